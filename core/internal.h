/*
** internal.h -- the object model shared by every file of core/ (and, later,
** kernels/): the state, storages, tensor handles, error reporting, the backend
** function table and small shape helpers. Nothing here is public API.
**
** Layering: ops/ checks arguments, works out shapes and dtypes, allocates the
** output and calls the backend of the tensors' device through S->backends[];
** cpu/ (and kernels/ for CUDA) implement that table. Kernels may assume their
** inputs were checked: same device, shapes already broadcast (as strided views),
** dtypes as the table entry documents.
*/
#ifndef EMBER_INTERNAL_H
#define EMBER_INTERNAL_H
#include "ember.h"
#include <assert.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <string.h>

/* -- Storage ----------------------------------------------------------------
** A refcounted block of device memory. Views share one storage. */
typedef struct emi_storage {
  int refcount;            /* atomic: a storage may be shared across threads */
  int device;
  em_state *S;             /* the state whose allocator owns data */
  void *data;
  size_t nbytes;           /* bytes of tensor data */
  size_t block_size;       /* bytes of the whole block (header + data + padding) */
  uint32_t version;        /* autograd: bumped by every in-place write */
  /* Data from an outside allocator (a loader's buffer_alloc): freed through this,
  ** the header with emi_free. NULL for ordinary blocks. */
  void (*ext_free)(void *ud, void *p, size_t nbytes);
  void *ext_ud;
} emi_storage;

/* -- Tensor handle ---------------------------------------------------------- */
struct em_tensor {
  int refcount;            /* atomic */
  em_dtype dtype;
  int device;
  int ndim;
  int64_t numel;           /* product of sizes, kept in step with them */
  int64_t offset;          /* in elements, into storage */
  int64_t sizes[EM_MAX_DIMS];
  int64_t strides[EM_MAX_DIMS];  /* in elements */
  emi_storage *storage;
  em_state *S;
  /* -- Autograd (core/autograd/): all zero for a plain tensor. requires_grad is
  ** set on leaves the user marked and on every output of a recorded op. */
  int requires_grad;
  int ag_pending;                /* engine scratch: contributions still to come */
  struct emi_ag_node *grad_fn;   /* owned reference, NULL for leaves */
  em_tensor *grad;               /* owned reference, NULL until a backward */
  struct emi_ag_hook *hooks;     /* gradient hooks of a leaf (owned list) */
};

/* -- Devices ------------------------------------------------------------------------
** The state owns one context per device it uses: the backend table that serves the
** device and whatever that backend keeps per device (for CUDA: streams, library
** handles). The CPU's is built into the state; others are added as backends
** register. */
struct emi_backend;
typedef struct emi_device {
  em_state *S;
  int index;                          /* EM_CPU or a CUDA ordinal */
  const struct emi_backend *backend;
  void *impl;                         /* the backend's own per-device data */
} emi_device;
enum { EMI_MAX_DEVICES = 16 };

/* -- nn geometry ----------------------------------------------------------------------
** Shared by the nn ops (core/ops/nn_*.c), which work them out and check them, and
** the backends' nn entries below, which may trust them. */
typedef struct emi_conv_geom {
  int64_t N, C, H, W;        /* input (N, C, H, W) */
  int64_t O, kH, kW;         /* weight (O, C/G, kH, kW) */
  int64_t OH, OW;            /* output (N, O, OH, OW) */
  int64_t sH, sW, pH, pW, dH, dW, G;
} emi_conv_geom;
/* 2-d pooling over planes = N*C independent (H, W) -> (OH, OW) planes. Adaptive
** pooling sets only planes, H, W, OH, OW (kH, kW: a window-size estimate). */
typedef struct emi_pool_geom {
  int64_t planes, H, W, OH, OW, kH, kW, sH, sW, pH, pW, dH, dW;
} emi_pool_geom;
/* The pointwise losses (pointwise_loss entries). */
enum { EMI_LOSS_MSE = 0, EMI_LOSS_BCE_LOGITS = 1 };

/* -- Backend table ---------------------------------------------------------------
** One per device kind. Every entry takes the device context first, then tensors
** (raw pointers never cross this line), and returns EM_OK or an error with the
** message set. An entry may be NULL: the dispatch point reports it (below).
** Shapes: "out-shaped" inputs are strided views already expanded to out's shape
** (broadcast dims have stride 0). */
typedef struct emi_backend {
  const char *name;
  int id;                  /* EMI_BACKEND_*: which row of the dispatch counters */
  /* A storage of nbytes on this device: the backend lays out the header and the
  ** data (the CPU puts both in one block) and sets data, nbytes and block_size;
  ** tensor.c sets the rest. NULL when the device is out of memory. */
  emi_storage *(*alloc)(emi_device *d, size_t nbytes);
  void (*free)(emi_device *d, emi_storage *st);
  /* out[i] = (out.dtype) src[i]; src out-shaped, any dtype. */
  em_status (*copy)(emi_device *d, em_tensor *out, const em_tensor *src);
  em_status (*fill)(emi_device *d, em_tensor *out, double value);
  /* a is out-shaped and has out's dtype (the ops layer converts first). */
  em_status (*unary)(emi_device *d, em_unop op, em_tensor *out, const em_tensor *a);
  /* a, b out-shaped and of the compute dtype; out is that dtype, or bool for
  ** comparisons and logical ops. */
  em_status (*binary)(emi_device *d, em_binop op, em_tensor *out, const em_tensor *a,
                      const em_tensor *b);
  em_status (*binary_scalar)(emi_device *d, em_binop op, em_tensor *out,
                             const em_tensor *a, double s, int reverse);
  /* out = a + alpha*b, all out-shaped and out's dtype. */
  em_status (*add_scaled)(emi_device *d, em_tensor *out, const em_tensor *a,
                          const em_tensor *b, double alpha);
  em_status (*clamp)(emi_device *d, em_tensor *out, const em_tensor *a, double lo,
                     double hi);
  /* cond (bool), a, b out-shaped; a, b of out's dtype. */
  em_status (*where)(emi_device *d, em_tensor *out, const em_tensor *cond,
                     const em_tensor *a, const em_tensor *b);
  /* Reduce a over the dims flagged in mask (bit d set = reduce dim d) into out,
  ** which has a's ndim with reduced dims of size 1 (the ops layer squeezes). */
  em_status (*reduce)(emi_device *d, em_redop op, em_tensor *out, const em_tensor *a,
                      unsigned mask);
  em_status (*var)(emi_device *d, em_tensor *out, const em_tensor *a, unsigned mask,
                   double correction, int take_sqrt);
  em_status (*norm)(emi_device *d, em_tensor *out, const em_tensor *a, unsigned mask,
                    double p);
  /* values/indices have a's shape with dim of size 1; want_max picks max or min.
  ** values may be NULL (argmax). */
  em_status (*arg_reduce)(emi_device *d, em_tensor *values, em_tensor *indices,
                          const em_tensor *a, int dim, int want_max, int index_base);
  em_status (*softmax)(emi_device *d, em_tensor *out, const em_tensor *a, int dim,
                       int log);
  /* Batched: a (*batch, M, K), b (*batch, K, N) strided views with the same batch
  ** dims (0 or more; stride 0 where broadcast), out (*batch, M, N) contiguous.
  ** a and b may have any dtype: out's dtype decides the arithmetic (ops/linalg.c). */
  em_status (*matmul)(emi_device *d, em_tensor *out, const em_tensor *a,
                      const em_tensor *b);
  /* a has >= 1 dim, idx is 1-D or 0-D int32/int64 (strided), out (contiguous) is a's
  ** shape with dim resized to idx's numel. Indices are range-checked here. */
  em_status (*index_select)(emi_device *d, em_tensor *out, const em_tensor *a, int dim,
                            const em_tensor *idx, int index_base);
  /* a, idx (int32/int64) strided with the same ndim >= 1, idx no larger than a
  ** outside dim; out (contiguous) has idx's shape. Indices are range-checked here. */
  em_status (*gather)(emi_device *d, em_tensor *out, const em_tensor *a, int dim,
                      const em_tensor *idx, int index_base);
  /* Random fills at Philox counter base `offset` with key `seed`, any strides,
  ** following the stream layout in philox.h. arange's out is contiguous. */
  em_status (*uniform)(emi_device *d, em_tensor *out, uint64_t seed, uint64_t offset,
                       double lo, double hi);
  em_status (*normal)(emi_device *d, em_tensor *out, uint64_t seed, uint64_t offset,
                      double mean, double std);
  em_status (*randint)(emi_device *d, em_tensor *out, uint64_t seed, uint64_t offset,
                       int64_t lo, int64_t hi);
  em_status (*arange)(emi_device *d, em_tensor *out, double start, double step);

  /* -- nn (core/ops/nn_*.c) and optimizers (core/ops/optim.c) ---------------------
  ** Unless said otherwise: float tensors are contiguous, float32 or float64, all of
  ** one dtype; shapes are checked against the geometry; outputs are fresh and every
  ** element of them is written. */
  /* x (N, C, H, W) with C >= 1, w (O, C/G, kH, kW), b (O) or NULL; y (N, O, OH, OW). */
  em_status (*conv2d)(emi_device *d, const emi_conv_geom *g, em_tensor *y,
                      const em_tensor *x, const em_tensor *w, const em_tensor *b);
  /* Shapes as conv2d, N, C and OH*OW all >= 1; gx, gw, gb may each be NULL. */
  em_status (*conv2d_backward)(emi_device *d, const emi_conv_geom *g, em_tensor *gx,
                               em_tensor *gw, em_tensor *gb, const em_tensor *gy,
                               const em_tensor *x, const em_tensor *w);
  /* x: g->planes (H, W) planes, y and ind (int64): (OH, OW) planes; ind holds the
  ** position of each maximum in its plane (h*W + w) plus index_base. */
  em_status (*max_pool2d)(emi_device *d, const emi_pool_geom *g, em_tensor *y,
                          em_tensor *ind, const em_tensor *x, int index_base);
  /* gy, ind (int64) (OH, OW) planes, gx (H, W) planes; only planes, H, W, OH, OW
  ** of g are set. Indices are range-checked here, before gx is written. */
  em_status (*max_pool2d_backward)(emi_device *d, const emi_pool_geom *g, em_tensor *gx,
                                   const em_tensor *gy, const em_tensor *ind,
                                   int index_base);
  em_status (*avg_pool2d)(emi_device *d, const emi_pool_geom *g, em_tensor *y,
                          const em_tensor *x, int count_include_pad);
  em_status (*avg_pool2d_backward)(emi_device *d, const emi_pool_geom *g, em_tensor *gx,
                                   const em_tensor *gy, int count_include_pad);
  em_status (*adaptive_avg_pool2d)(emi_device *d, const emi_pool_geom *g, em_tensor *y,
                                   const em_tensor *x);
  em_status (*adaptive_avg_pool2d_backward)(emi_device *d, const emi_pool_geom *g,
                                            em_tensor *gx, const em_tensor *gy);
  /* x, y (N, C, ...) seen as (N, C, L); w, b (C) or NULL; mean, invstd (C) receive
  ** the statistics used. Training (N*L >= 2): the batch's mean and 1/sqrt(biased
  ** var + eps), and running_mean / running_var (C, any strides, x's dtype; each
  ** may be NULL) move by momentum towards the mean and the unbiased variance. Not
  ** training: from running_mean and running_var, both given. */
  em_status (*batch_norm)(emi_device *d, em_tensor *y, em_tensor *mean, em_tensor *invstd,
                          em_tensor *running_mean, em_tensor *running_var,
                          const em_tensor *x, const em_tensor *w, const em_tensor *b,
                          int training, double momentum, double eps);
  /* gy, x, gx (N, C, ...); mean, invstd (C) as batch_norm gave; w (C) or NULL;
  ** gx, gw, gb may each be NULL. */
  em_status (*batch_norm_backward)(emi_device *d, em_tensor *gx, em_tensor *gw,
                                   em_tensor *gb, const em_tensor *gy, const em_tensor *x,
                                   const em_tensor *mean, const em_tensor *invstd,
                                   const em_tensor *w, int training);
  /* x, y: M = mean.numel rows of K = x.numel / M >= 1 elements; w, b (K) or NULL;
  ** mean, rstd receive each row's mean and 1/sqrt(var + eps). */
  em_status (*layer_norm)(emi_device *d, em_tensor *y, em_tensor *mean, em_tensor *rstd,
                          const em_tensor *x, const em_tensor *w, const em_tensor *b,
                          double eps);
  /* Rows as layer_norm (M may be 0: then gw, gb are zeros of their numel K >= 1);
  ** gx, gw, gb may each be NULL. */
  em_status (*layer_norm_backward)(emi_device *d, em_tensor *gx, em_tensor *gw,
                                   em_tensor *gb, const em_tensor *gy, const em_tensor *x,
                                   const em_tensor *mean, const em_tensor *rstd,
                                   const em_tensor *w);
  /* x (N, C) with C >= 1, lse (N) receives each row's logsumexp, loss is (N) for
  ** EM_REDUCE_NONE else 0-d. target (N): int32/int64, any strides, range-checked
  ** here (a target equal to ignore_index is skipped and not counted by the mean). */
  em_status (*cross_entropy)(emi_device *d, em_tensor *loss, em_tensor *lse,
                             const em_tensor *x, const em_tensor *target, int index_base,
                             int64_t ignore_index, double label_smoothing, int reduction);
  /* gx (N, C); grad_loss: (N) any strides for EM_REDUCE_NONE, else one element. */
  em_status (*cross_entropy_backward)(emi_device *d, em_tensor *gx,
                                      const em_tensor *grad_loss, const em_tensor *x,
                                      const em_tensor *target, const em_tensor *lse,
                                      int index_base, int64_t ignore_index,
                                      double label_smoothing, int reduction);
  /* As cross_entropy on log-probabilities logp (N, C), which may be strided. */
  em_status (*nll_loss)(emi_device *d, em_tensor *loss, const em_tensor *logp,
                        const em_tensor *target, int index_base, int64_t ignore_index,
                        int reduction);
  em_status (*nll_loss_backward)(emi_device *d, em_tensor *gx, const em_tensor *grad_loss,
                                 const em_tensor *target, int index_base,
                                 int64_t ignore_index, int reduction);
  /* kind: EMI_LOSS_*. x, y of one shape; loss has it for EM_REDUCE_NONE, else is 0-d
  ** (the sum, or the mean over x's elements). */
  em_status (*pointwise_loss)(emi_device *d, int kind, em_tensor *loss, const em_tensor *x,
                              const em_tensor *y, int reduction);
  /* grad_loss has x's shape for EM_REDUCE_NONE, else one element. */
  em_status (*pointwise_loss_backward)(emi_device *d, int kind, em_tensor *gx,
                                       const em_tensor *grad_loss, const em_tensor *x,
                                       const em_tensor *y, int reduction);
  /* In place, any dtype and strides (src has out's dtype; out and src may share
  ** storage): out[.., idx[i], ..] += src[.., i, ..] along dim. 0-d out and src act as
  ** [1]; idx 0-D or 1-D int32/int64; shapes checked. Indices are range-checked
  ** here before out is touched. */
  em_status (*index_add)(emi_device *d, em_tensor *out, int dim, const em_tensor *idx,
                         const em_tensor *src, int index_base);
  /* In place: out[.., idx[p], ..] += src[p] at every position p of idx; idx, src, out
  ** of one ndim, idx no larger than src (nor than out outside dim). Indices are
  ** range-checked here before out is touched. */
  em_status (*scatter_add)(emi_device *d, em_tensor *out, int dim, const em_tensor *idx,
                           const em_tensor *src, int index_base);
  /* Fused optimizer steps over n >= 1 parameters of this device and one dtype
  ** (float32/float64): p[i], g[i], buf[i] contiguous, one shape (numel >= 1); buf
  ** is NULL as a whole when momentum is 0. All are updated by one call -- on cuda
  ** one kernel launch -- with the same arithmetic, element for element, on every
  ** backend. A single parameter is the case n = 1.
  ** SGD: d = g + wd*p; buf = first[i] ? d : momentum*buf + (1-dampening)*d;
  ** d = nesterov ? d + momentum*buf : buf; p -= lr*d.
  ** Adam: with moments m, v; step_size[i] = lr / (1 - beta1^step), bc2_sqrt[i] =
  ** sqrt(1 - beta2^step), decay: the factor p is multiplied by first (AdamW; 1 for
  ** Adam), wd: the L2 term added to g (Adam). */
  em_status (*sgd_step_multi)(emi_device *d, int n, em_tensor *const *p,
                              const em_tensor *const *g, em_tensor *const *buf,
                              const int *first, double lr, double momentum,
                              double dampening, double wd, int nesterov);
  em_status (*adam_step_multi)(emi_device *d, int n, em_tensor *const *p,
                               const em_tensor *const *g, em_tensor *const *m,
                               em_tensor *const *v, const double *step_size,
                               const double *bc2_sqrt, double beta1, double beta2,
                               double eps, double wd, double decay);
  /* out: a 0-D float64 tensor on d = the sum over n contiguous tensors of this
  ** device and one dtype, float32 or float64 (numel >= 1), of |x|^p (p = 2: x*x,
  ** p = 1: |x|; finite p > 0), or the max of |x| (p = INFINITY; NaN wins), in
  ** double, in one fixed order that every backend keeps, so results are
  ** bit-identical for p = 1, 2, inf: the
  ** tensors' elements in chunks of 4096 (a chunk never spans two tensors); in a
  ** chunk, lane l (of 256) folds elements l, l+256, ... in turn, then lanes
  ** combine by halving (lane l with lane l+s, s = 128 .. 1); the chunks' results
  ** fold in order from 0 (clip_grad_norm). */
  em_status (*norm_multi)(emi_device *d, em_tensor *out, int n, const em_tensor *const *t,
                          double p);
  /* t[i] *= (T)scale for n tensors as norm_multi's. */
  em_status (*scale_multi)(emi_device *d, int n, em_tensor *const *t, double scale);
} emi_backend;

/* -- Backend entries by name, and their counters ---------------------------------
** EMI_BACKEND_ENTRIES(X) is X(entry) for every entry of emi_backend, in the
** struct's order, so code can walk the entries by name and index (EMI_ENTRY_<name>).
** The checks below break the build when the list and the struct disagree: each
** listed entry sits at its index, and the entries fill the struct from alloc on.
** Every call through the dispatch point (and every storage alloc and free, in
** tensor.c) adds one to S->dispatch_counts[backend id][entry], which the parity
** test (tests/c/test_backend_parity.c) reads to fail on an entry no case reached. */
#define EMI_BACKEND_ENTRIES(X)                                                       \
  X(alloc) X(free) X(copy) X(fill) X(unary) X(binary) X(binary_scalar) X(add_scaled) \
  X(clamp) X(where) X(reduce) X(var) X(norm) X(arg_reduce) X(softmax) X(matmul)      \
  X(index_select) X(gather) X(uniform) X(normal) X(randint) X(arange) X(conv2d)      \
  X(conv2d_backward) X(max_pool2d) X(max_pool2d_backward) X(avg_pool2d)              \
  X(avg_pool2d_backward) X(adaptive_avg_pool2d) X(adaptive_avg_pool2d_backward)      \
  X(batch_norm) X(batch_norm_backward) X(layer_norm) X(layer_norm_backward)          \
  X(cross_entropy) X(cross_entropy_backward) X(nll_loss) X(nll_loss_backward)        \
  X(pointwise_loss) X(pointwise_loss_backward) X(index_add) X(scatter_add)           \
  X(sgd_step_multi) X(adam_step_multi) X(norm_multi) X(scale_multi)
#define EMI_ENTRY_INDEX_(e) EMI_ENTRY_##e,
enum { EMI_BACKEND_ENTRIES(EMI_ENTRY_INDEX_) EMI_NENTRIES };
#define EMI_ENTRY_AT_(e)                                                             \
  static_assert(offsetof(emi_backend, e) ==                                          \
                offsetof(emi_backend, alloc) + EMI_ENTRY_##e * sizeof(void (*)(void)),  \
                "EMI_BACKEND_ENTRIES: " #e " is not at its index in emi_backend");
EMI_BACKEND_ENTRIES(EMI_ENTRY_AT_)
static_assert(sizeof(emi_backend) ==
              offsetof(emi_backend, alloc) + EMI_NENTRIES * sizeof(void (*)(void)),
              "EMI_BACKEND_ENTRIES does not list every entry of emi_backend");
/* Backend ids: small, fixed, one per backend table. */
enum { EMI_BACKEND_CPU = 0, EMI_BACKEND_CUDA = 1, EMI_MAX_BACKENDS = 4 };

extern const emi_backend emi_cpu_backend;

/* -- Workers (cpu/workers.c) ------------------------------------------------------
** The state's CPU threads: nthreads - 1 workers plus the caller (none for 1).
** emi_parallel_for runs fn(ctx, begin, end) over [0, n) in chunks of at least
** `grain` items; inline when one chunk covers it. Not reentrant: kernels do not
** nest it. */
typedef void (*emi_range_fn)(void *ctx, int64_t begin, int64_t end);
typedef struct emi_workers emi_workers;
emi_workers *emi_workers_new(em_state *S, int nthreads);   /* NULL: out of memory */
void emi_workers_free(emi_workers *w);
int emi_workers_size(const emi_workers *w);
void emi_parallel_for(em_state *S, int64_t n, int64_t grain, emi_range_fn fn,
                      void *ctx);

/* -- State ------------------------------------------------------------------------ */
enum { EMI_ERRMSG_SIZE = 512, EMI_CACHE_CLASSES = 8 * 32 };
struct em_state {
  em_alloc_fn alloc;
  void *alloc_ud;
  int num_threads;
  emi_workers *workers;
  uint64_t rng_seed, rng_offset;   /* Philox key and next free counter */
  int64_t mem_allocated, mem_peak;
  /* alloc.c: freed large blocks by size class, at most cache_limit bytes */
  pthread_mutex_t cache_mu;
  void *cache[EMI_CACHE_CLASSES];
  size_t cache_bytes, cache_limit;
  emi_device cpu;                          /* the CPU's context, always there */
  emi_device *devices[EMI_MAX_DEVICES];    /* CUDA ordinals, NULL until used */
  struct emi_profiler *profiler;           /* NULL unless recording (core/profile/) */
  struct emi_profiler *profile_last;       /* the stopped profile, kept for reading */
  struct emk_cuda *cuda;                   /* kernels/cuda.c: runtime, allocator, devices */
  int cuda_tried;                          /* devices looked for once per state */
  char cuda_why[256];                      /* and why there are none, if so */
  int memory_pressure;                     /* em_memory_pressure_flag */
  int allow_tf32;                          /* em_cuda_set_allow_tf32 */
  char alloc_why[256];                     /* why a backend's alloc just failed */
  void (*reclaim_hook)(void *ud, int device, size_t nbytes);   /* em_cuda_set_reclaim_hook */
  void *reclaim_ud;
  int grad_disabled;       /* autograd: 0 = grad mode on (the default) */
  int index_base;          /* messages number dims, positions, indices from it (0|1) */
  int64_t image_max_pixels; /* em_image_set_max_pixels: 0 default, > 0 limit, -1 none */
  struct emi_bw_callback *backward_callbacks;   /* engine.c: run at each backward's end */
  uint64_t dispatch_counts[EMI_MAX_BACKENDS][EMI_NENTRIES];   /* calls per backend entry */
  char errmsg[EMI_ERRMSG_SIZE];
};

/* -- Errors ----------------------------------------------------------------------
** emi_error formats into S->errmsg and returns code, so: return emi_error(...). */
em_status emi_error(em_state *S, em_status code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* "[2,3]" into buf; returns buf. Buffers of EMI_SHAPE_STR bytes always fit. */
enum { EMI_SHAPE_STR = 8 * 24 + 4 };
const char *emi_shape_str(char *buf, const int64_t *sizes, int ndim);
/* Shorthand for messages: a tensor's shape as "[2,3]" in a rotating buffer (four
** slots, so up to four may appear in one message). */
const char *emi_tshape(em_state *S, const em_tensor *t);
const char *emi_device_name(char *buf, int device);
/* Checks shared by every op: non-NULL tensor, dim in range (negative wraps). */
em_status emi_check_tensor(em_state *S, const char *op, const em_tensor *t);
em_status emi_wrap_dim(em_state *S, const char *op, int *dim, int ndim);

/* Monotonic seconds, for timing (loader stats, collectives). */
double emi_now(void);

/* -- The dispatch point -------------------------------------------------------------
** Every op reaches a kernel here and nowhere else: EMI_DISPATCH(S, op, t, entry, ...)
** calls `entry` of the backend serving tensor t's device with that device's context
** and the remaining arguments, and yields its em_status. t also names what the
** profiler records (op name, t's shape, dtype and device). A device without a
** backend, or a backend without the entry, is a clear EM_ERR_DEVICE naming the op
** and the device. Profiling off costs the one test of S->profiler; the count of
** calls per (backend, entry), one plain increment (a state's ops run on one thread). */
em_status emi_no_kernel(em_state *S, const char *op, const char *entry, int device);
double emi_profile_op_begin(em_state *S);
void emi_profile_op_end(em_state *S, const char *op, const em_tensor *t, double t0);
void emi_profile_free(em_state *S);      /* em_close */
void emi_profile_batch_out(em_state *S, double t);   /* the loader, per batch */
#define EMI_DISPATCH(S, op, t, entry, ...) __extension__({                           \
    em_state *S_ = (S);                                                             \
    const em_tensor *t_ = (t);                                                      \
    emi_device *d_ = emi_device_of(S_, t_->device);                                 \
    em_status st_;                                                                  \
    if (__builtin_expect(!d_ || !d_->backend->entry, 0)) {                          \
      st_ = emi_no_kernel(S_, (op), #entry, t_->device);                            \
    } else {                                                                        \
      S_->dispatch_counts[d_->backend->id][EMI_ENTRY_##entry]++;                    \
      if (__builtin_expect(__atomic_load_n(&S_->profiler, __ATOMIC_RELAXED) != NULL, 0)) { \
        double t0_ = emi_profile_op_begin(S_);                                      \
        st_ = d_->backend->entry(d_, __VA_ARGS__);                                  \
        emi_profile_op_end(S_, (op), t_, t0_);                                      \
      } else                                                                        \
        st_ = d_->backend->entry(d_, __VA_ARGS__);                                  \
    }                                                                               \
    st_; })

/* -- Memory (state.c) ------------------------------------------------------------- */
void *emi_malloc(em_state *S, size_t n);          /* NULL on failure, no message */
void emi_free(em_state *S, void *p, size_t n);
/* Storage blocks (alloc.c): large ones are cached for reuse. *actual receives the
** size really allocated, which emi_block_free must be given back. */
void *emi_block_alloc(em_state *S, size_t n, size_t *actual);
void emi_block_free(em_state *S, void *p, size_t actual);
void emi_cache_release(em_state *S);

/* -- Tensor construction (tensor.c) -------------------------------------------------
** emi_tensor_new makes a contiguous tensor with fresh, uninitialised storage. */
em_status emi_tensor_new(em_state *S, const char *op, const int64_t *sizes, int ndim,
                         em_dtype dt, int device, em_tensor **out);
/* Silent forms for threads that must not touch S->errmsg (loader workers): NULL
** on failure. Shapes must be valid; CPU only. The external form wraps data of
** nbytes that free_fn(ud, data, nbytes) releases with the storage (on failure the
** caller keeps it). */
em_tensor *emi_tensor_try_new(em_state *S, const int64_t *sizes, int ndim, em_dtype dt);
em_tensor *emi_tensor_try_external(em_state *S, void *data, size_t nbytes,
                                   void (*free_fn)(void *ud, void *p, size_t n), void *ud,
                                   const int64_t *sizes, int ndim, em_dtype dt);
em_tensor *emi_tensor_try_view(em_state *S, const em_tensor *src, const int64_t *sizes,
                               const int64_t *strides, int ndim, int64_t offset);
/* A new handle on t's storage with the given geometry (retains the storage). */
em_status emi_tensor_view(em_state *S, const em_tensor *t, const int64_t *sizes,
                          const int64_t *strides, int ndim, int64_t offset,
                          em_tensor **out);
void emi_contiguous_strides(const int64_t *sizes, int ndim, int64_t *strides);
int64_t emi_shape_numel(const int64_t *sizes, int ndim);
/* sizes >= 0 and every contiguous stride product (0 dims as 1) x 16 fits int64 */
bool emi_shape_ok(const int64_t *sizes, int ndim);
/* Broadcast two shapes (numpy rules); EM_ERR_SHAPE with message naming op. */
em_status emi_broadcast_shape(em_state *S, const char *op, const int64_t *a, int na,
                              const int64_t *b, int nb, int64_t *out, int *nout);
/* A stride-0 view of t expanded to shape (t must broadcast to it). */
em_status emi_expand_to(em_state *S, const char *op, const em_tensor *t,
                        const int64_t *shape, int ndim, em_tensor **out);
/* CUDA devices are opened on a state's first use of one (kernels/cuda.c): NULL
** when that device can't be had (the reason is kept for em_cuda_device_count). */
emi_device *emi_device_attach(em_state *S, int device);
void emi_cuda_detach(em_state *S);        /* em_close */
/* Drops one reference to a storage, freeing it with the last (core/tensor.c). */
void emi_storage_release(emi_storage *st);

/* The context of a device, or NULL when no backend serves it. */
static inline emi_device *emi_device_of(em_state *S, int device) {
  if (device == EM_CPU) return &S->cpu;
  if (device < 0 || device >= EMI_MAX_DEVICES) return NULL;
  emi_device *d = S->devices[device];
  return d ? d : emi_device_attach(S, device);
}

/* -- Strided iteration (tensor.c) --------------------------------------------------
** Kernels walk out-shaped operands as a loop over "rows": the dims are coalesced
** (adjacent dims merged when every operand's strides allow), the last dim is the
** inner loop. emi_iter handles up to EMI_ITER_MAX operands. */
enum { EMI_ITER_MAX = 4 };
typedef struct emi_iter {
  int nops, ndim;                      /* ndim >= 1 after coalescing */
  int64_t sizes[EM_MAX_DIMS];
  int64_t strides[EMI_ITER_MAX][EM_MAX_DIMS];  /* in bytes */
  char *base[EMI_ITER_MAX];
  int64_t inner;                       /* sizes[ndim-1] */
  int64_t nrows;                       /* product of the outer sizes */
} emi_iter;
/* All ops must have the same shape as ops[0]. */
void emi_iter_init(emi_iter *it, em_tensor *const *ops, int nops);
/* Pointers to the start of row r for each operand. */
void emi_iter_row(const emi_iter *it, int64_t r, char **ptrs);

/* -- float16 / bfloat16 ---------------------------------------------------------- */
float emi_half_to_float(uint16_t h);
uint16_t emi_float_to_half(float f);
static inline float emi_bf16_to_float(uint16_t b) {
  union { uint32_t u; float f; } v;
  v.u = (uint32_t)b << 16;
  return v.f;
}
static inline uint16_t emi_float_to_bf16(float f) {
  union { uint32_t u; float f; } v;
  v.f = f;
  if ((v.u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((v.u >> 16) | 0x40); /* NaN */
  return (uint16_t)((v.u + 0x7fffu + ((v.u >> 16) & 1u)) >> 16); /* round to even */
}
/* Read / write one element of any dtype as a double. */
double emi_load_f64(const void *p, em_dtype dt);
void emi_store_f64(void *p, em_dtype dt, double v);

static inline void emi_atomic_inc(int *p) { __atomic_add_fetch(p, 1, __ATOMIC_RELAXED); }
static inline int emi_atomic_dec(int *p) { return __atomic_sub_fetch(p, 1, __ATOMIC_ACQ_REL); }

/* Autograd's storage versions: every in-place write bumps its storage's (saved
** tensors compare it at backward). Atomic: views of one storage may be written
** from several threads (replicas, loader workers). */
static inline void emi_bump_version(const em_tensor *t) {
  __atomic_add_fetch(&t->storage->version, 1, __ATOMIC_RELAXED);
}
static inline uint32_t emi_version(const em_tensor *t) {
  return __atomic_load_n(&t->storage->version, __ATOMIC_RELAXED);
}

/* -- Autograd hooks on handles (core/autograd/) ----------------------------------
** New handles start with no history; a release drops grad, grad_fn and hooks. */
static inline void emi_ag_clear_fields(em_tensor *t) {
  t->requires_grad = 0;
  t->ag_pending = 0;
  t->grad_fn = NULL;
  t->grad = NULL;
  t->hooks = NULL;
}
void emi_ag_release_fields(em_tensor *t);
void emi_backward_callbacks_free(em_state *S);

/* -- Numbering in messages (state.c); copies on the calling thread (cpu/strided.c) --
** Messages show dims, list positions and indices in the caller's numbering:
** S->index_base, 0 unless the host set it (em_set_index_base; the Lua layer sets
** 1). emi_ix(S, v) is v, 0-based as C holds it, in that numbering; a negative v
** (counted from the end) is shown as given. */
static inline long long emi_ix(const em_state *S, long long v) {
  return v < 0 ? v : v + S->index_base;
}
/* Same-dtype copies that never use the state's workers, so loader threads can
** run them. emi_copy_row: n elements of es bytes from src, ss bytes apart
** (negative walks backwards), to contiguous dst. emi_copy_strided: src (CPU,
** any strides) into the contiguous bytes at dst. */
void emi_copy_row(void *dst, const void *src, int64_t n, int64_t ss, size_t es);
void emi_copy_strided(void *dst, const em_tensor *src);

#endif

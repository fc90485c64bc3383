/*
** backend.h -- what core/ exports to the backends that serve its devices: the
** storage and tensor layouts, a device's context, the two tables every device
** kind fills (the op table and the device-services table), the registration of a
** device kind, and the few core helpers a backend may call. kernels/ (the CUDA
** backend, built as its own library) includes this, ember.h and philox.h (the
** random streams' layout) and nothing else of core's; core/internal.h builds
** on it, and the built-in backends (core/cpu/, core/meta/), part of core,
** include internal.h (the CPU's kernels run on the state's workers).
**
** The seam. ops/ check arguments, work out shapes and dtypes, allocate outputs
** and call ONE entry of the op table of the tensors' device (EMI_DISPATCH in
** internal.h). What is not an op -- the loader's copies ahead of the step, the
** communicators' ordering against the compute stream, memory statistics, device
** facts -- goes through the services table: streams, events, asynchronous
** copies, pinned host memory and the device's collective engine. Device kinds
** register as an emi_backend_kind; the registry (core/device/registry.c) owns
** the numbering: cpu is EM_CPU, meta EM_META, an accelerator kind's devices are
** 0 .. max-1 of that kind. A kind's per-state data lives in its own context,
** which the registry keeps for the state; em_state has no field of any kind.
*/
#ifndef EMBER_BACKEND_H
#define EMBER_BACKEND_H
#include "ember.h"
#include <assert.h>
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
  /* -- Autograd (core/autograd/): requires_grad is set on leaves the user marked
  ** and on every output of a recorded op (the one test an op makes); everything
  ** else autograd keeps of a tensor is behind ag (internal.h's emi_ag_meta), made
  ** when the tensor first needs it: NULL for a plain tensor, and a layout the
  ** backends never see. */
  int requires_grad;
  struct emi_ag_meta *ag;        /* owned, NULL until autograd needs it */
};

/* -- Devices ------------------------------------------------------------------------
** The state owns one context per device it uses: the backend table that serves the
** device and whatever that backend keeps per device (for CUDA: streams, library
** handles). cpu's and meta's are built into the state; an accelerator kind's come
** from the kind's context, which the registry opens for the state on its first
** use of one of the kind's devices (core/device/registry.c). */
struct emi_backend;
typedef struct emi_device {
  em_state *S;
  int index;                          /* EM_CPU, EM_META or the kind's ordinal */
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
  int nhwc;                  /* x, w, y (gy, gx, gw) are all channels last, densely:
                             ** (N, H, W, C), (O, kH, kW, C/G), (N, OH, OW, O) */
  int act;                   /* forward only: EMI_ACT_RELU writes relu(conv) to y, as
                             ** x < 0 ? 0 : x (em.compile's fused conv + ReLU; only
                             ** the CPU backend is given it) */
} emi_conv_geom;
enum { EMI_ACT_NONE = 0, EMI_ACT_RELU = 1 };
/* 2-d pooling over planes = N*C independent (H, W) -> (OH, OW) planes. Adaptive
** pooling sets only planes, H, W, OH, OW (kH, kW: a window-size estimate). */
typedef struct emi_pool_geom {
  int64_t planes, H, W, OH, OW, kH, kW, sH, sW, pH, pW, dH, dW;
  int64_t C;                 /* channels, set when nhwc */
  int nhwc;                  /* x, y, ind (gx, gy) are (N, C, H, W) channels last, densely;
                             ** indices stay plane positions h*W + w */
  int ind_trusted;           /* max_pool2d_backward: the indices are max_pool2d's own
                             ** (in range), so a backend need not check them */
} emi_pool_geom;
/* Which entries of a backend take channels-last tensors (emi_backend.nhwc bits);
** for the others the ops layer reorders around the call (counted conversions).
** Batch norm: x, y, gy, gx channels last together (the entry reads x's strides). */
enum { EMI_NHWC_CONV = 1, EMI_NHWC_POOL = 2, EMI_NHWC_BN = 4 };
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
  unsigned nhwc;           /* EMI_NHWC_* bits: entries that serve channels last */
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
  /* -- Sorting and scans along one dim (core/ops/sort_scan.c) ---------------------
  ** indices (int64, contiguous, a's shape with k along dim, ndim >= 1) receives,
  ** for each line of a (any dtype, strided) along dim, the positions of its first
  ** k elements in ascending (descending) order, plus index_base: the whole order
  ** when k is the line's length, topk's when less. The sort is stable: equal
  ** elements keep their order. NaN sorts above every number (first when
  ** descending); NaNs are equal among themselves. */
  em_status (*sort)(emi_device *d, em_tensor *indices, const em_tensor *a, int dim,
                    int descending, int index_base, int64_t k);
  /* Inclusive scan along dim: op EMI_SCAN_SUM (cumsum) or EMI_SCAN_PROD (cumprod).
  ** out (contiguous) and a (strided) have one shape (ndim >= 1) and one dtype, a
  ** floating one or int64; floats accumulate in double, int64 wraps. */
  em_status (*scan)(emi_device *d, int op, em_tensor *out, const em_tensor *a, int dim);
} emi_backend;
/* The scans (scan entries). */
enum { EMI_SCAN_SUM = 0, EMI_SCAN_PROD = 1 };

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
  X(sgd_step_multi) X(adam_step_multi) X(norm_multi) X(scale_multi)                 \
  X(sort) X(scan)
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
enum { EMI_BACKEND_CPU = 0, EMI_BACKEND_CUDA = 1, EMI_BACKEND_META = 2, EMI_MAX_BACKENDS = 4 };


extern const emi_backend emi_cpu_backend;
extern const emi_backend emi_meta_backend;

/* -- Device services ------------------------------------------------------------
** What the loader, the communicators, the profiler and em_device_memory need from a
** device beside its ops. Streams are named by role: the compute stream runs the
** device's ops in call order; the copy stream runs copies from pinned memory
** beside it; the communication stream is the device's for collectives. A
** caller that needs streams of its own (a communicator: its collectives, sends
** and recvs must not wait behind another's) makes them with stream_new: a
** number past the roles, EMI_STREAM_OWN or more, that every entry taking an
** emi_stream accepts, until stream_free. An event marks a point on a stream. Entries may be NULL where the kind has no such thing. The CPU and
** meta devices have no services table (emi_services_of gives NULL): they have
** no streams, and work there is done when the call returns. */
typedef enum { EMI_STREAM_COMPUTE = 0, EMI_STREAM_COPY = 1, EMI_STREAM_COMM = 2,
               EMI_STREAM_OWN = 16 } emi_stream;
typedef enum { EMI_COPY_H2D = 0, EMI_COPY_D2H = 1 } emi_copy_dir;
typedef struct emi_event emi_event;
typedef struct emi_pinned_pool emi_pinned_pool;
typedef struct emi_collective emi_collective;
/* The collectives (core/dist/): what a device's engine runs. */
typedef enum emi_coll_kind {
  EMI_COLL_ALLREDUCE, EMI_COLL_BROADCAST, EMI_COLL_ALLGATHER, EMI_COLL_REDUCE_SCATTER,
  EMI_COLL_BARRIER,
  EMI_COLL_SEND, EMI_COLL_RECV   /* point-to-point (comm.h); peer is the other replica */
} emi_coll_kind;
/* One collective for a device's engine (NCCL): kind (emi_coll_kind), dtype and
** op (em_comm_op); in/out device pointers; count elements per
** rank (allgather: the input's count); peer: root or the other rank; stream:
** the stream it runs on (a communicator's own, stream_new). */
typedef struct emi_coll_call {
  int kind, dtype, op, peer, stream;
  const void *in;
  void *out;
  int64_t count;
} emi_coll_call;

typedef struct emi_services {
  /* Facts and memory (ember.h's em_cuda_props and em_cuda_memory serve every
  ** accelerator kind); reset_peak starts a new peak at what is allocated now. */
  em_status (*props)(emi_device *d, em_cuda_props *out);
  em_status (*memory_stats)(emi_device *d, em_cuda_memory *out);
  void (*reset_peak)(emi_device *d);
  em_status (*empty_cache)(emi_device *d);
  /* Waits for every stream of the device, then frees what died meanwhile. */
  em_status (*synchronize)(emi_device *d);
  /* The runtime's last message, for errors the caller words itself. */
  const char *(*errmsg)(emi_device *d);

  /* Streams and events. event_new records a new event on stream s now;
  ** event_wait makes stream s wait for it (the host does not). */
  em_status (*stream_sync)(emi_device *d, emi_stream s);
  em_status (*event_new)(emi_device *d, emi_stream s, emi_event **out);
  em_status (*event_query)(emi_device *d, emi_event *e, int *done);
  em_status (*event_wait)(emi_device *d, emi_stream s, emi_event *e);
  void (*event_free)(emi_device *d, emi_event *e);
  /* A stream of the caller's own (see above); stream_free after its work is
  ** done (it waits for it). */
  em_status (*stream_new)(emi_device *d, emi_stream *out);
  void (*stream_free)(emi_device *d, emi_stream s);
  /* fn(ud) on a runtime thread once the work queued on s before it has run. */
  em_status (*host_callback)(emi_device *d, emi_stream s, void (*fn)(void *ud), void *ud);

  /* Asynchronous copies of n bytes on stream s, between host memory (pinned for
  ** the copy to overlap) and device memory of d. */
  em_status (*memcpy_async)(emi_device *d, emi_stream s, void *dst, const void *src,
                            size_t n, emi_copy_dir dir);
  /* Pinned host memory: raw blocks (staging), and tensors. is_pinned: whether t
  ** lies in pinned memory of this kind; copy_pinned queues src (pinned,
  ** contiguous, out's dtype) into out (contiguous, on d): *on_copy = 1 when it
  ** went on the copy stream (the caller orders the compute stream after it), 0
  ** when on the compute stream. */
  em_status (*host_alloc)(emi_device *d, size_t n, void **out);
  void (*host_free)(emi_device *d, void *p);
  /* Frees the pinned blocks whose tensors died since (their last reference may
  ** drop on a runtime thread, which must not call the runtime). Host thread. */
  void (*host_collect)(emi_device *d);
  int (*is_pinned)(const em_tensor *t);
  em_status (*copy_pinned)(emi_device *d, em_tensor *out, const em_tensor *src,
                           int *on_copy);
  /* A pool of pinned buffers for a loader's workers: alloc and put serve as
  ** em_loader_config.buffer_alloc / buffer_free (any thread); copying marks a
  ** buffer a queued copy reads (a worker short of buffers waits for those). */
  em_status (*pool_new)(emi_device *d, int target, emi_pinned_pool **out);
  void *(*pool_alloc)(void *pool, size_t nbytes);
  void (*pool_put)(void *pool, void *p, size_t nbytes);
  void (*pool_copying)(emi_pinned_pool *pool, const void *p);
  void (*pool_stats)(emi_pinned_pool *pool, int64_t *buffers, int64_t *bytes,
                     int64_t *waits, double *wait_s);
  void (*pool_trim)(emi_pinned_pool *pool);
  void (*pool_close)(emi_pinned_pool *pool);

  /* The device's own collective engine (NCCL on real GPUs; NULL entries or
  ** native() = 0 where the host communicator stands in). init joins rank of
  ** size with the 128-byte id (polled up to timeout_s); group(1)/group(0)
  ** bracket issues; issue queues one collective on the communication stream. */
  int (*native)(emi_device *d);
  em_status (*coll_unique_id)(unsigned char id[128], char *err, size_t errlen);
  em_status (*coll_version)(int *code, char *err, size_t errlen);
  em_status (*coll_init)(emi_device *d, const unsigned char id[128], int rank, int size,
                         double timeout_s, emi_collective **out, char *err, size_t errlen);
  em_status (*coll_group)(emi_collective *c, int start, char *err, size_t errlen);
  em_status (*coll_issue)(emi_collective *c, const emi_coll_call *call, char *err,
                          size_t errlen);
  em_status (*coll_async_error)(emi_collective *c, char *err, size_t errlen);
  void (*coll_free)(emi_collective *c, int abort);
} emi_services;

/* -- Device kinds ------------------------------------------------------------------
** A kind serves devices of one name ("cuda": cuda:0 .. cuda:max-1). open runs once
** per state, on the state's first use of the kind: *ctx is the kind's context for
** that state (NULL and a reason in why when it has no devices) and touches no
** device; count and device read it (device: the host-side context of device i,
** whose services may give facts -- properties, memory counts -- before it is
** opened); open_device readies device i for work (streams, the CUDA context) on
** the state's first use of it, once (EM_OK at once after that; any thread; a
** failure says why, naming the device). close ends it at em_close. api: the
** kind's own public calls (cuda: emi_cuda_api), NULL if none. */
typedef struct emi_backend_kind {
  int version;                       /* EMI_DEVICE_INTERFACE_VERSION it implements */
  int abi;                           /* EMI_BACKEND_ABI of the build it came from */
  const char *name;
  int max_devices;
  const emi_backend *ops;
  const emi_services *svc;
  em_status (*open)(em_state *S, void **ctx, char *why, size_t whylen);
  void (*close)(em_state *S, void *ctx);
  int (*count)(void *ctx);
  emi_device *(*device)(void *ctx, int index);
  em_status (*open_device)(void *ctx, int index, char *why, size_t whylen);
  const void *api;
} emi_backend_kind;

/* A kind's library must implement this version of the device interface (the
** tables above, em_tensor and emi_storage as the backends see them): raised by
** hand with every change to them, so that a kind built from other sources is
** refused by name. EMI_BACKEND_ABI, a fingerprint of the layouts' sizes, backs it
** up where a change forgot the version. */
#define EMI_DEVICE_INTERFACE_VERSION 2
#define EMI_BACKEND_ABI ((int)(sizeof(emi_backend) * 131 + sizeof(emi_services) * 17 + \
                               sizeof(em_tensor) * 3 + sizeof(emi_storage) * 5 +         \
                               sizeof(emi_device) + sizeof(emi_backend_kind)))

/* The calls of ember.h's em_cuda_* that are the CUDA kind's own (graphs, pinned
** tensors); core/device/cuda_api.c forwards to them. */
typedef struct emi_cuda_api {
  int (*emulated)(void *ctx);
  int (*capturing)(void *ctx);              /* the device capturing, or -1 */
  em_status (*graph_begin)(emi_device *d);
  em_status (*graph_end)(em_state *S, em_cuda_graph **out);
  em_status (*graph_launch)(em_state *S, em_cuda_graph *g);
  void (*graph_free)(em_state *S, em_cuda_graph *g);
  em_status (*pin_memory)(em_state *S, void *ctx, const em_tensor *t, em_tensor **out);
  em_status (*libs_info)(char *buf, size_t len);
} emi_cuda_api;

/* A kind's one registration: its library calls this as it is loaded (from a
** constructor), whether linked into the host or loaded by the registry. A kind
** of another interface version or other table layouts (abi) is ignored. */
void emi_register_kind(const emi_backend_kind *k);
/* The context a kind opened for S (NULL before, or when it has none). */
void *emi_kind_ctx(em_state *S, const emi_backend_kind *k);
/* The CPU's device context: backends run CPU stand-ins through its table. */
emi_device *emi_cpu_device(em_state *S);

/* -- Core helpers for backends ------------------------------------------------------ */
em_status emi_error(em_state *S, em_status code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
void *emi_malloc(em_state *S, size_t n);          /* NULL on failure, no message */
void emi_free(em_state *S, void *p, size_t n);
/* The host's allocator (em_config), for a backend's own host-side blocks. */
void emi_host_allocator(em_state *S, em_alloc_fn *fn, void **ud);
em_status emi_tensor_new(em_state *S, const char *op, const int64_t *sizes, int ndim,
                         em_dtype dt, int device, em_tensor **out);
/* The same in channels-last order when nhwc (4-D only), and the NHWC strides of
** a 4-D shape (ops/layout.c), for backends that serve EMI_NHWC_* entries. */
em_status emi_tensor_new_fmt(em_state *S, const char *op, const int64_t *sizes, int ndim,
                             em_dtype dt, int device, bool nhwc, em_tensor **out);
void emi_nhwc_strides(const int64_t *sizes, int64_t *strides);
/* A new handle on t's storage with the given geometry (retains the storage). */
em_status emi_tensor_view(em_state *S, const em_tensor *t, const int64_t *sizes,
                          const int64_t *strides, int ndim, int64_t offset,
                          em_tensor **out);
em_tensor *emi_tensor_try_external(em_state *S, void *data, size_t nbytes,
                                   void (*free_fn)(void *ud, void *p, size_t n), void *ud,
                                   const int64_t *sizes, int ndim, em_dtype dt);
void emi_storage_release(emi_storage *st);
int64_t emi_shape_numel(const int64_t *sizes, int ndim);
em_status emi_check_tensor(em_state *S, const char *op, const em_tensor *t);
const char *emi_device_name(char *buf, int device);
double emi_now(void);
/* A device allocation failed: why (the allocator's account) for the message the
** op gives. */
void emi_alloc_failed(em_state *S, const char *why);
/* The device's memory is short (oom = 1: an allocation failed, else it passed
** the pressure mark): raises the state's memory-pressure flag and, on oom,
** calls the host's reclaim hook (em_cuda_set_reclaim_hook). */
void emi_memory_pressure(em_state *S, int device, size_t nbytes, int oom);
/* em_cuda_set_allow_tf32. */
int emi_allow_tf32(em_state *S);
/* v in the caller's numbering (em_set_index_base) for messages. */
long long emi_ix(const em_state *S, long long v);

/* float16 / bfloat16 and any dtype as a double. */
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
double emi_load_f64(const void *p, em_dtype dt);
void emi_store_f64(void *p, em_dtype dt, double v);
static inline void emi_atomic_inc(int *p) { __atomic_add_fetch(p, 1, __ATOMIC_RELAXED); }
static inline int emi_atomic_dec(int *p) { return __atomic_sub_fetch(p, 1, __ATOMIC_ACQ_REL); }

#endif

/*
** internal.h -- core/'s own shared declarations, on top of backend.h (what
** backends see): the state, the dispatch point, the device registry's core side,
** workers, construction and shape helpers. Nothing here is public API, and no
** backend outside core/ includes it.
**
** Layering: ops/ check arguments, work out shapes and dtypes, allocate the output
** and call the op table of the tensors' device (EMI_DISPATCH); cpu/, meta/ and
** the CUDA backend in kernels/ implement that table. Kernels may assume their
** inputs were checked: same device, shapes already broadcast (as strided views),
** dtypes as the table entry documents.
*/
#ifndef EMBER_INTERNAL_H
#define EMBER_INTERNAL_H
#include "ember.h"
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdbool.h>
#include <string.h>

#include "backend.h"


/* -- Workers (cpu/workers.c) ------------------------------------------------------
** The state's CPU threads: nthreads - 1 workers plus the caller (none for 1).
** emi_parallel_for runs fn(ctx, begin, end) over [0, n) in chunks of at least
** `grain` items; inline when one chunk covers it, and inline when called from
** inside a share (a nested call never re-enters the pool). */
typedef void (*emi_range_fn)(void *ctx, int64_t begin, int64_t end);
typedef struct emi_workers emi_workers;
emi_workers *emi_workers_new(em_state *S, int nthreads);   /* NULL: out of memory */
void emi_workers_free(emi_workers *w);
int emi_workers_size(const emi_workers *w);
void emi_parallel_for(em_state *S, int64_t n, int64_t grain, emi_range_fn fn,
                      void *ctx);

/* -- State ------------------------------------------------------------------------
** A kind's slot: its context for this state, opened once on first use (tried),
** and why it has no devices when it has none. One accelerator kind (cuda) serves
** device numbers 0 .. EMI_MAX_DEVICES-1; a second would take a slot here and the
** next range of numbers. */
enum { EMI_MAX_KINDS = 1 };
typedef struct emi_kind_slot {
  void *ctx;
  int tried;
  char why[256];
} emi_kind_slot;
/* One device's tensor bytes and their peak (atomic: loader workers allocate). */
typedef struct emi_mem_count { int64_t allocated, peak; } emi_mem_count;

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
  emi_device meta;                         /* the meta device's (core/meta/) */
  emi_mem_count cpu_mem, meta_mem;         /* per device; mem_allocated sums all */
  int64_t cpu_limit;                       /* em_set_memory_limit: 0 = none (atomic) */
  int current_device;                      /* the accelerator "cuda" names (em_cuda_set_device) */
  emi_device *devices[EMI_MAX_DEVICES];    /* the accelerator kind's, NULL until used */
  emi_kind_slot kinds[EMI_MAX_KINDS];      /* each accelerator kind's context (registry.c) */
  struct emi_profiler *profiler;           /* NULL unless recording (core/profile/) */
  struct emi_recorder *recorder;           /* NULL unless em.compile captures (core/compile/) */
  struct emi_profiler *profile_last;       /* the stopped profile, kept for reading */
  int memory_pressure;                     /* em_memory_pressure_flag */
  int allow_tf32;                          /* em_cuda_set_allow_tf32 */
  char alloc_why[256];                     /* why a backend's alloc just failed */
  void (*reclaim_hook)(void *ud, int device, size_t nbytes);   /* em_cuda_set_reclaim_hook */
  void *reclaim_ud;
  int grad_disabled;       /* autograd: 0 = grad mode on (the default); set with
                           ** emi_set_grad_disabled, which keeps ag_watch in step */
  int ag_watch;            /* grad mode on, or a probe listening (emi_ag_wanted*) */
  struct emi_ag_probe *ag_probe;   /* probe.c: the innermost active probe, or NULL */
  int ag_depth;            /* engine.c: backwards running (nested in custom nodes) */
  int ag_foreign;          /* engine.c: in a custom node, hook or callback (the host's code) */
  em_backward_reclaim_fn ag_reclaim;   /* em_backward_set_reclaim */
  void *ag_reclaim_ud;
  int ag_reclaiming;       /* ag_reclaim running: no second one inside it */
  int index_base;          /* messages number dims, positions, indices from it (0|1) */
  int64_t image_max_pixels; /* em_image_set_max_pixels: 0 default, > 0 limit, -1 none */
  struct emi_bw_callback *backward_callbacks;   /* engine.c: run at each backward's end */
  uint64_t dispatch_counts[EMI_MAX_BACKENDS][EMI_NENTRIES];   /* calls per backend entry */
  int64_t layout_conversions;   /* ops/layout.c: NCHW <-> NHWC copies (atomic) */
  char errmsg[EMI_ERRMSG_SIZE];
};

/* -- Errors ----------------------------------------------------------------------
** emi_error formats into S->errmsg and returns code, so: return emi_error(...). */
/* "[2,3]" into buf; returns buf. Buffers of EMI_SHAPE_STR bytes always fit. */
enum { EMI_SHAPE_STR = 8 * 24 + 4 };
const char *emi_shape_str(char *buf, const int64_t *sizes, int ndim);
/* Shorthand for messages: a tensor's shape as "[2,3]" in a rotating buffer (four
** slots, so up to four may appear in one message). */
const char *emi_tshape(em_state *S, const em_tensor *t);
/* Checks shared by every op: non-NULL tensor, dim in range (negative wraps). */
em_status emi_wrap_dim(em_state *S, const char *op, int *dim, int ndim);

/* Monotonic seconds, for timing (loader stats, collectives). */

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
/* compile (core/compile/): what a capture can't replay, and the engine's and the
** host's changes of a leaf's .grad, which it replays. No-ops unless capturing. */
void emi_compile_unfit(em_state *S, const char *fmt, ...);
void emi_compile_note_grad(em_state *S, em_tensor *leaf, em_tensor *grad, int first);
/* The references the capture's own views hold on st (0 unless capturing): a tensor
** the step made is still the step's alone when its storage has no others. */
int emi_compile_views_of(const em_state *S, const emi_storage *st);
void emi_compile_note_accumulate(em_state *S, const em_tensor *leaf);
/* A collective started on t (in place, contiguous, CPU) and the wait for one. */
void emi_compile_note_collective(em_state *S, em_comm *c, em_tensor *t, int broadcast,
                                 em_comm_op op, int root, em_comm_work *work);
void emi_compile_note_wait(em_state *S, em_comm_work *w);
/* A core call that reads a value and acts on it (clip_grad_norm: the norm, then
** the scaling it decides), run now by body and recorded as one call that runs
** body again at each replay, on the same tensors (list ts, n of them, on the CPU).
** Returns body's status; outside a capture it just runs body. */
typedef em_status (*emi_host_body)(em_state *S, int n, em_tensor *const *ts, const double *args,
                                   double *out);
em_status emi_compile_host_call(em_state *S, const char *op, emi_host_body body, int n,
                                em_tensor *const *ts, const double *args, int nargs, double *out);
/* A storage whose data lies in a compiled step's arena (counted there, once). */
int emi_storage_is_slice(const emi_storage *st);
#define EMI_DISPATCH(S, op, t, entry, ...) __extension__({                           \
    em_state *S_ = (S);                                                             \
    const em_tensor *t_ = (t);                                                      \
    emi_device *d_ = emi_device_of(S_, t_->device);                                 \
    em_status st_;                                                                  \
    if (__builtin_expect(!d_ || !d_->backend->entry, 0)) {                          \
      st_ = emi_no_kernel(S_, (op), #entry, t_->device);                            \
    } else {                                                                        \
      S_->dispatch_counts[d_->backend->id][EMI_ENTRY_##entry]++;                    \
      if (__builtin_expect(S_->recorder != NULL, 0) && d_ != &S_->cpu)              \
        emi_compile_unfit(S_, "%s runs on %s, and only CPU ops are captured", (op),  \
                          d_->backend->name);                                        \
      if (__builtin_expect(__atomic_load_n(&S_->profiler, __ATOMIC_RELAXED) != NULL, 0)) { \
        double t0_ = emi_profile_op_begin(S_);                                      \
        st_ = d_->backend->entry(d_, __VA_ARGS__);                                  \
        emi_profile_op_end(S_, (op), t_, t0_);                                      \
      } else                                                                        \
        st_ = d_->backend->entry(d_, __VA_ARGS__);                                  \
    }                                                                               \
    st_; })

/* -- Memory (state.c) ------------------------------------------------------------- */
/* Storage blocks (alloc.c): large ones are cached for reuse. *actual receives the
** size really allocated, which emi_block_free must be given back. */
void *emi_block_alloc(em_state *S, size_t n, size_t *actual);
void emi_block_free(em_state *S, void *p, size_t actual);
void emi_cache_release(em_state *S);
/* memlimit.c: S->alloc_why for a CPU allocation of nbytes the cap refused (and
** the pressure flag raised); "1.50 MiB" into buf. */
void emi_cpu_limit_why(em_state *S, size_t nbytes);
const char *emi_fmt_bytes(char *buf, size_t len, int64_t n);

/* io/files.c: fsync of the folder holding path, after a rename into it; 0, or -1
** with errno (a file system that cannot fsync folders counts as done). */
int emi_sync_folder_of(const char *path);

/* -- Tensor construction (tensor.c) -------------------------------------------------
** emi_tensor_new makes a contiguous tensor with fresh, uninitialised storage. */
/* Silent forms for threads that must not touch S->errmsg (loader workers): NULL
** on failure. Shapes must be valid; CPU only. The external form wraps data of
** nbytes that free_fn(ud, data, nbytes) releases with the storage (on failure the
** caller keeps it). */
em_tensor *emi_tensor_try_new(em_state *S, const int64_t *sizes, int ndim, em_dtype dt);
em_tensor *emi_tensor_try_view(em_state *S, const em_tensor *src, const int64_t *sizes,
                               const int64_t *strides, int ndim, int64_t offset);
/* emi_tensor_view: backend.h. */
void emi_contiguous_strides(const int64_t *sizes, int ndim, int64_t *strides);
/* Channels last (ops/layout.c): NHWC strides of a 4-D shape; t is channels last
** and not exactly of the default strides (the layout an op's output follows);
** a new tensor in NCHW or (4-D only) NHWC order; t as a new reference in that
** order (t itself when it is already, densely), a reorder counted and profiled
** as "convert_layout"; contiguous() of an NHWC tensor (autograd recorded). */
void emi_nhwc_strides(const int64_t *sizes, int64_t *strides);
bool emi_nhwc(const em_tensor *t);
em_status emi_tensor_new_fmt(em_state *S, const char *op, const int64_t *sizes, int ndim,
                             em_dtype dt, int device, bool nhwc, em_tensor **out);
em_status emi_layout_as(em_state *S, const char *op, const em_tensor *t, bool nhwc,
                        em_tensor **out);
em_status emi_contiguous_from_nhwc(em_state *S, const em_tensor *t, em_tensor **out);
/* An element-wise result of shape (nd dims) is NHWC when the leading operand of
** that full shape (a, else b; either may be NULL) is (TensorIterator's rule). */
bool emi_result_nhwc(const int64_t *shape, int nd, const em_tensor *a, const em_tensor *b);
/* sizes >= 0 and every contiguous stride product (0 dims as 1) x 16 fits int64 */
bool emi_shape_ok(const int64_t *sizes, int ndim);
/* Broadcast two shapes (numpy rules); EM_ERR_SHAPE with message naming op. */
em_status emi_broadcast_shape(em_state *S, const char *op, const int64_t *a, int na,
                              const int64_t *b, int nb, int64_t *out, int *nout);
/* A stride-0 view of t expanded to shape (t must broadcast to it). */
em_status emi_expand_to(em_state *S, const char *op, const em_tensor *t,
                        const int64_t *shape, int ndim, em_tensor **out);
/* -- The device registry (core/device/registry.c) ------------------------------------
** Accelerator devices 0 .. EMI_MAX_DEVICES-1 belong to the accelerator kind (cuda),
** a library loaded on the first ask of any state (libember_cuda.so beside
** libember, or linked in). A state opens the kind on its first use of one of
** its devices, and each device on its own first use. emi_device_attach: the
** device's context, opened for work (streams, a CUDA context), NULL when it
** can't be had (emi_accel_why says why). emi_accel_peek: the device's context
** without opening it, for facts that need no CUDA context (properties, memory
** counts), NULL when there is no such device. emi_accel: the kind and its
** context for S (opening the kind, no device, on first use), NULL when there is
** none. */
emi_device *emi_device_attach(em_state *S, int device);
emi_device *emi_accel_peek(em_state *S, int device);
const emi_backend_kind *emi_accel(em_state *S, void **ctx);
const char *emi_accel_why(em_state *S);
int emi_accel_count(em_state *S);
/* The kind whose library is loaded in this process, without loading it; and
** the kind, loading its library if need be (NULL: why says why). */
const emi_backend_kind *emi_accel_loaded(void);
const emi_backend_kind *emi_accel_library(char *why, size_t whylen);
void emi_devices_close(em_state *S);      /* em_close */
/* The services of a device's kind (NULL for cpu and meta). */
const emi_services *emi_services_of(em_state *S, int device);
/* A storage of nbytes from device d's backend, counted (core/tensor.c); NULL
** when the backend has none to give. */
emi_storage *emi_storage_new(emi_device *d, size_t nbytes);
/* Moves delta bytes into (> 0) or out of (< 0) the memory counts of S and device. */
void emi_storage_account(em_state *S, int device, int64_t delta);
/* Drops one reference to a storage, freeing it with the last (core/tensor.c). */
void emi_storage_release(emi_storage *st);

/* The context of a device, or NULL when no backend serves it. */
static inline emi_device *emi_device_of(em_state *S, int device) {
  if (device == EM_CPU) return &S->cpu;
  if (device == EM_META) return &S->meta;
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
/* The same, visiting the dims in ops[0]'s memory order when it has positive
** strides out of dim order (a channels-last output): for kernels that may visit
** elements in any order. */
void emi_iter_init_by_memory(emi_iter *it, em_tensor *const *ops, int nops);
/* Pointers to the start of row r for each operand. */
void emi_iter_row(const emi_iter *it, int64_t r, char **ptrs);


/* Autograd's storage versions: every in-place write bumps its storage's (saved
** tensors compare it at backward). Atomic: views of one storage may be written
** from several threads (replicas, loader workers). */
static inline void emi_bump_version(const em_tensor *t) {
  __atomic_add_fetch(&t->storage->version, 1, __ATOMIC_RELAXED);
}
/* Adam's bias correction for one parameter at step (from 1): the step size lr /
** (1 - beta1^step) and sqrt(1 - beta2^step) (ops/optim.c, and a compiled step's
** patch, which must give the same bits). */
static inline void emi_adam_factors(double lr, double beta1, double beta2, int64_t step,
                                    double *step_size, double *bc2_sqrt) {
  *step_size = lr / (1 - pow(beta1, (double)step));
  *bc2_sqrt = sqrt(1 - pow(beta2, (double)step));
}
static inline uint32_t emi_version(const em_tensor *t) {
  return __atomic_load_n(&t->storage->version, __ATOMIC_RELAXED);
}

/* -- Autograd's part of a tensor (core/autograd/) ---------------------------------
** What autograd keeps of a tensor beyond requires_grad lives in one block behind
** t->ag, made when first needed (a leaf marked to require grad, an op's recorded
** output, a .grad assigned, a hook added): a plain tensor carries one NULL, and
** the engine's fields change without changing the tensor the backends see. */
typedef struct emi_ag_meta {
  struct emi_ag_node *grad_fn;   /* owned reference, NULL for leaves */
  em_tensor *grad;               /* owned reference, NULL until a backward */
  struct emi_ag_hook *hooks;     /* gradient hooks of a leaf (owned list) */
  em_tensor *grad_dest;          /* owned reference: where a leaf's first gradient goes */
  struct emi_ag_walk *capture;   /* engine scratch: the backward capturing its grad */
  int pending;                   /* engine scratch: contributions still to come */
  int dest_busy;                 /* engine scratch: grad_dest handed to a producer */
} emi_ag_meta;
/* New handles start with no history; a release drops the block (grad, grad_fn,
** hooks, destination). */
static inline void emi_ag_clear_fields(em_tensor *t) {
  t->requires_grad = 0;
  t->ag = NULL;
}
void emi_ag_release_fields(em_tensor *t);
/* t's block, made (zeroed) on first use; NULL when out of memory. */
emi_ag_meta *emi_ag_meta_of(em_tensor *t);
static inline struct emi_ag_node *emi_ag_grad_fn(const em_tensor *t) {
  return t->ag ? t->ag->grad_fn : NULL;
}
static inline em_tensor *emi_ag_grad(const em_tensor *t) { return t->ag ? t->ag->grad : NULL; }
/* Grad mode's one writer: a probe listens with grad mode off, so the ops' single
** test (emi_ag_wanted*) reads ag_watch, which is either. */
static inline void emi_set_grad_disabled(em_state *S, int off) {
  S->grad_disabled = off;
  S->ag_watch = !off | (S->ag_probe != NULL);
}
void emi_ag_probe_free(em_state *S);   /* em_close: drops probes left open */
void emi_backward_callbacks_free(em_state *S);
/* An allocation failed: runs the host's reclaim when inside a backward's own
** kernels (em_backward_set_reclaim); 1 when it ran and the allocation is worth
** trying again. */
int emi_backward_reclaim(em_state *S);

/* -- Numbering in messages (state.c); copies on the calling thread (cpu/strided.c) --
** Messages show dims, list positions and indices in the caller's numbering:
** S->index_base, 0 unless the host set it (em_set_index_base; the Lua layer sets
** 1). emi_ix(S, v) is v, 0-based as C holds it, in that numbering; a negative v
** (counted from the end) is shown as given. */
/* Same-dtype copies that never use the state's workers, so loader threads can
** run them. emi_copy_row: n elements of es bytes from src, ss bytes apart
** (negative walks backwards), to contiguous dst. emi_copy_strided: src (CPU,
** any strides) into the contiguous bytes at dst. */
void emi_copy_row(void *dst, const void *src, int64_t n, int64_t ss, size_t es);
void emi_copy_strided(void *dst, const em_tensor *src);

#endif

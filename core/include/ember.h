/*
** ember.h -- the one public header of the ember C core.
**
** Rules (see shared/API.md, "C API"):
**  - one opaque state, no globals: everything hangs off an em_state;
**  - every call that can fail returns em_status (0 = EM_OK) and leaves a message
**    in em_errmsg(S); nothing here ever aborts or exits the host;
**  - tensors are refcounted handles: a function that hands out a tensor through
**    an `em_tensor **out` gives the caller one reference, dropped with
**    em_tensor_release;
**  - dimensions and indices are 0-based in C. Functions that take or return index
**    values (argmax, gather, ...) have an `index_base` argument so that the Lua
**    layer can speak 1-based without an extra pass over the data, and messages
**    number dims, list positions and indices from the state's index base
**    (em_set_index_base: 0 by default, 1 from Lua) -- never rewritten afterwards;
**  - the file is plain enough for LuaJIT's ffi.cdef: no structs by value, no
**    varargs, no macros outside the guarded preprocessor block below (the build
**    strips lines starting with '#' when it generates the Lua cdefs).
**
** Lua in a host program. The Lua layer opens with `luaopen_ember(lua_State *L)`
** (in libember_lua: link -lember_lua; declared in lua/host/luaopen.c, since this
** header includes no Lua header): it pushes the `ember` module. A global
** EMBER_CONFIG, a light userdata pointing at an em_config set before the first
** use of the module, gives the Lua layer's state the host's config (its
** allocator, and with it a memory cap). examples/embed/ shows both.
**
** Threads. ember has no global state (OpenBLAS's thread count aside: see
** em_blas_pin_threads), so states on different threads never interfere; replicas
** in threads are exactly that, one em_state per thread.
**  - An em_state and everything made from it -- tensors, datasets, transforms,
**    loaders, safetensors files, communicators, reducers, the profiler -- is used
**    by one thread at a time (the host serialises its calls), except as below.
**    em_errmsg is per state: the message of that state's last failed call.
**  - Any thread, any time: em_tensor_retain / em_tensor_release and the
**    retain / release of datasets, transforms and local groups (atomic counts;
**    the last release frees through the owning state's allocator, which is why
**    the hook below must be thread-safe, and runs a custom transform's
**    release(ud) on that thread), em_memory_allocated / em_memory_peak,
**    em_memory_release_cached, and the calls that take no state: em_config_init,
**    em_open, em_version, em_build_info, em_dtype_name / _size / _is_floating /
**    _promote, the float16 / bfloat16 conversions, em_json_quote, em_utf8_valid,
**    em_mpi_launched, em_blas_pin_threads, em_profile_clock, em_local_group_new
**    / _abort / _failure, em_comm_abort.
**    Threads of different states may read one tensor's values through ops at
**    once (replicas sharing a dataset's tensors) when none of them records
**    autograd on it; writing a tensor (in place, or its .grad in em_backward)
**    while another thread uses it is a race.
**  - Threads ember starts itself: the state's workers (num_threads - 1; an op
**    returns only when its kernel is done on all of them), a loader's workers
**    (they compute samples and batches from the loader's immutable datasets,
**    call custom transforms -- concurrently for different workers -- and the
**    loader's buffer_alloc; buffer_free runs wherever a batch's last reference
**    goes), and a communicator's thread (each collective runs there; with a
**    local group it reads and writes the other replicas' staging buffers). None
**    of them writes em_errmsg or runs host code other than those callbacks.
**    While the state's profiler records, each of them appends to a buffer of its
**    own (em_profile_events merges them after em_profile_stop).
**  - Communicators: one per replica, each used from its own state's thread;
**    every replica calls the same collectives in the same order.
**  - Callbacks run on the thread that caused them: gradient hooks and backward
**    callbacks on the thread in em_backward (they may call ember on that state).
**  - The allocator hook (em_config.alloc) is called from all of the threads above
**    and from any thread that drops a tensor's last reference, concurrently, and
**    sometimes while ember holds an internal lock (its cache of large blocks):
**    it must be thread-safe and must never call back into ember. ember only
**    allocates (ptr NULL) and frees (nsize 0, osize = the size it asked for);
**    it never resizes. Blocks need malloc's alignment: ember aligns tensor data
**    to 64 bytes itself. NULL is a clean EM_ERR_NOMEM (for a large block only
**    after ember has handed its cached blocks back and asked once more).
**  - em_close runs on the state's thread after its loaders, communicators and
**    reducers are freed and every tensor, dataset and transform it made has
**    been released (nothing may be released after it).
*/
#ifndef EMBER_H
#define EMBER_H
#include <stddef.h>
#include <stdint.h>
#ifdef __cplusplus
extern "C" {
#endif

/* -- Status codes ------------------------------------------------------- */
typedef enum em_status {
  EM_OK = 0,
  EM_ERR_ARG = 1,        /* bad argument (NULL, out of range, ...) */
  EM_ERR_SHAPE = 2,      /* shapes do not fit */
  EM_ERR_DTYPE = 3,      /* dtype not supported by the op */
  EM_ERR_DEVICE = 4,     /* tensors on different devices, or device missing */
  EM_ERR_NOMEM = 5,      /* allocation failed */
  EM_ERR_IO = 6,         /* file missing, truncated or corrupt */
  EM_ERR_INDEX = 7,      /* index out of range */
  EM_ERR_UNSUPPORTED = 8,/* not built in, or not implemented for these inputs */
  EM_ERR_INTERNAL = 9
} em_status;

/* -- Dtypes --------------------------------------------------------------- */
typedef enum em_dtype {
  EM_FLOAT32 = 0, EM_FLOAT64 = 1, EM_FLOAT16 = 2, EM_BFLOAT16 = 3,
  EM_INT32 = 4, EM_INT64 = 5, EM_UINT8 = 6, EM_BOOL = 7,
  EM_NUM_DTYPES = 8
} em_dtype;

/* Device numbers: EM_CPU, EM_META (tensors with shapes and dtypes and no data),
** or 0, 1, ... for the accelerator devices (cuda:0, cuda:1, ...). Names and
** numbers convert with em_device_parse / em_device_str. */
enum { EM_CPU = -1, EM_META = -2 };
/* Most dimensions a tensor can have. */
enum { EM_MAX_DIMS = 8 };

typedef struct em_state em_state;
typedef struct em_tensor em_tensor;

/* -- State ------------------------------------------------------------------
** alloc follows Lua's lua_Alloc contract: alloc(ud, ptr, osize, nsize) frees
** ptr when nsize == 0 and returns NULL; otherwise (re)allocates. It may return
** NULL to refuse, and ember reports EM_ERR_NOMEM cleanly. It must be
** thread-safe and must not call into ember (see "Threads" above). */
typedef void *(*em_alloc_fn)(void *ud, void *ptr, size_t osize, size_t nsize);

typedef struct em_config {
  int num_threads;        /* 0 = one per core */
  em_alloc_fn alloc;      /* NULL = malloc/realloc/free */
  void *alloc_ud;
  uint64_t seed;          /* initial RNG seed */
  /* Freed CPU blocks of 64 KiB and more are kept for reuse up to this many bytes:
  ** 0 = default (512 MiB), negative = keep none. */
  int64_t cache_limit;
} em_config;

void em_config_init(em_config *cfg);
em_status em_open(em_state **S, const em_config *cfg);
void em_close(em_state *S);
const char *em_errmsg(em_state *S);
/* The numbering messages use for dims, list positions and indices: 0 (the
** default, C's) or 1 (the Lua layer's); index values passed to ops keep their
** own index_base argument. */
em_status em_set_index_base(em_state *S, int base);
int em_get_index_base(em_state *S);
em_status em_set_num_threads(em_state *S, int n);
int em_get_num_threads(em_state *S);
const char *em_version(void);
/* One line per backend/library: BLAS, CUDA, cuDNN, NCCL, MPI. */
const char *em_build_info(void);
/* Bytes held by live tensor storages of this state, and the peak since open. */
int64_t em_memory_allocated(em_state *S);
int64_t em_memory_peak(em_state *S);
/* Bytes of freed blocks kept for reuse, and giving them back to the allocator. */
int64_t em_memory_cached(em_state *S);
void em_memory_release_cached(em_state *S);

/* -- Dtype facts -------------------------------------------------------------- */
const char *em_dtype_name(em_dtype dt);
size_t em_dtype_size(em_dtype dt);
int em_dtype_is_floating(em_dtype dt);
/* EM_OK and *dt set, or EM_ERR_DTYPE for an unknown name. */
em_status em_dtype_from_name(em_state *S, const char *name, em_dtype *dt);
/* The dtype PyTorch's promotion rules give a binary op on a and b. */
em_dtype em_dtype_promote(em_dtype a, em_dtype b);
/* One float16 / bfloat16 value (its bits) to float and back, rounding to nearest
** even, as every op converts them. */
float em_half_to_float(uint16_t h);
uint16_t em_float_to_half(float f);
float em_bfloat16_to_float(uint16_t b);
uint16_t em_float_to_bfloat16(float f);

/* -- Tensor handles ------------------------------------------------------------ */
void em_tensor_retain(em_tensor *t);
void em_tensor_release(em_tensor *t);
int em_tensor_ndim(const em_tensor *t);
/* Pointers into the handle: valid while the handle lives, ndim entries each. */
const int64_t *em_tensor_sizes(const em_tensor *t);
const int64_t *em_tensor_strides(const em_tensor *t);  /* in elements */
int64_t em_tensor_size(const em_tensor *t, int dim);
int64_t em_tensor_stride(const em_tensor *t, int dim);
int64_t em_tensor_offset(const em_tensor *t);           /* in elements */
int64_t em_tensor_numel(const em_tensor *t);
em_dtype em_tensor_dtype(const em_tensor *t);
int em_tensor_device(const em_tensor *t);
int em_tensor_is_contiguous(const em_tensor *t);
/* Address of element [0,...,0] (storage base + offset) for CPU tensors. */
void *em_tensor_data(const em_tensor *t);
/* Two tensors view the same storage. */
int em_tensor_same_storage(const em_tensor *a, const em_tensor *b);
/* The storage a tensor views, as an identity (every view of one storage gives the
** same pointer, on every device, meta included), and that storage's size in bytes:
** for counting memory once per storage. */
const void *em_tensor_storage_id(const em_tensor *t);
int64_t em_tensor_storage_nbytes(const em_tensor *t);
/* The single element of a one-element tensor, as a double / as an int64. */
em_status em_tensor_item(em_state *S, const em_tensor *t, double *out);
em_status em_tensor_item_int(em_state *S, const em_tensor *t, int64_t *out);

/* -- Creation --------------------------------------------------------------- */
em_status em_empty(em_state *S, const int64_t *shape, int ndim, em_dtype dt,
                   int device, em_tensor **out);
em_status em_full(em_state *S, const int64_t *shape, int ndim, double value,
                  em_dtype dt, int device, em_tensor **out);
/* Copies n values of type src_dt from data into a new contiguous tensor. */
em_status em_from_data(em_state *S, const int64_t *shape, int ndim, em_dtype dt,
                       const void *data, em_dtype src_dt, em_tensor **out);
/* Values start, start+step, ... up to stop (exclusive). */
em_status em_arange(em_state *S, double start, double stop, double step,
                    em_dtype dt, int device, em_tensor **out);
em_status em_eye(em_state *S, int64_t n, int64_t m, em_dtype dt, int device,
                 em_tensor **out);

/* -- Random numbers --------------------------------------------------------------
** Counter-based (Philox 4x32-10): element i of a draw depends only on the seed,
** the draw's position in the stream and i, never on the thread count. */
void em_manual_seed(em_state *S, uint64_t seed);
void em_rng_get_state(em_state *S, uint64_t *seed, uint64_t *offset);
void em_rng_set_state(em_state *S, uint64_t seed, uint64_t offset);
em_status em_uniform_(em_state *S, em_tensor *t, double lo, double hi);
em_status em_normal_(em_state *S, em_tensor *t, double mean, double std);
/* Integers in [lo, hi). */
em_status em_randint_(em_state *S, em_tensor *t, int64_t lo, int64_t hi);

/* -- Views (share storage with the input) ---------------------------------------
** A shape entry of -1 in view/reshape is inferred. */
em_status em_view(em_state *S, const em_tensor *a, const int64_t *shape, int ndim,
                  em_tensor **out);
/* A view when the strides allow it, a copy otherwise. */
em_status em_reshape(em_state *S, const em_tensor *a, const int64_t *shape,
                     int ndim, em_tensor **out);
em_status em_transpose(em_state *S, const em_tensor *a, int d1, int d2,
                       em_tensor **out);
em_status em_permute(em_state *S, const em_tensor *a, const int *perm, int ndim,
                     em_tensor **out);
em_status em_narrow(em_state *S, const em_tensor *a, int dim, int64_t start,
                    int64_t length, em_tensor **out);
em_status em_select(em_state *S, const em_tensor *a, int dim, int64_t index,
                    em_tensor **out);
/* all != 0 squeezes every size-1 dimension (dim is then ignored); otherwise only
** dim, which counts from the end when negative, and only if its size is 1. */
em_status em_squeeze(em_state *S, const em_tensor *a, int dim, int all,
                     em_tensor **out);
em_status em_unsqueeze(em_state *S, const em_tensor *a, int dim, em_tensor **out);
/* A shape entry of -1 keeps that size; new leading dims are allowed. */
em_status em_expand(em_state *S, const em_tensor *a, const int64_t *shape, int ndim,
                    em_tensor **out);
em_status em_as_strided(em_state *S, const em_tensor *a, const int64_t *shape,
                        const int64_t *strides, int ndim, int64_t offset,
                        em_tensor **out);

/* -- Copies and conversion -------------------------------------------------------- */
/* Returns a new reference to a itself when it is already contiguous. */
em_status em_contiguous(em_state *S, const em_tensor *a, em_tensor **out);
em_status em_clone(em_state *S, const em_tensor *a, em_tensor **out);
/* Channels last (NHWC memory order of a 4-D (N,C,H,W) tensor; strides
** (H*W*C, 1, W*C, C)). is_channels_last is PyTorch's is_contiguous(memory_format=
** channels_last) (size-1 dims are free). to_channels_last returns a new reference
** to t itself when it already has exactly those strides, else an NHWC copy.
** set_memory_format_ reorders t's data in place of its storage (the handle stays:
** a module's parameters keep their identity); 0 = NCHW, 1 = NHWC; not 4-D: no-op.
** em_layout_conversions counts the copies that reordered a tensor between the two
** layouts (asked for, or made inside an op), profiled as op "convert_layout". */
int em_tensor_is_channels_last(const em_tensor *t);
em_status em_to_channels_last(em_state *S, const em_tensor *t, em_tensor **out);
em_status em_tensor_set_memory_format_(em_state *S, em_tensor *t, int channels_last);
int64_t em_layout_conversions(em_state *S);
/* The copies S's backends have run, on every device: each call of a backend's copy
** (copy_, clone, contiguous of a strided tensor, to, casts, layout conversions,
** from_data, an op's converted temporaries). Read before and after a region to see
** that it copied nothing, whatever else it ran. */
int64_t em_copy_count(em_state *S);
/* dst[...] = src, broadcasting src to dst's shape and converting dtypes. */
em_status em_copy_(em_state *S, em_tensor *dst, const em_tensor *src);
/* Returns a new reference to a itself when dtype and device already match. */
em_status em_to(em_state *S, const em_tensor *a, em_dtype dt, int device,
                em_tensor **out);

/* -- Element-wise ------------------------------------------------------------- */
typedef enum em_unop {
  EM_NEG = 0, EM_ABS, EM_EXP, EM_LOG, EM_SQRT, EM_RSQRT, EM_SIN, EM_COS, EM_TANH,
  EM_SIGMOID, EM_RELU, EM_GELU, EM_SILU,
  EM_FLOOR, EM_CEIL, EM_ROUND, EM_TRUNC, EM_SIGN, EM_RECIPROCAL, EM_SQUARE,
  EM_LOG1P, EM_EXPM1, EM_LOG2, EM_LOG10, EM_TAN, EM_ASIN, EM_ACOS, EM_ATAN,
  EM_SINH, EM_COSH, EM_ERF, EM_LOGICAL_NOT, EM_GELU_TANH,
  EM_NUM_UNOPS
} em_unop;

typedef enum em_binop {
  EM_ADD = 0, EM_SUB, EM_MUL, EM_DIV, EM_POW, EM_MAXIMUM, EM_MINIMUM,
  EM_EQ, EM_NE, EM_LT, EM_LE, EM_GT, EM_GE,   /* comparisons give bool */
  EM_REMAINDER, EM_ATAN2, EM_LOGICAL_AND, EM_LOGICAL_OR,
  EM_NUM_BINOPS
} em_binop;

const char *em_unop_name(em_unop op);
const char *em_binop_name(em_binop op);
em_status em_unary(em_state *S, em_unop op, const em_tensor *a, em_tensor **out);
em_status em_unary_(em_state *S, em_unop op, em_tensor *a);
/* Broadcasting, with PyTorch's type promotion. */
em_status em_binary(em_state *S, em_binop op, const em_tensor *a,
                    const em_tensor *b, em_tensor **out);
/* a = a op b; b broadcasts to a's shape; the result is cast to a's dtype. */
em_status em_binary_(em_state *S, em_binop op, em_tensor *a, const em_tensor *b);
/* a op s, or s op a when reverse is non-zero (a Python-number scalar: it does not
** promote an integer or float tensor beyond its kind). */
em_status em_binary_scalar(em_state *S, em_binop op, const em_tensor *a, double s,
                           int reverse, em_tensor **out);
em_status em_binary_scalar_(em_state *S, em_binop op, em_tensor *a, double s);
/* out = a + alpha * b (broadcasting); the in-place form writes into a. */
em_status em_add_scaled(em_state *S, const em_tensor *a, const em_tensor *b,
                        double alpha, em_tensor **out);
em_status em_add_scaled_(em_state *S, em_tensor *a, const em_tensor *b, double alpha);
/* Bounds may be -inf / +inf for "none"; NaN stays NaN. */
em_status em_clamp(em_state *S, const em_tensor *a, double lo, double hi,
                   em_tensor **out);
em_status em_clamp_(em_state *S, em_tensor *a, double lo, double hi);
em_status em_where(em_state *S, const em_tensor *cond, const em_tensor *a,
                   const em_tensor *b, em_tensor **out);
em_status em_fill_(em_state *S, em_tensor *t, double value);

/* -- Reductions ----------------------------------------------------------------
** dims lists the dimensions to reduce (0-based, negative counts from the end);
** ndims == 0 reduces over all of them. */
typedef enum em_redop {
  EM_SUM = 0, EM_MEAN, EM_PROD, EM_AMAX, EM_AMIN, EM_LOGSUMEXP,
  EM_ANY, EM_ALL,
  EM_NUM_REDOPS
} em_redop;

em_status em_reduce(em_state *S, em_redop op, const em_tensor *a, const int *dims,
                    int ndims, int keepdim, em_tensor **out);
/* Variance / standard deviation with the given correction (1 = unbiased). */
em_status em_var(em_state *S, const em_tensor *a, const int *dims, int ndims,
                 double correction, int keepdim, int take_sqrt, em_tensor **out);
/* p-norm (p = 2 Euclidean; INFINITY max-abs). */
em_status em_norm(em_state *S, const em_tensor *a, double p, const int *dims,
                  int ndims, int keepdim, em_tensor **out);
/* max/min along one dim: values and indices (int64, counted from index_base). */
em_status em_max_dim(em_state *S, const em_tensor *a, int dim, int keepdim,
                     int index_base, em_tensor **values, em_tensor **indices);
em_status em_min_dim(em_state *S, const em_tensor *a, int dim, int keepdim,
                     int index_base, em_tensor **values, em_tensor **indices);
/* Index of the first max/min; all = non-zero means over the flattened tensor. */
em_status em_argmax(em_state *S, const em_tensor *a, int dim, int all, int keepdim,
                    int index_base, em_tensor **out);
em_status em_argmin(em_state *S, const em_tensor *a, int dim, int all, int keepdim,
                    int index_base, em_tensor **out);
/* Numerically stable softmax / log_softmax along dim. */
em_status em_softmax(em_state *S, const em_tensor *a, int dim, int log,
                     em_tensor **out);

/* -- Linear algebra --------------------------------------------------------------
** matmul follows numpy/PyTorch: 1-D operands are promoted and the added dim
** removed after; batch dimensions broadcast. */
em_status em_matmul(em_state *S, const em_tensor *a, const em_tensor *b,
                    em_tensor **out);
/* The Linear layer: out = x @ w^T + b, w (out_features, in_features) as PyTorch
** keeps it, b (out_features) or NULL. The same result, gradients included, as
** em_matmul(x, transpose(w)) then em_binary(EM_ADD, ., b); when nothing needs
** recording (grad mode off or no input requiring grad) it creates no tensor but
** the result, which is what makes small-net inference cheap. */
em_status em_linear(em_state *S, const em_tensor *x, const em_tensor *w,
                    const em_tensor *b, em_tensor **out);

/* -- Joining and indexing ----------------------------------------------------- */
em_status em_cat(em_state *S, em_tensor *const *list, int n, int dim,
                 em_tensor **out);
em_status em_stack(em_state *S, em_tensor *const *list, int n, int dim,
                   em_tensor **out);
/* idx is a 1-D integer tensor; its values count from index_base. */
em_status em_index_select(em_state *S, const em_tensor *a, int dim,
                          const em_tensor *idx, int index_base, em_tensor **out);
em_status em_gather(em_state *S, const em_tensor *a, int dim, const em_tensor *idx,
                    int index_base, em_tensor **out);
/* labels: integer tensor of any shape; out has one more dim of size n (int64).
** n <= 0 takes max(labels) + 1 - index_base. */
em_status em_one_hot(em_state *S, const em_tensor *labels, int64_t n, int index_base,
                     em_tensor **out);

/* -- Sorting and scans along one dim --------------------------------------------
** Stable sorts: equal elements keep their order; NaN sorts above every number.
** indices are int64 counted from index_base; values are a's elements in that
** order (differentiable). topk: the k largest (smallest) along dim, sorted,
** 0 <= k <= size. cumsum / cumprod: inclusive, integers and bool in int64. */
em_status em_argsort(em_state *S, const em_tensor *a, int dim, int descending,
                     int index_base, em_tensor **indices);
em_status em_sort(em_state *S, const em_tensor *a, int dim, int descending, int index_base,
                  em_tensor **values, em_tensor **indices);
em_status em_topk(em_state *S, const em_tensor *a, int64_t k, int dim, int largest,
                  int index_base, em_tensor **values, em_tensor **indices);
em_status em_cumsum(em_state *S, const em_tensor *a, int dim, em_tensor **out);
em_status em_cumprod(em_state *S, const em_tensor *a, int dim, em_tensor **out);

/* -- Dataset files ------------------------------------------------------------
** An IDX file (MNIST's format), gzip-compressed or raw, as one tensor of the
** file's shape: uint8, int32, float32 or float64 by the file's type code. */
em_status em_idx_load(em_state *S, const char *path, em_tensor **out);

/* -- Saving ---------------------------------------------------------------------
** safetensors files: an 8-byte little-endian header length N, N bytes of JSON
** {"name": {"dtype": "F32", "shape": [2, 3], "data_offsets": [begin, end]}, ...,
** "__metadata__": {"key": "value", ...}}, then the tensors' bytes (little-endian,
** row-major), covered exactly by the offsets. Dtypes F32 F64 F16 BF16 I32 I64 U8
** BOOL map to ember's; files with other dtypes (I8, U16, F8_*, ...) open, but
** reading those tensors fails with EM_ERR_DTYPE.
**
** em_safetensors_open reads and validates the whole header (every entry, the
** offsets covering the data with no gap or overlap, no duplicate names) without
** reading tensor data; any lie in the file is EM_ERR_IO with a message naming
** the file and the problem. Names, keys and values are valid until close;
** entries keep the file's header order. */
typedef struct em_safetensors em_safetensors;

em_status em_safetensors_open(em_state *S, const char *path, em_safetensors **out);
void em_safetensors_close(em_safetensors *f);
int64_t em_safetensors_count(const em_safetensors *f);
/* Name of entry i (0-based), or NULL when i is out of range. */
const char *em_safetensors_name(const em_safetensors *f, int64_t i);
/* Index of the entry called name, or -1. */
int64_t em_safetensors_find(const em_safetensors *f, const char *name);
/* Dtype and shape of entry i without reading it (shape has room for EM_MAX_DIMS). */
em_status em_safetensors_info(em_state *S, const em_safetensors *f, int64_t i,
                              em_dtype *dt, int *ndim, int64_t *shape);
/* Reads entry i into a new contiguous CPU tensor. */
em_status em_safetensors_get(em_state *S, em_safetensors *f, int64_t i, em_tensor **out);
/* The __metadata__ pairs, in file order. */
int64_t em_safetensors_metadata_count(const em_safetensors *f);
const char *em_safetensors_metadata_key(const em_safetensors *f, int64_t i);
const char *em_safetensors_metadata_value(const em_safetensors *f, int64_t i);

/* Writes n tensors (any strides; CPU) under the given names, plus nmeta metadata
** pairs (NULL arrays when n or nmeta is 0). Names and metadata must be valid
** UTF-8 and unique; "__metadata__" is not a tensor name. The file is written to
** a temporary file in the same folder and renamed over path, so path holds
** either its old content or the complete new one, never a mix; with
** EM_SAVE_SYNC the data and the rename are also flushed to the disk (fsync of
** the file, then of the folder) before the call returns.
** EM_SAVE_IN_PLACE writes path itself, created or truncated, with no temporary
** file: for a file that nothing reads until a later commit names it (the
** shards of a sharded checkpoint), so that a crash leaves no stray temporary. */
enum { EM_SAVE_SYNC = 1, EM_SAVE_IN_PLACE = 2 };
em_status em_safetensors_write(em_state *S, const char *path, const char *const *names,
                               em_tensor *const *tensors, int64_t n,
                               const char *const *meta_keys,
                               const char *const *meta_values, int64_t nmeta, int flags);
/* Elements [lo, hi) of entry i, flattened (row-major), into a new 1-D CPU tensor
** of hi - lo elements: only those bytes are read from the file (a sharded
** checkpoint's loader reads just the ranges it needs). 0 <= lo <= hi <= numel. */
em_status em_safetensors_read_range(em_state *S, em_safetensors *f, int64_t i, int64_t lo,
                                    int64_t hi, em_tensor **out);

/* Files for checkpoints made of several files. em_file_write replaces path with
** the n bytes at data as em_safetensors_write does (a temporary file in the same
** folder renamed over path; with EM_SAVE_SYNC the file, then its folder, are
** fsynced). em_dir_make creates the folder path (one level, mode 0777 less the
** umask); a folder already there is fine, anything else there is an error.
** em_dir_sync fsyncs the folder path, so that renames and removals in it are on
** the disk when it returns. */
em_status em_file_write(em_state *S, const char *path, const void *data, size_t n, int flags);
em_status em_dir_make(em_state *S, const char *path);
em_status em_dir_sync(em_state *S, const char *path);

/* The JSON string quoting the writer above uses, for hosts that write JSON
** themselves (the Lua layer's checkpoint document): s[0..n) as a quoted JSON
** string into dst when dst is not NULL; returns the quoted length (call with NULL
** first to size dst). s must be valid UTF-8: em_utf8_valid(s, n) is 1 when it is
** (no overlong forms, surrogates or values past U+10FFFF). */
size_t em_json_quote(char *dst, const char *s, size_t n);
int em_utf8_valid(const char *s, size_t n);

/* -- Autograd --------------------------------------------------------------------
** Reverse-mode automatic differentiation (API.md, "Autograd"). With grad mode on
** (the default), every differentiable op whose inputs require grad records how
** to differentiate it; em_backward walks that graph once, from a root, and adds
** the gradients into the .grad of the leaves (tensors marked with
** em_tensor_set_requires_grad). The graph is freed as it is walked. */
em_status em_set_grad_enabled(em_state *S, int enabled);
int em_is_grad_enabled(em_state *S);
/* Only floating-point tensors can require grad; only leaves can be unmarked. */
em_status em_tensor_set_requires_grad(em_state *S, em_tensor *t, int flag);
int em_tensor_requires_grad(const em_tensor *t);
/* A tensor with no recorded history (a leaf). */
int em_tensor_is_leaf(const em_tensor *t);
/* Call before writing a tensor's memory directly (through em_tensor_data), as
** every in-place op does first: it bumps the version of t's storage, so that a
** backward that saved t (or a view of its storage) fails instead of using the
** changed values, and it refuses, naming op, when grad mode is on and t
** requires grad (autograd can't follow such a write). */
em_status em_tensor_bump_version(em_state *S, em_tensor *t, const char *op);
/* The version of t's storage: bumped by every in-place write (em_tensor_bump_version),
** so a caller can tell whether a tensor was written since it last looked. */
uint32_t em_tensor_version(const em_tensor *t);
/* Parameters whose data comes and goes (sharded training: a parameter is
** gathered for its module's forward and backward and freed between). t must own
** its whole storage (contiguous, offset 0) and, the first time, be its only
** handle. em_tensor_free_data frees the memory and keeps the storage, so every
** view of it -- autograd's saved tensors included -- sees the data again after
** em_tensor_fill_data, which allocates it anew on t's device and copies src
** (t's shape; any dtype, same device) in without bumping the version (the
** values are the ones saved tensors were recorded with). While freed, t reads
** as a tensor of the meta device: shapes work, values are an error, and ops
** with tensors of other devices fail naming both devices. */
em_status em_tensor_free_data(em_state *S, em_tensor *t);
em_status em_tensor_fill_data(em_state *S, em_tensor *t, const em_tensor *src);
int em_tensor_has_data(const em_tensor *t);
/* A new reference to t's accumulated gradient, or NULL when there is none. */
em_tensor *em_tensor_grad(const em_tensor *t);
/* Replaces t's gradient (g may be NULL to clear it; same shape otherwise). */
em_status em_tensor_set_grad(em_state *S, em_tensor *t, em_tensor *g);
/* Backpropagates from root. grad is d(out)/d(root) with root's shape, or NULL
** for a one-element root (taken as 1). */
em_status em_backward(em_state *S, em_tensor *root, const em_tensor *grad);
/* A view of a sharing its storage but with no history and requires_grad off. */
em_status em_detach(em_state *S, const em_tensor *a, em_tensor **out);
/* fn(S, t, ud) is called once per backward when the gradient of leaf t is final
** (t->grad holds the sum of this backward's contributions); an error it returns
** stops the backward. */
typedef em_status (*em_grad_hook_fn)(em_state *S, em_tensor *t, void *ud);
em_status em_tensor_add_grad_hook(em_state *S, em_tensor *t, em_grad_hook_fn fn, void *ud);

/* A backward that returns gradients instead of accumulating them (as
** torch.autograd.grad): the gradients reaching the leaves wrt[0..n) (leaves that
** require grad) come back in grads[k], new references (NULL where none reached);
** their .grad is left alone and their hooks don't run. Other leaves accumulate
** as in em_backward. On error every grads[k] is NULL. */
em_status em_backward_capture(em_state *S, em_tensor *root, const em_tensor *grad,
                              em_tensor *const *wrt, int n, em_tensor **grads);
/* Backwards nest: em_backward or em_backward_capture may run inside a custom
** function's backward, on a graph of its own; the end-of-backward callbacks
** (em_backward_add_callback) run when the outermost one ends. */

/* Custom functions. em_function_apply makes *out, a view of value with no
** history of its own, whose grad_fn is a node called name (copied) with an edge
** to each of inputs[0..n) that requires grad (leaves or not). It records only
** with grad mode on and some input requiring grad; otherwise *out is a plain
** view. In backward, fn(S, ud, grad_out, grad_in) gets the gradient of *out and
** writes into grad_in[i] a NEW reference to the gradient of inputs[i] (or leaves
** it NULL: none); a gradient may have broadcast dims, which are summed away.
** On failure fn returns the status after setting the message with em_set_error
** (the backward then fails with it). The node may run in several backwards.
** After a successful call release(ud) (may be NULL) runs exactly once: when the
** node is freed, or before the call returns when no node was made; after a
** failed call the caller still owns ud. */
typedef em_status (*em_function_backward_fn)(em_state *S, void *ud, const em_tensor *grad_out,
                                             em_tensor **grad_in);
em_status em_function_apply(em_state *S, const char *name, const em_tensor *value,
                            em_tensor *const *inputs, int n, em_function_backward_fn fn,
                            void *ud, void (*release)(void *ud), em_tensor **out);
/* A release for hosts that can't be called back whenever a node dies (LuaJIT,
** where a tensor may be freed from compiled code): ud points to an int32_t the
** host set non-zero; this sets it to 0, and the host polls. */
void em_function_release_flag(void *ud);
/* Sets the state's error message to msg and returns code (a host callback's
** failure, told the way ember's own are). */
em_status em_set_error(em_state *S, em_status code, const char *msg);

/* The grad probe: which tensors requiring grad does a no-grad computation use?
** Between em_grad_probe_begin and em_grad_probe_end, every op that would have
** recorded (were grad mode on) notes its operands that require grad, once each,
** in the order first used; ops still record nothing. Probes nest (an inner
** probe's tensors count for the outer one too); a backward running meanwhile is
** not watched. em_grad_probe_count is the number noted so far by the innermost
** probe (-1: none active); em_grad_probe_end ends it and writes up to cap new
** references into list (list may be NULL to just end it). */
em_status em_grad_probe_begin(em_state *S);
int em_grad_probe_count(em_state *S);
em_status em_grad_probe_end(em_state *S, em_tensor **list, int cap);

/* -- Optimizer kernels ----------------------------------------------------------
** One fused in-place pass per parameter, following PyTorch 1.13's update rules.
** The parameter must be a contiguous float32/float64 tensor; grad and the state
** tensors must be contiguous with its shape, dtype and device.
**
** SGD: d = grad + weight_decay*param; with momentum != 0, momentum_buf becomes d on
** the first step (first_step != 0) and momentum*buf + (1-dampening)*d afterwards,
** and d becomes d + momentum*buf (nesterov) or buf; then param -= lr*d.
** momentum_buf may be NULL when momentum == 0. */
em_status em_sgd_step_(em_state *S, em_tensor *param, const em_tensor *grad,
                       em_tensor *momentum_buf, double lr, double momentum,
                       double dampening, double weight_decay, int nesterov,
                       int first_step);
/* Adam (decoupled = 0: grad += weight_decay*param) or AdamW (decoupled != 0:
** param *= 1 - lr*weight_decay first). step is the 1-based step count after this
** update (bias corrections 1 - beta^step). exp_avg and exp_avg_sq start as zeros. */
em_status em_adam_step_(em_state *S, em_tensor *param, const em_tensor *grad,
                        em_tensor *exp_avg, em_tensor *exp_avg_sq, double lr, double beta1,
                        double beta2, double eps, double weight_decay, int decoupled,
                        int64_t step);
/* The same updates for n parameters in one call (on cuda: one kernel launch for
** all of them): params[i], grads[i] and the state tensors as above, every
** parameter of one device and one dtype (group them by both); first_steps[i] and
** steps[i] per parameter. momentum_bufs may be NULL when momentum == 0. Parameters
** with no elements are skipped; n may be 0. */
em_status em_sgd_step_multi_(em_state *S, int n, em_tensor *const *params,
                             const em_tensor *const *grads, em_tensor *const *momentum_bufs,
                             const int *first_steps, double lr, double momentum,
                             double dampening, double weight_decay, int nesterov);
em_status em_adam_step_multi_(em_state *S, int n, em_tensor *const *params,
                              const em_tensor *const *grads, em_tensor *const *exp_avgs,
                              em_tensor *const *exp_avg_sqs, const int64_t *steps, double lr,
                              double beta1, double beta2, double eps, double weight_decay,
                              int decoupled);
/* clip_grad_norm: *total_norm = the norm_type-norm (> 0, or INFINITY) of all n
** tensors' elements together (contiguous float32/float64, any devices and dtypes:
** one norm launch and, when clipping, one scaling launch per device and dtype);
** when it exceeds max_norm every tensor is scaled in place by
** max_norm / (total + 1e-6). The sums run in double, in an order that does not
** depend on the device, so every backend gives the same total. With meta
** tensors the total is NaN (there are no values) and the scaling runs, as shapes. */
em_status em_clip_grad_norm_(em_state *S, int n, em_tensor *const *grads, double max_norm,
                             double norm_type, double *total_norm);

/* -- Neural network kernels ------------------------------------------------
** The raw forward and backward of the nn layers, as separate calls (autograd
** pairs them). CPU, float32 and float64 (every tensor of one call shares the
** dtype; integer targets/indices are int32 or int64), NCHW layout, any strides.
** Pair arguments (stride, padding, dilation, kernel) are two ints: {h, w}. */
/* conv2d: input (N,C,H,W), weight (O,C/groups,kH,kW), bias (O) or NULL. */
em_status em_conv2d(em_state *S, const em_tensor *input, const em_tensor *weight,
                    const em_tensor *bias, const int64_t *stride, const int64_t *padding,
                    const int64_t *dilation, int64_t groups, em_tensor **out);
/* Each of grad_input, grad_weight, grad_bias may be NULL (not wanted). */
em_status em_conv2d_backward(em_state *S, const em_tensor *grad_out,
                             const em_tensor *input, const em_tensor *weight,
                             const int64_t *stride, const int64_t *padding,
                             const int64_t *dilation, int64_t groups,
                             em_tensor **grad_input, em_tensor **grad_weight,
                             em_tensor **grad_bias);
/* Pooling over (N,C,H,W) or (C,H,W). stride NULL = kernel. max_pool2d's indices
** (int64, input's shape but output-sized) are flat h*W+w + index_base in each
** plane; padding is implicitly -inf, NaN propagates. */
em_status em_max_pool2d(em_state *S, const em_tensor *input, const int64_t *kernel,
                        const int64_t *stride, const int64_t *padding,
                        const int64_t *dilation, int ceil_mode, int index_base,
                        em_tensor **out, em_tensor **indices);
em_status em_max_pool2d_backward(em_state *S, const em_tensor *grad_out,
                                 const em_tensor *input, const em_tensor *indices,
                                 int index_base, em_tensor **grad_input);
em_status em_avg_pool2d(em_state *S, const em_tensor *input, const int64_t *kernel,
                        const int64_t *stride, const int64_t *padding, int ceil_mode,
                        int count_include_pad, em_tensor **out);
em_status em_avg_pool2d_backward(em_state *S, const em_tensor *grad_out,
                                 const em_tensor *input, const int64_t *kernel,
                                 const int64_t *stride, const int64_t *padding,
                                 int ceil_mode, int count_include_pad,
                                 em_tensor **grad_input);
/* output_size {oh, ow}. */
em_status em_adaptive_avg_pool2d(em_state *S, const em_tensor *input,
                                 const int64_t *output_size, em_tensor **out);
em_status em_adaptive_avg_pool2d_backward(em_state *S, const em_tensor *grad_out,
                                          const em_tensor *input,
                                          em_tensor **grad_input);
/* Losses. reduction: EM_REDUCE_NONE (per-sample loss, shape (N)), _MEAN, _SUM
** (0-d). Targets are class indices (int32/int64) counted from index_base; a
** target equal to ignore_index (compared before index_base is taken off, e.g.
** -100) contributes nothing and is left out of the mean's count. */
enum { EM_REDUCE_NONE = 0, EM_REDUCE_MEAN = 1, EM_REDUCE_SUM = 2 };
/* Fused log_softmax + nll over logits (N,C). lse (may be NULL) receives the
** per-row log-sum-exp (N), which the backward needs. */
em_status em_cross_entropy(em_state *S, const em_tensor *logits, const em_tensor *target,
                           int index_base, int64_t ignore_index,
                           double label_smoothing, int reduction, em_tensor **loss,
                           em_tensor **lse);
em_status em_cross_entropy_backward(em_state *S, const em_tensor *grad_loss,
                                    const em_tensor *logits, const em_tensor *target,
                                    const em_tensor *lse, int index_base,
                                    int64_t ignore_index, double label_smoothing,
                                    int reduction, em_tensor **grad_logits);
/* nll_loss on log-probabilities (N,C). */
em_status em_nll_loss(em_state *S, const em_tensor *logp, const em_tensor *target,
                      int index_base, int64_t ignore_index, int reduction,
                      em_tensor **loss);
em_status em_nll_loss_backward(em_state *S, const em_tensor *grad_loss,
                               const em_tensor *logp, const em_tensor *target,
                               int index_base, int64_t ignore_index, int reduction,
                               em_tensor **grad_input);
/* Elementwise losses: input and target of the same shape; the backward gives
** the gradient for input (target's is its negation for mse). */
em_status em_mse_loss(em_state *S, const em_tensor *input, const em_tensor *target,
                      int reduction, em_tensor **loss);
em_status em_mse_loss_backward(em_state *S, const em_tensor *grad_loss,
                               const em_tensor *input, const em_tensor *target,
                               int reduction, em_tensor **grad_input);
em_status em_bce_with_logits(em_state *S, const em_tensor *input, const em_tensor *target,
                             int reduction, em_tensor **loss);
em_status em_bce_with_logits_backward(em_state *S, const em_tensor *grad_loss,
                                      const em_tensor *input, const em_tensor *target,
                                      int reduction, em_tensor **grad_input);
/* batch_norm over (N,C) or (N,C,*): weight, bias (C) or NULL; running_mean/var
** (C) or NULL. training: batch statistics, and running stats (when given) are
** updated in place: r = (1-momentum)*r + momentum*batch (unbiased variance for
** running_var). Not training: running stats are used (required). save_mean and
** save_invstd (C) are for the backward (may be NULL). */
em_status em_batch_norm(em_state *S, const em_tensor *input, const em_tensor *weight,
                        const em_tensor *bias, em_tensor *running_mean,
                        em_tensor *running_var, int training, double momentum,
                        double eps, em_tensor **out, em_tensor **save_mean,
                        em_tensor **save_invstd);
em_status em_batch_norm_backward(em_state *S, const em_tensor *grad_out,
                                 const em_tensor *input, const em_tensor *weight,
                                 const em_tensor *save_mean,
                                 const em_tensor *save_invstd, int training,
                                 em_tensor **grad_input, em_tensor **grad_weight,
                                 em_tensor **grad_bias);
/* layer_norm over the last normalized_ndim dims; weight, bias of those dims or
** NULL. mean and rstd (may be NULL) have input's shape with those dims of size 1. */
em_status em_layer_norm(em_state *S, const em_tensor *input, int normalized_ndim,
                        const em_tensor *weight, const em_tensor *bias, double eps,
                        em_tensor **out, em_tensor **mean, em_tensor **rstd);
em_status em_layer_norm_backward(em_state *S, const em_tensor *grad_out,
                                 const em_tensor *input, int normalized_ndim,
                                 const em_tensor *mean, const em_tensor *rstd,
                                 const em_tensor *weight, em_tensor **grad_input,
                                 em_tensor **grad_weight, em_tensor **grad_bias);
/* The fused CPU attention kernels (cpu/attention.c) behind the Lua layer's
** scaled_dot_product_attention, on contiguous host buffers: q (B, L, E), k (B, S, E),
** v (B, S, Ev), out and dout (B, L, Ev), lse (B, L), dq/dk/dv shaped as q/k/v.
** dt is float32, float64 or bfloat16 (then mask and lse are float32, else of dt).
** mask (NULL for none) is additive, read for batch b, query i, key j at
** (b / ms[0]) * ms[1] + (b % ms[0]) * ms[2] + i * ms[3] + j * ms[4] (two groups of
** batch dims, strides 0 where broadcast); causal masks key j > query i. A query row with every key masked gives zeros. */
em_status em_cpu_attention_forward(em_state *S, em_dtype dt, int64_t B, int64_t L,
                                   int64_t Skv, int64_t E, int64_t Ev, const void *q,
                                   const void *k, const void *v, const void *mask,
                                   const int64_t *mask_strides, int causal, double scale,
                                   void *out, void *lse);
em_status em_cpu_attention_backward(em_state *S, em_dtype dt, int64_t B, int64_t L,
                                    int64_t Skv, int64_t E, int64_t Ev, const void *q,
                                    const void *k, const void *v, const void *mask,
                                    const int64_t *mask_strides, int causal, double scale,
                                    const void *out, const void *lse, const void *dout,
                                    void *dq, void *dk, void *dv);
/* The fused CPU kernels of one LSTM step's pointwise part (cpu/rnn_cell.c) behind
** nn.LSTM, on contiguous host buffers of N rows, dt float32 or float64. Forward:
** gates (N, 4H), plus gates2 (N, 4H) unless NULL, hold the pre-activations in the
** order i, f, g, o; c = sigmoid(f) c_prev + sigmoid(i) tanh(g), h = sigmoid(o)
** tanh(c); act (N, 4H), which may be gates itself, receives sigmoid(i),
** sigmoid(f), tanh(g), sigmoid(o). Backward:
** from act, c and c_prev of that step, dh (plus dh2, or NULL) the gradient of h
** and dc that of c, writes the gates' gradients (before their activations) to
** dgates (N, 4H) and c_prev's gradient over dc. */
em_status em_cpu_lstm_cell_forward(em_state *S, em_dtype dt, int64_t N, int64_t H,
                                   const void *gates, const void *gates2, const void *c_prev,
                                   void *act, void *h, void *c);
em_status em_cpu_lstm_cell_backward(em_state *S, em_dtype dt, int64_t N, int64_t H,
                                    const void *act, const void *c, const void *c_prev,
                                    const void *dh, const void *dh2, void *dc,
                                    void *dgates);
/* em.multinomial's draws with replacement on the CPU (cpu/multinomial.c), on
** contiguous host buffers: probs (rows, k) of dt float32 or float64, u (rows, n)
** uniforms in [0, 1); out (rows, n) receives 1-based categories: the count of the
** row's running sums (in double) <= u * the row's total, plus one, at most k.
** Errors (the op's own words): a weight NaN or infinite, a negative weight, a row
** whose sum is not positive; out is then undefined. */
em_status em_cpu_multinomial(em_state *S, em_dtype dt, int64_t rows, int64_t k,
                             const void *probs, int64_t n, const double *u, int64_t *out);
/* In place, out and src of one dtype (any), idx int32/int64:
** index_add_: out[.., idx[i], ..] += src[.., i, ..] along dim (idx 1-D);
** scatter_add_: out[.., idx[p], ..] += src[p] at every position p of idx (same
** ndim as out and src, no larger than src, nor than out outside dim). */
em_status em_index_add_(em_state *S, em_tensor *out, int dim, const em_tensor *idx,
                        const em_tensor *src, int index_base);
em_status em_scatter_add_(em_state *S, em_tensor *out, int dim, const em_tensor *idx,
                          const em_tensor *src, int index_base);


/* -- Input pipeline (core/data/) ------------------------------------------------
** A dataset is an immutable, refcounted node: a source (files, tensors, synthetic
** data) or a stage over a parent (shuffle, map, batch, shard, take). Sample i
** (0-based) is a tuple of up to EM_DATA_MAX_FIELDS tensors, e.g. (image, label).
** Nothing is read or computed per sample until a loader or em_dataset_get asks.
** Sources whose files hold 0-based class labels (IDX, CIFAR, image folders)
** add label_base to them (the Lua layer passes 1).
**
** Randomness (shuffle order, random transforms, synthetic data) is a pure
** function of the stage's seed, the epoch and the sample's index, so results
** never depend on the worker count or on timing. */
enum { EM_DATA_MAX_FIELDS = 4 };
typedef struct em_dataset em_dataset;
typedef struct em_transform em_transform;
typedef struct em_loader em_loader;

void em_dataset_retain(em_dataset *d);
void em_dataset_release(em_dataset *d);
int64_t em_dataset_len(const em_dataset *d);
int em_dataset_nfields(const em_dataset *d);
/* The stage's kind: "tensors", "idx", "shuffle", "batch", ... */
const char *em_dataset_kind(const em_dataset *d);
/* Sample i of `epoch` into out[0 .. nfields) (new references), on this thread. */
em_status em_dataset_get(em_state *S, em_dataset *d, int64_t i, int64_t epoch,
                         em_tensor **out);

/* The whole tensor of field k (0-based) of an in-memory source (tensors, idx,
** cifar10, csv): a new reference to what the samples are views of. */
em_status em_dataset_tensor(em_state *S, em_dataset *d, int field, em_tensor **out);

/* Sources. */
/* Sample i is (fields[0][i], fields[1][i], ...): the tensors share their first
** dim. They are retained, not copied; batches of consecutive samples are views. */
em_status em_data_tensors(em_state *S, em_tensor *const *fields, int nfields,
                          em_dataset **out);
/* IDX image and label files (gzip or raw): uint8 (1, H, W) images, int64 labels. */
em_status em_data_idx(em_state *S, const char *images, const char *labels,
                      int label_base, em_dataset **out);
/* CIFAR-10 binary batches: 3073-byte records, uint8 (3, 32, 32) and int64. */
em_status em_data_cifar10(em_state *S, const char *const *files, int nfiles,
                          int label_base, em_dataset **out);
/* Numeric CSV: each row a float32 (F) feature vector and, when label_column >= 0
** (0-based, or found by label_name in the header), a label: int64 when every
** value of that column is integral, float32 otherwise. Values as written. */
em_status em_data_csv(em_state *S, const char *path, int header,
                      const char *label_name, int label_column, em_dataset **out);
/* One subfolder per class (sorted by name = label order), JPEG and PNG files,
** decoded in the workers to uint8 (3, H, W) RGB; resized (bilinear) to height x
** width when both are > 0. */
em_status em_data_image_folder(em_state *S, const char *root, int64_t height,
                               int64_t width, int label_base, em_dataset **out);
/* Decoders refuse an image of more than max_pixels pixels (width x height, read
** from the header before anything is allocated: a decompression bomb is a clean
** EM_ERR_IO naming the file and its size). The default is PIL's limit. */
enum { EM_IMAGE_MAX_PIXELS = 89478485 };
typedef struct em_image_opts {
  int64_t max_pixels;   /* 0: the state's setting; > 0: this limit; < 0: no limit */
  int full_decode;      /* image_folder with a size: 1 = no reduced JPEG decode */
} em_image_opts;
/* The same with image options (NULL = defaults). The pixel
** limit is resolved when the dataset is made. With a size and reduced decode on
** (the default), JPEGs are decoded at the smallest DCT scale n/8 whose output still
** covers height x width, then resized: close to, not bit-exact with, a full
** decode + resize (set full_decode for PIL's exact pixels). */
em_status em_data_image_folder_opts(em_state *S, const char *root, int64_t height,
                                    int64_t width, int label_base,
                                    const em_image_opts *o, em_dataset **out);
/* `size` samples of `shape` and dtype dt (uint8: 0..255, floating: uniform [0,1))
** and labels in label_base .. label_base+classes-1, computed from seed and index. */
em_status em_data_synthetic(em_state *S, const int64_t *shape, int ndim, em_dtype dt,
                            int64_t classes, int64_t size, uint64_t seed,
                            int label_base, em_dataset **out);

/* Stages; each returns a new dataset over d (d is retained). */
/* A fresh permutation per epoch, from seed and the epoch number. */
em_status em_data_shuffle(em_state *S, em_dataset *d, uint64_t seed, em_dataset **out);
/* Runs transform t on each sample; random transforms draw from (seed, epoch, i). */
em_status em_data_map(em_state *S, em_dataset *d, em_transform *t, uint64_t seed,
                      em_dataset **out);
/* Stacks n consecutive samples: fields (B, ...). The last short batch is kept
** unless drop_last. */
em_status em_data_batch(em_state *S, em_dataset *d, int64_t n, int drop_last,
                        em_dataset **out);
/* Replica `rank` (0-based) of world_size gets samples rank, rank + world_size, ...
** Every shard has ceil(len / world_size) samples: the remainder is padded by
** wrapping around to the first samples (so a few repeat), or, with
** drop_remainder, floor(len / world_size) samples and the tail is left out. */
em_status em_data_shard(em_state *S, em_dataset *d, int64_t rank, int64_t world_size,
                        int drop_remainder, em_dataset **out);
/* The first n samples (all of them if there are fewer). */
em_status em_data_take(em_state *S, em_dataset *d, int64_t n, em_dataset **out);

/* -- Transforms (core/data/transforms*.c) ----------------------------------------
** A transform works on field 0 of a sample (the image, (C, H, W) or (H, W)); a
** custom one sees every field. Refcounted and immutable: one may serve many maps. */
void em_transform_retain(em_transform *t);
void em_transform_release(em_transform *t);
const char *em_transform_name(const em_transform *t);
/* uint8 -> float32 in [0, 1]; other dtypes -> float32 unscaled. */
em_status em_transform_to_float(em_state *S, em_transform **out);
/* (x - mean[c]) / std[c] per channel; n = 1 applies to every channel. Also takes a
** (B, C, H, W) batch: ds:batch(n):map(normalize) works on whole batches at once. */
em_status em_transform_normalize(em_state *S, const double *mean, const double *std,
                                 int n, em_transform **out);
/* Zero-pads by `padding` on each side, then crops height x width at a random spot. */
em_status em_transform_random_crop(em_state *S, int64_t height, int64_t width,
                                   int64_t padding, em_transform **out);
em_status em_transform_center_crop(em_state *S, int64_t height, int64_t width,
                                   em_transform **out);
/* Bilinear (half-pixel centres, no antialiasing, as torch's interpolate with
** align_corners=False); uint8 results are rounded. */
em_status em_transform_resize(em_state *S, int64_t height, int64_t width,
                              em_transform **out);
/* Mirrors the last dim with probability p. */
em_status em_transform_hflip(em_state *S, double p, em_transform **out);
/* Zeroes a size x size square centred at a random pixel (clipped at the edges). */
em_status em_transform_cutout(em_state *S, int64_t size, em_transform **out);
em_status em_transform_compose(em_state *S, em_transform *const *ts, int n,
                               em_transform **out);
/* A host function run per sample: it may replace fields[i] (releasing the old
** reference) and returns 0, or non-zero with a message in err. worker is the
** worker's number (0 ..), or -1 on the thread that called the loader; calls for
** different workers run concurrently. seed is the sample's own random seed (from
** the map's seed, the epoch and the index), for randomness that must not depend
** on which worker runs the sample. release(ud) runs when the transform dies. */
typedef int (*em_sample_fn)(void *ud, int worker, uint64_t seed, em_tensor **fields,
                            int nfields, char *err, size_t errlen);
em_status em_transform_custom(em_state *S, const char *name, em_sample_fn fn, void *ud,
                              void (*release)(void *ud), em_transform **out);
/* Applies t to fields[0 .. nfields) in place, drawing randomness from (seed, index). */
em_status em_transform_apply(em_state *S, em_transform *t, em_tensor **fields,
                             int nfields, uint64_t seed, int64_t index);

/* -- Loader (core/data/loader.c) -------------------------------------------------
** Worker threads compute the items of a dataset (usually batches) ahead of the
** consumer into a bounded queue; items come out in index order whatever the
** timing. buffer_alloc, when set, provides the memory of assembled batches
** (pinned host memory for the CUDA backend): it returns NULL to refuse, and
** buffer_free gets the pointer and size back. */
typedef struct em_loader_config {
  int workers;            /* 0 = compute items on the calling thread */
  int prefetch;           /* items computed ahead; 0 = 2 per worker */
  void *(*buffer_alloc)(void *ud, size_t nbytes);
  void (*buffer_free)(void *ud, void *p, size_t nbytes);
  void *buffer_ud;
} em_loader_config;
typedef struct em_loader_stats {
  int64_t epoch;          /* the current (or last) epoch */
  int64_t items;          /* items (batches) of the epoch done: handed out, and
                          ** skipped by em_loader_start_at */
  int64_t samples;        /* samples in them (batch sizes summed) */
  int64_t total_items;    /* items in the epoch */
  double elapsed_s;       /* since the epoch started */
  double wait_s;          /* time the consumer spent waiting in em_loader_next */
  int64_t ready;          /* items computed ahead, waiting for the consumer */
  /* With em_loader_to_device, since the loader was made (0 otherwise): batches
  ** whose copy was queued, and has run; the bytes; the time the copies took (on
  ** the copy stream for pinned batches, on the host for staged ones); batches
  ** handed out before their copy had run (the step waits for it on the device);
  ** times a worker waited for a pinned buffer whose copy was pending, and for
  ** how long; the pinned buffers and bytes of the loader's pool. */
  int64_t copies, copies_done, copy_bytes;
  double copy_s;
  int64_t copies_late, buffer_waits;
  double buffer_wait_s;
  int64_t pinned_buffers, pinned_bytes;
} em_loader_stats;
void em_loader_config_init(em_loader_config *cfg);
em_status em_loader_new(em_state *S, em_dataset *d, const em_loader_config *cfg,
                        em_loader **out);
/* Starts an epoch (stopping one under way): workers begin computing item 0 on. */
em_status em_loader_start(em_state *S, em_loader *l, int64_t epoch);
/* The same from item `first` (resuming an interrupted epoch: the items before it
** are skipped without being computed). */
em_status em_loader_start_at(em_state *S, em_loader *l, int64_t epoch, int64_t first);
/* The next item into out[0 .. nfields) (new references); out must have room for
** EM_DATA_MAX_FIELDS (the rest are set to NULL). *nfields = 0 at the end of the
** epoch. An error in a worker stops the epoch and is returned here, after every
** item before it. */
em_status em_loader_next(em_state *S, em_loader *l, em_tensor **out, int *nfields);
/* Stops the workers (joins them); items computed ahead are dropped, and a
** loader with pin_memory gives its pinned buffers back (after their copies). */
void em_loader_stop(em_loader *l);
void em_loader_stats_get(const em_loader *l, em_loader_stats *out);
/* Batches handed out on CUDA device `device` (em_loader_next returns device
** tensors). pin_memory: the workers assemble batches in pinned buffers from a
** pool the loader keeps, each batch's copy runs on the device's copy stream,
** and `ahead` batches (0 = none, -1 = 1) are copied before they are asked for,
** so a copy overlaps the step before it; the compute stream waits for a
** batch's copy when it is handed out. Without pin_memory each batch is staged
** and copied on the compute stream when handed out. device EM_CPU with
** pin_memory: CPU batches in pinned memory (for the caller's own asynchronous
** copies). Needs a CUDA device either way; not with a buffer_alloc of the
** caller's; call once, before the first epoch. */
em_status em_loader_to_device(em_state *S, em_loader *l, int device, int pin_memory,
                              int ahead);
/* Stops and frees. */
void em_loader_free(em_loader *l);

/* -- Collectives (core/dist/) ------------------------------------------------------
** A communicator joins the replicas of one job: threads of this process (a local
** group), or MPI processes on any number of hosts. Every replica calls the same
** collectives in the same order. Tensors: CPU, any strides (a non-contiguous
** tensor is staged through a contiguous copy), float32, float64, float16,
** bfloat16 (reduced in float32, rounded once), int32, int64; mean needs a
** floating dtype.
**
** Each collective runs on the communicator's own thread. With work == NULL the
** call returns when it is done; otherwise it returns at once and *work is a
** handle to wait on or test, freed with em_comm_work_free; the tensors must not
** be touched until then.
**
** Failure never hangs: when a replica aborts (em_comm_abort, or its host saw an
** error), every other replica's pending and later collectives fail with
** "replica K failed: <message>"; a collective that waits longer than the
** communicator's timeout fails naming the replicas that did not arrive. Failure
** is final for a communicator: every later call returns the same error.
**
** Threads: a communicator belongs to the thread of its state; em_comm_abort may be
** called from any thread. */
typedef struct em_comm em_comm;
typedef struct em_comm_work em_comm_work;
typedef struct em_local_group em_local_group;
typedef enum em_comm_op {
  EM_COMM_SUM = 0, EM_COMM_MEAN = 1, EM_COMM_MAX = 2, EM_COMM_MIN = 3
} em_comm_op;

/* A local group of world_size replicas in this process (threads, one em_state
** each). Refcounted: each communicator made from it holds a reference. */
em_local_group *em_local_group_new(int world_size);
void em_local_group_retain(em_local_group *g);
void em_local_group_release(em_local_group *g);
/* Marks the group failed on behalf of replica `rank` (its host saw an error): the
** other replicas' collectives fail with "replica <rank> failed: <message>". Any
** thread; the first failure wins. */
void em_local_group_abort(em_local_group *g, int rank, const char *message);
/* Says that replica `rank` has ended without failing (its script returned or
** called os.exit(0)): a collective of the local communicator that waits for it,
** or starts afterwards, fails with "replica <rank> exited" -- the others go on
** as long as they need it for nothing. Any thread. */
void em_local_group_leave(em_local_group *g, int rank);

/* 1 when the group has failed, with the first failure's message copied into buf
** (size bytes): "replica K failed: ..." or the timeout that found a replica missing. */
int em_local_group_failure(em_local_group *g, char *buf, size_t size);

/* Rank `rank` of a local group; timeout_s <= 0 means 300 s. */
em_status em_comm_local(em_state *S, em_local_group *g, int rank, double timeout_s,
                        em_comm **out);
/* A GPU replica's communicator (core/dist/nccl.c): its tensors live on CUDA device
** `device` of S. The replicas are threads of one local group g (rank = this one's)
** or, g NULL, the processes of an MPI job. On real GPUs the collectives run in
** NCCL on the device's communication stream, ordered after the work queued before
** the call; on emulated devices (EMBER_CUDA_EMULATE) the local group or MPI stands
** in for NCCL, through host memory. em_comm_backend says "nccl" either way. */
em_status em_comm_nccl(em_state *S, int device, em_local_group *g, int rank,
                       double timeout_s, em_comm **out);
/* A GPU replica's communicator over the host (core/dist/staged.c): the local group
** g (rank = this one's) or, g NULL, MPI moves the bytes, and every device tensor
** is staged through pinned host memory on the device's communication stream, on
** real and emulated GPUs alike. For replicas that share a GPU, which NCCL
** refuses. em_comm_backend says "local" or "mpi". */
em_status em_comm_staged(em_state *S, int device, em_local_group *g, int rank,
                         double timeout_s, em_comm **out);
/* 1 when c moves device memory itself (NCCL on a real GPU); 0 when its device
** tensors travel through host memory (host backends, emulated devices, groups). */
int em_comm_device_native(const em_comm *c);
/* This process's rank of an MPI job (MPI_COMM_WORLD). libmpi is loaded on first
** use; EM_ERR_UNSUPPORTED when it cannot be (the message says why). */
em_status em_comm_mpi(em_state *S, double timeout_s, em_comm **out);
/* 1 when this process looks started by mpirun, srun or another MPI launcher (from
** the environment); *rank and *size are read from there (either may be NULL). */
int em_mpi_launched(int *rank, int *size);
/* Finishes the pending work and frees (an MPI communicator finalizes MPI when the
** job ended cleanly). */
void em_comm_free(em_comm *c);
int em_comm_rank(const em_comm *c);
int em_comm_size(const em_comm *c);
/* "local", "mpi", "nccl" or "group(...)". */
const char *em_comm_backend(const em_comm *c);
/* Fails this replica's communicator and tells the others (see above). Any thread. */
void em_comm_abort(em_comm *c, const char *message);
/* EM_OK, or the failure this communicator has seen (message into S). */
em_status em_comm_status(em_state *S, em_comm *c);

/* t is reduced in place across replicas. */
em_status em_comm_allreduce(em_state *S, em_comm *c, em_tensor *t, em_comm_op op,
                            em_comm_work **work);
/* t takes rank root's values, in place. */
em_status em_comm_broadcast(em_state *S, em_comm *c, em_tensor *t, int root,
                            em_comm_work **work);
/* *out (new) is the replicas' t concatenated along dim 0 in rank order; every
** replica must pass the same shape. */
em_status em_comm_allgather(em_state *S, em_comm *c, const em_tensor *t, em_tensor **out,
                            em_comm_work **work);
/* *out (new) is this replica's part of the reduction: dim 0 of t split into
** world_size equal parts (dim 0 must divide evenly), in rank order. */
em_status em_comm_reduce_scatter(em_state *S, em_comm *c, const em_tensor *t,
                                 em_comm_op op, em_tensor **out, em_comm_work **work);
em_status em_comm_barrier(em_state *S, em_comm *c, em_comm_work **work);
/* Point-to-point: t's values go to replica `peer`, whose em_comm_recv from this
** replica writes them into its own t (same dtype and element count, else both
** sides fail naming both ranks). The k-th send to a peer meets that peer's k-th
** recv from this replica; collectives and point-to-point calls may interleave
** freely (no replica's collectives wait for its sends). A send finishes once the
** peer has received (no copy in between): two replicas that send to each other
** first use work handles. A dead, exited or silent peer fails the call naming it
** (the communicator's timeout). Every dtype (uint8 and bool too: bytes move).
** The local communicator, MPI, and GPU replicas': on emulated devices tensors
** are staged through host memory; on real GPUs device tensors go device to
** device (ncclSend / ncclRecv), in NCCL's stream order -- a send there holds
** back the replica's later sends, recvs and collectives until the peer
** receives, so the replicas' orders must match (else the timeout's error, and
** the communicator fails). */
/* A communicator of some of parent's replicas (core/dist/group.c): ranks[0..n)
** are parent ranks, ascending and distinct, and every one of them calls this
** (only they do), in the same order relative to their other groups. The group's
** rank is this replica's index in ranks; em_comm_backend says "group(local)",
** "group(mpi)" or "group(nccl)". Its collectives, sends and recvs, work handles
** and failure rules are a communicator's (messages name a member as "replica 2
** (world 5)"); their bytes travel by the parent's point-to-point, on channels of
** the group's own, so the parent's sends between the same replicas never mix
** with them. Members call the group's and the parent's collectives in the same
** relative order; under MPI a member that calls a parent collective while a
** group one is in flight needs the others not to wait for that group one first
** (MPI runs on the parent's thread). Free a group before its parent. */
em_status em_comm_group(em_state *S, em_comm *parent, int n, const int *ranks,
                        em_comm **out);
em_status em_comm_send(em_state *S, em_comm *c, const em_tensor *t, int peer,
                       em_comm_work **work);
em_status em_comm_recv(em_state *S, em_comm *c, em_tensor *t, int peer, em_comm_work **work);
em_status em_comm_work_wait(em_state *S, em_comm_work *w);
/* *done = 1 once w has finished (wait still reports how). */
em_status em_comm_work_test(em_state *S, em_comm_work *w, int *done);
/* Waits first when the work is still running (its memory is in use). */
void em_comm_work_free(em_comm_work *w);

/* -- Gradient averaging (core/dist/reducer.c) ---------------------------------------
** The engine of em.distribute's wrap: gradients of the parameters are averaged
** across replicas during backward, in buckets (reverse order of params, the first
** about first_bucket_bytes, the others about bucket_bytes), each bucket's
** allreduce started once all its gradients are final and waited for before
** em_backward returns. Gradients become views into the bucket memory. Hooks act
** only in a backward that follows em_reducer_prepare. A parameter that got no
** gradient is an error naming it (names[i]), unless find_unused. */
typedef struct em_reducer em_reducer;
typedef struct em_reducer_stats {
  int64_t buckets;           /* per step */
  int64_t steps;             /* backwards that averaged gradients */
  double comm_s;             /* time the bucket collectives ran (from the moment
                                every replica was there, where the backend knows) */
  double overlap_s;          /* of which before backward's computation ended */
  double wait_s;             /* time backward spent waiting for them at the end */
} em_reducer_stats;
em_status em_reducer_new(em_state *S, em_comm *c, em_tensor *const *params,
                         const char *const *names, int nparams, double bucket_bytes,
                         double first_bucket_bytes, int find_unused, em_reducer **out);
/* Arms the hooks for the next backward (the wrapped model's forward calls it). */
em_status em_reducer_prepare(em_state *S, em_reducer *r);
/* Buckets: how many, and bucket b's parameter count (for tests and reports). */
int em_reducer_num_buckets(const em_reducer *r);
int em_reducer_bucket_size(const em_reducer *r, int b);
void em_reducer_stats_get(const em_reducer *r, em_reducer_stats *out);
void em_reducer_free(em_reducer *r);

/* Runs fn(S, failed, ud) at the end of every em_backward of S (failed = 1 when the
** backward failed); an error it returns is the backward's. Removed by the same
** (fn, ud). */
typedef em_status (*em_backward_callback_fn)(em_state *S, int failed, void *ud);
em_status em_backward_add_callback(em_state *S, em_backward_callback_fn fn, void *ud);
void em_backward_remove_callback(em_state *S, em_backward_callback_fn fn, void *ud);
/* Removes the hook added with the same (fn, ud); nothing when there is none. */
void em_tensor_remove_grad_hook(em_tensor *t, em_grad_hook_fn fn, void *ud);
/* The host's way to free memory inside a backward: when an allocation by the
** engine's own kernels fails (the cpu's cap, a full device), fn(S, ud) runs on
** the backward's thread and the allocation is tried once more. Not inside a
** custom node, a gradient hook or a backward callback (their ops are the host's,
** which retries them itself), and never nested. fn may release tensors and may
** enter Lua: em_backward's callers keep it out of the JIT. NULL removes it. */
typedef void (*em_backward_reclaim_fn)(em_state *S, void *ud);
void em_backward_set_reclaim(em_state *S, em_backward_reclaim_fn fn, void *ud);

/* OpenBLAS keeps one thread count for the whole process: replicas that are threads
** of one process pin it once (n >= 1) instead of each state setting its own;
** 0 unpins. Process-wide, any thread. */
void em_blas_pin_threads(int n);

/* CPU kernels from the field's libraries: oneDNN (libdnnl, loaded at run time when
** present) serves conv2d and matmul cases where it measured faster than ember's own
** kernels. mode: "auto" (the measured choice; the default), "ours" (ember's kernels
** only), "onednn" (oneDNN wherever it serves the case, tensors as they are) or
** "onednn-blocked" (the same with activations reordered into oneDNN's blocked
** formats). EMBER_CPU_KERNELS sets the starting mode. Process-wide, any thread;
** EM_ERR_ARG for another name. */
em_status em_cpu_kernels_set(const char *mode);
const char *em_cpu_kernels_get(void);
/* Which library serves which CPU op on this machine, one line each ("conv2d forward
** float32 NHWC: oneDNN 2.6.3 (avx512_core_bf16)"), and why oneDNN is not used when
** it is not. Loads oneDNN to ask. At most len bytes, NUL-terminated; EM_ERR_ARG for
** no buffer. */
em_status em_cpu_kernels_info(char *buf, size_t len);

/* -- Profiler (core/profile/) -------------------------------------------------------
** Records what a state does between em_profile_start and em_profile_stop: ops at
** the dispatch point, backward nodes, loader waits and the loader workers' batches,
** collectives (on the communicator's thread) and the waits on them, user ranges and
** step marks. One track per thread. Off, it costs one branch per op. The analysis
** (step breakdown, diagnosis) is lua/ember/profile.lua's; C hosts read the events. */
typedef enum em_profile_kind {
  EM_PROF_OP,            /* a kernel: name, shape/dtype/device of its main tensor */
  EM_PROF_BACKWARD,      /* one autograd node's backward (contains its ops) */
  EM_PROF_DATA_WAIT,     /* the step thread blocked in em_loader_next; arg0 workers,
                            arg1 prefetch */
  EM_PROF_LOADER_WORK,   /* a loader worker producing one item; arg0 its index */
  EM_PROF_COLLECTIVE,    /* on the comm thread: bytes, wait = seconds until every
                            replica was there, flow = the work's sequence number */
  EM_PROF_COMM_WAIT,     /* the step thread blocked on a collective; wait = the part
                            of it spent waiting for peers */
  EM_PROF_BUCKET_READY,  /* a gradient bucket's allreduce being launched, once its last
                            gradient arrived (flow, bytes, arg0 its index) */
  EM_PROF_GRAD,          /* instant: a leaf gradient accumulated (bytes) */
  EM_PROF_RANGE,         /* a user range (em_profile_range_push/pop) */
  EM_PROF_OPTIMIZER,     /* an optimizer step (a range of this kind) */
  EM_PROF_STEP,          /* instant: the end of a training step */
  EM_PROF_COPY,          /* a copy between devices */
  EM_PROF_BUBBLE         /* a pipeline stage blocked on a neighbour stage (a range of
                            this kind): the pipeline's bubble */
} em_profile_kind;

typedef struct em_profile_event {
  double t0, t1;           /* seconds on the profile's clock (em_profile_origin) */
  const char *name;
  int32_t kind, track;
  int32_t dtype, device, ndim, reserved;
  int64_t sizes[8];
  int64_t bytes;           /* collectives, buckets, gradients */
  int64_t flow;            /* joins a BUCKET_READY to its COLLECTIVE; 0 = none */
  int64_t mem;             /* ops: bytes allocated by the state after the op */
  int64_t arg0, arg1;
  double wait;
} em_profile_event;

typedef struct em_profile_config {
  int auto_step;           /* each batch em_loader_next hands out ends a step, until
                              the first em_profile_step */
} em_profile_config;

/* Starts recording (discarding a previous profile); cfg may be NULL. */
em_status em_profile_start(em_state *S, const em_profile_config *cfg);
/* Stops recording and keeps the events until the next start or em_close. */
em_status em_profile_stop(em_state *S);
int em_profile_active(em_state *S);
/* After stop: every event, sorted by t0 (the array belongs to S). */
em_status em_profile_events(em_state *S, const em_profile_event **events, int64_t *n);
/* Seconds on the monotonic clock that t0 = 0 stands for, and the tracks. */
double em_profile_origin(em_state *S);
int em_profile_num_tracks(em_state *S);
const char *em_profile_track_name(em_state *S, int track);
/* Events dropped because a buffer was full (then the profile says so). */
int64_t em_profile_dropped(em_state *S);
/* Peak bytes the state held while recording (device: EM_CPU). */
int64_t em_profile_peak_bytes(em_state *S, int device);
/* The profiler's clock: monotonic seconds (shared by the threads and processes
** of one host). */
double em_profile_clock(void);
/* Marks the end of a training step (now). */
em_status em_profile_step(em_state *S);
/* A named span on the calling thread: kind EM_PROF_RANGE, EM_PROF_OPTIMIZER or
** EM_PROF_BUBBLE; ranges nest (at most 32 deep). No-ops when not recording. */
em_status em_profile_range_push(em_state *S, const char *name, int kind);
em_status em_profile_range_pop(em_state *S);

/* -- CUDA libraries (kernels/real/libs.c) ------------------------------------------
** What `ember --info` says of the real CUDA libraries, which neither libember nor
** libember_cuda links: the CUDA backend loads them (dlopen) when used. One line
** each for the CUDA runtime (with the driver), cuBLASLt, cuDNN and NCCL -- version
** and file, or why not and the places tried ($EMBER_CUDA_HOME/lib64,
** /usr/local/cuda/lib64, the system search path); without the CUDA backend's
** library, the one line of why it could not be loaded. Loads them to ask (a
** fraction of a second): for information, not hot paths.
** Writes at most len bytes, NUL-terminated; EM_ERR_ARG for no buffer. Any thread. */
em_status em_cuda_libs_info(char *buf, size_t len);

/* -- Devices by name, and their memory ----------------------------------------------
** em_device_parse reads "cpu", "meta", "cuda" (the current device, below) or "cuda:N" into *device
** (EM_ERR_DEVICE naming the text otherwise; a CUDA device need not exist yet).
** em_device_str writes the name of a device number into buf (32 bytes fit).
** em_device_memory: the bytes the device's tensors hold now (allocated), the most
** since the state began or the last reset (peak), what its allocator keeps
** (reserved: allocated plus cached blocks) and its memory (capacity: 0 where
** there is no fixed amount, as for meta and for cpu without em_set_memory_limit). For cpu, meta and cuda:N. */
typedef struct em_device_memory_stats {
  int64_t allocated, peak, reserved, capacity;
} em_device_memory_stats;
em_status em_device_parse(em_state *S, const char *name, int *device);
/* "cuda" alone names the state's current CUDA device: 0 until em_cuda_set_device
** (EM_ERR_DEVICE for a number outside the devices a state can name; the device need not
** exist yet). A replica's strategy sets it to the replica's own GPU. */
em_status em_cuda_set_device(em_state *S, int device);
int em_cuda_current_device(em_state *S);
const char *em_device_str(int device, char *buf, size_t len);
em_status em_device_memory(em_state *S, int device, em_device_memory_stats *out);
em_status em_device_reset_peak(em_state *S, int device);
/* Caps the bytes the device's tensors may hold (0: no cap), for cpu only: a
** CUDA device's cap is its memory. An allocation past it fails as a full GPU
** does: EM_ERR_NOMEM, a message naming the device, the size asked, what is
** allocated and the limit, the pressure flag raised (em_memory_pressure_flag),
** and the state as it was. Blocks kept for reuse do not count. A cap below what
** is allocated now refuses every new CPU tensor until enough are released. The
** capacity of em_device_memory reports it. */
em_status em_set_memory_limit(em_state *S, int device, int64_t bytes);

/* -- CUDA devices (kernels/, libember_cuda.so) ------------------------------------------
** Devices 0, 1, ... are served by the CUDA backend: the GPUs, through the CUDA
** runtime and cuBLASLt (loaded with dlopen when first used), or with
** EMBER_CUDA_EMULATE=N[:MB] N emulated devices of MB megabytes (default 1024)
** whose memory, streams and kernels are the backend's own code on the CPU.
** The backend is a library of its own, libember_cuda.so, that libember loads the
** first time a state asks for a CUDA device: from beside libember.so (or the
** executable that links libember.a and exports its symbols with -rdynamic), its
** lib/ and ../lib/, or $EMBER_CUDA_LIB; a host that links libember_cuda.a (whole)
** or libember_cuda.so itself has it already: it registers as the program starts. Without it, these calls and CUDA
** tensors fail with the reason, and everything else works. The devices are
** opened on first use, per state. Ops are queued on the device's stream and the
** host does not wait; copies to the CPU wait for what they read. The em_cuda_*
** calls below are core's: a CPU-only host links them and gets the reason. */
typedef struct em_cuda_memory {
  int64_t allocated, reserved, peak_allocated, capacity;
  int64_t num_allocs, num_frees, cache_hits, oom_retries;
} em_cuda_memory;
/* How many devices this state can use (0 without CUDA or emulation); when 0,
** em_errmsg says why. */
int em_cuda_device_count(em_state *S);
int em_cuda_emulated(em_state *S);
/* Waits for every piece of work queued on the device (-1: on every device). */
em_status em_cuda_synchronize(em_state *S, int device);
em_status em_cuda_memory_stats(em_state *S, int device, em_cuda_memory *out);
typedef struct em_cuda_props {
  char name[128];              /* "NVIDIA H100 80GB HBM3", or "ember emulated device" */
  int major, minor;            /* compute capability */
  int multiprocessors;
  int64_t total_memory;        /* bytes */
  int emulated;
} em_cuda_props;
em_status em_cuda_device_props(em_state *S, int device, em_cuda_props *out);
/* Gives the device's unused cached memory back (-1: every device). */
em_status em_cuda_empty_cache(em_state *S, int device);
/* Device memory running short. The CUDA allocator sets this flag (to 1) when a
** device's allocated bytes rise past 80 % of its memory, and when an allocation
** failed even after its cache was emptied. The host's answer is to release the
** tensors it no longer reaches and clear the flag: ember's Lua layer reads it at
** every new tensor and then runs a full garbage collection. The pointer stays
** valid for the state's life. */
int *em_memory_pressure_flag(em_state *S);
/* Whether float32 matmuls on CUDA devices may use TF32 tensor cores (10-bit
** mantissa products, float32 accumulation: ~8x faster on A100/H100, ~1e-3
** relative error). Off by default, as in PyTorch; the emulator always computes
** in full float32. */
void em_cuda_set_allow_tf32(em_state *S, int allow);
int em_cuda_allow_tf32(em_state *S);
/* A host's own way to free device memory on demand: called by the allocator, on
** the allocating thread, when an allocation failed after the cache was emptied;
** the allocation is then retried once. It may release tensors, but must not
** allocate on that device. NULL removes it. (Lua can't be entered from there:
** the Lua layer answers the pressure flag instead.) */
void em_cuda_set_reclaim_hook(em_state *S, void (*fn)(void *ud, int device, size_t nbytes),
                              void *ud);
/* -- CUDA graphs (kernels/graph.c) -------------------------------------------------
** em_cuda_graph_begin starts capturing the work this state queues on a device;
** em_cuda_graph_end stops and returns the graph -- nothing captured has run yet.
** em_cuda_graph_launch queues all of the captured work again in one call (where
** the ops cost a launch each), on the same memory: the tensors made while
** capturing are kept by the graph (each launch rewrites their values), and the
** tensors it reads that existed before (parameters, static inputs) must stay
** alive while the graph lives: copy new data into them before a launch. Scalar
** arguments are those of the capture. What can't be captured -- reading a value,
** a copy to or from the CPU or between devices, an op that waits for the device
** -- fails naming it, and then em_cuda_graph_end fails too; the state goes on.
** One capture at a time per state. */
typedef struct em_cuda_graph em_cuda_graph;
em_status em_cuda_graph_begin(em_state *S, int device);
/* The device being captured, or -1. */
int em_cuda_capturing(em_state *S);
em_status em_cuda_graph_end(em_state *S, em_cuda_graph **out);
em_status em_cuda_graph_launch(em_state *S, em_cuda_graph *g);
void em_cuda_graph_free(em_state *S, em_cuda_graph *g);
/* -- Compiled steps (core/compile/; em.compile in Lua) ---------------------------------
** em_compile_begin starts recording every kernel call this state makes on the CPU
** while the step runs as usual (eagerly); em_compile_end stops and returns the
** program: those calls with their arguments, every tensor they touched held by
** the program. why receives "" when the program can replay, else the reason
** (a call on another device, a gradient accumulated into a .grad from before the
** capture); the program is returned either way (NULL only on failure).
** em_program_run replays the calls on the same memory: copy new inputs into the
** captured input tensors first; results are rewritten in place. Random draws take
** fresh counters at every replay. em_program_ready says whether the leaves the
** capture gave a first gradient have none now (run refuses otherwise).
** em_program_patch_sgd / _adam set call i's per-step arguments (the learning
** rate; Adam's step counts, one per recorded parameter) before a replay.
** em_program_compare gives the first call where two programs differ, or -1.
** em_compile_guard_begin / _end bracket calls that a replay skips when flag (a CPU
** tensor of one element, read when the replay reaches the bracket) is nonzero: a
** decision the eager step makes on the host (a GradScaler skipping the optimizer's
** update on inf or NaN). Guards do not nest. em_program_ran(p, i) says whether call
** i ran in the last replay (1), was skipped by a guard (0), or is no call (-1).
** Only the CPU's calls are recorded.
** One capture at a time per state; the program must be freed before the state. */
typedef struct em_program em_program;
typedef struct em_program_info {
  int calls;                 /* calls, gradient events included */
  int kernels;               /* of which kernel calls (a fused call counts once) */
  int fused;                 /* of which fused calls, each doing the work of several */
  int64_t held_bytes;        /* tensor memory the program keeps alive */
  int64_t replays;
} em_program_info;
em_status em_compile_begin(em_state *S);
int em_compile_capturing(const em_state *S);
/* While paused (1), calls run without being recorded: one-time work inside a
** captured step, such as an optimizer's state made at its first step. */
void em_compile_pause(em_state *S, int paused);
/* Calls recorded so far (-1 when not capturing): a recorded call's index. */
int em_compile_recorded(const em_state *S);
em_status em_compile_end(em_state *S, em_program **out, char *why, size_t whylen);
int em_program_ready(const em_program *p);
em_status em_program_run(em_state *S, em_program *p);
em_status em_program_patch_sgd(em_state *S, em_program *p, int i, double lr);
em_status em_program_patch_adam(em_state *S, em_program *p, int i, int n, const int64_t *steps,
                                double lr, double weight_decay, int decoupled);
em_status em_compile_guard_begin(em_state *S, const em_tensor *flag);
em_status em_compile_guard_end(em_state *S);
int em_program_ran(const em_program *p, int i);
void em_program_stats(const em_program *p, em_program_info *out);
const char *em_program_op(const em_program *p, int i);
/* The kind of the k-th fused call ("conv2d_relu", "relu_backward"), NULL past the last;
** and the ops it does ("conv2d, relu"; a chain's, "mul, add, tanh"), kept with p. */
const char *em_program_fused(const em_program *p, int k);
const char *em_program_fused_ops(const em_program *p, int k);
int em_program_compare(const em_program *a, const em_program *b);
void em_program_free(em_state *S, em_program *p);
/* Pinned (page-locked) host memory: a CPU tensor whose data the CUDA runtime
** can copy from without staging, so t:cuda() of it is asynchronous and runs on
** the device's copy stream, beside the compute. *out is a new pinned contiguous
** copy of t (t itself when it is already pinned, retained). Until a copy from it
** ran (any read of the device tensor, or em_cuda_synchronize), the pinned tensor
** must not be written: as with PyTorch's non_blocking copies. Needs a CUDA device
** (the pinned memory belongs to the state's CUDA runtime); release pinned
** tensors before em_close. */
em_status em_tensor_pin_memory(em_state *S, const em_tensor *t, em_tensor **out);
int em_tensor_is_pinned(const em_tensor *t);

/* -- Images (core/io/image.c) ------------------------------------------------------ */
/* em_image_opts and the pixel limit: see Images, at em_image_load. */
/* The state's limit for calls that don't give one: n > 0, 0 = EM_IMAGE_MAX_PIXELS
** (the initial setting), < 0 = no limit. em_image_max_pixels returns the limit in
** force, -1 for none. Same thread rules as em_set_num_threads. */
void em_image_set_max_pixels(em_state *S, int64_t max_pixels);
int64_t em_image_max_pixels(em_state *S);
/* Decodes a JPEG or PNG file (by its signature) into uint8 (C, H, W): C = 3 (RGB)
** when channels is 3, the file's own (1 gray, 3 RGB, 4 RGBA) when channels is 0. */
em_status em_image_load(em_state *S, const char *path, int channels, em_tensor **out);
/* The same with options (NULL = defaults; only max_pixels applies). */
em_status em_image_load_opts(em_state *S, const char *path, int channels,
                             const em_image_opts *o, em_tensor **out);
/* Writes a uint8 (C, H, W) tensor, C 1 or 3, as PNG or JPEG by the path's
** extension (.png, .jpg/.jpeg); quality 1..100 for JPEG (0 = 90). */
em_status em_image_save(em_state *S, const char *path, const em_tensor *img, int quality);

#ifdef __cplusplus
}
#endif
#endif /* EMBER_H */

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
**    layer can speak 1-based without an extra pass over the data;
**  - the file is plain enough for LuaJIT's ffi.cdef: no structs by value, no
**    varargs, no macros outside the guarded preprocessor block below (the build
**    strips lines starting with '#' when it generates the Lua cdefs).
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

/* Device numbers: EM_CPU (-1) or a CUDA ordinal (0, 1, ...). */
enum { EM_CPU = -1 };
/* Most dimensions a tensor can have. */
enum { EM_MAX_DIMS = 8 };

typedef struct em_state em_state;
typedef struct em_tensor em_tensor;

/* -- State ------------------------------------------------------------------
** alloc follows Lua's lua_Alloc contract: alloc(ud, ptr, osize, nsize) frees
** ptr when nsize == 0 and returns NULL; otherwise (re)allocates. It may return
** NULL to refuse, and ember reports EM_ERR_NOMEM cleanly. */
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
/* dim < 0 squeezes every size-1 dimension. */
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

#ifdef __cplusplus
}
#endif
#endif /* EMBER_H */

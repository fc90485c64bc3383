/*
** libs.h -- the real CUDA libraries (CUDA runtime, cuBLASLt, cuDNN, NCCL), loaded
** only when used.
**
** Why dlopen. Neither libember nor libember_cuda links anything of CUDA
** (DESIGN.md, principle 7): a CPU-only host must load and run ember without the
** toolkit, and a GPU host must not fail to start because cuDNN or NCCL is missing
** when it only wants GEMMs. So each
** library is opened with dlopen the first time something asks for it, and every
** function ember calls is looked up with dlsym into a table. The toolkit's
** headers are read for types, constants and prototypes only (each table entry is
** declared as `__typeof__(cudnnGetVersion) *`, so the compiler checks our calls
** against the real prototypes, yet no object references a CUDA symbol).
**
** Where. For each file name in order -- the soname ember was built for first
** (libcudart.so.13, libcublasLt.so.13, libcudnn.so.9, libnccl.so.2), then the
** unversioned name -- in each place in order: $EMBER_CUDA_HOME/lib64 (when set),
** /usr/local/cuda/lib64, then the system search path (LD_LIBRARY_PATH,
** ld.so.cache). A bad EMBER_CUDA_HOME is not an error: the search goes on, and so
** it does past a file that is there but does not load (not an ELF file, a missing
** dependency); the message of a library found nowhere lists every place tried and
** dlopen's reason for each file that failed. A library that loads is then bound
** and asked its version, and one that lacks a function ember needs, or has
** another major version than the headers ember was built with, is refused with a
** message naming the file (cudart's structs and cuDNN's API change between
** majors; calling through the wrong prototypes would corrupt memory instead of
** failing).
**
** Laziness and failure. emk_libs_open finds nothing yet; emk_libs_cudnn (and its
** siblings) load on first call. A missing cuDNN fails only cuDNN's users, with a
** message that says what was tried; the failure is remembered, so asking again
** is cheap and gives the same message. Nothing here exits or aborts: every error
** is an em_status with the library's own words (cudaGetErrorName/String,
** cublasLtGetStatusName, cudnnGetErrorString, ncclGetErrorString).
**
** Lifetime. The libraries are opened with RTLD_NODELETE: they stay mapped for the
** rest of the process even after emk_libs_close. CUDA libraries are not written
** to be unloaded -- ncclGetUniqueId leaves a bootstrap thread running inside
** libnccl, and cudart tears its context down from an exit handler -- so closing
** frees ember's tables and nothing else.
**
** What works without a GPU (and so is tested on every machine with the toolkit):
** loading, versions, cudaDriverGetVersion (0 = no driver), cudaGetDeviceCount
** (fails cleanly: "no CUDA driver"), cuDNN tensor/filter/convolution descriptors
** and cudnnGetConvolution2dForwardOutputDim, cuBLASLt matmul descriptors and
** matrix layouts, ncclGetVersion and ncclGetUniqueId. Handles (cudnnCreate,
** cublasLtCreate) need a device; the emk_*_check_handle calls say why they fail.
**
** Threads: an emk_libs may be used from any thread; loading is serialised by a
** mutex inside it. Without the CUDA headers at build time every call fails with
** EM_ERR_UNSUPPORTED ("built without the CUDA headers"). This header includes no
** CUDA header; code compiled with them reaches the function tables through
** libs_fn.h.
*/
#ifndef EMBER_KERNELS_REAL_LIBS_H
#define EMBER_KERNELS_REAL_LIBS_H
#include "ember.h"
#include <stddef.h>
#include <stdint.h>

typedef struct emk_libs emk_libs;

typedef enum emk_lib_id {
  EMK_LIB_CUDART, EMK_LIB_CUBLASLT, EMK_LIB_CUDNN, EMK_LIB_NCCL, EMK_LIB_COUNT
} emk_lib_id;

/* The function tables (libs_fn.h: only for code compiled with the CUDA headers). */
typedef struct emk_cudart_fns emk_cudart_fns;
typedef struct emk_cublaslt_fns emk_cublaslt_fns;
typedef struct emk_cudnn_fns emk_cudnn_fns;
typedef struct emk_nccl_fns emk_nccl_fns;

/* -- Opening ----------------------------------------------------------------------- */
/* Reads EMBER_CUDA_HOME now; loads nothing. Fails only for memory (or without the
** CUDA headers at build time). */
em_status emk_libs_open(emk_libs **out, char *err, size_t errlen);
void emk_libs_close(emk_libs *L);

/* Loads library id on first use (EM_OK when it is loaded, now or before), else
** EM_ERR_UNSUPPORTED and why. fns (may be NULL) receives the function table. */
em_status emk_libs_load(emk_libs *L, emk_lib_id id, char *err, size_t errlen);
em_status emk_libs_cudart(emk_libs *L, const emk_cudart_fns **fns, char *err, size_t errlen);
em_status emk_libs_cublaslt(emk_libs *L, const emk_cublaslt_fns **fns, char *err,
                            size_t errlen);
em_status emk_libs_cudnn(emk_libs *L, const emk_cudnn_fns **fns, char *err, size_t errlen);
em_status emk_libs_nccl(emk_libs *L, const emk_nccl_fns **fns, char *err, size_t errlen);

/* "CUDA runtime", "cuBLASLt", "cuDNN", "NCCL". */
const char *emk_lib_name(emk_lib_id id);

/* -- What was found ------------------------------------------------------------------ */
typedef struct emk_lib_version {
  int code;                 /* the library's own number: 13000, 130100, 91900, 22809 */
  int major, minor, patch;
  int built_major;          /* the major version of the headers ember was built with */
} emk_lib_version;

/* Loads id if needed; its version. */
em_status emk_libs_version(emk_libs *L, emk_lib_id id, emk_lib_version *out, char *err,
                           size_t errlen);
/* The file a loaded library came from (as the dynamic linker resolved it), or NULL
** when it is not loaded. Valid until emk_libs_close. */
const char *emk_libs_path(emk_libs *L, emk_lib_id id);

/* cudaDriverGetVersion: 13000 for a CUDA 13.0 driver, 0 when there is none. */
em_status emk_libs_driver_version(emk_libs *L, int *version, char *err, size_t errlen);
/* cudaGetDeviceCount. *count is always set (0 on failure). No device is EM_OK with
** 0; no driver, or one too old for the runtime, is EM_ERR_DEVICE ("no CUDA
** driver ..."). */
em_status emk_libs_device_count(emk_libs *L, int *count, char *err, size_t errlen);

/* A few lines for `ember --info`, each ending in '\n': one per library, its version
** and the file it came from, or "not found" and the places tried. Loads every
** library. Truncated to len - 1 bytes; EM_ERR_ARG when len is 0. */
em_status emk_libs_describe(emk_libs *L, char *buf, size_t len);

/* -- Checks that run the real libraries without a GPU -------------------------------- */
/* A 2-D convolution: input NCHW float32, filter KCRS (k output channels). */
typedef struct emk_conv2d_shape {
  int n, c, h, w;
  int k, r, s;
  int pad_h, pad_w, stride_h, stride_w, dil_h, dil_w;
} emk_conv2d_shape;

typedef struct emk_conv2d_check {
  int out[4];               /* N, K, P, Q: cudnnGetConvolution2dForwardOutputDim */
  int input[8];             /* cudnnGetTensor4dDescriptor: n c h w, then strides */
  int filter[4];            /* cudnnGetFilter4dDescriptor: k c r s */
  int conv[6];              /* cudnnGetConvolution2dDescriptor: pads, strides, dilations */
} emk_conv2d_check;

/* Builds cuDNN's tensor, filter and convolution descriptors for sh (packed NCHW
** float32, cross-correlation, float32 compute), reads them back, asks cuDNN the
** output dims, destroys them. A shape cuDNN refuses is EM_ERR_SHAPE with
** cudnnGetErrorString's text. */
em_status emk_cudnn_conv2d_check(emk_libs *L, const emk_conv2d_shape *sh,
                                 emk_conv2d_check *out, char *err, size_t errlen);

/* C (m x n) = op(A) op(B), op(A) m x k, op(B) k x n, float32 throughout. */
typedef struct emk_gemm_shape {
  int64_t m, n, k;
  int trans_a, trans_b;
  int row_major;            /* storage order of A, B and C */
} emk_gemm_shape;

typedef struct emk_gemm_layout {
  uint64_t rows, cols;      /* of the matrix as stored (before op) */
  int64_t ld;
  int32_t order;            /* 0 column-major (CUBLASLT_ORDER_COL), 1 row-major */
  uint32_t type;            /* cudaDataType: 0 = CUDA_R_32F */
} emk_gemm_layout;

typedef struct emk_gemm_check {
  int32_t trans_a, trans_b; /* read back: cublasOperation_t, 0 = N, 1 = T */
  int32_t compute_type;     /* cublasComputeType_t: 68 = CUBLAS_COMPUTE_32F */
  int32_t scale_type;       /* cudaDataType: 0 = CUDA_R_32F */
  emk_gemm_layout a, b, c;
} emk_gemm_check;

/* cublasLtMatmulDescCreate (compute 32F, scale 32F), transa/transb set and read
** back, a cublasLtMatrixLayout for each of A, B, C read back; all destroyed. */
em_status emk_cublaslt_gemm_check(emk_libs *L, const emk_gemm_shape *sh,
                                  emk_gemm_check *out, char *err, size_t errlen);

/* cublasLtCreate / cudnnCreate and destroy: these need a device. EM_OK where one
** works; else EM_ERR_DEVICE naming the call and the library's status. */
em_status emk_cublaslt_check_handle(emk_libs *L, char *err, size_t errlen);
em_status emk_cudnn_check_handle(emk_libs *L, char *err, size_t errlen);

enum { EMK_NCCL_ID_BYTES = 128 };
/* ncclGetUniqueId (no GPU needed: a bootstrap address and a random magic). */
em_status emk_nccl_unique_id(emk_libs *L, unsigned char id[EMK_NCCL_ID_BYTES], char *err,
                             size_t errlen);

/* -- Internal, for tests ----------------------------------------------------------- */
/* The search above for a NULL-terminated list of file names (tried in that order,
** each in every place). EM_OK with the dlopen handle and the file it came from,
** or EM_ERR_UNSUPPORTED and a message listing every place tried. */
em_status emk_libs_find(emk_libs *L, const char *const *names, void **handle, char *path,
                        size_t pathlen, char *err, size_t errlen);

#endif

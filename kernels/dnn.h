/*
** dnn.h -- the CUDA backend's nn entries (k_dnn.c: convolution, batch norm;
** k_pool.c: pooling; as core/backend.h's emi_backend describes them), the runtimes' nn
** entries that serve them (runtime.h: emulated in emu/dnn_emu.c, cuDNN in
** real/dnn_real.c), and the state's convolution-algorithm cache (algo_cache.c)
** with its counters for tests.
*/
#ifndef EMBER_KERNELS_DNN_H
#define EMBER_KERNELS_DNN_H
#include "backend.h"
#include "runtime.h"

/* -- Backend entries (k_dnn.c) ------------------------------------------------------ */
em_status emk_conv2d(emi_device *d, const emi_conv_geom *g, em_tensor *y, const em_tensor *x,
                     const em_tensor *w, const em_tensor *b);
em_status emk_conv2d_backward(emi_device *d, const emi_conv_geom *g, em_tensor *gx,
                              em_tensor *gw, em_tensor *gb, const em_tensor *gy,
                              const em_tensor *x, const em_tensor *w);
/* k_pool.c: pooling, every floating dtype, NCHW or channels last. */
em_status emk_max_pool2d(emi_device *d, const emi_pool_geom *g, em_tensor *y, em_tensor *ind,
                         const em_tensor *x, int index_base);
em_status emk_max_pool2d_backward(emi_device *d, const emi_pool_geom *g, em_tensor *gx,
                                  const em_tensor *gy, const em_tensor *ind, int index_base);
em_status emk_avg_pool2d(emi_device *d, const emi_pool_geom *g, em_tensor *y,
                         const em_tensor *x, int count_include_pad);
em_status emk_avg_pool2d_backward(emi_device *d, const emi_pool_geom *g, em_tensor *gx,
                                  const em_tensor *gy, int count_include_pad);
em_status emk_adaptive_avg_pool2d(emi_device *d, const emi_pool_geom *g, em_tensor *y,
                                  const em_tensor *x);
em_status emk_adaptive_avg_pool2d_backward(emi_device *d, const emi_pool_geom *g,
                                           em_tensor *gx, const em_tensor *gy);
em_status emk_batch_norm(emi_device *d, em_tensor *y, em_tensor *mean, em_tensor *invstd,
                         em_tensor *running_mean, em_tensor *running_var, const em_tensor *x,
                         const em_tensor *w, const em_tensor *b, int training,
                         double momentum, double eps);
em_status emk_batch_norm_backward(emi_device *d, em_tensor *gx, em_tensor *gw, em_tensor *gb,
                                  const em_tensor *gy, const em_tensor *x,
                                  const em_tensor *mean, const em_tensor *invstd,
                                  const em_tensor *w, int training);

/* -- The algorithm cache (algo_cache.c) ----------------------------------------------
** One algorithm per (device, direction, dtype, allow_tf32, geometry, layout), picked at
** the first convolution of that key, in the state's CUDA context. Counters since
** the context opened. */
typedef struct emk_dnn_cache_stats { uint64_t hits, misses, entries; } emk_dnn_cache_stats;
typedef struct emk_algo_cache emk_algo_cache;
emk_algo_cache *emk_algo_cache_new(void);                /* NULL: out of memory */
void emk_algo_cache_free(emk_algo_cache *c);
int emk_algo_cache_find(emk_algo_cache *c, int dev, const emk_conv_desc *desc,
                        emk_conv_algo *out);              /* 1: a hit, into out */
void emk_algo_cache_put(emk_algo_cache *c, int dev, const emk_conv_desc *desc,
                        const emk_conv_algo *pick);
void emk_algo_cache_stats(const emk_algo_cache *c, emk_dnn_cache_stats *out);

/* -- Math modes ------------------------------------------------------------------------
** cuDNN's heuristics rank each algorithm under a math mode (runtime.h's EMK_MATH_*,
** cuDNN's cudnnMathType_t), and a convolution must run in the mode its algorithm was
** ranked under. What a caller allows decides which modes may run:
**   - TENSOR_OP_CONVERT (float32 rounded to float16 for the tensor cores) never: it
**     loses range and precision that neither allow_tf32 nor float64 permits;
**   - float32 without TF32: FMA only. TENSOR_OP rounds inputs to TF32, and DEFAULT
**     permits TF32 on Ampere and later, so a DEFAULT algorithm runs as FMA and a
**     TENSOR_OP one is dropped;
**   - float32 with TF32, and float64 (whose tensor-core path is exact float64): the
**     mode offered;
**   - float16 and bfloat16: TENSOR_OP, asked and run (as PyTorch sets it). These
**     types exist for the tensor cores; the heuristics asked in DEFAULT rank
**     algorithms that leave them idle, several times slower on an H100.
** emk_conv_math: 1 and *use (the mode to run in) when the offered mode may run for
** dt and allow_tf32, else 0 (the algorithm is left out). Both runtimes use it
** (dnn_real.c on cuDNN's list, dnn_emu.c on its made-up one). */
static inline int emk_conv_math(em_dtype dt, int allow_tf32, int offered, int *use) {
  *use = offered;
  if (offered != EMK_MATH_DEFAULT && offered != EMK_MATH_TENSOR_OP && offered != EMK_MATH_FMA)
    return 0;
  if (dt == EM_FLOAT32 && !allow_tf32) {
    if (offered == EMK_MATH_TENSOR_OP) return 0;
    *use = EMK_MATH_FMA;
  }
  if ((dt == EM_FLOAT16 || dt == EM_BFLOAT16) && offered == EMK_MATH_DEFAULT)
    *use = EMK_MATH_TENSOR_OP;
  return 1;
}
/* The mode a descriptor is asked about in: what the caller allows at most. */
static inline int emk_conv_query_math(em_dtype dt, int allow_tf32) {
  if (dt == EM_FLOAT16 || dt == EM_BFLOAT16) return EMK_MATH_TENSOR_OP;
  return dt == EM_FLOAT32 && !allow_tf32 ? EMK_MATH_FMA : EMK_MATH_DEFAULT;
}

/* -- The runtimes' entries ------------------------------------------------------------ */
em_status emi_emu_conv_algos(emk_runtime *rt, int dev, const emk_conv_desc *c,
                             emk_conv_algo *out, int max, int *n);
em_status emi_emu_conv(emk_runtime *rt, emk_stream *s, const emk_conv_desc *c,
                       const emk_conv_algo *algo, void *ws, size_t ws_size, void *x, void *w,
                       void *y, void *bias);
em_status emi_emu_batch_norm_fwd(emk_runtime *rt, emk_stream *s, const emk_bn_desc *b,
                                 const void *x, const void *w, const void *bias, void *y,
                                 void *mean, void *invstd, void *running_mean,
                                 void *running_var);
em_status emi_emu_batch_norm_bwd(emk_runtime *rt, emk_stream *s, const emk_bn_desc *b,
                                 const void *x, const void *gy, const void *w,
                                 const void *mean, const void *invstd, void *gx, void *gw,
                                 void *gb);
/* The emulator's made-up algorithms (dnn_emu.c), for tests: the workspace bytes
** algorithm `algo` needs for c. */
size_t emk_emu_conv_workspace(const emk_conv_desc *c, int algo);

struct emr;
void emr_dnn_close(struct emr *R);   /* runtime_real.c's close: the cuDNN handles and
                                     ** descriptor sets of that runtime */
em_status emr_conv_algos(emk_runtime *rt, int dev, const emk_conv_desc *c, emk_conv_algo *out,
                         int max, int *n);
em_status emr_conv(emk_runtime *rt, emk_stream *s, const emk_conv_desc *c,
                   const emk_conv_algo *algo, void *ws, size_t ws_size, void *x, void *w,
                   void *y, void *bias);
em_status emr_batch_norm_fwd(emk_runtime *rt, emk_stream *s, const emk_bn_desc *b,
                             const void *x, const void *w, const void *bias, void *y,
                             void *mean, void *invstd, void *running_mean, void *running_var);
em_status emr_batch_norm_bwd(emk_runtime *rt, emk_stream *s, const emk_bn_desc *b,
                             const void *x, const void *gy, const void *w, const void *mean,
                             const void *invstd, void *gx, void *gw, void *gb);

/* -- cuDNN without a GPU (dnn_real.c, built only with the CUDA headers), for tests --
** Loads cuDNN and builds the tensor, filter and convolution descriptors the real
** conv would use for c (cudnnCreate*Descriptor and the Set calls need no driver),
** and puts in dims the output dims cuDNN works out from them (N, O, OH, OW).
** EM_ERR_UNSUPPORTED when cuDNN cannot be loaded; a geometry cuDNN refuses is
** EM_ERR_SHAPE with its words. */
em_status emk_dnn_describe_check(const emk_conv_desc *c, int dims[4], char *err,
                                 size_t errlen);
/* The same descriptors, with math mode `math` set on the convolution descriptor by
** the call conv makes before it runs, and *got = the mode cuDNN reads back. */
em_status emk_dnn_math_check(const emk_conv_desc *c, int math, int *got, char *err,
                             size_t errlen);
/* The bytes of x, w and y that conv_algos allocates for cuDNN's Find trial:
** 1 and bytes[] = {x, w, y}, or 0 (bytes all 0) for a geometry it refuses. */
int emk_dnn_find_bytes(const emk_conv_desc *c, size_t bytes[3]);
/* Whether conv_algos tries Find (EMBER_CUDNN_FIND unset or not 0/off/false/no). */
int emk_dnn_find_on(void);
/* Loads cuDNN and puts in *count how many of the three Find*AlgorithmEx functions
** it has (3 for cuDNN 9; 0 leaves conv_algos on the heuristics alone). */
em_status emk_dnn_find_symbols(int *count, char *err, size_t errlen);

#endif

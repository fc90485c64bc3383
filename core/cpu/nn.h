/*
** nn.h -- the CPU kernels under the nn layers (conv, pooling, losses, norms),
** called directly by core/ops/nn_*.c. They take raw pointers to contiguous data
** that the ops layer has checked and laid out; dt is EM_FLOAT32 or EM_FLOAT64.
** Only the ones that need scratch memory can fail (EM_ERR_NOMEM, message set).
*/
#ifndef EMBER_CPU_NN_H
#define EMBER_CPU_NN_H
#include "../internal.h"

/* conv.c -- im2col + GEMM, parallel over the batch. */
typedef struct emi_conv_geom {
  int64_t N, C, H, W;        /* input */
  int64_t O, kH, kW;         /* weight (O, C/G, kH, kW) */
  int64_t OH, OW;            /* output */
  int64_t sH, sW, pH, pW, dH, dW, G;
} emi_conv_geom;
em_status emi_cpu_conv2d(em_state *S, em_dtype dt, const emi_conv_geom *g, const void *x,
                         const void *w, const void *b, void *y);
/* gx, gw, gb may each be NULL. */
em_status emi_cpu_conv2d_backward(em_state *S, em_dtype dt, const emi_conv_geom *g,
                                  const void *gy, const void *x, const void *w, void *gx,
                                  void *gw, void *gb);

/* nn_gemm.c -- C (MxN) = [C +] A (MxK, any strides) * B (KxN, rows of stride ldb),
** single-threaded float32 (AVX-512 kernel where built with it, else cblas).
** With the fallback, A must have acs == 1 or ars == 1. */
void emi_nn_sgemm(int64_t M, int64_t N, int64_t K, const float *A, int64_t ars, int64_t acs,
                  const float *B, int64_t ldb, float *C, int64_t ldc, int acc);

/* The same with rows given by pointers: A row i element k at A[i][k*acs], B row
** k at B[k] (conv_fast.c reads shifted windows of a padded image this way). */
void emi_nn_sgemm_rows(int64_t M, int64_t N, int64_t K, const float *const *A, int64_t acs,
                       const float *const *B, float *C, int64_t ldc, int acc);
/* conv_fast.c -- float32 stride-1 conv2d without im2col (AVX-512 builds). */
bool emi_conv_fast_ok(const emi_conv_geom *g);
em_status emi_conv_fast_fwd(em_state *S, const emi_conv_geom *g, const float *x,
                            const float *w, const float *b, float *y, int64_t shares);
em_status emi_conv_fast_bwd(em_state *S, const emi_conv_geom *g, const float *gy,
                            const float *x, const float *w, float *gx, float *gw, float *gb,
                            int64_t shares);

/* pool.c -- planes = N*C independent (H, W) planes. */
typedef struct emi_pool_geom {
  int64_t planes, H, W, OH, OW, kH, kW, sH, sW, pH, pW, dH, dW;
} emi_pool_geom;
void emi_cpu_max_pool2d(em_state *S, em_dtype dt, const emi_pool_geom *g, const void *x,
                        void *y, int64_t *ind, int index_base);
void emi_cpu_max_pool2d_backward(em_state *S, em_dtype dt, const emi_pool_geom *g,
                                 const void *gy, const int64_t *ind, int index_base,
                                 void *gx);
void emi_cpu_avg_pool2d(em_state *S, em_dtype dt, const emi_pool_geom *g, const void *x,
                        void *y, int count_include_pad);
void emi_cpu_avg_pool2d_backward(em_state *S, em_dtype dt, const emi_pool_geom *g,
                                 const void *gy, void *gx, int count_include_pad);
void emi_cpu_adaptive_avg_pool2d(em_state *S, em_dtype dt, const emi_pool_geom *g,
                                 const void *x, void *y);
void emi_cpu_adaptive_avg_pool2d_backward(em_state *S, em_dtype dt,
                                          const emi_pool_geom *g, const void *gy,
                                          void *gx);

/* nn_loss.c -- logits (N, C) rows; target already as int64 minus index_base,
** with ignored rows marked by ign[i] != 0 (their loss is 0). */
void emi_cpu_cross_entropy(em_dtype dt, int64_t N, int64_t C, const void *x,
                           const int64_t *t, const unsigned char *ign, double smooth,
                           double *loss_rows, void *lse);
/* gl: per-row gradient factor (N) already including the mean's 1/count. */
void emi_cpu_cross_entropy_backward(em_dtype dt, int64_t N, int64_t C, const void *x,
                                    const int64_t *t, const unsigned char *ign,
                                    double smooth, const double *gl, const void *lse,
                                    void *gx);
/* Pointwise losses over n elements: EMI_LOSS_MSE, EMI_LOSS_BCE_LOGITS. Forward
** writes per-element losses to out (when not NULL) and returns their sum. The
** backward scales by gl[i] (gl NULL: by the scalar g). */
enum { EMI_LOSS_MSE = 0, EMI_LOSS_BCE_LOGITS = 1 };
double emi_cpu_pointwise_loss(em_dtype dt, int kind, int64_t n, const void *x,
                              const void *y, void *out);
void emi_cpu_pointwise_loss_backward(em_dtype dt, int kind, int64_t n, const void *x,
                                     const void *y, const void *gl, double g, void *gx);

/* norm.c -- batch norm over (N, C, L); layer norm over (M rows, K). */
void emi_cpu_batch_norm_stats(em_state *S, em_dtype dt, int64_t N, int64_t C, int64_t L,
                              const void *x, double *mean, double *var);
void emi_cpu_batch_norm_apply(em_state *S, em_dtype dt, int64_t N, int64_t C, int64_t L,
                              const void *x, const double *mean, const double *invstd,
                              const void *w, const void *b, void *y);
void emi_cpu_batch_norm_backward(em_state *S, em_dtype dt, int64_t N, int64_t C,
                                 int64_t L, const void *gy, const void *x,
                                 const double *mean, const double *invstd, const void *w,
                                 int training, void *gx, void *gw, void *gb);
void emi_cpu_layer_norm(em_state *S, em_dtype dt, int64_t M, int64_t K, const void *x,
                        const void *w, const void *b, double eps, void *y, void *mean,
                        void *rstd);
em_status emi_cpu_layer_norm_backward(em_state *S, em_dtype dt, int64_t M, int64_t K,
                                      const void *gy, const void *x, const void *mean,
                                      const void *rstd, const void *w, void *gx,
                                      void *gw, void *gb);
#endif

/*
** cpu.h -- the CPU backend's kernels, one declaration per backend table entry
** (see emi_backend in backend.h for what each one may assume), and the
** process-wide OpenBLAS thread-count registry (blas.c). Only core/cpu/ includes it.
*/
#ifndef EMBER_CPU_H
#define EMBER_CPU_H
#include "../internal.h"

/* copy.c */
em_status emi_cpu_copy(emi_device *dev, em_tensor *out, const em_tensor *src);
em_status emi_cpu_fill(emi_device *dev, em_tensor *out, double value);
/* elementwise.c */
em_status emi_cpu_unary(emi_device *dev, em_unop op, em_tensor *out, const em_tensor *a);
em_status emi_cpu_binary(emi_device *dev, em_binop op, em_tensor *out, const em_tensor *a,
                         const em_tensor *b);
em_status emi_cpu_binary_scalar(emi_device *dev, em_binop op, em_tensor *out,
                                const em_tensor *a, double s, int reverse);
em_status emi_cpu_add_scaled(emi_device *dev, em_tensor *out, const em_tensor *a,
                             const em_tensor *b, double alpha);
em_status emi_cpu_clamp(emi_device *dev, em_tensor *out, const em_tensor *a, double lo,
                        double hi);
em_status emi_cpu_where(emi_device *dev, em_tensor *out, const em_tensor *cond,
                        const em_tensor *a, const em_tensor *b);
/* reduce.c */
em_status emi_cpu_reduce(emi_device *dev, em_redop op, em_tensor *out, const em_tensor *a,
                         unsigned mask);
em_status emi_cpu_var(emi_device *dev, em_tensor *out, const em_tensor *a, unsigned mask,
                      double correction, int take_sqrt);
em_status emi_cpu_norm(emi_device *dev, em_tensor *out, const em_tensor *a, unsigned mask,
                       double p);
em_status emi_cpu_arg_reduce(emi_device *dev, em_tensor *values, em_tensor *indices,
                             const em_tensor *a, int dim, int want_max, int index_base);
em_status emi_cpu_softmax(emi_device *dev, em_tensor *out, const em_tensor *a, int dim,
                          int log);
/* matmul.c */
em_status emi_cpu_matmul(emi_device *dev, em_tensor *out, const em_tensor *a,
                         const em_tensor *b);
/* index.c */
em_status emi_cpu_index_select(emi_device *dev, em_tensor *out, const em_tensor *a, int dim,
                               const em_tensor *idx, int index_base);
em_status emi_cpu_gather(emi_device *dev, em_tensor *out, const em_tensor *a, int dim,
                         const em_tensor *idx, int index_base);
/* random.c */
em_status emi_cpu_uniform(emi_device *dev, em_tensor *out, uint64_t seed, uint64_t offset,
                          double lo, double hi);
em_status emi_cpu_normal(emi_device *dev, em_tensor *out, uint64_t seed, uint64_t offset,
                         double mean, double std);
em_status emi_cpu_randint(emi_device *dev, em_tensor *out, uint64_t seed, uint64_t offset,
                          int64_t lo, int64_t hi);
em_status emi_cpu_arange(emi_device *dev, em_tensor *out, double start, double step);

/* conv.c */
em_status emi_cpu_conv2d(emi_device *dev, const emi_conv_geom *g, em_tensor *y,
                         const em_tensor *x, const em_tensor *w, const em_tensor *b);
em_status emi_cpu_conv2d_backward(emi_device *dev, const emi_conv_geom *g, em_tensor *gx,
                                  em_tensor *gw, em_tensor *gb, const em_tensor *gy,
                                  const em_tensor *x, const em_tensor *w);
/* pool.c */
em_status emi_cpu_max_pool2d(emi_device *dev, const emi_pool_geom *g, em_tensor *y,
                             em_tensor *ind, const em_tensor *x, int index_base);
/* ..._relu: then ReLU's backward, gx = relu_mask > 0 ? gx : gx * 0, plane by plane
** (em.compile's fusion; NCHW float32/float64, relu_mask dense like gx) */
em_status emi_cpu_max_pool2d_backward_relu(emi_device *dev, const emi_pool_geom *g,
                                           em_tensor *gx, const em_tensor *gy,
                                           const em_tensor *ind, int index_base,
                                           const em_tensor *relu_mask);
em_status emi_cpu_max_pool2d_backward(emi_device *dev, const emi_pool_geom *g, em_tensor *gx,
                                      const em_tensor *gy, const em_tensor *ind,
                                      int index_base);
em_status emi_cpu_avg_pool2d(emi_device *dev, const emi_pool_geom *g, em_tensor *y,
                             const em_tensor *x, int count_include_pad);
em_status emi_cpu_avg_pool2d_backward(emi_device *dev, const emi_pool_geom *g, em_tensor *gx,
                                      const em_tensor *gy, int count_include_pad);
em_status emi_cpu_adaptive_avg_pool2d(emi_device *dev, const emi_pool_geom *g, em_tensor *y,
                                      const em_tensor *x);
em_status emi_cpu_adaptive_avg_pool2d_backward(emi_device *dev, const emi_pool_geom *g,
                                               em_tensor *gx, const em_tensor *gy);
/* pool_nhwc.c: the same on channels-last tensors (g->nhwc); pool.c calls them */
void emi_cpu_pool_nhwc_max(em_state *S, const emi_pool_geom *g, em_tensor *y, em_tensor *ind,
                           const em_tensor *x, int index_base);
void emi_cpu_pool_nhwc_max_bwd(em_state *S, const emi_pool_geom *g, em_tensor *gx,
                               const em_tensor *gy, const int64_t *ind, int index_base);
void emi_cpu_pool_nhwc_avg(em_state *S, const emi_pool_geom *g, em_tensor *y,
                           const em_tensor *x, int include_pad);
void emi_cpu_pool_nhwc_avg_bwd(em_state *S, const emi_pool_geom *g, em_tensor *gx,
                               const em_tensor *gy, int include_pad);
void emi_cpu_pool_nhwc_adaptive(em_state *S, const emi_pool_geom *g, em_tensor *y,
                                const em_tensor *x);
void emi_cpu_pool_nhwc_adaptive_bwd(em_state *S, const emi_pool_geom *g, em_tensor *gx,
                                    const em_tensor *gy);
/* bn_nhwc.c: batch norm's loops on channels-last x ((M = N*H*W) rows of C), which
** normalize.c calls: per-channel mean and biased variance (double); y = x*sc + sh
** with sc, sh per channel (T), then ReLU where relu; the backward's per-channel sums
** and gx. */
em_status emi_cpu_bn_nhwc_stats(em_state *S, em_dtype dt, int64_t M, int64_t C, const void *x,
                                double *mean, double *var);
void emi_cpu_bn_nhwc_apply(em_state *S, em_dtype dt, int64_t M, int64_t C, const void *x,
                           const double *mean, const double *invstd, const void *w,
                           const void *b, void *y, int relu);
em_status emi_cpu_bn_nhwc_backward(em_state *S, em_dtype dt, int64_t M, int64_t C,
                                   const void *gy, const void *x, const void *mean,
                                   const void *invstd, const void *w, int training, void *gx,
                                   void *gw, void *gb);
/* bn_half.c: the same for a float16/bfloat16 x (NCHW or channels last) with float32
** weight, bias and saved statistics, computing in float32 a run at a time. */
em_status emi_cpu_bn_half_stats(em_state *S, em_dtype dt, int64_t N, int64_t C, int64_t L,
                                bool nhwc, const void *x, double *mean, double *var);
void emi_cpu_bn_half_apply(em_state *S, em_dtype dt, int64_t N, int64_t C, int64_t L,
                           bool nhwc, const void *x, const double *mean, const double *invstd,
                           const float *w, const float *b, void *y, int relu);
em_status emi_cpu_bn_half_backward(em_state *S, em_dtype dt, int64_t N, int64_t C, int64_t L,
                                   bool nhwc, const void *gy, const void *x, const float *mean,
                                   const float *invstd, const float *w, int training, void *gx,
                                   float *gw, float *gb);
/* normalize.c; ..._relu writes relu(batch_norm(x)) to y, as x < 0 ? 0 : x, in the
** same pass (em.compile's fusion) */
em_status emi_cpu_batch_norm(emi_device *dev, em_tensor *y, em_tensor *mean,
                             em_tensor *invstd, em_tensor *running_mean,
                             em_tensor *running_var, const em_tensor *x, const em_tensor *w,
                             const em_tensor *b, int training, double momentum, double eps);
em_status emi_cpu_batch_norm_relu(emi_device *dev, em_tensor *y, em_tensor *mean,
                                  em_tensor *invstd, em_tensor *running_mean,
                                  em_tensor *running_var, const em_tensor *x,
                                  const em_tensor *w, const em_tensor *b, int training,
                                  double momentum, double eps);
em_status emi_cpu_batch_norm_backward(emi_device *dev, em_tensor *gx, em_tensor *gw,
                                      em_tensor *gb, const em_tensor *gy, const em_tensor *x,
                                      const em_tensor *mean, const em_tensor *invstd,
                                      const em_tensor *w, int training);
em_status emi_cpu_layer_norm(emi_device *dev, em_tensor *y, em_tensor *mean, em_tensor *rstd,
                             const em_tensor *x, const em_tensor *w, const em_tensor *b,
                             double eps);
em_status emi_cpu_layer_norm_backward(emi_device *dev, em_tensor *gx, em_tensor *gw,
                                      em_tensor *gb, const em_tensor *gy, const em_tensor *x,
                                      const em_tensor *mean, const em_tensor *rstd,
                                      const em_tensor *w);
/* nn_loss.c */
em_status emi_cpu_cross_entropy(emi_device *dev, em_tensor *loss, em_tensor *lse,
                                const em_tensor *x, const em_tensor *target, int index_base,
                                int64_t ignore_index, double label_smoothing, int reduction);
em_status emi_cpu_cross_entropy_backward(emi_device *dev, em_tensor *gx,
                                         const em_tensor *grad_loss, const em_tensor *x,
                                         const em_tensor *target, const em_tensor *lse,
                                         int index_base, int64_t ignore_index,
                                         double label_smoothing, int reduction);
em_status emi_cpu_nll_loss(emi_device *dev, em_tensor *loss, const em_tensor *logp,
                           const em_tensor *target, int index_base, int64_t ignore_index,
                           int reduction);
em_status emi_cpu_nll_loss_backward(emi_device *dev, em_tensor *gx, const em_tensor *grad_loss,
                                    const em_tensor *target, int index_base,
                                    int64_t ignore_index, int reduction);
em_status emi_cpu_pointwise_loss(emi_device *dev, int kind, em_tensor *loss,
                                 const em_tensor *x, const em_tensor *y, int reduction);
em_status emi_cpu_pointwise_loss_backward(emi_device *dev, int kind, em_tensor *gx,
                                          const em_tensor *grad_loss, const em_tensor *x,
                                          const em_tensor *y, int reduction);
/* scatter.c */
em_status emi_cpu_index_add(emi_device *dev, em_tensor *out, int dim, const em_tensor *idx,
                            const em_tensor *src, int index_base);
em_status emi_cpu_scatter_add(emi_device *dev, em_tensor *out, int dim, const em_tensor *idx,
                              const em_tensor *src, int index_base);
/* optim.c: the optimizer entries (backend.h), one fused pass per parameter, and
** clip_grad_norm's norm and scaling. */
em_status emi_cpu_sgd_step_multi(emi_device *dev, int n, em_tensor *const *p,
                                 const em_tensor *const *g, em_tensor *const *buf,
                                 const int *first, double lr, double momentum,
                                 double dampening, double wd, int nesterov);
em_status emi_cpu_adam_step_multi(emi_device *dev, int n, em_tensor *const *p,
                                  const em_tensor *const *g, em_tensor *const *m,
                                  em_tensor *const *v, const double *step_size,
                                  const double *bc2_sqrt, double beta1, double beta2,
                                  double eps, double wd, double decay);
em_status emi_cpu_norm_multi(emi_device *dev, em_tensor *out, int n,
                             const em_tensor *const *t, double p);
em_status emi_cpu_scale_multi(emi_device *dev, int n, em_tensor *const *t, double scale);
/* sort_scan.c: stable sorts and inclusive scans along one dim. */
em_status emi_cpu_sort(emi_device *dev, em_tensor *indices, const em_tensor *a, int dim,
                       int descending, int index_base, int64_t k);
em_status emi_cpu_scan(emi_device *dev, int op, em_tensor *out, const em_tensor *a, int dim);

/* -- OpenBLAS's thread count (blas.c) ----------------------------------------------
** One setting for the whole process: OpenBLAS runs the largest count wanted by a
** live state (each state's workers register theirs), or the count a host pinned
** (em_blas_pin_threads). It is set when that changes, never per call. Between
** emi_blas_serial_begin and _end (conv2d's batch shares, each calling BLAS on its
** own thread) it runs 1 thread. */
typedef struct emi_blas_want {
  int n, live;
  struct emi_blas_want *next;
} emi_blas_want;
void emi_blas_register(emi_blas_want *w, int n);
void emi_blas_unregister(emi_blas_want *w);
void emi_blas_serial_begin(void);
void emi_blas_serial_end(void);

#endif

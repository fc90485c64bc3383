/*
** pool.c -- CPU 2-d pooling (max, average, adaptive average), forward and
** backward, over independent (H, W) planes in parallel. The loops are written
** once, in pool_impl.h, which this file includes for float and for double.
** Backward of max pool scatters into its own plane only, so planes never race.
** Channels-last geometries (g->nhwc) go to pool_nhwc.c.
*/
#include "lowp.h"
#include "nn.h"
#include <math.h>

typedef struct pool_job {
  const emi_pool_geom *g;
  const void *x, *gy;
  void *y, *gx;
  int64_t *ind;
  const int64_t *cind;
  const void *relu_mask;   /* max pool's backward: then ReLU's backward at mask */
  int base, include_pad;
} pool_job;

static int64_t pool_grain(const emi_pool_geom *g) {
  int64_t per = g->OH * g->OW * g->kH * g->kW + g->H * g->W;
  int64_t grain = 32768 / (per ? per : 1);
  return grain < 1 ? 1 : grain;
}
static int64_t ada_start(int64_t o, int64_t in, int64_t out) { return (o * in) / out; }
static int64_t ada_end(int64_t o, int64_t in, int64_t out) {
  return ((o + 1) * in + out - 1) / out;
}

/* The common 2x2 window with stride 2 and no padding or dilation (every CNN's
** MaxPool2d(2)), whose windows tile the plane without overlap. */
static bool is_2x2(const emi_pool_geom *g) {
  return g->kH == 2 && g->kW == 2 && g->sH == 2 && g->sW == 2 && g->pH == 0 && g->pW == 0 &&
         g->dH == 1 && g->dW == 1 && 2 * g->OH <= g->H && 2 * g->OW <= g->W;
}

/* The vector row of pool_avx2.c for float32 where the CPU has AVX2 (it says how
** many outputs it did, the rest run in pool_impl.h's scalar loop); float64 has
** none. */
static inline int64_t row2x2_f32(const float *r0, const float *r1, int64_t OW, int64_t W,
                                 int64_t i0, float *y, int64_t *ind) {
#if EMI_HAVE_AVX2_KERNELS
  if (emi_cpu_avx2()) return emi_maxpool2x2_row_avx2(r0, r1, OW, W, i0, y, ind);
#endif
  return 0;
}
static inline int64_t row2x2_f64(const double *r0, const double *r1, int64_t OW, int64_t W,
                                 int64_t i0, double *y, int64_t *ind) {
  return 0;
}
/* -- Per-dtype loops (pool_impl.h, T float then double) --------------------------------- */

#define T float
#define FN(name) name##_f32
#include "pool_impl.h"
#define T double
#define FN(name) name##_f64
#include "pool_impl.h"

/* -- Entries ---------------------------------------------------------------------------- */

#define POOL_RUN(fnbase, S, dt, g, job)                                                  \
  emi_parallel_for(S, (g)->planes, pool_grain(g),                                        \
                   (dt) == EM_FLOAT32 ? fnbase##_f32 : fnbase##_f64, job)

em_status emi_cpu_max_pool2d(emi_device *dev, const emi_pool_geom *g, em_tensor *y,
                             em_tensor *ind, const em_tensor *x, int index_base) {
  if (emi_lowp(x->dtype)) return emi_cpu_max_pool2d_lowp(dev, g, y, ind, x, index_base);
  if (g->nhwc) {
    emi_cpu_pool_nhwc_max(dev->S, g, y, ind, x, index_base);
    return EM_OK;
  }
  pool_job j = {.g = g, .x = em_tensor_data(x), .y = em_tensor_data(y),
                .ind = em_tensor_data(ind), .base = index_base};
  POOL_RUN(maxp_fwd, dev->S, x->dtype, g, &j);
  return EM_OK;
}

em_status emi_cpu_max_pool2d_backward(emi_device *dev, const emi_pool_geom *g, em_tensor *gx,
                                      const em_tensor *gy, const em_tensor *ind,
                                      int index_base) {
  return emi_cpu_max_pool2d_backward_relu(dev, g, gx, gy, ind, index_base, NULL);
}

em_status emi_cpu_max_pool2d_backward_relu(emi_device *dev, const emi_pool_geom *g,
                                           em_tensor *gx, const em_tensor *gy,
                                           const em_tensor *ind, int index_base,
                                           const em_tensor *relu_mask) {
  if (relu_mask && (g->nhwc || emi_lowp(gx->dtype)))
    return emi_error(dev->S, EM_ERR_INTERNAL, "max_pool2d_backward_relu: %s %s not served",
                     em_dtype_name(gx->dtype), g->nhwc ? "channels-last" : "NCHW");
  if (emi_lowp(gx->dtype)) return emi_cpu_max_pool2d_backward_lowp(dev, g, gx, gy, ind, index_base);
  const int64_t *pi = em_tensor_data(ind);
  int64_t HW = g->H * g->W;
  /* all checked before gx is written, unless they are max_pool2d's own (the
  ** autograd's), which are in range by construction: the check reads as many
  ** bytes as the pass itself */
  for (int64_t i = 0; !g->ind_trusted && i < ind->numel; i++)
    if (pi[i] - index_base < 0 || pi[i] - index_base >= HW)
      return emi_error(dev->S, EM_ERR_INDEX, "max_pool2d_backward: index %lld out of range "
                       "for a %lldx%lld plane (index_base %d)", (long long)pi[i],
                       (long long)g->H, (long long)g->W, index_base);
  if (g->nhwc) {
    emi_cpu_pool_nhwc_max_bwd(dev->S, g, gx, gy, pi, index_base);
    return EM_OK;
  }
  pool_job j = {.g = g, .gy = em_tensor_data(gy), .gx = em_tensor_data(gx), .cind = pi,
                .base = index_base, .relu_mask = relu_mask ? em_tensor_data(relu_mask) : NULL};
  POOL_RUN(maxp_bwd, dev->S, gx->dtype, g, &j);
  return EM_OK;
}

em_status emi_cpu_avg_pool2d(emi_device *dev, const emi_pool_geom *g, em_tensor *y,
                             const em_tensor *x, int count_include_pad) {
  if (emi_lowp(x->dtype)) return emi_cpu_avg_pool2d_lowp(dev, g, y, x, count_include_pad);
  if (g->nhwc) {
    emi_cpu_pool_nhwc_avg(dev->S, g, y, x, count_include_pad);
    return EM_OK;
  }
  pool_job j = {.g = g, .x = em_tensor_data(x), .y = em_tensor_data(y),
                .include_pad = count_include_pad};
  POOL_RUN(avgp_fwd, dev->S, x->dtype, g, &j);
  return EM_OK;
}

em_status emi_cpu_avg_pool2d_backward(emi_device *dev, const emi_pool_geom *g, em_tensor *gx,
                                      const em_tensor *gy, int count_include_pad) {
  if (emi_lowp(gx->dtype))
    return emi_cpu_avg_pool2d_backward_lowp(dev, g, gx, gy, count_include_pad);
  if (g->nhwc) {
    emi_cpu_pool_nhwc_avg_bwd(dev->S, g, gx, gy, count_include_pad);
    return EM_OK;
  }
  pool_job j = {.g = g, .gy = em_tensor_data(gy), .gx = em_tensor_data(gx),
                .include_pad = count_include_pad};
  POOL_RUN(avgp_bwd, dev->S, gx->dtype, g, &j);
  return EM_OK;
}

em_status emi_cpu_adaptive_avg_pool2d(emi_device *dev, const emi_pool_geom *g, em_tensor *y,
                                      const em_tensor *x) {
  if (emi_lowp(x->dtype)) return emi_cpu_adaptive_avg_pool2d_lowp(dev, g, y, x);
  if (g->nhwc) {
    emi_cpu_pool_nhwc_adaptive(dev->S, g, y, x);
    return EM_OK;
  }
  pool_job j = {.g = g, .x = em_tensor_data(x), .y = em_tensor_data(y)};
  POOL_RUN(adap_fwd, dev->S, x->dtype, g, &j);
  return EM_OK;
}

em_status emi_cpu_adaptive_avg_pool2d_backward(emi_device *dev, const emi_pool_geom *g,
                                               em_tensor *gx, const em_tensor *gy) {
  if (emi_lowp(gx->dtype)) return emi_cpu_adaptive_avg_pool2d_backward_lowp(dev, g, gx, gy);
  if (g->nhwc) {
    emi_cpu_pool_nhwc_adaptive_bwd(dev->S, g, gx, gy);
    return EM_OK;
  }
  pool_job j = {.g = g, .gy = em_tensor_data(gy), .gx = em_tensor_data(gx)};
  POOL_RUN(adap_bwd, dev->S, gx->dtype, g, &j);
  return EM_OK;
}

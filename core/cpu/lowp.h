/*
** lowp.h -- widening helpers for the CPU's float16/bfloat16 fallbacks
** (conv_lowp.c, pool_lowp.c): a float32 copy of an operand, a float32 buffer
** for a result, and rounding that result back into the caller's tensor. The
** fallbacks run the float32 kernel in between, so low-precision conv and pooling
** compute with float32 accumulation and round once, at the end.
*/
#ifndef EMBER_CPU_LOWP_H
#define EMBER_CPU_LOWP_H
#include "cpu.h"

static inline bool emi_lowp(em_dtype dt) { return dt == EM_FLOAT16 || dt == EM_BFLOAT16; }

/* *out = t widened to float32, in t's memory order (NCHW or NHWC: the geometry's
** nhwc flag holds for the widened operands too) (NULL for NULL). */
static inline em_status emi_lowp_widen(emi_device *dev, const char *op, const em_tensor *t,
                                       em_tensor **out) {
  *out = NULL;
  if (!t) return EM_OK;
  em_status st = emi_tensor_new_fmt(dev->S, op, t->sizes, t->ndim, EM_FLOAT32, EM_CPU,
                                    emi_nhwc(t), out);
  if (st) return st;
  if ((st = emi_cpu_copy(dev, *out, t))) { em_tensor_release(*out); *out = NULL; }
  return st;
}

/* *out = an uninitialised float32 tensor shaped and ordered as t (NULL for NULL). */
static inline em_status emi_lowp_buffer(emi_device *dev, const char *op, const em_tensor *t,
                                        em_tensor **out) {
  *out = NULL;
  if (!t) return EM_OK;
  return emi_tensor_new_fmt(dev->S, op, t->sizes, t->ndim, EM_FLOAT32, EM_CPU, emi_nhwc(t),
                            out);
}

/* Rounds the float32 result r into dst (nothing for NULL). */
static inline em_status emi_lowp_round(emi_device *dev, em_tensor *dst, const em_tensor *r) {
  return dst ? emi_cpu_copy(dev, dst, r) : EM_OK;
}

static inline void emi_lowp_release(em_tensor **ts, int n) {
  for (int i = 0; i < n; i++) em_tensor_release(ts[i]);
}

/* conv_lowp.c and pool_lowp.c: the entries of cpu.h for float16/bfloat16. */
em_status emi_cpu_conv2d_lowp(emi_device *dev, const emi_conv_geom *g, em_tensor *y,
                              const em_tensor *x, const em_tensor *w, const em_tensor *b);
em_status emi_cpu_conv2d_backward_lowp(emi_device *dev, const emi_conv_geom *g,
                                       em_tensor *gx, em_tensor *gw, em_tensor *gb,
                                       const em_tensor *gy, const em_tensor *x,
                                       const em_tensor *w);
em_status emi_cpu_max_pool2d_lowp(emi_device *dev, const emi_pool_geom *g, em_tensor *y,
                                  em_tensor *ind, const em_tensor *x, int index_base);
em_status emi_cpu_max_pool2d_backward_lowp(emi_device *dev, const emi_pool_geom *g,
                                           em_tensor *gx, const em_tensor *gy,
                                           const em_tensor *ind, int index_base);
em_status emi_cpu_avg_pool2d_lowp(emi_device *dev, const emi_pool_geom *g, em_tensor *y,
                                  const em_tensor *x, int count_include_pad);
em_status emi_cpu_avg_pool2d_backward_lowp(emi_device *dev, const emi_pool_geom *g,
                                           em_tensor *gx, const em_tensor *gy,
                                           int count_include_pad);
em_status emi_cpu_adaptive_avg_pool2d_lowp(emi_device *dev, const emi_pool_geom *g,
                                           em_tensor *y, const em_tensor *x);
em_status emi_cpu_adaptive_avg_pool2d_backward_lowp(emi_device *dev, const emi_pool_geom *g,
                                                    em_tensor *gx, const em_tensor *gy);
#endif

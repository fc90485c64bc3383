/*
** k_dnn_lowp.c -- the CUDA backend's pooling entries for every floating dtype.
** The pooling kernels of k_dnn.cu exist for float32 and float64; a float16 or
** bfloat16 operand (autocast's conv output, for one) is widened to float32 on the
** device, pooled there and rounded back once, as the CPU's pool_lowp.c does. Max
** pooling picks the same element either way (widening is exact) and average
** pooling sums in float32, so the results are the CPU's. The backend table
** (backend.c) points at these; float32 and float64 pass straight through.
*/
#include "cuda.h"
#include "dnn.h"
#include "k_elementwise.h"

static int lowp(em_dtype dt) { return dt == EM_FLOAT16 || dt == EM_BFLOAT16; }

/* *out = a float32 tensor on d shaped as t, holding t's values when copy is set. */
static em_status widened(emi_device *d, const char *op, const em_tensor *t, int copy,
                         em_tensor **out) {
  em_status st = emi_tensor_new(d->S, op, t->sizes, t->ndim, EM_FLOAT32, d->index, out);
  if (st) return st;
  if ((st = copy ? emk_cast(d, *out, t) : emk_fill(d, *out, 0.0))) {
    em_tensor_release(*out);
    *out = NULL;
  }
  return st;
}

/* The pooled float32 result r rounded into dst, and both temporaries released. */
static em_status rounded(emi_device *d, em_status st, em_tensor *dst, em_tensor *in,
                         em_tensor *r) {
  if (!st) st = emk_cast(d, dst, r);
  em_tensor_release(in);
  em_tensor_release(r);
  return st;
}

em_status emk_max_pool2d_any(emi_device *d, const emi_pool_geom *g, em_tensor *y,
                             em_tensor *ind, const em_tensor *x, int index_base) {
  if (!lowp(x->dtype)) return emk_max_pool2d(d, g, y, ind, x, index_base);
  em_tensor *wx = NULL, *wy = NULL;
  em_status st = widened(d, "max_pool2d", x, 1, &wx);
  if (!st) st = widened(d, "max_pool2d", y, 0, &wy);
  if (!st) st = emk_max_pool2d(d, g, wy, ind, wx, index_base);
  return rounded(d, st, y, wx, wy);
}

em_status emk_max_pool2d_backward_any(emi_device *d, const emi_pool_geom *g, em_tensor *gx,
                                      const em_tensor *gy, const em_tensor *ind,
                                      int index_base) {
  if (!lowp(gx->dtype)) return emk_max_pool2d_backward(d, g, gx, gy, ind, index_base);
  em_tensor *wgy = NULL, *wgx = NULL;
  em_status st = widened(d, "max_pool2d_backward", gy, 1, &wgy);
  if (!st) st = widened(d, "max_pool2d_backward", gx, 0, &wgx);
  if (!st) st = emk_max_pool2d_backward(d, g, wgx, wgy, ind, index_base);
  return rounded(d, st, gx, wgy, wgx);
}

em_status emk_avg_pool2d_any(emi_device *d, const emi_pool_geom *g, em_tensor *y,
                             const em_tensor *x, int count_include_pad) {
  if (!lowp(x->dtype)) return emk_avg_pool2d(d, g, y, x, count_include_pad);
  em_tensor *wx = NULL, *wy = NULL;
  em_status st = widened(d, "avg_pool2d", x, 1, &wx);
  if (!st) st = widened(d, "avg_pool2d", y, 0, &wy);
  if (!st) st = emk_avg_pool2d(d, g, wy, wx, count_include_pad);
  return rounded(d, st, y, wx, wy);
}

em_status emk_avg_pool2d_backward_any(emi_device *d, const emi_pool_geom *g, em_tensor *gx,
                                      const em_tensor *gy, int count_include_pad) {
  if (!lowp(gx->dtype)) return emk_avg_pool2d_backward(d, g, gx, gy, count_include_pad);
  em_tensor *wgy = NULL, *wgx = NULL;
  em_status st = widened(d, "avg_pool2d_backward", gy, 1, &wgy);
  if (!st) st = widened(d, "avg_pool2d_backward", gx, 0, &wgx);
  if (!st) st = emk_avg_pool2d_backward(d, g, wgx, wgy, count_include_pad);
  return rounded(d, st, gx, wgy, wgx);
}

em_status emk_adaptive_avg_pool2d_any(emi_device *d, const emi_pool_geom *g, em_tensor *y,
                                      const em_tensor *x) {
  if (!lowp(x->dtype)) return emk_adaptive_avg_pool2d(d, g, y, x);
  em_tensor *wx = NULL, *wy = NULL;
  em_status st = widened(d, "adaptive_avg_pool2d", x, 1, &wx);
  if (!st) st = widened(d, "adaptive_avg_pool2d", y, 0, &wy);
  if (!st) st = emk_adaptive_avg_pool2d(d, g, wy, wx);
  return rounded(d, st, y, wx, wy);
}

em_status emk_adaptive_avg_pool2d_backward_any(emi_device *d, const emi_pool_geom *g,
                                               em_tensor *gx, const em_tensor *gy) {
  if (!lowp(gx->dtype)) return emk_adaptive_avg_pool2d_backward(d, g, gx, gy);
  em_tensor *wgy = NULL, *wgx = NULL;
  em_status st = widened(d, "adaptive_avg_pool2d_backward", gy, 1, &wgy);
  if (!st) st = widened(d, "adaptive_avg_pool2d_backward", gx, 0, &wgx);
  if (!st) st = emk_adaptive_avg_pool2d_backward(d, g, wgx, wgy);
  return rounded(d, st, gx, wgy, wgx);
}

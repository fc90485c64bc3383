/*
** pool_lowp.c -- CPU 2-d pooling in float16/bfloat16: widen to float32, run
** pool.c's float32 loops, round the result. Max pooling picks the same element
** either way (widening is exact), and average pooling sums in float32.
*/
#include "lowp.h"

em_status emi_cpu_max_pool2d_lowp(emi_device *dev, const emi_pool_geom *g, em_tensor *y,
                                  em_tensor *ind, const em_tensor *x, int index_base) {
  em_tensor *t[2] = {NULL, NULL};
  em_status st;
  if (!(st = emi_lowp_widen(dev, "max_pool2d", x, &t[0])) &&
      !(st = emi_lowp_buffer(dev, "max_pool2d", y, &t[1])) &&
      !(st = emi_cpu_max_pool2d(dev, g, t[1], ind, t[0], index_base)))
    st = emi_lowp_round(dev, y, t[1]);
  emi_lowp_release(t, 2);
  return st;
}

em_status emi_cpu_max_pool2d_backward_lowp(emi_device *dev, const emi_pool_geom *g,
                                           em_tensor *gx, const em_tensor *gy,
                                           const em_tensor *ind, int index_base) {
  em_tensor *t[2] = {NULL, NULL};
  em_status st;
  if (!(st = emi_lowp_widen(dev, "max_pool2d_backward", gy, &t[0])) &&
      !(st = emi_lowp_buffer(dev, "max_pool2d_backward", gx, &t[1])) &&
      !(st = emi_cpu_fill(dev, t[1], 0.0)) &&
      !(st = emi_cpu_max_pool2d_backward(dev, g, t[1], t[0], ind, index_base)))
    st = emi_lowp_round(dev, gx, t[1]);
  emi_lowp_release(t, 2);
  return st;
}

em_status emi_cpu_avg_pool2d_lowp(emi_device *dev, const emi_pool_geom *g, em_tensor *y,
                                  const em_tensor *x, int count_include_pad) {
  em_tensor *t[2] = {NULL, NULL};
  em_status st;
  if (!(st = emi_lowp_widen(dev, "avg_pool2d", x, &t[0])) &&
      !(st = emi_lowp_buffer(dev, "avg_pool2d", y, &t[1])) &&
      !(st = emi_cpu_avg_pool2d(dev, g, t[1], t[0], count_include_pad)))
    st = emi_lowp_round(dev, y, t[1]);
  emi_lowp_release(t, 2);
  return st;
}

em_status emi_cpu_avg_pool2d_backward_lowp(emi_device *dev, const emi_pool_geom *g,
                                           em_tensor *gx, const em_tensor *gy,
                                           int count_include_pad) {
  em_tensor *t[2] = {NULL, NULL};
  em_status st;
  if (!(st = emi_lowp_widen(dev, "avg_pool2d_backward", gy, &t[0])) &&
      !(st = emi_lowp_buffer(dev, "avg_pool2d_backward", gx, &t[1])) &&
      !(st = emi_cpu_fill(dev, t[1], 0.0)) &&
      !(st = emi_cpu_avg_pool2d_backward(dev, g, t[1], t[0], count_include_pad)))
    st = emi_lowp_round(dev, gx, t[1]);
  emi_lowp_release(t, 2);
  return st;
}

em_status emi_cpu_adaptive_avg_pool2d_lowp(emi_device *dev, const emi_pool_geom *g,
                                           em_tensor *y, const em_tensor *x) {
  em_tensor *t[2] = {NULL, NULL};
  em_status st;
  if (!(st = emi_lowp_widen(dev, "adaptive_avg_pool2d", x, &t[0])) &&
      !(st = emi_lowp_buffer(dev, "adaptive_avg_pool2d", y, &t[1])) &&
      !(st = emi_cpu_adaptive_avg_pool2d(dev, g, t[1], t[0])))
    st = emi_lowp_round(dev, y, t[1]);
  emi_lowp_release(t, 2);
  return st;
}

em_status emi_cpu_adaptive_avg_pool2d_backward_lowp(emi_device *dev, const emi_pool_geom *g,
                                                    em_tensor *gx, const em_tensor *gy) {
  em_tensor *t[2] = {NULL, NULL};
  em_status st;
  if (!(st = emi_lowp_widen(dev, "adaptive_avg_pool2d_backward", gy, &t[0])) &&
      !(st = emi_lowp_buffer(dev, "adaptive_avg_pool2d_backward", gx, &t[1])) &&
      !(st = emi_cpu_fill(dev, t[1], 0.0)) &&
      !(st = emi_cpu_adaptive_avg_pool2d_backward(dev, g, t[1], t[0])))
    st = emi_lowp_round(dev, gx, t[1]);
  emi_lowp_release(t, 2);
  return st;
}

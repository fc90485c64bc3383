/*
** conv_lowp.c -- CPU conv2d forward and backward in float16/bfloat16: the
** operands are widened to float32, the float32 kernel of conv.c runs (float32
** accumulation, as cuDNN does for half types), and the results are rounded once.
** This is the fallback for CPUs and builds without a native low-precision
** kernel; it costs one conversion per operand and buys correctness everywhere.
*/
#include "lowp.h"

em_status emi_cpu_conv2d_lowp(emi_device *dev, const emi_conv_geom *g, em_tensor *y,
                              const em_tensor *x, const em_tensor *w, const em_tensor *b) {
  em_tensor *t[4] = {NULL, NULL, NULL, NULL};   /* x, w, b, y in float32 */
  em_status st;
  if (!(st = emi_lowp_widen(dev, "conv2d", x, &t[0])) &&
      !(st = emi_lowp_widen(dev, "conv2d", w, &t[1])) &&
      !(st = emi_lowp_widen(dev, "conv2d", b, &t[2])) &&
      !(st = emi_lowp_buffer(dev, "conv2d", y, &t[3])) &&
      !(st = emi_cpu_conv2d(dev, g, t[3], t[0], t[1], t[2])))
    st = emi_lowp_round(dev, y, t[3]);
  emi_lowp_release(t, 4);
  return st;
}

em_status emi_cpu_conv2d_backward_lowp(emi_device *dev, const emi_conv_geom *g,
                                       em_tensor *gx, em_tensor *gw, em_tensor *gb,
                                       const em_tensor *gy, const em_tensor *x,
                                       const em_tensor *w) {
  const char *op = "conv2d_backward";
  em_tensor *t[6] = {NULL, NULL, NULL, NULL, NULL, NULL};   /* gy x w gx gw gb */
  em_status st;
  if (!(st = emi_lowp_widen(dev, op, gy, &t[0])) &&
      !(st = emi_lowp_widen(dev, op, x, &t[1])) &&
      !(st = emi_lowp_widen(dev, op, w, &t[2])) &&
      !(st = emi_lowp_buffer(dev, op, gx, &t[3])) &&
      !(st = emi_lowp_buffer(dev, op, gw, &t[4])) &&
      !(st = emi_lowp_buffer(dev, op, gb, &t[5])) &&
      !(st = emi_cpu_conv2d_backward(dev, g, t[3], t[4], t[5], t[0], t[1], t[2])) &&
      !(st = emi_lowp_round(dev, gx, t[3])) && !(st = emi_lowp_round(dev, gw, t[4])))
    st = emi_lowp_round(dev, gb, t[5]);
  emi_lowp_release(t, 6);
  return st;
}

/*
** math_dev.h -- the C math library as float / double overloads, for device code
** templated on its floating type (nvcc and the grid emulator alike): emk_exp(x)
** calls expf for a float and exp for a double, so a template<typename T> computes
** in its own type with exactly the calls a float and a double copy would make.
*/
#ifndef EMBER_KERNELS_MATH_DEV_H
#define EMBER_KERNELS_MATH_DEV_H
#include "device.h"
#include <math.h>

#define EMK__MATH1(fn)                                                             \
  EMK_DEVICE float emk_##fn(float x) { return fn##f(x); }                          \
  EMK_DEVICE double emk_##fn(double x) { return fn(x); }
#define EMK__MATH2(fn)                                                             \
  EMK_DEVICE float emk_##fn(float x, float y) { return fn##f(x, y); }              \
  EMK_DEVICE double emk_##fn(double x, double y) { return fn(x, y); }

EMK__MATH1(fabs)
EMK__MATH1(exp)
EMK__MATH1(expm1)
EMK__MATH1(log)
EMK__MATH1(log1p)
EMK__MATH1(log2)
EMK__MATH1(log10)
EMK__MATH1(sqrt)
EMK__MATH1(sin)
EMK__MATH1(cos)
EMK__MATH1(tan)
EMK__MATH1(asin)
EMK__MATH1(acos)
EMK__MATH1(atan)
EMK__MATH1(sinh)
EMK__MATH1(cosh)
EMK__MATH1(tanh)
EMK__MATH1(erf)
EMK__MATH1(floor)
EMK__MATH1(ceil)
EMK__MATH1(nearbyint)
EMK__MATH1(trunc)
EMK__MATH2(pow)
EMK__MATH2(fmod)
EMK__MATH2(atan2)

#undef EMK__MATH1
#undef EMK__MATH2
#endif

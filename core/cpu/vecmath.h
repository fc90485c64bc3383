/*
** vecmath.h -- float32 helpers written so that GCC vectorises them, shared by
** the CPU reduction and softmax kernels: a NaN-propagating max/min. (Their exp
** is emi_vexpf from vmath.h.)
*/
#ifndef EMBER_CPU_VECMATH_H
#define EMBER_CPU_VECMATH_H
#include <math.h>
#include <stdint.h>

/* max (want_max) or min of n floats; NaN if any is NaN. 64 float lanes with a
** NaN flag per lane keep the main loop a plain vmaxps/vminps; rows of up to 16
** take a scalar loop (no set-up or fold to pay). */
static inline float emi_extreme_f32(const float *restrict a, int64_t n, int want_max) {
  if (n <= 16) {
    float r = want_max ? -INFINITY : INFINITY;
    int rn = 0;
    for (int64_t i = 0; i < n; i++) {
      float x = a[i];
      r = (want_max ? x > r : x < r) ? x : r;
      rn |= x != x;
    }
    return rn ? NAN : r;
  }
  float acc[64];
  int nan[64];
  int64_t i = 0;
  for (int j = 0; j < 64; j++) { acc[j] = want_max ? -INFINITY : INFINITY; nan[j] = 0; }
  if (want_max) {
    for (; i + 64 <= n; i += 64)
      for (int j = 0; j < 64; j++) {
        float x = a[i + j];
        acc[j] = x > acc[j] ? x : acc[j];
        nan[j] |= x != x;
      }
  } else {
    for (; i + 64 <= n; i += 64)
      for (int j = 0; j < 64; j++) {
        float x = a[i + j];
        acc[j] = x < acc[j] ? x : acc[j];
        nan[j] |= x != x;
      }
  }
  for (int j = 0; i < n; i++, j++) {
    float x = a[i];
    acc[j] = (want_max ? x > acc[j] : x < acc[j]) ? x : acc[j];
    nan[j] |= x != x;
  }
  for (int w = 32; w > 0; w /= 2)          /* tree fold: vector ops, no long chain */
    for (int j = 0; j < w; j++) {
      acc[j] = (want_max ? acc[j + w] > acc[j] : acc[j + w] < acc[j]) ? acc[j + w] : acc[j];
      nan[j] |= nan[j + w];
    }
  return nan[0] ? NAN : acc[0];
}

#endif

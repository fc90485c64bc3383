/*
** vecmath.h -- float32 helpers written so that GCC vectorises them, shared by
** the CPU reduction and softmax kernels: an exp (libm's is a call per element
** and never vectorises without -ffast-math) and a NaN-propagating max/min.
*/
#ifndef EMBER_CPU_VECMATH_H
#define EMBER_CPU_VECMATH_H
#include <math.h>
#include <stdint.h>

/* exp(x) in float32 to about 1 ulp, written so that GCC vectorises loops that
** call it: Cody-Waite reduction x = n*ln2 + r, a degree-7 polynomial for e^r,
** and 2^n built from bits in two halves so that results down to the subnormal
** range stay right. exp(-inf) = 0, exp(+inf) = inf, NaN stays NaN. */
static inline float emi_expf(float x) {
  x = x > 100.0f ? 100.0f : x;
  x = x < -110.0f ? -110.0f : x;
  const float magic = 12582912.0f;       /* 1.5 * 2^23: adding it rounds to int */
  float t = x * 1.44269504088896341f + magic;
  float n = t - magic;
  float r = x - n * 0.693359375f;
  r = r - n * -2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  union { float f; uint32_t u; } ti = {t}, s1, s2;
  int32_t ni = (int32_t)(ti.u - 0x4b400000u);   /* n as an integer, from t's bits */
  int32_t n1 = ni / 2, n2 = ni - n1;
  s1.u = ((uint32_t)n1 + 127u) << 23;       /* unsigned: a NaN's garbage n is */
  s2.u = ((uint32_t)n2 + 127u) << 23;       /* harmless, p is NaN anyway */
  return p * s1.f * s2.f;
}

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

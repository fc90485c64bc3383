/*
** fastexp.h -- a float32 exp that GCC vectorises, shared by the CPU softmax
** and reduction kernels (libm's exp is a call per element and never
** vectorises without -ffast-math).
*/
#ifndef EMBER_CPU_FASTEXP_H
#define EMBER_CPU_FASTEXP_H
#include <stdint.h>

/* exp(x) in float32 to about 1 ulp, written so that GCC vectorises loops that
** call it: Cody-Waite reduction x = n*ln2 + r, a degree-7 polynomial for e^r,
** and 2^n built from bits in two halves so that results down to the subnormal
** range stay right. exp(-inf) = 0, exp(+inf) = inf, NaN stays NaN. */
static inline float emx_expf(float x) {
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

#endif

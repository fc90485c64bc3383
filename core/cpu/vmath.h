/*
** vmath.h -- float32 exp, log, tanh and erf written so that a loop calling them
** auto-vectorizes: no branches (both sides of a choice are computed and one is
** selected), no calls, no errno. libm's expf/logf/tanhf/erff are scalar calls
** that cost 5-50x more per element than a vector loop; PyTorch vectorizes these
** (Sleef), so the float32 kernels of unary.c use the functions below. float64
** stays on libm.
**
** Accuracy (measured against double-precision libm on every 97th float):
** exp 0.99 ulp, log 0.83 ulp, tanh 1.33 ulp, erf 2.6 ulp. Specials follow C: exp(-inf) = 0, exp(+inf) = inf,
** log(0) = -inf, log(x<0) = NaN, NaN in -> NaN out; subnormal results of exp and
** subnormal inputs of log are handled.
**
** exp: x = n ln2 + r with |r| <= ln2/2 (ln2 split in a short high part and a
** low part so that n ln2 is exact), exp(r) = 1 + r + r^2 P(r), 2^n applied as
** two exact power-of-two factors so that results down to the subnormals round
** once. log: x = m 2^e with m in [sqrt(1/2), sqrt(2)), log(m) = f - f^2/2 +
** f^3 P(f) with f = m - 1. tanh: x + x^3 P(x^2) below |x| = 0.625, 1 - 2/(exp(2|x|)
** + 1) above. erf: x P(x^2) below 0.921875, 1 - exp(Q(x)) above (Q approximates
** log erfc), 1 beyond 4. All polynomials were fitted for ember by least squares
** on Chebyshev nodes against 40-digit references (mpmath).
*/
#ifndef EMBER_CPU_VMATH_H
#define EMBER_CPU_VMATH_H
#include <stdint.h>

static inline uint32_t emi_fbits(float f) {
  union { float f; uint32_t u; } v;
  v.f = f;
  return v.u;
}

static inline float emi_bitsf(uint32_t u) {
  union { float f; uint32_t u; } v;
  v.u = u;
  return v.f;
}

/* Round to nearest (even) for |v| < 2^22: adding 1.5*2^23 pushes the fraction
** out of the mantissa. Exact without -ffast-math (which ember never uses). */
static inline float emi_roundf_small(float v) {
  return (v + 12582912.0f) - 12582912.0f;
}

/* exp(r) for |r| <= ln2/2, and n = round(x/ln2) with r = x - n ln2. */
static inline float emi_exp_reduce(float x, float *n) {
  *n = emi_roundf_small(x * 1.44269504088896341f);
  float r = x - *n * 0.693359375f;
  return r - *n * -2.121944400547e-4f;
}

static inline float emi_exp_poly(float r) {
  float p = 1.989928508e-04f;
  p = p * r + 1.393365035e-03f;
  p = p * r + 8.333298470e-03f;
  p = p * r + 4.166646491e-02f;
  p = p * r + 1.666666672e-01f;
  p = p * r + 5.000000013e-01f;
  return p * r * r + r + 1.0f;
}

static inline float emi_vexpf(float x) {
  const float hi = 88.72283935546875f, lo = -104.0f;
  float xc = x > lo ? x : lo;            /* NaN -> lo: n stays a valid integer */
  xc = xc < hi ? xc : hi;
  float n, r = emi_exp_reduce(xc, &n), e = emi_exp_poly(r);
  int32_t ni = (int32_t)n, n1 = ni / 2, n2 = ni - n1;   /* each in [-75, 64] */
  float res = e * emi_bitsf((uint32_t)(n1 + 127) << 23) * emi_bitsf((uint32_t)(n2 + 127) << 23);
  res = x > hi ? emi_bitsf(0x7f800000u) : res;
  return x != x ? x : res;
}

/* exp for arguments known to lie in [-87, 88] (normal results, no NaN): one
** scaling, no special cases. */
static inline float emi_vexpf_mid(float x) {
  float n, r = emi_exp_reduce(x, &n), e = emi_exp_poly(r);
  return e * emi_bitsf((uint32_t)((int32_t)n + 127) << 23);
}

static inline float emi_vlogf(float x) {
  /* Subnormal inputs are scaled into the normal range first. Choices select
  ** constants and then compute unconditionally: GCC (trapping math) will not
  ** if-convert an operation that only one side of a choice performs. */
  int sub = x < 1.17549435e-38f;
  float xs = x * (sub ? 8388608.0f : 1.0f);
  uint32_t u = emi_fbits(xs);
  int32_t e = (int32_t)((u >> 23) & 0xff) - (sub ? 149 : 126);
  float m = emi_bitsf((u & 0x007fffffu) | 0x3f000000u);        /* [0.5, 1) */
  int lowm = m < 0.707106781186547524f;
  float ef = (float)e - (lowm ? 1.0f : 0.0f);
  float f = m * (lowm ? 2.0f : 1.0f) - 1.0f;
  float z = f * f;
  float y = 7.149753843e-02f;
  y = y * f - 1.157120071e-01f;
  y = y * f + 1.166151107e-01f;
  y = y * f - 1.241105069e-01f;
  y = y * f + 1.424993653e-01f;
  y = y * f - 1.666848024e-01f;
  y = y * f + 2.000070748e-01f;
  y = y * f - 2.499998905e-01f;
  y = y * f + 3.333333119e-01f;
  y = y * f * z;
  y = y + ef * -2.121944400547e-4f;
  y = y - 0.5f * z;
  float res = f + y + ef * 0.693359375f;
  res = x == 0 ? emi_bitsf(0xff800000u) : res;                  /* -inf */
  res = x < 0 ? emi_bitsf(0x7fc00000u) : res;                   /* NaN */
  res = x == emi_bitsf(0x7f800000u) ? x : res;                  /* +inf */
  return x != x ? x : res;
}

static inline float emi_vtanhf(float x) {
  float ax = x < 0 ? -x : x;
  float z = x * x;
  float p = -6.155231737e-03f;
  p = p * z + 2.104571709e-02f;
  p = p * z - 5.386392630e-02f;
  p = p * z + 1.333289075e-01f;
  p = p * z - 3.333333141e-01f;
  float small = x + x * z * p;
  small = x == 0 ? x : small;                                   /* keep -0 */
  float big = 1.0f - 2.0f / (emi_vexpf(ax + ax) + 1.0f);
  big = x < 0 ? -big : big;
  return ax < 0.625f ? small : big;
}

static inline float emi_verff(float x) {
  float ax = x < 0 ? -x : x;
  float z = x * x;
  float p = -6.047158648e-04f;
  p = p * z + 5.005626197e-03f;
  p = p * z - 2.677640247e-02f;
  p = p * z + 1.128213981e-01f;
  p = p * z - 3.761253384e-01f;
  p = p * z + 1.128379160e+00f;
  float small = x * p;
  float q = 1.613101898e-06f;
  q = q * ax - 4.557118468e-05f;
  q = q * ax + 5.926017195e-04f;
  q = q * ax - 4.739417687e-03f;
  q = q * ax + 2.636238020e-02f;
  q = q * ax - 1.099740465e-01f;
  q = q * ax - 6.319416358e-01f;
  q = q * ax - 1.130163978e+00f;
  q = q * ax + 3.025418153e-04f;
  q = q > -80.0f ? q : -80.0f;          /* NaN and |x| > 4 are replaced below */
  q = q < 0.0f ? q : 0.0f;
  float big = 1.0f - emi_vexpf_mid(q);
  big = ax > 4.0f ? 1.0f : big;
  big = x < 0 ? -big : big;
  float res = ax < 0.921875f ? small : big;
  return x != x ? x : res;
}

#endif

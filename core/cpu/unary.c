/*
** unary.c -- CPU kernels of the unary element-wise ops and clamp.
**
** One loop per (op, dtype) in the table UN[op][dtype]. The ops layer has already
** chosen the dtype: float ops on integer inputs arrive converted to float32,
** logical_not arrives as bool, so integer loops exist only for the ops that keep
** an integer dtype (neg abs relu sign floor ceil round trunc square). float16 and
** bfloat16 go through the float32 loops (elementwise.c adapters).
**
** A loop is written once per type, in loop_impl.h; an op is an element function
** (an expression of x) that the short UN_FN macro wraps in it, one line per op
** and dtype family below. The sqrt loops add a hand-vectorized prefix.
*/
#include "loops.h"
#include "inline.h"
#include "vmath.h"
#include <tgmath.h>

/* -- Loops ---------------------------------------------------------------------------
** The loops themselves are loop_impl.h's, one copy per type; an op's kernel is
** its element function around them (loop_impl.h says why). */
#include "loop_types.h"
#define loop1_b loop1_u8                    /* bool is stored as uint8 */

/* NAME_SFX, the kernel of one op and dtype: the element function NAME_SFX_x
** computes EXPR of x (of type T; U is T's unsigned twin, for wrapping integer
** arithmetic; p_ the parameters), VEC is loop1's vector prefix or NULL. */
#define UN_FN(NAME, SFX, T_, U_, EXPR, VEC)                                            \
  EMI_INLINE T_ NAME##_##SFX##_x(T_ x, emi_kparams *p_) {                              \
    typedef T_ T; typedef U_ U; (void)sizeof(U); (void)p_; return (T)(EXPR); }         \
  static void NAME##_##SFX(char *o, const char *a, int64_t n, int64_t so, int64_t sa,  \
                           emi_kparams *p) {                                           \
    loop1_##SFX(o, a, n, so, sa, p, NAME##_##SFX##_x, VEC); }

/* The float16 and bfloat16 loops of NAME: its float32 loop through an adapter. */
#define HALF1_FN(NAME, SFX, DT)                                                        \
  static void NAME##_##SFX(char *o, const char *a, int64_t n, int64_t so, int64_t sa,  \
                           emi_kparams *p) {                                           \
    emi_half_loop1(NAME##_f32, DT, 0, o, a, n, so, sa, p); }
#define HALF1(NAME) HALF1_FN(NAME, f16, EM_FLOAT16) HALF1_FN(NAME, bf16, EM_BFLOAT16)
/* EXPR sees x of type T; constants are written (T)c to stay in T's precision. */
#define FLOAT_UN(NAME, EXPR)                                                           \
  UN_FN(NAME, f32, float, float, EXPR, NULL)                                           \
  UN_FN(NAME, f64, double, double, EXPR, NULL)                                         \
  HALF1(NAME)
/* float32 with its own (vectorizable, vmath.h) expression, float64 on libm. */
#define FLOAT_UN2(NAME, EXPR32, EXPR64)                                                \
  UN_FN(NAME, f32, float, float, EXPR32, NULL)                                         \
  UN_FN(NAME, f64, double, double, EXPR64, NULL)                                       \
  HALF1(NAME)
#define SIGNED_UN(NAME, EXPR)                                                          \
  UN_FN(NAME, i32, int32_t, uint32_t, EXPR, NULL)                                      \
  UN_FN(NAME, i64, int64_t, uint64_t, EXPR, NULL)
#define INT_UN(NAME, EXPR)                                                             \
  SIGNED_UN(NAME, EXPR) UN_FN(NAME, u8, uint8_t, uint32_t, EXPR, NULL)

/* -- Float loops ---------------------------------------------------------------------- */
#define SQRT_2_OVER_PI 0.7978845608028654
FLOAT_UN(neg, -x)
FLOAT_UN(abs, fabs(x))
FLOAT_UN2(exp, emi_vexpf(x), exp(x))
FLOAT_UN2(log, emi_vlogf(x), log(x))
/* sqrt and rsqrt: unless the build passes -fno-math-errno, GCC keeps libm's errno
** contract -- no vector form, and a libm call for every negative input (15 ms
** for 4M floats vs 0.3 ms). The x86 vector square root gives the same correctly
** rounded results (NaN for negatives), so the contiguous case starts with it.
** AVX is part of x86-64-v3, the portable build's baseline, so installed builds
** keep this path; wider AVX-512 forms would change no result (each lane is
** correctly rounded), and no run-time choice is made here. */
#if defined(__AVX__) || defined(__SSE2__)
#include <immintrin.h>
#if defined(__AVX__)
enum { VF32 = 8, VF64 = 4 };                /* floats, doubles per vector */
EMI_INLINE void vroot_f32(float *o, const float *a, int recip) {
  __m256 v = _mm256_sqrt_ps(_mm256_loadu_ps(a));
  _mm256_storeu_ps(o, recip ? _mm256_div_ps(_mm256_set1_ps(1.0f), v) : v);
}
EMI_INLINE void vroot_f64(double *o, const double *a, int recip) {
  __m256d v = _mm256_sqrt_pd(_mm256_loadu_pd(a));
  _mm256_storeu_pd(o, recip ? _mm256_div_pd(_mm256_set1_pd(1.0), v) : v);
}
#else
enum { VF32 = 4, VF64 = 2 };
EMI_INLINE void vroot_f32(float *o, const float *a, int recip) {
  __m128 v = _mm_sqrt_ps(_mm_loadu_ps(a));
  _mm_storeu_ps(o, recip ? _mm_div_ps(_mm_set1_ps(1.0f), v) : v);
}
EMI_INLINE void vroot_f64(double *o, const double *a, int recip) {
  __m128d v = _mm_sqrt_pd(_mm_loadu_pd(a));
  _mm_storeu_pd(o, recip ? _mm_div_pd(_mm_set1_pd(1.0), v) : v);
}
#endif
/* loop1's vector prefixes: whole vectors of (1 /) sqrt(a), the count done. */
EMI_INLINE int64_t vroots_f32(float *o, const float *a, int64_t n, int recip) {
  int64_t i = 0;
  for (; i + VF32 <= n; i += VF32) vroot_f32(o + i, a + i, recip);
  return i;
}
EMI_INLINE int64_t vroots_f64(double *o, const double *a, int64_t n, int recip) {
  int64_t i = 0;
  for (; i + VF64 <= n; i += VF64) vroot_f64(o + i, a + i, recip);
  return i;
}
EMI_INLINE int64_t vsqrt_f32(float *o, const float *a, int64_t n) {
  return vroots_f32(o, a, n, 0); }
EMI_INLINE int64_t vrsqrt_f32(float *o, const float *a, int64_t n) {
  return vroots_f32(o, a, n, 1); }
EMI_INLINE int64_t vsqrt_f64(double *o, const double *a, int64_t n) {
  return vroots_f64(o, a, n, 0); }
EMI_INLINE int64_t vrsqrt_f64(double *o, const double *a, int64_t n) {
  return vroots_f64(o, a, n, 1); }
#else
#define vsqrt_f32 NULL
#define vrsqrt_f32 NULL
#define vsqrt_f64 NULL
#define vrsqrt_f64 NULL
#endif
UN_FN(sqrt, f32, float, float, sqrt(x), vsqrt_f32)
UN_FN(sqrt, f64, double, double, sqrt(x), vsqrt_f64)
UN_FN(rsqrt, f32, float, float, (T)1 / sqrt(x), vrsqrt_f32)
UN_FN(rsqrt, f64, double, double, (T)1 / sqrt(x), vrsqrt_f64)
HALF1(sqrt)
HALF1(rsqrt)
FLOAT_UN(sin, sin(x))
FLOAT_UN(cos, cos(x))
FLOAT_UN2(tanh, emi_vtanhf(x), tanh(x))
FLOAT_UN2(sigmoid, 1.0f / (1.0f + emi_vexpf(-x)), 1.0 / (1.0 + exp(-x)))
FLOAT_UN(relu, x < 0 ? (T)0 : x)                     /* NaN stays NaN */
FLOAT_UN2(gelu, 0.5f * x * (1.0f + emi_verff(x * 0.70710678118654752440f)),
          0.5 * x * (1.0 + erf(x * 0.70710678118654752440)))
FLOAT_UN2(silu, x / (1.0f + emi_vexpf(-x)), x / (1.0 + exp(-x)))
FLOAT_UN(floor, floor(x))
FLOAT_UN(ceil, ceil(x))
FLOAT_UN(round, nearbyint(x))                       /* half to even */
FLOAT_UN(trunc, trunc(x))
FLOAT_UN(sign, (T)((x > 0) - (x < 0)))
FLOAT_UN(recip, (T)1 / x)
FLOAT_UN(square, x * x)
FLOAT_UN(log1p, log1p(x))
FLOAT_UN(expm1, expm1(x))
FLOAT_UN(log2, log2(x))
FLOAT_UN(log10, log10(x))
FLOAT_UN(tan, tan(x))
FLOAT_UN(asin, asin(x))
FLOAT_UN(acos, acos(x))
FLOAT_UN(atan, atan(x))
FLOAT_UN(sinh, sinh(x))
FLOAT_UN(cosh, cosh(x))
FLOAT_UN2(erf, emi_verff(x), erf(x))
FLOAT_UN2(gelut,
          0.5f * x * (1.0f + emi_vtanhf((float)SQRT_2_OVER_PI * (x + 0.044715f * x * x * x))),
          0.5 * x * (1.0 + tanh(SQRT_2_OVER_PI * (x + 0.044715 * x * x * x))))


/* -- Integer and bool loops --------------------------------------------------------- */
INT_UN(neg, (U)0 - (U)x)
SIGNED_UN(abs, x < 0 ? (T)((U)0 - (U)x) : x)
SIGNED_UN(relu, x < 0 ? 0 : x)
SIGNED_UN(sign, (x > 0) - (x < 0))
UN_FN(sign, u8, uint8_t, uint8_t, x > 0, NULL)
#define abs_u8 ident_u8                     /* uint8 is never negative */
#define relu_u8 ident_u8
INT_UN(ident, x)                            /* floor ceil round trunc of an integer */
INT_UN(square, (U)x * (U)x)
UN_FN(ident, b, uint8_t, uint8_t, x, NULL)  /* sign abs relu floor ... of a bool */
UN_FN(lnot, b, uint8_t, uint8_t, !x, NULL)

/* -- Table ----------------------------------------------------------------------------- */
#define FLOATS(N)                                                                      \
  [EM_FLOAT32] = N##_f32, [EM_FLOAT64] = N##_f64, [EM_FLOAT16] = N##_f16,              \
  [EM_BFLOAT16] = N##_bf16
#define INTS(N) [EM_INT32] = N##_i32, [EM_INT64] = N##_i64, [EM_UINT8] = N##_u8

static const emi_loop1 UN[EM_NUM_UNOPS][EM_NUM_DTYPES] = {
  [EM_NEG] = {FLOATS(neg), INTS(neg)},
  [EM_ABS] = {[EM_BOOL] = ident_b, FLOATS(abs), INTS(abs)},
  [EM_EXP] = {FLOATS(exp)},
  [EM_LOG] = {FLOATS(log)},
  [EM_SQRT] = {FLOATS(sqrt)},
  [EM_RSQRT] = {FLOATS(rsqrt)},
  [EM_SIN] = {FLOATS(sin)},
  [EM_COS] = {FLOATS(cos)},
  [EM_TANH] = {FLOATS(tanh)},
  [EM_SIGMOID] = {FLOATS(sigmoid)},
  [EM_RELU] = {[EM_BOOL] = ident_b, FLOATS(relu), INTS(relu)},
  [EM_GELU] = {FLOATS(gelu)},
  [EM_SILU] = {FLOATS(silu)},
  [EM_FLOOR] = {[EM_BOOL] = ident_b, FLOATS(floor), INTS(ident)},
  [EM_CEIL] = {[EM_BOOL] = ident_b, FLOATS(ceil), INTS(ident)},
  [EM_ROUND] = {[EM_BOOL] = ident_b, FLOATS(round), INTS(ident)},
  [EM_TRUNC] = {[EM_BOOL] = ident_b, FLOATS(trunc), INTS(ident)},
  [EM_SIGN] = {FLOATS(sign), INTS(sign), [EM_BOOL] = ident_b},
  [EM_RECIPROCAL] = {FLOATS(recip)},
  [EM_SQUARE] = {FLOATS(square), INTS(square)},
  [EM_LOG1P] = {FLOATS(log1p)},
  [EM_EXPM1] = {FLOATS(expm1)},
  [EM_LOG2] = {FLOATS(log2)},
  [EM_LOG10] = {FLOATS(log10)},
  [EM_TAN] = {FLOATS(tan)},
  [EM_ASIN] = {FLOATS(asin)},
  [EM_ACOS] = {FLOATS(acos)},
  [EM_ATAN] = {FLOATS(atan)},
  [EM_SINH] = {FLOATS(sinh)},
  [EM_COSH] = {FLOATS(cosh)},
  [EM_ERF] = {FLOATS(erf)},
  [EM_LOGICAL_NOT] = {[EM_BOOL] = lnot_b},
  [EM_GELU_TANH] = {FLOATS(gelut)},
};

emi_loop1 emi_cpu_unary_loop(em_unop op, em_dtype dt) {
  if ((unsigned)op >= EM_NUM_UNOPS || (unsigned)dt >= EM_NUM_DTYPES) return NULL;
  return UN[op][dt];
}

/* Ops cheap enough that only large tensors are worth a thread hand-off. */
static int64_t grain_of(em_unop op) {
  switch (op) {
  case EM_NEG: case EM_ABS: case EM_RELU: case EM_FLOOR: case EM_CEIL: case EM_ROUND:
  case EM_TRUNC: case EM_SIGN: case EM_RECIPROCAL: case EM_SQUARE: case EM_LOGICAL_NOT:
    return EMI_GRAIN_CHEAP;
  default:
    return EMI_GRAIN_COSTLY;
  }
}

typedef struct un_ctx { emi_loop1 f; emi_kparams kp; } un_ctx;

static void un_row(void *ctx, char *const *p, const int64_t *s, int64_t n) {
  un_ctx *c = ctx;
  c->f(p[0], p[1], n, s[0], s[1], &c->kp);
}

em_status emi_cpu_unary(emi_device *dev, em_unop op, em_tensor *out, const em_tensor *a) {
  em_state *S = dev->S;
  un_ctx c;
  c.f = emi_cpu_unary_loop(op, a->dtype);
  if (!c.f)
    return emi_error(S, EM_ERR_DTYPE, "%s: not supported for %s tensors on cpu",
                     em_unop_name(op), em_dtype_name(a->dtype));
  c.kp.err = 0;
  em_tensor *ops[2] = {out, (em_tensor *)a};
  emi_cpu_foreach(S, ops, 2, grain_of(op), un_row, &c);
  return EM_OK;
}

/* -- clamp ------------------------------------------------------------------------------
** max then min, so that lo > hi gives hi everywhere (as PyTorch); comparisons are
** false for NaN, which therefore passes through. Integer bounds are ceil(lo) and
** floor(hi), so a fractional bound never lets an out-of-range value through. */
#define CLAMP(x, lo, hi) \
  (((x) < (lo) ? (lo) : (x)) > (hi) ? (hi) : ((x) < (lo) ? (lo) : (x)))
UN_FN(clamp, f32, float, float, CLAMP(x, p_->f0, p_->f1), NULL)
UN_FN(clamp, f64, double, double, CLAMP(x, p_->d0, p_->d1), NULL)
HALF1(clamp)
UN_FN(clamp, i32, int32_t, uint32_t, CLAMP((int64_t)x, p_->i0, p_->i1), NULL)
UN_FN(clamp, i64, int64_t, uint64_t, CLAMP(x, p_->i0, p_->i1), NULL)
UN_FN(clamp, u8, uint8_t, uint32_t, CLAMP((int64_t)x, p_->i0, p_->i1), NULL)
UN_FN(clamp, b, uint8_t, uint8_t, CLAMP((int64_t)x, p_->i0, p_->i1) != 0, NULL)

static const emi_loop1 CLAMPS[EM_NUM_DTYPES] = {FLOATS(clamp), INTS(clamp),
                                                [EM_BOOL] = clamp_b};

static int64_t bound_i64(double v) {
  if (v != v) return 0;
  return emi_f2i(v);
}

em_status emi_cpu_clamp(emi_device *dev, em_tensor *out, const em_tensor *a, double lo,
                        double hi) {
  em_state *S = dev->S;
  un_ctx c;
  c.f = CLAMPS[a->dtype];
  c.kp.d0 = lo;
  c.kp.d1 = hi;
  c.kp.f0 = (float)lo;
  c.kp.f1 = (float)hi;
  c.kp.i0 = bound_i64(ceil(lo));
  c.kp.i1 = bound_i64(floor(hi));
  c.kp.err = 0;
  em_tensor *ops[2] = {out, (em_tensor *)a};
  emi_cpu_foreach(S, ops, 2, EMI_GRAIN_CHEAP, un_row, &c);
  return EM_OK;
}

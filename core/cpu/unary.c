/*
** unary.c -- CPU kernels of the unary element-wise ops and clamp.
**
** One loop per (op, dtype) in the table UN[op][dtype]. The ops layer has already
** chosen the dtype: float ops on integer inputs arrive converted to float32,
** logical_not arrives as bool, so integer loops exist only for the ops that keep
** an integer dtype (neg abs relu sign floor ceil round trunc square). float16 and
** bfloat16 go through the float32 loops (elementwise.c adapters).
*/
#include "loops.h"
#include "vmath.h"
#include <tgmath.h>

/* T is a typedef inside the loop so that EXPR can name it ((T)1, ...). */
#define UN_LOOP(NAME, T_, OT, PRE, EXPR)                                               \
  static void NAME(char *o_, const char *a_, int64_t n, int64_t so, int64_t sa,        \
                   emi_kparams *p_) {                                                  \
    typedef T_ T;                                                                      \
    PRE;                                                                               \
    if (so == sizeof(OT) && sa == sizeof(T)) {                                         \
      OT *o = (OT *)o_;                                                                \
      const T *a = (const T *)a_;                                                      \
      for (int64_t i = 0; i < n; i++) { T x = a[i]; o[i] = (OT)(EXPR); }               \
    } else {                                                                           \
      for (int64_t i = 0; i < n; i++) {                                                \
        T x = *(const T *)(a_ + i * sa);                                               \
        *(OT *)(o_ + i * so) = (OT)(EXPR);                                             \
      }                                                                                \
    }                                                                                  \
    (void)p_;                                                                          \
  }

/* The float16 and bfloat16 loops of NAME: its float32 loop through an adapter. */
#define HALF1_FN(NAME, SFX, DT)                                                        \
  static void NAME##_##SFX(char *o, const char *a, int64_t n, int64_t so, int64_t sa,  \
                           emi_kparams *p) {                                           \
    emi_half_loop1(NAME##_f32, DT, 0, o, a, n, so, sa, p); }
#define HALF1(NAME) HALF1_FN(NAME, f16, EM_FLOAT16) HALF1_FN(NAME, bf16, EM_BFLOAT16)
/* EXPR sees x of type T; constants are written (T)c to stay in T's precision. */
#define FLOAT_UN(NAME, PRE32, PRE64, EXPR)                                             \
  UN_LOOP(NAME##_f32, float, float, PRE32, EXPR)                                       \
  UN_LOOP(NAME##_f64, double, double, PRE64, EXPR)                                     \
  HALF1(NAME)
/* float32 with its own (vectorizable, vmath.h) expression, float64 on libm. */
#define FLOAT_UN2(NAME, EXPR32, EXPR64)                                                \
  UN_LOOP(NAME##_f32, float, float, , EXPR32)                                          \
  UN_LOOP(NAME##_f64, double, double, , EXPR64)                                        \
  HALF1(NAME)
#define INT_UN(NAME, PRE, EXPR)                                                        \
  UN_LOOP(NAME##_i32, int32_t, int32_t, typedef uint32_t U; (void)sizeof(U); PRE, EXPR)                 \
  UN_LOOP(NAME##_i64, int64_t, int64_t, typedef uint64_t U; (void)sizeof(U); PRE, EXPR)                 \
  UN_LOOP(NAME##_u8, uint8_t, uint8_t, typedef uint32_t U; (void)sizeof(U); PRE, EXPR)

/* -- Float loops ---------------------------------------------------------------------- */
#define SQRT_2_OVER_PI 0.7978845608028654
FLOAT_UN(neg, , , -x)
FLOAT_UN(abs, , , fabs(x))
FLOAT_UN2(exp, emi_vexpf(x), exp(x))
FLOAT_UN2(log, emi_vlogf(x), log(x))
/* sqrt and rsqrt: unless the build passes -fno-math-errno, GCC keeps libm's errno
** contract -- no vector form, and a libm call for every negative input (15 ms
** for 4M floats vs 0.3 ms). The x86 vector square root gives the same correctly
** rounded results (NaN for negatives), so the contiguous case uses it. AVX is
** part of x86-64-v3, the portable build's baseline, so installed builds keep this
** path; wider AVX-512 forms would change no result (each lane is correctly
** rounded), and no run-time choice is made here. */
#if defined(__AVX__)
#include <immintrin.h>
#define VSQRT_F32(o, a, i, n, RECIP)                                                   \
  for (; i + 8 <= n; i += 8) {                                                         \
    __m256 v = _mm256_sqrt_ps(_mm256_loadu_ps(a + i));                                 \
    _mm256_storeu_ps(o + i, RECIP ? _mm256_div_ps(_mm256_set1_ps(1.0f), v) : v);       \
  }
#define VSQRT_F64(o, a, i, n, RECIP)                                                   \
  for (; i + 4 <= n; i += 4) {                                                         \
    __m256d v = _mm256_sqrt_pd(_mm256_loadu_pd(a + i));                                \
    _mm256_storeu_pd(o + i, RECIP ? _mm256_div_pd(_mm256_set1_pd(1.0), v) : v);        \
  }
#elif defined(__SSE2__)
#include <emmintrin.h>
#define VSQRT_F32(o, a, i, n, RECIP)                                                   \
  for (; i + 4 <= n; i += 4) {                                                         \
    __m128 v = _mm_sqrt_ps(_mm_loadu_ps(a + i));                                       \
    _mm_storeu_ps(o + i, RECIP ? _mm_div_ps(_mm_set1_ps(1.0f), v) : v);                \
  }
#define VSQRT_F64(o, a, i, n, RECIP)                                                   \
  for (; i + 2 <= n; i += 2) {                                                         \
    __m128d v = _mm_sqrt_pd(_mm_loadu_pd(a + i));                                      \
    _mm_storeu_pd(o + i, RECIP ? _mm_div_pd(_mm_set1_pd(1.0), v) : v);                 \
  }
#else
#define VSQRT_F32(o, a, i, n, RECIP)
#define VSQRT_F64(o, a, i, n, RECIP)
#endif
#define SQRT_LOOP(NAME, T, VEC, RECIP)                                                 \
  static void NAME(char *o_, const char *a_, int64_t n, int64_t so, int64_t sa,        \
                   emi_kparams *p_) {                                                  \
    (void)p_;                                                                          \
    int64_t i = 0;                                                                     \
    if (so == sizeof(T) && sa == sizeof(T)) {                                          \
      T *o = (T *)o_;                                                                  \
      const T *a = (const T *)a_;                                                      \
      VEC(o, a, i, n, RECIP)                                                           \
      for (; i < n; i++) o[i] = RECIP ? (T)1 / sqrt(a[i]) : sqrt(a[i]);                \
    } else {                                                                           \
      for (; i < n; i++) {                                                             \
        T x = *(const T *)(a_ + i * sa);                                               \
        *(T *)(o_ + i * so) = RECIP ? (T)1 / sqrt(x) : sqrt(x);                        \
      }                                                                                \
    }                                                                                  \
  }
SQRT_LOOP(sqrt_f32, float, VSQRT_F32, 0)
SQRT_LOOP(sqrt_f64, double, VSQRT_F64, 0)
SQRT_LOOP(rsqrt_f32, float, VSQRT_F32, 1)
SQRT_LOOP(rsqrt_f64, double, VSQRT_F64, 1)
HALF1(sqrt)
HALF1(rsqrt)
FLOAT_UN(sin, , , sin(x))
FLOAT_UN(cos, , , cos(x))
FLOAT_UN2(tanh, emi_vtanhf(x), tanh(x))
FLOAT_UN2(sigmoid, 1.0f / (1.0f + emi_vexpf(-x)), 1.0 / (1.0 + exp(-x)))
FLOAT_UN(relu, , , x < 0 ? (T)0 : x)                     /* NaN stays NaN */
FLOAT_UN2(gelu, 0.5f * x * (1.0f + emi_verff(x * 0.70710678118654752440f)),
          0.5 * x * (1.0 + erf(x * 0.70710678118654752440)))
FLOAT_UN2(silu, x / (1.0f + emi_vexpf(-x)), x / (1.0 + exp(-x)))
FLOAT_UN(floor, , , floor(x))
FLOAT_UN(ceil, , , ceil(x))
FLOAT_UN(round, , , nearbyint(x))                       /* half to even */
FLOAT_UN(trunc, , , trunc(x))
FLOAT_UN(sign, , , (T)((x > 0) - (x < 0)))
FLOAT_UN(recip, , , (T)1 / x)
FLOAT_UN(square, , , x * x)
FLOAT_UN(log1p, , , log1p(x))
FLOAT_UN(expm1, , , expm1(x))
FLOAT_UN(log2, , , log2(x))
FLOAT_UN(log10, , , log10(x))
FLOAT_UN(tan, , , tan(x))
FLOAT_UN(asin, , , asin(x))
FLOAT_UN(acos, , , acos(x))
FLOAT_UN(atan, , , atan(x))
FLOAT_UN(sinh, , , sinh(x))
FLOAT_UN(cosh, , , cosh(x))
FLOAT_UN2(erf, emi_verff(x), erf(x))
FLOAT_UN2(gelut,
          0.5f * x * (1.0f + emi_vtanhf((float)SQRT_2_OVER_PI * (x + 0.044715f * x * x * x))),
          0.5 * x * (1.0 + tanh(SQRT_2_OVER_PI * (x + 0.044715 * x * x * x))))


/* -- Integer and bool loops --------------------------------------------------------- */
#define SIGNED_UN(NAME, EXPR)                                                          \
  UN_LOOP(NAME##_i32, int32_t, int32_t, typedef uint32_t U; (void)sizeof(U), EXPR)     \
  UN_LOOP(NAME##_i64, int64_t, int64_t, typedef uint64_t U; (void)sizeof(U), EXPR)
INT_UN(neg, , (U)0 - (U)x)
SIGNED_UN(abs, x < 0 ? (T)((U)0 - (U)x) : x)
SIGNED_UN(relu, x < 0 ? 0 : x)
SIGNED_UN(sign, (x > 0) - (x < 0))
UN_LOOP(sign_u8, uint8_t, uint8_t, , x > 0)
#define abs_u8 ident_u8                     /* uint8 is never negative */
#define relu_u8 ident_u8
INT_UN(ident, , x)                          /* floor ceil round trunc of an integer */
INT_UN(square, , (U)x * (U)x)
UN_LOOP(ident_b, uint8_t, uint8_t, , x)     /* sign abs relu floor ... of a bool */
UN_LOOP(lnot_b, uint8_t, uint8_t, , !x)

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
UN_LOOP(clamp_f32, float, float, const float lo = p_->f0; const float hi = p_->f1,
        CLAMP(x, lo, hi))
UN_LOOP(clamp_f64, double, double, const double lo = p_->d0; const double hi = p_->d1,
        CLAMP(x, lo, hi))
HALF1(clamp)
#define ICLAMP_PRE const int64_t lo = p_->i0; const int64_t hi = p_->i1
UN_LOOP(clamp_i32, int32_t, int32_t, ICLAMP_PRE, CLAMP((int64_t)x, lo, hi))
UN_LOOP(clamp_i64, int64_t, int64_t, ICLAMP_PRE, CLAMP(x, lo, hi))
UN_LOOP(clamp_u8, uint8_t, uint8_t, ICLAMP_PRE, CLAMP((int64_t)x, lo, hi))
UN_LOOP(clamp_b, uint8_t, uint8_t, ICLAMP_PRE, CLAMP((int64_t)x, lo, hi) != 0)

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

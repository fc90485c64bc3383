/*
** copy.c -- CPU copy (with dtype conversion) and fill.
**
** Same-dtype copies move bytes (one loop per element size, memcpy for contiguous
** rows). Conversions use the table CONV[src][dst] of loops stamped out below
** (float16 ones go through float32 chunks to use the F16C conversions):
** each loads a source element as its natural C value (float16/bfloat16 widen to
** float), then converts the way emi_store_f64 does: float -> integer truncates
** toward zero with NaN -> 0 and out-of-range values clamped to int64 before the
** narrowing wrap, anything -> bool is "!= 0".
**
** A conversion is one element function (a load, a conversion, a store) that the
** short CONV macro wraps in cast_rows, a loop written once and always inlined,
** so each pair still gets its own vectorized loop; the loop works on bytes, as
** 56 source and destination pairs are too many for one copy per type. The
** same-dtype loops are copy_impl.h's, one copy per element size.
*/
#include "loops.h"
#include "inline.h"

/* -- Element types: storage type and load-as-value ---------------------------------- */
#define ST_f32 float
#define ST_f64 double
#define ST_f16 uint16_t
#define ST_bf16 uint16_t
#define ST_i32 int32_t
#define ST_i64 int64_t
#define ST_u8 uint8_t
#define ST_b uint8_t
#define LD_f32(x) (x)
#define LD_f64(x) (x)
#define LD_f16(x) emi_half_to_float(x)
#define LD_bf16(x) emi_bf16_to_float(x)
#define LD_i32(x) (x)
#define LD_i64(x) (x)
#define LD_u8(x) (x)
#define LD_b(x) (x)

/* Value -> destination storage. Integers come from floats through emi_f2i. */
#define TO_INT(IT, v) _Generic((v), float: (IT)emi_f2i(v), double: (IT)emi_f2i(v), \
                               default: (IT)(v))
#define CV_f32(v) ((float)(v))
#define CV_f64(v) ((double)(v))
#define CV_f16(v) emi_float_to_half((float)(v))
#define CV_bf16(v) emi_float_to_bf16((float)(v))
#define CV_i32(v) TO_INT(int32_t, v)
#define CV_i64(v) TO_INT(int64_t, v)
#define CV_u8(v) TO_INT(uint8_t, v)
#define CV_b(v) ((uint8_t)((v) != 0))

/* n elements: f converts the one at a to the one at o. eo and ea are the element
** sizes of o and a, constants in each inlined copy. */
EMI_INLINE void cast_rows(char *o, const char *a, int64_t n, int64_t so, int64_t sa,
                          int64_t eo, int64_t ea, void (*f)(char *, const char *)) {
  if (so == eo && sa == ea) {
    for (int64_t i = 0; i < n; i++) f(o + i * eo, a + i * ea);
  } else {
    for (int64_t i = 0; i < n; i++) f(o + i * so, a + i * sa);
  }
}

/* cv_S_D, the loop from S to D: cast_rows around the element function cv_S_D_x. */
#define CONV(S, D)                                                                     \
  EMI_INLINE void cv_##S##_##D##_x(char *o, const char *a) {                           \
    *(ST_##D *)o = CV_##D(LD_##S(*(const ST_##S *)a)); }                               \
  static void cv_##S##_##D(char *o, const char *a, int64_t n, int64_t so, int64_t sa,  \
                           emi_kparams *p) {                                           \
    cast_rows(o, a, n, so, sa, sizeof(ST_##D), sizeof(ST_##S), cv_##S##_##D##_x); }
/* One source to every destination (the diagonal is never used: same dtype moves
** bytes), and the table row that goes with it. */
#define CONV_FROM(S)                                                                   \
  CONV(S, f32) CONV(S, f64) CONV(S, f16) CONV(S, bf16)                                 \
  CONV(S, i32) CONV(S, i64) CONV(S, u8) CONV(S, b)
#define ROW(S)                                                                         \
  {cv_##S##_f32, cv_##S##_f64, cv_##S##_f16, cv_##S##_bf16,                            \
   cv_##S##_i32, cv_##S##_i64, cv_##S##_u8, cv_##S##_b}

CONV_FROM(f32)
CONV_FROM(f64)
CONV_FROM(f16)
CONV_FROM(bf16)
CONV_FROM(i32)
CONV_FROM(i64)
CONV_FROM(u8)
CONV_FROM(b)

/* Indexed [src][dst] in em_dtype order: float32 float64 float16 bfloat16 int32
** int64 uint8 bool. */
static const emi_loop1 CONV[EM_NUM_DTYPES][EM_NUM_DTYPES] = {
  ROW(f32), ROW(f64), ROW(f16), ROW(bf16), ROW(i32), ROW(i64), ROW(u8), ROW(b),
};

/* -- Same-dtype moves and fills (copy_impl.h) ------------------------------------ */
#define T uint8_t
#define FN(name) name##_1
#include "copy_impl.h"
#define T uint16_t
#define FN(name) name##_2
#include "copy_impl.h"
#define T uint32_t
#define FN(name) name##_4
#include "copy_impl.h"
#define T uint64_t
#define FN(name) name##_8
#include "copy_impl.h"

static emi_loop1 move_loop(size_t size) {
  switch (size) {
  case 1: return move_1;
  case 2: return move_2;
  case 4: return move_4;
  default: return move_8;
  }
}

typedef struct cp_ctx {
  emi_loop1 f;
  int half;           /* 1: float16 source, 2: float16 destination, 0: neither */
} cp_ctx;

static void cp_row(void *ctx, char *const *p, const int64_t *s, int64_t n) {
  const cp_ctx *c = ctx;
  if (!c->half) { c->f(p[0], p[1], n, s[0], s[1], NULL); return; }
  /* float16 goes through float chunks and the bulk (F16C) conversions; f is
  ** then the float32 -> dst or src -> float32 loop */
  float buf[EMI_HALF_CHUNK];
  for (int64_t i = 0; i < n; i += EMI_HALF_CHUNK) {
    int64_t m = n - i < EMI_HALF_CHUNK ? n - i : EMI_HALF_CHUNK;
    if (c->half == 1) {
      emi_half_to_float_n(buf, p[1] + i * s[1], m, s[1], EM_FLOAT16);
      c->f(p[0] + i * s[0], (const char *)buf, m, s[0], sizeof(float), NULL);
    } else {
      c->f((char *)buf, p[1] + i * s[1], m, sizeof(float), s[1], NULL);
      emi_float_to_half_n(p[0] + i * s[0], buf, m, s[0], EM_FLOAT16);
    }
  }
}

em_status emi_cpu_copy(emi_device *dev, em_tensor *out, const em_tensor *src) {
  em_state *S = dev->S;
  if ((unsigned)out->dtype >= EM_NUM_DTYPES || (unsigned)src->dtype >= EM_NUM_DTYPES)
    return emi_error(S, EM_ERR_DTYPE, "copy: invalid dtype");
  cp_ctx c;
  c.half = 0;
  if (out->dtype == src->dtype) {
    c.f = move_loop(em_dtype_size(out->dtype));
  } else if (src->dtype == EM_FLOAT16) {
    c.half = 1;
    c.f = CONV[EM_FLOAT32][out->dtype];
  } else if (out->dtype == EM_FLOAT16) {
    c.half = 2;
    c.f = CONV[src->dtype][EM_FLOAT32];
  } else {
    c.f = CONV[src->dtype][out->dtype];
  }
  em_tensor *ops[2] = {out, (em_tensor *)src};
  emi_cpu_foreach(S, ops, 2, EMI_GRAIN_CHEAP, cp_row, &c);
  return EM_OK;
}

/* -- fill --------------------------------------------------------------------------------- */
/* fill_1 .. fill_8 are copy_impl.h's. */
typedef void (*fill_fn)(char *o, int64_t n, int64_t so, const void *pv);
typedef struct fill_ctx { fill_fn f; uint64_t v; int zero; int64_t es; } fill_ctx;

static void fill_row(void *ctx, char *const *p, const int64_t *s, int64_t n) {
  fill_ctx *c = ctx;
  if (c->zero && s[0] == c->es) memset(p[0], 0, (size_t)(n * c->es));  /* zero_() */
  else c->f(p[0], n, s[0], &c->v);
}

em_status emi_cpu_fill(emi_device *dev, em_tensor *out, double value) {
  em_state *S = dev->S;
  fill_ctx c;
  c.v = 0;
  emi_store_f64(&c.v, out->dtype, value);
  c.zero = c.v == 0;
  c.es = (int64_t)em_dtype_size(out->dtype);
  switch (em_dtype_size(out->dtype)) {
  case 1: c.f = fill_1; break;
  case 2: c.f = fill_2; break;
  case 4: c.f = fill_4; break;
  case 8: c.f = fill_8; break;
  default: return emi_error(S, EM_ERR_DTYPE, "fill: invalid dtype");
  }
  em_tensor *ops[1] = {out};
  emi_cpu_foreach(S, ops, 1, EMI_GRAIN_CHEAP, fill_row, &c);
  return EM_OK;
}

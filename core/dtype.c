/*
** dtype.c -- the dtype traits table (names, sizes, kinds), PyTorch's type
** promotion, and float16 conversion. float16 and bfloat16 are stored as such
** and computed in float32 by the kernels.
*/
#include "internal.h"
#include <math.h>

typedef struct dtype_info {
  const char *name;
  size_t size;
  int kind;       /* 0 bool, 1 unsigned int, 2 signed int, 3 float: promotion order */
  int rank;       /* order inside a kind for promotion */
} dtype_info;

static const dtype_info INFO[EM_NUM_DTYPES] = {
  [EM_FLOAT32] = {"float32", 4, 3, 2},
  [EM_FLOAT64] = {"float64", 8, 3, 3},
  [EM_FLOAT16] = {"float16", 2, 3, 1},
  [EM_BFLOAT16] = {"bfloat16", 2, 3, 1},
  [EM_INT32] = {"int32", 4, 2, 2},
  [EM_INT64] = {"int64", 8, 2, 3},
  [EM_UINT8] = {"uint8", 1, 1, 0},
  [EM_BOOL] = {"bool", 1, 0, 0},
};

static int valid(em_dtype dt) { return (unsigned)dt < EM_NUM_DTYPES; }

const char *em_dtype_name(em_dtype dt) { return valid(dt) ? INFO[dt].name : "?"; }
size_t em_dtype_size(em_dtype dt) { return valid(dt) ? INFO[dt].size : 0; }
int em_dtype_is_floating(em_dtype dt) { return valid(dt) && INFO[dt].kind == 3; }

em_status em_dtype_from_name(em_state *S, const char *name, em_dtype *dt) {
  static const struct { const char *alias; em_dtype dt; } ALIASES[] = {
    {"float", EM_FLOAT32}, {"double", EM_FLOAT64}, {"half", EM_FLOAT16},
    {"int", EM_INT32}, {"long", EM_INT64}, {"byte", EM_UINT8},
  };
  for (int i = 0; i < EM_NUM_DTYPES; i++)
    if (strcmp(name, INFO[i].name) == 0) { *dt = (em_dtype)i; return EM_OK; }
  for (size_t i = 0; i < sizeof ALIASES / sizeof *ALIASES; i++)
    if (strcmp(name, ALIASES[i].alias) == 0) { *dt = ALIASES[i].dt; return EM_OK; }
  return emi_error(S, EM_ERR_DTYPE,
                   "unknown dtype '%s' (expected float32 float64 float16 bfloat16 "
                   "int32 int64 uint8 bool)", name);
}

/* PyTorch: the higher kind wins (bool < integer < float); inside a kind the wider
** type wins; uint8 with a signed int gives the signed one (int16 does not exist
** here, so uint8+int32 -> int32); float16 with bfloat16 gives float32. */
em_dtype em_dtype_promote(em_dtype a, em_dtype b) {
  if (a == b) return a;
  const dtype_info *x = &INFO[a], *y = &INFO[b];
  if ((a == EM_FLOAT16 && b == EM_BFLOAT16) || (a == EM_BFLOAT16 && b == EM_FLOAT16))
    return EM_FLOAT32;
  if (x->kind != y->kind) {
    if (x->kind == 1 && y->kind == 2) return b;
    if (x->kind == 2 && y->kind == 1) return a;
    return x->kind > y->kind ? a : b;
  }
  return x->rank >= y->rank ? a : b;
}

/* -- float16 <-> float32 ---------------------------------------------------------- */

float emi_half_to_float(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000) << 16, exp = (h >> 10) & 0x1f, man = h & 0x3ff;
  union { uint32_t u; float f; } v;
  if (exp == 0) {                      /* zero or subnormal: man * 2^-24 */
    float f = ldexpf((float)man, -24);
    return sign ? -f : f;
  }
  if (exp == 31) v.u = sign | 0x7f800000u | (man << 13);     /* inf / nan */
  else v.u = sign | ((exp + 112) << 23) | (man << 13);
  return v.f;
}

uint16_t emi_float_to_half(float f) {
  union { uint32_t u; float f; } v;
  v.f = f;
  uint32_t sign = (v.u >> 16) & 0x8000, a = v.u & 0x7fffffffu;
  if (a > 0x7f800000u) return (uint16_t)(sign | 0x7e00);     /* nan */
  if (a >= 0x477ff000u) return (uint16_t)(sign | 0x7c00);    /* overflow -> inf */
  if (a < 0x38800000u) {               /* subnormal or zero in half */
    float m = fabsf(f) * 16777216.0f;  /* value / 2^-24, rounded to nearest even */
    return (uint16_t)(sign | (uint32_t)nearbyintf(m));
  }
  /* normal: rebias exponent, round mantissa to nearest even */
  uint32_t r = a + 0xc8000fffu + ((a >> 13) & 1u);
  return (uint16_t)(sign | (r >> 13));
}

/* The public names: hosts (the Lua layer reading t[i] of a float16 tensor)
** convert exactly as the ops do. */
float em_half_to_float(uint16_t h) { return emi_half_to_float(h); }
uint16_t em_float_to_half(float f) { return emi_float_to_half(f); }
float em_bfloat16_to_float(uint16_t b) { return emi_bf16_to_float(b); }
uint16_t em_float_to_bfloat16(float f) { return emi_float_to_bf16(f); }

double emi_load_f64(const void *p, em_dtype dt) {
  switch (dt) {
  case EM_FLOAT32: return *(const float *)p;
  case EM_FLOAT64: return *(const double *)p;
  case EM_FLOAT16: return emi_half_to_float(*(const uint16_t *)p);
  case EM_BFLOAT16: return emi_bf16_to_float(*(const uint16_t *)p);
  case EM_INT32: return *(const int32_t *)p;
  case EM_INT64: return (double)*(const int64_t *)p;
  case EM_UINT8: return *(const uint8_t *)p;
  case EM_BOOL: return *(const uint8_t *)p != 0;
  default: return 0;
  }
}

/* Float to integer conversions truncate toward zero as C (and PyTorch) do;
** out-of-range values are clamped rather than left undefined. */
static int64_t to_i64(double v) {
  if (v != v) return 0;
  if (v >= 9.2233720368547758e18) return INT64_MAX;
  if (v <= -9.2233720368547758e18) return INT64_MIN;
  return (int64_t)v;
}

void emi_store_f64(void *p, em_dtype dt, double v) {
  switch (dt) {
  case EM_FLOAT32: *(float *)p = (float)v; break;
  case EM_FLOAT64: *(double *)p = v; break;
  case EM_FLOAT16: *(uint16_t *)p = emi_float_to_half((float)v); break;
  case EM_BFLOAT16: *(uint16_t *)p = emi_float_to_bf16((float)v); break;
  case EM_INT32: *(int32_t *)p = (int32_t)to_i64(v); break;
  case EM_INT64: *(int64_t *)p = to_i64(v); break;
  case EM_UINT8: *(uint8_t *)p = (uint8_t)to_i64(v); break;
  case EM_BOOL: *(uint8_t *)p = v != 0; break;
  default: break;
  }
}

/*
** dtype_dev.h -- dtypes inside kernels: float16 / bfloat16 conversions and
** loading / storing one element of any dtype, for device code (nvcc) and the
** grid emulator alike (device.h's EMK_DEVICE). The conversions round exactly as
** the CPU backend's (core/dtype.c, backend.h), so a kernel's float16 results
** match the CPU's bit for bit when the arithmetic in float32 does.
**
** Element kinds: floating dtypes compute in float32 (float16, bfloat16, float32)
** or float64; integer dtypes through int64; bool reads as 0 / 1 and stores
** v != 0. emk_load_f64 / emk_store_f64 are the slow generic forms, for casts and
** for kernels written once for every dtype.
*/
#ifndef EMBER_KERNELS_DTYPE_DEV_H
#define EMBER_KERNELS_DTYPE_DEV_H
#include "device.h"
#include "ember.h"
#include <stdint.h>
#include <string.h>
#include <math.h>

EMK_DEVICE float emk_half_to_float(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000) << 16, exp = (h >> 10) & 0x1f, man = h & 0x3ff;
  uint32_t u;
  float f;
  if (exp == 0) {                                   /* zero or subnormal: man * 2^-24 */
    f = ldexpf((float)man, -24);
    return sign ? -f : f;
  }
  if (exp == 31) u = sign | 0x7f800000u | (man << 13);
  else u = sign | ((exp + 112) << 23) | (man << 13);
  memcpy(&f, &u, 4);
  return f;
}

EMK_DEVICE uint16_t emk_float_to_half(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  uint32_t sign = (u >> 16) & 0x8000, a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return (uint16_t)(sign | 0x7e00);
  if (a >= 0x477ff000u) return (uint16_t)(sign | 0x7c00);
  if (a < 0x38800000u) {
    float m = fabsf(f) * 16777216.0f;
    return (uint16_t)(sign | (uint32_t)nearbyintf(m));
  }
  uint32_t r = a + 0xc8000fffu + ((a >> 13) & 1u);
  return (uint16_t)(sign | (r >> 13));
}

EMK_DEVICE float emk_bf16_to_float(uint16_t b) {
  uint32_t u = (uint32_t)b << 16;
  float f;
  memcpy(&f, &u, 4);
  return f;
}

EMK_DEVICE uint16_t emk_float_to_bf16(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40);
  return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

EMK_DEVICE double emk_load_f64(const void *p, int dt) {
  switch (dt) {
  case EM_FLOAT32: return *(const float *)p;
  case EM_FLOAT64: return *(const double *)p;
  case EM_FLOAT16: return emk_half_to_float(*(const uint16_t *)p);
  case EM_BFLOAT16: return emk_bf16_to_float(*(const uint16_t *)p);
  case EM_INT32: return *(const int32_t *)p;
  case EM_INT64: return (double)*(const int64_t *)p;
  case EM_UINT8: return *(const uint8_t *)p;
  default: return *(const uint8_t *)p != 0;
  }
}

/* Stores v converted as the CPU backend converts (float to integer truncates). */
EMK_DEVICE void emk_store_f64(void *p, int dt, double v) {
  switch (dt) {
  case EM_FLOAT32: *(float *)p = (float)v; break;
  case EM_FLOAT64: *(double *)p = v; break;
  case EM_FLOAT16: *(uint16_t *)p = emk_float_to_half((float)v); break;
  case EM_BFLOAT16: *(uint16_t *)p = emk_float_to_bf16((float)v); break;
  case EM_INT32: *(int32_t *)p = (int32_t)v; break;
  case EM_INT64: *(int64_t *)p = (int64_t)v; break;
  case EM_UINT8: *(uint8_t *)p = (uint8_t)(int64_t)v; break;
  default: *(uint8_t *)p = v != 0; break;
  }
}

/* Integers exactly (int64 values beyond 2^53 would not survive a double). */
EMK_DEVICE int64_t emk_load_i64(const void *p, int dt) {
  switch (dt) {
  case EM_INT32: return *(const int32_t *)p;
  case EM_INT64: return *(const int64_t *)p;
  case EM_UINT8: return *(const uint8_t *)p;
  case EM_BOOL: return *(const uint8_t *)p != 0;
  default: return (int64_t)emk_load_f64(p, dt);
  }
}

#endif

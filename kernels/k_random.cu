/*
** k_random.cu -- the CUDA backend's uniform, normal, randint and arange. The device
** code, one source for nvcc and the grid emulator (device.h); the launchers are
** k_random.c.
**
** Every thread computes the Philox counter its element (or Box-Muller pair)
** reads under the stream layout of core/philox.h -- word j of a draw is lane
** j % 4 of counter offset + j / 4, element i uses words [i*w, i*w + w) -- turns
** the words into a value with the CPU's arithmetic (core/cpu/random.c, written
** out again here for the device), and stores it at the element's place in the
** tensor's logical (row-major) order, any strides. The constants that depend
** only on the arguments (the float32 bounds, the largest value below hi) are
** computed on the host with the CPU's own functions.
*/
#include "k_random_args.h"
#include "device.h"
#include "dtype_dev.h"

EMK_DEVICE void rnd_philox(uint64_t seed, uint64_t c, uint32_t *out) {
  uint32_t c0 = (uint32_t)c, c1 = (uint32_t)(c >> 32), c2 = 0, c3 = 0;
  uint32_t k0 = (uint32_t)seed, k1 = (uint32_t)(seed >> 32);
  for (int r = 0; r < 10; r++) {
    uint64_t p0 = (uint64_t)0xD2511F53u * c0, p1 = (uint64_t)0xCD9E8D57u * c2;
    uint32_t n0 = (uint32_t)(p1 >> 32) ^ c1 ^ k0, n2 = (uint32_t)(p0 >> 32) ^ c3 ^ k1;
    c0 = n0; c1 = (uint32_t)p1; c2 = n2; c3 = (uint32_t)p0;
    k0 += 0x9E3779B9u; k1 += 0xBB67AE85u;
  }
  out[0] = c0; out[1] = c1; out[2] = c2; out[3] = c3;
}

/* Word j of the draw at (seed, offset). */
EMK_DEVICE uint32_t rnd_word(const rnd_args *a, uint64_t j) {
  uint32_t w[4];
  rnd_philox(a->seed, a->offset + j / 4, w);
  return w[j % 4];
}

EMK_DEVICE float rnd_u24(uint32_t x) { return (float)(x >> 8) * 5.9604644775390625e-8f; }
EMK_DEVICE double rnd_u53(uint32_t hi, uint32_t lo) {
  return (double)((((uint64_t)hi << 32) | lo) >> 11) * 1.1102230246251565404236316680908203125e-16;
}

/* log_u, sqrt_pos, sincos_turns: core/cpu/random.c's, operation for operation */
EMK_DEVICE float rnd_log_u(float u) {
  uint32_t i;
  memcpy(&i, &u, 4);
  int32_t e = (int32_t)(i >> 23) - 127;
  i = (i & 0x7fffffu) | 0x3f800000u;
  float m;
  memcpy(&m, &i, 4);
  if (m > 1.41421356f) { m *= 0.5f; e += 1; }
  float s = (m - 1.0f) / (m + 1.0f), z = s * s;
  float p = 1.0f + z * (1.0f / 3 + z * (1.0f / 5 + z * (1.0f / 7 + z * (1.0f / 9))));
  return (float)e * 0.693145751953125f + ((float)e * 1.428606765330187e-6f + 2.0f * s * p);
}

EMK_DEVICE float rnd_sqrt_pos(float x) {
  uint32_t i;
  memcpy(&i, &x, 4);
  i = 0x5f3759dfu - (i >> 1);
  float y;
  memcpy(&y, &i, 4);
  float h = 0.5f * x;
  y = y * (1.5f - h * y * y);
  y = y * (1.5f - h * y * y);
  y = y * (1.5f - h * y * y);
  return x * y;
}

EMK_DEVICE void rnd_sincos_turns(float t, float *sn, float *cs) {
  float q = nearbyintf(t * 4.0f);
  float x = (t - q * 0.25f) * 6.2831853071795864f, x2 = x * x;
  float sx = x * (1.0f + x2 * (-1.0f / 6 + x2 * (1.0f / 120 + x2 * (-1.0f / 5040 +
                                                               x2 * (1.0f / 362880)))));
  float cx = 1.0f + x2 * (-0.5f + x2 * (1.0f / 24 + x2 * (-1.0f / 720 + x2 * (1.0f / 40320 +
                                                               x2 * (-1.0f / 3628800)))));
  int k = (int)q & 3;
  float s1 = (k & 1) ? cx : sx, c1 = (k & 1) ? sx : cx;
  *sn = (k & 2) ? -s1 : s1;
  *cs = ((k + 1) & 2) ? -c1 : c1;
}

EMK_DEVICE float rnd_round_to(float x, int dt) {
  return dt == EM_FLOAT16 ? emk_half_to_float(emk_float_to_half(x))
                          : emk_bf16_to_float(emk_float_to_bf16(x));
}

/* Element k (logical order) of out. */
EMK_DEVICE char *rnd_at(const rnd_args *a, int64_t k) {
  int64_t off = 0;
  for (int d = a->ndim - 1; d >= 0; d--) {
    off += (k % a->sizes[d]) * a->strides[d];
    k /= a->sizes[d];
  }
  return a->out + off * a->esize;
}

EMK_DEVICE void rnd_store_f32(char *p, int dt, float v) {
  if (dt == EM_FLOAT32) *(float *)p = v;
  else if (dt == EM_FLOAT16) *(uint16_t *)p = emk_float_to_half(v);
  else *(uint16_t *)p = emk_float_to_bf16(v);
}

EMK_DEVICE void rnd_store_i64(char *p, int dt, int64_t v) {
  switch (dt) {
  case EM_INT64: *(int64_t *)p = v; break;
  case EM_INT32: *(int32_t *)p = (int32_t)v; break;
  case EM_UINT8: *(uint8_t *)p = (uint8_t)v; break;
  case EM_BOOL: *(uint8_t *)p = v != 0; break;
  default: emk_store_f64(p, dt, (double)v); break;
  }
}

EMK_DEVICE void rnd_one(const rnd_args *a, int64_t i) {
  int dt = a->dt;
  switch (a->op) {
  case R_UNIFORM:
    if (dt == EM_FLOAT64) {
      uint64_t j = (uint64_t)i * 2;
      uint32_t w[4];
      rnd_philox(a->seed, a->offset + j / 4, w);
      double x = a->dlo + a->dspan * rnd_u53(w[j % 4], w[j % 4 + 1]);
      *(double *)rnd_at(a, i) = x < a->dhi ? x : (a->dspan > 0 ? a->dtop : a->dlo);
    } else if (dt == EM_FLOAT32) {
      float x = a->flo + a->fspan * rnd_u24(rnd_word(a, (uint64_t)i));
      *(float *)rnd_at(a, i) = x < a->fhi ? x : (a->fspan > 0 ? a->ftop : a->flo);
    } else {
      float x = rnd_round_to(a->flo + a->fspan * rnd_u24(rnd_word(a, (uint64_t)i)), dt);
      rnd_store_f32(rnd_at(a, i), dt, x < a->fhi ? x : a->ftop);
    }
    break;
  case R_NORMAL:                 /* i is a pair: elements 2i, 2i+1 */
    if (dt == EM_FLOAT64) {
      uint32_t w[4];
      rnd_philox(a->seed, a->offset + (uint64_t)i, w);
      double u1 = (double)(((((uint64_t)w[0] << 32) | w[1]) >> 11) + 1) * 1.1102230246251565404236316680908203125e-16;
      double u2 = rnd_u53(w[2], w[3]);
      double r = sqrt(-2.0 * log(u1)), th = 6.283185307179586477 * u2;
      double s = sin(th), co = cos(th);
      /* the CPU's rounding: gcc contracts its mean + sd*r*co to fma(sd*r, co, mean)
      ** where the target has FMA (the -march=native build), else rounds twice */
      double mean = a->dlo, sdr = a->dspan * r;
#if defined(__CUDACC__) || defined(__FP_FAST_FMA)
      *(double *)rnd_at(a, 2 * i) = fma(sdr, co, mean);
      if (2 * i + 1 < a->numel) *(double *)rnd_at(a, 2 * i + 1) = fma(sdr, s, mean);
#else
      *(double *)rnd_at(a, 2 * i) = mean + sdr * co;
      if (2 * i + 1 < a->numel) *(double *)rnd_at(a, 2 * i + 1) = mean + sdr * s;
#endif
    } else {
      uint64_t j = (uint64_t)i * 2;
      uint32_t w[4];
      rnd_philox(a->seed, a->offset + j / 4, w);
      float mean = (float)a->dlo, sd = (float)a->dspan;
      float u1 = (float)((w[j % 4] >> 8) + 1) * 5.9604644775390625e-8f, u2 = rnd_u24(w[j % 4 + 1]);
      float r = sd * rnd_sqrt_pos(-2.0f * rnd_log_u(u1)), sn, cs;
      rnd_sincos_turns(u2, &sn, &cs);
      rnd_store_f32(rnd_at(a, 2 * i), dt, mean + r * cs);
      if (2 * i + 1 < a->numel) rnd_store_f32(rnd_at(a, 2 * i + 1), dt, mean + r * sn);
    }
    break;
  case R_RANDINT:
    if (a->words == 1) {
      uint32_t w = rnd_word(a, (uint64_t)i);
      rnd_store_i64(rnd_at(a, i), dt, a->lo + (int64_t)(((uint64_t)w * a->range) >> 32));
    } else {
      uint64_t j = (uint64_t)i * 2;
      uint32_t w[4];
      rnd_philox(a->seed, a->offset + j / 4, w);
      uint64_t x = ((uint64_t)w[j % 4] << 32) | w[j % 4 + 1];
#ifdef __CUDACC__
      uint64_t hi = __umul64hi(x, a->range);
#else
      uint64_t hi = (uint64_t)(((unsigned __int128)x * a->range) >> 64);
#endif
      rnd_store_i64(rnd_at(a, i), dt, (int64_t)((uint64_t)a->lo + hi));
    }
    break;
  default: {                     /* arange: out contiguous */
    char *p = a->out + i * a->esize;
    switch (dt) {
    case EM_FLOAT32: *(float *)p = (float)(a->start + (double)i * a->step); break;
    case EM_FLOAT64: *(double *)p = a->start + (double)i * a->step; break;
    case EM_INT64: *(int64_t *)p = (int64_t)a->start + i * (int64_t)a->step; break;
    case EM_INT32: *(int32_t *)p = (int32_t)((int64_t)a->start + i * (int64_t)a->step); break;
    default: emk_store_f64(p, dt, a->start + (double)i * a->step); break;
    }
  }
  }
}

EMK_KERNEL(k_random, rnd_args) {
  int64_t step = (int64_t)gridDim.x * blockDim.x;
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < a.n; i += step)
    rnd_one(&a, i);
}

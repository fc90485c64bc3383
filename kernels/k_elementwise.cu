/*
** k_elementwise.cu -- the CUDA backend's element-wise kernels: unary, binary,
** tensor-scalar, a + alpha*b, clamp, where, and dtype conversions within one
** device: the device code, one source for nvcc and the grid emulator (device.h);
** the launchers are k_elementwise.c.
**
** One kernel (k_ew) walks out's elements with a grid-stride loop; each thread
** unravels its flat index into the operands' offsets (stride 0 where broadcast),
** or, when every operand is contiguous, uses the flat index as it is. Before the
** launch, size-1 dims are dropped and neighbour dims that walk memory as one in
** every operand are merged, so a broadcast (N, C) + (C,) unravels over two dims
** and a transposed copy over as few as its layout allows; below 2^31 elements
** the unravelling divides in 32 bits, several times cheaper on a GPU than the
** 64-bit division. Contiguous float32 operands go through k_ew_f32x4 instead:
** 16-byte loads, two per operand in flight per thread. The element
** function then picks the computation by kind, dtype class and op. The results
** follow the CPU backend (core/cpu/unary.c, binary.c, elementwise.c, copy.c):
** float16 / bfloat16 compute in float32 and round once on the store, float32 and
** float64 in their own type with the same expressions, integers wrap (computed
** in 64-bit two's complement, then narrowed: the same bits as the CPU's 32- and
** 8-bit loops), bool results are "!= 0". Integer remainder by zero sets a flag on
** the device that the host reads back after the launch and reports as the CPU
** does (ZeroDivisionError).
*/
#include "k_elementwise_args.h"
#include "device.h"
#include "dtype_dev.h"
#include "math_dev.h"

/* -- Loads and stores ------------------------------------------------------------ */

EMK_DEVICE float ew_ldf(const char *p, int dt) {      /* float32, float16, bfloat16 */
  if (dt == EM_FLOAT32) return *(const float *)p;
  if (dt == EM_FLOAT16) return emk_half_to_float(*(const uint16_t *)p);
  return emk_bf16_to_float(*(const uint16_t *)p);
}

EMK_DEVICE void ew_stf(char *p, int dt, float v) {
  if (dt == EM_FLOAT32) *(float *)p = v;
  else if (dt == EM_FLOAT16) *(uint16_t *)p = emk_float_to_half(v);
  else *(uint16_t *)p = emk_float_to_bf16(v);
}

EMK_DEVICE int64_t ew_ldi(const char *p, int dt) {     /* integers; bool as its byte */
  switch (dt) {
  case EM_INT32: return *(const int32_t *)p;
  case EM_INT64: return *(const int64_t *)p;
  default: return *(const uint8_t *)p;
  }
}

EMK_DEVICE void ew_sti(char *p, int dt, int64_t v) {   /* narrowing wraps; bool: != 0 */
  switch (dt) {
  case EM_INT32: *(int32_t *)p = (int32_t)(uint32_t)(uint64_t)v; break;
  case EM_INT64: *(int64_t *)p = v; break;
  case EM_UINT8: *(uint8_t *)p = (uint8_t)(uint64_t)v; break;
  default: *(uint8_t *)p = v != 0; break;
  }
}

/* float -> integer as the CPU's emi_f2i: NaN 0, clamped to int64, truncated */
EMK_DEVICE int64_t ew_f2i(double v) {
  if (v != v) return 0;
  if (v >= 9.2233720368547758e18) return INT64_MAX;
  if (v <= -9.2233720368547758e18) return INT64_MIN;
  return (int64_t)v;
}

/* -- Float element functions (float32 and float64, T either) ----------------------- */
#define EW_SQRT_2_OVER_PI 0.7978845608028654

/* maximum / minimum with NaN propagating from either side, as the CPU's */
template <typename T> EMK_DEVICE T ew_fmax(T x, T y) {
  return x != x ? x : y != y ? y : x > y ? x : y;
}
template <typename T> EMK_DEVICE T ew_fmin(T x, T y) {
  return x != x ? x : y != y ? y : x < y ? x : y;
}
/* for every dtype class (float, double, int64) */
template <typename T> EMK_DEVICE T ew_clamp(T x, T lo, T hi) {
  return ((x < lo ? lo : x)) > hi ? hi : (x < lo ? lo : x);
}

template <typename T> EMK_DEVICE T ew_un(int op, T x) {
  switch (op) {
  case EM_NEG: return -x;
  case EM_ABS: return emk_fabs(x);
  case EM_EXP: return emk_exp(x);
  case EM_LOG: return emk_log(x);
  case EM_SQRT: return emk_sqrt(x);
  case EM_RSQRT: return (T)1 / emk_sqrt(x);
  case EM_SIN: return emk_sin(x);
  case EM_COS: return emk_cos(x);
  case EM_TANH: return emk_tanh(x);
  case EM_SIGMOID: return (T)1 / ((T)1 + emk_exp(-x));
  case EM_RELU: return x < 0 ? (T)0 : x;
  case EM_GELU: return (T)0.5 * x * ((T)1 + emk_erf(x * (T)0.70710678118654752440));
  case EM_SILU: return x / ((T)1 + emk_exp(-x));
  case EM_FLOOR: return emk_floor(x);
  case EM_CEIL: return emk_ceil(x);
  case EM_ROUND: return emk_nearbyint(x);
  case EM_TRUNC: return emk_trunc(x);
  case EM_SIGN: return (T)((x > 0) - (x < 0));
  case EM_RECIPROCAL: return (T)1 / x;
  case EM_SQUARE: return x * x;
  case EM_LOG1P: return emk_log1p(x);
  case EM_EXPM1: return emk_expm1(x);
  case EM_LOG2: return emk_log2(x);
  case EM_LOG10: return emk_log10(x);
  case EM_TAN: return emk_tan(x);
  case EM_ASIN: return emk_asin(x);
  case EM_ACOS: return emk_acos(x);
  case EM_ATAN: return emk_atan(x);
  case EM_SINH: return emk_sinh(x);
  case EM_COSH: return emk_cosh(x);
  case EM_ERF: return emk_erf(x);
  case EM_GELU_TANH:
    return (T)0.5 * x *
           ((T)1 + emk_tanh((T)EW_SQRT_2_OVER_PI * (x + (T)0.044715 * x * x * x)));
  default: return x;
  }
}

template <typename T> EMK_DEVICE T ew_bin(int op, T x, T y) {
  switch (op) {
  case EM_ADD: return x + y;
  case EM_SUB: return x - y;
  case EM_MUL: return x * y;
  case EM_DIV: return x / y;
  case EM_POW: return emk_pow(x, y);
  case EM_MAXIMUM: return ew_fmax(x, y);
  case EM_MINIMUM: return ew_fmin(x, y);
  case EM_EQ: return (T)(x == y);
  case EM_NE: return (T)(x != y);
  case EM_LT: return (T)(x < y);
  case EM_LE: return (T)(x <= y);
  case EM_GT: return (T)(x > y);
  case EM_GE: return (T)(x >= y);
  case EM_REMAINDER: {
    T m = emk_fmod(x, y);
    if (m != 0 && ((y < 0) != (m < 0))) m += y;
    return m;
  }
  case EM_ATAN2: return emk_atan2(x, y);
  case EM_LOGICAL_AND: return (T)(x != 0 && y != 0);
  case EM_LOGICAL_OR: return (T)(x != 0 || y != 0);
  default: return x;
  }
}

/* pow(x, s) for the exponents the CPU maps to other loops (binary.c) */
template <typename T> EMK_DEVICE T ew_pspec(int k, T x) {
  switch (k) {
  case 1: return x * x;
  case 2: return emk_sqrt(x);
  case 3: return (T)1 / x;
  case 4: return (T)1 / emk_sqrt(x);
  case 5: return x * x * x;
  default: return 1 / (x * x);
  }
}

/* -- Integer (and bool) element functions, wrapping in 64 bits ------------------- */
EMK_DEVICE int64_t ew_ipow(int64_t b, int64_t e) {
  if (e < 0) return b == 1 ? 1 : b == -1 ? ((e & 1) ? -1 : 1) : 0;
  uint64_t r = 1, x = (uint64_t)b;
  while (e) {
    if (e & 1) r *= x;
    x *= x;
    e >>= 1;
  }
  return (int64_t)r;
}

EMK_DEVICE int64_t ew_un_i(int op, int64_t x) {
  uint64_t u = (uint64_t)x;
  switch (op) {
  case EM_NEG: return (int64_t)(0 - u);
  case EM_ABS: return x < 0 ? (int64_t)(0 - u) : x;
  case EM_RELU: return x < 0 ? 0 : x;
  case EM_SIGN: return (x > 0) - (x < 0);
  case EM_SQUARE: return (int64_t)(u * u);
  case EM_LOGICAL_NOT: return !x;
  default: return x;            /* floor ceil round trunc of an integer */
  }
}

EMK_DEVICE int64_t ew_bin_i(int op, int64_t x, int64_t y, int *err) {
  uint64_t ux = (uint64_t)x, uy = (uint64_t)y;
  switch (op) {
  case EM_ADD: return (int64_t)(ux + uy);
  case EM_SUB: return (int64_t)(ux - uy);
  case EM_MUL: return (int64_t)(ux * uy);
  case EM_POW: return ew_ipow(x, y);
  case EM_MAXIMUM: return x > y ? x : y;
  case EM_MINIMUM: return x < y ? x : y;
  case EM_EQ: return x == y;
  case EM_NE: return x != y;
  case EM_LT: return x < y;
  case EM_LE: return x <= y;
  case EM_GT: return x > y;
  case EM_GE: return x >= y;
  case EM_REMAINDER: {
    if (y == 0) {
      if (err) *err = 1;
      return 0;
    }
    if (y == -1) return 0;
    int64_t r = x % y;
    if (r != 0 && ((r < 0) != (y < 0))) r += y;
    return r;
  }
  case EM_LOGICAL_AND: return x != 0 && y != 0;
  case EM_LOGICAL_OR: return x != 0 || y != 0;
  default: return x;
  }
}

/* -- Casts: the source as its natural value, converted as core/cpu/copy.c ---------- */
EMK_DEVICE void ew_cast(char *po, int odt, const char *pi, int idt) {
  if (idt == EM_FLOAT64) {
    double v = *(const double *)pi;
    switch (odt) {
    case EM_FLOAT64: *(double *)po = v; break;
    case EM_FLOAT32: case EM_FLOAT16: case EM_BFLOAT16: ew_stf(po, odt, (float)v); break;
    case EM_BOOL: *(uint8_t *)po = v != 0; break;
    default: ew_sti(po, odt, ew_f2i(v)); break;
    }
  } else if (idt == EM_FLOAT32 || idt == EM_FLOAT16 || idt == EM_BFLOAT16) {
    float v = ew_ldf(pi, idt);
    switch (odt) {
    case EM_FLOAT64: *(double *)po = (double)v; break;
    case EM_FLOAT32: case EM_FLOAT16: case EM_BFLOAT16: ew_stf(po, odt, v); break;
    case EM_BOOL: *(uint8_t *)po = v != 0; break;
    default: ew_sti(po, odt, ew_f2i((double)v)); break;
    }
  } else {
    int64_t v = ew_ldi(pi, idt);
    switch (odt) {
    case EM_FLOAT64: *(double *)po = (double)v; break;
    case EM_FLOAT32: case EM_FLOAT16: case EM_BFLOAT16: ew_stf(po, odt, (float)v); break;
    default: ew_sti(po, odt, v); break;
    }
  }
}

EMK_DEVICE void ew_move(char *dst, const char *src, int esize) {
  switch (esize) {
  case 1: *(uint8_t *)dst = *(const uint8_t *)src; break;
  case 2: *(uint16_t *)dst = *(const uint16_t *)src; break;
  case 4: *(uint32_t *)dst = *(const uint32_t *)src; break;
  default: *(uint64_t *)dst = *(const uint64_t *)src; break;
  }
}

/* -- One element ------------------------------------------------------------------- */
EMK_DEVICE void ew_element(const ew_args *a, char *po, const char *p0, const char *p1,
                           const char *p2) {
  int dt = a->dt, odt = a->odt, op = a->op;
  switch (a->kind) {
  case K_CAST: ew_cast(po, odt, p0, dt); return;
  case K_WHERE: ew_move(po, *(const uint8_t *)p0 ? p1 : p2, a->esz[0]); return;
  default: break;
  }
  if (dt == EM_FLOAT32 || dt == EM_FLOAT16 || dt == EM_BFLOAT16) {
    float x = ew_ldf(p0, dt), r;
    switch (a->kind) {
    case K_UNARY: r = ew_un<float>(op, x); break;
    case K_BINARY: r = ew_bin<float>(op, x, ew_ldf(p1, dt)); break;
    case K_SCALAR:
      r = a->pspec ? ew_pspec<float>(a->pspec, x)
          : a->reverse ? ew_bin<float>(op, a->f0, x) : ew_bin<float>(op, x, a->f0);
      break;
    case K_ADDS: r = x + a->f0 * ew_ldf(p1, dt); break;
    default: r = ew_clamp<float>(x, a->f0, a->f1); break;
    }
    if (odt == EM_BOOL) *(uint8_t *)po = r != 0;
    else ew_stf(po, odt, r);
  } else if (dt == EM_FLOAT64) {
    double x = *(const double *)p0, r;
    switch (a->kind) {
    case K_UNARY: r = ew_un<double>(op, x); break;
    case K_BINARY: r = ew_bin<double>(op, x, *(const double *)p1); break;
    case K_SCALAR:
      r = a->pspec ? ew_pspec<double>(a->pspec, x)
          : a->reverse ? ew_bin<double>(op, a->d0, x) : ew_bin<double>(op, x, a->d0);
      break;
    case K_ADDS: r = x + a->d0 * *(const double *)p1; break;
    default: r = ew_clamp<double>(x, a->d0, a->d1); break;
    }
    if (odt == EM_BOOL) *(uint8_t *)po = r != 0;
    else *(double *)po = r;
  } else {
    int64_t x = ew_ldi(p0, dt), r;
    switch (a->kind) {
    case K_UNARY: r = ew_un_i(op, x); break;
    case K_BINARY: r = ew_bin_i(op, x, ew_ldi(p1, dt), a->err); break;
    case K_SCALAR:
      r = a->reverse ? ew_bin_i(op, a->i0, x, a->err) : ew_bin_i(op, x, a->i0, a->err);
      break;
    case K_ADDS: {
      int64_t y = ew_ldi(p1, dt);
      if (dt == EM_BOOL) r = x | (y & (a->d0 != 0));
      else r = (int64_t)((uint64_t)x + (uint64_t)a->i0 * (uint64_t)y);
      break;
    }
    default: r = ew_clamp<int64_t>(x, a->i0, a->i1); break;
    }
    ew_sti(po, odt, r);
  }
}

/* -- The vectorised path ----------------------------------------------------------
** Every operand and out contiguous float32 and 16-byte aligned: each thread
** does four neighbours with one 16-byte load per operand and one store, where
** the generic path makes four narrow accesses and unravels nothing anyway, and
** two such groups (a grid-stride apart) per loop trip, their loads issued
** before either is computed. The launch gives 8 elements per thread (at 4M
** floats, 2048 blocks of 256: ~4 waves on 132 SMs, no grid-stride trips), up
** to MAX_BLOCKS, past which the loop strides. The element functions are the
** generic path's, so the results are the same bits. The n % 4 tail is done
** element by element by the first threads. */
EMK_DEVICE float ew_f32_one(const ew_args *a, float x, float y) {
  switch (a->kind) {
  case K_UNARY: return ew_un<float>(a->op, x);
  case K_BINARY: return ew_bin<float>(a->op, x, y);
  case K_SCALAR:
    return a->pspec ? ew_pspec<float>(a->pspec, x)
           : a->reverse ? ew_bin<float>(a->op, a->f0, x) : ew_bin<float>(a->op, x, a->f0);
  case K_ADDS: return x + a->f0 * y;
  default: return ew_clamp<float>(x, a->f0, a->f1);
  }
}

EMK_KERNEL(k_ew_f32x4, ew_args) {
  int64_t step = (int64_t)gridDim.x * blockDim.x;
  int64_t first = (int64_t)blockIdx.x * blockDim.x + threadIdx.x, n4 = a.n / 4;
  const emk_float4 *x4 = (const emk_float4 *)a.in[0];
  const emk_float4 *y4 = (const emk_float4 *)(a.nin > 1 ? a.in[1] : a.in[0]);
  emk_float4 *o4 = (emk_float4 *)a.out;
  int64_t i = first;
  /* two vectors per operand loaded before either is used: twice the bytes in
  ** flight per thread, which a short launch (a few waves) needs to reach the
  ** memory's bandwidth */
  for (; i + step < n4; i += 2 * step) {
    emk_float4 x = x4[i], y = y4[i], u = x4[i + step], v = y4[i + step], r, q;
    r.x = ew_f32_one(&a, x.x, y.x);
    r.y = ew_f32_one(&a, x.y, y.y);
    r.z = ew_f32_one(&a, x.z, y.z);
    r.w = ew_f32_one(&a, x.w, y.w);
    q.x = ew_f32_one(&a, u.x, v.x);
    q.y = ew_f32_one(&a, u.y, v.y);
    q.z = ew_f32_one(&a, u.z, v.z);
    q.w = ew_f32_one(&a, u.w, v.w);
    o4[i] = r;
    o4[i + step] = q;
  }
  if (i < n4) {
    emk_float4 x = x4[i], y = y4[i], r;
    r.x = ew_f32_one(&a, x.x, y.x);
    r.y = ew_f32_one(&a, x.y, y.y);
    r.z = ew_f32_one(&a, x.z, y.z);
    r.w = ew_f32_one(&a, x.w, y.w);
    o4[i] = r;
  }
  const float *x1 = (const float *)a.in[0];
  const float *y1 = (const float *)(a.nin > 1 ? a.in[1] : a.in[0]);
  for (int64_t j = n4 * 4 + first; j < a.n; j += step)
    ((float *)a.out)[j] = ew_f32_one(&a, x1[j], y1[j]);
}

EMK_KERNEL(k_ew, ew_args) {
  int64_t step = (int64_t)gridDim.x * blockDim.x;
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < a.n; i += step) {
    int64_t off[4] = {i, i, i, i};
    if (!a.contig) {
      off[0] = off[1] = off[2] = off[3] = 0;
      if (a.narrow) {
        uint32_t rest = (uint32_t)i;
        for (int d = a.ndim - 1; d >= 0; d--) {
          uint32_t sz = (uint32_t)a.sizes[d], k = rest % sz;
          rest /= sz;
          for (int j = 0; j <= a.nin; j++) off[j] += (int64_t)k * a.st[j][d];
        }
      } else {
        int64_t rest = i;
        for (int d = a.ndim - 1; d >= 0; d--) {
          int64_t k = rest % a.sizes[d];
          rest /= a.sizes[d];
          for (int j = 0; j <= a.nin; j++) off[j] += k * a.st[j][d];
        }
      }
    }
    ew_element(&a, a.out + off[0] * a.esz[0], a.in[0] + off[1] * a.esz[1],
               a.nin > 1 ? a.in[1] + off[2] * a.esz[2] : NULL,
               a.nin > 2 ? a.in[2] + off[3] * a.esz[3] : NULL);
  }
}

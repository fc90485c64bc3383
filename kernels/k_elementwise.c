/*
** k_elementwise.c -- the CUDA backend's element-wise kernels: unary, binary,
** tensor-scalar, a + alpha*b, clamp, where, and dtype conversions within one
** device. One source for nvcc and the grid emulator (device.h).
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
#include "k_elementwise.h"
#include "device.h"
#include "dtype_dev.h"

enum { THREADS = 256, MAX_BLOCKS = 4096 };
enum { K_UNARY, K_BINARY, K_SCALAR, K_ADDS, K_CLAMP, K_WHERE, K_CAST };

typedef struct ew_args {
  char *out;
  const char *in[3];
  int *err;                        /* integer remainder: set to 1 on division by zero */
  int64_t n;
  int ndim, nin, contig, narrow;   /* narrow: n < 2^31, unravel in 32 bits */
  int kind, op, dt, odt;           /* dt: the operands' dtype (cast: the source's) */
  int reverse, pspec;              /* scalar: s op a; pow's special exponents */
  int esz[4];                      /* element sizes: out, in[0..2] */
  float f0, f1;                    /* scalar / alpha / bounds, per dtype class */
  double d0, d1;
  int64_t i0, i1;
  int64_t sizes[EM_MAX_DIMS];
  int64_t st[4][EM_MAX_DIMS];      /* strides in elements: out, in[0..2] */
} ew_args;

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

/* -- Float element functions (float32 and float64 from one text) ------------------ */
#define EW_F32(fn) fn##f
#define EW_F64(fn) fn
#define EW_SQRT_2_OVER_PI 0.7978845608028654
#define EW_FMAX(x, y) ((x) != (x) ? (x) : (y) != (y) ? (y) : (x) > (y) ? (x) : (y))
#define EW_FMIN(x, y) ((x) != (x) ? (x) : (y) != (y) ? (y) : (x) < (y) ? (x) : (y))
#define EW_CLAMP(x, lo, hi) \
  (((x) < (lo) ? (lo) : (x)) > (hi) ? (hi) : ((x) < (lo) ? (lo) : (x)))

#define EW_FLOAT_FNS(SFX, T, F)                                                        \
  EMK_DEVICE T ew_un_##SFX(int op, T x) {                                              \
    switch (op) {                                                                      \
    case EM_NEG: return -x;                                                            \
    case EM_ABS: return F(fabs)(x);                                                    \
    case EM_EXP: return F(exp)(x);                                                     \
    case EM_LOG: return F(log)(x);                                                     \
    case EM_SQRT: return F(sqrt)(x);                                                   \
    case EM_RSQRT: return (T)1 / F(sqrt)(x);                                           \
    case EM_SIN: return F(sin)(x);                                                     \
    case EM_COS: return F(cos)(x);                                                     \
    case EM_TANH: return F(tanh)(x);                                                   \
    case EM_SIGMOID: return (T)1 / ((T)1 + F(exp)(-x));                                \
    case EM_RELU: return x < 0 ? (T)0 : x;                                             \
    case EM_GELU: return (T)0.5 * x * ((T)1 + F(erf)(x * (T)0.70710678118654752440));  \
    case EM_SILU: return x / ((T)1 + F(exp)(-x));                                      \
    case EM_FLOOR: return F(floor)(x);                                                 \
    case EM_CEIL: return F(ceil)(x);                                                   \
    case EM_ROUND: return F(nearbyint)(x);                                             \
    case EM_TRUNC: return F(trunc)(x);                                                 \
    case EM_SIGN: return (T)((x > 0) - (x < 0));                                       \
    case EM_RECIPROCAL: return (T)1 / x;                                               \
    case EM_SQUARE: return x * x;                                                      \
    case EM_LOG1P: return F(log1p)(x);                                                 \
    case EM_EXPM1: return F(expm1)(x);                                                 \
    case EM_LOG2: return F(log2)(x);                                                   \
    case EM_LOG10: return F(log10)(x);                                                 \
    case EM_TAN: return F(tan)(x);                                                     \
    case EM_ASIN: return F(asin)(x);                                                   \
    case EM_ACOS: return F(acos)(x);                                                   \
    case EM_ATAN: return F(atan)(x);                                                   \
    case EM_SINH: return F(sinh)(x);                                                   \
    case EM_COSH: return F(cosh)(x);                                                   \
    case EM_ERF: return F(erf)(x);                                                     \
    case EM_GELU_TANH:                                                                 \
      return (T)0.5 * x *                                                              \
             ((T)1 + F(tanh)((T)EW_SQRT_2_OVER_PI * (x + (T)0.044715 * x * x * x)));   \
    default: return x;                                                                 \
    }                                                                                  \
  }                                                                                    \
  EMK_DEVICE T ew_bin_##SFX(int op, T x, T y) {                                        \
    switch (op) {                                                                      \
    case EM_ADD: return x + y;                                                         \
    case EM_SUB: return x - y;                                                         \
    case EM_MUL: return x * y;                                                         \
    case EM_DIV: return x / y;                                                         \
    case EM_POW: return F(pow)(x, y);                                                  \
    case EM_MAXIMUM: return EW_FMAX(x, y);                                             \
    case EM_MINIMUM: return EW_FMIN(x, y);                                             \
    case EM_EQ: return (T)(x == y);                                                    \
    case EM_NE: return (T)(x != y);                                                    \
    case EM_LT: return (T)(x < y);                                                     \
    case EM_LE: return (T)(x <= y);                                                    \
    case EM_GT: return (T)(x > y);                                                     \
    case EM_GE: return (T)(x >= y);                                                    \
    case EM_REMAINDER: {                                                               \
      T m = F(fmod)(x, y);                                                             \
      if (m != 0 && ((y < 0) != (m < 0))) m += y;                                      \
      return m;                                                                        \
    }                                                                                  \
    case EM_ATAN2: return F(atan2)(x, y);                                              \
    case EM_LOGICAL_AND: return (T)(x != 0 && y != 0);                                 \
    case EM_LOGICAL_OR: return (T)(x != 0 || y != 0);                                  \
    default: return x;                                                                 \
    }                                                                                  \
  }                                                                                    \
  /* pow(x, s) for the exponents the CPU maps to other loops (binary.c) */             \
  EMK_DEVICE T ew_pspec_##SFX(int k, T x) {                                            \
    switch (k) {                                                                       \
    case 1: return x * x;                                                              \
    case 2: return F(sqrt)(x);                                                         \
    case 3: return (T)1 / x;                                                           \
    case 4: return (T)1 / F(sqrt)(x);                                                  \
    case 5: return x * x * x;                                                          \
    default: return 1 / (x * x);                                                       \
    }                                                                                  \
  }
EW_FLOAT_FNS(f32, float, EW_F32)
EW_FLOAT_FNS(f64, double, EW_F64)

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
    case K_UNARY: r = ew_un_f32(op, x); break;
    case K_BINARY: r = ew_bin_f32(op, x, ew_ldf(p1, dt)); break;
    case K_SCALAR:
      r = a->pspec ? ew_pspec_f32(a->pspec, x)
          : a->reverse ? ew_bin_f32(op, a->f0, x) : ew_bin_f32(op, x, a->f0);
      break;
    case K_ADDS: r = x + a->f0 * ew_ldf(p1, dt); break;
    default: r = EW_CLAMP(x, a->f0, a->f1); break;
    }
    if (odt == EM_BOOL) *(uint8_t *)po = r != 0;
    else ew_stf(po, odt, r);
  } else if (dt == EM_FLOAT64) {
    double x = *(const double *)p0, r;
    switch (a->kind) {
    case K_UNARY: r = ew_un_f64(op, x); break;
    case K_BINARY: r = ew_bin_f64(op, x, *(const double *)p1); break;
    case K_SCALAR:
      r = a->pspec ? ew_pspec_f64(a->pspec, x)
          : a->reverse ? ew_bin_f64(op, a->d0, x) : ew_bin_f64(op, x, a->d0);
      break;
    case K_ADDS: r = x + a->d0 * *(const double *)p1; break;
    default: r = EW_CLAMP(x, a->d0, a->d1); break;
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
    default: r = EW_CLAMP(x, a->i0, a->i1); break;
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
  case K_UNARY: return ew_un_f32(a->op, x);
  case K_BINARY: return ew_bin_f32(a->op, x, y);
  case K_SCALAR:
    return a->pspec ? ew_pspec_f32(a->pspec, x)
           : a->reverse ? ew_bin_f32(a->op, a->f0, x) : ew_bin_f32(a->op, x, a->f0);
  case K_ADDS: return x + a->f0 * y;
  default: return EW_CLAMP(x, a->f0, a->f1);
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

/* -- Host side ---------------------------------------------------------------------- */

/* Drops size-1 dims and merges neighbours that walk memory as one dim in out
** and every operand (outer stride = inner stride * inner size in each). */
static void merge_dims(ew_args *a) {
  int m = 0;
  for (int d = 0; d < a->ndim; d++) {
    if (a->sizes[d] == 1) continue;
    int join = m > 0;
    for (int j = 0; join && j <= a->nin; j++)
      join = a->st[j][m - 1] == a->st[j][d] * a->sizes[d];
    if (join) {
      a->sizes[m - 1] *= a->sizes[d];
      for (int j = 0; j <= a->nin; j++) a->st[j][m - 1] = a->st[j][d];
      continue;
    }
    a->sizes[m] = a->sizes[d];
    for (int j = 0; j <= a->nin; j++) a->st[j][m] = a->st[j][d];
    m++;
  }
  a->ndim = m;
}

static void setup(ew_args *a, int kind, int op, em_tensor *out, const em_tensor *x,
                  const em_tensor *y, const em_tensor *z) {
  memset(a, 0, sizeof *a);
  const em_tensor *ins[3] = {x, y, z};
  a->kind = kind;
  a->op = op;
  a->out = (char *)em_tensor_data(out);
  a->n = out->numel;
  a->ndim = out->ndim;
  a->odt = out->dtype;
  a->dt = x->dtype;
  a->esz[0] = (int)em_dtype_size(out->dtype);
  a->contig = em_tensor_is_contiguous(out);
  for (int k = 0; k < out->ndim; k++) {
    a->sizes[k] = out->sizes[k];
    a->st[0][k] = out->strides[k];
  }
  for (int j = 0; j < 3 && ins[j]; j++) {
    a->nin = j + 1;
    a->in[j] = (const char *)em_tensor_data(ins[j]);
    a->esz[j + 1] = (int)em_dtype_size(ins[j]->dtype);
    if (!em_tensor_is_contiguous(ins[j])) a->contig = 0;
    for (int k = 0; k < out->ndim; k++) a->st[j + 1][k] = ins[j]->strides[k];
  }
  merge_dims(a);
  a->narrow = a->n <= INT32_MAX;
}

static int aligned16(const void *p) { return ((uintptr_t)p & 15) == 0; }

/* k_ew_f32x4's conditions: float32 in and out, contiguous, 16-byte aligned. */
static int vectorisable(const ew_args *a) {
  if (!a->contig || a->dt != EM_FLOAT32 || a->odt != EM_FLOAT32 || a->n < 4) return 0;
  if (a->kind != K_UNARY && a->kind != K_BINARY && a->kind != K_SCALAR &&
      a->kind != K_ADDS && a->kind != K_CLAMP)
    return 0;
  if (!aligned16(a->out)) return 0;
  for (int j = 0; j < a->nin; j++)
    if (!aligned16(a->in[j]) || a->esz[j + 1] != 4) return 0;
  return 1;
}

/* Launches k_ew (or k_ew_f32x4 where it can); with check_div, an integer remainder's division-by-zero flag is
** read back (a sync) and reported as the CPU reports it. */
static em_status run(emi_device *d, const char *name, ew_args *a, int check_div) {
  if (a->n == 0) return EM_OK;
  em_state *S = d->S;
  emk_cuda_device *cd = emk_dev(d);
  emk_runtime *rt = cd->cuda->rt;
  em_tensor *flag = NULL;
  em_status st;
  const emk_kernel *kern = vectorisable(a) ? &k_ew_f32x4 : &k_ew;
  int64_t per_thread = kern == &k_ew ? 1 : 8, one = 1;
  int64_t blocks = (a->n + THREADS * per_thread - 1) / (THREADS * per_thread);
  if (blocks > MAX_BLOCKS) blocks = MAX_BLOCKS;
  emk_dim3 grid = {(unsigned)blocks, 1, 1}, block = {THREADS, 1, 1};
  if (check_div) {
    if ((st = emi_tensor_new(S, name, &one, 1, EM_INT32, d->index, &flag))) return st;
    if ((st = emk_fill(d, flag, 0))) goto done;
    a->err = (int *)em_tensor_data(flag);
  }
  if ((st = rt->ops->launch(rt, kern, grid, block, 0, cd->compute, a, sizeof *a))) {
    st = emk_error(d, name, st);
    goto done;
  }
  if (flag) {
    int32_t h = 0;   /* the flag's value, read back (a sync) */
    if ((st = rt->ops->memcpy_async(rt, &h, a->err, sizeof h, EMK_DEVICE_TO_HOST,
                                    cd->compute)) ||
        (st = rt->ops->stream_sync(rt, cd->compute))) {
      st = emk_error(d, name, st);
      goto done;
    }
    if (h) st = emi_error(S, EM_ERR_ARG, "%s: integer division by zero (ZeroDivisionError)",
                          name);
  }
done:
  em_tensor_release(flag);
  return st;
}

static int is_float(em_dtype dt) {
  return dt == EM_FLOAT32 || dt == EM_FLOAT64 || dt == EM_FLOAT16 || dt == EM_BFLOAT16;
}

static int unary_ok(em_unop op, em_dtype dt) {
  if ((unsigned)op >= EM_NUM_UNOPS) return 0;
  if (is_float(dt)) return op != EM_LOGICAL_NOT;
  switch (op) {
  case EM_ABS: case EM_RELU: case EM_FLOOR: case EM_CEIL: case EM_ROUND: case EM_TRUNC:
  case EM_SIGN:
    return 1;
  case EM_NEG: case EM_SQUARE: return dt != EM_BOOL;
  case EM_LOGICAL_NOT: return dt == EM_BOOL;
  default: return 0;
  }
}

static int binary_ok(em_binop op, em_dtype dt) {
  if ((unsigned)op >= EM_NUM_BINOPS || (unsigned)dt >= EM_NUM_DTYPES) return 0;
  if (is_float(dt)) return 1;
  if (op == EM_DIV || op == EM_ATAN2) return 0;
  if (dt != EM_BOOL) return 1;
  return !(op == EM_SUB || op == EM_POW || op == EM_REMAINDER);
}

static em_status unsupported(emi_device *d, const char *what, const char *op, em_dtype dt) {
  return emi_error(d->S, EM_ERR_DTYPE, "%s: %s is not supported for %s tensors on cuda",
                   what, op, em_dtype_name(dt));
}

em_status emk_unary(emi_device *d, em_unop op, em_tensor *out, const em_tensor *a) {
  if (!unary_ok(op, a->dtype)) return unsupported(d, "unary", em_unop_name(op), a->dtype);
  ew_args k;
  setup(&k, K_UNARY, op, out, a, NULL, NULL);
  return run(d, em_unop_name(op), &k, 0);
}

em_status emk_binary(emi_device *d, em_binop op, em_tensor *out, const em_tensor *a,
                     const em_tensor *b) {
  if (!binary_ok(op, a->dtype)) return unsupported(d, "binary", em_binop_name(op), a->dtype);
  ew_args k;
  setup(&k, K_BINARY, op, out, a, b, NULL);
  return run(d, em_binop_name(op), &k, op == EM_REMAINDER && !is_float(a->dtype));
}

static int64_t bound_i64(double v) {
  if (v != v) return 0;
  if (v >= 9.2233720368547758e18) return INT64_MAX;
  if (v <= -9.2233720368547758e18) return INT64_MIN;
  return (int64_t)v;
}

em_status emk_binary_scalar(emi_device *d, em_binop op, em_tensor *out, const em_tensor *a,
                            double s, int reverse) {
  em_dtype dt = a->dtype;
  if (!binary_ok(op, dt)) return unsupported(d, "binary", em_binop_name(op), dt);
  ew_args k;
  setup(&k, K_SCALAR, op, out, a, NULL, NULL);
  k.reverse = reverse;
  switch (dt) {
  case EM_FLOAT16: k.f0 = emi_half_to_float(emi_float_to_half((float)s)); break;
  case EM_BFLOAT16: k.f0 = emi_bf16_to_float(emi_float_to_bf16((float)s)); break;
  case EM_FLOAT32: k.f0 = (float)s; break;
  case EM_FLOAT64: k.d0 = s; break;
  case EM_INT32: k.i0 = (int32_t)bound_i64(s); break;
  case EM_INT64: k.i0 = bound_i64(s); break;
  case EM_UINT8: k.i0 = (uint8_t)bound_i64(s); break;
  default: k.i0 = s != 0; break;
  }
  /* as the CPU (PyTorch 1.13): not for float16, whose pow is pow itself */
  if (op == EM_POW && !reverse && is_float(dt) && dt != EM_FLOAT16)
    k.pspec = s == 2 ? 1 : s == 0.5 ? 2 : s == -1 ? 3 : s == -0.5 ? 4 : s == 3 ? 5
              : s == -2 ? 6 : 0;
  return run(d, em_binop_name(op), &k, op == EM_REMAINDER && !is_float(dt));
}

em_status emk_add_scaled(emi_device *d, em_tensor *out, const em_tensor *a,
                         const em_tensor *b, double alpha) {
  ew_args k;
  setup(&k, K_ADDS, EM_ADD, out, a, b, NULL);
  k.f0 = (float)alpha;
  k.d0 = alpha;
  k.i0 = bound_i64(alpha);
  return run(d, "add", &k, 0);
}

em_status emk_clamp(emi_device *d, em_tensor *out, const em_tensor *a, double lo,
                    double hi) {
  ew_args k;
  setup(&k, K_CLAMP, 0, out, a, NULL, NULL);
  k.f0 = (float)lo;
  k.f1 = (float)hi;
  k.d0 = lo;
  k.d1 = hi;
  k.i0 = bound_i64(ceil(lo));
  k.i1 = bound_i64(floor(hi));
  return run(d, "clamp", &k, 0);
}

em_status emk_where(emi_device *d, em_tensor *out, const em_tensor *cond,
                    const em_tensor *a, const em_tensor *b) {
  ew_args k;
  setup(&k, K_WHERE, 0, out, cond, a, b);
  return run(d, "where", &k, 0);
}

em_status emk_cast(emi_device *d, em_tensor *out, const em_tensor *src) {
  ew_args k;
  setup(&k, K_CAST, 0, out, src, NULL, NULL);
  return run(d, "copy", &k, 0);
}

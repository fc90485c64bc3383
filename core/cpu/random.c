/*
** random.c -- CPU kernels for the random fills and arange.
**
** A fill walks the tensor in logical (row-major) order in tiles of TILE
** elements. Each tile computes the Philox words it needs (philox.h gives the
** layout: element i uses words [i*w, i*w + w)), turns them into values in a small
** buffer, and stores the buffer into the tensor, converting to its dtype and
** following its strides. Tiles are independent, so they are spread over the
** workers and the result is the same for any thread count.
*/
#include "cpu.h"
#include "../philox.h"
#include <math.h>

enum { TILE = 256 };   /* elements; a multiple of 4 so tiles start on counters */

/* -- Storing a tile ----------------------------------------------------------------- */

typedef enum { VAL_F32, VAL_F64, VAL_I64 } val_kind;

typedef struct fill_ctx {
  em_tensor *out;
  emi_iter it;
  int contiguous;       /* out is one dense run: store by plain indexing */
  size_t esize;
  uint64_t seed, offset;
  int words;            /* per element */
  double a, b;          /* uniform: lo, hi - lo; normal: mean, std */
  int64_t lo;           /* randint */
  uint64_t range;
  void (*make)(const struct fill_ctx *c, const uint32_t *w, int64_t n, void *vals);
  val_kind kind;
} fill_ctx;

static void store_one(char *p, em_dtype dt, val_kind k, const void *vals, int64_t i) {
  switch (k) {
  case VAL_F32: {
    float v = ((const float *)vals)[i];
    if (dt == EM_FLOAT32) *(float *)p = v;
    else if (dt == EM_FLOAT16) *(uint16_t *)p = emi_float_to_half(v);
    else *(uint16_t *)p = emi_float_to_bf16(v);
    break;
  }
  case VAL_F64: *(double *)p = ((const double *)vals)[i]; break;
  case VAL_I64: {
    int64_t v = ((const int64_t *)vals)[i];
    switch (dt) {
    case EM_INT64: *(int64_t *)p = v; break;
    case EM_INT32: *(int32_t *)p = (int32_t)v; break;
    case EM_UINT8: *(uint8_t *)p = (uint8_t)v; break;
    case EM_BOOL: *(uint8_t *)p = v != 0; break;
    default: emi_store_f64(p, dt, (double)v); break;   /* exact: range was checked */
    }
    break;
  }
  }
}

/* Elements [k0, k0 + n) of out, in logical order, from vals. */
static void store_tile(const fill_ctx *c, int64_t k0, int64_t n, const void *vals) {
  em_dtype dt = c->out->dtype;
  if (c->contiguous) {
    char *p = c->it.base[0] + k0 * (int64_t)c->esize;
    const float *f = vals;
    const int64_t *q = vals;
    switch (c->kind * 16 + dt) {     /* the common pairs as plain loops */
    case VAL_F32 * 16 + EM_FLOAT32: memcpy(p, vals, (size_t)n * 4); return;
    case VAL_F64 * 16 + EM_FLOAT64: memcpy(p, vals, (size_t)n * 8); return;
    case VAL_I64 * 16 + EM_INT64: memcpy(p, vals, (size_t)n * 8); return;
    case VAL_F32 * 16 + EM_BFLOAT16:
      for (int64_t i = 0; i < n; i++) ((uint16_t *)p)[i] = emi_float_to_bf16(f[i]);
      return;
    case VAL_I64 * 16 + EM_INT32:
      for (int64_t i = 0; i < n; i++) ((int32_t *)p)[i] = (int32_t)q[i];
      return;
    case VAL_I64 * 16 + EM_FLOAT32:
      for (int64_t i = 0; i < n; i++) ((float *)p)[i] = (float)q[i];
      return;
    case VAL_I64 * 16 + EM_FLOAT64:
      for (int64_t i = 0; i < n; i++) ((double *)p)[i] = (double)q[i];
      return;
    case VAL_I64 * 16 + EM_UINT8: case VAL_I64 * 16 + EM_BOOL:
      for (int64_t i = 0; i < n; i++) ((uint8_t *)p)[i] = (uint8_t)q[i];
      return;
    }
    for (int64_t i = 0; i < n; i++) store_one(p + i * (int64_t)c->esize, dt, c->kind, vals, i);
    return;
  }
  /* Strided: find the row of element k0, then walk along rows. */
  const emi_iter *it = &c->it;
  int64_t row = k0 / it->inner, col = k0 % it->inner;
  int64_t step = it->strides[0][it->ndim - 1];
  char *rp;
  emi_iter_row(it, row, &rp);
  char *p = rp + col * step;
  for (int64_t i = 0; i < n; i++) {
    store_one(p, dt, c->kind, vals, i);
    if (++col == it->inner && i + 1 < n) {
      col = 0;
      emi_iter_row(it, ++row, &rp);
      p = rp;
    } else {
      p += step;
    }
  }
}

static void fill_range(void *ctx, int64_t t0, int64_t t1) {
  const fill_ctx *c = ctx;
  uint32_t words[TILE * 2];    /* w <= 2 words per element */
  _Alignas(64) char vals[TILE * 8];
  int64_t numel = c->out->numel;
  for (int64_t t = t0; t < t1; t++) {
    int64_t k0 = t * TILE, n = numel - k0 < TILE ? numel - k0 : TILE;
    /* words of this tile: [k0*w, (k0+n)*w), whole counters starting at k0*w/4 */
    int64_t nw = n * c->words, nctr = (nw + 3) / 4;
    uint64_t ctr = c->offset + (uint64_t)(k0 * c->words / 4);
    for (int64_t done = 0; done < nctr; done += EMI_PHILOX_RUN) {
      int run = nctr - done < EMI_PHILOX_RUN ? (int)(nctr - done) : EMI_PHILOX_RUN;
      emi_philox_run(c->seed, ctr + (uint64_t)done, run, words + 4 * done);
    }
    c->make(c, words, n, vals);
    store_tile(c, k0, n, vals);
  }
}

static em_status run_fill(em_state *S, fill_ctx *c, int64_t grain_elems) {
  em_tensor *out = c->out;
  emi_iter_init(&c->it, &out, 1);
  c->esize = em_dtype_size(out->dtype);
  c->contiguous = c->it.ndim == 1 && c->it.strides[0][0] == (int64_t)c->esize;
  int64_t ntiles = (out->numel + TILE - 1) / TILE;
  int64_t grain = (grain_elems + TILE - 1) / TILE;
  emi_parallel_for(S, ntiles, grain, fill_range, c);
  return EM_OK;
}

/* -- Value makers: n values from the tile's words --------------------------------- */

/* 24 bits -> [0, 1) in float32, 53 bits -> [0, 1) in float64. */
static inline float u24(uint32_t x) { return (float)(x >> 8) * 0x1p-24f; }
static inline double u53(uint32_t hi, uint32_t lo) {
  return (double)((((uint64_t)hi << 32) | lo) >> 11) * 0x1p-53;
}

/* Scaling can round lo + (hi-lo)*u up to hi; keep the range half-open. */
static void make_uniform_f32(const fill_ctx *c, const uint32_t *w, int64_t n, void *vals) {
  float *v = vals, lo = (float)c->a, span = (float)c->b, hi = (float)(c->a + c->b);
  float top = nextafterf(hi, -INFINITY);
  for (int64_t i = 0; i < n; i++) {
    float x = lo + span * u24(w[i]);
    v[i] = x < hi ? x : (span > 0 ? top : lo);
  }
}

/* float16/bfloat16: the same float32 value, rounded to the dtype here so that the
** rounding can be kept below hi too (stores of already-rounded values are exact). */
static float round_to(float x, em_dtype dt) {
  return dt == EM_FLOAT16 ? emi_half_to_float(emi_float_to_half(x))
                          : emi_bf16_to_float(emi_float_to_bf16(x));
}

/* The largest value of dt (float16 or bfloat16) below hi, as a float. */
static float below(float hi, em_dtype dt) {
  uint16_t h = dt == EM_FLOAT16 ? emi_float_to_half(hi) : emi_float_to_bf16(hi);
  float r = dt == EM_FLOAT16 ? emi_half_to_float(h) : emi_bf16_to_float(h);
  if (r >= hi) {
    if (r == 0) h = 0x8001;                /* below 0: the smallest negative */
    else if (h & 0x8000) h++;              /* negative: larger magnitude */
    else h--;
    r = dt == EM_FLOAT16 ? emi_half_to_float(h) : emi_bf16_to_float(h);
  }
  return r;
}

static void make_uniform_half(const fill_ctx *c, const uint32_t *w, int64_t n, void *vals) {
  em_dtype dt = c->out->dtype;
  float *v = vals, lo = (float)c->a, span = (float)c->b, hi = (float)(c->a + c->b);
  float top = span > 0 ? below(hi, dt) : round_to(lo, dt);
  for (int64_t i = 0; i < n; i++) {
    float x = round_to(lo + span * u24(w[i]), dt);
    v[i] = x < hi ? x : top;
  }
}

static void make_uniform_f64(const fill_ctx *c, const uint32_t *w, int64_t n, void *vals) {
  double *v = vals, lo = c->a, span = c->b, hi = c->a + c->b, top = nextafter(hi, -INFINITY);
  for (int64_t i = 0; i < n; i++) {
    double x = lo + span * u53(w[2 * i], w[2 * i + 1]);
    v[i] = x < hi ? x : (span > 0 ? top : lo);
  }
}

/* Box-Muller in float32, written so that the loop vectorises: libm's logf and
** sincosf are scalar calls and would cost three times the rest of the fill.
**
** log_u: log of u in (0, 1]: u = 2^e * m with m in [sqrt(1/2), sqrt(2)), and
** log m = 2 atanh(s) = 2s (1 + s^2/3 + s^4/5 + ...), s = (m-1)/(m+1), |s| < 0.172;
** five terms leave a relative error near 1e-9, below float rounding.
** sincos_turns: sin and cos of 2*pi*t for t in [0, 1). t is reduced to the
** nearest quarter turn q/4 exactly (t has at most 24 significant bits), the rest
** x = 2*pi*(t - q/4) lies in [-pi/4, pi/4] where short Taylor series are accurate
** to float precision, and the quadrant q rotates the pair. */
static inline float log_u(float u) {
  union { float f; uint32_t i; } b = {u};
  int32_t e = (int32_t)(b.i >> 23) - 127;
  b.i = (b.i & 0x7fffffu) | 0x3f800000u;          /* m in [1, 2) */
  float m = b.f;
  if (m > 1.41421356f) { m *= 0.5f; e += 1; }
  float s = (m - 1.0f) / (m + 1.0f), z = s * s;
  float p = 1.0f + z * (1.0f / 3 + z * (1.0f / 5 + z * (1.0f / 7 + z * (1.0f / 9))));
  return (float)e * 0.693145751953125f + ((float)e * 1.428606765330187e-6f + 2.0f * s * p);
}

/* sqrt of x >= 0 as x / sqrt(x) from Newton steps on 1/sqrt(x) (each squares the
** relative error: 3.4e-2 from the exponent-halving guess, then 1.7e-3, 4.6e-6,
** 3e-11). sqrtf would do, but its errno path is a branch that stops the loop from
** vectorising under the project's flags. */
static inline float sqrt_pos(float x) {
  union { float f; uint32_t i; } b = {x};
  b.i = 0x5f3759dfu - (b.i >> 1);
  float y = b.f, h = 0.5f * x;
  y = y * (1.5f - h * y * y);
  y = y * (1.5f - h * y * y);
  y = y * (1.5f - h * y * y);
  return x * y;
}

static inline void sincos_turns(float t, float *sn, float *cs) {
  float q = nearbyintf(t * 4.0f);                  /* 0..4 */
  float x = (t - q * 0.25f) * 6.2831853071795864f, x2 = x * x;
  float sx = x * (1.0f + x2 * (-1.0f / 6 + x2 * (1.0f / 120 + x2 * (-1.0f / 5040 +
                                                               x2 * (1.0f / 362880)))));
  float cx = 1.0f + x2 * (-0.5f + x2 * (1.0f / 24 + x2 * (-1.0f / 720 + x2 * (1.0f / 40320 +
                                                               x2 * (-1.0f / 3628800)))));
  int k = (int)q & 3;
  float s1 = (k & 1) ? cx : sx, c1 = (k & 1) ? sx : cx;  /* quarter turn: swap */
  *sn = (k & 2) ? -s1 : s1;                        /* half turn: negate both */
  *cs = ((k + 1) & 2) ? -c1 : c1;                  /* cos negative in q = 1, 2 */
}

/* u1 in (0, 1] so that log never sees 0. The tile buffer has room past n, so an
** odd last element may compute its unused partner. */
static void make_normal_f32(const fill_ctx *c, const uint32_t *w, int64_t n, void *vals) {
  float *v = vals, mean = (float)c->a, sd = (float)c->b;
  for (int64_t m = 0; m < (n + 1) / 2; m++) {
    float u1 = (float)((w[2 * m] >> 8) + 1) * 0x1p-24f, u2 = u24(w[2 * m + 1]);
    float r = sd * sqrt_pos(-2.0f * log_u(u1)), sn, cs;
    sincos_turns(u2, &sn, &cs);
    v[2 * m] = mean + r * cs;
    v[2 * m + 1] = mean + r * sn;
  }
}

static void make_normal_f64(const fill_ctx *c, const uint32_t *w, int64_t n, void *vals) {
  double *v = vals, mean = c->a, sd = c->b;
  for (int64_t i = 0; i < n; i += 2) {
    double u1 = (double)(((((uint64_t)w[2 * i] << 32) | w[2 * i + 1]) >> 11) + 1) * 0x1p-53;
    double u2 = u53(w[2 * i + 2], w[2 * i + 3]);
    double r = sqrt(-2.0 * log(u1)), th = 6.283185307179586477 * u2;
    double s = sin(th), co = cos(th);
    v[i] = mean + sd * r * co;
    v[i + 1] = mean + sd * r * s;    /* room past n: see make_normal_f32 */
  }
}

/* Lemire's multiply-shift maps a w-word value onto [0, range) without a division;
** its bias is below range / 2^32 (or / 2^64), the same order as modulo's. */
static void make_randint32(const fill_ctx *c, const uint32_t *w, int64_t n, void *vals) {
  int64_t *v = vals;
  uint64_t range = c->range;
  for (int64_t i = 0; i < n; i++)
    v[i] = c->lo + (int64_t)(((uint64_t)w[i] * range) >> 32);
}

static void make_randint64(const fill_ctx *c, const uint32_t *w, int64_t n, void *vals) {
  int64_t *v = vals;
  for (int64_t i = 0; i < n; i++) {
    uint64_t x = ((uint64_t)w[2 * i] << 32) | w[2 * i + 1];
    v[i] = (int64_t)((uint64_t)c->lo + (uint64_t)(((unsigned __int128)x * c->range) >> 64));
  }
}

/* -- Entries ------------------------------------------------------------------------ */

em_status emi_cpu_uniform(emi_device *dev, em_tensor *out, uint64_t seed, uint64_t offset,
                          double lo, double hi) {
  em_state *S = dev->S;
  fill_ctx c = {.out = out, .seed = seed, .offset = offset, .a = lo, .b = hi - lo,
                .words = emi_rng_words(out->dtype)};
  c.kind = out->dtype == EM_FLOAT64 ? VAL_F64 : VAL_F32;
  c.make = out->dtype == EM_FLOAT64 ? make_uniform_f64
           : out->dtype == EM_FLOAT32 ? make_uniform_f32 : make_uniform_half;
  return run_fill(S, &c, 32768);
}

em_status emi_cpu_normal(emi_device *dev, em_tensor *out, uint64_t seed, uint64_t offset,
                         double mean, double std) {
  em_state *S = dev->S;
  fill_ctx c = {.out = out, .seed = seed, .offset = offset, .a = mean, .b = std,
                .words = emi_rng_words(out->dtype)};
  if (out->dtype == EM_FLOAT64) { c.make = make_normal_f64; c.kind = VAL_F64; }
  else { c.make = make_normal_f32; c.kind = VAL_F32; }
  return run_fill(S, &c, 8192);
}

em_status emi_cpu_randint(emi_device *dev, em_tensor *out, uint64_t seed, uint64_t offset,
                          int64_t lo, int64_t hi) {
  em_state *S = dev->S;
  uint64_t range = (uint64_t)hi - (uint64_t)lo;
  fill_ctx c = {.out = out, .seed = seed, .offset = offset, .lo = lo, .range = range,
                .words = emi_rng_randint_words(range), .kind = VAL_I64};
  c.make = c.words == 1 ? make_randint32 : make_randint64;
  return run_fill(S, &c, 32768);
}

/* -- arange: out[i] = start + i*step, out contiguous ------------------------------- */

typedef struct arange_ctx { em_tensor *out; double start, step; } arange_ctx;

static void arange_range(void *ctx, int64_t b, int64_t e) {
  const arange_ctx *c = ctx;
  char *base = em_tensor_data(c->out);
  em_dtype dt = c->out->dtype;
  switch (dt) {
  case EM_FLOAT32: {
    float *p = (float *)base;
    for (int64_t i = b; i < e; i++) p[i] = (float)(c->start + (double)i * c->step);
    break;
  }
  case EM_FLOAT64: {
    double *p = (double *)base;
    for (int64_t i = b; i < e; i++) p[i] = c->start + (double)i * c->step;
    break;
  }
  case EM_INT64: {
    /* integer arithmetic: exact beyond 2^53 */
    int64_t *p = (int64_t *)base, s = (int64_t)c->start, d = (int64_t)c->step;
    for (int64_t i = b; i < e; i++) p[i] = s + i * d;
    break;
  }
  case EM_INT32: {
    int32_t *p = (int32_t *)base;
    int64_t s = (int64_t)c->start, d = (int64_t)c->step;
    for (int64_t i = b; i < e; i++) p[i] = (int32_t)(s + i * d);
    break;
  }
  default: {
    size_t es = em_dtype_size(dt);
    for (int64_t i = b; i < e; i++)
      emi_store_f64(base + i * (int64_t)es, dt, c->start + (double)i * c->step);
  }
  }
}

em_status emi_cpu_arange(emi_device *dev, em_tensor *out, double start, double step) {
  em_state *S = dev->S;
  arange_ctx c = {out, start, step};
  emi_parallel_for(S, out->numel, 65536, arange_range, &c);
  return EM_OK;
}

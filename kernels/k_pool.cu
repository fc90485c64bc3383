/*
** k_pool.cu -- the CUDA backend's pooling kernels: max, average and adaptive
** average, forward and backward, NCHW or channels last (NHWC), in float32,
** float64, float16 and bfloat16. The device code, one source for nvcc and the
** grid emulator (device.h); the launchers are k_pool.c.
**
** Results equal the CPU's (core/cpu/pool.c, pool_nhwc.c, pool_lowp.c) bit for
** bit, in both layouts:
**   - half types are loaded and stored through dtype_dev.h and computed in
**     float32, as the CPU's widen-compute-round fallback does;
**   - forward kernels give each thread one output: the same window walk, the
**     first maximum wins and a NaN is taken, the same divisors;
**   - the average backwards are gathers: each thread owns one input element and
**     adds the gradients of the windows covering it in ascending (oh, ow) order,
**     starting from zero -- exactly the sequence of additions the CPU's scatter
**     (outputs in order, each added over its window) makes to that element, with
**     no atomics and one store, so a half gradient is rounded once;
**   - the max backward cannot gather (its entry has no window geometry, and
**     indices may point anywhere in the plane), so each thread owns one plane
**     and scatters in output order, as the CPU; the half types scatter into a
**     float32 gradient that k_pool.c rounds once.
** Indices are plane positions h*W + w (plus the index base) in both layouts.
*/
#include "k_pool_args.h"
#include "device.h"
#include "dtype_dev.h"

/* -- Element types: storage and the type computed in ------------------------------- */

/* Tags naming a storage type; pld / pst load and store one element as the type
** computed in (P::acc): float for the float types, double for float64. */
struct P32 { typedef float acc; };
struct P64 { typedef double acc; };
struct P16 { typedef float acc; };
struct PB16 { typedef float acc; };

EMK_DEVICE float pld(P32, const void *p, int64_t i) { return ((const float *)p)[i]; }
EMK_DEVICE void pst(P32, void *p, int64_t i, float v) { ((float *)p)[i] = v; }
EMK_DEVICE double pld(P64, const void *p, int64_t i) { return ((const double *)p)[i]; }
EMK_DEVICE void pst(P64, void *p, int64_t i, double v) { ((double *)p)[i] = v; }
EMK_DEVICE float pld(P16, const void *p, int64_t i) {
  return emk_half_to_float(((const uint16_t *)p)[i]);
}
EMK_DEVICE void pst(P16, void *p, int64_t i, float v) {
  ((uint16_t *)p)[i] = emk_float_to_half(v);
}
EMK_DEVICE float pld(PB16, const void *p, int64_t i) {
  return emk_bf16_to_float(((const uint16_t *)p)[i]);
}
EMK_DEVICE void pst(PB16, void *p, int64_t i, float v) {
  ((uint16_t *)p)[i] = emk_float_to_bf16(v);
}

/* -- Indexing ------------------------------------------------------------------------- */

/* Work item i of an (N, C, R, Q) grid as (n, c, r, q): channel fastest when nhwc. */
EMK_DEVICE void pool_split(const pool_args *A, int64_t i, int64_t R, int64_t Q, int64_t *n,
                           int64_t *c, int64_t *r, int64_t *q) {
  if (A->nhwc) {
    *c = i % A->C;
    i /= A->C;
    *q = i % Q;
    i /= Q;
    *r = i % R;
    *n = i / R;
  } else {
    *q = i % Q;
    i /= Q;
    *r = i % R;
    i /= R;
    *c = i % A->C;
    *n = i / A->C;
  }
}

EMK_DEVICE int64_t at(const int64_t *s, int64_t n, int64_t c, int64_t h, int64_t w) {
  return n * s[0] + c * s[1] + h * s[2] + w * s[3];
}

EMK_DEVICE int64_t ada_lo(int64_t o, int64_t in, int64_t out) { return (o * in) / out; }
EMK_DEVICE int64_t ada_hi(int64_t o, int64_t in, int64_t out) {
  return ((o + 1) * in + out - 1) / out;
}

/* The window of output (oh, ow) clipped to the input, and 1 / its divisor (the
** CPU's avg_window). */
template <typename A>
EMK_DEVICE A avg_inv(const pool_args *q, int64_t oh, int64_t ow, int64_t *h0, int64_t *h1,
                     int64_t *w0, int64_t *w1) {
  int64_t hs = oh * q->sH - q->pH, ws = ow * q->sW - q->pW, he = hs + q->kH, we = ws + q->kW;
  if (he > q->H + q->pH) he = q->H + q->pH;
  if (we > q->W + q->pW) we = q->W + q->pW;
  int64_t padded = (he - hs) * (we - ws);
  *h0 = hs < 0 ? 0 : hs;
  *w0 = ws < 0 ? 0 : ws;
  *h1 = he > q->H ? q->H : he;
  *w1 = we > q->W ? q->W : we;
  int64_t n = q->include_pad ? padded : (*h1 - *h0) * (*w1 - *w0);
  return n > 0 ? (A)1 / (A)n : (A)0;
}

/* The outputs o in [0, out) whose window [o*s - p, o*s - p + k) holds i. */
EMK_DEVICE void covering(int64_t i, int64_t k, int64_t s, int64_t p, int64_t out,
                         int64_t *lo, int64_t *hi) {
  int64_t num = i + p - k + 1;
  *lo = num <= 0 ? 0 : (num + s - 1) / s;
  *hi = (i + p) / s + 1;
  if (*hi > out) *hi = out;
}

/* -- Kernels -------------------------------------------------------------------------- */

#define GRID_LOOP(i, total)                                                              \
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x, step_ =               \
       (int64_t)gridDim.x * blockDim.x; i < (total); i += step_)

/* one output each: the first maximum wins; a NaN is taken, then only a later one */
template <typename P>
EMK_DEVICE void pool_max(const pool_args *A) {
  typedef typename P::acc T;
  GRID_LOOP(i, A->total) {
    int64_t n, c, oh, ow;
    pool_split(A, i, A->OH, A->OW, &n, &c, &oh, &ow);
    int64_t h0 = oh * A->sH - A->pH, w0 = ow * A->sW - A->pW, bi = -1;
    T best = (T)-INFINITY;
    for (int64_t kh = 0; kh < A->kH; kh++) {
      int64_t ih = h0 + kh * A->dH;
      if (ih < 0 || ih >= A->H) continue;
      for (int64_t kw = 0; kw < A->kW; kw++) {
        int64_t iw = w0 + kw * A->dW;
        if (iw < 0 || iw >= A->W) continue;
        T v = pld(P(), A->x, at(A->xs, n, c, ih, iw));
        if (bi < 0 || v > best || v != v) {
          best = v;
          bi = ih * A->W + iw;
        }
      }
    }
    pst(P(), A->y, at(A->ys, n, c, oh, ow), best);
    A->ind[at(A->is, n, c, oh, ow)] = (bi < 0 ? 0 : bi) + A->base;
  }
}

/* one plane each: zeros, then every output's gradient added at its index in
** output order; PG reads gy, PX writes gx (float32 for the half types) */
template <typename PG, typename PX>
EMK_DEVICE void pool_max_bwd(const pool_args *A) {
  int64_t HW = A->H * A->W;
  GRID_LOOP(p, A->total) {
    int64_t n = p / A->C, c = p % A->C;
    for (int64_t h = 0; h < A->H; h++)
      for (int64_t w = 0; w < A->W; w++) pst(PX(), A->y, at(A->xs, n, c, h, w), 0);
    for (int64_t oh = 0; oh < A->OH; oh++)
      for (int64_t ow = 0; ow < A->OW; ow++) {
        int64_t k = A->cind[at(A->is, n, c, oh, ow)] - A->base;
        if (k < 0 || k >= HW) continue;          /* the entry checked the range */
        int64_t o = at(A->xs, n, c, k / A->W, k % A->W);
        typename PX::acc v = pld(PG(), A->x, at(A->ys, n, c, oh, ow));
        pst(PX(), A->y, o, pld(PX(), A->y, o) + v);
      }
  }
}

template <typename P>
EMK_DEVICE void pool_avg(const pool_args *A) {
  typedef typename P::acc T;
  GRID_LOOP(i, A->total) {
    int64_t n, c, oh, ow, h0, h1, w0, w1;
    pool_split(A, i, A->OH, A->OW, &n, &c, &oh, &ow);
    T inv = avg_inv<T>(A, oh, ow, &h0, &h1, &w0, &w1), acc = 0;
    for (int64_t ih = h0; ih < h1; ih++)
      for (int64_t iw = w0; iw < w1; iw++) acc += pld(P(), A->x, at(A->xs, n, c, ih, iw));
    pst(P(), A->y, at(A->ys, n, c, oh, ow), acc * inv);
  }
}

/* one input element each, gathering the windows that cover it (see the top) */
template <typename P>
EMK_DEVICE void pool_avg_bwd(const pool_args *A) {
  typedef typename P::acc T;
  GRID_LOOP(i, A->total) {
    int64_t n, c, h, w, oh0, oh1, ow0, ow1;
    pool_split(A, i, A->H, A->W, &n, &c, &h, &w);
    covering(h, A->kH, A->sH, A->pH, A->OH, &oh0, &oh1);
    covering(w, A->kW, A->sW, A->pW, A->OW, &ow0, &ow1);
    T acc = 0;
    for (int64_t oh = oh0; oh < oh1; oh++)
      for (int64_t ow = ow0; ow < ow1; ow++) {
        int64_t h0, h1, w0, w1;
        T inv = avg_inv<T>(A, oh, ow, &h0, &h1, &w0, &w1);
        if (h < h0 || h >= h1 || w < w0 || w >= w1) continue;
        acc += pld(P(), A->x, at(A->ys, n, c, oh, ow)) * inv;
      }
    pst(P(), A->y, at(A->xs, n, c, h, w), acc);
  }
}

template <typename P>
EMK_DEVICE void pool_ada(const pool_args *A) {
  typedef typename P::acc T;
  GRID_LOOP(i, A->total) {
    int64_t n, c, oh, ow;
    pool_split(A, i, A->OH, A->OW, &n, &c, &oh, &ow);
    int64_t h0 = ada_lo(oh, A->H, A->OH), h1 = ada_hi(oh, A->H, A->OH);
    int64_t w0 = ada_lo(ow, A->W, A->OW), w1 = ada_hi(ow, A->W, A->OW);
    T acc = 0;
    for (int64_t ih = h0; ih < h1; ih++)
      for (int64_t iw = w0; iw < w1; iw++) acc += pld(P(), A->x, at(A->xs, n, c, ih, iw));
    pst(P(), A->y, at(A->ys, n, c, oh, ow), acc / (T)((h1 - h0) * (w1 - w0)));
  }
}

/* The adaptive outputs o whose window holds i: a superset, checked by the caller. */
EMK_DEVICE void ada_covering(int64_t i, int64_t in, int64_t out, int64_t *lo, int64_t *hi) {
  *lo = (i * out) / in - 1;
  if (*lo < 0) *lo = 0;
  *hi = ((i + 1) * out + in - 1) / in + 1;
  if (*hi > out) *hi = out;
}

template <typename P>
EMK_DEVICE void pool_ada_bwd(const pool_args *A) {
  typedef typename P::acc T;
  GRID_LOOP(i, A->total) {
    int64_t n, c, h, w, oh0, oh1, ow0, ow1;
    pool_split(A, i, A->H, A->W, &n, &c, &h, &w);
    ada_covering(h, A->H, A->OH, &oh0, &oh1);
    ada_covering(w, A->W, A->OW, &ow0, &ow1);
    T acc = 0;
    for (int64_t oh = oh0; oh < oh1; oh++) {
      int64_t h0 = ada_lo(oh, A->H, A->OH), h1 = ada_hi(oh, A->H, A->OH);
      if (h < h0 || h >= h1) continue;
      for (int64_t ow = ow0; ow < ow1; ow++) {
        int64_t w0 = ada_lo(ow, A->W, A->OW), w1 = ada_hi(ow, A->W, A->OW);
        if (w < w0 || w >= w1) continue;
        acc += pld(P(), A->x, at(A->ys, n, c, oh, ow)) / (T)((h1 - h0) * (w1 - w0));
      }
    }
    pst(P(), A->y, at(A->xs, n, c, h, w), acc);
  }
}

/* The kernels, named in full: the real runtime finds each by its name in the fatbin. */
#define POOL_KERNELS(name, fn)                                        \
  EMK_KERNEL(name##_f32, pool_args) { fn<P32>(&a); }                  \
  EMK_KERNEL(name##_f64, pool_args) { fn<P64>(&a); }                  \
  EMK_KERNEL(name##_f16, pool_args) { fn<P16>(&a); }                  \
  EMK_KERNEL(name##_bf16, pool_args) { fn<PB16>(&a); }
POOL_KERNELS(k_pool_max, pool_max)
POOL_KERNELS(k_pool_avg, pool_avg)
POOL_KERNELS(k_pool_avg_bwd, pool_avg_bwd)
POOL_KERNELS(k_pool_ada, pool_ada)
POOL_KERNELS(k_pool_ada_bwd, pool_ada_bwd)
EMK_KERNEL(k_pool_max_bwd_f32, pool_args) { pool_max_bwd<P32, P32>(&a); }
EMK_KERNEL(k_pool_max_bwd_f64, pool_args) { pool_max_bwd<P64, P64>(&a); }
EMK_KERNEL(k_pool_max_bwd_f16, pool_args) { pool_max_bwd<P16, P32>(&a); }
EMK_KERNEL(k_pool_max_bwd_bf16, pool_args) { pool_max_bwd<PB16, P32>(&a); }

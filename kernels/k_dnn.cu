/*
** k_dnn.cu -- the CUDA backend's own nn kernels: max / average / adaptive-average
** pooling and their backwards, and evaluation-mode batch norm and its backward
** (convolutions and training batch norm go to the runtime: k_dnn.c). The device
** code, one source for nvcc and the grid emulator (device.h); the launchers are
** k_dnn.c.
**
** Forward kernels give each thread one output element; the backward kernels give
** each thread one plane (one channel for batch norm) and walk it in the CPU's
** order (core/cpu/pool.c, normalize.c), with no atomics: results equal the CPU's
** bit for bit and are deterministic. Each kernel is a float32 and a float64
** instance of one template, named in full (k_dnn_maxpool_f32, ...); batch norm's
** apply and evaluation backward also have float16 / bfloat16 instances (_f16,
** _bf16) that keep float32 parameters.
*/
#include "k_dnn_args.h"
#include "device.h"
#include "dtype_dev.h"
#include <math.h>

/* == Kernels ============================================================================ */

EMK_DEVICE int64_t ada_lo(int64_t o, int64_t in, int64_t out) { return (o * in) / out; }
EMK_DEVICE int64_t ada_hi(int64_t o, int64_t in, int64_t out) {
  return ((o + 1) * in + out - 1) / out;
}

/* The kernels' bodies for T float or double, as the CPU's pool.c and normalize.c
** compute. */
template <typename T>
EMK_DEVICE T avg_inv(const pool_args *q, int64_t oh, int64_t ow, int64_t *h0, int64_t *h1,
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
  return n > 0 ? (T)1 / (T)n : (T)0;
}

/* one output each: the first maximum wins; a NaN is taken, then only a later one */
template <typename T>
EMK_DEVICE void dnn_maxpool(const pool_args *A) {
  int64_t step = (int64_t)gridDim.x * blockDim.x;
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < A->total; i += step) {
    int64_t ow = i % A->OW, oh = (i / A->OW) % A->OH, p = i / A->OW / A->OH;
    const T *x = (const T *)A->x + p * A->H * A->W;
    int64_t h0 = oh * A->sH - A->pH, w0 = ow * A->sW - A->pW, bi = -1;
    T best = (T)-INFINITY;
    for (int64_t kh = 0; kh < A->kH; kh++) {
      int64_t ih = h0 + kh * A->dH;
      if (ih < 0 || ih >= A->H) continue;
      for (int64_t kw = 0; kw < A->kW; kw++) {
        int64_t iw = w0 + kw * A->dW;
        if (iw < 0 || iw >= A->W) continue;
        T v = x[ih * A->W + iw];
        if (bi < 0 || v > best || v != v) {
          best = v;
          bi = ih * A->W + iw;
        }
      }
    }
    ((T *)A->y)[i] = best;
    A->ind[i] = (bi < 0 ? 0 : bi) + A->base;
  }
}

/* one plane each: zeros, then every output's gradient added at its index in order */
template <typename T>
EMK_DEVICE void dnn_maxpool_bwd(const pool_args *A) {
  int64_t step = (int64_t)gridDim.x * blockDim.x, HW = A->H * A->W, L = A->OH * A->OW;
  for (int64_t p = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; p < A->total; p += step) {
    T *gx = (T *)A->y + p * HW;
    const T *gy = (const T *)A->x + p * L;
    const int64_t *ind = A->cind + p * L;
    for (int64_t i = 0; i < HW; i++) gx[i] = 0;
    for (int64_t l = 0; l < L; l++) {
      int64_t k = ind[l] - A->base;
      if (k >= 0 && k < HW) gx[k] += gy[l];      /* the entry checked the range */
    }
  }
}

template <typename T>
EMK_DEVICE void dnn_avgpool(const pool_args *A) {
  int64_t step = (int64_t)gridDim.x * blockDim.x;
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < A->total; i += step) {
    int64_t ow = i % A->OW, oh = (i / A->OW) % A->OH, p = i / A->OW / A->OH, h0, h1, w0, w1;
    const T *x = (const T *)A->x + p * A->H * A->W;
    T inv = avg_inv<T>(A, oh, ow, &h0, &h1, &w0, &w1), acc = 0;
    for (int64_t ih = h0; ih < h1; ih++)
      for (int64_t iw = w0; iw < w1; iw++) acc += x[ih * A->W + iw];
    ((T *)A->y)[i] = acc * inv;
  }
}

template <typename T>
EMK_DEVICE void dnn_avgpool_bwd(const pool_args *A) {
  int64_t step = (int64_t)gridDim.x * blockDim.x;
  for (int64_t p = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; p < A->total; p += step) {
    T *gx = (T *)A->y + p * A->H * A->W;
    const T *gy = (const T *)A->x + p * A->OH * A->OW;
    for (int64_t i = 0; i < A->H * A->W; i++) gx[i] = 0;
    for (int64_t oh = 0; oh < A->OH; oh++)
      for (int64_t ow = 0; ow < A->OW; ow++) {
        int64_t h0, h1, w0, w1;
        T v = gy[oh * A->OW + ow] * avg_inv<T>(A, oh, ow, &h0, &h1, &w0, &w1);
        for (int64_t ih = h0; ih < h1; ih++)
          for (int64_t iw = w0; iw < w1; iw++) gx[ih * A->W + iw] += v;
      }
  }
}

template <typename T>
EMK_DEVICE void dnn_adapool(const pool_args *A) {
  int64_t step = (int64_t)gridDim.x * blockDim.x;
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < A->total; i += step) {
    int64_t ow = i % A->OW, oh = (i / A->OW) % A->OH, p = i / A->OW / A->OH;
    int64_t h0 = ada_lo(oh, A->H, A->OH), h1 = ada_hi(oh, A->H, A->OH);
    int64_t w0 = ada_lo(ow, A->W, A->OW), w1 = ada_hi(ow, A->W, A->OW);
    const T *x = (const T *)A->x + p * A->H * A->W;
    T acc = 0;
    for (int64_t ih = h0; ih < h1; ih++)
      for (int64_t iw = w0; iw < w1; iw++) acc += x[ih * A->W + iw];
    ((T *)A->y)[i] = acc / (T)((h1 - h0) * (w1 - w0));
  }
}

template <typename T>
EMK_DEVICE void dnn_adapool_bwd(const pool_args *A) {
  int64_t step = (int64_t)gridDim.x * blockDim.x;
  for (int64_t p = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; p < A->total; p += step) {
    T *gx = (T *)A->y + p * A->H * A->W;
    const T *gy = (const T *)A->x + p * A->OH * A->OW;
    for (int64_t i = 0; i < A->H * A->W; i++) gx[i] = 0;
    for (int64_t oh = 0; oh < A->OH; oh++) {
      int64_t h0 = ada_lo(oh, A->H, A->OH), h1 = ada_hi(oh, A->H, A->OH);
      for (int64_t ow = 0; ow < A->OW; ow++) {
        int64_t w0 = ada_lo(ow, A->W, A->OW), w1 = ada_hi(ow, A->W, A->OW);
        T v = gy[oh * A->OW + ow] / (T)((h1 - h0) * (w1 - w0));
        for (int64_t ih = h0; ih < h1; ih++)
          for (int64_t iw = w0; iw < w1; iw++) gx[ih * A->W + iw] += v;
      }
    }
  }
}

/* evaluation: mean and invstd (C) from the running statistics (any strides) */
template <typename T>
EMK_DEVICE void dnn_bn_eval_stats(const bn_args *A) {
  int64_t c = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= A->C) return;
  double m = (double)((const T *)A->rm)[c * A->rms];
  double v = (double)((const T *)A->rv)[c * A->rvs];
  ((T *)A->mean)[c] = (T)m;
  ((T *)A->invstd)[c] = (T)(1 / sqrt(v + A->eps));
}

/* y = x * sc + sh per (n, c) row, as the CPU's bn_apply */
template <typename T>
EMK_DEVICE void dnn_bn_apply(const bn_args *A) {
  int64_t step = (int64_t)gridDim.x * blockDim.x;
  const T *w = (const T *)A->w, *b = (const T *)A->b;
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < A->total; i += step) {
    int64_t c = (i / A->L) % A->C;
    T sc = ((const T *)A->invstd)[c] * (w ? w[c] : (T)1);
    T sh = (b ? b[c] : (T)0) - ((const T *)A->mean)[c] * sc;
    ((T *)A->y)[i] = ((const T *)A->x)[i] * sc + sh;
  }
}

/* evaluation backward, one channel each in the CPU's order (gx = w*invstd*gy) */
template <typename T>
EMK_DEVICE void dnn_bn_eval_bwd(const bn_args *A) {
  int64_t c = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= A->C) return;
  const T *x = (const T *)A->x, *gy = (const T *)A->gy, *w = (const T *)A->w;
  double m = (double)((const T *)A->mean)[c], is = (double)((const T *)A->invstd)[c];
  double sg = 0, sgx = 0;
  for (int64_t n = 0; n < A->N; n++) {
    const T *r = x + (n * A->C + c) * A->L, *g = gy + (n * A->C + c) * A->L;
    T s0 = 0, s1 = 0;
    for (int64_t l = 0; l < A->L; l++) {
      s0 += g[l];
      s1 += g[l] * (r[l] - (T)m);
    }
    sg += s0;
    sgx += s1;
  }
  if (A->gw) ((T *)A->gw)[c] = (T)(sgx * is);
  if (A->gb) ((T *)A->gb)[c] = (T)sg;
  if (!A->gx) return;
  T k = (T)((w ? (double)w[c] : 1.0) * is);
  for (int64_t n = 0; n < A->N; n++) {
    const T *g = gy + (n * A->C + c) * A->L;
    T *o = (T *)A->gx + (n * A->C + c) * A->L;
    for (int64_t l = 0; l < A->L; l++) o[l] = k * g[l];
  }
}

/* float16 (bf 0) / bfloat16 (bf 1) element i of p, and the store back. A half x
** keeps float32 weight, bias and statistics (the ops layer's rule), so only x, y,
** gy and gx go through these; the arithmetic is the float32 kernels' (the CPU's
** bn_half.c), rounded once per stored element. */
EMK_DEVICE float bn_ld16(const void *p, int64_t i, int bf) {
  uint16_t v = ((const uint16_t *)p)[i];
  return bf ? emk_bf16_to_float(v) : emk_half_to_float(v);
}
EMK_DEVICE void bn_st16(void *p, int64_t i, int bf, float v) {
  ((uint16_t *)p)[i] = bf ? emk_float_to_bf16(v) : emk_float_to_half(v);
}

EMK_DEVICE void dnn_bn_apply_lp(const bn_args *A, int bf) {
  int64_t step = (int64_t)gridDim.x * blockDim.x;
  const float *w = (const float *)A->w, *b = (const float *)A->b;
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < A->total; i += step) {
    int64_t c = (i / A->L) % A->C;
    float sc = ((const float *)A->invstd)[c] * (w ? w[c] : 1.0f);
    float sh = (b ? b[c] : 0.0f) - ((const float *)A->mean)[c] * sc;
    bn_st16(A->y, i, bf, bn_ld16(A->x, i, bf) * sc + sh);
  }
}

EMK_DEVICE void dnn_bn_eval_bwd_lp(const bn_args *A, int bf) {
  int64_t c = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= A->C) return;
  const float *w = (const float *)A->w;
  float m = ((const float *)A->mean)[c];
  double is = (double)((const float *)A->invstd)[c], sg = 0, sgx = 0;
  for (int64_t n = 0; n < A->N; n++) {
    int64_t r = (n * A->C + c) * A->L;
    float s0 = 0, s1 = 0;
    for (int64_t l = 0; l < A->L; l++) {
      float g = bn_ld16(A->gy, r + l, bf);
      s0 += g;
      s1 += g * (bn_ld16(A->x, r + l, bf) - m);
    }
    sg += s0;
    sgx += s1;
  }
  if (A->gw) ((float *)A->gw)[c] = (float)(sgx * is);
  if (A->gb) ((float *)A->gb)[c] = (float)sg;
  if (!A->gx) return;
  float k = (float)((w ? (double)w[c] : 1.0) * is);
  for (int64_t n = 0; n < A->N; n++) {
    int64_t r = (n * A->C + c) * A->L;
    for (int64_t l = 0; l < A->L; l++) bn_st16(A->gx, r + l, bf, k * bn_ld16(A->gy, r + l, bf));
  }
}

/* The kernels, named in full: the real runtime finds each by its name in the fatbin. */
EMK_KERNEL(k_dnn_maxpool_f32, pool_args) { dnn_maxpool<float>(&a); }
EMK_KERNEL(k_dnn_maxpool_f64, pool_args) { dnn_maxpool<double>(&a); }
EMK_KERNEL(k_dnn_maxpool_bwd_f32, pool_args) { dnn_maxpool_bwd<float>(&a); }
EMK_KERNEL(k_dnn_maxpool_bwd_f64, pool_args) { dnn_maxpool_bwd<double>(&a); }
EMK_KERNEL(k_dnn_avgpool_f32, pool_args) { dnn_avgpool<float>(&a); }
EMK_KERNEL(k_dnn_avgpool_f64, pool_args) { dnn_avgpool<double>(&a); }
EMK_KERNEL(k_dnn_avgpool_bwd_f32, pool_args) { dnn_avgpool_bwd<float>(&a); }
EMK_KERNEL(k_dnn_avgpool_bwd_f64, pool_args) { dnn_avgpool_bwd<double>(&a); }
EMK_KERNEL(k_dnn_adapool_f32, pool_args) { dnn_adapool<float>(&a); }
EMK_KERNEL(k_dnn_adapool_f64, pool_args) { dnn_adapool<double>(&a); }
EMK_KERNEL(k_dnn_adapool_bwd_f32, pool_args) { dnn_adapool_bwd<float>(&a); }
EMK_KERNEL(k_dnn_adapool_bwd_f64, pool_args) { dnn_adapool_bwd<double>(&a); }
EMK_KERNEL(k_dnn_bn_eval_stats_f32, bn_args) { dnn_bn_eval_stats<float>(&a); }
EMK_KERNEL(k_dnn_bn_eval_stats_f64, bn_args) { dnn_bn_eval_stats<double>(&a); }
EMK_KERNEL(k_dnn_bn_apply_f32, bn_args) { dnn_bn_apply<float>(&a); }
EMK_KERNEL(k_dnn_bn_apply_f64, bn_args) { dnn_bn_apply<double>(&a); }
EMK_KERNEL(k_dnn_bn_eval_bwd_f32, bn_args) { dnn_bn_eval_bwd<float>(&a); }
EMK_KERNEL(k_dnn_bn_eval_bwd_f64, bn_args) { dnn_bn_eval_bwd<double>(&a); }
EMK_KERNEL(k_dnn_bn_apply_f16, bn_args) { dnn_bn_apply_lp(&a, 0); }
EMK_KERNEL(k_dnn_bn_apply_bf16, bn_args) { dnn_bn_apply_lp(&a, 1); }
EMK_KERNEL(k_dnn_bn_eval_bwd_f16, bn_args) { dnn_bn_eval_bwd_lp(&a, 0); }
EMK_KERNEL(k_dnn_bn_eval_bwd_bf16, bn_args) { dnn_bn_eval_bwd_lp(&a, 1); }

/*
** k_dnn.cu -- the CUDA backend's own batch norm kernels: evaluation mode and its
** backward (convolutions and training batch norm go to the runtime: k_dnn.c;
** pooling is k_pool.cu). The device code, one source for nvcc and the grid
** emulator (device.h); the launchers are k_dnn.c.
**
** The forward kernel gives each thread one element; the backward gives each
** thread one channel and walks it in the CPU's order (core/cpu/normalize.c), with
** no atomics: results equal the CPU's bit for bit and are deterministic. A
** channels-last x (A->nhwc: N*L rows of C) is indexed as such -- element i is of
** channel i % C -- and the backward then sums its channel's column row by row
** straight into double, as the CPU's bn_nhwc.c and bn_half.c do (neighbouring
** threads read neighbouring channels of a row, so the loads coalesce). Each
** kernel is a float32 and a float64 instance of one template, named in full
** (k_dnn_bn_apply_f32, ...); apply and the evaluation backward also have float16 /
** bfloat16 instances (_f16, _bf16) that keep float32 parameters.
*/
#include "k_dnn_args.h"
#include "device.h"
#include "dtype_dev.h"
#include <math.h>

/* == Kernels ============================================================================ */

/* The kernels' bodies for T float or double, as the CPU's normalize.c computes. */

/* The channel of element i of x (N, C, L): NCHW or channels last. */
EMK_DEVICE int64_t bn_chan(const bn_args *A, int64_t i) {
  return A->nhwc ? i % A->C : (i / A->L) % A->C;
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

/* y = x * sc + sh per element, as the CPU's bn_apply (bnh_apply channels last) */
template <typename T>
EMK_DEVICE void dnn_bn_apply(const bn_args *A) {
  int64_t step = (int64_t)gridDim.x * blockDim.x;
  const T *w = (const T *)A->w, *b = (const T *)A->b;
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < A->total; i += step) {
    int64_t c = bn_chan(A, i);
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
  if (A->nhwc) {   /* channel c's column of N*L rows, as bnh_sums and bnh_gx */
    int64_t M = A->N * A->L, C = A->C;
    for (int64_t r = 0; r < M; r++) {
      T g = gy[r * C + c];
      sg += (double)g;
      /* the CPU's rounding: gcc contracts its vectorized sum to an fma (exact
      ** either way for float32, whose product fits a double) */
      sgx = fma((double)g, (double)(x[r * C + c] - (T)m), sgx);
    }
    if (A->gw) ((T *)A->gw)[c] = (T)(sgx * is);
    if (A->gb) ((T *)A->gb)[c] = (T)sg;
    if (!A->gx) return;
    T k = (T)((w ? (double)w[c] : 1.0) * is);
    for (int64_t r = 0; r < M; r++) ((T *)A->gx)[r * C + c] = k * gy[r * C + c];
    return;
  }
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
    int64_t c = bn_chan(A, i);
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
  if (A->nhwc) {   /* channel c's column, as bn_half.c's nhwc_sums and nhwc_gx */
    int64_t M = A->N * A->L, C = A->C;
    for (int64_t r = 0; r < M; r++) {
      float g = bn_ld16(A->gy, r * C + c, bf);
      sg += (double)g;
      sgx += (double)g * (double)(bn_ld16(A->x, r * C + c, bf) - m);
    }
    if (A->gw) ((float *)A->gw)[c] = (float)(sgx * is);
    if (A->gb) ((float *)A->gb)[c] = (float)sg;
    if (!A->gx) return;
    float k = (float)((w ? (double)w[c] : 1.0) * is);
    for (int64_t r = 0; r < M; r++)
      bn_st16(A->gx, r * C + c, bf, k * bn_ld16(A->gy, r * C + c, bf));
    return;
  }
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

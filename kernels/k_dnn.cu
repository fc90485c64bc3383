/*
** k_dnn.cu -- the CUDA backend's own batch norm kernels: evaluation mode and its
** backward (convolutions and training batch norm go to the runtime: k_dnn.c;
** pooling is k_pool.cu). The device code, one source for nvcc and the grid
** emulator (device.h); the launchers are k_dnn.c.
**
** The forward kernel gives each thread one element; the backward gives each
** thread one channel and walks it in the CPU's order (core/cpu/normalize.c), with
** no atomics: results equal the CPU's bit for bit and are deterministic. Each
** kernel is a float32 and a float64 instance of one template, named in full
** (k_dnn_bn_apply_f32, ...).
*/
#include "k_dnn_args.h"
#include "device.h"
#include <math.h>

/* == Kernels ============================================================================ */

/* The kernels' bodies for T float or double, as the CPU's normalize.c computes. */

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

/* The kernels, named in full: the real runtime finds each by its name in the fatbin. */
EMK_KERNEL(k_dnn_bn_eval_stats_f32, bn_args) { dnn_bn_eval_stats<float>(&a); }
EMK_KERNEL(k_dnn_bn_eval_stats_f64, bn_args) { dnn_bn_eval_stats<double>(&a); }
EMK_KERNEL(k_dnn_bn_apply_f32, bn_args) { dnn_bn_apply<float>(&a); }
EMK_KERNEL(k_dnn_bn_apply_f64, bn_args) { dnn_bn_apply<double>(&a); }
EMK_KERNEL(k_dnn_bn_eval_bwd_f32, bn_args) { dnn_bn_eval_bwd<float>(&a); }
EMK_KERNEL(k_dnn_bn_eval_bwd_f64, bn_args) { dnn_bn_eval_bwd<double>(&a); }

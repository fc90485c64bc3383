/*
** k_optim.cu -- multi-tensor optimizer kernels of the CUDA backend: an SGD or
** Adam(W) step over every parameter of a device (one dtype) in ONE launch, and
** clip_grad_norm's two passes -- the total norm, then the scaling -- in one launch
** each. The device code, one source for nvcc and the grid emulator (device.h); the
** launchers are k_optim.c.
**
** The chunk table. A launch covers n tensors of different sizes. The host writes
** one mt_tensor per tensor (its pointers, numel, per-tensor constants and the
** index of its first chunk: tensor i owns chunks [chunk0_i, chunk0_{i+1}), each
** of CHUNK elements, the last one short) into a small buffer, which is copied to
** the device on the compute stream ahead of the kernel (an ordinary
** host-to-device copy, so the table has no size limit and the kernel's argument
** struct stays small). Block b takes chunks b, b + gridDim.x, ... and finds a
** chunk's tensor by binary search over chunk0; its threads stride over the
** chunk. The table's device memory is released right after the launch: the
** caching allocator reuses it only for later work on the same stream.
**
** Same results as the CPU. The element updates are the CPU kernels'
** (core/cpu/optim.c) expression for expression, in the parameter's dtype, with
** the constants rounded the same way (the host computes them in double). gcc
** must not fuse a*b + c into an FMA here or on the CPU (both files turn
** fp-contract off), and nvcc neither: the kernels multiply and add through
** mt_mul / mt_add, which are __fmul_rn / __fadd_rn (never contracted) under nvcc.
** Division and sqrt are IEEE in both (nvcc's defaults -prec-div, -prec-sqrt).
** So float32 and float64 steps are meant to be bit-identical to the CPU's.
**
** The norm. k_mt_norm folds each chunk as core/backend.h's norm_multi prescribes
** (256 lanes, each its strided share in order, then a halving tree in shared
** memory) into partial[chunk]; the last block to finish (an atomic count of
** finished blocks, after a memory fence) folds the partials in chunk order into
** the 0-D output. Everything depends on the sizes only -- never on which block
** finishes first -- so the result is deterministic and equals the CPU's
** (core/cpu/optim.c does the same lanes and tree on the host) for p = 1, 2, inf.
*/
#include "k_optim_args.h"
#include "device.h"
#include "dtype_dev.h"
#include "math_dev.h"

#if !defined(__CUDACC__)
#pragma GCC optimize("fp-contract=off")   /* see "Same results as the CPU" */
#endif

/* Multiply, add and subtract, each rounded on its own (never contracted into an
** FMA): under nvcc the _rn intrinsics, on the host the plain operators (this file
** turns fp-contract off). */
#if defined(__CUDACC__)
EMK_DEVICE float mt_mul(float a, float b) { return __fmul_rn(a, b); }
EMK_DEVICE float mt_add(float a, float b) { return __fadd_rn(a, b); }
EMK_DEVICE float mt_sub(float a, float b) { return __fsub_rn(a, b); }
EMK_DEVICE double mt_mul(double a, double b) { return __dmul_rn(a, b); }
EMK_DEVICE double mt_add(double a, double b) { return __dadd_rn(a, b); }
EMK_DEVICE double mt_sub(double a, double b) { return __dsub_rn(a, b); }
EMK_DEVICE void mt_fence(void) { __threadfence(); }
#else
template <typename T> EMK_DEVICE T mt_mul(T a, T b) { return a * b; }
template <typename T> EMK_DEVICE T mt_add(T a, T b) { return a + b; }
template <typename T> EMK_DEVICE T mt_sub(T a, T b) { return a - b; }
EMK_DEVICE void mt_fence(void) { __atomic_thread_fence(__ATOMIC_SEQ_CST); }
#endif

/* -- Device helpers ------------------------------------------------------------------ */

/* the tensor that owns chunk c: the last one with chunk0 <= c */
EMK_DEVICE const mt_tensor *mt_find(const mt_tensor *tab, int n, int64_t c) {
  int lo = 0, hi = n - 1;
  while (lo < hi) {
    int mid = (lo + hi + 1) / 2;
    if (tab[mid].chunk0 <= c) lo = mid;
    else hi = mid - 1;
  }
  return &tab[lo];
}

/* The element update for T float or double, written as core/cpu/optim.c's
** SGD_KERNEL and ADAM_KERNEL (same operations, same order). h: lr, momentum,
** 1 - dampening, wd, nesterov, has_buf (SGD); beta1, beta2, 1 - beta1, 1 - beta2,
** eps, wd plus decay in p (Adam); scale in h[0] (scale). */
template <typename T>
EMK_DEVICE void mt_elem(const mt_args *a, const mt_tensor *e, int64_t i) {
  T *p = (T *)e->p;
  if (a->kind == MT_SCALE) {
    p[i] = mt_mul(p[i], (T)a->h[0]);
    return;
  }
  const T *g = (const T *)e->g;
  if (a->kind == MT_SGD) {
    const T lr = (T)a->h[0], mom = (T)a->h[1], damp1 = (T)a->h[2], wd = (T)a->h[3];
    T d = mt_add(g[i], mt_mul(wd, p[i]));
    if (a->h[5] == 0) {                    /* no momentum buffer */
      p[i] = mt_sub(p[i], mt_mul(lr, d));
      return;
    }
    T *buf = (T *)e->s1;
    if (e->c0 != 0) {                      /* first step: buf = d */
      buf[i] = d;
      T u = a->h[4] != 0 ? mt_add(d, mt_mul(mom, d)) : d;
      p[i] = mt_sub(p[i], mt_mul(lr, u));
      return;
    }
    T m = mt_add(mt_mul(mom, buf[i]), mt_mul(damp1, d));
    buf[i] = m;
    T u = a->h[4] != 0 ? mt_add(d, mt_mul(mom, m)) : m;
    p[i] = mt_sub(p[i], mt_mul(lr, u));
    return;
  }
  T *m = (T *)e->s1, *v = (T *)e->s2;
  const T b1 = (T)a->h[0], b2 = (T)a->h[1], one_b1 = (T)a->h[2];
  const T one_b2 = (T)a->h[3], eps = (T)a->h[4], wd = (T)a->h[5];
  const T decay = (T)a->p, step = (T)e->c0, bc2 = (T)e->c1;
  T x = mt_mul(p[i], decay);
  T gi = mt_add(g[i], mt_mul(wd, x));
  T mi = mt_add(mt_mul(b1, m[i]), mt_mul(one_b1, gi));
  T vi = mt_add(mt_mul(b2, v[i]), mt_mul(one_b2, mt_mul(gi, gi)));
  m[i] = mi;
  v[i] = vi;
  p[i] = mt_sub(x, mt_mul(step, mi / mt_add(emk_sqrt(vi) / bc2, eps)));
}

/* -- The update kernel: SGD, Adam(W), scale --------------------------------------- */

/* Every chunk of every tensor; threads stride over a chunk (coalesced). */
EMK_KERNEL(k_mt_update, mt_args) {
  for (int64_t c = blockIdx.x; c < a.nchunks; c += gridDim.x) {
    const mt_tensor *e = mt_find(a.tab, a.ntens, c);
    int64_t b = (c - e->chunk0) * CHUNK, end = b + CHUNK < e->n ? b + CHUNK : e->n;
    for (int64_t i = b + threadIdx.x; i < end; i += blockDim.x) {
      if (a.f64) mt_elem<double>(&a, e, i);
      else mt_elem<float>(&a, e, i);
    }
  }
}

/* -- The norm kernel -------------------------------------------------------------- */

EMK_DEVICE double norm_term(int kind, double x, double p) {
  switch (kind) {
  case N_SUMSQ: return mt_mul(x, x);
  case N_SUMPOW: return pow(fabs(x), p);
  default: return fabs(x);
  }
}

/* sums add; the max keeps the larger, and a NaN once seen */
EMK_DEVICE double norm_comb(int kind, double acc, double y) {
  if (kind == N_MAXABS) return (y > acc || y != y) ? y : acc;
  return mt_add(acc, y);
}

/* blockDim.x == LANES: the lane count is part of the order. */
EMK_KERNEL_SYNC(k_mt_norm, mt_args) {
  EMK_SHARED(double, sh, LANES);
  EMK_SHARED(int, last, 1);
  int t = (int)threadIdx.x, kind = a.norm;
  for (int64_t c = blockIdx.x; c < a.nchunks; c += gridDim.x) {
    const mt_tensor *e = mt_find(a.tab, a.ntens, c);
    int64_t b = (c - e->chunk0) * CHUNK, end = b + CHUNK < e->n ? b + CHUNK : e->n;
    double acc = 0;          /* the identity of both: |x| >= 0 */
    for (int64_t i = b + t; i < end; i += LANES) {
      double x = a.f64 ? ((const double *)e->p)[i] : (double)((const float *)e->p)[i];
      acc = norm_comb(kind, acc, norm_term(kind, x, a.p));
    }
    sh[t] = acc;
    EMK_SYNCTHREADS();
    for (int s = LANES / 2; s > 0; s >>= 1) {
      if (t < s) sh[t] = norm_comb(kind, sh[t], sh[t + s]);
      EMK_SYNCTHREADS();
    }
    if (t == 0) a.partial[c] = sh[0];
    EMK_SYNCTHREADS();       /* sh is reused by the next chunk */
  }
  /* The last block to get here folds the partials: each block publishes its
  ** partials (fence) before it counts itself done. */
  if (t == 0) {
    mt_fence();
    last[0] = emk_atomic_add_u32(a.done, 1u) == gridDim.x - 1;
  }
  EMK_SYNCTHREADS();
  if (last[0] && t == 0) {
    mt_fence();
    const volatile double *part = a.partial;
    double tot = 0;
    for (int64_t c = 0; c < a.nchunks; c++) tot = norm_comb(kind, tot, part[c]);
    *a.out = tot;
  }
}

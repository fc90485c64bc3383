/*
** k_optim.c -- multi-tensor optimizer kernels of the CUDA backend: an SGD or
** Adam(W) step over every parameter of a device (one dtype) in ONE launch, and
** clip_grad_norm's two passes -- the total norm, then the scaling -- in one launch
** each. One source for nvcc and the grid emulator (device.h).
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
** MUL/ADD, which are __fmul_rn / __fadd_rn (never contracted) under nvcc.
** Division and sqrt are IEEE in both (nvcc's defaults -prec-div, -prec-sqrt).
** So float32 and float64 steps are meant to be bit-identical to the CPU's.
**
** The norm. k_mt_norm folds each chunk as internal.h's norm_multi prescribes
** (256 lanes, each its strided share in order, then a halving tree in shared
** memory) into partial[chunk]; the last block to finish (an atomic count of
** finished blocks, after a memory fence) folds the partials in chunk order into
** the 0-D output. Everything depends on the sizes only -- never on which block
** finishes first -- so the result is deterministic and equals the CPU's
** (core/cpu/optim.c does the same lanes and tree on the host) for p = 1, 2, inf.
*/
#include "k_optim.h"
#include "device.h"
#include "dtype_dev.h"

#if !defined(__CUDACC__)
#pragma GCC optimize("fp-contract=off")   /* see "Same results as the CPU" */
#endif

/* CHUNK and LANES are part of norm_multi's contract (internal.h, core/cpu/optim.c). */
enum { CHUNK = 4096, LANES = 256, MAX_BLOCKS = 4096 };
enum { MT_SGD, MT_ADAM, MT_SCALE };
enum { N_SUMSQ, N_SUMABS, N_SUMPOW, N_MAXABS };

/* One tensor of a launch (the device table). */
typedef struct mt_tensor {
  char *p;                 /* the parameter (norm, scale: the tensor) */
  const char *g;           /* its gradient */
  char *s1, *s2;           /* state: momentum buffer, or exp_avg and exp_avg_sq */
  int64_t n;               /* numel >= 1 */
  int64_t chunk0;          /* its first chunk */
  double c0, c1;           /* SGD: c0 = first step; Adam: step_size, bc2_sqrt */
} mt_tensor;

typedef struct mt_args {
  const mt_tensor *tab;
  int ntens, kind, f64, norm;
  int64_t nchunks;
  double h[6];             /* hyper-parameters, in the CPU kernels' order */
  double p;                /* norm exponent (N_SUMPOW) */
  double *partial;         /* norm: (nchunks) */
  unsigned *done;          /* norm: finished blocks, 0 at the launch */
  double *out;             /* norm: the 0-D result */
} mt_args;

#if defined(__CUDACC__)
#define FMUL(a, b) __fmul_rn(a, b)
#define FADD(a, b) __fadd_rn(a, b)
#define FSUB(a, b) __fsub_rn(a, b)
#define DMUL(a, b) __dmul_rn(a, b)
#define DADD(a, b) __dadd_rn(a, b)
#define DSUB(a, b) __dsub_rn(a, b)
#define MT_FENCE() __threadfence()
#else
#define FMUL(a, b) ((a) * (b))
#define FADD(a, b) ((a) + (b))
#define FSUB(a, b) ((a) - (b))
#define DMUL(a, b) ((a) * (b))
#define DADD(a, b) ((a) + (b))
#define DSUB(a, b) ((a) - (b))
#define MT_FENCE() __atomic_thread_fence(__ATOMIC_SEQ_CST)
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

/* The element updates, one per dtype, written as core/cpu/optim.c's SGD_KERNEL and
** ADAM_KERNEL (same operations, same order). h: lr, momentum, 1 - dampening, wd,
** nesterov, has_buf (SGD); beta1, beta2, 1 - beta1, 1 - beta2, eps, wd plus decay
** in p (Adam); scale in h[0] (scale). */
#define MT_ELEMENT_FN(NAME, T, MUL, ADD, SUB, SQRT)                                   \
  EMK_DEVICE void NAME(const mt_args *a, const mt_tensor *e, int64_t i) {             \
    T *p = (T *)e->p;                                                                 \
    if (a->kind == MT_SCALE) {                                                        \
      p[i] = MUL(p[i], (T)a->h[0]);                                                   \
      return;                                                                         \
    }                                                                                 \
    const T *g = (const T *)e->g;                                                     \
    if (a->kind == MT_SGD) {                                                          \
      const T lr = (T)a->h[0], mom = (T)a->h[1], damp1 = (T)a->h[2], wd = (T)a->h[3]; \
      T d = ADD(g[i], MUL(wd, p[i]));                                                 \
      if (a->h[5] == 0) {                    /* no momentum buffer */                 \
        p[i] = SUB(p[i], MUL(lr, d));                                                 \
        return;                                                                       \
      }                                                                               \
      T *buf = (T *)e->s1;                                                            \
      if (e->c0 != 0) {                      /* first step: buf = d */                \
        buf[i] = d;                                                                   \
        T u = a->h[4] != 0 ? ADD(d, MUL(mom, d)) : d;                                 \
        p[i] = SUB(p[i], MUL(lr, u));                                                 \
        return;                                                                       \
      }                                                                               \
      T m = ADD(MUL(mom, buf[i]), MUL(damp1, d));                                     \
      buf[i] = m;                                                                     \
      T u = a->h[4] != 0 ? ADD(d, MUL(mom, m)) : m;                                   \
      p[i] = SUB(p[i], MUL(lr, u));                                                   \
      return;                                                                         \
    }                                                                                 \
    T *m = (T *)e->s1, *v = (T *)e->s2;                                               \
    const T b1 = (T)a->h[0], b2 = (T)a->h[1], one_b1 = (T)a->h[2];                    \
    const T one_b2 = (T)a->h[3], eps = (T)a->h[4], wd = (T)a->h[5];                   \
    const T decay = (T)a->p, step = (T)e->c0, bc2 = (T)e->c1;                         \
    T x = MUL(p[i], decay);                                                           \
    T gi = ADD(g[i], MUL(wd, x));                                                     \
    T mi = ADD(MUL(b1, m[i]), MUL(one_b1, gi));                                       \
    T vi = ADD(MUL(b2, v[i]), MUL(one_b2, MUL(gi, gi)));                              \
    m[i] = mi;                                                                        \
    v[i] = vi;                                                                        \
    p[i] = SUB(x, MUL(step, mi / ADD(SQRT(vi) / bc2, eps)));                          \
  }
MT_ELEMENT_FN(mt_elem_f32, float, FMUL, FADD, FSUB, sqrtf)
MT_ELEMENT_FN(mt_elem_f64, double, DMUL, DADD, DSUB, sqrt)

/* -- The update kernel: SGD, Adam(W), scale --------------------------------------- */

/* Every chunk of every tensor; threads stride over a chunk (coalesced). */
EMK_KERNEL(k_mt_update, mt_args) {
  for (int64_t c = blockIdx.x; c < a.nchunks; c += gridDim.x) {
    const mt_tensor *e = mt_find(a.tab, a.ntens, c);
    int64_t b = (c - e->chunk0) * CHUNK, end = b + CHUNK < e->n ? b + CHUNK : e->n;
    for (int64_t i = b + threadIdx.x; i < end; i += blockDim.x) {
      if (a.f64) mt_elem_f64(&a, e, i);
      else mt_elem_f32(&a, e, i);
    }
  }
}

/* -- The norm kernel -------------------------------------------------------------- */

EMK_DEVICE double norm_term(int kind, double x, double p) {
  switch (kind) {
  case N_SUMSQ: return DMUL(x, x);
  case N_SUMPOW: return pow(fabs(x), p);
  default: return fabs(x);
  }
}

/* sums add; the max keeps the larger, and a NaN once seen */
EMK_DEVICE double norm_comb(int kind, double acc, double y) {
  if (kind == N_MAXABS) return (y > acc || y != y) ? y : acc;
  return DADD(acc, y);
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
    MT_FENCE();
    last[0] = emk_atomic_add_u32(a.done, 1u) == gridDim.x - 1;
  }
  EMK_SYNCTHREADS();
  if (last[0] && t == 0) {
    MT_FENCE();
    const volatile double *part = a.partial;
    double tot = 0;
    for (int64_t c = 0; c < a.nchunks; c++) tot = norm_comb(kind, tot, part[c]);
    *a.out = tot;
  }
}

/* -- Host side ----------------------------------------------------------------------- */

/* The table of n tensors (t0 and the parallel lists t1..t3, c0, c1, each may be
** NULL) on d's device: built in a CPU tensor, copied by the backend's copy (which
** snapshots it and orders the copy on the compute stream). extra: bytes after the
** table, zeroed (the norm's counter). *chunks: the launch's chunk count. */
static em_status mt_table(emi_device *d, const char *op, int n, em_tensor *const *t0,
                          const em_tensor *const *t1, em_tensor *const *t2,
                          em_tensor *const *t3, const double *c0, const double *c1,
                          const int *first, size_t extra, em_tensor **dev,
                          int64_t *chunks) {
  em_state *S = d->S;
  int64_t bytes = (int64_t)(sizeof(mt_tensor) * (size_t)n + extra);
  em_tensor *h = NULL;
  em_status st = emi_tensor_new(S, op, &bytes, 1, EM_UINT8, EM_CPU, &h);
  if (st) return st;
  mt_tensor *tab = (mt_tensor *)em_tensor_data(h);
  memset(tab, 0, (size_t)bytes);
  int64_t nc = 0;
  for (int i = 0; i < n; i++) {
    mt_tensor *e = &tab[i];
    e->p = (char *)em_tensor_data(t0[i]);
    e->g = t1 ? (const char *)em_tensor_data(t1[i]) : NULL;
    e->s1 = t2 ? (char *)em_tensor_data(t2[i]) : NULL;
    e->s2 = t3 ? (char *)em_tensor_data(t3[i]) : NULL;
    e->n = t0[i]->numel;
    e->chunk0 = nc;
    e->c0 = first ? (double)(first[i] != 0) : c0 ? c0[i] : 0;
    e->c1 = c1 ? c1[i] : 0;
    nc += (e->n + CHUNK - 1) / CHUNK;
  }
  *chunks = nc;
  if (!(st = emi_tensor_new(S, op, &bytes, 1, EM_UINT8, d->index, dev)) &&
      (st = d->backend->copy(d, *dev, h))) {
    em_tensor_release(*dev);
    *dev = NULL;
  }
  em_tensor_release(h);
  return st;
}

static em_status mt_launch(emi_device *d, const char *op, const emk_kernel *k, mt_args *a) {
  emk_cuda_device *cd = emk_dev(d);
  emk_runtime *rt = cd->cuda->rt;
  int64_t blocks = a->nchunks < MAX_BLOCKS ? a->nchunks : MAX_BLOCKS;
  emk_dim3 grid = {(unsigned)blocks, 1, 1}, block = {LANES, 1, 1};
  em_status st = rt->ops->launch(rt, k, grid, block, 0, cd->compute, a, sizeof *a);
  return st ? emk_error(d, op, st) : EM_OK;
}

/* Table, launch, release: the update kernel over n tensors. */
static em_status mt_update(emi_device *d, const char *op, mt_args *a, int n,
                           em_tensor *const *t0, const em_tensor *const *t1,
                           em_tensor *const *t2, em_tensor *const *t3, const double *c0,
                           const double *c1, const int *first) {
  em_tensor *tab = NULL;
  em_status st = mt_table(d, op, n, t0, t1, t2, t3, c0, c1, first, 0, &tab, &a->nchunks);
  if (st) return st;
  a->tab = (const mt_tensor *)em_tensor_data(tab);
  a->ntens = n;
  a->f64 = t0[0]->dtype == EM_FLOAT64;
  st = mt_launch(d, op, &k_mt_update, a);
  em_tensor_release(tab);   /* reused only by work queued after the kernel */
  return st;
}

em_status emk_sgd_step_multi(emi_device *d, int n, em_tensor *const *p,
                             const em_tensor *const *g, em_tensor *const *buf,
                             const int *first, double lr, double momentum, double dampening,
                             double wd, int nesterov) {
  mt_args a;
  memset(&a, 0, sizeof a);
  a.kind = MT_SGD;
  a.h[0] = lr;
  a.h[1] = momentum;
  a.h[2] = 1.0 - dampening;     /* as the CPU kernel rounds it: in double, then to T */
  a.h[3] = wd;
  a.h[4] = nesterov != 0;
  a.h[5] = buf != NULL;
  return mt_update(d, "sgd_step_multi", &a, n, p, g, buf, NULL, NULL, NULL, first);
}

em_status emk_adam_step_multi(emi_device *d, int n, em_tensor *const *p,
                              const em_tensor *const *g, em_tensor *const *m,
                              em_tensor *const *v, const double *step_size,
                              const double *bc2_sqrt, double beta1, double beta2, double eps,
                              double wd, double decay) {
  mt_args a;
  memset(&a, 0, sizeof a);
  a.kind = MT_ADAM;
  a.h[0] = beta1;
  a.h[1] = beta2;
  a.h[2] = 1.0 - beta1;
  a.h[3] = 1.0 - beta2;
  a.h[4] = eps;
  a.h[5] = wd;
  a.p = decay;
  return mt_update(d, "adam_step_multi", &a, n, p, g, m, v, step_size, bc2_sqrt, NULL);
}

em_status emk_scale_multi(emi_device *d, int n, em_tensor *const *t, double scale) {
  mt_args a;
  memset(&a, 0, sizeof a);
  a.kind = MT_SCALE;
  a.h[0] = scale;
  return mt_update(d, "scale_multi", &a, n, t, NULL, NULL, NULL, NULL, NULL, NULL);
}

em_status emk_norm_multi(emi_device *d, em_tensor *out, int n, const em_tensor *const *t,
                         double p) {
  const char *op = "norm_multi";
  em_state *S = d->S;
  mt_args a;
  memset(&a, 0, sizeof a);
  a.norm = isinf(p) ? N_MAXABS : p == 2 ? N_SUMSQ : p == 1 ? N_SUMABS : N_SUMPOW;
  a.p = p;
  /* the table is read-only here; mt_table takes the tensors as its t0 list */
  em_tensor *tab = NULL, *part = NULL;
  size_t counter = sizeof(double);       /* the done counter, zeroed, after the table */
  em_status st = mt_table(d, op, n, (em_tensor *const *)t, NULL, NULL, NULL, NULL, NULL,
                          NULL, counter, &tab, &a.nchunks);
  if (st) return st;
  if ((st = emi_tensor_new(S, op, &a.nchunks, 1, EM_FLOAT64, d->index, &part))) {
    em_tensor_release(tab);
    return st;
  }
  a.tab = (const mt_tensor *)em_tensor_data(tab);
  a.done = (unsigned *)((char *)em_tensor_data(tab) + sizeof(mt_tensor) * (size_t)n);
  a.partial = (double *)em_tensor_data(part);
  a.out = (double *)em_tensor_data(out);
  a.ntens = n;
  a.f64 = t[0]->dtype == EM_FLOAT64;
  st = mt_launch(d, op, &k_mt_norm, &a);
  em_tensor_release(part);
  em_tensor_release(tab);
  return st;
}

/*
** k_loss.c -- the CUDA backend's losses, forward and backward: cross_entropy
** (fused logsumexp + nll with label smoothing and ignore_index), nll_loss, and
** the pointwise losses (EMI_LOSS_MSE, EMI_LOSS_BCE_LOGITS). One source for nvcc
** and the grid emulator (device.h). Semantics, messages and the order of checks
** follow the CPU backend's core/cpu/nn_loss.c.
**
** Targets. They are copied to the host (a sync) and range-checked there in row
** order before any kernel is queued, so a bad target gives the CPU's message
** naming the same first bad value and no output is written; the host also
** counts the rows that are not ignored (the mean's divisor). The kernels then
** read the targets again from device memory, any int32/int64 stride. The
** targets are N integers next to N*C logits: the sync is the price of the
** CPU's exact errors, paid once per call.
**
** cross_entropy forward: one row per warp (C <= ROW_WARP_MAX) or per block of
** 256 threads (longer rows). The row's threads take elements c = lane,
** lane + tpr, ... and reduce with warp shuffles (a butterfly, so every lane
** holds the same bits) and, for a block, the 8 warp partials added in warp
** order from shared memory: max first, then sum(exp(x - max)) and sum(x)
** (smoothing) in one pass, in double as the CPU. Its first thread writes lse and
** the row's loss. The backward needs no reduction (lse is saved): one thread per
** element computes g * (exp(x - lse) - eps/C) - [c == t] * g * (1 - eps).
**
** Reductions (mean, sum) never use atomics: per-row (or per-block) partials go
** to a double scratch buffer whose layout depends only on the shape, and one
** block adds them in a fixed tree order (k_loss_total), so results are
** bit-identical run to run. The mean divides by the count of rows not ignored
** (0/0 = NaN when all are, as the CPU and PyTorch).
*/
#include "k_loss.h"
#include "device.h"
#include "dtype_dev.h"

enum { THREADS = 256, MAX_BLOCKS = 4096, PW_MAX_BLOCKS = 1024, ROW_WARP_MAX = 1024 };

/* -- Device helpers ------------------------------------------------------------------ */

/* element i of a float32 (f64 = 0) or float64 array, as a double */
EMK_DEVICE double ldx(const char *p, int64_t i, int f64) {
  return f64 ? ((const double *)p)[i] : (double)((const float *)p)[i];
}
EMK_DEVICE void stx(char *p, int64_t i, int f64, double v) {
  if (f64) ((double *)p)[i] = v;
  else ((float *)p)[i] = (float)v;
}
/* target i (int32 or int64, stride ts elements) */
EMK_DEVICE int64_t ldt(const char *p, int64_t i, int64_t ts, int t64) {
  return t64 ? ((const int64_t *)p)[i * ts] : (int64_t)((const int32_t *)p)[i * ts];
}
/* NaN-propagating max, as the CPU's row scan (x > m || isnan(x)) */
EMK_DEVICE double nmax(double a, double b) { return (b > a || b != b) ? b : a; }

/* v combined over the tpr threads of a row (32: one warp; 256: the block), in a
** fixed order; every thread of the row gets the same value. sh holds
** THREADS/32 doubles; only tpr == THREADS reaches the barriers, and then the
** whole block works on one row. */
EMK_DEVICE double row_reduce(double v, double *sh, int tpr, int is_max) {
  for (int o = 16; o > 0; o >>= 1) {
    double u = emk_shfl_xor_sync(EMK_FULL_MASK, v, o);
    v = is_max ? nmax(v, u) : v + u;
  }
  if (tpr == 32) return v;
  if ((threadIdx.x & 31) == 0) sh[threadIdx.x >> 5] = v;
  EMK_SYNCTHREADS();
  v = sh[0];
  for (int w = 1; w < tpr / 32; w++) v = is_max ? nmax(v, sh[w]) : v + sh[w];
  EMK_SYNCTHREADS();             /* sh is reused by the next call */
  return v;
}

/* -- cross_entropy ------------------------------------------------------------------- */

typedef struct ce_args {
  const char *x, *tgt, *gl;   /* x (N, C) contiguous; target (N) stride ts; grad_loss */
  char *loss, *lse, *gx;      /* forward: loss (N) (none) or NULL; lse (N); backward: gx */
  double *rows;               /* forward, mean/sum: per-row losses (N) */
  int64_t N, C, ts, gls, base, ignore;
  int f64, t64, tpr, gl_none;
  double smooth, scale;       /* backward: the factor on grad_loss (1/count for mean) */
} ce_args;

/* x is (N, C), lse (N); loss (N) or rows (N). One row per tpr threads. */
EMK_KERNEL_SYNC(k_ce_fwd, ce_args) {
  EMK_SHARED(double, sh, THREADS / 32);
  int rpb = THREADS / a.tpr, lane = (int)threadIdx.x % a.tpr;
  for (int64_t i = (int64_t)blockIdx.x * rpb + (int)threadIdx.x / a.tpr; i < a.N;
       i += (int64_t)gridDim.x * rpb) {
    const char *r = a.x + i * a.C * (a.f64 ? 8 : 4);
    double m = -INFINITY, s = 0, sx = 0;
    for (int64_t c = lane; c < a.C; c += a.tpr) m = nmax(m, ldx(r, c, a.f64));
    m = row_reduce(m, sh, a.tpr, 1);
    if (m == -INFINITY) m = 0;             /* a row of -inf: avoid -inf - -inf */
    for (int64_t c = lane; c < a.C; c += a.tpr) {
      double v = ldx(r, c, a.f64);
      s += exp(v - m);
      sx += v;
    }
    s = row_reduce(s, sh, a.tpr, 0);
    sx = row_reduce(sx, sh, a.tpr, 0);
    if (lane != 0) continue;
    double lse = m + log(s);
    /* lse is stored in x's dtype, the row loss uses the unrounded one (as the CPU) */
    stx(a.lse, i, a.f64, lse);
    int64_t t = ldt(a.tgt, i, a.ts, a.t64);
    double l = 0;
    if (t != a.ignore) {
      l = (1 - a.smooth) * (lse - ldx(r, t - a.base, a.f64));
      if (a.smooth > 0) l += a.smooth * (lse - sx / (double)a.C);
    }
    if (a.loss) stx(a.loss, i, a.f64, l);
    else a.rows[i] = l;
  }
}

/* gx (N, C): one thread per element; d loss_i / d x_ic = p_c - (1-eps)[c == t] - eps/C. */
EMK_KERNEL(k_ce_bwd, ce_args) {
  int64_t n = a.N * a.C, step = (int64_t)gridDim.x * blockDim.x;
  double off = a.smooth / (double)a.C;
  for (int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; e < n; e += step) {
    int64_t i = e / a.C, c = e - i * a.C, t = ldt(a.tgt, i, a.ts, a.t64);
    if (t == a.ignore) { stx(a.gx, e, a.f64, 0); continue; }
    double g = ldx(a.gl, a.gl_none ? i * a.gls : 0, a.f64) * a.scale;
    double v = g * (exp(ldx(a.x, e, a.f64) - ldx(a.lse, i, a.f64)) - off);
    if (c == t - a.base) v -= g * (1 - a.smooth);
    stx(a.gx, e, a.f64, v);
  }
}

/* -- nll_loss ------------------------------------------------------------------------ */

typedef struct nll_args {
  const char *x, *tgt, *gl;   /* forward: logp (N, C) strides s0, s1; backward: grad_loss */
  char *loss, *gx;            /* forward: loss (N) (none) or NULL; backward: gx (N, C) */
  double *rows;
  int64_t N, C, s0, s1, ts, gls, base, ignore;
  int f64, t64, gl_none;
  double scale;
} nll_args;

/* one thread per row: -logp[i, t_i], or 0 when ignored */
EMK_KERNEL(k_nll_fwd, nll_args) {
  int64_t step = (int64_t)gridDim.x * blockDim.x;
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < a.N; i += step) {
    int64_t t = ldt(a.tgt, i, a.ts, a.t64);
    double l = t == a.ignore ? 0 : -ldx(a.x, i * a.s0 + (t - a.base) * a.s1, a.f64);
    if (a.loss) stx(a.loss, i, a.f64, l);
    else a.rows[i] = l;
  }
}

/* gx (N, C) contiguous, one thread per element: -g_i at the target, else 0 */
EMK_KERNEL(k_nll_bwd, nll_args) {
  int64_t n = a.N * a.C, step = (int64_t)gridDim.x * blockDim.x;
  for (int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; e < n; e += step) {
    int64_t i = e / a.C, c = e - i * a.C, t = ldt(a.tgt, i, a.ts, a.t64);
    double v = 0;
    if (t != a.ignore && c == t - a.base)
      v = -(ldx(a.gl, a.gl_none ? i * a.gls : 0, a.f64) * a.scale);
    stx(a.gx, e, a.f64, v);
  }
}

/* -- Pointwise losses ------------------------------------------------------------------ */

typedef struct pw_args {
  const char *x, *y, *gl;     /* x, y (n) contiguous; backward: grad_loss (n) or 1 */
  char *out;                  /* forward (none): loss (n); backward: gx (n) */
  double *part;               /* forward (mean/sum): one partial sum per block */
  int64_t n;
  int kind, f64, gl_none;
  double div;                 /* backward, mean/sum: n or 1 (the CPU divides) */
} pw_args;

/* the loss of one element, in double (bce on logits in its stable form) */
EMK_DEVICE double pw_loss(int kind, double x, double y) {
  if (kind == EMI_LOSS_MSE) return (x - y) * (x - y);
  return (x > 0 ? x : 0) - x * y + log1p(exp(-fabs(x)));
}

/* loss (n), one element per thread */
EMK_KERNEL(k_pw_fwd, pw_args) {
  int64_t step = (int64_t)gridDim.x * blockDim.x;
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < a.n; i += step)
    stx(a.out, i, a.f64, pw_loss(a.kind, ldx(a.x, i, a.f64), ldx(a.y, i, a.f64)));
}

/* part[block]: the block's elements (a grid-stride share per thread, in order)
** added in a fixed tree; the grid depends only on n */
EMK_KERNEL_SYNC(k_pw_sum, pw_args) {
  EMK_SHARED(double, sh, THREADS);
  int t = (int)threadIdx.x;
  double s = 0;
  int64_t step = (int64_t)gridDim.x * blockDim.x;
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + t; i < a.n; i += step)
    s += pw_loss(a.kind, ldx(a.x, i, a.f64), ldx(a.y, i, a.f64));
  sh[t] = s;
  EMK_SYNCTHREADS();
  for (int h = THREADS / 2; h > 0; h >>= 1) {
    if (t < h) sh[t] += sh[t + h];
    EMK_SYNCTHREADS();
  }
  if (t == 0) a.part[blockIdx.x] = sh[0];
}

/* gx (n): grad_loss times the loss's derivative */
EMK_KERNEL(k_pw_bwd, pw_args) {
  int64_t step = (int64_t)gridDim.x * blockDim.x;
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < a.n; i += step) {
    double x = ldx(a.x, i, a.f64), y = ldx(a.y, i, a.f64), d;
    double s = a.gl_none ? ldx(a.gl, i, a.f64) : ldx(a.gl, 0, a.f64) / a.div;
    if (a.kind == EMI_LOSS_MSE) d = 2 * (x - y);
    else {
      double e = exp(-fabs(x));
      d = (x >= 0 ? 1 / (1 + e) : e / (1 + e)) - y;   /* sigmoid(x) - y, stable */
    }
    stx(a.out, i, a.f64, s * d);
  }
}

/* -- The total: one block adds n doubles in a fixed order ------------------------------ */

typedef struct total_args {
  const double *part;
  char *out;                  /* 0-d, float32 or float64 */
  int64_t n;
  double div;                 /* mean: the count (may be 0: 0/0 = NaN); sum: 1 */
  int f64;
} total_args;

EMK_KERNEL_SYNC(k_loss_total, total_args) {
  EMK_SHARED(double, sh, THREADS);
  int t = (int)threadIdx.x;
  double s = 0;
  for (int64_t i = t; i < a.n; i += THREADS) s += a.part[i];
  sh[t] = s;
  EMK_SYNCTHREADS();
  for (int h = THREADS / 2; h > 0; h >>= 1) {
    if (t < h) sh[t] += sh[t + h];
    EMK_SYNCTHREADS();
  }
  if (t == 0) stx(a.out, 0, a.f64, a.div == 1 ? sh[0] : sh[0] / a.div);
}

/* -- Host side ----------------------------------------------------------------------- */

static em_status launch(emi_device *d, const char *op, const emk_kernel *k, int64_t blocks,
                        void *args, size_t size) {
  emk_cuda_device *cd = emk_dev(d);
  emk_runtime *rt = cd->cuda->rt;
  if (blocks > MAX_BLOCKS) blocks = MAX_BLOCKS;
  if (blocks < 1) blocks = 1;
  emk_dim3 grid = {(unsigned)blocks, 1, 1}, block = {THREADS, 1, 1};
  em_status st = rt->ops->launch(rt, k, grid, block, 0, cd->compute, args, size);
  return st ? emk_error(d, op, st) : EM_OK;
}

static int64_t blocks_for(int64_t n) { return (n + THREADS - 1) / THREADS; }

/* Copies target (N) to the host and checks it as the CPU's read_targets:
** in row order, a value equal to ignore_index skipped, the first one outside
** [index_base, index_base + C) an error. *count: the rows not ignored. */
static em_status check_targets(emi_device *d, const char *op, const em_tensor *target,
                               int64_t N, int64_t C, int index_base, int64_t ignore_index,
                               int64_t *count) {
  em_state *S = d->S;
  em_tensor *h = NULL;
  *count = 0;
  if (N == 0) return EM_OK;
  em_status st = emi_tensor_new(S, op, target->sizes, target->ndim, target->dtype, EM_CPU, &h);
  if (st || (st = emk_cuda_backend.copy(d, h, target))) {
    em_tensor_release(h);
    return st;
  }
  const char *p = (const char *)em_tensor_data(h);
  for (int64_t i = 0; i < N && !st; i++) {
    int64_t v = h->dtype == EM_INT64 ? ((const int64_t *)p)[i] : ((const int32_t *)p)[i];
    if (v == ignore_index) continue;
    if (v - index_base < 0 || v - index_base >= C)
      st = emi_error(S, EM_ERR_INDEX, "%s: target %lld is out of range for %lld classes "
                     "(index_base %d)", op, (long long)v, (long long)C, index_base);
    (*count)++;
  }
  em_tensor_release(h);
  return st;
}

/* A fresh float64 scratch vector of n (>= 1) on d. Released by the caller right
** after queueing: the allocator reuses it only for later work on the stream. */
static em_status scratch(emi_device *d, const char *op, int64_t n, em_tensor **t) {
  if (n < 1) n = 1;
  return emi_tensor_new(d->S, op, &n, 1, EM_FLOAT64, d->index, t);
}

/* the 0-d loss from n partials in part: their sum, divided by div */
static em_status total(emi_device *d, const char *op, em_tensor *loss, const em_tensor *part,
                       int64_t n, double div) {
  total_args ta = {(const double *)em_tensor_data(part), (char *)em_tensor_data(loss), n, div,
                   loss->dtype == EM_FLOAT64};
  emk_cuda_device *cd = emk_dev(d);
  emk_runtime *rt = cd->cuda->rt;
  emk_dim3 grid = {1, 1, 1}, block = {THREADS, 1, 1};
  em_status st = rt->ops->launch(rt, &k_loss_total, grid, block, 0, cd->compute, &ta, sizeof ta);
  return st ? emk_error(d, op, st) : EM_OK;
}

/* grad_loss's element stride for reduction none (1-D, any strides) */
static int64_t grad_stride(const em_tensor *g) { return g->ndim ? g->strides[0] : 0; }

em_status emk_cross_entropy(emi_device *d, em_tensor *loss, em_tensor *lse, const em_tensor *x,
                            const em_tensor *target, int index_base, int64_t ignore_index,
                            double label_smoothing, int reduction) {
  const char *op = "cross_entropy";
  int64_t N = x->sizes[0], C = x->sizes[1], count;
  em_tensor *rows = NULL;
  em_status st = check_targets(d, op, target, N, C, index_base, ignore_index, &count);
  if (st) return st;
  int none = reduction == EM_REDUCE_NONE;
  if (!none && (st = scratch(d, op, N, &rows))) return st;
  ce_args a;
  memset(&a, 0, sizeof a);
  a.x = (const char *)em_tensor_data(x);
  a.tgt = (const char *)em_tensor_data(target);
  a.lse = (char *)em_tensor_data(lse);
  a.loss = none ? (char *)em_tensor_data(loss) : NULL;
  a.rows = rows ? (double *)em_tensor_data(rows) : NULL;
  a.N = N;
  a.C = C;
  a.ts = target->strides[0];
  a.base = index_base;
  a.ignore = ignore_index;
  a.f64 = x->dtype == EM_FLOAT64;
  a.t64 = target->dtype == EM_INT64;
  a.tpr = C <= ROW_WARP_MAX ? 32 : THREADS;   /* by shape only: deterministic */
  a.smooth = label_smoothing;
  if (N > 0)
    st = launch(d, op, &k_ce_fwd, (N * a.tpr + THREADS - 1) / THREADS, &a, sizeof a);
  if (!st && !none)
    st = total(d, op, loss, rows, N, reduction == EM_REDUCE_MEAN ? (double)count : 1);
  em_tensor_release(rows);
  return st;
}

em_status emk_cross_entropy_backward(emi_device *d, em_tensor *gx, const em_tensor *grad_loss,
                                     const em_tensor *x, const em_tensor *target,
                                     const em_tensor *lse, int index_base,
                                     int64_t ignore_index, double label_smoothing,
                                     int reduction) {
  const char *op = "cross_entropy_backward";
  int64_t N = x->sizes[0], C = x->sizes[1], count;
  em_status st = check_targets(d, op, target, N, C, index_base, ignore_index, &count);
  if (st || N * C == 0) return st;
  ce_args a;
  memset(&a, 0, sizeof a);
  a.x = (const char *)em_tensor_data(x);
  a.tgt = (const char *)em_tensor_data(target);
  a.gl = (const char *)em_tensor_data(grad_loss);
  a.lse = (char *)em_tensor_data(lse);
  a.gx = (char *)em_tensor_data(gx);
  a.N = N;
  a.C = C;
  a.ts = target->strides[0];
  a.gls = grad_stride(grad_loss);
  a.base = index_base;
  a.ignore = ignore_index;
  a.f64 = x->dtype == EM_FLOAT64;
  a.t64 = target->dtype == EM_INT64;
  a.gl_none = reduction == EM_REDUCE_NONE;
  a.smooth = label_smoothing;
  a.scale = reduction == EM_REDUCE_MEAN ? 1.0 / (double)count : 1.0;
  return launch(d, op, &k_ce_bwd, blocks_for(N * C), &a, sizeof a);
}

em_status emk_nll_loss(emi_device *d, em_tensor *loss, const em_tensor *logp,
                       const em_tensor *target, int index_base, int64_t ignore_index,
                       int reduction) {
  const char *op = "nll_loss";
  int64_t N = logp->sizes[0], C = logp->sizes[1], count;
  em_tensor *rows = NULL;
  em_status st = check_targets(d, op, target, N, C, index_base, ignore_index, &count);
  if (st) return st;
  int none = reduction == EM_REDUCE_NONE;
  if (!none && (st = scratch(d, op, N, &rows))) return st;
  nll_args a;
  memset(&a, 0, sizeof a);
  a.x = (const char *)em_tensor_data(logp);
  a.tgt = (const char *)em_tensor_data(target);
  a.loss = none ? (char *)em_tensor_data(loss) : NULL;
  a.rows = rows ? (double *)em_tensor_data(rows) : NULL;
  a.N = N;
  a.C = C;
  a.s0 = logp->strides[0];
  a.s1 = logp->strides[1];
  a.ts = target->strides[0];
  a.base = index_base;
  a.ignore = ignore_index;
  a.f64 = logp->dtype == EM_FLOAT64;
  a.t64 = target->dtype == EM_INT64;
  if (N > 0) st = launch(d, op, &k_nll_fwd, blocks_for(N), &a, sizeof a);
  if (!st && !none)
    st = total(d, op, loss, rows, N, reduction == EM_REDUCE_MEAN ? (double)count : 1);
  em_tensor_release(rows);
  return st;
}

em_status emk_nll_loss_backward(emi_device *d, em_tensor *gx, const em_tensor *grad_loss,
                                const em_tensor *target, int index_base, int64_t ignore_index,
                                int reduction) {
  const char *op = "nll_loss_backward";
  int64_t N = gx->sizes[0], C = gx->sizes[1], count;
  em_status st = check_targets(d, op, target, N, C, index_base, ignore_index, &count);
  if (st || N * C == 0) return st;
  nll_args a;
  memset(&a, 0, sizeof a);
  a.tgt = (const char *)em_tensor_data(target);
  a.gl = (const char *)em_tensor_data(grad_loss);
  a.gx = (char *)em_tensor_data(gx);
  a.N = N;
  a.C = C;
  a.ts = target->strides[0];
  a.gls = grad_stride(grad_loss);
  a.base = index_base;
  a.ignore = ignore_index;
  a.f64 = gx->dtype == EM_FLOAT64;
  a.t64 = target->dtype == EM_INT64;
  a.gl_none = reduction == EM_REDUCE_NONE;
  a.scale = reduction == EM_REDUCE_MEAN ? 1.0 / (double)count : 1.0;
  return launch(d, op, &k_nll_bwd, blocks_for(N * C), &a, sizeof a);
}

em_status emk_pointwise_loss(emi_device *d, int kind, em_tensor *loss, const em_tensor *x,
                             const em_tensor *y, int reduction) {
  const char *op = kind == EMI_LOSS_MSE ? "mse_loss" : "bce_with_logits";
  pw_args a;
  memset(&a, 0, sizeof a);
  a.x = (const char *)em_tensor_data(x);
  a.y = (const char *)em_tensor_data(y);
  a.n = x->numel;
  a.kind = kind;
  a.f64 = x->dtype == EM_FLOAT64;
  if (reduction == EM_REDUCE_NONE) {
    if (a.n == 0) return EM_OK;
    a.out = (char *)em_tensor_data(loss);
    return launch(d, op, &k_pw_fwd, blocks_for(a.n), &a, sizeof a);
  }
  int64_t nb = blocks_for(a.n);
  if (nb > PW_MAX_BLOCKS) nb = PW_MAX_BLOCKS;
  em_tensor *part = NULL;
  em_status st = scratch(d, op, nb, &part);
  if (st) return st;
  a.part = (double *)em_tensor_data(part);
  if (a.n > 0) st = launch(d, op, &k_pw_sum, nb, &a, sizeof a);
  if (!st)
    st = total(d, op, loss, part, a.n > 0 ? nb : 0,
               reduction == EM_REDUCE_MEAN ? (double)a.n : 1);
  em_tensor_release(part);
  return st;
}

em_status emk_pointwise_loss_backward(emi_device *d, int kind, em_tensor *gx,
                                      const em_tensor *grad_loss, const em_tensor *x,
                                      const em_tensor *y, int reduction) {
  const char *op = kind == EMI_LOSS_MSE ? "mse_loss_backward" : "bce_with_logits_backward";
  pw_args a;
  memset(&a, 0, sizeof a);
  a.x = (const char *)em_tensor_data(x);
  a.y = (const char *)em_tensor_data(y);
  a.gl = (const char *)em_tensor_data(grad_loss);
  a.out = (char *)em_tensor_data(gx);
  a.n = x->numel;
  a.kind = kind;
  a.f64 = x->dtype == EM_FLOAT64;
  a.gl_none = reduction == EM_REDUCE_NONE;
  a.div = reduction == EM_REDUCE_MEAN ? (double)a.n : 1.0;
  if (a.n == 0) return EM_OK;
  return launch(d, op, &k_pw_bwd, blocks_for(a.n), &a, sizeof a);
}

/*
** k_loss.cu -- the CUDA backend's losses, forward and backward: cross_entropy
** (fused logsumexp + nll with label smoothing and ignore_index), nll_loss, and the
** pointwise losses (EMI_LOSS_MSE, EMI_LOSS_BCE_LOGITS). The device code, one source
** for nvcc and the grid emulator (device.h); the launchers are k_loss.c. Semantics,
** messages and the order of checks follow the CPU backend's core/cpu/nn_loss.c.
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
#include "k_loss_args.h"
#include "device.h"
#include "dtype_dev.h"

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

/* the loss of one element, in double (bce on logits in its stable form) */
EMK_DEVICE double pw_loss(int mse, double x, double y) {
  if (mse) return (x - y) * (x - y);
  return (x > 0 ? x : 0) - x * y + log1p(exp(-fabs(x)));
}

/* loss (n), one element per thread */
EMK_KERNEL(k_pw_fwd, pw_args) {
  int64_t step = (int64_t)gridDim.x * blockDim.x;
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < a.n; i += step)
    stx(a.out, i, a.f64, pw_loss(a.mse, ldx(a.x, i, a.f64), ldx(a.y, i, a.f64)));
}

/* part[block]: the block's elements (a grid-stride share per thread, in order)
** added in a fixed tree; the grid depends only on n */
EMK_KERNEL_SYNC(k_pw_sum, pw_args) {
  EMK_SHARED(double, sh, THREADS);
  int t = (int)threadIdx.x;
  double s = 0;
  int64_t step = (int64_t)gridDim.x * blockDim.x;
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + t; i < a.n; i += step)
    s += pw_loss(a.mse, ldx(a.x, i, a.f64), ldx(a.y, i, a.f64));
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
    if (a.mse) d = 2 * (x - y);
    else {
      double e = exp(-fabs(x));
      d = (x >= 0 ? 1 / (1 + e) : e / (1 + e)) - y;   /* sigmoid(x) - y, stable */
    }
    stx(a.out, i, a.f64, s * d);
  }
}

/* -- The total: one block adds n doubles in a fixed order ------------------------------ */

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

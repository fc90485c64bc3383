/*
** k_reduce.c -- the CUDA backend's reductions: reduce (sum, mean, prod, amax,
** amin, logsumexp, any, all), var/std, p-norms, max/min with indices along a dim
** (arg_reduce) and softmax / log_softmax. One source for nvcc and the grid
** emulator (device.h).
**
** Geometry. The input is seen as K outputs of R reduced elements each: kept dims
** (sizes, input strides, output strides) and reduced dims (sizes, input strides),
** size-1 dims dropped. Output k's offsets come from unravelling k over the kept
** dims, element r's from unravelling r over the reduced dims, so any strides
** (transposed, expanded with stride 0) and any mask work without a copy.
**
** Work. One block per output (blocks stride over the outputs when there are more
** than MAX_BLOCKS); its T threads (32..256, a power of two: the smallest >= R)
** each fold a strided share r = t, t + T, ... in increasing order, then the
** block combines the T partials with a shared-memory tree in a fixed order.
** Many short reductions (K >= 2048, R <= 32) and column reductions (the
** innermost kept dim contiguous in the input, no reduced dim contiguous) run
** one thread per output instead, folding its elements in order (k_reduce_seq,
** k_arg_seq, k_softmax_seq: a block of 32 threads with its barriers for a row of
** 3 -- 10 classes, say -- leaves most threads idle and, on the grid emulator,
** costs ~5 us a row).
** The choice depends on the shape only, and there are no atomics: the same
** shapes give bit-identical results run to run.
**
** Semantics follow the CPU backend (core/cpu/reduce.c): floating inputs
** accumulate in double (sums, products, exp sums, norms), integer sums and
** products in int64 with two's complement wrap-around, integer max/min in int64;
** max/min propagate NaN; any/all count non-zeros (NaN counts). var = mean first,
** then the sum of squared deviations / max(R - correction, 0); logsumexp = max
** first (0 when it is infinite), then log(sum(exp(x - max))) + max. Both passes
** run in the same block. arg_reduce: the first NaN, else the first extreme
** (ties across threads go to the lower index). softmax: max, sum of exp(x - max)
** in double, then each element, per row along dim.
*/
#include "k_reduce.h"
#include "device.h"
#include "dtype_dev.h"

enum { RT = 256, MAX_BLOCKS = 4096,
       SEQ_MIN_K = 2048, SEQ_MAX_R = 32 };   /* see seq_shape */

/* accumulation kinds: K_* double, KI_* int64 */
enum { K_SUM, K_PROD, K_MAX, K_MIN, K_CNTNZ, K_SUMABS, K_SUMSQ, K_SUMPOW, K_MAXABS,
       K_MINABS, K_SUMEXP, K_SUMSQDEV, KI_SUM, KI_PROD, KI_MAX, KI_MIN };
enum { F_ID, F_MEAN, F_SQRT, F_ROOT, F_ANY, F_ALL, F_VAR, F_STD, F_LSE };

typedef struct rgeom {
  const char *in;
  char *out;
  int idt, odt, iesz, oesz;
  int nk, nr;
  int64_t K, R;
  int64_t ksz[EM_MAX_DIMS], kst[EM_MAX_DIMS], kost[EM_MAX_DIMS];  /* in elements */
  int64_t rsz[EM_MAX_DIMS], rst[EM_MAX_DIMS], rost[EM_MAX_DIMS];
} rgeom;

typedef struct red_args {
  rgeom g;
  int kind, fin;
  double p, arg;          /* norm exponent; F_ROOT: 1/p, F_VAR/F_STD: correction */
} red_args;

typedef struct arg_args {
  rgeom g;
  char *vout;             /* values, or NULL */
  int64_t vkost[EM_MAX_DIMS];
  int want_max, i64;
  int64_t base;
} arg_args;

typedef struct smax_args {
  rgeom g;
  int log;
} smax_args;

/* -- Device helpers ------------------------------------------------------------------ */

/* input offset of output k (elements); *oo gets its output offset */
EMK_DEVICE int64_t kept_off(const rgeom *g, const int64_t *kost, int64_t k, int64_t *oo) {
  int64_t io = 0, o = 0;
  for (int d = g->nk - 1; d >= 0; d--) {
    int64_t i = k % g->ksz[d];
    k /= g->ksz[d];
    io += i * g->kst[d];
    o += i * kost[d];
  }
  *oo = o;
  return io;
}

EMK_DEVICE int64_t red_off(const rgeom *g, int64_t r, int64_t *oo) {
  int64_t io = 0, o = 0;
  for (int d = g->nr - 1; d >= 0; d--) {
    int64_t i = r % g->rsz[d];
    r /= g->rsz[d];
    io += i * g->rst[d];
    o += i * g->rost[d];
  }
  if (oo) *oo = o;
  return io;
}

EMK_DEVICE double kind_id(int kind) {
  switch (kind) {
  case K_PROD: return 1.0;
  case K_MAX: return -INFINITY;
  case K_MIN: case K_MINABS: return INFINITY;
  default: return 0.0;
  }
}

EMK_DEVICE double comb_f(int kind, double a, double b) {
  switch (kind) {
  case K_PROD: return a * b;
  case K_MAX: case K_MAXABS: return ((b > a) || (b != b)) ? b : a;
  case K_MIN: case K_MINABS: return ((b < a) || (b != b)) ? b : a;
  default: return a + b;
  }
}

EMK_DEVICE double expr_f(int kind, double x, double s, double p) {
  switch (kind) {
  case K_SUMABS: case K_MAXABS: case K_MINABS: return fabs(x);
  case K_SUMSQ: return x * x;
  case K_SUMPOW: return pow(fabs(x), p);
  case K_CNTNZ: return x != 0 ? 1.0 : 0.0;
  case K_SUMEXP: return exp(x - s);
  case K_SUMSQDEV: return (x - s) * (x - s);
  default: return x;
  }
}

EMK_DEVICE int64_t comb_i(int kind, int64_t a, int64_t b) {
  switch (kind) {
  case KI_PROD: return (int64_t)((uint64_t)a * (uint64_t)b);
  case KI_MAX: return b > a ? b : a;
  case KI_MIN: return b < a ? b : a;
  default: return (int64_t)((uint64_t)a + (uint64_t)b);
  }
}

EMK_DEVICE int64_t kind_id_i(int kind) {
  switch (kind) {
  case KI_PROD: return 1;
  case KI_MAX: return INT64_MIN;
  case KI_MIN: return INT64_MAX;
  default: return 0;
  }
}

EMK_DEVICE void store_i64(char *p, int dt, int64_t v) {
  switch (dt) {
  case EM_INT32: *(int32_t *)p = (int32_t)v; break;
  case EM_UINT8: *(uint8_t *)p = (uint8_t)v; break;
  case EM_BOOL: *(uint8_t *)p = v != 0; break;
  case EM_INT64: *(int64_t *)p = v; break;
  default: emk_store_f64(p, dt, (double)v); break;
  }
}

/* The block's partials combined in a fixed tree order; every thread gets the
** result. Called by every thread of the block. */
EMK_DEVICE double block_f(double *sh, double v, int kind) {
  int t = (int)threadIdx.x;
  sh[t] = v;
  EMK_SYNCTHREADS();
  for (int s = (int)blockDim.x / 2; s > 0; s >>= 1) {
    if (t < s) sh[t] = comb_f(kind, sh[t], sh[t + s]);
    EMK_SYNCTHREADS();
  }
  double r = sh[0];
  EMK_SYNCTHREADS();     /* sh is reused next */
  return r;
}

EMK_DEVICE int64_t block_i(int64_t *sh, int64_t v, int kind) {
  int t = (int)threadIdx.x;
  sh[t] = v;
  EMK_SYNCTHREADS();
  for (int s = (int)blockDim.x / 2; s > 0; s >>= 1) {
    if (t < s) sh[t] = comb_i(kind, sh[t], sh[t + s]);
    EMK_SYNCTHREADS();
  }
  int64_t r = sh[0];
  EMK_SYNCTHREADS();
  return r;
}

/* this thread's share of output k's elements, folded in order */
EMK_DEVICE double share_f(const rgeom *g, int64_t io, int kind, double s, double p) {
  double acc = kind_id(kind);
  for (int64_t r = threadIdx.x; r < g->R; r += blockDim.x) {
    double x = emk_load_f64(g->in + (io + red_off(g, r, NULL)) * g->iesz, g->idt);
    acc = comb_f(kind, acc, expr_f(kind, x, s, p));
  }
  return acc;
}

/* -- reduce / var / norm ----------------------------------------------------------- */

/* the final step of output k (value v of the last pass, s its shift) into o */
EMK_DEVICE void finish(const red_args *a, char *o, double v, double s) {
  double R = (double)a->g.R;
  switch (a->fin) {
  case F_MEAN: v = v / R; break;
  case F_SQRT: v = sqrt(v); break;
  case F_ROOT: v = pow(v, a->arg); break;
  case F_LSE: v = log(v) + s; break;
  case F_VAR: case F_STD: {
    double dof = R - a->arg;
    v = v / (dof > 0 ? dof : 0);
    if (a->fin == F_STD) v = sqrt(v);
    break;
  }
  case F_ANY: v = v > 0; break;
  case F_ALL: v = v == R; break;
  default: break;
  }
  emk_store_f64(o, a->g.odt, v);
}

/* One block per output. */
EMK_KERNEL_SYNC(k_reduce, red_args) {
  EMK_SHARED(double, shd, RT);
  EMK_SHARED(int64_t, shi, RT);
  const rgeom *g = &a.g;
  for (int64_t k = blockIdx.x; k < g->K; k += gridDim.x) {
    int64_t oo, io = kept_off(g, g->kost, k, &oo);
    char *o = g->out + oo * g->oesz;
    if (a.kind >= KI_SUM) {
      int64_t acc = kind_id_i(a.kind);
      for (int64_t r = threadIdx.x; r < g->R; r += blockDim.x)
        acc = comb_i(a.kind, acc,
                     emk_load_i64(g->in + (io + red_off(g, r, NULL)) * g->iesz, g->idt));
      acc = block_i(shi, acc, a.kind);
      if (threadIdx.x == 0) store_i64(o, g->odt, acc);
      continue;
    }
    double s = 0;
    int kind = a.kind;
    if (a.fin == F_VAR || a.fin == F_STD) {
      s = block_f(shd, share_f(g, io, K_SUM, 0, 0), K_SUM) / (double)g->R;
      kind = K_SUMSQDEV;
    } else if (a.fin == F_LSE) {
      s = block_f(shd, share_f(g, io, K_MAX, 0, 0), K_MAX);
      if (s == INFINITY || s == -INFINITY) s = 0;
      kind = K_SUMEXP;
    }
    double v = block_f(shd, share_f(g, io, kind, s, a.p), kind);
    if (threadIdx.x == 0) finish(&a, o, v, s);
  }
}

/* output k's elements folded in order by one thread */
EMK_DEVICE double seq_f(const rgeom *g, int64_t io, int kind, double s, double p) {
  double acc = kind_id(kind);
  for (int64_t r = 0; r < g->R; r++) {
    double x = emk_load_f64(g->in + (io + red_off(g, r, NULL)) * g->iesz, g->idt);
    acc = comb_f(kind, acc, expr_f(kind, x, s, p));
  }
  return acc;
}

/* One thread per output: many short reductions, or columns (a kept dim
** contiguous in the input, so a warp's loads are contiguous). */
EMK_KERNEL(k_reduce_seq, red_args) {
  const rgeom *g = &a.g;
  int64_t step = (int64_t)gridDim.x * blockDim.x;
  for (int64_t k = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; k < g->K; k += step) {
    int64_t oo, io = kept_off(g, g->kost, k, &oo);
    char *o = g->out + oo * g->oesz;
    if (a.kind >= KI_SUM) {
      int64_t acc = kind_id_i(a.kind);
      for (int64_t r = 0; r < g->R; r++)
        acc = comb_i(a.kind, acc,
                     emk_load_i64(g->in + (io + red_off(g, r, NULL)) * g->iesz, g->idt));
      store_i64(o, g->odt, acc);
      continue;
    }
    double s = 0;
    int kind = a.kind;
    if (a.fin == F_VAR || a.fin == F_STD) {
      s = seq_f(g, io, K_SUM, 0, 0) / (double)g->R;
      kind = K_SUMSQDEV;
    } else if (a.fin == F_LSE) {
      s = seq_f(g, io, K_MAX, 0, 0);
      if (s == INFINITY || s == -INFINITY) s = 0;
      kind = K_SUMEXP;
    }
    finish(&a, o, seq_f(g, io, kind, s, a.p), s);
  }
}

/* -- arg_reduce ------------------------------------------------------------------------ */

/* Is candidate (x, xi) better than (b, bi)? NaN beats everything but an earlier
** NaN; equal values go to the lower index. bi < 0: nothing yet. */
EMK_DEVICE int better_f(double x, int64_t xi, double b, int64_t bi, int want_max) {
  if (xi < 0) return 0;
  if (bi < 0) return 1;
  int xn = x != x, bn = b != b;
  if (xn || bn) return xn && (!bn || xi < bi);
  if (x == b) return xi < bi;
  return want_max ? x > b : x < b;
}

EMK_DEVICE int better_i(int64_t x, int64_t xi, int64_t b, int64_t bi, int want_max) {
  if (xi < 0) return 0;
  if (bi < 0) return 1;
  if (x == b) return xi < bi;
  return want_max ? x > b : x < b;
}

EMK_KERNEL_SYNC(k_arg, arg_args) {
  EMK_SHARED(double, shd, RT);
  EMK_SHARED(int64_t, shv, RT);
  EMK_SHARED(int64_t, shx, RT);
  const rgeom *g = &a.g;
  int t = (int)threadIdx.x;
  for (int64_t k = blockIdx.x; k < g->K; k += gridDim.x) {
    int64_t oo, vo, io = kept_off(g, g->kost, k, &oo);
    kept_off(g, a.vkost, k, &vo);
    double bf = 0;
    int64_t bv = 0, bx = -1;
    for (int64_t r = t; r < g->R; r += blockDim.x) {
      const char *p = g->in + (io + red_off(g, r, NULL)) * g->iesz;
      if (a.i64) {
        int64_t x = emk_load_i64(p, g->idt);
        if (better_i(x, r, bv, bx, a.want_max)) { bv = x; bx = r; }
      } else {
        double x = emk_load_f64(p, g->idt);
        if (better_f(x, r, bf, bx, a.want_max)) { bf = x; bx = r; }
      }
    }
    shd[t] = bf;
    shv[t] = bv;
    shx[t] = bx;
    EMK_SYNCTHREADS();
    for (int s = (int)blockDim.x / 2; s > 0; s >>= 1) {
      if (t < s) {
        int take = a.i64 ? better_i(shv[t + s], shx[t + s], shv[t], shx[t], a.want_max)
                         : better_f(shd[t + s], shx[t + s], shd[t], shx[t], a.want_max);
        if (take) { shd[t] = shd[t + s]; shv[t] = shv[t + s]; shx[t] = shx[t + s]; }
      }
      EMK_SYNCTHREADS();
    }
    if (t == 0) {
      int64_t w = shx[0];
      *(int64_t *)(g->out + oo * 8) = w + a.base;
      if (a.vout) {
        const char *src = g->in + (io + red_off(g, w, NULL)) * g->iesz;
        char *dst = a.vout + vo * g->iesz;
        for (int b = 0; b < g->iesz; b++) dst[b] = src[b];
      }
    }
    EMK_SYNCTHREADS();
  }
}

/* One thread per output, its elements scanned in order: a strictly better
** candidate replaces the best, so ties and NaNs keep the first, as above. */
EMK_KERNEL(k_arg_seq, arg_args) {
  const rgeom *g = &a.g;
  int64_t step = (int64_t)gridDim.x * blockDim.x;
  for (int64_t k = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; k < g->K; k += step) {
    int64_t oo, vo, io = kept_off(g, g->kost, k, &oo);
    kept_off(g, a.vkost, k, &vo);
    double bf = 0;
    int64_t bv = 0, bx = -1;
    for (int64_t r = 0; r < g->R; r++) {
      const char *p = g->in + (io + red_off(g, r, NULL)) * g->iesz;
      if (a.i64) {
        int64_t x = emk_load_i64(p, g->idt);
        if (better_i(x, r, bv, bx, a.want_max)) { bv = x; bx = r; }
      } else {
        double x = emk_load_f64(p, g->idt);
        if (better_f(x, r, bf, bx, a.want_max)) { bf = x; bx = r; }
      }
    }
    *(int64_t *)(g->out + oo * 8) = bx + a.base;
    if (a.vout) {
      const char *src = g->in + (io + red_off(g, bx, NULL)) * g->iesz;
      char *dst = a.vout + vo * g->iesz;
      for (int b = 0; b < g->iesz; b++) dst[b] = src[b];
    }
  }
}

/* -- softmax --------------------------------------------------------------------------- */

EMK_KERNEL_SYNC(k_softmax, smax_args) {
  EMK_SHARED(double, shd, RT);
  const rgeom *g = &a.g;
  for (int64_t k = blockIdx.x; k < g->K; k += gridDim.x) {
    int64_t oo, io = kept_off(g, g->kost, k, &oo);
    double m = block_f(shd, share_f(g, io, K_MAX, 0, 0), K_MAX);
    double s = block_f(shd, share_f(g, io, K_SUMEXP, m, 0), K_SUM);
    double ls = log(s), inv = 1.0 / s;
    for (int64_t r = threadIdx.x; r < g->R; r += blockDim.x) {
      int64_t ro, ri = red_off(g, r, &ro);
      double x = emk_load_f64(g->in + (io + ri) * g->iesz, g->idt);
      emk_store_f64(g->out + (oo + ro) * g->oesz, g->odt,
                    a.log ? (x - m) - ls : exp(x - m) * inv);
    }
  }
}

/* One thread per row: max, sum of exp(x - max) and the row, in order. */
EMK_KERNEL(k_softmax_seq, smax_args) {
  const rgeom *g = &a.g;
  int64_t step = (int64_t)gridDim.x * blockDim.x;
  for (int64_t k = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; k < g->K; k += step) {
    int64_t oo, io = kept_off(g, g->kost, k, &oo);
    double m = seq_f(g, io, K_MAX, 0, 0);
    double s = seq_f(g, io, K_SUMEXP, m, 0);
    double ls = log(s), inv = 1.0 / s;
    for (int64_t r = 0; r < g->R; r++) {
      int64_t ro, ri = red_off(g, r, &ro);
      double x = emk_load_f64(g->in + (io + ri) * g->iesz, g->idt);
      emk_store_f64(g->out + (oo + ro) * g->oesz, g->odt,
                    a.log ? (x - m) - ls : exp(x - m) * inv);
    }
  }
}

/* -- Host side ----------------------------------------------------------------------- */

/* out: a's ndim, reduced dims of size 1 (or a's shape for softmax: rost used) */
static void make_geom(rgeom *g, const em_tensor *a, const em_tensor *out, unsigned mask) {
  memset(g, 0, sizeof *g);
  g->in = (const char *)em_tensor_data(a);
  g->out = (char *)em_tensor_data(out);
  g->idt = a->dtype;
  g->odt = out->dtype;
  g->iesz = (int)em_dtype_size(a->dtype);
  g->oesz = (int)em_dtype_size(out->dtype);
  g->K = g->R = 1;
  for (int d = 0; d < a->ndim; d++) {
    int64_t n = a->sizes[d];
    if (n == 1) continue;
    if (mask >> d & 1) {
      g->rsz[g->nr] = n;
      g->rst[g->nr] = a->strides[d];
      g->rost[g->nr++] = out->ndim == a->ndim && out->sizes[d] == n ? out->strides[d] : 0;
      g->R *= n;
    } else {
      g->ksz[g->nk] = n;
      g->kst[g->nk] = a->strides[d];
      g->kost[g->nk++] = out->strides[d];
      g->K *= n;
    }
  }
}

static em_status launch(emi_device *d, const char *op, const emk_kernel *k, int64_t K,
                        int64_t R, void *args, size_t size) {
  if (K <= 0) return EM_OK;
  emk_cuda_device *cd = emk_dev(d);
  emk_runtime *rt = cd->cuda->rt;
  unsigned threads = 32;
  while (threads < RT && (int64_t)threads < R) threads *= 2;
  int64_t blocks = K < MAX_BLOCKS ? K : MAX_BLOCKS;
  emk_dim3 grid = {(unsigned)blocks, 1, 1}, block = {threads, 1, 1};
  em_status st = rt->ops->launch(rt, k, grid, block, 0, cd->compute, args, size);
  return st ? emk_error(d, op, st) : EM_OK;
}

/* One thread per output when there are many outputs and each is short, or when
** the innermost kept dim is contiguous in the input and no reduced dim is
** (column sums): decided by the shape alone, so results stay deterministic. */
static int seq_shape(const rgeom *g) {
  if (g->K < SEQ_MIN_K) return 0;
  if (g->R <= SEQ_MAX_R) return 1;
  if (g->nk == 0 || g->kst[g->nk - 1] != 1) return 0;
  for (int k = 0; k < g->nr; k++)
    if (g->rst[k] == 1) return 0;
  return 1;
}

/* g's work on one of the two kernels: seq (one thread per output) when
** seq_shape says so, else blocks (one block per output). */
static em_status launch_either(emi_device *d, const char *op, const rgeom *g,
                               const emk_kernel *blocks_k, const emk_kernel *seq_k,
                               void *args, size_t size) {
  if (!seq_shape(g)) return launch(d, op, blocks_k, g->K, g->R, args, size);
  emk_cuda_device *cd = emk_dev(d);
  emk_runtime *rt = cd->cuda->rt;
  int64_t blocks = (g->K + RT - 1) / RT;
  if (blocks > MAX_BLOCKS) blocks = MAX_BLOCKS;
  emk_dim3 grid = {(unsigned)blocks, 1, 1}, block = {RT, 1, 1};
  em_status st = rt->ops->launch(rt, seq_k, grid, block, 0, cd->compute, args, size);
  return st ? emk_error(d, op, st) : EM_OK;
}

static em_status run_red(emi_device *d, const char *op, em_tensor *out, const em_tensor *a,
                         unsigned mask, int kind, int fin, double p, double arg) {
  red_args ra;
  memset(&ra, 0, sizeof ra);
  make_geom(&ra.g, a, out, mask);
  ra.kind = kind;
  ra.fin = fin;
  ra.p = p;
  ra.arg = arg;
  return launch_either(d, op, &ra.g, &k_reduce, &k_reduce_seq, &ra, sizeof ra);
}

em_status emk_reduce(emi_device *d, em_redop op, em_tensor *out, const em_tensor *a,
                     unsigned mask) {
  int ic = !em_dtype_is_floating(a->dtype);
  switch (op) {
  case EM_SUM: return run_red(d, "sum", out, a, mask, ic ? KI_SUM : K_SUM, F_ID, 0, 0);
  case EM_MEAN: return run_red(d, "mean", out, a, mask, K_SUM, F_MEAN, 0, 0);
  case EM_PROD: return run_red(d, "prod", out, a, mask, ic ? KI_PROD : K_PROD, F_ID, 0, 0);
  case EM_AMAX: return run_red(d, "amax", out, a, mask, ic ? KI_MAX : K_MAX, F_ID, 0, 0);
  case EM_AMIN: return run_red(d, "amin", out, a, mask, ic ? KI_MIN : K_MIN, F_ID, 0, 0);
  case EM_ANY: return run_red(d, "any", out, a, mask, K_CNTNZ, F_ANY, 0, 0);
  case EM_ALL: return run_red(d, "all", out, a, mask, K_CNTNZ, F_ALL, 0, 0);
  case EM_LOGSUMEXP: return run_red(d, "logsumexp", out, a, mask, K_SUM, F_LSE, 0, 0);
  default:
    return emi_error(d->S, EM_ERR_ARG, "reduce: unknown reduction %d", (int)op);
  }
}

em_status emk_var(emi_device *d, em_tensor *out, const em_tensor *a, unsigned mask,
                  double correction, int take_sqrt) {
  return run_red(d, take_sqrt ? "std" : "var", out, a, mask, K_SUM,
                 take_sqrt ? F_STD : F_VAR, 0, correction);
}

em_status emk_norm(emi_device *d, em_tensor *out, const em_tensor *a, unsigned mask,
                   double p) {
  int64_t R = 1;
  for (int k = 0; k < a->ndim; k++)
    if (mask >> k & 1) R *= a->sizes[k];
  if (R == 0) p = 1;          /* the norm of nothing is 0 for every p */
  if (p == 2) return run_red(d, "norm", out, a, mask, K_SUMSQ, F_SQRT, p, 0);
  if (p == 1) return run_red(d, "norm", out, a, mask, K_SUMABS, F_ID, p, 0);
  if (p == 0) return run_red(d, "norm", out, a, mask, K_CNTNZ, F_ID, p, 0);
  if (isinf(p)) return run_red(d, "norm", out, a, mask, p > 0 ? K_MAXABS : K_MINABS, F_ID, p, 0);
  return run_red(d, "norm", out, a, mask, K_SUMPOW, F_ROOT, p, 1.0 / p);
}

em_status emk_arg_reduce(emi_device *d, em_tensor *values, em_tensor *indices,
                         const em_tensor *a, int dim, int want_max, int index_base) {
  arg_args aa;
  memset(&aa, 0, sizeof aa);
  unsigned mask = a->ndim ? 1u << dim : 0;
  make_geom(&aa.g, a, indices, mask);
  if (values) {
    rgeom vg;
    make_geom(&vg, a, values, mask);
    aa.vout = vg.out;
    memcpy(aa.vkost, vg.kost, sizeof aa.vkost);
  }
  aa.want_max = want_max;
  aa.i64 = !em_dtype_is_floating(a->dtype);
  aa.base = index_base;
  return launch_either(d, want_max ? "argmax" : "argmin", &aa.g, &k_arg, &k_arg_seq, &aa,
                       sizeof aa);
}

em_status emk_softmax(emi_device *d, em_tensor *out, const em_tensor *a, int dim, int log) {
  smax_args sa;
  memset(&sa, 0, sizeof sa);
  if (a->numel == 0) return EM_OK;
  make_geom(&sa.g, a, out, a->ndim ? 1u << dim : 0);
  sa.log = log;
  return launch_either(d, log ? "log_softmax" : "softmax", &sa.g, &k_softmax, &k_softmax_seq,
                       &sa, sizeof sa);
}

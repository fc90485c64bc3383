/*
** k_reduce.c -- the launchers of the reductions (k_reduce.cu): each entry
** checks its arguments, describes the reduction as kept and reduced dims
** (size-1 dims dropped, neighbours merged), picks a shape of launch -- one
** group of threads per output, a sequential walk, or a split over chunks with
** a combining pass -- and queues the kernels on the compute stream.
*/
#include "k_reduce.h"
#include "k_reduce_args.h"
#include <math.h>

/* Merges neighbours of a dims list that walk memory as one dim in every strides
** array given (the outer stride is the inner stride times the inner size);
** returns the new count. s2 may be NULL. */
static int merge_dims(int n, int64_t *sz, int64_t *s0, int64_t *s1, int64_t *s2) {
  int m = 0;
  for (int d = 0; d < n; d++) {
    if (m > 0 && s0[m - 1] == s0[d] * sz[d] && s1[m - 1] == s1[d] * sz[d] &&
        (!s2 || s2[m - 1] == s2[d] * sz[d])) {
      sz[m - 1] *= sz[d];
      s0[m - 1] = s0[d];
      s1[m - 1] = s1[d];
      if (s2) s2[m - 1] = s2[d];
      continue;
    }
    sz[m] = sz[d];
    s0[m] = s0[d];
    s1[m] = s1[d];
    if (s2) s2[m] = s2[d];
    m++;
  }
  for (int d = m; d < n; d++) {
    sz[d] = s0[d] = s1[d] = 0;
    if (s2) s2[d] = 0;
  }
  return m;
}

/* out: a's ndim, reduced dims of size 1 (or a's shape for softmax: rost used).
** values (arg_reduce, or NULL): a second output shaped as out, whose kept-dim
** strides go to vkost. */
static void make_geom(rgeom *g, const em_tensor *a, const em_tensor *out, unsigned mask,
                      const em_tensor *values, int64_t *vkost) {
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
      if (vkost) vkost[g->nk] = values->strides[d];
      g->ksz[g->nk] = n;
      g->kst[g->nk] = a->strides[d];
      g->kost[g->nk++] = out->strides[d];
      g->K *= n;
    }
  }
  g->nr = merge_dims(g->nr, g->rsz, g->rst, g->rost, NULL);
  g->nk = merge_dims(g->nk, g->ksz, g->kst, g->kost, vkost);
  g->vec = g->idt == EM_FLOAT32 && g->nr == 1 && g->rst[0] == 1;
  g->ovec = g->odt == EM_FLOAT32 && g->nr == 1 && g->rost[0] == 1;
}

/* threads for n elements: the smallest power of two >= n, 32 to RT */
static unsigned threads_for(int64_t n) {
  unsigned threads = 32;
  while (threads < RT && (int64_t)threads < n) threads *= 2;
  return threads;
}

static em_status launch_grid(emi_device *d, const char *op, const emk_kernel *k,
                             int64_t blocks, unsigned tx, unsigned ty, void *args,
                             size_t size) {
  emk_cuda_device *cd = emk_dev(d);
  emk_runtime *rt = cd->cuda->rt;
  if (blocks > MAX_BLOCKS) blocks = MAX_BLOCKS;
  emk_dim3 grid = {(unsigned)blocks, 1, 1}, block = {tx, ty, 1};
  em_status st = rt->ops->launch(rt, k, grid, block, 0, cd->compute, args, size);
  return st ? emk_error(d, op, st) : EM_OK;
}

/* One group per output: a warp each (8 outputs a block) for slices up to
** WARP_MAX_R when the kernel takes warp groups, else a block of threads_for(R). */
static em_status launch_rows(emi_device *d, const char *op, const emk_kernel *k,
                             const rgeom *g, int warps_ok, void *args, size_t size) {
  if (warps_ok && g->R <= WARP_MAX_R) {
    unsigned ty = g->K < WARP_ROWS ? (unsigned)g->K : WARP_ROWS;
    return launch_grid(d, op, k, (g->K + ty - 1) / ty, 32, ty, args, size);
  }
  return launch_grid(d, op, k, g->K, threads_for(g->R), 1, args, size);
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

/* Split work for few outputs with long slices: S chunks per output so that the
** K*S blocks number about SPLIT_BLOCKS (8 per SM of a 132-SM GPU, enough for
** any current one), each chunk at least SPLIT_MIN elements and a multiple of 4
** (a chunk of an aligned float32 slice starts aligned). 0: no split. */
static int split_of(const rgeom *g, int64_t *S, int64_t *chunk) {
  if (seq_shape(g) || g->R < 2 * SPLIT_MIN || g->K >= SPLIT_BLOCKS / 2) return 0;
  int64_t s = (SPLIT_BLOCKS + g->K - 1) / g->K, most = g->R / SPLIT_MIN;
  if (s > most) s = most;
  if (s < 2) return 0;
  int64_t c = (g->R + s - 1) / s;
  c = (c + 3) & ~(int64_t)3;
  *chunk = c;
  *S = (g->R + c - 1) / c;
  return *S >= 2;
}

/* g's work on seq (one thread per output) when seq_shape says so, else rows. */
static em_status launch_either(emi_device *d, const char *op, const rgeom *g,
                               const emk_kernel *rows_k, const emk_kernel *seq_k,
                               int warps_ok, void *args, size_t size) {
  if (g->K <= 0) return EM_OK;
  if (!seq_shape(g)) return launch_rows(d, op, rows_k, g, warps_ok, args, size);
  return launch_grid(d, op, seq_k, (g->K + RT - 1) / RT, RT, 1, args, size);
}

/* The split pipeline: (a first pass and its combine into the shifts, for var
** and logsumexp, then) the main pass and its combine into out. */
static em_status run_split(emi_device *d, const char *op, red_args *ra) {
  int64_t K = ra->g.K, n = K * ra->S + K;
  em_tensor *ws = NULL;
  em_status st = emi_tensor_new(d->S, op, &n, 1, EM_FLOAT64, d->index, &ws);
  if (st) return st;
  ra->part = (double *)em_tensor_data(ws);
  double *shift = ra->part + K * ra->S;
  int main_kind = ra->kind, stage = 0;
  ra->shift = shift;
  if (ra->fin == F_VAR || ra->fin == F_STD) {
    ra->kind = K_SUM;
    main_kind = K_SUMSQDEV;
    stage = 1;
  } else if (ra->fin == F_LSE) {
    ra->kind = K_MAX;
    main_kind = K_SUMEXP;
    stage = 2;
  }
  for (;;) {
    ra->stage = stage;
    st = launch_grid(d, op, &k_reduce_part, K * ra->S, RT, 1, ra, sizeof *ra);
    if (!st) st = launch_grid(d, op, &k_reduce_comb, K, threads_for(ra->S), 1, ra, sizeof *ra);
    if (st || stage == 0) break;
    ra->kind = main_kind;
    stage = 0;
  }
  em_tensor_release(ws);   /* reused only by later work on the stream */
  return st;
}

static em_status run_red(emi_device *d, const char *op, em_tensor *out, const em_tensor *a,
                         unsigned mask, int kind, int fin, double p, double arg) {
  red_args ra;
  memset(&ra, 0, sizeof ra);
  make_geom(&ra.g, a, out, mask, NULL, NULL);
  ra.kind = kind;
  ra.fin = fin;
  ra.p = p;
  ra.arg = arg;
  if (ra.g.K > 0 && split_of(&ra.g, &ra.S, &ra.chunk)) return run_split(d, op, &ra);
  return launch_either(d, op, &ra.g, &k_reduce, &k_reduce_seq, 1, &ra, sizeof ra);
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
  const char *op = want_max ? "argmax" : "argmin";
  arg_args aa;
  memset(&aa, 0, sizeof aa);
  unsigned mask = a->ndim ? 1u << dim : 0;
  make_geom(&aa.g, a, indices, mask, values, values ? aa.vkost : NULL);
  if (values) aa.vout = (char *)em_tensor_data(values);
  aa.want_max = want_max;
  aa.i64 = !em_dtype_is_floating(a->dtype);
  aa.base = index_base;
  if (aa.g.K <= 0 || !split_of(&aa.g, &aa.S, &aa.chunk))
    return launch_either(d, op, &aa.g, &k_arg, &k_arg_seq, 0, &aa, sizeof aa);
  /* split: a candidate per chunk (value as double and int64, index), then the best */
  int64_t n = 3 * aa.g.K * aa.S;
  em_tensor *ws = NULL;
  em_status st = emi_tensor_new(d->S, op, &n, 1, EM_INT64, d->index, &ws);
  if (st) return st;
  aa.pv = (int64_t *)em_tensor_data(ws);
  aa.px = aa.pv + aa.g.K * aa.S;
  aa.pf = (double *)(aa.px + aa.g.K * aa.S);
  st = launch_grid(d, op, &k_arg_part, aa.g.K * aa.S, RT, 1, &aa, sizeof aa);
  if (!st) st = launch_grid(d, op, &k_arg_comb, aa.g.K, threads_for(aa.S), 1, &aa, sizeof aa);
  em_tensor_release(ws);
  return st;
}

em_status emk_softmax(emi_device *d, em_tensor *out, const em_tensor *a, int dim, int log) {
  smax_args sa;
  memset(&sa, 0, sizeof sa);
  if (a->numel == 0) return EM_OK;
  make_geom(&sa.g, a, out, a->ndim ? 1u << dim : 0, NULL, NULL);
  sa.log = log;
  return launch_either(d, log ? "log_softmax" : "softmax", &sa.g, &k_softmax, &k_softmax_seq,
                       1, &sa, sizeof sa);
}

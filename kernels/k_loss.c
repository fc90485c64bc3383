/*
** k_loss.c -- the launchers of the losses (k_loss.cu): each entry checks its
** arguments and the targets in the CPU backend's order and with its messages
** (core/cpu/nn_loss.c), queues the kernels on the compute stream, and for a
** mean or sum adds the per-row or per-block partials in one block, in a fixed
** order.
*/
#include "k_loss.h"
#include "k_loss_args.h"

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
                     "(labels count from %d, "
                     "so they run %d..%lld%s)", op, (long long)v, (long long)C, index_base,
                     index_base, (long long)(C - 1 + index_base),
                     index_base == 1 ? "; add 1 to 0-based labels" : "");
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
  a.mse = kind == EMI_LOSS_MSE;
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
  a.mse = kind == EMI_LOSS_MSE;
  a.f64 = x->dtype == EM_FLOAT64;
  a.gl_none = reduction == EM_REDUCE_NONE;
  a.div = reduction == EM_REDUCE_MEAN ? (double)a.n : 1.0;
  if (a.n == 0) return EM_OK;
  return launch(d, op, &k_pw_bwd, blocks_for(a.n), &a, sizeof a);
}

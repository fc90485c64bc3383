/*
** k_norm.c -- the launchers of layer norm, forward and backward (k_norm.cu):
** each entry picks the threads per row (a warp for short rows, the block for
** long ones) and, for the weight's and bias's gradients, the chunks of rows
** whose partial sums are added in chunk order, and queues the kernels on the
** compute stream.
*/
#include "k_norm.h"
#include "k_norm_args.h"

static em_status launch(emi_device *d, const char *op, const emk_kernel *k, int64_t blocks,
                        ln_args *a) {
  emk_cuda_device *cd = emk_dev(d);
  emk_runtime *rt = cd->cuda->rt;
  if (blocks > MAX_BLOCKS) blocks = MAX_BLOCKS;
  if (blocks < 1) blocks = 1;
  emk_dim3 grid = {(unsigned)blocks, 1, 1}, block = {THREADS, 1, 1};
  em_status st = rt->ops->launch(rt, k, grid, block, 0, cd->compute, a, sizeof *a);
  return st ? emk_error(d, op, st) : EM_OK;
}

static const char *data_or_null(const em_tensor *t) {
  return t ? (const char *)em_tensor_data(t) : NULL;
}

/* rows per thread group: a warp for short rows, the block for long ones */
static int row_threads(int64_t K) { return K <= ROW_WARP_MAX ? 32 : THREADS; }

static int64_t row_blocks(int64_t M, int tpr) {
  int rpb = THREADS / tpr;
  return (M + rpb - 1) / rpb;
}

em_status emk_layer_norm(emi_device *d, em_tensor *y, em_tensor *mean, em_tensor *rstd,
                         const em_tensor *x, const em_tensor *w, const em_tensor *b,
                         double eps) {
  int64_t M = mean->numel;
  if (M == 0) return EM_OK;
  ln_args a;
  memset(&a, 0, sizeof a);
  a.x = (const char *)em_tensor_data(x);
  a.w = data_or_null(w);
  a.b = data_or_null(b);
  a.y = (char *)em_tensor_data(y);
  a.mo = (char *)em_tensor_data(mean);
  a.ro = (char *)em_tensor_data(rstd);
  a.M = M;
  a.K = x->numel / M;
  a.f64 = x->dtype == EM_FLOAT64;
  a.tpr = row_threads(a.K);
  a.eps = eps;
  return launch(d, "layer_norm", &k_ln_fwd, row_blocks(M, a.tpr), &a);
}

em_status emk_layer_norm_backward(emi_device *d, em_tensor *gx, em_tensor *gw, em_tensor *gb,
                                  const em_tensor *gy, const em_tensor *x,
                                  const em_tensor *mean, const em_tensor *rstd,
                                  const em_tensor *w) {
  const char *op = "layer_norm_backward";
  int64_t M = mean->numel;
  ln_args a;
  memset(&a, 0, sizeof a);
  a.x = (const char *)em_tensor_data(x);
  a.gy = (const char *)em_tensor_data(gy);
  a.mean = (const char *)em_tensor_data(mean);
  a.rstd = (const char *)em_tensor_data(rstd);
  a.w = data_or_null(w);
  a.gx = (char *)data_or_null(gx);
  a.gw = (char *)data_or_null(gw);
  a.gb = (char *)data_or_null(gb);
  a.M = M;
  a.K = M ? x->numel / M : gw ? gw->numel : gb ? gb->numel : 0;
  a.f64 = x->dtype == EM_FLOAT64;
  a.tpr = row_threads(a.K);
  em_status st = EM_OK;
  if (gx && M > 0 && a.K > 0 &&
      (st = launch(d, op, &k_ln_bwd_x, row_blocks(M, a.tpr), &a)))
    return st;
  if ((!gw && !gb) || a.K == 0) return EM_OK;
  /* chunks of ~CHUNK_ROWS rows, at most MAX_CHUNKS: fixed by M, so deterministic */
  a.ch = (M + CHUNK_ROWS - 1) / CHUNK_ROWS;
  if (a.ch > MAX_CHUNKS) a.ch = MAX_CHUNKS;
  em_tensor *part = NULL;
  int64_t n = a.ch * 2 * a.K;
  if (n < 1) n = 1;
  if ((st = emi_tensor_new(d->S, op, &n, 1, EM_FLOAT64, d->index, &part))) return st;
  a.part = (double *)em_tensor_data(part);
  if (a.ch > 0) st = launch(d, op, &k_ln_wb_part, (a.ch * a.K + THREADS - 1) / THREADS, &a);
  if (!st) st = launch(d, op, &k_ln_wb_fin, (a.K + THREADS - 1) / THREADS, &a);
  em_tensor_release(part);   /* reused only by later work on the stream */
  return st;
}

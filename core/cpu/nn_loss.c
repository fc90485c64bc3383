/*
** nn_loss.c -- CPU loss kernels: fused log_softmax + nll (cross entropy) with
** label smoothing, nll_loss, and the pointwise losses (mse, binary cross entropy
** on logits, in its stable form max(x,0) - x*y + log1p(exp(-|x|))). Sums are
** kept in double. Targets are read (any int dtype and stride), range-checked and
** turned into 0-based int64 plus an ignore mask before any output is written.
** The typed loops are written once, in nn_loss_impl.h, which this file includes
** for float and for double.
*/
#include "cpu.h"
#include <math.h>

/* -- Per-dtype loops (nn_loss_impl.h, T float then double) ------------------------------ */

#define T float
#define FN(name) name##_f32
#include "nn_loss_impl.h"
#define T double
#define FN(name) name##_f64
#include "nn_loss_impl.h"

/* -- Targets, reductions and gradient factors ------------------------------------------ */

/* Targets as 0-based int64 plus an ignore mask (ignored rows: ign[i] = 1, not
** counted); one scratch block of `bytes`, freed with targets_free. */
typedef struct targets { int64_t *t; unsigned char *ign; int64_t count; size_t bytes; } targets;

static void targets_free(em_state *S, targets *tg) { emi_free(S, tg->t, tg->bytes); }

static em_status read_targets(em_state *S, const char *op, const em_tensor *target, int64_t N,
                              int64_t C, int index_base, int64_t ignore_index, targets *tg) {
  tg->bytes = (size_t)N * 9 + 8;
  if (!(tg->t = emi_malloc(S, tg->bytes)))
    return emi_error(S, EM_ERR_NOMEM, "%s: out of memory for %lld targets", op, (long long)N);
  tg->ign = (unsigned char *)(tg->t + N);
  tg->count = 0;
  const char *base = (const char *)em_tensor_data(target);
  size_t es = em_dtype_size(target->dtype);
  for (int64_t i = 0; i < N; i++) {
    const char *p = base + i * target->strides[0] * (int64_t)es;
    int64_t v = target->dtype == EM_INT64 ? *(const int64_t *)p : *(const int32_t *)p;
    tg->ign[i] = v == ignore_index;
    tg->t[i] = 0;
    if (tg->ign[i]) continue;
    if (v - index_base < 0 || v - index_base >= C) {
      targets_free(S, tg);
      return emi_error(S, EM_ERR_INDEX, "%s: target %lld is out of range for %lld classes "
                       "(labels count from %d, "
                       "so they run %d..%lld%s)", op, (long long)v, (long long)C, index_base,
                       index_base, (long long)(C - 1 + index_base),
                       index_base == 1 ? "; add 1 to 0-based labels" : "");
    }
    tg->t[i] = v - index_base;
    tg->count++;
  }
  return EM_OK;
}

/* Rows and the per-row scratch of N doubles, or EM_ERR_NOMEM (targets freed). */
static em_status row_scratch(em_state *S, const char *op, targets *tg, int64_t N,
                             double **rows, size_t *bytes) {
  *bytes = (size_t)N * sizeof(double) + 8;
  if ((*rows = emi_malloc(S, *bytes))) return EM_OK;
  targets_free(S, tg);
  return emi_error(S, EM_ERR_NOMEM, "%s: out of memory", op);
}

/* loss from per-row values: (n) for EM_REDUCE_NONE, else the 0-d sum or mean. */
static void store_loss(em_tensor *loss, const double *rows, int64_t n, double count,
                       int reduction) {
  em_dtype dt = loss->dtype;
  char *p = em_tensor_data(loss);
  if (reduction == EM_REDUCE_NONE) {
    for (int64_t i = 0; i < n; i++) emi_store_f64(p + i * em_dtype_size(dt), dt, rows[i]);
    return;
  }
  double s = 0;
  for (int64_t i = 0; i < n; i++) s += rows[i];
  if (reduction == EM_REDUCE_MEAN) s /= count;
  emi_store_f64(p, dt, s);
}

/* grad_loss as n per-row factors (times scale): (n), any stride, for
** EM_REDUCE_NONE, else its one element for every row. */
static void read_grad(const em_tensor *grad, int64_t n, int reduction, double scale,
                      double *out) {
  const char *p = em_tensor_data(grad);
  em_dtype dt = grad->dtype;
  if (reduction == EM_REDUCE_NONE) {
    int64_t step = grad->ndim ? grad->strides[0] * (int64_t)em_dtype_size(dt) : 0;
    for (int64_t i = 0; i < n; i++) out[i] = emi_load_f64(p + i * step, dt) * scale;
  } else {
    double g = emi_load_f64(p, dt) * scale;
    for (int64_t i = 0; i < n; i++) out[i] = g;
  }
}

/* -- Entries ---------------------------------------------------------------------------- */

em_status emi_cpu_cross_entropy(emi_device *dev, em_tensor *loss, em_tensor *lse,
                                const em_tensor *x, const em_tensor *target, int index_base,
                                int64_t ignore_index, double label_smoothing, int reduction) {
  em_state *S = dev->S;
  const char *op = "cross_entropy";
  int64_t N = x->sizes[0], C = x->sizes[1];
  targets tg;
  double *rows;
  size_t rbytes;
  em_status st = read_targets(S, op, target, N, C, index_base, ignore_index, &tg);
  if (st || (st = row_scratch(S, op, &tg, N, &rows, &rbytes))) return st;
  if (x->dtype == EM_FLOAT32)
    ce_fwd_f32(N, C, em_tensor_data(x), tg.t, tg.ign, label_smoothing, rows,
               em_tensor_data(lse));
  else
    ce_fwd_f64(N, C, em_tensor_data(x), tg.t, tg.ign, label_smoothing, rows,
               em_tensor_data(lse));
  store_loss(loss, rows, N, (double)tg.count, reduction);
  emi_free(S, rows, rbytes);
  targets_free(S, &tg);
  return EM_OK;
}

em_status emi_cpu_cross_entropy_backward(emi_device *dev, em_tensor *gx,
                                         const em_tensor *grad_loss, const em_tensor *x,
                                         const em_tensor *target, const em_tensor *lse,
                                         int index_base, int64_t ignore_index,
                                         double label_smoothing, int reduction) {
  em_state *S = dev->S;
  const char *op = "cross_entropy_backward";
  int64_t N = x->sizes[0], C = x->sizes[1];
  targets tg;
  double *gl;
  size_t gbytes;
  em_status st = read_targets(S, op, target, N, C, index_base, ignore_index, &tg);
  if (st || (st = row_scratch(S, op, &tg, N, &gl, &gbytes))) return st;
  read_grad(grad_loss, N, reduction,
            reduction == EM_REDUCE_MEAN ? 1.0 / (double)tg.count : 1.0, gl);
  if (x->dtype == EM_FLOAT32)
    ce_bwd_f32(N, C, em_tensor_data(x), tg.t, tg.ign, label_smoothing, gl,
               em_tensor_data(lse), em_tensor_data(gx));
  else
    ce_bwd_f64(N, C, em_tensor_data(x), tg.t, tg.ign, label_smoothing, gl,
               em_tensor_data(lse), em_tensor_data(gx));
  emi_free(S, gl, gbytes);
  targets_free(S, &tg);
  return EM_OK;
}

em_status emi_cpu_nll_loss(emi_device *dev, em_tensor *loss, const em_tensor *logp,
                           const em_tensor *target, int index_base, int64_t ignore_index,
                           int reduction) {
  em_state *S = dev->S;
  const char *op = "nll_loss";
  int64_t N = logp->sizes[0], C = logp->sizes[1];
  targets tg;
  double *rows;
  size_t rbytes, es = em_dtype_size(logp->dtype);
  em_status st = read_targets(S, op, target, N, C, index_base, ignore_index, &tg);
  if (st || (st = row_scratch(S, op, &tg, N, &rows, &rbytes))) return st;
  const char *x = em_tensor_data(logp);
  for (int64_t i = 0; i < N; i++)
    rows[i] = tg.ign[i] ? 0 : -emi_load_f64(x + (i * logp->strides[0] +
                                                  tg.t[i] * logp->strides[1]) * (int64_t)es,
                                             logp->dtype);
  store_loss(loss, rows, N, (double)tg.count, reduction);
  emi_free(S, rows, rbytes);
  targets_free(S, &tg);
  return EM_OK;
}

em_status emi_cpu_nll_loss_backward(emi_device *dev, em_tensor *gx, const em_tensor *grad_loss,
                                    const em_tensor *target, int index_base,
                                    int64_t ignore_index, int reduction) {
  em_state *S = dev->S;
  const char *op = "nll_loss_backward";
  int64_t N = gx->sizes[0], C = gx->sizes[1];
  targets tg;
  double *gl;
  size_t gbytes, es = em_dtype_size(gx->dtype);
  em_status st = read_targets(S, op, target, N, C, index_base, ignore_index, &tg);
  if (st || (st = row_scratch(S, op, &tg, N, &gl, &gbytes))) return st;
  read_grad(grad_loss, N, reduction,
            reduction == EM_REDUCE_MEAN ? 1.0 / (double)tg.count : 1.0, gl);
  char *p = em_tensor_data(gx);
  memset(p, 0, (size_t)gx->numel * es);
  for (int64_t i = 0; i < N; i++)
    if (!tg.ign[i]) emi_store_f64(p + (i * C + tg.t[i]) * (int64_t)es, gx->dtype, -gl[i]);
  emi_free(S, gl, gbytes);
  targets_free(S, &tg);
  return EM_OK;
}

em_status emi_cpu_pointwise_loss(emi_device *dev, int kind, em_tensor *loss,
                                 const em_tensor *x, const em_tensor *y, int reduction) {
  em_dtype dt = x->dtype;
  int64_t n = x->numel;
  void *out = reduction == EM_REDUCE_NONE ? em_tensor_data(loss) : NULL;
  double s = dt == EM_FLOAT32 ? pw_fwd_f32(kind, n, em_tensor_data(x), em_tensor_data(y), out)
                              : pw_fwd_f64(kind, n, em_tensor_data(x), em_tensor_data(y), out);
  if (reduction != EM_REDUCE_NONE) {
    if (reduction == EM_REDUCE_MEAN) s /= (double)n;
    emi_store_f64(em_tensor_data(loss), dt, s);
  }
  return EM_OK;
}

em_status emi_cpu_pointwise_loss_backward(emi_device *dev, int kind, em_tensor *gx,
                                          const em_tensor *grad_loss, const em_tensor *x,
                                          const em_tensor *y, int reduction) {
  em_dtype dt = x->dtype;
  int64_t n = x->numel;
  double g = 1;
  const void *gl = NULL;
  if (reduction == EM_REDUCE_NONE) gl = em_tensor_data(grad_loss);
  else {
    g = emi_load_f64(em_tensor_data(grad_loss), dt);
    if (reduction == EM_REDUCE_MEAN) g /= (double)n;
  }
  if (dt == EM_FLOAT32)
    pw_bwd_f32(kind, n, em_tensor_data(x), em_tensor_data(y), gl, g, em_tensor_data(gx));
  else
    pw_bwd_f64(kind, n, em_tensor_data(x), em_tensor_data(y), gl, g, em_tensor_data(gx));
  return EM_OK;
}

/*
** nn_loss.c -- loss functions, forward and backward: cross_entropy (fused
** log_softmax + nll, label smoothing), nll_loss, mse_loss and
** binary_cross_entropy_with_logits. Semantics follow PyTorch 1.13: a target
** equal to ignore_index adds nothing and is not counted by the mean (0/0 = NaN
** when every target is ignored); the smoothed loss is
** (1-eps)*nll + eps*mean_c(-log p_c).
*/
#include "nn_util.h"
#include "../autograd/grad_nn.h"
#include <math.h>

static em_status check_reduction(em_state *S, const char *op, int reduction) {
  if (reduction < EM_REDUCE_NONE || reduction > EM_REDUCE_SUM)
    return emi_error(S, EM_ERR_ARG, "%s: reduction %d is not none (0), mean (1) or sum (2)",
                     op, reduction);
  return EM_OK;
}

/* Targets as 0-based int64 plus an ignore mask, range-checked; one scratch block
** of *bytes (freed with emi_free). */
typedef struct targets { int64_t *t; unsigned char *ign; int64_t count; size_t bytes; } targets;

static em_status read_targets(em_state *S, const char *op, const em_tensor *logits,
                              const em_tensor *target, int index_base, int64_t ignore_index,
                              targets *tg) {
  em_status st = nn_check_index(S, op, "target", target);
  if (st) return st;
  if (logits->ndim != 2)
    return emi_error(S, EM_ERR_SHAPE, "%s: input %s must be 2-D (N, C)", op,
                     emi_tshape(S, logits));
  int64_t N = logits->sizes[0], C = logits->sizes[1];
  if (target->ndim != 1 || target->sizes[0] != N)
    return emi_error(S, EM_ERR_SHAPE, "%s: target %s must be [%lld] for input %s", op,
                     emi_tshape(S, target), (long long)N, emi_tshape(S, logits));
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
      emi_free(S, tg->t, tg->bytes);
      return emi_error(S, EM_ERR_INDEX, "%s: target %lld is out of range for %lld classes "
                       "(index_base %d)", op, (long long)v, (long long)C, index_base);
    }
    tg->t[i] = v - index_base;
    tg->count++;
  }
  return EM_OK;
}

/* The loss tensor from per-row values: (N) for none, else a 0-d sum or mean. */
static em_status make_loss(em_state *S, const char *op, em_dtype dt, const double *rows,
                           int64_t n, double count, int reduction, em_tensor **loss) {
  em_status st;
  if (reduction == EM_REDUCE_NONE) {
    if ((st = emi_tensor_new(S, op, &n, 1, dt, EM_CPU, loss))) return st;
    char *p = em_tensor_data(*loss);
    for (int64_t i = 0; i < n; i++) emi_store_f64(p + i * em_dtype_size(dt), dt, rows[i]);
    return EM_OK;
  }
  double s = 0;
  for (int64_t i = 0; i < n; i++) s += rows[i];
  if (reduction == EM_REDUCE_MEAN) s /= count;
  if ((st = emi_tensor_new(S, op, NULL, 0, dt, EM_CPU, loss))) return st;
  emi_store_f64(em_tensor_data(*loss), dt, s);
  return EM_OK;
}

/* grad_loss as n per-row factors (times scale), from a 0-d/one-element tensor for
** mean/sum or an (n) tensor for none. */
static em_status read_grad(em_state *S, const char *op, const em_tensor *grad, em_dtype dt,
                           int64_t n, int reduction, double scale, double *out) {
  em_status st = nn_check_float(S, op, "grad_loss", grad, dt);
  if (st) return st;
  const char *p = em_tensor_data(grad);
  size_t es = em_dtype_size(dt);
  if (reduction == EM_REDUCE_NONE) {
    if (grad->ndim != 1 || grad->sizes[0] != n)
      return emi_error(S, EM_ERR_SHAPE, "%s: grad_loss %s must be [%lld] (reduction none)",
                       op, emi_tshape(S, grad), (long long)n);
    for (int64_t i = 0; i < n; i++)
      out[i] = emi_load_f64(p + i * grad->strides[0] * (int64_t)es, dt) * scale;
  } else {
    if (grad->numel != 1)
      return emi_error(S, EM_ERR_SHAPE, "%s: grad_loss %s must have one element", op,
                       emi_tshape(S, grad));
    double g = emi_load_f64(p, dt) * scale;
    for (int64_t i = 0; i < n; i++) out[i] = g;
  }
  return EM_OK;
}

em_status em_cross_entropy(em_state *S, const em_tensor *logits, const em_tensor *target,
                           int index_base, int64_t ignore_index, double label_smoothing,
                           int reduction, em_tensor **loss, em_tensor **lse) {
  const char *op = "cross_entropy";
  em_status st;
  if ((st = nn_check_float(S, op, "input", logits, -1)) ||
      (st = check_reduction(S, op, reduction)))
    return st;
  if (!(label_smoothing >= 0 && label_smoothing <= 1))
    return emi_error(S, EM_ERR_ARG, "%s: label_smoothing %g must be in [0, 1]", op,
                     label_smoothing);
  if (!loss) return emi_error(S, EM_ERR_ARG, "%s: loss is NULL", op);
  targets tg;
  if ((st = read_targets(S, op, logits, target, index_base, ignore_index, &tg))) return st;
  int64_t N = logits->sizes[0], C = logits->sizes[1];
  if (C < 1 && N > 0) {
    emi_free(S, tg.t, tg.bytes);
    return emi_error(S, EM_ERR_SHAPE, "%s: input %s has no classes", op, emi_tshape(S, logits));
  }
  em_tensor *t[3] = {0};   /* x, lse, loss */
  double *rows = NULL;
  size_t rbytes = (size_t)N * sizeof(double) + 8;
  if ((st = nn_contig(S, logits, &t[0])) ||
      (st = emi_tensor_new(S, op, &N, 1, logits->dtype, EM_CPU, &t[1])))
    goto done;
  if (!(rows = emi_malloc(S, rbytes))) {
    st = emi_error(S, EM_ERR_NOMEM, "%s: out of memory", op);
    goto done;
  }
  emi_cpu_cross_entropy(logits->dtype, N, C, em_tensor_data(t[0]), tg.t, tg.ign,
                        label_smoothing, rows, em_tensor_data(t[1]));
  st = make_loss(S, op, logits->dtype, rows, N, (double)tg.count, reduction, &t[2]);
done:
  if (rows) emi_free(S, rows, rbytes);
  emi_free(S, tg.t, tg.bytes);
  if (st) { nn_release(t, 3); return st; }
  *loss = t[2];
  if (emi_ag_wanted1(S, logits) &&
      (st = emi_ag_record_cross_entropy(S, logits, target, t[1], index_base, ignore_index,
                                        label_smoothing, reduction, loss))) {
    nn_release(t, 2);
    return st;
  }
  if (lse) *lse = t[1];
  else em_tensor_release(t[1]);
  em_tensor_release(t[0]);
  return EM_OK;
}

em_status em_cross_entropy_backward(em_state *S, const em_tensor *grad_loss,
                                    const em_tensor *logits, const em_tensor *target,
                                    const em_tensor *lse, int index_base,
                                    int64_t ignore_index, double label_smoothing,
                                    int reduction, em_tensor **grad_logits) {
  const char *op = "cross_entropy_backward";
  em_status st;
  if ((st = nn_check_float(S, op, "input", logits, -1)) ||
      (st = check_reduction(S, op, reduction)) ||
      (st = nn_check_float(S, op, "lse", lse, logits->dtype)))
    return st;
  if (!grad_logits) return emi_error(S, EM_ERR_ARG, "%s: grad_logits is NULL", op);
  targets tg;
  if ((st = read_targets(S, op, logits, target, index_base, ignore_index, &tg))) return st;
  int64_t N = logits->sizes[0], C = logits->sizes[1];
  em_tensor *t[3] = {0};   /* x, lse, gx */
  double *gl = NULL;
  size_t gbytes = (size_t)N * sizeof(double) + 8;
  if (lse->ndim != 1 || lse->sizes[0] != N) {
    st = emi_error(S, EM_ERR_SHAPE, "%s: lse %s must be [%lld]", op, emi_tshape(S, lse),
                   (long long)N);
    goto done;
  }
  if (!(gl = emi_malloc(S, gbytes))) {
    st = emi_error(S, EM_ERR_NOMEM, "%s: out of memory", op);
    goto done;
  }
  if ((st = read_grad(S, op, grad_loss, logits->dtype, N, reduction,
                      reduction == EM_REDUCE_MEAN ? 1.0 / (double)tg.count : 1.0, gl)) ||
      (st = nn_contig(S, logits, &t[0])) || (st = nn_contig(S, lse, &t[1])) ||
      (st = emi_tensor_new(S, op, logits->sizes, 2, logits->dtype, EM_CPU, &t[2])))
    goto done;
  emi_cpu_cross_entropy_backward(logits->dtype, N, C, em_tensor_data(t[0]), tg.t, tg.ign,
                                 label_smoothing, gl, em_tensor_data(t[1]),
                                 em_tensor_data(t[2]));
done:
  if (gl) emi_free(S, gl, gbytes);
  emi_free(S, tg.t, tg.bytes);
  if (st) { nn_release(t, 3); return st; }
  *grad_logits = t[2];
  nn_release(t, 2);
  return EM_OK;
}

em_status em_nll_loss(em_state *S, const em_tensor *logp, const em_tensor *target,
                      int index_base, int64_t ignore_index, int reduction,
                      em_tensor **loss) {
  const char *op = "nll_loss";
  em_status st;
  if ((st = nn_check_float(S, op, "input", logp, -1)) ||
      (st = check_reduction(S, op, reduction)))
    return st;
  if (!loss) return emi_error(S, EM_ERR_ARG, "%s: loss is NULL", op);
  targets tg;
  if ((st = read_targets(S, op, logp, target, index_base, ignore_index, &tg))) return st;
  int64_t N = logp->sizes[0];
  size_t rbytes = (size_t)N * sizeof(double) + 8, es = em_dtype_size(logp->dtype);
  double *rows = emi_malloc(S, rbytes);
  if (!rows) {
    emi_free(S, tg.t, tg.bytes);
    return emi_error(S, EM_ERR_NOMEM, "%s: out of memory", op);
  }
  const char *x = em_tensor_data(logp);
  for (int64_t i = 0; i < N; i++)
    rows[i] = tg.ign[i] ? 0 : -emi_load_f64(x + (i * logp->strides[0] +
                                                  tg.t[i] * logp->strides[1]) * (int64_t)es,
                                             logp->dtype);
  st = make_loss(S, op, logp->dtype, rows, N, (double)tg.count, reduction, loss);
  emi_free(S, rows, rbytes);
  emi_free(S, tg.t, tg.bytes);
  if (!st && emi_ag_wanted1(S, logp))
    return emi_ag_record_nll_loss(S, logp, target, index_base, ignore_index, reduction, loss);
  return st;
}

em_status em_nll_loss_backward(em_state *S, const em_tensor *grad_loss,
                               const em_tensor *logp, const em_tensor *target,
                               int index_base, int64_t ignore_index, int reduction,
                               em_tensor **grad_input) {
  const char *op = "nll_loss_backward";
  em_status st;
  if ((st = nn_check_float(S, op, "input", logp, -1)) ||
      (st = check_reduction(S, op, reduction)))
    return st;
  if (!grad_input) return emi_error(S, EM_ERR_ARG, "%s: grad_input is NULL", op);
  targets tg;
  if ((st = read_targets(S, op, logp, target, index_base, ignore_index, &tg))) return st;
  int64_t N = logp->sizes[0], C = logp->sizes[1];
  size_t gbytes = (size_t)N * sizeof(double) + 8, es = em_dtype_size(logp->dtype);
  double *gl = emi_malloc(S, gbytes);
  em_tensor *gx = NULL;
  if (!gl) st = emi_error(S, EM_ERR_NOMEM, "%s: out of memory", op);
  if (!st) st = read_grad(S, op, grad_loss, logp->dtype, N, reduction,
                          reduction == EM_REDUCE_MEAN ? 1.0 / (double)tg.count : 1.0, gl);
  if (!st) st = emi_tensor_new(S, op, logp->sizes, 2, logp->dtype, EM_CPU, &gx);
  if (!st) {
    memset(em_tensor_data(gx), 0, (size_t)gx->numel * es);
    char *p = em_tensor_data(gx);
    for (int64_t i = 0; i < N; i++)
      if (!tg.ign[i]) emi_store_f64(p + (i * C + tg.t[i]) * (int64_t)es, logp->dtype, -gl[i]);
  }
  if (gl) emi_free(S, gl, gbytes);
  emi_free(S, tg.t, tg.bytes);
  if (st) { em_tensor_release(gx); return st; }
  *grad_input = gx;
  return EM_OK;
}

static em_status pointwise(em_state *S, const char *op, int kind, const em_tensor *input,
                           const em_tensor *target, int reduction, em_tensor **loss) {
  em_status st;
  if ((st = nn_check_float(S, op, "input", input, -1)) ||
      (st = nn_check_float(S, op, "target", target, input->dtype)) ||
      (st = check_reduction(S, op, reduction)))
    return st;
  if (!nn_same_shape(input, target))
    return emi_error(S, EM_ERR_SHAPE, "%s: input %s and target %s must have the same shape",
                     op, emi_tshape(S, input), emi_tshape(S, target));
  if (!loss) return emi_error(S, EM_ERR_ARG, "%s: loss is NULL", op);
  em_tensor *t[3] = {0};
  if ((st = nn_contig(S, input, &t[0])) || (st = nn_contig(S, target, &t[1])))
    goto done;
  if (reduction == EM_REDUCE_NONE) {
    if ((st = emi_tensor_new(S, op, input->sizes, input->ndim, input->dtype, EM_CPU, &t[2])))
      goto done;
    emi_cpu_pointwise_loss(input->dtype, kind, input->numel, em_tensor_data(t[0]),
                           em_tensor_data(t[1]), em_tensor_data(t[2]));
  } else {
    if ((st = emi_tensor_new(S, op, NULL, 0, input->dtype, EM_CPU, &t[2]))) goto done;
    double s = emi_cpu_pointwise_loss(input->dtype, kind, input->numel, em_tensor_data(t[0]),
                                      em_tensor_data(t[1]), NULL);
    if (reduction == EM_REDUCE_MEAN) s /= (double)input->numel;
    emi_store_f64(em_tensor_data(t[2]), input->dtype, s);
  }
done:
  if (st) { nn_release(t, 3); return st; }
  *loss = t[2];
  nn_release(t, 2);
  return EM_OK;
}

static em_status pointwise_backward(em_state *S, const char *op, int kind,
                                    const em_tensor *grad, const em_tensor *input,
                                    const em_tensor *target, int reduction,
                                    em_tensor **grad_input) {
  em_status st;
  if ((st = nn_check_float(S, op, "input", input, -1)) ||
      (st = nn_check_float(S, op, "target", target, input->dtype)) ||
      (st = nn_check_float(S, op, "grad_loss", grad, input->dtype)) ||
      (st = check_reduction(S, op, reduction)))
    return st;
  if (!nn_same_shape(input, target))
    return emi_error(S, EM_ERR_SHAPE, "%s: input %s and target %s must have the same shape",
                     op, emi_tshape(S, input), emi_tshape(S, target));
  if (reduction == EM_REDUCE_NONE ? !nn_same_shape(grad, input) : grad->numel != 1)
    return emi_error(S, EM_ERR_SHAPE, "%s: grad_loss %s does not fit input %s (reduction %d)",
                     op, emi_tshape(S, grad), emi_tshape(S, input), reduction);
  if (!grad_input) return emi_error(S, EM_ERR_ARG, "%s: grad_input is NULL", op);
  em_tensor *t[4] = {0};   /* x, y, g, gx */
  if ((st = nn_contig(S, input, &t[0])) || (st = nn_contig(S, target, &t[1])) ||
      (st = nn_contig(S, grad, &t[2])) ||
      (st = emi_tensor_new(S, op, input->sizes, input->ndim, input->dtype, EM_CPU, &t[3]))) {
    nn_release(t, 4);
    return st;
  }
  double g = 1;
  if (reduction != EM_REDUCE_NONE) {
    g = emi_load_f64(em_tensor_data(t[2]), input->dtype);
    if (reduction == EM_REDUCE_MEAN) g /= (double)input->numel;
  }
  emi_cpu_pointwise_loss_backward(input->dtype, kind, input->numel, em_tensor_data(t[0]),
                                  em_tensor_data(t[1]),
                                  reduction == EM_REDUCE_NONE ? em_tensor_data(t[2]) : NULL,
                                  g, em_tensor_data(t[3]));
  *grad_input = t[3];
  nn_release(t, 3);
  return EM_OK;
}

em_status em_mse_loss(em_state *S, const em_tensor *input, const em_tensor *target,
                      int reduction, em_tensor **loss) {
  em_status st = pointwise(S, "mse_loss", EMI_LOSS_MSE, input, target, reduction, loss);
  if (!st && emi_ag_wanted2(S, input, target))
    return emi_ag_record_pointwise_loss(S, 0, input, target, reduction, loss);
  return st;
}
em_status em_mse_loss_backward(em_state *S, const em_tensor *grad_loss,
                               const em_tensor *input, const em_tensor *target,
                               int reduction, em_tensor **grad_input) {
  return pointwise_backward(S, "mse_loss_backward", EMI_LOSS_MSE, grad_loss, input, target,
                            reduction, grad_input);
}
em_status em_bce_with_logits(em_state *S, const em_tensor *input, const em_tensor *target,
                             int reduction, em_tensor **loss) {
  em_status st = pointwise(S, "bce_with_logits", EMI_LOSS_BCE_LOGITS, input, target,
                           reduction, loss);
  if (!st && emi_ag_wanted2(S, input, target))
    return emi_ag_record_pointwise_loss(S, 1, input, target, reduction, loss);
  return st;
}
em_status em_bce_with_logits_backward(em_state *S, const em_tensor *grad_loss,
                                      const em_tensor *input, const em_tensor *target,
                                      int reduction, em_tensor **grad_input) {
  return pointwise_backward(S, "bce_with_logits_backward", EMI_LOSS_BCE_LOGITS, grad_loss,
                            input, target, reduction, grad_input);
}

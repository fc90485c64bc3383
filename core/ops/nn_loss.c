/*
** nn_loss.c -- loss functions, forward and backward: cross_entropy (fused
** log_softmax + nll, label smoothing), nll_loss, mse_loss and
** binary_cross_entropy_with_logits. Semantics follow PyTorch 1.13: a target
** equal to ignore_index adds nothing and is not counted by the mean (0/0 = NaN
** when every target is ignored); the smoothed loss is
** (1-eps)*nll + eps*mean_c(-log p_c). Checks and output shapes here; targets
** are read and range-checked by the device's loss entries (the CPU backend's
** nn_loss.c).
*/
#include "nn_util.h"
#include "../autograd/grad_nn.h"

static em_status check_reduction(em_state *S, const char *op, int reduction) {
  if (reduction < EM_REDUCE_NONE || reduction > EM_REDUCE_SUM)
    return emi_error(S, EM_ERR_ARG, "%s: reduction %d is not none (0), mean (1) or sum (2)",
                     op, reduction);
  return EM_OK;
}

/* target (N) int32/int64 on logits' device, for logits (N, C). The values are
** range-checked by the kernels, as they read them. */
static em_status check_targets(em_state *S, const char *op, const em_tensor *logits,
                               const em_tensor *target) {
  em_status st = nn_check_index(S, op, "target", target, logits);
  if (st) return st;
  if (logits->ndim != 2)
    return emi_error(S, EM_ERR_SHAPE, "%s: input %s must be 2-D (N, C)", op,
                     emi_tshape(S, logits));
  int64_t N = logits->sizes[0];
  if (target->ndim != 1 || target->sizes[0] != N)
    return emi_error(S, EM_ERR_SHAPE, "%s: target %s must be [%lld] for input %s", op,
                     emi_tshape(S, target), (long long)N, emi_tshape(S, logits));
  return EM_OK;
}

/* grad_loss: (n) for reduction none, else one element; input's dtype and device. */
static em_status check_grad(em_state *S, const char *op, const em_tensor *grad,
                            const em_tensor *input, int64_t n, int reduction) {
  em_status st = nn_check_float(S, op, "grad_loss", grad, input);
  if (st) return st;
  if (reduction == EM_REDUCE_NONE) {
    if (grad->ndim != 1 || grad->sizes[0] != n)
      return emi_error(S, EM_ERR_SHAPE, "%s: grad_loss %s must be [%lld] (reduction none)",
                       op, emi_tshape(S, grad), (long long)n);
  } else if (grad->numel != 1) {
    return emi_error(S, EM_ERR_SHAPE, "%s: grad_loss %s must have one element", op,
                     emi_tshape(S, grad));
  }
  return EM_OK;
}

/* A fresh loss tensor: (n) for reduction none, else 0-d. */
static em_status new_loss(em_state *S, const char *op, const em_tensor *input, int64_t n,
                          int reduction, em_tensor **loss) {
  return emi_tensor_new(S, op, &n, reduction == EM_REDUCE_NONE ? 1 : 0, input->dtype,
                        input->device, loss);
}

em_status em_cross_entropy(em_state *S, const em_tensor *logits, const em_tensor *target,
                           int index_base, int64_t ignore_index, double label_smoothing,
                           int reduction, em_tensor **loss, em_tensor **lse) {
  const char *op = "cross_entropy";
  em_status st;
  if ((st = nn_check_float(S, op, "input", logits, NULL)) ||
      (st = check_reduction(S, op, reduction)))
    return st;
  if (!(label_smoothing >= 0 && label_smoothing <= 1))
    return emi_error(S, EM_ERR_ARG, "%s: label_smoothing %g must be in [0, 1]", op,
                     label_smoothing);
  if (!loss) return emi_error(S, EM_ERR_ARG, "%s: loss is NULL", op);
  if ((st = check_targets(S, op, logits, target))) return st;
  int64_t N = logits->sizes[0], C = logits->sizes[1];
  if (C < 1 && N > 0)
    return emi_error(S, EM_ERR_SHAPE, "%s: input %s has no classes", op, emi_tshape(S, logits));
  em_tensor *x = NULL, *lse_out = NULL, *l = NULL;   /* contiguous logits, outputs */
  if ((st = nn_contig(S, logits, &x)) ||
      (st = emi_tensor_new(S, op, &N, 1, logits->dtype, logits->device, &lse_out)) ||
      (st = new_loss(S, op, logits, N, reduction, &l)) ||
      (st = EMI_DISPATCH(S, op, x, cross_entropy, l, lse_out, x, target, index_base,
                         ignore_index, label_smoothing, reduction))) {
    NN_RELEASE(x, lse_out, l);
    return st;
  }
  em_tensor_release(x);
  *loss = l;   /* the recorder releases it on failure */
  if (emi_ag_wanted1(S, logits) &&
      (st = emi_ag_record_cross_entropy(S, logits, target, lse_out, index_base, ignore_index,
                                        label_smoothing, reduction, loss))) {
    em_tensor_release(lse_out);
    return st;
  }
  if (lse) *lse = lse_out;
  else em_tensor_release(lse_out);
  return EM_OK;
}

em_status em_cross_entropy_backward(em_state *S, const em_tensor *grad_loss,
                                    const em_tensor *logits, const em_tensor *target,
                                    const em_tensor *lse, int index_base,
                                    int64_t ignore_index, double label_smoothing,
                                    int reduction, em_tensor **grad_logits) {
  const char *op = "cross_entropy_backward";
  em_status st;
  if ((st = nn_check_float(S, op, "input", logits, NULL)) ||
      (st = check_reduction(S, op, reduction)) ||
      (st = nn_check_float(S, op, "lse", lse, logits)))
    return st;
  if (!grad_logits) return emi_error(S, EM_ERR_ARG, "%s: grad_logits is NULL", op);
  if ((st = check_targets(S, op, logits, target))) return st;
  int64_t N = logits->sizes[0];
  if (lse->ndim != 1 || lse->sizes[0] != N)
    return emi_error(S, EM_ERR_SHAPE, "%s: lse %s must be [%lld]", op, emi_tshape(S, lse),
                     (long long)N);
  if ((st = check_grad(S, op, grad_loss, logits, N, reduction))) return st;
  em_tensor *x = NULL, *lse_c = NULL, *gx = NULL;   /* contiguous inputs, the gradient */
  if ((st = nn_contig(S, logits, &x)) || (st = nn_contig(S, lse, &lse_c)) ||
      (st = emi_tensor_new(S, op, logits->sizes, 2, logits->dtype, logits->device, &gx)) ||
      (st = EMI_DISPATCH(S, op, x, cross_entropy_backward, gx, grad_loss, x, target, lse_c,
                         index_base, ignore_index, label_smoothing, reduction))) {
    NN_RELEASE(x, lse_c, gx);
    return st;
  }
  NN_RELEASE(x, lse_c);
  *grad_logits = gx;
  return EM_OK;
}

em_status em_nll_loss(em_state *S, const em_tensor *logp, const em_tensor *target,
                      int index_base, int64_t ignore_index, int reduction,
                      em_tensor **loss) {
  const char *op = "nll_loss";
  em_status st;
  if ((st = nn_check_float(S, op, "input", logp, NULL)) ||
      (st = check_reduction(S, op, reduction)))
    return st;
  if (!loss) return emi_error(S, EM_ERR_ARG, "%s: loss is NULL", op);
  if ((st = check_targets(S, op, logp, target))) return st;
  em_tensor *l = NULL;
  if ((st = new_loss(S, op, logp, logp->sizes[0], reduction, &l)) ||
      (st = EMI_DISPATCH(S, op, logp, nll_loss, l, logp, target, index_base, ignore_index,
                         reduction))) {
    em_tensor_release(l);
    return st;
  }
  *loss = l;
  if (emi_ag_wanted1(S, logp))
    return emi_ag_record_nll_loss(S, logp, target, index_base, ignore_index, reduction, loss);
  return EM_OK;
}

em_status em_nll_loss_backward(em_state *S, const em_tensor *grad_loss,
                               const em_tensor *logp, const em_tensor *target,
                               int index_base, int64_t ignore_index, int reduction,
                               em_tensor **grad_input) {
  const char *op = "nll_loss_backward";
  em_status st;
  if ((st = nn_check_float(S, op, "input", logp, NULL)) ||
      (st = check_reduction(S, op, reduction)))
    return st;
  if (!grad_input) return emi_error(S, EM_ERR_ARG, "%s: grad_input is NULL", op);
  if ((st = check_targets(S, op, logp, target)) ||
      (st = check_grad(S, op, grad_loss, logp, logp->sizes[0], reduction)))
    return st;
  em_tensor *gx = NULL;
  if ((st = emi_tensor_new(S, op, logp->sizes, 2, logp->dtype, logp->device, &gx)) ||
      (st = EMI_DISPATCH(S, op, logp, nll_loss_backward, gx, grad_loss, target, index_base,
                         ignore_index, reduction))) {
    em_tensor_release(gx);
    return st;
  }
  *grad_input = gx;
  return EM_OK;
}

static em_status pointwise(em_state *S, const char *op, int kind, const em_tensor *input,
                           const em_tensor *target, int reduction, em_tensor **loss) {
  em_status st;
  if ((st = nn_check_float(S, op, "input", input, NULL)) ||
      (st = nn_check_float(S, op, "target", target, input)) ||
      (st = check_reduction(S, op, reduction)))
    return st;
  if (!nn_same_shape(input, target))
    return emi_error(S, EM_ERR_SHAPE, "%s: input %s and target %s must have the same shape",
                     op, emi_tshape(S, input), emi_tshape(S, target));
  if (!loss) return emi_error(S, EM_ERR_ARG, "%s: loss is NULL", op);
  em_tensor *x = NULL, *y = NULL, *l = NULL;   /* contiguous input and target, the loss */
  if ((st = nn_contig(S, input, &x)) || (st = nn_contig(S, target, &y)) ||
      (st = emi_tensor_new(S, op, input->sizes, reduction == EM_REDUCE_NONE ? input->ndim : 0,
                           input->dtype, input->device, &l)) ||
      (st = EMI_DISPATCH(S, op, x, pointwise_loss, kind, l, x, y, reduction))) {
    NN_RELEASE(x, y, l);
    return st;
  }
  NN_RELEASE(x, y);
  *loss = l;
  return EM_OK;
}

static em_status pointwise_backward(em_state *S, const char *op, int kind,
                                    const em_tensor *grad, const em_tensor *input,
                                    const em_tensor *target, int reduction,
                                    em_tensor **grad_input) {
  em_status st;
  if ((st = nn_check_float(S, op, "input", input, NULL)) ||
      (st = nn_check_float(S, op, "target", target, input)) ||
      (st = nn_check_float(S, op, "grad_loss", grad, input)) ||
      (st = check_reduction(S, op, reduction)))
    return st;
  if (!nn_same_shape(input, target))
    return emi_error(S, EM_ERR_SHAPE, "%s: input %s and target %s must have the same shape",
                     op, emi_tshape(S, input), emi_tshape(S, target));
  if (reduction == EM_REDUCE_NONE ? !nn_same_shape(grad, input) : grad->numel != 1)
    return emi_error(S, EM_ERR_SHAPE, "%s: grad_loss %s does not fit input %s (reduction %d)",
                     op, emi_tshape(S, grad), emi_tshape(S, input), reduction);
  if (!grad_input) return emi_error(S, EM_ERR_ARG, "%s: grad_input is NULL", op);
  em_tensor *x = NULL, *y = NULL, *g = NULL, *gx = NULL;   /* contiguous inputs, gradient */
  if ((st = nn_contig(S, input, &x)) || (st = nn_contig(S, target, &y)) ||
      (st = nn_contig(S, grad, &g)) ||
      (st = emi_tensor_new(S, op, input->sizes, input->ndim, input->dtype, input->device,
                           &gx)) ||
      (st = EMI_DISPATCH(S, op, x, pointwise_loss_backward, kind, gx, g, x, y, reduction))) {
    NN_RELEASE(x, y, g, gx);
    return st;
  }
  NN_RELEASE(x, y, g);
  *grad_input = gx;
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

/*
** optim.c -- the optimizer update ops (em_sgd_step_, em_adam_step_): argument
** checks, then one fused kernel per parameter from the device's backend table
** (the CPU backend's optim.c). The Lua optimizers (lua/ember/optim/) keep the
** state tensors and hyper-parameters and call these once per parameter per step.
*/
#include <math.h>
#include "../internal.h"

static const char *dtname(em_dtype dt) { return em_dtype_name(dt); }

/* Every state tensor must be a contiguous, same-shape, same-dtype, same-device
** companion of the parameter: the kernels walk them all with one flat index. */
static em_status check_like(em_state *S, const char *op, const em_tensor *p,
                            const em_tensor *t, const char *what) {
  if (!t) return emi_error(S, EM_ERR_ARG, "%s: %s is NULL", op, what);
  if (t->numel != p->numel || t->ndim != p->ndim ||
      memcmp(t->sizes, p->sizes, sizeof(int64_t) * (size_t)p->ndim) != 0)
    return emi_error(S, EM_ERR_SHAPE, "%s: %s shape %s doesn't match the parameter's shape %s",
                     op, what, emi_tshape(S, t), emi_tshape(S, p));
  if (t->dtype != p->dtype)
    return emi_error(S, EM_ERR_DTYPE, "%s: %s dtype %s doesn't match the parameter's "
                     "dtype %s", op, what, dtname(t->dtype), dtname(p->dtype));
  if (t->device != p->device) {
    char a[32], b[32];
    return emi_error(S, EM_ERR_DEVICE, "%s: %s is on %s but the parameter is on %s", op,
                     what, emi_device_name(a, t->device), emi_device_name(b, p->device));
  }
  if (!em_tensor_is_contiguous(t))
    return emi_error(S, EM_ERR_ARG, "%s: %s of shape %s must be contiguous", op, what,
                     emi_tshape(S, t));
  return EM_OK;
}

static em_status check_param(em_state *S, const char *op, const em_tensor *p) {
  em_status st = emi_check_tensor(S, op, p);
  if (st) return st;
  if (p->dtype != EM_FLOAT32 && p->dtype != EM_FLOAT64)
    return emi_error(S, EM_ERR_DTYPE, "%s: parameters must be float32 or float64, got %s "
                     "(shape %s)", op, dtname(p->dtype), emi_tshape(S, p));
  if (!em_tensor_is_contiguous(p))
    return emi_error(S, EM_ERR_ARG, "%s: the parameter of shape %s must be contiguous",
                     op, emi_tshape(S, p));
  return EM_OK;
}

em_status em_sgd_step_(em_state *S, em_tensor *param, const em_tensor *grad,
                       em_tensor *momentum_buf, double lr, double momentum,
                       double dampening, double weight_decay, int nesterov,
                       int first_step) {
  const char *op = "sgd_step_";
  em_status st;
  if ((st = check_param(S, op, param)) || (st = check_like(S, op, param, grad, "grad")))
    return st;
  if (momentum != 0 && (st = check_like(S, op, param, momentum_buf, "momentum_buf")))
    return st;
  if (!(lr >= 0) || !(momentum >= 0) || !(weight_decay >= 0))
    return emi_error(S, EM_ERR_ARG, "%s: lr, momentum and weight_decay must be >= 0 "
                     "(got %g, %g, %g)", op, lr, momentum, weight_decay);
  if (nesterov && (momentum <= 0 || dampening != 0))
    return emi_error(S, EM_ERR_ARG, "%s: nesterov needs momentum > 0 and dampening = 0 "
                     "(got momentum %g, dampening %g)", op, momentum, dampening);
  if (param->numel == 0) return EM_OK;
  /* Like every in-place write: saved copies of the parameter (autograd) see it.
  ** An optimizer step is not recorded, as under PyTorch's no_grad. */
  emi_bump_version(param);
  if (momentum != 0) emi_bump_version(momentum_buf);
  return EMI_DISPATCH(S, "sgd_step", param, sgd_step, param, grad,
                      momentum != 0 ? momentum_buf : NULL, lr, momentum, dampening,
                      weight_decay, nesterov != 0, first_step != 0);
}

em_status em_adam_step_(em_state *S, em_tensor *param, const em_tensor *grad,
                        em_tensor *exp_avg, em_tensor *exp_avg_sq, double lr, double beta1,
                        double beta2, double eps, double weight_decay, int decoupled,
                        int64_t step) {
  const char *op = decoupled ? "adamw_step_" : "adam_step_";
  em_status st;
  if ((st = check_param(S, op, param)) || (st = check_like(S, op, param, grad, "grad")) ||
      (st = check_like(S, op, param, exp_avg, "exp_avg")) ||
      (st = check_like(S, op, param, exp_avg_sq, "exp_avg_sq")))
    return st;
  if (step < 1)
    return emi_error(S, EM_ERR_ARG, "%s: step counts from 1, got %lld", op, (long long)step);
  if (!(lr >= 0) || !(eps >= 0) || !(weight_decay >= 0) || !(beta1 >= 0 && beta1 < 1) ||
      !(beta2 >= 0 && beta2 < 1))
    return emi_error(S, EM_ERR_ARG, "%s: need lr, eps, weight_decay >= 0 and betas in "
                     "[0, 1) (got lr %g, betas (%g, %g), eps %g, weight_decay %g)", op, lr,
                     beta1, beta2, eps, weight_decay);
  if (param->numel == 0) return EM_OK;
  emi_bump_version(param);
  emi_bump_version(exp_avg);
  emi_bump_version(exp_avg_sq);
  double bc1 = 1 - pow(beta1, (double)step), bc2 = 1 - pow(beta2, (double)step);
  double decay = decoupled ? 1 - lr * weight_decay : 1;
  double wd = decoupled ? 0 : weight_decay;
  return EMI_DISPATCH(S, decoupled ? "adamw_step" : "adam_step", param, adam_step, param,
                      grad, exp_avg, exp_avg_sq, beta1, beta2, eps, wd, decay, lr / bc1,
                      sqrt(bc2));
}

/*
** optim.c -- the optimizer update ops: argument checks, then the device's backend
** table. em_sgd_step_multi_ / em_adam_step_multi_ update a list of parameters of
** one device and dtype with one backend call (on cuda one kernel launch for all,
** kernels/k_optim.c; on the CPU a fused pass per parameter, cpu/optim.c);
** em_sgd_step_ / em_adam_step_ are the lists of one, through the same entries, and
** em_clip_grad_norm_ does clip_grad_norm with one norm and one scaling call per
** device and dtype. The Lua optimizers (lua/ember/optim/) keep the state tensors
** and hyper-parameters and call the list forms once per group, device and dtype.
*/
#include <math.h>
#include "../internal.h"

static const char *dtname(em_dtype dt) { return em_dtype_name(dt); }

/* Every state tensor must be a dense, same-shape, same-dtype, same-device
** companion of the parameter in its memory order (contiguous, or channels last
** as the parameter): the kernels walk them all with one flat index. */
static bool dense(const em_tensor *t) {
  return em_tensor_is_contiguous(t) || em_tensor_is_channels_last(t);
}
static bool same_order(const em_tensor *p, const em_tensor *t) {
  return (em_tensor_is_contiguous(p) && em_tensor_is_contiguous(t)) ||
         (em_tensor_is_channels_last(p) && em_tensor_is_channels_last(t));
}
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
  if (!same_order(p, t))
    return emi_error(S, EM_ERR_ARG, "%s: %s of shape %s must be contiguous (or channels "
                     "last as its parameter)", op, what, emi_tshape(S, t));
  return EM_OK;
}

static em_status check_param(em_state *S, const char *op, const em_tensor *p) {
  em_status st = emi_check_tensor(S, op, p);
  if (st) return st;
  if (p->dtype != EM_FLOAT32 && p->dtype != EM_FLOAT64)
    return emi_error(S, EM_ERR_DTYPE, "%s: parameters must be float32 or float64, got %s "
                     "(shape %s)", op, dtname(p->dtype), emi_tshape(S, p));
  if (!dense(p))
    return emi_error(S, EM_ERR_ARG, "%s: the parameter of shape %s must be contiguous",
                     op, emi_tshape(S, p));
  return EM_OK;
}

/* -- The steps ----------------------------------------------------------------------
** One backend call per list (the CUDA backend: one kernel launch for all of them,
** kernels/k_optim.c). Each parameter is checked on its own; the list must share
** one device and one dtype, since a launch runs on one device and its kernel is
** compiled per dtype (lua/ember/optim groups the parameters so). Parameters
** without elements are dropped from the list handed to the backend. `rec` is the
** name the profiler records: the single forms keep their own. */

/* A scratch block for the compacted lists: `lists` arrays of n 8-byte entries
** (pointers, doubles; int arrays use part of one). */
typedef struct mlist {
  void *block;
  size_t bytes;
} mlist;

static void *mlist_alloc(em_state *S, const char *op, mlist *l, int n, int lists) {
  l->bytes = sizeof(double) * (size_t)(n > 0 ? n : 1) * (size_t)lists;
  l->block = emi_malloc(S, l->bytes);
  if (!l->block) emi_error(S, EM_ERR_NOMEM, "%s: out of memory for a list of %d", op, n);
  return l->block;
}

static em_status check_same_group(em_state *S, const char *op, em_tensor *const *params,
                                  int i) {
  const em_tensor *a = params[0], *b = params[i];
  if (b->device != a->device) {
    char x[32], y[32];
    return emi_error(S, EM_ERR_DEVICE, "%s: parameter %d is on %s but parameter 1 is on %s "
                     "(one call updates one device's parameters: group them by device)", op,
                     i + 1, emi_device_name(x, b->device), emi_device_name(y, a->device));
  }
  if (b->dtype != a->dtype)
    return emi_error(S, EM_ERR_DTYPE, "%s: parameter %d is %s but parameter 1 is %s (one "
                     "call updates parameters of one dtype: group them by dtype)", op, i + 1,
                     dtname(b->dtype), dtname(a->dtype));
  return EM_OK;
}

static em_status sgd_steps(em_state *S, const char *rec, int n, em_tensor *const *params,
                           const em_tensor *const *grads, em_tensor *const *momentum_bufs,
                           const int *first_steps, double lr, double momentum,
                           double dampening, double weight_decay, int nesterov) {
  const char *op = "sgd_step_";
  em_status st;
  if (n < 0 || (n > 0 && (!params || !grads || !first_steps)))
    return emi_error(S, EM_ERR_ARG, "%s: bad list (n %d, params %p, grads %p, first_steps %p)",
                     op, n, (const void *)params, (const void *)grads, (const void *)first_steps);
  if (momentum != 0 && n > 0 && !momentum_bufs)
    return emi_error(S, EM_ERR_ARG, "%s: momentum %g needs momentum_bufs", op, momentum);
  if (!(lr >= 0) || !(momentum >= 0) || !(weight_decay >= 0))
    return emi_error(S, EM_ERR_ARG, "%s: lr, momentum and weight_decay must be >= 0 "
                     "(got %g, %g, %g)", op, lr, momentum, weight_decay);
  if (nesterov && (momentum <= 0 || dampening != 0))
    return emi_error(S, EM_ERR_ARG, "%s: nesterov needs momentum > 0 and dampening = 0 "
                     "(got momentum %g, dampening %g)", op, momentum, dampening);
  for (int i = 0; i < n; i++) {
    if ((st = check_param(S, op, params[i])) ||
        (st = check_like(S, op, params[i], grads[i], "grad")) ||
        (momentum != 0 && (st = check_like(S, op, params[i], momentum_bufs[i],
                                           "momentum_buf"))) ||
        (st = check_same_group(S, op, params, i)))
      return st;
  }
  mlist l;
  void **blk = mlist_alloc(S, op, &l, n, 4);
  if (!blk) return EM_ERR_NOMEM;
  em_tensor **P = (em_tensor **)blk, **B = P + n;
  const em_tensor **G = (const em_tensor **)(B + n);
  int *F = (int *)(G + n);
  int k = 0;
  for (int i = 0; i < n; i++) {
    if (params[i]->numel == 0) continue;
    emi_bump_version(params[i]);
    if (momentum != 0) emi_bump_version(momentum_bufs[i]);
    P[k] = params[i];
    G[k] = grads[i];
    B[k] = momentum != 0 ? momentum_bufs[i] : NULL;
    F[k++] = first_steps[i] != 0;
  }
  st = EM_OK;
  if (k > 0)
    st = EMI_DISPATCH(S, rec, P[0], sgd_step_multi, k, P, G, momentum != 0 ? B : NULL, F,
                      lr, momentum, dampening, weight_decay, nesterov != 0);
  emi_free(S, l.block, l.bytes);
  return st;
}

static em_status adam_steps(em_state *S, const char *rec, int n, em_tensor *const *params,
                            const em_tensor *const *grads, em_tensor *const *exp_avgs,
                            em_tensor *const *exp_avg_sqs, const int64_t *steps, double lr,
                            double beta1, double beta2, double eps, double weight_decay,
                            int decoupled) {
  const char *op = decoupled ? "adamw_step_" : "adam_step_";
  em_status st;
  if (n < 0 || (n > 0 && (!params || !grads || !exp_avgs || !exp_avg_sqs || !steps)))
    return emi_error(S, EM_ERR_ARG, "%s: bad list (n %d, a list is NULL)", op, n);
  if (!(lr >= 0) || !(eps >= 0) || !(weight_decay >= 0) || !(beta1 >= 0 && beta1 < 1) ||
      !(beta2 >= 0 && beta2 < 1))
    return emi_error(S, EM_ERR_ARG, "%s: need lr, eps, weight_decay >= 0 and betas in "
                     "[0, 1) (got lr %g, betas (%g, %g), eps %g, weight_decay %g)", op, lr,
                     beta1, beta2, eps, weight_decay);
  for (int i = 0; i < n; i++) {
    if ((st = check_param(S, op, params[i])) ||
        (st = check_like(S, op, params[i], grads[i], "grad")) ||
        (st = check_like(S, op, params[i], exp_avgs[i], "exp_avg")) ||
        (st = check_like(S, op, params[i], exp_avg_sqs[i], "exp_avg_sq")) ||
        (st = check_same_group(S, op, params, i)))
      return st;
    if (steps[i] < 1)
      return emi_error(S, EM_ERR_ARG, "%s: step counts from 1, got %lld (parameter %d)", op,
                       (long long)steps[i], i + 1);
  }
  mlist l;
  void **blk = mlist_alloc(S, op, &l, n, 6);
  if (!blk) return EM_ERR_NOMEM;
  em_tensor **P = (em_tensor **)blk, **M = P + n, **V = M + n;
  const em_tensor **G = (const em_tensor **)(V + n);
  double *SS = (double *)(G + n), *BC = SS + n;
  int k = 0;
  for (int i = 0; i < n; i++) {
    if (params[i]->numel == 0) continue;
    emi_bump_version(params[i]);
    emi_bump_version(exp_avgs[i]);
    emi_bump_version(exp_avg_sqs[i]);
    P[k] = params[i];
    G[k] = grads[i];
    M[k] = exp_avgs[i];
    V[k] = exp_avg_sqs[i];
    emi_adam_factors(lr, beta1, beta2, steps[i], &SS[k], &BC[k]);
    k++;
  }
  double decay = decoupled ? 1 - lr * weight_decay : 1;
  double wd = decoupled ? 0 : weight_decay;
  st = EM_OK;
  if (k > 0)
    st = EMI_DISPATCH(S, rec, P[0], adam_step_multi, k, P, G, M, V, SS, BC, beta1, beta2,
                      eps, wd, decay);
  emi_free(S, l.block, l.bytes);
  return st;
}

em_status em_sgd_step_multi_(em_state *S, int n, em_tensor *const *params,
                             const em_tensor *const *grads, em_tensor *const *momentum_bufs,
                             const int *first_steps, double lr, double momentum,
                             double dampening, double weight_decay, int nesterov) {
  return sgd_steps(S, "sgd_step_multi", n, params, grads, momentum_bufs, first_steps, lr,
                   momentum, dampening, weight_decay, nesterov);
}

em_status em_sgd_step_(em_state *S, em_tensor *param, const em_tensor *grad,
                       em_tensor *momentum_buf, double lr, double momentum,
                       double dampening, double weight_decay, int nesterov,
                       int first_step) {
  return sgd_steps(S, "sgd_step", 1, &param, &grad, &momentum_buf, &first_step, lr,
                   momentum, dampening, weight_decay, nesterov);
}

em_status em_adam_step_multi_(em_state *S, int n, em_tensor *const *params,
                              const em_tensor *const *grads, em_tensor *const *exp_avgs,
                              em_tensor *const *exp_avg_sqs, const int64_t *steps, double lr,
                              double beta1, double beta2, double eps, double weight_decay,
                              int decoupled) {
  return adam_steps(S, decoupled ? "adamw_step_multi" : "adam_step_multi", n, params, grads,
                    exp_avgs, exp_avg_sqs, steps, lr, beta1, beta2, eps, weight_decay,
                    decoupled);
}

em_status em_adam_step_(em_state *S, em_tensor *param, const em_tensor *grad,
                        em_tensor *exp_avg, em_tensor *exp_avg_sq, double lr, double beta1,
                        double beta2, double eps, double weight_decay, int decoupled,
                        int64_t step) {
  return adam_steps(S, decoupled ? "adamw_step" : "adam_step", 1, &param, &grad, &exp_avg,
                    &exp_avg_sq, &step, lr, beta1, beta2, eps, weight_decay, decoupled);
}

/* -- clip_grad_norm -------------------------------------------------------------------
** Per (device, dtype) group, in order of first appearance: one norm_multi into a
** 0-D float64 tensor, read back (the total is returned as a number, so the host
** waits here anyway); the groups' raw sums (or maxima) fold in that order, then the
** root; then, when clipping, one scale_multi per group. clip_body does this
** (args: max_norm, norm_type); a compiled step records it as one call that each
** replay runs again (emi_compile_host_call), since what it does depends on the
** norm it reads. */
static em_status clip_body(em_state *S, int n, em_tensor *const *grads, const double *args,
                           double *total_norm) {
  const char *op = "clip_grad_norm";
  double max_norm = args[0], norm_type = args[1];
  em_status st;
  mlist l;
  void **blk = mlist_alloc(S, op, &l, n, 3);
  if (!blk) return EM_ERR_NOMEM;
  em_tensor **T = (em_tensor **)blk, **outs = T + n;   /* outs[g]: group g's sum */
  int *grp = (int *)(outs + n);   /* grp[i]: the group of grads[i], -1 if empty */
  int ng = 0;
  for (int i = 0; i < n; i++) {
    grp[i] = -1;
    if (grads[i]->numel == 0) continue;
    for (int j = 0; j < i && grp[i] < 0; j++)
      if (grp[j] >= 0 && grads[j]->device == grads[i]->device &&
          grads[j]->dtype == grads[i]->dtype)
        grp[i] = grp[j];
    if (grp[i] < 0) grp[i] = ng++;
  }
  int inf = isinf(norm_type);
  double raw = 0;
  st = EM_OK;
  /* Every group's norm is queued before the first is read, so devices work at
  ** once and each is waited for once. A group's members, in order, go to T[0..k). */
  for (int gi = 0; gi < ng; gi++) outs[gi] = NULL;
  for (int gi = 0; gi < ng && !st; gi++) {
    int k = 0;
    for (int i = 0; i < n; i++)
      if (grp[i] == gi) T[k++] = grads[i];
    int64_t one = 1;
    if (!(st = emi_tensor_new(S, op, &one, 0, EM_FLOAT64, T[0]->device, &outs[gi])))
      st = EMI_DISPATCH(S, op, T[0], norm_multi, outs[gi], k, (const em_tensor *const *)T,
                        norm_type);
  }
  int meta = 0;                        /* no values on meta: the total is NaN */
  for (int gi = 0; gi < ng; gi++) {
    double v = 0;
    if (!st && outs[gi] && outs[gi]->device == EM_META) { meta = 1; v = NAN; }
    else if (!st && outs[gi]) st = em_tensor_item(S, outs[gi], &v);
    em_tensor_release(outs[gi]);
    if (inf) raw = (v > raw || v != v) ? v : raw;
    else raw += v;
  }
  double total = inf ? raw : norm_type == 2 ? sqrt(raw) : norm_type == 1 ? raw
                 : pow(raw, 1 / norm_type);
  double coef = max_norm / (total + 1e-6);
  for (int gi = 0; gi < ng && !st && (coef < 1 || meta); gi++) {
    int k = 0;
    for (int i = 0; i < n; i++)
      if (grp[i] == gi) {
        emi_bump_version(grads[i]);
        T[k++] = grads[i];
      }
    st = EMI_DISPATCH(S, "clip_grad_scale", T[0], scale_multi, k, T, coef);
  }
  emi_free(S, l.block, l.bytes);
  if (!st) *total_norm = total;
  return st;
}

em_status em_clip_grad_norm_(em_state *S, int n, em_tensor *const *grads, double max_norm,
                             double norm_type, double *total_norm) {
  const char *op = "clip_grad_norm";
  em_status st;
  if (n < 0 || (n > 0 && !grads) || !total_norm)
    return emi_error(S, EM_ERR_ARG, "%s: bad list (n %d)", op, n);
  if (!(norm_type > 0))
    return emi_error(S, EM_ERR_ARG, "%s: norm_type must be > 0 or inf, got %g", op, norm_type);
  if (max_norm != max_norm)
    return emi_error(S, EM_ERR_ARG, "%s: max_norm is NaN", op);
  for (int i = 0; i < n; i++) {
    const em_tensor *g = grads[i];
    if ((st = emi_check_tensor(S, op, g))) return st;
    if (g->dtype != EM_FLOAT32 && g->dtype != EM_FLOAT64)
      return emi_error(S, EM_ERR_DTYPE, "%s: gradient %d is %s (shape %s); gradients must be "
                       "float32 or float64", op, i + 1, dtname(g->dtype), emi_tshape(S, g));
    if (!dense(g))
      return emi_error(S, EM_ERR_ARG, "%s: gradient %d of shape %s must be contiguous", op,
                       i + 1, emi_tshape(S, g));
  }
  double args[2] = {max_norm, norm_type};
  return emi_compile_host_call(S, op, clip_body, n, grads, args, 2, total_norm);
}

/*
** nn_normalize.c -- the normalization layers batch_norm and layer_norm, forward
** and backward: checks, output shapes and contiguous inputs, then the device's
** entries (the CPU backend's normalize.c), which also move batch norm's running
** statistics -- an in-place write, so it bumps their storage versions here. Batch
** norm also takes a float16/bfloat16 input with float32 parameters and statistics
** (bn_param_dtype); layer norm takes one dtype throughout.
*/
#include "nn_util.h"
#include "../autograd/grad_nn.h"
#include <math.h>

static bool half_dtype(em_dtype dt) { return dt == EM_FLOAT16 || dt == EM_BFLOAT16; }

/* Batch norm's parameters and statistics (weight, bias, running and saved mean and
** variance): of input's dtype, or float32 for a float16/bfloat16 input -- autocast
** keeps them float32, as PyTorch's kernels and cuDNN take them, and the op
** computes in float32 and returns the input's dtype. */
static em_dtype bn_param_dtype(const em_tensor *input) {
  return half_dtype(input->dtype) ? EM_FLOAT32 : input->dtype;
}

static em_status check_vec(em_state *S, const char *op, const char *what,
                           const em_tensor *t, const em_tensor *input, int64_t C) {
  em_status st;
  if (half_dtype(input->dtype)) {
    if ((st = emi_check_tensor(S, op, t))) return st;
    if (t->dtype != EM_FLOAT32)
      return emi_error(S, EM_ERR_DTYPE, "%s: %s has dtype %s but a %s input takes float32 "
                       "%s (parameters and statistics stay float32)", op, what,
                       em_dtype_name(t->dtype), em_dtype_name(input->dtype), what);
    st = nn_check_device(S, op, what, t, input);
  } else {
    st = nn_check_float(S, op, what, t, input);
  }
  if (st) return st;
  if (t->ndim != 1 || t->sizes[0] != C)
    return emi_error(S, EM_ERR_SHAPE, "%s: %s %s must be [%lld]", op, what, emi_tshape(S, t),
                     (long long)C);
  return EM_OK;
}

static em_status bn_input(em_state *S, const char *op, const em_tensor *input, int64_t *N,
                          int64_t *C, int64_t *L) {
  em_status st = nn_check_floating(S, op, "input", input, NULL);
  if (st) return st;
  if (input->ndim < 2)
    return emi_error(S, EM_ERR_SHAPE, "%s: input %s must have at least 2 dims (N, C, ...)",
                     op, emi_tshape(S, input));
  *N = input->sizes[0];
  *C = input->sizes[1];
  *L = 1;
  for (int d = 2; d < input->ndim; d++) *L *= input->sizes[d];
  return EM_OK;
}

em_status em_batch_norm(em_state *S, const em_tensor *input, const em_tensor *weight,
                        const em_tensor *bias, em_tensor *running_mean,
                        em_tensor *running_var, int training, double momentum,
                        double eps, em_tensor **out, em_tensor **save_mean,
                        em_tensor **save_invstd) {
  const char *op = "batch_norm";
  int64_t N = 0, C = 0, L = 0;
  em_status st = bn_input(S, op, input, &N, &C, &L);
  if (st) return st;
  em_dtype dt = input->dtype;
  if ((weight && (st = check_vec(S, op, "weight", weight, input, C))) ||
      (bias && (st = check_vec(S, op, "bias", bias, input, C))) ||
      (running_mean && (st = check_vec(S, op, "running_mean", running_mean, input, C))) ||
      (running_var && (st = check_vec(S, op, "running_var", running_var, input, C))))
    return st;
  if (!training && (!running_mean || !running_var))
    return emi_error(S, EM_ERR_ARG, "%s: running_mean and running_var are required when "
                     "not training", op);
  if (training && N * L <= 1)
    return emi_error(S, EM_ERR_SHAPE, "%s: expected more than 1 value per channel when "
                     "training, got input %s", op, emi_tshape(S, input));
  if (!out) return emi_error(S, EM_ERR_ARG, "%s: out is NULL", op);
  em_tensor *x = NULL, *w = NULL, *b = NULL;           /* contiguous inputs */
  em_tensor *y = NULL, *mean = NULL, *invstd = NULL;   /* outputs */
  int dev = input->device;
  /* a channels-last input keeps its layout (see nn_util.h) */
  bool nhwc = emi_nhwc(input), kn = nhwc && nn_serves_nhwc(S, dev, EMI_NHWC_BN);
  if ((st = nn_layout(S, input, kn, &x)) || (weight && (st = nn_contig(S, weight, &w))) ||
      (bias && (st = nn_contig(S, bias, &b))) ||
      (st = emi_tensor_new_fmt(S, op, input->sizes, input->ndim, dt, dev, kn, &y)) ||
      (st = emi_tensor_new(S, op, &C, 1, bn_param_dtype(input), dev, &mean)) ||
      (st = emi_tensor_new(S, op, &C, 1, bn_param_dtype(input), dev, &invstd)))
    goto done;
  st = EMI_DISPATCH(S, op, x, batch_norm, y, mean, invstd, running_mean, running_var, x, w, b,
                    training, momentum, eps);
  if (!st && training) {   /* the running statistics moved */
    if (running_mean) emi_bump_version(running_mean);
    if (running_var) emi_bump_version(running_var);
  }
  if (!st && nhwc && !kn) st = nn_relayout(S, &y, true);
done:
  NN_RELEASE(x, w, b);
  if (st) { NN_RELEASE(y, mean, invstd); return st; }
  *out = y;   /* the recorder releases it on failure */
  if (emi_ag_wanted_opt(S, input, weight, bias) &&
      (st = emi_ag_record_batch_norm(S, input, weight, bias, mean, invstd, training, out))) {
    NN_RELEASE(mean, invstd);
    return st;
  }
  if (save_mean) *save_mean = mean; else em_tensor_release(mean);
  if (save_invstd) *save_invstd = invstd; else em_tensor_release(invstd);
  return EM_OK;
}

em_status em_batch_norm_backward(em_state *S, const em_tensor *grad_out,
                                 const em_tensor *input, const em_tensor *weight,
                                 const em_tensor *save_mean,
                                 const em_tensor *save_invstd, int training,
                                 em_tensor **grad_input, em_tensor **grad_weight,
                                 em_tensor **grad_bias) {
  const char *op = "batch_norm_backward";
  int64_t N = 0, C = 0, L = 0;
  em_status st = bn_input(S, op, input, &N, &C, &L);
  if (st) return st;
  em_dtype dt = input->dtype;
  if ((st = nn_check_floating(S, op, "grad_out", grad_out, input)) ||
      (weight && (st = check_vec(S, op, "weight", weight, input, C))) ||
      (st = check_vec(S, op, "save_mean", save_mean, input, C)) ||
      (st = check_vec(S, op, "save_invstd", save_invstd, input, C)))
    return st;
  if (!nn_same_shape(grad_out, input))
    return emi_error(S, EM_ERR_SHAPE, "%s: grad_out %s does not match input %s", op,
                     emi_tshape(S, grad_out), emi_tshape(S, input));
  /* contiguous inputs, then the gradients asked for */
  em_tensor *gy = NULL, *x = NULL, *w = NULL, *mean = NULL, *invstd = NULL;
  em_tensor *gx = NULL, *gw = NULL, *gb = NULL;
  int dev = input->device;
  bool nhwc = emi_nhwc(input), kn = nhwc && nn_serves_nhwc(S, dev, EMI_NHWC_BN);
  if ((st = nn_layout(S, grad_out, kn, &gy)) || (st = nn_layout(S, input, kn, &x)) ||
      (weight && (st = nn_contig(S, weight, &w))) ||
      (st = nn_contig(S, save_mean, &mean)) || (st = nn_contig(S, save_invstd, &invstd)) ||
      (grad_input &&
       (st = emi_tensor_new_fmt(S, op, input->sizes, input->ndim, dt, dev, kn, &gx))) ||
      (grad_weight && (st = emi_tensor_new(S, op, &C, 1, bn_param_dtype(input), dev, &gw))) ||
      (grad_bias && (st = emi_tensor_new(S, op, &C, 1, bn_param_dtype(input), dev, &gb))))
    goto done;
  st = EMI_DISPATCH(S, op, x, batch_norm_backward, gx, gw, gb, gy, x, mean, invstd, w,
                    training);
  if (!st && nhwc && !kn) st = nn_relayout(S, &gx, true);
done:
  NN_RELEASE(gy, x, w, mean, invstd);
  if (st) { NN_RELEASE(gx, gw, gb); return st; }
  if (grad_input) *grad_input = gx;
  if (grad_weight) *grad_weight = gw;
  if (grad_bias) *grad_bias = gb;
  return EM_OK;
}

/* Rows M and row length K of layer norm, with weight/bias checked against the
** normalized shape (input's last k dims). */
static em_status ln_setup(em_state *S, const char *op, const em_tensor *input, int k,
                          const em_tensor *weight, const em_tensor *bias, int64_t *M,
                          int64_t *K) {
  em_status st = nn_check_float(S, op, "input", input, NULL);
  if (st) return st;
  if (k < 1 || k > input->ndim)
    return emi_error(S, EM_ERR_ARG, "%s: normalized_ndim %d out of range for input %s", op,
                     k, emi_tshape(S, input));
  const em_tensor *wb[2] = {weight, bias};
  const char *nm[2] = {"weight", "bias"};
  for (int i = 0; i < 2; i++) {
    if (!wb[i]) continue;
    if ((st = nn_check_float(S, op, nm[i], wb[i], input))) return st;
    if (wb[i]->ndim != k ||
        memcmp(wb[i]->sizes, input->sizes + input->ndim - k, sizeof(int64_t) * k))
      return emi_error(S, EM_ERR_SHAPE, "%s: %s %s does not match the last %d dims of "
                       "input %s", op, nm[i], emi_tshape(S, wb[i]), k, emi_tshape(S, input));
  }
  *M = 1;
  *K = 1;
  for (int d = 0; d < input->ndim; d++) {
    if (d < input->ndim - k) *M *= input->sizes[d];
    else *K *= input->sizes[d];
  }
  return EM_OK;
}

em_status em_layer_norm(em_state *S, const em_tensor *input, int normalized_ndim,
                        const em_tensor *weight, const em_tensor *bias, double eps,
                        em_tensor **out, em_tensor **mean, em_tensor **rstd) {
  const char *op = "layer_norm";
  int64_t M = 0, K = 0;
  em_status st = ln_setup(S, op, input, normalized_ndim, weight, bias, &M, &K);
  if (st) return st;
  if (!out) return emi_error(S, EM_ERR_ARG, "%s: out is NULL", op);
  int64_t sshape[EM_MAX_DIMS];
  memcpy(sshape, input->sizes, sizeof(int64_t) * input->ndim);
  for (int d = input->ndim - normalized_ndim; d < input->ndim; d++) sshape[d] = 1;
  em_tensor *x = NULL, *w = NULL, *b = NULL;                 /* contiguous inputs */
  em_tensor *y = NULL, *mean_out = NULL, *rstd_out = NULL;   /* outputs */
  em_dtype dt = input->dtype;
  int dev = input->device;
  if ((st = nn_contig(S, input, &x)) || (weight && (st = nn_contig(S, weight, &w))) ||
      (bias && (st = nn_contig(S, bias, &b))) ||
      (st = emi_tensor_new(S, op, input->sizes, input->ndim, dt, dev, &y)) ||
      (st = emi_tensor_new(S, op, sshape, input->ndim, dt, dev, &mean_out)) ||
      (st = emi_tensor_new(S, op, sshape, input->ndim, dt, dev, &rstd_out)))
    goto done;
  if (K > 0 && M > 0)
    st = EMI_DISPATCH(S, op, x, layer_norm, y, mean_out, rstd_out, x, w, b, eps);
  else if (M > 0 && !(st = EMI_DISPATCH(S, op, mean_out, fill, mean_out, 0)))  /* empty rows */
    st = EMI_DISPATCH(S, op, rstd_out, fill, rstd_out, NAN);
done:
  NN_RELEASE(x, w, b);
  if (st) { NN_RELEASE(y, mean_out, rstd_out); return st; }
  *out = y;   /* the recorder releases it on failure */
  if (emi_ag_wanted_opt(S, input, weight, bias) &&
      (st = emi_ag_record_layer_norm(S, input, normalized_ndim, weight, bias, mean_out,
                                     rstd_out, out))) {
    NN_RELEASE(mean_out, rstd_out);
    return st;
  }
  if (mean) *mean = mean_out; else em_tensor_release(mean_out);
  if (rstd) *rstd = rstd_out; else em_tensor_release(rstd_out);
  return EM_OK;
}

em_status em_layer_norm_backward(em_state *S, const em_tensor *grad_out,
                                 const em_tensor *input, int normalized_ndim,
                                 const em_tensor *mean, const em_tensor *rstd,
                                 const em_tensor *weight, em_tensor **grad_input,
                                 em_tensor **grad_weight, em_tensor **grad_bias) {
  const char *op = "layer_norm_backward";
  int64_t M = 0, K = 0;
  em_status st = ln_setup(S, op, input, normalized_ndim, weight, NULL, &M, &K);
  if (st) return st;
  em_dtype dt = input->dtype;
  if ((st = nn_check_float(S, op, "grad_out", grad_out, input)) ||
      (st = nn_check_float(S, op, "mean", mean, input)) ||
      (st = nn_check_float(S, op, "rstd", rstd, input)))
    return st;
  if (!nn_same_shape(grad_out, input) || mean->numel != M || rstd->numel != M)
    return emi_error(S, EM_ERR_SHAPE, "%s: grad_out %s, mean %s or rstd %s do not fit "
                     "input %s", op, emi_tshape(S, grad_out), emi_tshape(S, mean),
                     emi_tshape(S, rstd), emi_tshape(S, input));
  const int64_t *ns = input->sizes + input->ndim - normalized_ndim;
  int dev = input->device;
  /* contiguous inputs, then the gradients asked for */
  em_tensor *gy = NULL, *x = NULL, *mean_c = NULL, *rstd_c = NULL, *w = NULL;
  em_tensor *gx = NULL, *gw = NULL, *gb = NULL;
  if ((st = nn_contig(S, grad_out, &gy)) || (st = nn_contig(S, input, &x)) ||
      (st = nn_contig(S, mean, &mean_c)) || (st = nn_contig(S, rstd, &rstd_c)) ||
      (weight && (st = nn_contig(S, weight, &w))) ||
      (grad_input && (st = emi_tensor_new(S, op, input->sizes, input->ndim, dt, dev, &gx))) ||
      (grad_weight && (st = emi_tensor_new(S, op, ns, normalized_ndim, dt, dev, &gw))) ||
      (grad_bias && (st = emi_tensor_new(S, op, ns, normalized_ndim, dt, dev, &gb))))
    goto done;
  if (K > 0)   /* M may be 0: then gw, gb are zeros */
    st = EMI_DISPATCH(S, op, x, layer_norm_backward, gx, gw, gb, gy, x, mean_c, rstd_c, w);
done:
  NN_RELEASE(gy, x, mean_c, rstd_c, w);
  if (st) { NN_RELEASE(gx, gw, gb); return st; }
  if (grad_input) *grad_input = gx;
  if (grad_weight) *grad_weight = gw;
  if (grad_bias) *grad_bias = gb;
  return EM_OK;
}

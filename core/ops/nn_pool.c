/*
** nn_pool.c -- max_pool2d, avg_pool2d and adaptive_avg_pool2d (forward and
** backward) on (N,C,H,W) or (C,H,W): checks and output shapes as PyTorch, then
** the device's pooling entries (the CPU backend's pool.c; pool_nhwc.c for
** channels-last inputs, whose outputs and gradients stay channels last).
*/
#include "nn_util.h"
#include "../autograd/grad_nn.h"

static em_status pool_input(em_state *S, const char *op, const em_tensor *input) {
  em_status st = nn_check_floating(S, op, "input", input, NULL);
  if (st) return st;
  if (input->ndim != 3 && input->ndim != 4)
    return emi_error(S, EM_ERR_SHAPE, "%s: input %s must have 3 or 4 dims ((N,)C,H,W)", op,
                     emi_tshape(S, input));
  int nd = input->ndim;
  if (input->sizes[nd - 2] < 1 || input->sizes[nd - 1] < 1)
    return emi_error(S, EM_ERR_SHAPE, "%s: input %s has an empty plane", op,
                     emi_tshape(S, input));
  return EM_OK;
}

/* PyTorch's pooling_output_shape. */
static int64_t pool_out(int64_t in, int64_t k, int64_t p, int64_t s, int64_t d, int ceil) {
  int64_t num = in + 2 * p - d * (k - 1) - 1 + (ceil ? s - 1 : 0);
  int64_t o = (num >= 0 ? num / s : -((-num + s - 1) / s)) + 1;
  if (ceil && (o - 1) * s >= in + p) o--;
  return o;
}

static em_status pool_geom(em_state *S, const char *op, const em_tensor *input,
                           const int64_t *kernel, const int64_t *stride,
                           const int64_t *padding, const int64_t *dilation, int ceil,
                           emi_pool_geom *g) {
  em_status st = pool_input(S, op, input);
  if (st) return st;
  if (!kernel || !padding)
    return emi_error(S, EM_ERR_ARG, "%s: kernel and padding are required", op);
  const int64_t *s = stride ? stride : kernel;
  int64_t one[2] = {1, 1};
  const int64_t *d = dilation ? dilation : one;
  if (kernel[0] < 1 || kernel[1] < 1 || s[0] < 1 || s[1] < 1 || d[0] < 1 || d[1] < 1)
    return emi_error(S, EM_ERR_ARG, "%s: kernel (%lld,%lld), stride (%lld,%lld) and "
                     "dilation must be positive", op, (long long)kernel[0],
                     (long long)kernel[1], (long long)s[0], (long long)s[1]);
  if (padding[0] < 0 || padding[1] < 0 || padding[0] > kernel[0] / 2 ||
      padding[1] > kernel[1] / 2)
    return emi_error(S, EM_ERR_ARG, "%s: padding (%lld,%lld) must be >= 0 and at most half "
                     "of kernel (%lld,%lld)", op, (long long)padding[0],
                     (long long)padding[1], (long long)kernel[0], (long long)kernel[1]);
  int nd = input->ndim;
  *g = (emi_pool_geom){.H = input->sizes[nd - 2], .W = input->sizes[nd - 1],
                       .kH = kernel[0], .kW = kernel[1], .sH = s[0], .sW = s[1],
                       .pH = padding[0], .pW = padding[1], .dH = d[0], .dW = d[1]};
  g->planes = input->sizes[nd - 3] * (nd == 4 ? input->sizes[0] : 1);
  g->OH = pool_out(g->H, g->kH, g->pH, g->sH, g->dH, ceil);
  g->OW = pool_out(g->W, g->kW, g->pW, g->sW, g->dW, ceil);
  if (g->OH < 1 || g->OW < 1)
    return emi_error(S, EM_ERR_SHAPE, "%s: input %s is too small for kernel (%lld,%lld): "
                     "output would be %lldx%lld", op, emi_tshape(S, input),
                     (long long)kernel[0], (long long)kernel[1], (long long)g->OH,
                     (long long)g->OW);
  return EM_OK;
}

/* Channels last: an NHWC input keeps its layout (the output and the gradient are
** NHWC); the backend computes in NHWC where it serves it (g->nhwc), else in NCHW
** with the output reordered. Returns whether the input is NHWC. */
static bool pool_layout(em_state *S, const em_tensor *input, emi_pool_geom *g) {
  bool nhwc = input->ndim == 4 && emi_nhwc(input);
  g->nhwc = nhwc && nn_serves_nhwc(S, input->device, EMI_NHWC_POOL);
  g->C = input->sizes[input->ndim - 3];
  return nhwc;
}

/* grad_out as a channels-last backward kernel takes it: NHWC, or NCHW as it is
** (those kernels read gy through its strides; a flatten's backward gives NCHW). */
static em_status pool_grad(em_state *S, const em_tensor *grad_out, bool nhwc, em_tensor **gy) {
  if (nhwc && em_tensor_is_contiguous(grad_out)) {
    em_tensor_retain((em_tensor *)grad_out);
    *gy = (em_tensor *)grad_out;
    return EM_OK;
  }
  return nn_layout(S, grad_out, nhwc, gy);
}

static void out_shape(const em_tensor *input, const emi_pool_geom *g, int64_t *shape) {
  int nd = input->ndim;
  memcpy(shape, input->sizes, sizeof(int64_t) * nd);
  shape[nd - 2] = g->OH;
  shape[nd - 1] = g->OW;
}

/* grad_out must have the output's shape. */
static em_status check_grad(em_state *S, const char *op, const em_tensor *grad_out,
                            const em_tensor *input, const emi_pool_geom *g) {
  em_status st = nn_check_floating(S, op, "grad_out", grad_out, input);
  if (st) return st;
  int64_t shape[EM_MAX_DIMS];
  out_shape(input, g, shape);
  if (grad_out->ndim != input->ndim ||
      memcmp(grad_out->sizes, shape, sizeof(int64_t) * input->ndim))
    return emi_error(S, EM_ERR_SHAPE, "%s: grad_out %s does not match the output shape %s",
                     op, emi_tshape(S, grad_out),
                     emi_shape_str((char[EMI_SHAPE_STR]){0}, shape, input->ndim));
  return EM_OK;
}

em_status em_max_pool2d(em_state *S, const em_tensor *input, const int64_t *kernel,
                        const int64_t *stride, const int64_t *padding,
                        const int64_t *dilation, int ceil_mode, int index_base,
                        em_tensor **out, em_tensor **indices) {
  const char *op = "max_pool2d";
  emi_pool_geom g;
  em_status st = pool_geom(S, op, input, kernel, stride, padding, dilation, ceil_mode, &g);
  if (st) return st;
  if (!out) return emi_error(S, EM_ERR_ARG, "%s: out is NULL", op);
  int64_t shape[EM_MAX_DIMS];
  out_shape(input, &g, shape);
  em_tensor *x = NULL, *y = NULL, *ind = NULL;   /* dense input, outputs */
  bool nhwc = pool_layout(S, input, &g);
  if ((st = nn_layout(S, input, g.nhwc, &x)) ||
      (st = emi_tensor_new_fmt(S, op, shape, input->ndim, input->dtype, input->device, g.nhwc,
                               &y)) ||
      (st = emi_tensor_new_fmt(S, op, shape, input->ndim, EM_INT64, input->device, g.nhwc,
                               &ind)) ||
      (st = EMI_DISPATCH(S, op, x, max_pool2d, &g, y, ind, x, index_base)) ||
      (nhwc && !g.nhwc && ((st = nn_relayout(S, &y, true)) ||
                           (st = nn_relayout(S, &ind, true))))) {
    NN_RELEASE(x, y, ind);
    return st;
  }
  em_tensor_release(x);
  *out = y;   /* the recorder releases it on failure */
  if (emi_ag_wanted1(S, input) &&
      (st = emi_ag_record_max_pool2d(S, input, ind, index_base, out))) {
    em_tensor_release(ind);
    return st;
  }
  if (indices) *indices = ind;
  else em_tensor_release(ind);
  return EM_OK;
}

em_status em_max_pool2d_backward(em_state *S, const em_tensor *grad_out,
                                 const em_tensor *input, const em_tensor *indices,
                                 int index_base, em_tensor **grad_input) {
  return emi_max_pool2d_backward(S, grad_out, input, indices, index_base, 0, grad_input);
}

em_status emi_max_pool2d_backward(em_state *S, const em_tensor *grad_out,
                                  const em_tensor *input, const em_tensor *indices,
                                  int index_base, int own, em_tensor **grad_input) {
  const char *op = "max_pool2d_backward";
  em_status st = pool_input(S, op, input);
  if (st) return st;
  if ((st = nn_check_floating(S, op, "grad_out", grad_out, input))) return st;
  if ((st = emi_check_tensor(S, op, indices))) return st;
  if (indices->dtype != EM_INT64)
    return emi_error(S, EM_ERR_DTYPE, "%s: indices have dtype %s; int64 expected", op,
                     em_dtype_name(indices->dtype));
  if ((st = nn_check_device(S, op, "indices", indices, input))) return st;
  int nd = input->ndim;
  if (!nn_same_shape(grad_out, indices) || grad_out->ndim != nd ||
      memcmp(grad_out->sizes, input->sizes, sizeof(int64_t) * (nd - 2)))
    return emi_error(S, EM_ERR_SHAPE, "%s: grad_out %s and indices %s do not fit input %s",
                     op, emi_tshape(S, grad_out), emi_tshape(S, indices),
                     emi_tshape(S, input));
  if (!grad_input) return emi_error(S, EM_ERR_ARG, "%s: grad_input is NULL", op);
  emi_pool_geom g = {.H = input->sizes[nd - 2], .W = input->sizes[nd - 1],
                     .OH = grad_out->sizes[nd - 2], .OW = grad_out->sizes[nd - 1],
                     .ind_trusted = own};
  g.planes = input->sizes[nd - 3] * (nd == 4 ? input->sizes[0] : 1);
  em_tensor *gy = NULL, *ind = NULL, *gx = NULL;   /* dense inputs, the gradient */
  bool nhwc = pool_layout(S, input, &g);
  if ((st = pool_grad(S, grad_out, g.nhwc, &gy)) || (st = nn_layout(S, indices, g.nhwc, &ind)) ||
      (st = emi_tensor_new_fmt(S, op, input->sizes, nd, input->dtype, input->device, g.nhwc,
                               &gx)) ||
      (st = EMI_DISPATCH(S, op, gy, max_pool2d_backward, &g, gx, gy, ind, index_base)) ||
      (nhwc && !g.nhwc && (st = nn_relayout(S, &gx, true)))) {
    NN_RELEASE(gy, ind, gx);
    return st;
  }
  NN_RELEASE(gy, ind);
  *grad_input = gx;
  return EM_OK;
}

em_status em_avg_pool2d(em_state *S, const em_tensor *input, const int64_t *kernel,
                        const int64_t *stride, const int64_t *padding, int ceil_mode,
                        int count_include_pad, em_tensor **out) {
  const char *op = "avg_pool2d";
  emi_pool_geom g;
  em_status st = pool_geom(S, op, input, kernel, stride, padding, NULL, ceil_mode, &g);
  if (st) return st;
  if (!out) return emi_error(S, EM_ERR_ARG, "%s: out is NULL", op);
  int64_t shape[EM_MAX_DIMS];
  out_shape(input, &g, shape);
  em_tensor *x = NULL, *y = NULL;   /* dense input, output */
  bool nhwc = pool_layout(S, input, &g);
  if ((st = nn_layout(S, input, g.nhwc, &x)) ||
      (st = emi_tensor_new_fmt(S, op, shape, input->ndim, input->dtype, input->device, g.nhwc,
                               &y)) ||
      (st = EMI_DISPATCH(S, op, x, avg_pool2d, &g, y, x, count_include_pad)) ||
      (nhwc && !g.nhwc && (st = nn_relayout(S, &y, true)))) {
    NN_RELEASE(x, y);
    return st;
  }
  em_tensor_release(x);
  *out = y;
  if (emi_ag_wanted1(S, input))
    return emi_ag_record_avg_pool2d(S, input, kernel, stride, padding, ceil_mode,
                                    count_include_pad, out);
  return EM_OK;
}

em_status em_avg_pool2d_backward(em_state *S, const em_tensor *grad_out,
                                 const em_tensor *input, const int64_t *kernel,
                                 const int64_t *stride, const int64_t *padding,
                                 int ceil_mode, int count_include_pad,
                                 em_tensor **grad_input) {
  const char *op = "avg_pool2d_backward";
  emi_pool_geom g;
  em_status st = pool_geom(S, op, input, kernel, stride, padding, NULL, ceil_mode, &g);
  if (st) return st;
  if ((st = check_grad(S, op, grad_out, input, &g))) return st;
  if (!grad_input) return emi_error(S, EM_ERR_ARG, "%s: grad_input is NULL", op);
  em_tensor *gy = NULL, *gx = NULL;   /* dense grad_out, the gradient */
  bool nhwc = pool_layout(S, input, &g);
  if ((st = pool_grad(S, grad_out, g.nhwc, &gy)) ||
      (st = emi_tensor_new_fmt(S, op, input->sizes, input->ndim, input->dtype, input->device,
                               g.nhwc, &gx)) ||
      (st = EMI_DISPATCH(S, op, gy, avg_pool2d_backward, &g, gx, gy, count_include_pad)) ||
      (nhwc && !g.nhwc && (st = nn_relayout(S, &gx, true)))) {
    NN_RELEASE(gy, gx);
    return st;
  }
  em_tensor_release(gy);
  *grad_input = gx;
  return EM_OK;
}

em_status em_adaptive_avg_pool2d(em_state *S, const em_tensor *input,
                                 const int64_t *output_size, em_tensor **out) {
  const char *op = "adaptive_avg_pool2d";
  em_status st = pool_input(S, op, input);
  if (st) return st;
  if (!output_size || output_size[0] < 1 || output_size[1] < 1)
    return emi_error(S, EM_ERR_ARG, "%s: output_size must be two positive ints", op);
  if (!out) return emi_error(S, EM_ERR_ARG, "%s: out is NULL", op);
  int nd = input->ndim;
  emi_pool_geom g = {.H = input->sizes[nd - 2], .W = input->sizes[nd - 1],
                     .OH = output_size[0], .OW = output_size[1], .kH = 1, .kW = 1};
  g.planes = input->sizes[nd - 3] * (nd == 4 ? input->sizes[0] : 1);
  /* the grain estimate reads kH*kW: the average window covers about H/OH x W/OW */
  g.kH = (g.H + g.OH - 1) / g.OH + 1;
  g.kW = (g.W + g.OW - 1) / g.OW + 1;
  int64_t shape[EM_MAX_DIMS];
  out_shape(input, &g, shape);
  em_tensor *x = NULL, *y = NULL;   /* dense input, output */
  bool nhwc = pool_layout(S, input, &g);
  if ((st = nn_layout(S, input, g.nhwc, &x)) ||
      (st = emi_tensor_new_fmt(S, op, shape, nd, input->dtype, input->device, g.nhwc, &y)) ||
      (st = EMI_DISPATCH(S, op, x, adaptive_avg_pool2d, &g, y, x)) ||
      (nhwc && !g.nhwc && (st = nn_relayout(S, &y, true)))) {
    NN_RELEASE(x, y);
    return st;
  }
  em_tensor_release(x);
  *out = y;
  if (emi_ag_wanted1(S, input)) return emi_ag_record_adaptive_avg_pool2d(S, input, out);
  return EM_OK;
}

em_status em_adaptive_avg_pool2d_backward(em_state *S, const em_tensor *grad_out,
                                          const em_tensor *input,
                                          em_tensor **grad_input) {
  const char *op = "adaptive_avg_pool2d_backward";
  em_status st = pool_input(S, op, input);
  if (st) return st;
  if ((st = nn_check_floating(S, op, "grad_out", grad_out, input))) return st;
  int nd = input->ndim;
  if (grad_out->ndim != nd || memcmp(grad_out->sizes, input->sizes, sizeof(int64_t) * (nd - 2)) ||
      grad_out->sizes[nd - 2] < 1 || grad_out->sizes[nd - 1] < 1)
    return emi_error(S, EM_ERR_SHAPE, "%s: grad_out %s does not fit input %s", op,
                     emi_tshape(S, grad_out), emi_tshape(S, input));
  if (!grad_input) return emi_error(S, EM_ERR_ARG, "%s: grad_input is NULL", op);
  emi_pool_geom g = {.H = input->sizes[nd - 2], .W = input->sizes[nd - 1],
                     .OH = grad_out->sizes[nd - 2], .OW = grad_out->sizes[nd - 1]};
  g.planes = input->sizes[nd - 3] * (nd == 4 ? input->sizes[0] : 1);
  g.kH = (g.H + g.OH - 1) / g.OH + 1;
  g.kW = (g.W + g.OW - 1) / g.OW + 1;
  em_tensor *gy = NULL, *gx = NULL;   /* dense grad_out, the gradient */
  bool nhwc = pool_layout(S, input, &g);
  if ((st = pool_grad(S, grad_out, g.nhwc, &gy)) ||
      (st = emi_tensor_new_fmt(S, op, input->sizes, nd, input->dtype, input->device, g.nhwc,
                               &gx)) ||
      (st = EMI_DISPATCH(S, op, gy, adaptive_avg_pool2d_backward, &g, gx, gy)) ||
      (nhwc && !g.nhwc && (st = nn_relayout(S, &gx, true)))) {
    NN_RELEASE(gy, gx);
    return st;
  }
  em_tensor_release(gy);
  *grad_input = gx;
  return EM_OK;
}

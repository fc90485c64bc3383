/*
** nn_conv.c -- conv2d forward and backward: argument checks, output shapes and
** dense inputs (NCHW, or NHWC when input or weight is channels last and the
** backend serves it), then the device's conv2d entries (the CPU backend's conv.c).
** Convs without input channels (the output is the bias) or with empty outputs
** never reach the kernels: fills, copies and sums do them.
*/
#include "nn_util.h"
#include "../autograd/grad_nn.h"

static em_status conv_setup(em_state *S, const char *op, const em_tensor *input,
                            const em_tensor *weight, const int64_t *stride,
                            const int64_t *padding, const int64_t *dilation,
                            int64_t groups, emi_conv_geom *g) {
  em_status st;
  if ((st = nn_check_floating(S, op, "input", input, NULL))) return st;
  if ((st = nn_check_floating(S, op, "weight", weight, input))) return st;
  if (input->ndim != 4)
    return emi_error(S, EM_ERR_SHAPE, "%s: input %s must have 4 dims (N,C,H,W)", op,
                     emi_tshape(S, input));
  if (weight->ndim != 4)
    return emi_error(S, EM_ERR_SHAPE, "%s: weight %s must have 4 dims (O,C/groups,kH,kW)",
                     op, emi_tshape(S, weight));
  if (!stride || !padding || !dilation)
    return emi_error(S, EM_ERR_ARG, "%s: stride, padding and dilation are required", op);
  if (stride[0] < 1 || stride[1] < 1 || dilation[0] < 1 || dilation[1] < 1 ||
      padding[0] < 0 || padding[1] < 0)
    return emi_error(S, EM_ERR_ARG, "%s: bad stride (%lld,%lld), padding (%lld,%lld) or "
                     "dilation (%lld,%lld)", op, (long long)stride[0], (long long)stride[1],
                     (long long)padding[0], (long long)padding[1], (long long)dilation[0],
                     (long long)dilation[1]);
  if (groups < 1)
    return emi_error(S, EM_ERR_ARG, "%s: groups is %lld, must be >= 1", op, (long long)groups);
  *g = (emi_conv_geom){.N = input->sizes[0], .C = input->sizes[1], .H = input->sizes[2],
                       .W = input->sizes[3], .O = weight->sizes[0], .kH = weight->sizes[2],
                       .kW = weight->sizes[3], .sH = stride[0], .sW = stride[1],
                       .pH = padding[0], .pW = padding[1], .dH = dilation[0],
                       .dW = dilation[1], .G = groups};
  if (g->C % groups || g->O % groups)
    return emi_error(S, EM_ERR_SHAPE, "%s: input %s channels and weight %s out channels "
                     "must be divisible by groups=%lld", op, emi_tshape(S, input),
                     emi_tshape(S, weight), (long long)groups);
  if (weight->sizes[1] * groups != g->C)
    return emi_error(S, EM_ERR_SHAPE, "%s: input %s has %lld channels, weight %s expects "
                     "%lld", op, emi_tshape(S, input), (long long)g->C,
                     emi_tshape(S, weight), (long long)(weight->sizes[1] * groups));
  if (g->kH < 1 || g->kW < 1 || g->O < 1)
    return emi_error(S, EM_ERR_SHAPE, "%s: weight %s is empty", op, emi_tshape(S, weight));
  g->OH = (g->H + 2 * g->pH - g->dH * (g->kH - 1) - 1) / g->sH + 1;
  g->OW = (g->W + 2 * g->pW - g->dW * (g->kW - 1) - 1) / g->sW + 1;
  if (g->H + 2 * g->pH < g->dH * (g->kH - 1) + 1 || g->W + 2 * g->pW < g->dW * (g->kW - 1) + 1)
    return emi_error(S, EM_ERR_SHAPE, "%s: input %s (padded %lldx%lld) is smaller than the "
                     "dilated kernel %lldx%lld", op, emi_tshape(S, input),
                     (long long)(g->H + 2 * g->pH), (long long)(g->W + 2 * g->pW),
                     (long long)(g->dH * (g->kH - 1) + 1), (long long)(g->dW * (g->kW - 1) + 1));
  int64_t K = g->C / groups * g->kH * g->kW, L = g->OH * g->OW;
  if (K > INT32_MAX || L > INT32_MAX / 8 || g->O > INT32_MAX)
    return emi_error(S, EM_ERR_SHAPE, "%s: input %s with weight %s is too large for BLAS",
                     op, emi_tshape(S, input), emi_tshape(S, weight));
  return EM_OK;
}

em_status em_conv2d(em_state *S, const em_tensor *input, const em_tensor *weight,
                    const em_tensor *bias, const int64_t *stride, const int64_t *padding,
                    const int64_t *dilation, int64_t groups, em_tensor **out) {
  const char *op = "conv2d";
  emi_conv_geom g;
  em_status st = conv_setup(S, op, input, weight, stride, padding, dilation, groups, &g);
  if (st) return st;
  if (bias) {
    if ((st = nn_check_floating(S, op, "bias", bias, input))) return st;
    if (bias->ndim != 1 || bias->sizes[0] != g.O)
      return emi_error(S, EM_ERR_SHAPE, "%s: bias %s must be [%lld] for weight %s", op,
                       emi_tshape(S, bias), (long long)g.O, emi_tshape(S, weight));
  }
  if (!out) return emi_error(S, EM_ERR_ARG, "%s: out is NULL", op);
  em_tensor *x = NULL, *w = NULL, *b = NULL, *y = NULL;   /* dense inputs, output */
  int64_t shape[4] = {g.N, g.O, g.OH, g.OW};
  /* channels last when input or weight is (PyTorch's rule); a backend that does
  ** not serve it computes NCHW and the output is reordered */
  bool nhwc = emi_nhwc(input) || emi_nhwc(weight);
  g.nhwc = nhwc && nn_serves_nhwc(S, input->device, EMI_NHWC_CONV);
  if ((st = nn_layout(S, input, g.nhwc, &x)) || (st = nn_layout(S, weight, g.nhwc, &w)) ||
      (bias && (st = nn_contig(S, bias, &b))) ||
      (st = emi_tensor_new_fmt(S, op, shape, 4, input->dtype, input->device, g.nhwc, &y)))
    goto done;
  if (y->numel) {
    if (g.C) st = EMI_DISPATCH(S, op, x, conv2d, &g, y, x, w, b);
    else st = EMI_DISPATCH(S, op, y, fill, y, 0);  /* no input channels: y = bias */
    if (!st && !g.C && bias) {
      em_tensor *bv = NULL;
      int64_t bs[4] = {g.N, g.O, g.OH, g.OW}, bst[4] = {0, 1, 0, 0};
      if (!(st = emi_tensor_view(S, b, bs, bst, 4, b->offset, &bv)))
        st = EMI_DISPATCH(S, op, y, copy, y, bv);
      em_tensor_release(bv);
    }
  }
  if (!st && nhwc && !g.nhwc) st = nn_relayout(S, &y, true);
done:
  NN_RELEASE(x, w, b);
  if (st) { em_tensor_release(y); return st; }
  *out = y;
  if (emi_ag_wanted_opt(S, input, weight, bias))
    return emi_ag_record_conv2d(S, input, weight, bias, stride, padding, dilation, groups, out);
  return EM_OK;
}

em_status em_conv2d_backward(em_state *S, const em_tensor *grad_out,
                             const em_tensor *input, const em_tensor *weight,
                             const int64_t *stride, const int64_t *padding,
                             const int64_t *dilation, int64_t groups,
                             em_tensor **grad_input, em_tensor **grad_weight,
                             em_tensor **grad_bias) {
  return emi_conv2d_backward_into(S, grad_out, input, weight, stride, padding, dilation,
                                  groups, grad_input, grad_weight, grad_bias, NULL, NULL);
}

/* As em_conv2d_backward; gw_into and gb_into, when given, are where the weight and
** bias gradients are written (autograd's gradient destinations: contiguous, of the
** input's dtype, used only for NCHW operands) and are what comes back. */
em_status emi_conv2d_backward_into(em_state *S, const em_tensor *grad_out,
                                   const em_tensor *input, const em_tensor *weight,
                                   const int64_t *stride, const int64_t *padding,
                                   const int64_t *dilation, int64_t groups,
                                   em_tensor **grad_input, em_tensor **grad_weight,
                                   em_tensor **grad_bias, em_tensor *gw_into,
                                   em_tensor *gb_into) {
  const char *op = "conv2d_backward";
  emi_conv_geom g;
  em_status st = conv_setup(S, op, input, weight, stride, padding, dilation, groups, &g);
  if (st) return st;
  if ((st = nn_check_floating(S, op, "grad_out", grad_out, input))) return st;
  int64_t yshape[4] = {g.N, g.O, g.OH, g.OW};
  if (grad_out->ndim != 4 || memcmp(grad_out->sizes, yshape, sizeof yshape))
    return emi_error(S, EM_ERR_SHAPE, "%s: grad_out %s does not match the output shape "
                     "[%lld,%lld,%lld,%lld]", op, emi_tshape(S, grad_out), (long long)g.N,
                     (long long)g.O, (long long)g.OH, (long long)g.OW);
  em_tensor *gy = NULL, *x = NULL, *w = NULL;   /* dense inputs */
  em_tensor *gx = NULL, *gw = NULL, *gb = NULL;  /* the gradients asked for */
  bool nhwc = emi_nhwc(input) || emi_nhwc(weight);   /* as the forward */
  g.nhwc = nhwc && nn_serves_nhwc(S, input->device, EMI_NHWC_CONV);
  if ((st = nn_layout(S, grad_out, g.nhwc, &gy)) || (st = nn_layout(S, input, g.nhwc, &x)) ||
      (st = nn_layout(S, weight, g.nhwc, &w)))
    goto done;
  int dev = input->device;
  if (grad_input &&
      (st = emi_tensor_new_fmt(S, op, input->sizes, 4, input->dtype, dev, g.nhwc, &gx)))
    goto done;
  if (nhwc || (gw_into && gw_into->dtype != input->dtype)) gw_into = NULL;
  if (gb_into && gb_into->dtype != input->dtype) gb_into = NULL;
  if (grad_weight && gw_into) { gw = gw_into; em_tensor_retain(gw); }
  else if (grad_weight &&
      (st = emi_tensor_new_fmt(S, op, weight->sizes, 4, input->dtype, dev, g.nhwc, &gw)))
    goto done;
  if (grad_bias && gb_into) { gb = gb_into; em_tensor_retain(gb); }
  else if (grad_bias && (st = emi_tensor_new(S, op, &g.O, 1, input->dtype, dev, &gb)))
    goto done;
  if (g.N == 0 || g.C == 0 || g.OH * g.OW == 0) {
    em_tensor *grads[3] = {gx, gw, gb};   /* no products to sum: zeros */
    for (int i = 0; i < 3 && !st; i++)
      if (grads[i] && grads[i]->numel) st = EMI_DISPATCH(S, op, grads[i], fill, grads[i], 0);
    if (!st && gb && g.C == 0 && g.N > 0 && g.OH * g.OW > 0) {
      /* the bias gradient still flows without input channels: gy summed over
      ** (N, OH, OW) into gb seen as [1,O,1,1] */
      em_tensor *gb4 = NULL;
      int64_t s4[4] = {1, g.O, 1, 1}, st4[4] = {g.O, 1, 1, 1};
      if (!(st = emi_tensor_view(S, gb, s4, st4, 4, gb->offset, &gb4)))
        st = EMI_DISPATCH(S, op, gy, reduce, EM_SUM, gb4, gy, 1u | 4u | 8u);
      em_tensor_release(gb4);
    }
  } else {
    st = EMI_DISPATCH(S, op, x, conv2d_backward, &g, gx, gw, gb, gy, x, w);
  }
  /* each gradient in the layout of the tensor it is for */
  if (!st && nhwc) st = nn_relayout(S, &gx, emi_nhwc(input));
  if (!st && nhwc) st = nn_relayout(S, &gw, emi_nhwc(weight));
done:
  NN_RELEASE(gy, x, w);
  if (st) { NN_RELEASE(gx, gw, gb); return st; }
  if (grad_input) *grad_input = gx;
  if (grad_weight) *grad_weight = gw;
  if (grad_bias) *grad_bias = gb;
  return EM_OK;
}

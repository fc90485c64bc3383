/*
** grad_nn.c -- autograd for the nn kernels (conv, pooling, losses, normalization
** layers): each recorder makes a node that saves what the kernel's public
** backward needs (em_conv2d_backward, em_max_pool2d_backward, ...) and the
** backward just calls it. Optional inputs (weight, bias) are recorded only when
** given; iarg holds their presence so the input positions can be found again.
*/
#include "grad_nn.h"

/* Inputs x and the optional w, b packed in order; returns how many. */
static int pack3(const em_tensor **in, const em_tensor *x, const em_tensor *w,
                 const em_tensor *b) {
  int n = 0;
  in[n++] = x;
  if (w) in[n++] = w;
  if (b) in[n++] = b;
  return n;
}

/* Save up to 4 tensors (NULL ends the list). */
static em_status save_all(em_state *S, emi_ag_node *n, const em_tensor *a, const em_tensor *b,
                          const em_tensor *c, const em_tensor *d) {
  const em_tensor *l[4] = {a, b, c, d};
  em_status st = EM_OK;
  for (int i = 0; i < 4 && l[i] && !st; i++) st = emi_ag_save(S, n, l[i]);
  return st;
}

/* -- conv2d ----------------------------------------------------------------------------- */
/* iarg: stride[2] padding[2] dilation[2] groups has_bias */
static em_status conv2d_backward(em_state *S, emi_ag_node *n, const em_tensor *g,
                                 em_tensor **gin) {
  em_tensor *x, *w;
  em_status st;
  if ((st = emi_ag_saved(S, n, 0, &x)) || (st = emi_ag_saved(S, n, 1, &w))) return st;
  int hb = (int)n->iarg[7];
  return em_conv2d_backward(S, g, x, w, n->iarg, n->iarg + 2, n->iarg + 4, n->iarg[6],
                            emi_ag_needs(n, 0) ? &gin[0] : NULL,
                            emi_ag_needs(n, 1) ? &gin[1] : NULL,
                            hb && emi_ag_needs(n, 2) ? &gin[2] : NULL);
}

em_status emi_ag_record_conv2d(em_state *S, const em_tensor *x, const em_tensor *w,
                               const em_tensor *b, const int64_t *stride,
                               const int64_t *padding, const int64_t *dilation,
                               int64_t groups, em_tensor **out) {
  const em_tensor *in[3];
  int k = pack3(in, x, w, b);
  emi_ag_node *n;
  em_status st = emi_ag_node_new(S, "conv2d", conv2d_backward, *out, in, k, &n);
  if (st) return emi_ag_fail(out, st);
  for (int i = 0; i < 2; i++) {
    n->iarg[i] = stride ? stride[i] : 1;
    n->iarg[2 + i] = padding ? padding[i] : 0;
    n->iarg[4 + i] = dilation ? dilation[i] : 1;
  }
  n->iarg[6] = groups;
  n->iarg[7] = b != NULL;
  if ((st = save_all(S, n, x, w, NULL, NULL))) return emi_ag_fail(out, st);
  return EM_OK;
}

/* -- pooling --------------------------------------------------------------------------- */
static em_status max_pool2d_backward(em_state *S, emi_ag_node *n, const em_tensor *g,
                                     em_tensor **gin) {
  em_tensor *x, *idx;
  em_status st;
  if ((st = emi_ag_saved(S, n, 0, &x)) || (st = emi_ag_saved(S, n, 1, &idx))) return st;
  return em_max_pool2d_backward(S, g, x, idx, (int)n->iarg[0], &gin[0]);
}

em_status emi_ag_record_max_pool2d(em_state *S, const em_tensor *x, const em_tensor *indices,
                                   int index_base, em_tensor **out) {
  emi_ag_node *n;
  em_status st = emi_ag_node_new(S, "max_pool2d", max_pool2d_backward, *out, &x, 1, &n);
  if (st) return emi_ag_fail(out, st);
  n->iarg[0] = index_base;
  if ((st = save_all(S, n, x, indices, NULL, NULL))) return emi_ag_fail(out, st);
  return EM_OK;
}

/* iarg: kernel[2] stride[2] padding[2] ceil_mode count_include_pad */
static em_status avg_pool2d_backward(em_state *S, emi_ag_node *n, const em_tensor *g,
                                     em_tensor **gin) {
  em_tensor *x;
  em_status st;
  if ((st = emi_ag_saved(S, n, 0, &x))) return st;
  return em_avg_pool2d_backward(S, g, x, n->iarg, n->iarg + 2, n->iarg + 4, (int)n->iarg[6],
                                (int)n->iarg[7], &gin[0]);
}

em_status emi_ag_record_avg_pool2d(em_state *S, const em_tensor *x, const int64_t *kernel,
                                   const int64_t *stride, const int64_t *padding,
                                   int ceil_mode, int count_include_pad, em_tensor **out) {
  emi_ag_node *n;
  em_status st = emi_ag_node_new(S, "avg_pool2d", avg_pool2d_backward, *out, &x, 1, &n);
  if (st) return emi_ag_fail(out, st);
  for (int i = 0; i < 2; i++) {
    n->iarg[i] = kernel[i];
    n->iarg[2 + i] = stride ? stride[i] : kernel[i];
    n->iarg[4 + i] = padding ? padding[i] : 0;
  }
  n->iarg[6] = ceil_mode;
  n->iarg[7] = count_include_pad;
  if ((st = emi_ag_save(S, n, x))) return emi_ag_fail(out, st);
  return EM_OK;
}

static em_status adaptive_backward(em_state *S, emi_ag_node *n, const em_tensor *g,
                                   em_tensor **gin) {
  em_tensor *x;
  em_status st;
  if ((st = emi_ag_saved(S, n, 0, &x))) return st;
  return em_adaptive_avg_pool2d_backward(S, g, x, &gin[0]);
}

em_status emi_ag_record_adaptive_avg_pool2d(em_state *S, const em_tensor *x, em_tensor **out) {
  emi_ag_node *n;
  em_status st = emi_ag_node_new(S, "adaptive_avg_pool2d", adaptive_backward, *out, &x, 1, &n);
  if (st) return emi_ag_fail(out, st);
  if ((st = emi_ag_save(S, n, x))) return emi_ag_fail(out, st);
  return EM_OK;
}

/* -- losses ----------------------------------------------------------------------------- */
/* iarg: index_base ignore_index reduction; darg[0]: label_smoothing */
static em_status cross_entropy_backward(em_state *S, emi_ag_node *n, const em_tensor *g,
                                        em_tensor **gin) {
  em_tensor *x, *t, *lse;
  em_status st;
  if ((st = emi_ag_saved(S, n, 0, &x)) || (st = emi_ag_saved(S, n, 1, &t)) ||
      (st = emi_ag_saved(S, n, 2, &lse)))
    return st;
  return em_cross_entropy_backward(S, g, x, t, lse, (int)n->iarg[0], n->iarg[1], n->darg[0],
                                   (int)n->iarg[2], &gin[0]);
}

em_status emi_ag_record_cross_entropy(em_state *S, const em_tensor *logits,
                                      const em_tensor *target, const em_tensor *lse,
                                      int index_base, int64_t ignore_index,
                                      double label_smoothing, int reduction, em_tensor **out) {
  emi_ag_node *n;
  em_status st = emi_ag_node_new(S, "cross_entropy", cross_entropy_backward, *out, &logits, 1,
                                 &n);
  if (st) return emi_ag_fail(out, st);
  n->iarg[0] = index_base;
  n->iarg[1] = ignore_index;
  n->iarg[2] = reduction;
  n->darg[0] = label_smoothing;
  if ((st = save_all(S, n, logits, target, lse, NULL))) return emi_ag_fail(out, st);
  return EM_OK;
}

static em_status nll_backward(em_state *S, emi_ag_node *n, const em_tensor *g, em_tensor **gin) {
  em_tensor *x, *t;
  em_status st;
  if ((st = emi_ag_saved(S, n, 0, &x)) || (st = emi_ag_saved(S, n, 1, &t))) return st;
  return em_nll_loss_backward(S, g, x, t, (int)n->iarg[0], n->iarg[1], (int)n->iarg[2],
                              &gin[0]);
}

em_status emi_ag_record_nll_loss(em_state *S, const em_tensor *logp, const em_tensor *target,
                                 int index_base, int64_t ignore_index, int reduction,
                                 em_tensor **out) {
  emi_ag_node *n;
  em_status st = emi_ag_node_new(S, "nll_loss", nll_backward, *out, &logp, 1, &n);
  if (st) return emi_ag_fail(out, st);
  n->iarg[0] = index_base;
  n->iarg[1] = ignore_index;
  n->iarg[2] = reduction;
  if ((st = save_all(S, n, logp, target, NULL, NULL))) return emi_ag_fail(out, st);
  return EM_OK;
}

/* iarg: bce reduction. The target's gradient: -d(input) for mse; for
** bce_with_logits d/dt = -x, times g (divided by the count for the mean). */
static em_status pointwise_backward(em_state *S, emi_ag_node *n, const em_tensor *g,
                                    em_tensor **gin) {
  em_tensor *x, *t;
  em_status st;
  if ((st = emi_ag_saved(S, n, 0, &x)) || (st = emi_ag_saved(S, n, 1, &t))) return st;
  int bce = (int)n->iarg[0], red = (int)n->iarg[1];
  em_tensor *gx = NULL;
  if (emi_ag_needs(n, 0) || (!bce && emi_ag_needs(n, 1))) {
    st = bce ? em_bce_with_logits_backward(S, g, x, t, red, &gx)
             : em_mse_loss_backward(S, g, x, t, red, &gx);
    if (st) return st;
  }
  if (emi_ag_needs(n, 1)) {
    emi_f F, *f = &F;
    emi_f_init(f, S);
    em_tensor *r;
    if (!bce) {
      r = emi_f_un(f, EM_NEG, gx);
    } else {
      double scale = red == EM_REDUCE_MEAN ? -1.0 / (double)(x->numel ? x->numel : 1) : -1.0;
      r = emi_f_sc(f, EM_MUL, emi_f_bin(f, EM_MUL, x, g), scale);
    }
    if ((st = emi_f_end(f, r, &gin[1]))) {
      em_tensor_release(gx);
      return st;
    }
  }
  if (emi_ag_needs(n, 0)) gin[0] = gx;
  else em_tensor_release(gx);
  return EM_OK;
}

em_status emi_ag_record_pointwise_loss(em_state *S, int bce, const em_tensor *input,
                                       const em_tensor *target, int reduction,
                                       em_tensor **out) {
  const em_tensor *in[2] = {input, target};
  emi_ag_node *n;
  em_status st = emi_ag_node_new(S, bce ? "binary_cross_entropy_with_logits" : "mse_loss",
                                 pointwise_backward, *out, in, 2, &n);
  if (st) return emi_ag_fail(out, st);
  n->iarg[0] = bce;
  n->iarg[1] = reduction;
  if ((st = save_all(S, n, input, target, NULL, NULL))) return emi_ag_fail(out, st);
  return EM_OK;
}

/* -- normalization layers ----------------------------------------------------------------- */
/* iarg: has_w has_b training; saved: x, mean, invstd[, w] */
static em_status batch_norm_backward(em_state *S, emi_ag_node *n, const em_tensor *g,
                                     em_tensor **gin) {
  em_tensor *x, *m, *inv, *w = NULL;
  em_status st;
  int hw = (int)n->iarg[0], hb = (int)n->iarg[1];
  if ((st = emi_ag_saved(S, n, 0, &x)) || (st = emi_ag_saved(S, n, 1, &m)) ||
      (st = emi_ag_saved(S, n, 2, &inv)) || (hw && (st = emi_ag_saved(S, n, 3, &w))))
    return st;
  int ib = 1 + hw;
  return em_batch_norm_backward(S, g, x, w, m, inv, (int)n->iarg[2],
                                emi_ag_needs(n, 0) ? &gin[0] : NULL,
                                hw && emi_ag_needs(n, 1) ? &gin[1] : NULL,
                                hb && emi_ag_needs(n, ib) ? &gin[ib] : NULL);
}

em_status emi_ag_record_batch_norm(em_state *S, const em_tensor *x, const em_tensor *w,
                                   const em_tensor *b, const em_tensor *save_mean,
                                   const em_tensor *save_invstd, int training,
                                   em_tensor **out) {
  const em_tensor *in[3];
  int k = pack3(in, x, w, b);
  emi_ag_node *n;
  em_status st = emi_ag_node_new(S, "batch_norm", batch_norm_backward, *out, in, k, &n);
  if (st) return emi_ag_fail(out, st);
  n->iarg[0] = w != NULL;
  n->iarg[1] = b != NULL;
  n->iarg[2] = training;
  if ((st = save_all(S, n, x, save_mean, save_invstd, w))) return emi_ag_fail(out, st);
  return EM_OK;
}

/* iarg: has_w has_b normalized_ndim; saved: x, mean, rstd[, w] */
static em_status layer_norm_backward(em_state *S, emi_ag_node *n, const em_tensor *g,
                                     em_tensor **gin) {
  em_tensor *x, *m, *r, *w = NULL;
  em_status st;
  int hw = (int)n->iarg[0], hb = (int)n->iarg[1];
  if ((st = emi_ag_saved(S, n, 0, &x)) || (st = emi_ag_saved(S, n, 1, &m)) ||
      (st = emi_ag_saved(S, n, 2, &r)) || (hw && (st = emi_ag_saved(S, n, 3, &w))))
    return st;
  int ib = 1 + hw;
  return em_layer_norm_backward(S, g, x, (int)n->iarg[2], m, r, w,
                                emi_ag_needs(n, 0) ? &gin[0] : NULL,
                                hw && emi_ag_needs(n, 1) ? &gin[1] : NULL,
                                hb && emi_ag_needs(n, ib) ? &gin[ib] : NULL);
}

em_status emi_ag_record_layer_norm(em_state *S, const em_tensor *x, int normalized_ndim,
                                   const em_tensor *w, const em_tensor *b,
                                   const em_tensor *mean, const em_tensor *rstd,
                                   em_tensor **out) {
  const em_tensor *in[3];
  int k = pack3(in, x, w, b);
  emi_ag_node *n;
  em_status st = emi_ag_node_new(S, "layer_norm", layer_norm_backward, *out, in, k, &n);
  if (st) return emi_ag_fail(out, st);
  n->iarg[0] = w != NULL;
  n->iarg[1] = b != NULL;
  n->iarg[2] = normalized_ndim;
  if ((st = save_all(S, n, x, mean, rstd, w))) return emi_ag_fail(out, st);
  return EM_OK;
}

/*
** grad_nn.c -- autograd for the nn kernels (conv, pooling, losses, normalization
** layers): each recorder makes a node that saves what the kernel's public
** backward needs (em_conv2d_backward, em_max_pool2d_backward, ...) and the
** backward just calls it.
**
** Every node reads its saved tensors through a named view (autograd.h) and its
** parameters through named iarg positions. Optional inputs (weight, bias) are
** recorded only when given, so their input positions depend on which were
** given: nn_inputs says where each one sits, from presence flags kept in iarg.
*/
#include "grad_nn.h"

/* -- Input positions -------------------------------------------------------------------- */

/* The op's main input is always the node's first; mse and bce_with_logits have
** their target second. */
enum { IN_INPUT = 0, IN_TARGET = 1 };

/* Where the input x and the optional weight and bias sit among a node's inputs;
** -1 for one not given. */
typedef struct nn_inputs { int x, weight, bias; } nn_inputs;

static nn_inputs nn_inputs_of(int has_weight, int has_bias) {
  return (nn_inputs){.x = IN_INPUT, .weight = has_weight ? 1 : -1,
                     .bias = has_bias ? 1 + (has_weight != 0) : -1};
}

/* x and the optional w, b at their positions in in[]; returns how many. */
static int pack_inputs(const em_tensor **in, const em_tensor *x, const em_tensor *w,
                       const em_tensor *b) {
  nn_inputs p = nn_inputs_of(w != NULL, b != NULL);
  in[p.x] = x;
  if (w) in[p.weight] = w;
  if (b) in[p.bias] = b;
  return 1 + (w != NULL) + (b != NULL);
}

/* Where the gradient of input i goes: gin[i] when i was given and needs one. */
static em_tensor **grad_of(emi_ag_node *n, em_tensor **gin, int i) {
  return i >= 0 && emi_ag_needs(n, i) ? &gin[i] : NULL;
}

/* -- Saved views shared by several ops ------------------------------------------------ */

typedef union input_saved {
  struct { const em_tensor *x; };
  const em_tensor *slot[1];
} input_saved;
EMI_AG_VIEW_CHECK(input_saved, x);

/* An input and its target (nll_loss, mse_loss, bce_with_logits). */
typedef union target_saved {
  struct { const em_tensor *input, *target; };
  const em_tensor *slot[2];
} target_saved;
EMI_AG_VIEW_CHECK(target_saved, target);

/* -- conv2d ----------------------------------------------------------------------------- */

enum { CONV_STRIDE = 0, CONV_PADDING = 2, CONV_DILATION = 4, CONV_GROUPS = 6,
       CONV_HAS_BIAS = 7 };

typedef union conv2d_saved {
  struct { const em_tensor *x, *weight; };
  const em_tensor *slot[2];
} conv2d_saved;
EMI_AG_VIEW_CHECK(conv2d_saved, weight);

static em_status conv2d_backward(em_state *S, emi_ag_node *n, const em_tensor *g,
                                 em_tensor **gin) {
  conv2d_saved v;
  em_status st = EMI_AG_LOAD_VIEW(S, n, v);
  if (st) return st;
  const int64_t *ia = n->iarg;
  nn_inputs in = nn_inputs_of(1, (int)ia[CONV_HAS_BIAS]);
  /* the weight and bias gradients go straight where they are to live, when their
  ** leaves name such memory (a gradient destination, engine.c) */
  em_tensor *dw = NULL, *db = NULL;
  if (!emi_nhwc(v.x) && !emi_nhwc(v.weight) && v.x->dtype == v.weight->dtype) {
    int64_t cst[4];
    emi_contiguous_strides(v.weight->sizes, 4, cst);
    if (grad_of(n, gin, in.weight)) dw = emi_ag_grad_dest(S, n, in.weight, cst);
    if (grad_of(n, gin, in.bias)) db = emi_ag_grad_dest(S, n, in.bias, cst + 3);
  }
  st = emi_conv2d_backward_into(S, g, v.x, v.weight, ia + CONV_STRIDE, ia + CONV_PADDING,
                                ia + CONV_DILATION, ia[CONV_GROUPS], grad_of(n, gin, in.x),
                                grad_of(n, gin, in.weight), grad_of(n, gin, in.bias), dw, db);
  em_tensor_release(dw);
  em_tensor_release(db);
  return st;
}

em_status emi_ag_record_conv2d(em_state *S, const em_tensor *x, const em_tensor *w,
                               const em_tensor *b, const int64_t *stride,
                               const int64_t *padding, const int64_t *dilation,
                               int64_t groups, em_tensor **out) {
  const em_tensor *in[3];
  int k = pack_inputs(in, x, w, b);
  emi_ag_node *n;
  em_status st = emi_ag_node_new(S, "conv2d", conv2d_backward, *out, in, k, &n);
  if (st) return emi_ag_fail(out, st);
  for (int i = 0; i < 2; i++) {
    n->iarg[CONV_STRIDE + i] = stride ? stride[i] : 1;
    n->iarg[CONV_PADDING + i] = padding ? padding[i] : 0;
    n->iarg[CONV_DILATION + i] = dilation ? dilation[i] : 1;
  }
  n->iarg[CONV_GROUPS] = groups;
  n->iarg[CONV_HAS_BIAS] = b != NULL;
  conv2d_saved v = {.x = x, .weight = w};
  if ((st = EMI_AG_SAVE_VIEW(S, n, v))) return emi_ag_fail(out, st);
  return EM_OK;
}

/* -- pooling --------------------------------------------------------------------------- */

enum { MAXPOOL_INDEX_BASE = 0 };

typedef union max_pool_saved {
  struct { const em_tensor *x, *indices; };
  const em_tensor *slot[2];
} max_pool_saved;
EMI_AG_VIEW_CHECK(max_pool_saved, indices);

static em_status max_pool2d_backward(em_state *S, emi_ag_node *n, const em_tensor *g,
                                     em_tensor **gin) {
  max_pool_saved v;
  em_status st = EMI_AG_LOAD_VIEW(S, n, v);
  if (st) return st;
  return emi_max_pool2d_backward(S, g, v.x, v.indices, (int)n->iarg[MAXPOOL_INDEX_BASE], 1,
                                 &gin[IN_INPUT]);
}

em_status emi_ag_record_max_pool2d(em_state *S, const em_tensor *x, const em_tensor *indices,
                                   int index_base, em_tensor **out) {
  emi_ag_node *n;
  em_status st = emi_ag_node_new(S, "max_pool2d", max_pool2d_backward, *out, &x, 1, &n);
  if (st) return emi_ag_fail(out, st);
  n->iarg[MAXPOOL_INDEX_BASE] = index_base;
  max_pool_saved v = {.x = x, .indices = indices};
  if ((st = EMI_AG_SAVE_VIEW(S, n, v))) return emi_ag_fail(out, st);
  return EM_OK;
}

enum { AVGPOOL_KERNEL = 0, AVGPOOL_STRIDE = 2, AVGPOOL_PADDING = 4, AVGPOOL_CEIL_MODE = 6,
       AVGPOOL_COUNT_INCLUDE_PAD = 7 };

static em_status avg_pool2d_backward(em_state *S, emi_ag_node *n, const em_tensor *g,
                                     em_tensor **gin) {
  input_saved v;
  em_status st = EMI_AG_LOAD_VIEW(S, n, v);
  if (st) return st;
  const int64_t *ia = n->iarg;
  return em_avg_pool2d_backward(S, g, v.x, ia + AVGPOOL_KERNEL, ia + AVGPOOL_STRIDE,
                                ia + AVGPOOL_PADDING, (int)ia[AVGPOOL_CEIL_MODE],
                                (int)ia[AVGPOOL_COUNT_INCLUDE_PAD], &gin[IN_INPUT]);
}

em_status emi_ag_record_avg_pool2d(em_state *S, const em_tensor *x, const int64_t *kernel,
                                   const int64_t *stride, const int64_t *padding,
                                   int ceil_mode, int count_include_pad, em_tensor **out) {
  emi_ag_node *n;
  em_status st = emi_ag_node_new(S, "avg_pool2d", avg_pool2d_backward, *out, &x, 1, &n);
  if (st) return emi_ag_fail(out, st);
  for (int i = 0; i < 2; i++) {
    n->iarg[AVGPOOL_KERNEL + i] = kernel[i];
    n->iarg[AVGPOOL_STRIDE + i] = stride ? stride[i] : kernel[i];
    n->iarg[AVGPOOL_PADDING + i] = padding ? padding[i] : 0;
  }
  n->iarg[AVGPOOL_CEIL_MODE] = ceil_mode;
  n->iarg[AVGPOOL_COUNT_INCLUDE_PAD] = count_include_pad;
  input_saved v = {.x = x};
  if ((st = EMI_AG_SAVE_VIEW(S, n, v))) return emi_ag_fail(out, st);
  return EM_OK;
}

static em_status adaptive_backward(em_state *S, emi_ag_node *n, const em_tensor *g,
                                   em_tensor **gin) {
  input_saved v;
  em_status st = EMI_AG_LOAD_VIEW(S, n, v);
  if (st) return st;
  return em_adaptive_avg_pool2d_backward(S, g, v.x, &gin[IN_INPUT]);
}

em_status emi_ag_record_adaptive_avg_pool2d(em_state *S, const em_tensor *x, em_tensor **out) {
  emi_ag_node *n;
  em_status st = emi_ag_node_new(S, "adaptive_avg_pool2d", adaptive_backward, *out, &x, 1, &n);
  if (st) return emi_ag_fail(out, st);
  input_saved v = {.x = x};
  if ((st = EMI_AG_SAVE_VIEW(S, n, v))) return emi_ag_fail(out, st);
  return EM_OK;
}

/* -- losses ----------------------------------------------------------------------------- */

/* cross_entropy and nll_loss; darg[LOSS_LABEL_SMOOTHING] for cross_entropy. */
enum { LOSS_INDEX_BASE = 0, LOSS_IGNORE_INDEX = 1, LOSS_REDUCTION = 2 };
enum { LOSS_LABEL_SMOOTHING = 0 };

typedef union cross_entropy_saved {
  struct { const em_tensor *logits, *target, *lse; };
  const em_tensor *slot[3];
} cross_entropy_saved;
EMI_AG_VIEW_CHECK(cross_entropy_saved, lse);

static em_status cross_entropy_backward(em_state *S, emi_ag_node *n, const em_tensor *g,
                                        em_tensor **gin) {
  cross_entropy_saved v;
  em_status st = EMI_AG_LOAD_VIEW(S, n, v);
  if (st) return st;
  return em_cross_entropy_backward(S, g, v.logits, v.target, v.lse,
                                   (int)n->iarg[LOSS_INDEX_BASE], n->iarg[LOSS_IGNORE_INDEX],
                                   n->darg[LOSS_LABEL_SMOOTHING],
                                   (int)n->iarg[LOSS_REDUCTION], &gin[IN_INPUT]);
}

em_status emi_ag_record_cross_entropy(em_state *S, const em_tensor *logits,
                                      const em_tensor *target, const em_tensor *lse,
                                      int index_base, int64_t ignore_index,
                                      double label_smoothing, int reduction, em_tensor **out) {
  emi_ag_node *n;
  em_status st = emi_ag_node_new(S, "cross_entropy", cross_entropy_backward, *out, &logits, 1,
                                 &n);
  if (st) return emi_ag_fail(out, st);
  n->iarg[LOSS_INDEX_BASE] = index_base;
  n->iarg[LOSS_IGNORE_INDEX] = ignore_index;
  n->iarg[LOSS_REDUCTION] = reduction;
  n->darg[LOSS_LABEL_SMOOTHING] = label_smoothing;
  cross_entropy_saved v = {.logits = logits, .target = target, .lse = lse};
  if ((st = EMI_AG_SAVE_VIEW(S, n, v))) return emi_ag_fail(out, st);
  return EM_OK;
}

static em_status nll_backward(em_state *S, emi_ag_node *n, const em_tensor *g, em_tensor **gin) {
  target_saved v;
  em_status st = EMI_AG_LOAD_VIEW(S, n, v);
  if (st) return st;
  return em_nll_loss_backward(S, g, v.input, v.target, (int)n->iarg[LOSS_INDEX_BASE],
                              n->iarg[LOSS_IGNORE_INDEX], (int)n->iarg[LOSS_REDUCTION],
                              &gin[IN_INPUT]);
}

em_status emi_ag_record_nll_loss(em_state *S, const em_tensor *logp, const em_tensor *target,
                                 int index_base, int64_t ignore_index, int reduction,
                                 em_tensor **out) {
  emi_ag_node *n;
  em_status st = emi_ag_node_new(S, "nll_loss", nll_backward, *out, &logp, 1, &n);
  if (st) return emi_ag_fail(out, st);
  n->iarg[LOSS_INDEX_BASE] = index_base;
  n->iarg[LOSS_IGNORE_INDEX] = ignore_index;
  n->iarg[LOSS_REDUCTION] = reduction;
  target_saved v = {.input = logp, .target = target};
  if ((st = EMI_AG_SAVE_VIEW(S, n, v))) return emi_ag_fail(out, st);
  return EM_OK;
}

/* The target's gradient: -d(input) for mse; for bce_with_logits d/dt = -x,
** times g (divided by the count for the mean). */
enum { POINTWISE_BCE = 0, POINTWISE_REDUCTION = 1 };

static em_status pointwise_backward(em_state *S, emi_ag_node *n, const em_tensor *g,
                                    em_tensor **gin) {
  target_saved v;
  em_status st = EMI_AG_LOAD_VIEW(S, n, v);
  if (st) return st;
  const em_tensor *x = v.input, *t = v.target;
  int bce = (int)n->iarg[POINTWISE_BCE], red = (int)n->iarg[POINTWISE_REDUCTION];
  int need_x = emi_ag_needs(n, IN_INPUT), need_t = emi_ag_needs(n, IN_TARGET);
  em_tensor *gx = NULL;
  if (need_x || (!bce && need_t)) {
    st = bce ? em_bce_with_logits_backward(S, g, x, t, red, &gx)
             : em_mse_loss_backward(S, g, x, t, red, &gx);
    if (st) return st;
  }
  if (need_t) {
    emi_f F, *f = &F;
    emi_f_init(f, S);
    em_tensor *r;
    if (!bce) {
      r = emi_f_un(f, EM_NEG, gx);
    } else {
      double scale = red == EM_REDUCE_MEAN ? -1.0 / (double)(x->numel ? x->numel : 1) : -1.0;
      r = emi_f_sc(f, EM_MUL, emi_f_bin(f, EM_MUL, x, g), scale);
    }
    if ((st = emi_f_end(f, r, &gin[IN_TARGET]))) {
      em_tensor_release(gx);
      return st;
    }
  }
  if (need_x) gin[IN_INPUT] = gx;
  else em_tensor_release(gx);
  return EM_OK;
}

em_status emi_ag_record_pointwise_loss(em_state *S, int bce, const em_tensor *input,
                                       const em_tensor *target, int reduction,
                                       em_tensor **out) {
  const em_tensor *in[2];
  in[IN_INPUT] = input;
  in[IN_TARGET] = target;
  emi_ag_node *n;
  em_status st = emi_ag_node_new(S, bce ? "binary_cross_entropy_with_logits" : "mse_loss",
                                 pointwise_backward, *out, in, 2, &n);
  if (st) return emi_ag_fail(out, st);
  n->iarg[POINTWISE_BCE] = bce;
  n->iarg[POINTWISE_REDUCTION] = reduction;
  target_saved v = {.input = input, .target = target};
  if ((st = EMI_AG_SAVE_VIEW(S, n, v))) return emi_ag_fail(out, st);
  return EM_OK;
}

/* -- normalization layers ----------------------------------------------------------------- */

/* batch_norm and layer_norm: which optional inputs were given, then the mode. */
enum { NORM_HAS_WEIGHT = 0, NORM_HAS_BIAS = 1, BN_TRAINING = 2, LN_NORMALIZED_NDIM = 2 };

/* The input, the statistics of the forward (the mean and 1/sqrt(var + eps),
** which batch_norm calls invstd) and the optional weight. */
typedef union norm_saved {
  struct { const em_tensor *x, *mean, *rstd, *weight; };
  const em_tensor *slot[4];
} norm_saved;
EMI_AG_VIEW_CHECK(norm_saved, weight);

static nn_inputs norm_inputs(const emi_ag_node *n) {
  return nn_inputs_of((int)n->iarg[NORM_HAS_WEIGHT], (int)n->iarg[NORM_HAS_BIAS]);
}

static em_status batch_norm_backward(em_state *S, emi_ag_node *n, const em_tensor *g,
                                     em_tensor **gin) {
  norm_saved v;
  em_status st = EMI_AG_LOAD_VIEW(S, n, v);
  if (st) return st;
  nn_inputs in = norm_inputs(n);
  return em_batch_norm_backward(S, g, v.x, v.weight, v.mean, v.rstd,
                                (int)n->iarg[BN_TRAINING], grad_of(n, gin, in.x),
                                grad_of(n, gin, in.weight), grad_of(n, gin, in.bias));
}

/* A norm's node, the one record of batch and layer norm: inputs x and those of w
** and b given, an integer argument of its own (at), and x, mean, rstd and w saved. */
static em_status record_norm(em_state *S, const char *name, emi_ag_fn fn, const em_tensor *x,
                             const em_tensor *w, const em_tensor *b, const em_tensor *mean,
                             const em_tensor *rstd, int at, int64_t arg, em_tensor **out) {
  const em_tensor *in[3];
  int k = pack_inputs(in, x, w, b);
  emi_ag_node *n;
  em_status st = emi_ag_node_new(S, name, fn, *out, in, k, &n);
  if (st) return emi_ag_fail(out, st);
  n->iarg[NORM_HAS_WEIGHT] = w != NULL;
  n->iarg[NORM_HAS_BIAS] = b != NULL;
  n->iarg[at] = arg;
  norm_saved v = {.x = x, .mean = mean, .rstd = rstd, .weight = w};
  if ((st = EMI_AG_SAVE_VIEW(S, n, v))) return emi_ag_fail(out, st);
  return EM_OK;
}

em_status emi_ag_record_batch_norm(em_state *S, const em_tensor *x, const em_tensor *w,
                                   const em_tensor *b, const em_tensor *save_mean,
                                   const em_tensor *save_invstd, int training,
                                   em_tensor **out) {
  return record_norm(S, "batch_norm", batch_norm_backward, x, w, b, save_mean, save_invstd,
                     BN_TRAINING, training, out);
}

static em_status layer_norm_backward(em_state *S, emi_ag_node *n, const em_tensor *g,
                                     em_tensor **gin) {
  norm_saved v;
  em_status st = EMI_AG_LOAD_VIEW(S, n, v);
  if (st) return st;
  nn_inputs in = norm_inputs(n);
  return em_layer_norm_backward(S, g, v.x, (int)n->iarg[LN_NORMALIZED_NDIM], v.mean, v.rstd,
                                v.weight, grad_of(n, gin, in.x), grad_of(n, gin, in.weight),
                                grad_of(n, gin, in.bias));
}

em_status emi_ag_record_layer_norm(em_state *S, const em_tensor *x, int normalized_ndim,
                                   const em_tensor *w, const em_tensor *b,
                                   const em_tensor *mean, const em_tensor *rstd,
                                   em_tensor **out) {
  return record_norm(S, "layer_norm", layer_norm_backward, x, w, b, mean, rstd,
                     LN_NORMALIZED_NDIM, normalized_ndim, out);
}

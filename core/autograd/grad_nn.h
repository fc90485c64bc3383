/*
** grad_nn.h -- the autograd recorders of the nn kernels (grad_nn.c), called by
** the one recording branch at the end of each public op in core/ops/nn_*.c.
** Each takes ownership of *out on failure (released, set to NULL). Optional
** tensors (weight, bias) may be NULL; borrowed extra outputs of the forward
** (indices, lse, saved statistics) are saved by the node.
*/
#ifndef EMBER_GRAD_NN_H
#define EMBER_GRAD_NN_H
#include "autograd.h"

/* Whether any of a and the optional b, c requires grad, with grad mode on. */
static inline int emi_ag_wanted_opt(em_state *S, const em_tensor *a, const em_tensor *b,
                                    const em_tensor *c) {
  return ((a->requires_grad | (b && b->requires_grad) | (c && c->requires_grad)) &
          S->ag_watch) && emi_ag_recording(S, a, b, c);
}

em_status emi_ag_record_conv2d(em_state *S, const em_tensor *x, const em_tensor *w,
                               const em_tensor *b, const int64_t *stride,
                               const int64_t *padding, const int64_t *dilation,
                               int64_t groups, em_tensor **out);
/* em_max_pool2d_backward with own set when the indices are max_pool2d's own (the
** node's saved ones): in range, so a backend need not check them (nn_pool.c). */
em_status emi_max_pool2d_backward(em_state *S, const em_tensor *grad_out,
                                  const em_tensor *input, const em_tensor *indices,
                                  int index_base, int own, em_tensor **grad_input);
em_status emi_ag_record_max_pool2d(em_state *S, const em_tensor *x, const em_tensor *indices,
                                   int index_base, em_tensor **out);
em_status emi_ag_record_avg_pool2d(em_state *S, const em_tensor *x, const int64_t *kernel,
                                   const int64_t *stride, const int64_t *padding,
                                   int ceil_mode, int count_include_pad, em_tensor **out);
em_status emi_ag_record_adaptive_avg_pool2d(em_state *S, const em_tensor *x, em_tensor **out);
em_status emi_ag_record_cross_entropy(em_state *S, const em_tensor *logits,
                                      const em_tensor *target, const em_tensor *lse,
                                      int index_base, int64_t ignore_index,
                                      double label_smoothing, int reduction, em_tensor **out);
em_status emi_ag_record_nll_loss(em_state *S, const em_tensor *logp, const em_tensor *target,
                                 int index_base, int64_t ignore_index, int reduction,
                                 em_tensor **out);
/* bce != 0: binary_cross_entropy_with_logits, else mse_loss. */
em_status emi_ag_record_pointwise_loss(em_state *S, int bce, const em_tensor *input,
                                       const em_tensor *target, int reduction,
                                       em_tensor **out);
em_status emi_ag_record_batch_norm(em_state *S, const em_tensor *x, const em_tensor *w,
                                   const em_tensor *b, const em_tensor *save_mean,
                                   const em_tensor *save_invstd, int training,
                                   em_tensor **out);
em_status emi_ag_record_layer_norm(em_state *S, const em_tensor *x, int normalized_ndim,
                                   const em_tensor *w, const em_tensor *b,
                                   const em_tensor *mean, const em_tensor *rstd,
                                   em_tensor **out);
#endif

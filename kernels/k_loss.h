/*
** k_loss.h -- the CUDA backend's losses (k_loss.c): the backend entries
** cross_entropy, nll_loss and pointwise_loss (EMI_LOSS_*), forward and
** backward, with the semantics and target errors of the CPU backend's
** (core/cpu/nn_loss.c).
*/
#ifndef EMBER_KERNELS_K_LOSS_H
#define EMBER_KERNELS_K_LOSS_H
#include "cuda.h"

em_status emk_cross_entropy(emi_device *d, em_tensor *loss, em_tensor *lse, const em_tensor *x,
                            const em_tensor *target, int index_base, int64_t ignore_index,
                            double label_smoothing, int reduction);
em_status emk_cross_entropy_backward(emi_device *d, em_tensor *gx, const em_tensor *grad_loss,
                                     const em_tensor *x, const em_tensor *target,
                                     const em_tensor *lse, int index_base,
                                     int64_t ignore_index, double label_smoothing,
                                     int reduction);
em_status emk_nll_loss(emi_device *d, em_tensor *loss, const em_tensor *logp,
                       const em_tensor *target, int index_base, int64_t ignore_index,
                       int reduction);
em_status emk_nll_loss_backward(emi_device *d, em_tensor *gx, const em_tensor *grad_loss,
                                const em_tensor *target, int index_base, int64_t ignore_index,
                                int reduction);
em_status emk_pointwise_loss(emi_device *d, int kind, em_tensor *loss, const em_tensor *x,
                             const em_tensor *y, int reduction);
em_status emk_pointwise_loss_backward(emi_device *d, int kind, em_tensor *gx,
                                      const em_tensor *grad_loss, const em_tensor *x,
                                      const em_tensor *y, int reduction);

#endif

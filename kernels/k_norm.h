/*
** k_norm.h -- the CUDA backend's layer norm (k_norm.c): the backend entries
** layer_norm and layer_norm_backward, with the semantics of the CPU backend's
** (core/cpu/normalize.c).
*/
#ifndef EMBER_KERNELS_K_NORM_H
#define EMBER_KERNELS_K_NORM_H
#include "cuda.h"

em_status emk_layer_norm(emi_device *d, em_tensor *y, em_tensor *mean, em_tensor *rstd,
                         const em_tensor *x, const em_tensor *w, const em_tensor *b,
                         double eps);
em_status emk_layer_norm_backward(emi_device *d, em_tensor *gx, em_tensor *gw, em_tensor *gb,
                                  const em_tensor *gy, const em_tensor *x,
                                  const em_tensor *mean, const em_tensor *rstd,
                                  const em_tensor *w);

#endif

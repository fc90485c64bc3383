/*
** k_optim.h -- the CUDA backend's multi-tensor optimizer entries (k_optim.c):
** SGD and Adam(W) steps, the gradient-norm reduction and the gradient scaling of
** clip_grad_norm, each over a whole list of tensors in one kernel launch, with
** the semantics core/backend.h gives the emi_backend entries of the same names.
*/
#ifndef EMBER_KERNELS_K_OPTIM_H
#define EMBER_KERNELS_K_OPTIM_H
#include "cuda.h"

em_status emk_sgd_step_multi(emi_device *d, int n, em_tensor *const *p,
                             const em_tensor *const *g, em_tensor *const *buf,
                             const int *first, double lr, double momentum, double dampening,
                             double wd, int nesterov);
em_status emk_adam_step_multi(emi_device *d, int n, em_tensor *const *p,
                              const em_tensor *const *g, em_tensor *const *m,
                              em_tensor *const *v, const double *step_size,
                              const double *bc2_sqrt, double beta1, double beta2, double eps,
                              double wd, double decay);
em_status emk_norm_multi(emi_device *d, em_tensor *out, int n, const em_tensor *const *t,
                         double p);
em_status emk_scale_multi(emi_device *d, int n, em_tensor *const *t, double scale);

#endif

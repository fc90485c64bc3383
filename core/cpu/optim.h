/*
** optim.h -- the CPU optimizer kernels (core/cpu/optim.c), called by
** core/ops/optim.c. They are not (yet) backend-table entries: when a second
** backend arrives they move into emi_backend beside the element-wise entries.
*/
#ifndef EMBER_CPU_OPTIM_H
#define EMBER_CPU_OPTIM_H
#include "../internal.h"

/* All tensors contiguous, same numel and dtype (float32 or float64), checked by
** the ops layer; buf is NULL when momentum == 0. */
em_status emi_cpu_sgd_step(em_state *S, em_tensor *p, const em_tensor *g, em_tensor *buf,
                           double lr, double momentum, double dampening, double wd,
                           int nesterov, int first_step);
/* step_size = lr / (1 - beta1^step), bc2_sqrt = sqrt(1 - beta2^step), decay: the
** factor p is multiplied by first (AdamW; 1 for Adam), wd: L2 term added to g (Adam). */
em_status emi_cpu_adam_step(em_state *S, em_tensor *p, const em_tensor *g,
                            em_tensor *m, em_tensor *v, double beta1, double beta2,
                            double eps, double wd, double decay, double step_size,
                            double bc2_sqrt);
#endif

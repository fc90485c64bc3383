/*
** k_reduce.h -- the CUDA backend's reductions (k_reduce.c): the backend entries
** reduce (every em_redop), var, norm, arg_reduce and softmax, with the
** semantics of the CPU backend's (core/cpu/reduce.c, reduce_arg.c, softmax.c).
*/
#ifndef EMBER_KERNELS_K_REDUCE_H
#define EMBER_KERNELS_K_REDUCE_H
#include "cuda.h"

em_status emk_reduce(emi_device *d, em_redop op, em_tensor *out, const em_tensor *a,
                     unsigned mask);
em_status emk_var(emi_device *d, em_tensor *out, const em_tensor *a, unsigned mask,
                  double correction, int take_sqrt);
em_status emk_norm(emi_device *d, em_tensor *out, const em_tensor *a, unsigned mask,
                   double p);
em_status emk_arg_reduce(emi_device *d, em_tensor *values, em_tensor *indices,
                         const em_tensor *a, int dim, int want_max, int index_base);
em_status emk_softmax(emi_device *d, em_tensor *out, const em_tensor *a, int dim, int log);

#endif

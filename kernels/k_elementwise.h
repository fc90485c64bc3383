/*
** k_elementwise.h -- the CUDA backend's element-wise entries (k_elementwise.c):
** unary, binary, binary_scalar, add_scaled, clamp, where, and dtype conversions
** within one device. Each takes tensors on d's device (operands out-shaped, as
** core/backend.h's emi_backend describes) and queues its kernel on the
** device's compute stream; results match the CPU backend's.
*/
#ifndef EMBER_KERNELS_K_ELEMENTWISE_H
#define EMBER_KERNELS_K_ELEMENTWISE_H
#include "cuda.h"

em_status emk_unary(emi_device *d, em_unop op, em_tensor *out, const em_tensor *a);
em_status emk_binary(emi_device *d, em_binop op, em_tensor *out, const em_tensor *a,
                     const em_tensor *b);
em_status emk_binary_scalar(emi_device *d, em_binop op, em_tensor *out, const em_tensor *a,
                            double s, int reverse);
em_status emk_add_scaled(emi_device *d, em_tensor *out, const em_tensor *a,
                         const em_tensor *b, double alpha);
em_status emk_clamp(emi_device *d, em_tensor *out, const em_tensor *a, double lo,
                    double hi);
em_status emk_where(emi_device *d, em_tensor *out, const em_tensor *cond,
                    const em_tensor *a, const em_tensor *b);
/* out[i] = (out.dtype) src[i], src out-shaped on the same device, dtypes differ. */
em_status emk_cast(emi_device *d, em_tensor *out, const em_tensor *src);

#endif

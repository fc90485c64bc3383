/*
** dnnl.h -- oneDNN (loaded at run time) as a first choice for the CPU conv and
** matmul entries. Each call either serves the op (*served = true; the status is the
** op's) or declines it (*served = false, EM_OK, nothing written), and the caller
** goes on with ember's own kernels. It declines when the library is absent, when
** ember's kernels measured faster for the case (the decision table in dnnl.c), when
** EMBER_CPU_KERNELS=ours, or for shapes, dtypes and layouts it does not serve.
*/
#ifndef EMBER_CPU_DNNL_H
#define EMBER_CPU_DNNL_H
#include "cpu.h"

em_status emi_dnnl_conv2d(em_state *S, const emi_conv_geom *g, em_tensor *y,
                          const em_tensor *x, const em_tensor *w, const em_tensor *b,
                          bool *served);
/* Serves what it can of the three gradients and sets the pointers of those it
** wrote to NULL; the caller computes the ones left (if any). */
em_status emi_dnnl_conv2d_backward(em_state *S, const emi_conv_geom *g, em_tensor **gx,
                                   em_tensor **gw, em_tensor **gb, const em_tensor *gy,
                                   const em_tensor *x, const em_tensor *w);
em_status emi_dnnl_matmul(em_state *S, em_tensor *out, const em_tensor *a,
                          const em_tensor *b, bool *served);

#endif

/*
** k_index.h -- the CUDA backend's indexing kernels (k_index.c): index_select,
** gather, index_add and scatter_add, with the semantics and error messages of
** the CPU backend's (core/cpu/index.c, scatter.c).
*/
#ifndef EMBER_KERNELS_K_INDEX_H
#define EMBER_KERNELS_K_INDEX_H
#include "cuda.h"

em_status emk_index_select(emi_device *d, em_tensor *out, const em_tensor *a, int dim,
                           const em_tensor *idx, int index_base);
em_status emk_gather(emi_device *d, em_tensor *out, const em_tensor *a, int dim,
                     const em_tensor *idx, int index_base);
em_status emk_index_add(emi_device *d, em_tensor *out, int dim, const em_tensor *idx,
                        const em_tensor *src, int index_base);
em_status emk_scatter_add(emi_device *d, em_tensor *out, int dim, const em_tensor *idx,
                          const em_tensor *src, int index_base);

#endif

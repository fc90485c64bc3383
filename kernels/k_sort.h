/*
** k_sort.h -- the CUDA backend's sort and scan entries (k_sort.c), with the
** semantics of the CPU backend's (core/cpu/sort_scan.c).
*/
#ifndef EMBER_KERNELS_K_SORT_H
#define EMBER_KERNELS_K_SORT_H
#include "cuda.h"

em_status emk_sort(emi_device *d, em_tensor *indices, const em_tensor *a, int dim,
                   int descending, int index_base, int64_t k);
em_status emk_scan(emi_device *d, int op, em_tensor *out, const em_tensor *a, int dim);

#endif

/*
** k_random.h -- the CUDA backend's random fills and arange (k_random.c): the
** same numbers as the CPU backend's (core/cpu/random.c) for the same seed,
** offset and tensor geometry, following the stream layout in core/philox.h.
*/
#ifndef EMBER_KERNELS_K_RANDOM_H
#define EMBER_KERNELS_K_RANDOM_H
#include "cuda.h"

em_status emk_uniform(emi_device *d, em_tensor *out, uint64_t seed, uint64_t offset,
                      double lo, double hi);
em_status emk_normal(emi_device *d, em_tensor *out, uint64_t seed, uint64_t offset,
                     double mean, double std);
em_status emk_randint(emi_device *d, em_tensor *out, uint64_t seed, uint64_t offset,
                      int64_t lo, int64_t hi);
em_status emk_arange(emi_device *d, em_tensor *out, double start, double step);

#endif

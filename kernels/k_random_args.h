/*
** k_random_args.h -- what the random kernels (k_random.cu) and their C launchers
** (k_random.c) share: the argument struct, the kinds of draw, the launch sizes and
** the kernel's descriptor. Included by C and C++ alike.
*/
#ifndef EMBER_KERNELS_K_RANDOM_ARGS_H
#define EMBER_KERNELS_K_RANDOM_ARGS_H
#include "runtime.h"

enum { THREADS = 256, MAX_BLOCKS = 4096 };
enum { R_UNIFORM, R_NORMAL, R_RANDINT, R_ARANGE };

typedef struct rnd_args {
  char *out;
  int64_t n;                     /* work items: elements, or pairs for normal */
  int64_t numel;
  int ndim, dt, esize, op, words;
  int64_t sizes[EM_MAX_DIMS];
  int64_t strides[EM_MAX_DIMS];  /* in elements */
  uint64_t seed, offset;
  float flo, fspan, fhi, ftop;   /* uniform float32/float16/bfloat16 */
  double dlo, dspan, dhi, dtop;  /* uniform float64; normal: dlo mean, dspan std */
  int64_t lo;                    /* randint */
  uint64_t range;
  double start, step;            /* arange */
} rnd_args;

/* The kernels (k_random.cu). */
EMK_KERNEL_DECL(k_random);

#endif

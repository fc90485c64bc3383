/*
** k_matmul_args.h -- what the integer matmul kernel (k_matmul.cu) and the matmul
** entry (k_matmul.c) share: the argument struct, the launch sizes and the kernel's
** descriptor. Included by C and C++ alike.
*/
#ifndef EMBER_KERNELS_K_MATMUL_ARGS_H
#define EMBER_KERNELS_K_MATMUL_ARGS_H
#include "runtime.h"

enum { THREADS = 256, MAX_BLOCKS = 4096 };

typedef struct imm_args {
  char *out;
  const char *a, *b;
  int dtype, nb;
  int64_t total, M, N, K;
  int64_t bsizes[EM_MAX_DIMS], abs_[EM_MAX_DIMS], bbs[EM_MAX_DIMS];   /* elements */
  int64_t ars, acs, brs, bcs;
} imm_args;

/* The kernels (k_matmul.cu). */
EMK_KERNEL_DECL(k_matmul_int);

#endif

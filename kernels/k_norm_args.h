/*
** k_norm_args.h -- what the layer norm kernels (k_norm.cu) and their C launchers
** (k_norm.c) share: the argument struct, the launch sizes and the kernels'
** descriptors. Included by C and C++ alike.
*/
#ifndef EMBER_KERNELS_K_NORM_ARGS_H
#define EMBER_KERNELS_K_NORM_ARGS_H
#include "runtime.h"

enum { THREADS = 256, MAX_BLOCKS = 4096, ROW_WARP_MAX = 1024,
       CHUNK_ROWS = 32, MAX_CHUNKS = 64 };

typedef struct ln_args {
  const char *x, *w, *b, *gy, *mean, *rstd;  /* w, b (K) or NULL; mean, rstd (M) */
  char *y, *mo, *ro, *gx, *gw, *gb;          /* forward: y, mo, ro; backward: gx, gw, gb */
  double *part;                              /* backward: (CH, 2, K) partial sums */
  int64_t M, K, ch;
  int f64, tpr;
  double eps;
} ln_args;

/* The kernels (k_norm.cu). */
EMK_KERNEL_DECL(k_ln_fwd);
EMK_KERNEL_DECL(k_ln_bwd_x);
EMK_KERNEL_DECL(k_ln_wb_part);
EMK_KERNEL_DECL(k_ln_wb_fin);

#endif

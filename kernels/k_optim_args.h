/*
** k_optim_args.h -- what the multi-tensor optimizer kernels (k_optim.cu) and their
** C launchers (k_optim.c) share: the chunk table's entries, the argument struct,
** the kinds of update and of norm, the chunk and lane counts, and the kernels'
** descriptors. Included by C and C++ alike.
*/
#ifndef EMBER_KERNELS_K_OPTIM_ARGS_H
#define EMBER_KERNELS_K_OPTIM_ARGS_H
#include "runtime.h"

/* CHUNK and LANES are part of norm_multi's contract (core/backend.h, core/cpu/optim.c). */
enum { CHUNK = 4096, LANES = 256, MAX_BLOCKS = 4096 };
enum { MT_SGD, MT_ADAM, MT_SCALE };
enum { N_SUMSQ, N_SUMABS, N_SUMPOW, N_MAXABS };

/* One tensor of a launch (the device table). */
typedef struct mt_tensor {
  char *p;                 /* the parameter (norm, scale: the tensor) */
  const char *g;           /* its gradient */
  char *s1, *s2;           /* state: momentum buffer, or exp_avg and exp_avg_sq */
  int64_t n;               /* numel >= 1 */
  int64_t chunk0;          /* its first chunk */
  double c0, c1;           /* SGD: c0 = first step; Adam: step_size, bc2_sqrt */
} mt_tensor;

typedef struct mt_args {
  const mt_tensor *tab;
  int ntens, kind, f64, norm;
  int64_t nchunks;
  double h[6];             /* hyper-parameters, in the CPU kernels' order */
  double p;                /* norm exponent (N_SUMPOW) */
  double *partial;         /* norm: (nchunks) */
  unsigned *done;          /* norm: finished blocks, 0 at the launch */
  double *out;             /* norm: the 0-D result */
} mt_args;

/* The kernels (k_optim.cu). */
EMK_KERNEL_DECL(k_mt_update);
EMK_KERNEL_DECL(k_mt_norm);

#endif

/*
** k_pool_args.h -- what the pooling kernels (k_pool.cu) and their launchers
** (k_pool.c) share: the argument struct and the kernels' descriptors. Included
** by C and C++ alike.
*/
#ifndef EMBER_KERNELS_K_POOL_ARGS_H
#define EMBER_KERNELS_K_POOL_ARGS_H
#include "runtime.h"

enum { POOL_THREADS = 256, POOL_MAX_BLOCKS = 4096 };

/* Planes are (n, c) pairs: N samples of C channels. A NCHW geometry (which
** knows only its planes) is N = planes, C = 1. Every array is read through its
** strides (n, c, h, w), so one kernel serves NCHW and NHWC; work items are
** numbered channel-fastest when nhwc, so that neighbouring threads touch
** neighbouring addresses in either layout. */
typedef struct pool_args {
  const void *x;                  /* forward: x; backward: gy */
  void *y;                        /* forward: y; backward: gx */
  int64_t *ind;                   /* max_pool2d's indices (written) */
  const int64_t *cind;            /* max_pool2d_backward's (read) */
  int64_t total;                  /* threads' work items */
  int64_t N, C;
  int64_t xs[4], ys[4], is[4];    /* strides of x (gx), y (gy), the indices */
  int64_t H, W, OH, OW, kH, kW, sH, sW, pH, pW, dH, dW;
  int base, include_pad, nhwc;
} pool_args;

/* The kernels (k_pool.cu), per dtype: f32, f64, f16, bf16. The max-pool
** backward of the half types writes a float32 gradient (k_pool.c rounds it). */
#define EMK_POOL_KERNELS_(name) \
  EMK_KERNEL_DECL(name##_f32); EMK_KERNEL_DECL(name##_f64); \
  EMK_KERNEL_DECL(name##_f16); EMK_KERNEL_DECL(name##_bf16)
EMK_POOL_KERNELS_(k_pool_max);
EMK_POOL_KERNELS_(k_pool_max_bwd);
EMK_POOL_KERNELS_(k_pool_avg);
EMK_POOL_KERNELS_(k_pool_avg_bwd);
EMK_POOL_KERNELS_(k_pool_ada);
EMK_POOL_KERNELS_(k_pool_ada_bwd);

#endif

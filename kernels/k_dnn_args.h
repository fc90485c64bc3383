/*
** k_dnn_args.h -- what the evaluation batch norm kernels (k_dnn.cu) and
** the nn entries (k_dnn.c) share: the argument structs, the launch sizes and the
** kernels' descriptors. Included by C and C++ alike.
*/
#ifndef EMBER_KERNELS_K_DNN_ARGS_H
#define EMBER_KERNELS_K_DNN_ARGS_H
#include "runtime.h"

enum { THREADS = 256, MAX_BLOCKS = 4096 };

typedef struct bn_args {
  const void *x, *gy, *w, *b, *rm, *rv;
  void *y, *mean, *invstd, *gx, *gw, *gb;
  int64_t N, C, L, total, rms, rvs;   /* rms, rvs: running stats' strides */
  int64_t nhwc;                       /* x, y, gy, gx channels last: N*L rows of C */
  double eps;
} bn_args;

/* The kernels (k_dnn.cu). */
EMK_KERNEL_DECL(k_dnn_bn_eval_stats_f32);
EMK_KERNEL_DECL(k_dnn_bn_eval_stats_f64);
EMK_KERNEL_DECL(k_dnn_bn_apply_f32);
EMK_KERNEL_DECL(k_dnn_bn_apply_f64);
EMK_KERNEL_DECL(k_dnn_bn_eval_bwd_f32);
EMK_KERNEL_DECL(k_dnn_bn_eval_bwd_f64);
EMK_KERNEL_DECL(k_dnn_bn_apply_f16);
EMK_KERNEL_DECL(k_dnn_bn_apply_bf16);
EMK_KERNEL_DECL(k_dnn_bn_eval_bwd_f16);
EMK_KERNEL_DECL(k_dnn_bn_eval_bwd_bf16);

#endif

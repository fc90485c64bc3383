/*
** k_loss_args.h -- what the loss kernels (k_loss.cu) and their C launchers
** (k_loss.c) share: the argument structs, the launch sizes and the kernels'
** descriptors. Included by C and C++ alike.
*/
#ifndef EMBER_KERNELS_K_LOSS_ARGS_H
#define EMBER_KERNELS_K_LOSS_ARGS_H
#include "runtime.h"

enum { THREADS = 256, MAX_BLOCKS = 4096, PW_MAX_BLOCKS = 1024, ROW_WARP_MAX = 1024 };

typedef struct ce_args {
  const char *x, *tgt, *gl;   /* x (N, C) contiguous; target (N) stride ts; grad_loss */
  char *loss, *lse, *gx;      /* forward: loss (N) (none) or NULL; lse (N); backward: gx */
  double *rows;               /* forward, mean/sum: per-row losses (N) */
  int64_t N, C, ts, gls, base, ignore;
  int f64, t64, tpr, gl_none;
  double smooth, scale;       /* backward: the factor on grad_loss (1/count for mean) */
} ce_args;

typedef struct nll_args {
  const char *x, *tgt, *gl;   /* forward: logp (N, C) strides s0, s1; backward: grad_loss */
  char *loss, *gx;            /* forward: loss (N) (none) or NULL; backward: gx (N, C) */
  double *rows;
  int64_t N, C, s0, s1, ts, gls, base, ignore;
  int f64, t64, gl_none;
  double scale;
} nll_args;

typedef struct pw_args {
  const char *x, *y, *gl;     /* x, y (n) contiguous; backward: grad_loss (n) or 1 */
  char *out;                  /* forward (none): loss (n); backward: gx (n) */
  double *part;               /* forward (mean/sum): one partial sum per block */
  int64_t n;
  int mse, f64, gl_none;      /* mse: EMI_LOSS_MSE, else EMI_LOSS_BCE_LOGITS */
  double div;                 /* backward, mean/sum: n or 1 (the CPU divides) */
} pw_args;

typedef struct total_args {
  const double *part;
  char *out;                  /* 0-d, float32 or float64 */
  int64_t n;
  double div;                 /* mean: the count (may be 0: 0/0 = NaN); sum: 1 */
  int f64;
} total_args;

/* The kernels (k_loss.cu). */
EMK_KERNEL_DECL(k_ce_fwd);
EMK_KERNEL_DECL(k_ce_bwd);
EMK_KERNEL_DECL(k_nll_fwd);
EMK_KERNEL_DECL(k_nll_bwd);
EMK_KERNEL_DECL(k_pw_fwd);
EMK_KERNEL_DECL(k_pw_sum);
EMK_KERNEL_DECL(k_pw_bwd);
EMK_KERNEL_DECL(k_loss_total);

#endif

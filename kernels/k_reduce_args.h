/*
** k_reduce_args.h -- what the reductions' kernels (k_reduce.cu) and their C
** launchers (k_reduce.c) share: the argument structs, the accumulation and
** finishing kinds, the launch sizes, and the kernels' descriptors. Included by C
** and C++ alike.
*/
#ifndef EMBER_KERNELS_K_REDUCE_ARGS_H
#define EMBER_KERNELS_K_REDUCE_ARGS_H
#include "runtime.h"

enum { RT = 256, MAX_BLOCKS = 4096,
       SEQ_MIN_K = 2048, SEQ_MAX_R = 32,            /* see seq_shape */
       WARP_MAX_R = 512, WARP_ROWS = 8,              /* see launch_rows */
       SPLIT_BLOCKS = 1024, SPLIT_MIN = 4096 };      /* see split_of */

/* accumulation kinds: K_* double, KI_* int64 */
enum { K_SUM, K_PROD, K_MAX, K_MIN, K_CNTNZ, K_SUMABS, K_SUMSQ, K_SUMPOW, K_MAXABS,
       K_MINABS, K_SUMEXP, K_SUMSQDEV, KI_SUM, KI_PROD, KI_MAX, KI_MIN };
enum { F_ID, F_MEAN, F_SQRT, F_ROOT, F_ANY, F_ALL, F_VAR, F_STD, F_LSE };

typedef struct rgeom {
  const char *in;
  char *out;
  int idt, odt, iesz, oesz;
  int nk, nr;
  int vec, ovec;          /* float32 slices contiguous in the input / the output */
  int64_t K, R;
  int64_t ksz[EM_MAX_DIMS], kst[EM_MAX_DIMS], kost[EM_MAX_DIMS];  /* in elements */
  int64_t rsz[EM_MAX_DIMS], rst[EM_MAX_DIMS], rost[EM_MAX_DIMS];
} rgeom;

typedef struct red_args {
  rgeom g;
  int kind, fin;
  double p, arg;          /* norm exponent; F_ROOT: 1/p, F_VAR/F_STD: correction */
  /* split work (k_reduce_part, k_reduce_comb): S chunks of `chunk` elements per
  ** output, K*S partials in part (int64 kinds: as int64), K shifts in shift
  ** (written by stages 1 and 2, read by var's and logsumexp's stage 0) */
  int64_t S, chunk;
  double *part, *shift;
  int stage;              /* k_reduce_comb: 0 the result, 1 var's mean, 2 lse's max */
} red_args;

typedef struct arg_args {
  rgeom g;
  char *vout;             /* values, or NULL */
  int64_t vkost[EM_MAX_DIMS];
  int want_max, i64;
  int64_t base;
  int64_t S, chunk;       /* split work: partial candidates per (output, chunk) */
  double *pf;
  int64_t *pv, *px;
} arg_args;

typedef struct smax_args {
  rgeom g;
  int log;
} smax_args;

/* The kernels (k_reduce.cu). */
EMK_KERNEL_DECL(k_reduce);
EMK_KERNEL_DECL(k_reduce_part);
EMK_KERNEL_DECL(k_reduce_comb);
EMK_KERNEL_DECL(k_reduce_seq);
EMK_KERNEL_DECL(k_arg);
EMK_KERNEL_DECL(k_arg_part);
EMK_KERNEL_DECL(k_arg_comb);
EMK_KERNEL_DECL(k_arg_seq);
EMK_KERNEL_DECL(k_softmax);
EMK_KERNEL_DECL(k_softmax_seq);

#endif

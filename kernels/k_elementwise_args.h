/*
** k_elementwise_args.h -- what the element-wise kernels (k_elementwise.cu) and
** their C launchers (k_elementwise.c) share: the argument struct, the kinds of
** element operation, and the kernels' descriptors. Included by C and C++ alike.
*/
#ifndef EMBER_KERNELS_K_ELEMENTWISE_ARGS_H
#define EMBER_KERNELS_K_ELEMENTWISE_ARGS_H
#include "runtime.h"

enum { K_UNARY, K_BINARY, K_SCALAR, K_ADDS, K_CLAMP, K_WHERE, K_CAST };

typedef struct ew_args {
  char *out;
  const char *in[3];
  int *err;                        /* integer remainder: set to 1 on division by zero */
  int64_t n;
  int ndim, nin, contig, narrow;   /* contig: 1 contiguous, 2 every operand dense in
                                   ** out's order (flat index either way); narrow:
                                   ** n < 2^31, unravel in 32 bits */
  int kind, op, dt, odt;           /* dt: the operands' dtype (cast: the source's) */
  int reverse, pspec;              /* scalar: s op a; pow's special exponents */
  int esz[4];                      /* element sizes: out, in[0..2] */
  float f0, f1;                    /* scalar / alpha / bounds, per dtype class */
  double d0, d1;
  int64_t i0, i1;
  int64_t sizes[EM_MAX_DIMS];
  int64_t st[4][EM_MAX_DIMS];      /* strides in elements: out, in[0..2] */
} ew_args;

/* Any operands, unravelled per element (one element per thread per trip). */
EMK_KERNEL_DECL(k_ew);
/* Contiguous, 16-byte aligned float32 operands: four elements per access. */
EMK_KERNEL_DECL(k_ew_f32x4);

#endif

/*
** k_copy_args.h -- what the fill and strided copy kernel (k_copy.cu) and its C
** launchers (k_copy.c) share: the argument struct, the launch sizes and the
** kernel's descriptor. Included by C and C++ alike.
*/
#ifndef EMBER_KERNELS_K_COPY_ARGS_H
#define EMBER_KERNELS_K_COPY_ARGS_H
#include "runtime.h"

enum { THREADS = 256, MAX_BLOCKS = 4096 };

typedef struct strided_args {
  char *out;
  const char *src;                /* NULL for a fill */
  int64_t n;
  int ndim, esize;
  int64_t sizes[EM_MAX_DIMS];
  int64_t ostrides[EM_MAX_DIMS];  /* in elements */
  int64_t sstrides[EM_MAX_DIMS];
  uint64_t pattern;               /* fill: the value's bits */
} strided_args;

/* The kernels (k_copy.cu). */
EMK_KERNEL_DECL(k_strided);

#endif

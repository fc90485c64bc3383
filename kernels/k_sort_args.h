/*
** k_sort_args.h -- what the sort and scan kernels (k_sort.cu) and their C
** launchers (k_sort.c) share: the argument struct, the launch sizes and the
** kernels' descriptors. Included by C and C++ alike.
*/
#ifndef EMBER_KERNELS_K_SORT_ARGS_H
#define EMBER_KERNELS_K_SORT_ARGS_H
#include "runtime.h"

enum { SORT_THREADS = 256, SORT_MAX_BLOCKS = 4096 };

/* A tensor a walked as lines along dim: line k of outer * inner lines starts in a
** at the offset its position in the other dims gives, and in the contiguous
** output at (k / inner) * width * inner + k % inner, its elements inner apart
** (width: len, or the k positions a sort writes). */
typedef struct sort_args {
  char *out;                      /* sort: int64 indices; scan: values of a's dtype */
  const char *a;
  int64_t n;                      /* work items: sort, one per element; scan, one per line */
  int64_t len, inner;
  int64_t k;                      /* sort: the first k of each line's order are written */
  int ndim, dim, dt, esize, op, descending, index_base;
  int64_t sizes[EM_MAX_DIMS];
  int64_t astrides[EM_MAX_DIMS];
} sort_args;

EMK_KERNEL_DECL(k_sort_rank);
EMK_KERNEL_DECL(k_scan);

#endif

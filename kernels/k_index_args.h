/*
** k_index_args.h -- what the indexing kernels (k_index.cu) and their C launchers
** (k_index.c) share: the argument struct, the launch sizes and the kernels'
** descriptors. Included by C and C++ alike.
*/
#ifndef EMBER_KERNELS_K_INDEX_ARGS_H
#define EMBER_KERNELS_K_INDEX_ARGS_H
#include "runtime.h"

enum { THREADS = 256, MAX_BLOCKS = 4096 };

typedef struct ix_args {
  char *out;
  const char *a;                  /* index_select/gather: source; adds: src */
  const char *idx;
  int64_t n;                      /* threads' work items */
  int ndim, dim, esize, idt, dt, index_base;
  int64_t nidx;                   /* index_select/index_add: idx numel; scatter_add: line length */
  int64_t istride;                /* idx stride for 1-D idx (elements) */
  int64_t sizes[EM_MAX_DIMS];     /* the geometry walked (see each kernel) */
  int64_t ostrides[EM_MAX_DIMS];
  int64_t astrides[EM_MAX_DIMS];
  int64_t istrides[EM_MAX_DIMS];
} ix_args;

/* The kernels (k_index.cu). */
EMK_KERNEL_DECL(k_index_select);
EMK_KERNEL_DECL(k_gather);
EMK_KERNEL_DECL(k_index_add);
EMK_KERNEL_DECL(k_scatter_add);

#endif

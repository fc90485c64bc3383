/*
** cuda.h -- the CUDA backend's side of a state: the runtime it talks to the
** devices through, the caching allocator, and one context per device (the
** emi_device that S->devices[i] points at, and the device's compute stream).
** Shared by cuda.c (opening, closing, the em_cuda_* calls), backend.c (the
** backend table) and the kernel files.
*/
#ifndef EMBER_KERNELS_CUDA_H
#define EMBER_KERNELS_CUDA_H
#include "internal.h"
#include "runtime.h"
#include "alloc.h"

typedef struct emk_cuda_device {
  emi_device base;               /* base.impl points back here */
  struct emk_cuda *cuda;
  int index;
  emk_stream *compute;           /* every op of this state on this device, in order */
  emk_stream *copy;              /* asynchronous copies from pinned memory (pinned.c) */
} emk_cuda_device;

typedef struct emk_cuda {
  emk_runtime *rt;
  emk_alloc *alloc;
  int ndev, emulated;
  emk_cuda_device *dev[EMK_MAX_DEVICES];
  pthread_mutex_t pinned_mu;     /* guards pinned_dead */
  void *pinned_dead;             /* pinned blocks to give back (pinned.c) */
} emk_cuda;

extern const emi_backend emk_cuda_backend;

static inline emk_cuda_device *emk_dev(emi_device *d) { return (emk_cuda_device *)d->impl; }

/* The runtime's message as the state's error: "op: cuda:N: <message>". */
em_status emk_error(emi_device *d, const char *op, em_status st);

/* -- Kernels (k_copy.c) ----------------------------------------------------------------
** Both take tensors on d's device and queue their kernel on its compute stream. */
em_status emk_fill(emi_device *d, em_tensor *out, double value);
/* out[i] = src[i], one dtype, any strides (out-shaped src). */
em_status emk_copy_same_dtype(emi_device *d, em_tensor *out, const em_tensor *src);

/* Pinned host tensors (pinned.c): whether t's memory is pinned, and the copy
** from such a tensor (contiguous, out's dtype) to out, a contiguous tensor on d. */
int emk_is_pinned(const em_tensor *t);
/* Gives the dead pinned blocks back to the runtime (not on a stream's thread). */
void emk_pinned_collect(emk_cuda *c);
em_status emk_copy_from_pinned(emi_device *d, em_tensor *out, const em_tensor *src);

/* The matmul entry (k_matmul.c), as core/internal.h's emi_backend describes it. */
em_status emk_matmul(emi_device *d, em_tensor *out, const em_tensor *a, const em_tensor *b);

#endif

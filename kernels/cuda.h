/*
** cuda.h -- the CUDA kind's context for a state: the runtime it talks to the
** devices through, the caching allocator, and one context per device (the
** emi_device the registry hands out for cuda:i, and the device's streams, made
** when the state first uses the device: emk_device_open).
** Shared by cuda.c (the kind), backend.c (the op table), services.c (the
** services table) and the kernel files.
*/
#ifndef EMBER_KERNELS_CUDA_H
#define EMBER_KERNELS_CUDA_H
#include "backend.h"
#include <pthread.h>
#include "runtime.h"
#include "alloc.h"

typedef struct emk_cuda_device {
  emi_device base;               /* base.impl points back here */
  struct emk_cuda *cuda;
  int index;
  int opened;                    /* atomic: 1 once compute and copy exist (emk_device_open) */
  emk_stream *compute;           /* every op of this state on this device, in order */
  emk_stream *copy;              /* asynchronous copies from pinned memory (pinned.c) */
  emk_stream *comm;              /* collectives (services.c), made on first use */
  struct em_cuda_graph *capture; /* the graph being captured here, or NULL (graph.c) */
} emk_cuda_device;

typedef struct emk_cuda {
  em_state *S;
  emk_runtime *rt;
  emk_alloc *alloc;
  int ndev, emulated;
  emk_cuda_device *dev[EMK_MAX_DEVICES];
  struct emk_algo_cache *algos;  /* convolution algorithms by geometry (algo_cache.c) */
  pthread_mutex_t open_mu;       /* guards opening a device (emk_device_open) */
  pthread_mutex_t pinned_mu;     /* guards pinned_dead */
  void *pinned_dead;             /* pinned blocks to give back (pinned.c) */
} emk_cuda;

extern const emi_backend emk_cuda_backend;
extern const emi_services emk_cuda_services;
extern const emi_backend_kind emk_cuda_kind;

static inline emk_cuda_device *emk_dev(emi_device *d) { return (emk_cuda_device *)d->impl; }
/* The kind's context for S: NULL until the state opened its CUDA devices. */
static inline emk_cuda *emk_ctx(em_state *S) {
  return (emk_cuda *)emi_kind_ctx(S, &emk_cuda_kind);
}

/* Opens device i for the state on its first use: its compute and copy streams,
** which is where the runtime makes the device's CUDA context (and loads the
** kernels into it). Until then the state has not touched the device, so a
** process that uses one GPU of eight makes one context, and a GPU in
** EXCLUSIVE_PROCESS mode that another process holds is refused only to the
** state that asks for it. Thread-safe (under c->open_mu; an opened device costs
** one atomic load); EM_OK at once when open. On failure, why says which device
** and the runtime's reason, and a later use tries again. */
em_status emk_device_open(emk_cuda *c, int i, char *why, size_t whylen);
static inline int emk_device_is_open(const emk_cuda_device *cd) {
  return __atomic_load_n(&cd->opened, __ATOMIC_ACQUIRE);
}
/* For tests: bit d set when the state's runtime made (or would have made, on the
** emulator) a CUDA context on device d; 0 when S has no CUDA context. Exported,
** so a Lua test can reach it in the loaded library (ffi.load). */
unsigned emk_cuda_contexts(em_state *S);

/* The runtime's message as the state's error: "op: cuda:N: <message>". */
em_status emk_error(emi_device *d, const char *op, em_status st);

/* -- Kernels (k_copy.c) ----------------------------------------------------------------
** Both take tensors on d's device and queue their kernel on its compute stream. */
em_status emk_fill(emi_device *d, em_tensor *out, double value);
/* out[i] = src[i], one dtype, any strides (out-shaped src). */
em_status emk_copy_same_dtype(emi_device *d, em_tensor *out, const em_tensor *src);

/* CUDA graphs (graph.c). While d captures: a new storage is kept by the graph
** (keep), a storage freed is taken by it and freed with it (take_dead: 1 when
** taken), a copy from the CPU becomes a constant of the graph (upload), and
** refuse makes an op that can't be captured fail, and the capture with it. emk_storage_free is the backend's real free (backend.c). */
void emk_graph_keep(emk_cuda_device *cd, emi_storage *st);
int emk_graph_take_dead(emk_cuda_device *cd, emi_storage *st);
em_status emk_graph_refuse(emi_device *d, const char *op, const char *what);
/* Queues n bytes from the CPU to dst as a constant of the graph d captures. */
em_status emk_graph_upload(emi_device *d, void *dst, const void *src, size_t n);
void emk_storage_free(emi_device *d, emi_storage *st);

/* Pinned host tensors (pinned.c): whether t's memory is pinned, and the copy
** from such a tensor (contiguous, out's dtype) to out, a contiguous tensor on d. */
int emk_is_pinned(const em_tensor *t);
/* Gives the dead pinned blocks back to the runtime (not on a stream's thread). */
void emk_pinned_collect(emk_cuda *c);
em_status emk_copy_from_pinned(emi_device *d, em_tensor *out, const em_tensor *src);
/* The same copy without the compute stream's wait: *on_copy = 1 when it was
** queued on the copy stream (the caller records an event there and makes the
** compute stream wait for it before the tensor is used), 0 when it ran on the
** compute stream. */
em_status emk_pinned_copy_queue(emi_device *d, em_tensor *out, const em_tensor *src,
                                int *on_copy);
/* The loader's pool of pinned buffers (pinned.c): alloc and put are its
** em_loader_config.buffer_alloc and buffer_free (any thread; put never calls the
** runtime); copying marks a buffer a queued copy reads (a worker short of
** buffers waits for those); close gives the pool up (busy buffers go back to the
** runtime when they die). */
typedef struct emi_pinned_pool emk_pinned_pool;
/* target: the buffers the pipeline needs (past them, a worker waits for a copy). */
em_status emk_pinned_pool_new(em_state *S, emk_cuda *c, int target, emk_pinned_pool **out);
void *emk_pinned_pool_alloc(void *ud, size_t nbytes);
void emk_pinned_pool_put(void *ud, void *p, size_t nbytes);
void emk_pinned_pool_copying(emk_pinned_pool *pl, const void *p);
void emk_pinned_pool_stats(emk_pinned_pool *pl, int64_t *buffers, int64_t *bytes,
                           int64_t *waits, double *wait_s);
void emk_pinned_pool_trim(emk_pinned_pool *pl);     /* gives the free buffers back */
void emk_pinned_pool_close(emk_pinned_pool *pl);

/* The kind's own calls (emi_cuda_api): graphs (graph.c), pinning (pinned.c), the
** libraries' report (real/libs.c). */
int emk_graph_capturing(void *ctx);
em_status emk_graph_begin(emi_device *d);
em_status emk_graph_end(em_state *S, em_cuda_graph **out);
em_status emk_graph_launch(em_state *S, em_cuda_graph *g);
void emk_graph_free(em_state *S, em_cuda_graph *g);
em_status emk_pin_memory(em_state *S, void *ctx, const em_tensor *t, em_tensor **out);
em_status emk_libs_info(char *buf, size_t len);

/* The matmul entry (k_matmul.c), as core/backend.h's emi_backend describes it. */
em_status emk_matmul(emi_device *d, em_tensor *out, const em_tensor *a, const em_tensor *b);

#endif

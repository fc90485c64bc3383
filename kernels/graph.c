/*
** graph.c -- CUDA graphs: a step captured once and launched again as a whole
** (em_cuda_graph_*, ember.h; em.cuda.graph in Lua).
**
** What a graph is. While a device captures, the runtime records the work queued
** on its compute stream instead of running it (runtime.h: capture_begin ..
** capture_end); a launch queues all of it again with one call, so a step of a
** few hundred small ops costs one host call instead of a few hundred launches.
** The recorded work names memory by address, so the graph must own that memory
** for as long as it lives:
**   - every storage made while capturing is noted (keep), and at the end of the
**     capture those still alive get one more reference, held by the graph: their
**     tensors may die in Lua, the memory stays, and each launch rewrites it --
**     the outputs the capture returned are such storages;
**   - a storage that dies while capturing (made before, read by the captured
**     work, e.g. a temporary of the previous step) is not given back: the graph
**     takes it (take_dead) and frees it when the graph is freed;
**   - what existed before and still lives (parameters, static inputs) is the
**     caller's to keep alive, as with PyTorch's graphs.
** A copy from the CPU while capturing is a constant of the graph: the values of
** the capture are kept in pinned memory the graph owns (upload), and every
** launch copies them again -- so a small table of pointers or a scalar tensor
** made from Lua is fine inside a step. What can't be captured fails at once with
** a message naming it, and spoils the capture: reading a value (a copy to the
** host and a wait), copies between devices, host callbacks. The runtime refuses its own share (a sync, an event);
** the backend refuses copies before queuing anything (refuse), since a real
** CUDA capture would record a host callback without complaint.
** Freeing a graph releases the storages it kept: their blocks go back to the
** compute stream's bins, behind any launch still queued on that stream.
*/
#include "cuda.h"
#include <stdio.h>
#include <stdlib.h>

struct em_cuda_graph {
  emk_cuda_device *dev;
  emk_graph *g;                  /* the runtime's recorded work (after end) */
  /* made while capturing (a reference each once the capture ended, unless they
  ** died) / died while capturing (freed with the graph) */
  emi_storage **kept, **dead;
  size_t nkept, ndead, capkept, capdead;
  void **pinned;                 /* the constants' pinned buffers (upload) */
  size_t npinned, cappinned;
  em_status err;                 /* the first refusal while capturing */
  char why[EMK_ERRMSG_SIZE];
};

static int push(emi_storage ***v, size_t *n, size_t *cap, emi_storage *st) {
  if (*n == *cap) {
    size_t c = *cap ? 2 * *cap : 64;
    emi_storage **p = realloc(*v, c * sizeof *p);
    if (!p) return 0;
    *v = p;
    *cap = c;
  }
  (*v)[(*n)++] = st;
  return 1;
}

static int push_ptr(void ***v, size_t *n, size_t *cap, void *p) {
  return push((emi_storage ***)v, n, cap, (emi_storage *)p);
}

static void spoil(em_cuda_graph *G, em_status code, const char *msg) {
  if (G->err) return;
  G->err = code;
  snprintf(G->why, sizeof G->why, "%s", msg);
}

void emk_graph_keep(emk_cuda_device *cd, emi_storage *st) {
  em_cuda_graph *G = cd->capture;
  if (!push(&G->kept, &G->nkept, &G->capkept, st))
    spoil(G, EM_ERR_NOMEM, "out of host memory for the graph's list of tensors");
}

/* At the end of a good capture: the graph's reference on each storage made
** while capturing that still lives (one that died is on the dead list, with
** its count at 0, and is freed from there). */
static void hold_kept(em_cuda_graph *G) {
  size_t n = 0;
  for (size_t i = 0; i < G->nkept; i++) {
    emi_storage *st = G->kept[i];
    if (__atomic_load_n(&st->refcount, __ATOMIC_ACQUIRE) == 0) continue;
    emi_atomic_inc(&st->refcount);
    G->kept[n++] = st;
  }
  G->nkept = n;
}

int emk_graph_take_dead(emk_cuda_device *cd, emi_storage *st) {
  em_cuda_graph *G = cd->capture;
  if (push(&G->dead, &G->ndead, &G->capdead, st)) return 1;
  /* no room to keep it: wait for the stream instead (the capture is spoiled, so
  ** nothing recorded will run), then free it */
  spoil(G, EM_ERR_NOMEM, "out of host memory for the graph's list of tensors");
  return 0;
}

em_status emk_graph_refuse(emi_device *d, const char *op, const char *what) {
  emk_cuda_device *cd = emk_dev(d);
  char msg[EMK_ERRMSG_SIZE];
  snprintf(msg, sizeof msg, "cuda:%d is capturing a CUDA graph: %s can't be captured "
           "(capture only device work; copy inputs in before, read results after)",
           d->index, what);
  spoil(cd->capture, EM_ERR_UNSUPPORTED, msg);
  return emi_error(d->S, EM_ERR_UNSUPPORTED, "%s: %s", op, msg);
}

em_status emk_graph_upload(emi_device *d, void *dst, const void *src, size_t n) {
  emk_cuda_device *cd = emk_dev(d);
  em_cuda_graph *G = cd->capture;
  emk_runtime *rt = cd->cuda->rt;
  void *p = NULL;
  em_status st = rt->ops->host_alloc(rt, n, &p);
  if (!st && !push_ptr(&G->pinned, &G->npinned, &G->cappinned, p)) {
    rt->ops->host_free(rt, p);
    st = EM_ERR_NOMEM;
  }
  if (st) {
    spoil(G, st, "no pinned memory for a constant copied from the CPU");
    return emk_error(d, "copy to device", st);
  }
  memcpy(p, src, n);
  if ((st = rt->ops->memcpy_async(rt, dst, p, n, EMK_HOST_TO_DEVICE, cd->compute)))
    return emk_error(d, "copy to device", st);
  return EM_OK;
}

/* Lets go of everything the graph holds (its work will not run again); held:
** whether hold_kept took the references. */
static void graph_release(em_state *S, em_cuda_graph *G, int held) {
  emk_runtime *rt = G->dev->cuda->rt;
  if (G->g) rt->ops->graph_destroy(rt, G->g);
  for (size_t i = 0; held && i < G->nkept; i++) emi_storage_release(G->kept[i]);
  for (size_t i = 0; i < G->ndead; i++) emk_storage_free(&G->dev->base, G->dead[i]);
  /* launches still queued may read the constants: wait for them first */
  if (G->npinned) rt->ops->stream_sync(rt, G->dev->compute);
  for (size_t i = 0; i < G->npinned; i++) rt->ops->host_free(rt, G->pinned[i]);
  free(G->kept);
  free(G->dead);
  free(G->pinned);
  emi_free(S, G, sizeof *G);
}

static em_cuda_graph *capturing(em_state *S) {
  emk_cuda *c = emk_ctx(S);
  for (int i = 0; c && i < c->ndev; i++)
    if (c->dev[i]->capture) return c->dev[i]->capture;
  return NULL;
}

int emk_graph_capturing(void *ctx) {
  em_cuda_graph *G = capturing(((emk_cuda *)ctx)->S);
  return G ? G->dev->index : -1;
}

/* d: a device of the state (core checked the number). */
em_status emk_graph_begin(emi_device *d) {
  em_state *S = d->S;
  em_cuda_graph *busy = capturing(S);
  if (busy)
    return emi_error(S, EM_ERR_ARG, "cuda.graph: cuda:%d is capturing already (one capture "
                     "at a time)", busy->dev->index);
  emk_cuda_device *cd = emk_dev(d);
  emk_runtime *rt = cd->cuda->rt;
  em_cuda_graph *G = emi_malloc(S, sizeof *G);
  if (!G) return emi_error(S, EM_ERR_NOMEM, "cuda.graph: out of memory");
  memset(G, 0, sizeof *G);
  G->dev = cd;
  em_status st = rt->ops->capture_begin(rt, cd->compute);
  if (st) {
    emi_free(S, G, sizeof *G);
    return emk_error(&cd->base, "cuda.graph", st);
  }
  cd->capture = G;
  return EM_OK;
}

em_status emk_graph_end(em_state *S, em_cuda_graph **out) {
  *out = NULL;
  em_cuda_graph *G = capturing(S);
  if (!G) return emi_error(S, EM_ERR_ARG, "cuda.graph: nothing is being captured");
  emk_cuda_device *cd = G->dev;
  emk_runtime *rt = cd->cuda->rt;
  em_status st = rt->ops->capture_end(rt, cd->compute, &G->g);
  cd->capture = NULL;
  if (G->err || st) {
    char why[EMK_ERRMSG_SIZE];
    snprintf(why, sizeof why, "%s", G->err ? G->why : rt->errmsg);
    if (!G->err) G->err = st;
    st = G->err;
    graph_release(S, G, 0);
    return emi_error(S, st, "cuda.graph: the capture failed: %s", why);
  }
  hold_kept(G);
  *out = G;
  return EM_OK;
}

em_status emk_graph_launch(em_state *S, em_cuda_graph *G) {
  if (!G) return emi_error(S, EM_ERR_ARG, "cuda.graph: no graph (NULL)");
  emk_cuda_device *cd = G->dev;
  if (cd->capture)
    return emi_error(S, EM_ERR_ARG, "cuda.graph: cuda:%d is capturing: a graph can't be "
                     "launched inside a capture", cd->index);
  emk_runtime *rt = cd->cuda->rt;
  em_status st = rt->ops->graph_launch(rt, G->g, cd->compute);
  return st ? emk_error(&cd->base, "cuda.graph", st) : EM_OK;
}

void emk_graph_free(em_state *S, em_cuda_graph *G) {
  if (G) graph_release(S, G, 1);
}

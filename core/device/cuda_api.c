/*
** cuda_api.c -- ember.h's em_cuda_* calls. They belong to core, so a host links
** them whether or not the CUDA backend's library is there; each finds the kind
** through the registry and forwards to its services table or its own calls
** (emi_cuda_api). Without the library or a device, each says why, as the
** registry put it. State-wide settings (TF32, the reclaim hook, the memory
** pressure flag) are the state's own and need no device.
**
** None of them opens a device the state has not used (registry.c): a device
** never opened has no work to wait for and no cache to empty, and its facts
** (properties, memory counts) come without a CUDA context.
*/
#include "internal.h"
#include <stdio.h>

static const emi_cuda_api *api_of(const emi_backend_kind *k) {
  return (const emi_cuda_api *)k->api;
}

int em_cuda_device_count(em_state *S) {
  int n = emi_accel_count(S);
  if (n == 0) emi_error(S, EM_ERR_DEVICE, "%s", emi_accel_why(S));
  return n;
}

int em_cuda_emulated(em_state *S) {
  void *ctx;
  const emi_backend_kind *k = emi_accel(S, &ctx);
  return k ? api_of(k)->emulated(ctx) : 0;
}

int *em_memory_pressure_flag(em_state *S) { return &S->memory_pressure; }
void em_cuda_set_allow_tf32(em_state *S, int allow) { S->allow_tf32 = allow != 0; }
int em_cuda_allow_tf32(em_state *S) { return S->allow_tf32; }
int emi_allow_tf32(em_state *S) { return S->allow_tf32; }

void em_cuda_set_reclaim_hook(em_state *S, void (*fn)(void *, int, size_t), void *ud) {
  S->reclaim_hook = fn;
  S->reclaim_ud = ud;
}

void emi_memory_pressure(em_state *S, int device, size_t nbytes, int oom) {
  __atomic_store_n(&S->memory_pressure, 1, __ATOMIC_RELAXED);
  if (oom && S->reclaim_hook) S->reclaim_hook(S->reclaim_ud, device, nbytes);
}

void emi_alloc_failed(em_state *S, const char *why) {
  snprintf(S->alloc_why, sizeof S->alloc_why, "%.250s", why);
}

/* The devices [*lo, *hi) a call names (-1: all), and their kind. */
static em_status device_range(em_state *S, const char *op, int device, int one, int *lo,
                              int *hi, const emi_backend_kind **k) {
  *k = NULL;
  int n = emi_accel_count(S);
  if (n == 0) return emi_error(S, EM_ERR_DEVICE, "%s: %s", op, emi_accel_why(S));
  if (device < -1 || device >= n)
    return emi_error(S, EM_ERR_DEVICE, "%s: no device cuda:%d (this state has %d)", op,
                     device, n);
  if (one && device < 0) return emi_error(S, EM_ERR_ARG, "%s: name one device", op);
  void *ctx;
  *k = emi_accel(S, &ctx);
  *lo = device < 0 ? 0 : device;
  *hi = device < 0 ? n : device + 1;
  return EM_OK;
}

static em_status svc_error(em_state *S, const char *op, emi_device *d, em_status st) {
  void *ctx;
  const emi_backend_kind *k = emi_accel(S, &ctx);
  return emi_error(S, st, "%s: cuda:%d: %s", op, d->index, k->svc->errmsg(d));
}

em_status em_cuda_synchronize(em_state *S, int device) {
  int lo, hi;
  const emi_backend_kind *k;
  em_status st = device_range(S, "cuda.synchronize", device, 0, &lo, &hi, &k);
  for (int i = lo; !st && i < hi; i++)
    if (S->devices[i] && (st = k->svc->synchronize(S->devices[i])))
      st = svc_error(S, "cuda.synchronize", S->devices[i], st);
  return st;
}

em_status em_cuda_memory_stats(em_state *S, int device, em_cuda_memory *out) {
  int lo, hi;
  const emi_backend_kind *k;
  em_status st = device_range(S, "cuda.memory_stats", device, 1, &lo, &hi, &k);
  if (st) return st;
  if ((st = k->svc->memory_stats(emi_accel_peek(S, device), out)))
    return emi_error(S, st, "cuda.memory_stats: cuda:%d: no statistics", device);
  return EM_OK;
}

em_status em_cuda_device_props(em_state *S, int device, em_cuda_props *out) {
  int lo, hi;
  const emi_backend_kind *k;
  em_status st = device_range(S, "cuda.get_device_properties", device, 1, &lo, &hi, &k);
  if (st) return st;
  emi_device *d = emi_accel_peek(S, device);
  if ((st = k->svc->props(d, out))) return svc_error(S, "cuda.get_device_properties", d, st);
  return EM_OK;
}

em_status em_cuda_empty_cache(em_state *S, int device) {
  int lo, hi;
  const emi_backend_kind *k;
  em_status st = device_range(S, "cuda.empty_cache", device, 0, &lo, &hi, &k);
  for (int i = lo; !st && i < hi; i++)
    if (S->devices[i]) st = k->svc->empty_cache(S->devices[i]);
  return st;
}

/* -- Graphs -------------------------------------------------------------------------- */

int em_cuda_capturing(em_state *S) {
  if (!S->kinds[0].ctx) return -1;
  void *ctx;
  const emi_backend_kind *k = emi_accel(S, &ctx);
  return api_of(k)->capturing(ctx);
}

em_status em_cuda_graph_begin(em_state *S, int device) {
  int lo, hi;
  const emi_backend_kind *k;
  em_status st = device_range(S, "cuda.graph", device, 1, &lo, &hi, &k);
  if (st) return st;
  emi_device *d = emi_device_of(S, device);       /* capturing needs its streams */
  if (!d) return emi_error(S, EM_ERR_DEVICE, "cuda.graph: %s", emi_accel_why(S));
  return api_of(k)->graph_begin(d);
}

em_status em_cuda_graph_end(em_state *S, em_cuda_graph **out) {
  *out = NULL;
  void *ctx;
  const emi_backend_kind *k = S->kinds[0].ctx ? emi_accel(S, &ctx) : NULL;
  if (!k) return emi_error(S, EM_ERR_ARG, "cuda.graph: nothing is being captured");
  return api_of(k)->graph_end(S, out);
}

em_status em_cuda_graph_launch(em_state *S, em_cuda_graph *G) {
  void *ctx;
  const emi_backend_kind *k = G && S->kinds[0].ctx ? emi_accel(S, &ctx) : NULL;
  if (!k) return emi_error(S, EM_ERR_ARG, "cuda.graph: no graph (NULL)");
  return api_of(k)->graph_launch(S, G);
}

void em_cuda_graph_free(em_state *S, em_cuda_graph *G) {
  const emi_backend_kind *k = emi_accel_loaded();
  if (G && k) api_of(k)->graph_free(S, G);
}

/* -- Pinned tensors ------------------------------------------------------------------ */

int em_tensor_is_pinned(const em_tensor *t) {
  const emi_backend_kind *k = t ? emi_accel_loaded() : NULL;
  return k ? k->svc->is_pinned(t) : 0;
}

em_status em_tensor_pin_memory(em_state *S, const em_tensor *t, em_tensor **out) {
  *out = NULL;
  em_status st = emi_check_tensor(S, "pin_memory", t);
  if (st) return st;
  if (t->device != EM_CPU) {
    char b[32];
    return emi_error(S, EM_ERR_DEVICE, "pin_memory: the tensor is on %s; only CPU "
                     "tensors can be pinned", emi_device_name(b, t->device));
  }
  void *ctx;
  const emi_backend_kind *k = emi_accel(S, &ctx);
  if (!k) return emi_error(S, EM_ERR_DEVICE, "pin_memory: %s", emi_accel_why(S));
  /* Pinned memory needs a CUDA context: the current device's, the one the state
  ** works on, rather than cuda:0's (CUDA's choice on a thread that chose none). */
  if (!emi_device_of(S, S->current_device))
    return emi_error(S, EM_ERR_DEVICE, "pin_memory: %s", emi_accel_why(S));
  return api_of(k)->pin_memory(S, ctx, t, out);
}

em_status em_cuda_libs_info(char *buf, size_t len) {
  if (!buf || !len) return EM_ERR_ARG;
  char why[256];
  const emi_backend_kind *k = emi_accel_library(why, sizeof why);
  if (!k) {
    snprintf(buf, len, "%s\n", why);
    return EM_OK;
  }
  return api_of(k)->libs_info(buf, len);
}

/*
** cuda.c -- opening a state's CUDA devices on first use, closing them with the
** state, and the em_cuda_* calls of ember.h.
**
** Which runtime. EMBER_CUDA_EMULATE=N[:MB] opens the emulated runtime
** (kernels/emu/): N devices whose memory, streams and kernels are the backend's
** own code running on the CPU. Without it, the real runtime (kernels/real/: the
** CUDA runtime and cuBLASLt, loaded with dlopen) finds the GPUs; on a machine
** without a driver or a GPU there are no CUDA devices, and the reason says so.
** The devices are looked for once per state, at the first use of a device
** number >= 0 (emi_device_of's slow path), so a CPU-only script pays nothing.
*/
#include "cuda.h"
#include "emu/grid.h"
#include <stdio.h>
#include <stdlib.h>

static void close_all(em_state *S, emk_cuda *c) {
  for (int i = 0; i < c->ndev; i++) {
    emk_cuda_device *d = c->dev[i];
    if (!d) continue;
    if (d->comm) c->rt->ops->stream_destroy(c->rt, d->comm);
    if (d->copy) c->rt->ops->stream_destroy(c->rt, d->copy);
    if (d->compute) c->rt->ops->stream_destroy(c->rt, d->compute);
    S->devices[i] = NULL;
    emi_free(S, d, sizeof *d);
  }
  if (c->alloc) emk_alloc_close(c->alloc);
  if (c->rt) emk_pinned_collect(c);
  pthread_mutex_destroy(&c->pinned_mu);
  if (c->rt) c->rt->ops->close(c->rt);
  emi_free(S, c, sizeof *c);
}

/* Device memory running short: the host is asked to release what it no longer
** reaches. The flag is for Lua (which can't be entered from inside an op: its
** layer collects at the next tensor it makes, see em_memory_pressure_flag); an
** embedder's reclaim hook runs now, and the allocator then retries. */
static void oom_hook(void *ud, int dev, size_t n) {
  em_state *S = ud;
  __atomic_store_n(&S->memory_pressure, 1, __ATOMIC_RELAXED);
  if (S->reclaim_hook) S->reclaim_hook(S->reclaim_ud, dev, n);
}

static void pressure_hook(void *ud, int dev, size_t allocated, size_t capacity) {
  (void)dev; (void)allocated; (void)capacity;
  em_state *S = ud;
  __atomic_store_n(&S->memory_pressure, 1, __ATOMIC_RELAXED);
}

/* The runtime: emulated when EMBER_CUDA_EMULATE asks, else the real one. */
static em_status open_runtime(emk_runtime **rt, int *emulated, char *why, size_t whylen) {
  const char *spec = getenv("EMBER_CUDA_EMULATE");
  char err[EMK_ERRMSG_SIZE];
  em_status st;
  *emulated = spec && *spec;
  if (!*emulated) {
    if ((st = emk_real_open(rt, err, sizeof err)))
      snprintf(why, whylen, "no CUDA device: %.180s (set EMBER_CUDA_EMULATE=N[:MB] for N "
               "emulated devices)", err);
    return st;
  }
  emk_emu_config cfg;
  if ((st = emk_emu_parse(spec, &cfg, err, sizeof err))) {
    snprintf(why, whylen, "EMBER_CUDA_EMULATE: %.200s", err);
    return st;
  }
  if ((st = emk_emu_open(&cfg, rt, err, sizeof err)))
    snprintf(why, whylen, "emulated CUDA runtime: %.200s", err);
  return st;
}

static em_status open_devices(em_state *S, char *why, size_t whylen) {
  emk_runtime *rt = NULL;
  int emulated = 0;
  char err[EMK_ERRMSG_SIZE];
  em_status st = open_runtime(&rt, &emulated, why, whylen);
  if (st) return st;
  emk_cuda *c = emi_malloc(S, sizeof *c);
  if (!c) {
    rt->ops->close(rt);
    snprintf(why, whylen, "out of memory opening the CUDA devices");
    return EM_ERR_NOMEM;
  }
  memset(c, 0, sizeof *c);
  pthread_mutex_init(&c->pinned_mu, NULL);
  c->rt = rt;
  c->emulated = emulated;
  emk_alloc_config acfg = {.host_alloc = S->alloc, .host_ud = S->alloc_ud,
                           .oom_hook = oom_hook, .pressure_hook = pressure_hook,
                           .hook_ud = S};
  if ((st = emk_alloc_new(c->rt, &acfg, &c->alloc, err, sizeof err))) {
    snprintf(why, whylen, "CUDA allocator: %.200s", err);
    close_all(S, c);
    return st;
  }
  c->ndev = c->rt->ops->device_count(c->rt);
  for (int i = 0; i < c->ndev && i < EMI_MAX_DEVICES; i++) {
    emk_cuda_device *d = emi_malloc(S, sizeof *d);
    if (!d) { st = EM_ERR_NOMEM; snprintf(why, whylen, "out of memory"); break; }
    memset(d, 0, sizeof *d);
    d->base = (emi_device){S, i, &emk_cuda_backend, d};
    d->cuda = c;
    d->index = i;
    c->dev[i] = d;
    if ((st = c->rt->ops->stream_create(c->rt, i, &d->compute)) ||
        (st = c->rt->ops->stream_create(c->rt, i, &d->copy))) {
      snprintf(why, whylen, "cuda:%d: %.200s", i, c->rt->errmsg);
      break;
    }
  }
  if (st) { close_all(S, c); return st; }
  for (int i = 0; i < c->ndev && i < EMI_MAX_DEVICES; i++) S->devices[i] = &c->dev[i]->base;
  S->cuda = c;
  return EM_OK;
}

emi_device *emi_device_attach(em_state *S, int device) {
  if (!S->cuda_tried) {
    S->cuda_tried = 1;
    open_devices(S, S->cuda_why, sizeof S->cuda_why);
  }
  return device >= 0 && device < EMI_MAX_DEVICES ? S->devices[device] : NULL;
}

void emi_cuda_detach(em_state *S) {
  if (S->cuda) close_all(S, S->cuda);
  S->cuda = NULL;
}

em_status emk_error(emi_device *d, const char *op, em_status st) {
  emk_cuda *c = emk_dev(d)->cuda;
  return emi_error(d->S, st, "%s: cuda:%d: %s", op, d->index, c->rt->errmsg);
}

/* -- ember.h ------------------------------------------------------------------------ */

int em_cuda_device_count(em_state *S) {
  emi_device_attach(S, 0);
  if (!S->cuda) { emi_error(S, EM_ERR_DEVICE, "%s", S->cuda_why); return 0; }
  return S->cuda->ndev;
}

int *em_memory_pressure_flag(em_state *S) { return &S->memory_pressure; }

void em_cuda_set_allow_tf32(em_state *S, int allow) { S->allow_tf32 = allow != 0; }
int em_cuda_allow_tf32(em_state *S) { return S->allow_tf32; }

void em_cuda_set_reclaim_hook(em_state *S, void (*fn)(void *, int, size_t), void *ud) {
  S->reclaim_hook = fn;
  S->reclaim_ud = ud;
}

int em_cuda_emulated(em_state *S) {
  emi_device_attach(S, 0);
  return S->cuda ? S->cuda->emulated : 0;
}

static em_status device_arg(em_state *S, const char *op, int device, int *lo, int *hi) {
  int n = em_cuda_device_count(S);
  if (n == 0) return emi_error(S, EM_ERR_DEVICE, "%s: %s", op, S->cuda_why);
  if (device < -1 || device >= n)
    return emi_error(S, EM_ERR_DEVICE, "%s: no device cuda:%d (this state has %d)", op,
                     device, n);
  *lo = device < 0 ? 0 : device;
  *hi = device < 0 ? n : device + 1;
  return EM_OK;
}

em_status em_cuda_synchronize(em_state *S, int device) {
  int lo = 0, hi = 0;
  em_status st = device_arg(S, "cuda.synchronize", device, &lo, &hi);
  for (int i = lo; !st && i < hi; i++) {
    emk_cuda_device *d = S->cuda->dev[i];
    if ((st = S->cuda->rt->ops->stream_sync(S->cuda->rt, d->copy)) ||
        (st = S->cuda->rt->ops->stream_sync(S->cuda->rt, d->compute)))
      st = emk_error(&d->base, "cuda.synchronize", st);
  }
  if (S->cuda) emk_pinned_collect(S->cuda);
  return st;
}

em_status em_cuda_memory_stats(em_state *S, int device, em_cuda_memory *out) {
  int lo = 0, hi = 0;
  em_status st = device_arg(S, "cuda.memory_stats", device, &lo, &hi);
  if (st) return st;
  if (device < 0) return emi_error(S, EM_ERR_ARG, "cuda.memory_stats: name one device");
  emk_alloc_stats a;
  if ((st = emk_alloc_stats_get(S->cuda->alloc, device, &a)))
    return emi_error(S, st, "cuda.memory_stats: cuda:%d: no statistics", device);
  *out = (em_cuda_memory){(int64_t)a.allocated, (int64_t)a.reserved,
                          (int64_t)a.peak_allocated, (int64_t)a.capacity, a.num_allocs,
                          a.num_frees, a.cache_hits, a.oom_retries};
  return EM_OK;
}

em_status em_cuda_device_props(em_state *S, int device, em_cuda_props *out) {
  int lo = 0, hi = 0;
  em_status st = device_arg(S, "cuda.get_device_properties", device, &lo, &hi);
  if (st) return st;
  if (device < 0)
    return emi_error(S, EM_ERR_ARG, "cuda.get_device_properties: name one device");
  emk_runtime *rt = S->cuda->rt;
  emk_device_props p;
  if ((st = rt->ops->device_props(rt, device, &p)))
    return emi_error(S, st, "cuda.get_device_properties: cuda:%d: %s", device, rt->errmsg);
  memset(out, 0, sizeof *out);
  snprintf(out->name, sizeof out->name, "%s", p.name);
  out->major = p.major;
  out->minor = p.minor;
  out->multiprocessors = p.multiprocessors;
  out->total_memory = (int64_t)p.total_memory;
  out->emulated = p.emulated;
  return EM_OK;
}

em_status em_cuda_empty_cache(em_state *S, int device) {
  int lo = 0, hi = 0;
  em_status st = device_arg(S, "cuda.empty_cache", device, &lo, &hi);
  if (st) return st;
  char err[EMK_ERRMSG_SIZE];
  if ((st = emk_alloc_empty_cache(S->cuda->alloc, device, err, sizeof err)))
    return emi_error(S, st, "cuda.empty_cache: %s", err);
  return EM_OK;
}

/*
** cuda.c -- the CUDA device kind (emk_cuda_kind): opening a state's CUDA devices
** on its first use of one, closing them with the state, and the kind's own
** calls that ember.h's em_cuda_* reach through core/device/cuda_api.c.
**
** Which runtime. EMBER_CUDA_EMULATE=N[:MB] opens the emulated runtime
** (kernels/emu/): N devices whose memory, streams and kernels are the backend's
** own code running on the CPU. Without it, the real runtime (kernels/real/: the
** CUDA runtime and cuBLASLt, loaded with dlopen) finds the GPUs; on a machine
** without a driver or a GPU there are no CUDA devices, and the reason says so.
** The registry opens the kind once per state, at the first use of a device
** number >= 0, so a CPU-only script pays nothing. Opening the kind counts the
** devices and makes the allocator and one host-side record per device; no
** device is touched. Device i opens (emk_device_open: its streams, and with
** them its CUDA context and kernels) at the state's first use of it, through
** the registry (emi_device_attach) or a pinned allocation (the current device),
** so a replica or an mpirun rank that uses cuda:3 makes a context on cuda:3
** alone, and a GPU in EXCLUSIVE_PROCESS mode is asked only by the process that
** uses it. A device never opened needs nothing at close.
*/
#include "cuda.h"
#include "dnn.h"
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
    emi_free(S, d, sizeof *d);
  }
  if (c->alloc) emk_alloc_close(c->alloc);
  if (c->rt) emk_pinned_collect(c);
  pthread_mutex_destroy(&c->pinned_mu);
  pthread_mutex_destroy(&c->open_mu);
  if (c->rt) c->rt->ops->close(c->rt);
  emk_algo_cache_free(c->algos);
  emi_free(S, c, sizeof *c);
}

/* Device memory running short: the host is asked to release what it no longer
** reaches. The flag is for Lua (which can't be entered from inside an op: its
** layer collects at the next tensor it makes, see em_memory_pressure_flag); an
** embedder's reclaim hook runs now, and the allocator then retries. */
static void oom_hook(void *ud, int dev, size_t n) { emi_memory_pressure(ud, dev, n, 1); }

static void pressure_hook(void *ud, int dev, size_t allocated, size_t capacity) {
  (void)allocated; (void)capacity;
  emi_memory_pressure(ud, dev, 0, 0);
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

static em_status open_devices(em_state *S, void **ctx, char *why, size_t whylen) {
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
  pthread_mutex_init(&c->open_mu, NULL);
  c->rt = rt;
  c->emulated = emulated;
  c->algos = emk_algo_cache_new();       /* NULL: convolutions choose every time */
  emk_alloc_config acfg = {.oom_hook = oom_hook, .pressure_hook = pressure_hook,
                           .hook_ud = S};
  emi_host_allocator(S, &acfg.host_alloc, &acfg.host_ud);
  if ((st = emk_alloc_new(c->rt, &acfg, &c->alloc, err, sizeof err))) {
    snprintf(why, whylen, "CUDA allocator: %.200s", err);
    close_all(S, c);
    return st;
  }
  c->ndev = c->rt->ops->device_count(c->rt);
  if (c->ndev > EMI_MAX_DEVICES) c->ndev = EMI_MAX_DEVICES;
  /* host-side records only: the streams come with the device's first use */
  for (int i = 0; i < c->ndev; i++) {
    emk_cuda_device *d = emi_malloc(S, sizeof *d);
    if (!d) { st = EM_ERR_NOMEM; snprintf(why, whylen, "out of memory"); break; }
    memset(d, 0, sizeof *d);
    d->base = (emi_device){S, i, &emk_cuda_backend, d};
    d->cuda = c;
    d->index = i;
    c->dev[i] = d;
  }
  if (st) { close_all(S, c); return st; }
  c->S = S;
  *ctx = c;
  return EM_OK;
}

em_status emk_device_open(emk_cuda *c, int i, char *why, size_t whylen) {
  if (i < 0 || i >= c->ndev) {
    snprintf(why, whylen, "no device cuda:%d (this state has %d)", i, c->ndev);
    return EM_ERR_DEVICE;
  }
  emk_cuda_device *d = c->dev[i];
  if (emk_device_is_open(d)) return EM_OK;
  em_status st = EM_OK;
  pthread_mutex_lock(&c->open_mu);
  if (!d->opened) {
    emk_runtime *rt = c->rt;
    if ((st = rt->ops->stream_create(rt, i, &d->compute)) ||
        (st = rt->ops->stream_create(rt, i, &d->copy))) {
      snprintf(why, whylen, "cuda:%d could not be opened: %.300s", i, rt->errmsg);
      if (d->compute) rt->ops->stream_destroy(rt, d->compute);
      d->compute = NULL;                /* nothing half made: a later use tries again */
    } else {
      __atomic_store_n(&d->opened, 1, __ATOMIC_RELEASE);
    }
  }
  pthread_mutex_unlock(&c->open_mu);
  return st;
}

unsigned emk_cuda_contexts(em_state *S) {
  emk_cuda *c = emk_ctx(S);
  if (!c) return 0;
  return c->emulated ? emk_emu_contexts(c->rt) : emk_real_contexts(c->rt);
}

em_status emk_error(emi_device *d, const char *op, em_status st) {
  emk_cuda *c = emk_dev(d)->cuda;
  return emi_error(d->S, st, "%s: cuda:%d: %s", op, d->index, c->rt->errmsg);
}

/* -- The kind -------------------------------------------------------------------------- */

static void kind_close(em_state *S, void *ctx) { close_all(S, ctx); }
static int kind_count(void *ctx) { return ((emk_cuda *)ctx)->ndev; }
static emi_device *kind_device(void *ctx, int i) { return &((emk_cuda *)ctx)->dev[i]->base; }
static em_status kind_open_device(void *ctx, int i, char *why, size_t whylen) {
  return emk_device_open(ctx, i, why, whylen);
}
static int kind_emulated(void *ctx) { return ((emk_cuda *)ctx)->emulated; }

static const emi_cuda_api cuda_api = {
  .emulated = kind_emulated,
  .capturing = emk_graph_capturing,
  .graph_begin = emk_graph_begin,
  .graph_end = emk_graph_end,
  .graph_launch = emk_graph_launch,
  .graph_free = emk_graph_free,
  .pin_memory = emk_pin_memory,
  .libs_info = emk_libs_info,
};

const emi_backend_kind emk_cuda_kind = {
  .version = EMI_DEVICE_INTERFACE_VERSION,
  .abi = EMI_BACKEND_ABI,
  .name = "cuda",
  .max_devices = EMK_MAX_DEVICES,
  .ops = &emk_cuda_backend,
  .svc = &emk_cuda_services,
  .open = open_devices,
  .close = kind_close,
  .count = kind_count,
  .device = kind_device,
  .open_device = kind_open_device,
  .api = &cuda_api,
};

/* The kind's registration, as the library is loaded (before main when linked). */
__attribute__((constructor)) static void register_cuda(void) { emi_register_kind(&emk_cuda_kind); }

/*
** names.c -- device names and numbers ("cpu", "meta", "cuda:1"), both ways, and
** each device's memory statistics (em_device_memory).
*/
#include "internal.h"
#include <stdio.h>
#include <stdlib.h>

const char *emi_device_name(char *buf, int device) {
  if (device == EM_CPU) strcpy(buf, "cpu");
  else if (device == EM_META) strcpy(buf, "meta");
  else sprintf(buf, "cuda:%d", device);
  return buf;
}

const char *em_device_str(int device, char *buf, size_t len) {
  char b[32];
  if (buf && len) snprintf(buf, len, "%s", emi_device_name(b, device));
  return buf;
}

em_status em_device_parse(em_state *S, const char *name, int *device) {
  if (!name || !device) return emi_error(S, EM_ERR_ARG, "device: expected a device name");
  if (!strcmp(name, "cpu")) { *device = EM_CPU; return EM_OK; }
  if (!strcmp(name, "meta")) { *device = EM_META; return EM_OK; }
  if (!strcmp(name, "cuda")) { *device = S ? S->current_device : 0; return EM_OK; }
  if (!strncmp(name, "cuda:", 5) && name[5] >= '0' && name[5] <= '9') {
    char *end;
    long i = strtol(name + 5, &end, 10);
    if (!*end && i < EMI_MAX_DEVICES) { *device = (int)i; return EM_OK; }
  }
  return emi_error(S, EM_ERR_DEVICE, "device: unknown device '%.64s' (expected cpu, meta, "
                   "cuda or cuda:N with N < %d)", name, EMI_MAX_DEVICES);
}

/* "cuda" alone names the state's current device, as torch.cuda.set_device makes
** "cuda" a process's own GPU: a replica given cuda:2 then writes 'cuda' and means
** it. The device need not exist yet (its first use says so). */
em_status em_cuda_set_device(em_state *S, int device) {
  if (device < 0 || device >= EMI_MAX_DEVICES)
    return emi_error(S, EM_ERR_DEVICE, "cuda.set_device: device %d is not a CUDA device "
                     "number (0 to %d)", device, EMI_MAX_DEVICES - 1);
  S->current_device = device;
  return EM_OK;
}

int em_cuda_current_device(em_state *S) { return S->current_device; }

/* -- Memory statistics ---------------------------------------------------------------- */

static emi_mem_count *own_count(em_state *S, int device) {
  return device == EM_CPU ? &S->cpu_mem : device == EM_META ? &S->meta_mem : NULL;
}

/* An accelerator device and its services, or an error naming the call. Memory
** counts need no CUDA context: the device is not opened for them. */
static em_status accel_device(em_state *S, const char *op, int device, emi_device **d,
                              const emi_services **svc) {
  *d = device >= 0 ? emi_accel_peek(S, device) : NULL;
  *svc = *d ? emi_services_of(S, device) : NULL;
  if (*svc) return EM_OK;
  char b[32];
  if (device < EM_META)
    return emi_error(S, EM_ERR_DEVICE, "%s: invalid device %d", op, device);
  return emi_error(S, EM_ERR_DEVICE, "%s: device %s is not available: %s", op,
                   emi_device_name(b, device), emi_accel_why(S));
}

em_status em_device_memory(em_state *S, int device, em_device_memory_stats *out) {
  emi_mem_count *c = own_count(S, device);
  if (c) {
    out->allocated = __atomic_load_n(&c->allocated, __ATOMIC_RELAXED);
    out->peak = __atomic_load_n(&c->peak, __ATOMIC_RELAXED);
    out->reserved = out->allocated + (device == EM_CPU ? em_memory_cached(S) : 0);
    out->capacity = device == EM_CPU ? __atomic_load_n(&S->cpu_limit, __ATOMIC_RELAXED) : 0;
    return EM_OK;
  }
  emi_device *d;
  const emi_services *svc;
  em_status st = accel_device(S, "memory_stats", device, &d, &svc);
  if (st) return st;
  em_cuda_memory m;
  if ((st = svc->memory_stats(d, &m)))
    return emi_error(S, st, "memory_stats: cuda:%d: no statistics", device);
  *out = (em_device_memory_stats){m.allocated, m.peak_allocated, m.reserved, m.capacity};
  return EM_OK;
}

em_status em_device_reset_peak(em_state *S, int device) {
  emi_mem_count *c = own_count(S, device);
  if (c) {
    __atomic_store_n(&c->peak, __atomic_load_n(&c->allocated, __ATOMIC_RELAXED),
                     __ATOMIC_RELAXED);
    return EM_OK;
  }
  emi_device *d;
  const emi_services *svc;
  em_status st = accel_device(S, "reset_peak_memory_stats", device, &d, &svc);
  if (st) return st;
  svc->reset_peak(d);
  return EM_OK;
}

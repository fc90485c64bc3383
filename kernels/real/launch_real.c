/*
** launch_real.c -- kernel launches on the real runtime (runtime.h's launch).
**
** Where the device code comes from. The library is built by gcc, so a kernel's
** descriptor (device.h's host branch) has a name, "k_scale", and no device
** function. nvcc compiled the same sources into fatbins, which the build embeds
** in libember_cuda (fatbins.h); there the kernel is the C-linkage symbol
** "k_scale_emk_dev" (device.h's nvcc branch). When a device opens (its first
** stream), every embedded fatbin is loaded with cudaLibraryLoadData, once per
** runtime, and every kernel of them is listed by name (cudaLibraryEnumerateKernels,
** cudaFuncGetName) into a sorted table. A cudaLibrary_t is context-independent:
** with CUDA's lazy loading (the default) a kernel's code reaches a device's
** context when it first runs there -- possibly inside a stream capture, or in the
** middle of a timed step. So the opening device also asks each kernel for its
** attributes (cudaFuncGetAttributes), which loads them all into its context there
** and then. A descriptor's kernel is then found by name in the table, without
** the failed cudaLibraryGetKernel calls a module-by-module search makes (which
** compute-sanitizer reports, one per miss); runtimes too old to enumerate fall
** back to that search. The cudaKernel_t found is context-independent, so the
** lookup is made once per descriptor (not per device) and kept in a small hash
** table on the descriptor's address, under the runtime's mutex; a launch after
** the first costs one table probe.
**
** Checks before a launch, each with a message naming the kernel: the block
** (<= 1024 threads, 1024 x 1024 x 64), the grid (2^31-1 x 65535 x 65535), dynamic
** shared memory (<= 48 KiB, what every device gives without opting in), and the
** argument struct's size against the size of the kernel's parameter as the
** device code declares it (cudaFuncGetParamInfo), which catches a host struct
** that differs from the device's. The launch itself copies the argument struct
** (the kernel takes it by value), so args may live on the caller's stack.
*/
#include "real.h"
#include "fatbins.h"
#define EMK_DEVICE_LIMITS_ONLY
#include "../device.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { MAX_PARAM_BYTES = 32764 };   /* kernel parameters: CUDA 12.1+, sm_70+ */

/* -- Modules --------------------------------------------------------------------------- */

/* Loads every embedded fatbin; under R->mu. */
static void load_modules_locked(emr *R) {
  if (emk_fatbin_count == 0) {
    snprintf(R->mods_why, sizeof R->mods_why, "ember was built without nvcc: no device code "
             "(rebuild where nvcc is found; see the Makefile)");
    R->mods_state = -1;
    return;
  }
  R->mods = calloc(emk_fatbin_count, sizeof *R->mods);
  if (!R->mods) {
    snprintf(R->mods_why, sizeof R->mods_why, "out of host memory for the module table");
    R->mods_state = -1;
    return;
  }
  for (size_t i = 0; i < emk_fatbin_count; i++) {
    const emk_fatbin *fb = &emk_fatbins[i];
    cudaError_t e = R->f->cudaLibraryLoadData(&R->mods[i], fb->data, NULL, NULL, 0, NULL, NULL, 0);
    if (e != cudaSuccess) {
      (void)R->f->cudaGetLastError();
      snprintf(R->mods_why, sizeof R->mods_why, "loading the device code of %s (%llu bytes): "
               "cudaLibraryLoadData: %s: %s", fb->name, (unsigned long long)fb->size,
               R->f->cudaGetErrorName(e), R->f->cudaGetErrorString(e));
      for (size_t j = 0; j < i; j++) R->f->cudaLibraryUnload(R->mods[j]);
      free(R->mods);
      R->mods = NULL;
      R->mods_state = -1;
      return;
    }
  }
  R->nmods = emk_fatbin_count;
  R->mods_state = 1;
}

/* -- Kernels by name ----------------------------------------------------------------------- */

struct emr_kname {
  const char *name;         /* CUDA's string, alive while the module is loaded */
  cudaKernel_t fn;
};

static int kname_cmp(const void *a, const void *b) {
  return strcmp(((const struct emr_kname *)a)->name, ((const struct emr_kname *)b)->name);
}

/* Lists every kernel of the loaded modules into R->knames; under R->mu. Leaves the
** table NULL (the module-by-module search) when the runtime can't enumerate. */
static void list_kernels_locked(emr *R) {
  const emk_cudart_fns *f = R->f;
  if (!f->cudaLibraryGetKernelCount || !f->cudaLibraryEnumerateKernels || !f->cudaFuncGetName)
    return;
  size_t total = 0;
  unsigned int *counts = calloc(R->nmods ? R->nmods : 1, sizeof *counts);
  if (!counts) return;
  for (size_t i = 0; i < R->nmods; i++) {
    if (f->cudaLibraryGetKernelCount(&counts[i], R->mods[i]) != cudaSuccess) {
      (void)f->cudaGetLastError();
      free(counts);
      return;
    }
    total += counts[i];
  }
  struct emr_kname *v = calloc(total ? total : 1, sizeof *v);
  cudaKernel_t *ks = calloc(total ? total : 1, sizeof *ks);
  size_t n = 0;
  int ok = v && ks;
  for (size_t i = 0; ok && i < R->nmods; i++) {
    if (!counts[i]) continue;
    if (f->cudaLibraryEnumerateKernels(ks, counts[i], R->mods[i]) != cudaSuccess) { ok = 0; break; }
    for (unsigned j = 0; j < counts[i]; j++) {
      const char *name = NULL;
      if (f->cudaFuncGetName(&name, (const void *)ks[j]) != cudaSuccess || !name) { ok = 0; break; }
      v[n].name = name;
      v[n].fn = ks[j];
      n++;
    }
  }
  free(ks);
  free(counts);
  if (!ok) {
    (void)f->cudaGetLastError();
    free(v);
    return;
  }
  qsort(v, n, sizeof *v, kname_cmp);
  R->knames = v;
  R->nknames = n;
}

void emr_kernels_load_on(emr *R, int dev) {
  pthread_mutex_lock(&R->mu);
  if (R->mods_state == 0) {
    load_modules_locked(R);
    if (R->mods_state > 0) list_kernels_locked(R);
  }
  if (R->mods_state > 0 && !R->kernels_on[dev] && R->f->cudaFuncGetAttributes) {
    /* The device is current (stream_create set it). A kernel that can't load here
    ** (no code for this architecture, say) fails again at its launch, which names it. */
    for (size_t i = 0; i < R->nknames; i++) {
      struct cudaFuncAttributes a;
      if (R->f->cudaFuncGetAttributes(&a, (const void *)R->knames[i].fn) != cudaSuccess)
        (void)R->f->cudaGetLastError();
    }
    R->kernels_on[dev] = 1;
  }
  pthread_mutex_unlock(&R->mu);
}

void emr_kernels_close(emr *R) {
  free(R->knames);          /* the names are CUDA's: gone with the modules */
  for (size_t i = 0; i < R->nmods; i++) R->f->cudaLibraryUnload(R->mods[i]);
  free(R->mods);
  free(R->kslots);
  R->mods = NULL;
  R->kslots = NULL;
  R->knames = NULL;
  R->nmods = R->kcap = R->klen = R->nknames = 0;
  memset(R->kernels_on, 0, sizeof R->kernels_on);
}

/* -- The descriptor -> kernel table ------------------------------------------------------ */

static size_t slot_of(const emk_kernel *k, size_t cap) {
  uint64_t x = (uint64_t)(uintptr_t)k;
  x ^= x >> 29;
  x *= 0x9E3779B97F4A7C15ull;
  return (size_t)(x >> 32) & (cap - 1);
}

static emr_kslot *probe(emr_kslot *v, size_t cap, const emk_kernel *k) {
  size_t i = slot_of(k, cap);
  while (v[i].k && v[i].k != k) i = (i + 1) & (cap - 1);
  return &v[i];
}

/* Room for one more entry (load factor <= 1/2); 0 when out of memory. */
static int table_reserve(emr *R) {
  if ((R->klen + 1) * 2 <= R->kcap) return 1;
  size_t cap = R->kcap ? R->kcap * 2 : 64;
  emr_kslot *v = calloc(cap, sizeof *v);
  if (!v) return 0;
  for (size_t i = 0; i < R->kcap; i++)
    if (R->kslots[i].k) *probe(v, cap, R->kslots[i].k) = R->kslots[i];
  free(R->kslots);
  R->kslots = v;
  R->kcap = cap;
  return 1;
}

/* The kernel of descriptor k: from the table, or found in the modules now. */
static em_status find_kernel(emr *R, const emk_kernel *k, const char *name, int dev,
                             emr_kslot *out) {
  em_status st = EM_OK;
  pthread_mutex_lock(&R->mu);
  emr_kslot *slot = R->kcap ? probe(R->kslots, R->kcap, k) : NULL;
  if (slot && slot->k) {
    *out = *slot;
    pthread_mutex_unlock(&R->mu);
    return EM_OK;
  }
  if (R->mods_state == 0) {
    load_modules_locked(R);
    if (R->mods_state > 0) list_kernels_locked(R);
  }
  if (R->mods_state < 0) {
    st = emr_fail(R, EM_ERR_UNSUPPORTED, "launch %s: %s", name, R->mods_why);
    goto done;
  }
  char sym[256];
  if ((size_t)snprintf(sym, sizeof sym, "%s_emk_dev", name) >= sizeof sym) {
    st = emr_fail(R, EM_ERR_ARG, "launch: kernel name too long (%.40s...)", name);
    goto done;
  }
  cudaKernel_t fn = NULL;
  size_t found = R->nmods;
  if (R->knames) {
    struct emr_kname key = {sym, NULL};
    const struct emr_kname *hit = bsearch(&key, R->knames, R->nknames, sizeof key, kname_cmp);
    if (hit) fn = hit->fn, found = 0;
  }
  /* Not in the table (a name CUDA spells otherwise?): the module-by-module search. */
  for (size_t i = 0; i < R->nmods && found == R->nmods; i++) {
    cudaError_t e = R->f->cudaLibraryGetKernel(&fn, R->mods[i], sym);
    if (e == cudaSuccess) {
      found = i;
    } else if (e == cudaErrorSymbolNotFound || e == cudaErrorInvalidDeviceFunction ||
               e == cudaErrorSharedObjectSymbolNotFound) {
      (void)R->f->cudaGetLastError();            /* not in this module: go on */
    } else {
      char call[320];
      snprintf(call, sizeof call, "cudaLibraryGetKernel(%s in %s)", sym, emk_fatbins[i].name);
      st = emr_cuda(R, e, "launch", dev, call);
      goto done;
    }
  }
  if (found == R->nmods) {
    st = emr_fail(R, EM_ERR_UNSUPPORTED, "launch %s: no device code: %s is in none of the %zu "
                  "embedded modules (was libember_cuda built before this kernel was added, "
                  "or without its source?)", name, sym, R->nmods);
    goto done;
  }
  emr_kslot ks = {k, fn, 0};
  if (R->f->cudaFuncGetParamInfo) {
    size_t off = 0, size = 0;
    if (R->f->cudaFuncGetParamInfo((const void *)fn, 0, &off, &size) == cudaSuccess)
      ks.param_size = size;
    else
      (void)R->f->cudaGetLastError();
  }
  if (!table_reserve(R)) {
    st = emr_fail(R, EM_ERR_NOMEM, "launch %s: out of host memory for the kernel table", name);
    goto done;
  }
  *probe(R->kslots, R->kcap, k) = ks;
  R->klen++;
  *out = ks;
done:
  pthread_mutex_unlock(&R->mu);
  return st;
}

/* -- Launch -------------------------------------------------------------------------------- */

em_status emr_launch(emk_runtime *rt, const emk_kernel *k, emk_dim3 grid, emk_dim3 block,
                     size_t dyn_shared, emk_stream *s, const void *args, size_t args_size) {
  emr *R = (emr *)rt->impl;
  if (!k || !k->name) return emr_fail(R, EM_ERR_ARG, "launch: no kernel (NULL)");
  const char *name = k->name;
  if (!grid.x || !grid.y || !grid.z || !block.x || !block.y || !block.z)
    return emr_fail(R, EM_ERR_ARG, "launch %s: empty grid or block (%ux%ux%u blocks of "
                    "%ux%ux%u threads)", name, grid.x, grid.y, grid.z, block.x, block.y, block.z);
  uint64_t threads = (uint64_t)block.x * block.y * block.z;
  if (threads > EMK_MAX_BLOCK_THREADS || block.x > 1024 || block.y > 1024 || block.z > 64)
    return emr_fail(R, EM_ERR_ARG, "launch %s: a block of %ux%ux%u = %llu threads; at most %d "
                    "(and 1024x1024x64)", name, block.x, block.y, block.z,
                    (unsigned long long)threads, EMK_MAX_BLOCK_THREADS);
  if (grid.x > 2147483647u || grid.y > 65535 || grid.z > 65535)
    return emr_fail(R, EM_ERR_ARG, "launch %s: a grid of %ux%ux%u blocks; at most "
                    "2147483647x65535x65535", name, grid.x, grid.y, grid.z);
  if (dyn_shared > EMK_SHARED_MAX)
    return emr_fail(R, EM_ERR_ARG, "launch %s: %zu bytes of dynamic shared memory; a block "
                    "has %d", name, dyn_shared, EMK_SHARED_MAX);
  if (!args || !args_size || args_size > MAX_PARAM_BYTES)
    return emr_fail(R, EM_ERR_ARG, "launch %s: argument struct of %zu bytes at %p (1 to %d "
                    "bytes)", name, args_size, args, MAX_PARAM_BYTES);
  em_status st = emr_check_stream(R, s, "launch");
  if (st) return st;
  emr_kslot ks = {NULL, NULL, 0};
  if ((st = find_kernel(R, k, name, s->dev, &ks))) return st;
  if (ks.param_size && ks.param_size != args_size)
    return emr_fail(R, EM_ERR_ARG, "launch %s: the argument struct is %zu bytes here but "
                    "%zu bytes in the device code (the host and nvcc builds disagree on its "
                    "layout)", name, args_size, ks.param_size);
  dim3 g, b;
  g.x = grid.x, g.y = grid.y, g.z = grid.z;
  b.x = block.x, b.y = block.y, b.z = block.z;
  void *argv[1] = {(void *)args};
  cudaError_t e = R->f->cudaLaunchKernel((const void *)ks.fn, g, b, argv, dyn_shared, s->s);
  if (e != cudaSuccess) {
    char call[320];
    snprintf(call, sizeof call, "cudaLaunchKernel(%s, %ux%ux%u blocks of %ux%ux%u threads, "
             "%zu bytes shared)", name, grid.x, grid.y, grid.z, block.x, block.y, block.z,
             dyn_shared);
    return emr_cuda(R, e, "launch", s->dev, call);
  }
  return EM_OK;
}

/*
** memlimit.c -- the cap on a state's CPU tensor memory (em_set_memory_limit):
** setting it, and the out-of-memory message an allocation past it gets.
**
** What counts is what em_device_memory calls allocated: the bytes of the live
** CPU storages. Freed blocks the state keeps for reuse (alloc.c's cache) are not
** in use, so they never count against the cap; with a cap the cache also keeps no
** more than the room under it, so that what the process holds (reserved) stays
** near the cap too. The check itself is in tensor.c, where storages are counted.
** A refusal is EM_ERR_NOMEM and raises the memory pressure flag, as a full GPU
** does: the Lua layer then collects its garbage and tries the op once more.
*/
#include "internal.h"
#include <stdio.h>

em_status em_set_memory_limit(em_state *S, int device, int64_t bytes) {
  char b[32];
  if (device != EM_CPU)
    return emi_error(S, EM_ERR_DEVICE, "set_memory_limit: only the cpu device takes a limit "
                     "(got %s; a CUDA device's limit is its memory)",
                     emi_device_name(b, device));
  if (bytes < 0)
    return emi_error(S, EM_ERR_ARG, "set_memory_limit: the limit must be 0 (none) or a "
                     "number of bytes, got %lld", (long long)bytes);
  __atomic_store_n(&S->cpu_limit, bytes, __ATOMIC_RELAXED);
  /* cached blocks past the new room go back now */
  if (bytes > 0 && em_memory_cached(S) + em_memory_allocated(S) > bytes) emi_cache_release(S);
  return EM_OK;
}

const char *emi_fmt_bytes(char *buf, size_t len, int64_t n) {
  static const char *unit[] = {"KiB", "MiB", "GiB", "TiB"};
  if (n < 1024) {
    snprintf(buf, len, "%lld B", (long long)n);
    return buf;
  }
  double x = (double)n / 1024;
  int u = 0;
  while (x >= 1024 && u < 3) { x /= 1024; u++; }
  snprintf(buf, len, "%.2f %s", x, unit[u]);
  return buf;
}

void emi_cpu_limit_why(em_state *S, size_t nbytes) {
  char b1[32], b2[32], b3[32];
  int64_t used = __atomic_load_n(&S->cpu_mem.allocated, __ATOMIC_RELAXED);
  int64_t limit = __atomic_load_n(&S->cpu_limit, __ATOMIC_RELAXED);
  snprintf(S->alloc_why, sizeof S->alloc_why, "cpu: out of memory allocating %s (%s "
           "allocated by tensors, %s limit, set by --memory-limit, EMBER_MEMORY_LIMIT or "
           "set_memory_limit)", emi_fmt_bytes(b1, sizeof b1, (int64_t)nbytes),
           emi_fmt_bytes(b2, sizeof b2, used), emi_fmt_bytes(b3, sizeof b3, limit));
  __atomic_store_n(&S->memory_pressure, 1, __ATOMIC_RELAXED);
}

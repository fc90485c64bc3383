/*
** alloc.c -- storage blocks for CPU tensors, with a cache of large blocks.
**
** Why a cache: a freed multi-megabyte block goes back to the kernel (glibc
** serves big requests with mmap), and the next tensor of that size must fault
** every page in again. On the VMs we run on that costs ~25 us per 4 KiB page:
** a 16 MB temporary pays ~100 ms before the first add. Training loops allocate
** the same sizes step after step, so freed blocks of 64 KiB and more are kept,
** binned by size class, and handed to the next request of that class.
**
** Size classes: a request is rounded up to a multiple of 1/8 of its power of
** two (at most 12.5% waste), so every block in a class has the same size and a
** class is a plain free list. The cache holds at most cache_limit bytes; a
** request the allocator hook refuses empties the cache and retries once, so
** cached memory never causes an out-of-memory error. Under a cap on the CPU's
** tensor memory (memlimit.c) the cache keeps only the room under the cap:
** tensors plus cached blocks stay near it, as on a device of that size.
**
** Blocks may be freed from any thread (a tensor can outlive its use on the
** thread that made it), so the lists sit behind a mutex; small blocks bypass
** all of this.
*/
#include "internal.h"

enum { CACHE_MIN_SHIFT = 16 };                 /* 64 KiB */
#define CACHE_MIN ((size_t)1 << CACHE_MIN_SHIFT)

typedef struct free_block { struct free_block *next; } free_block;

static int floor_log2(size_t n) { return 63 - __builtin_clzll((unsigned long long)n); }

/* Rounded size and class index of a request of n >= CACHE_MIN bytes. */
static size_t size_class(size_t n, int *cls) {
  int k = floor_log2(n);
  size_t unit = (size_t)1 << (k - 3);
  size_t r = (n + unit - 1) & ~(unit - 1);
  if (floor_log2(r) != k) { k++; unit <<= 1; }   /* rounded up to the next power */
  *cls = (k - CACHE_MIN_SHIFT) * 8 + (int)((r >> (k - 3)) & 7);
  return r;
}

/* Under cache_mu: whether tensors (whose count already holds a new block's bytes, or no longer
** holds a freed one's) plus the cache plus extra bytes pass the cap, if any. */
static bool over_cap(em_state *S, size_t extra) {
  int64_t limit = __atomic_load_n(&S->cpu_limit, __ATOMIC_RELAXED);
  return limit > 0 && __atomic_load_n(&S->cpu_mem.allocated, __ATOMIC_RELAXED) +
                      (int64_t)(S->cache_bytes + extra) > limit;
}

void *emi_block_alloc(em_state *S, size_t n, size_t *actual) {
  *actual = n;
  if (n < CACHE_MIN || S->cache_limit == 0) return emi_malloc(S, n);
  int cls;
  size_t r = size_class(n, &cls);
  *actual = r;
  if (cls < EMI_CACHE_CLASSES) {
    pthread_mutex_lock(&S->cache_mu);
    free_block *b = S->cache[cls];
    if (b) { S->cache[cls] = b->next; S->cache_bytes -= r; }
    pthread_mutex_unlock(&S->cache_mu);
    if (b) return b;
  }
  if (__atomic_load_n(&S->cpu_limit, __ATOMIC_RELAXED) > 0) {   /* make room first */
    pthread_mutex_lock(&S->cache_mu);
    bool over = S->cache_bytes > 0 && over_cap(S, 0);
    pthread_mutex_unlock(&S->cache_mu);
    if (over) emi_cache_release(S);
  }
  void *p = emi_malloc(S, r);
  if (!p && S->cache_bytes > 0) {
    emi_cache_release(S);
    p = emi_malloc(S, r);
  }
  return p;
}

void emi_block_free(em_state *S, void *p, size_t actual) {
  if (!p) return;
  int cls;
  if (actual >= CACHE_MIN && S->cache_limit != 0 &&
      size_class(actual, &cls) == actual && cls < EMI_CACHE_CLASSES) {
    pthread_mutex_lock(&S->cache_mu);
    if (S->cache_bytes + actual <= S->cache_limit && !over_cap(S, actual)) {
      free_block *b = p;
      b->next = S->cache[cls];
      S->cache[cls] = b;
      S->cache_bytes += actual;
      p = NULL;
    }
    pthread_mutex_unlock(&S->cache_mu);
    if (!p) return;
  }
  emi_free(S, p, actual);
}

void emi_cache_release(em_state *S) {
  pthread_mutex_lock(&S->cache_mu);
  for (int c = 0; c < EMI_CACHE_CLASSES; c++) {
    size_t size = ((size_t)8 + (size_t)(c & 7)) << (c / 8 + CACHE_MIN_SHIFT - 3);
    for (free_block *b = S->cache[c], *next; b; b = next) {
      next = b->next;
      emi_free(S, b, size);
    }
    S->cache[c] = NULL;
  }
  S->cache_bytes = 0;
  pthread_mutex_unlock(&S->cache_mu);
}

void em_memory_release_cached(em_state *S) { if (S) emi_cache_release(S); }
/* Under the cache's lock: loader workers free blocks into it while the state's
** thread asks (em.memory_stats in a training step). */
int64_t em_memory_cached(em_state *S) {
  if (!S) return 0;
  pthread_mutex_lock(&S->cache_mu);
  int64_t n = (int64_t)S->cache_bytes;
  pthread_mutex_unlock(&S->cache_mu);
  return n;
}

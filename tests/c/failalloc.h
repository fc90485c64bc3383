/*
** failalloc.h -- the counting, failing allocator of the allocation-failure tests
** (test_failalloc.c, test_autograd.c, test_safetensors.c): an em_config.alloc hook
** that refuses request number fail_at and counts the bytes and blocks it has handed
** out, so that a test can run a sequence once per N = 1, 2, ... and see each
** refusal reported and nothing leaked.
**
**     fa_state f = FA_STATE_INIT;
**     fa_reset(&f, n);                    (refuse the nth request)
**     cfg.alloc = fa_alloc; cfg.alloc_ud = &f;
**     ... em_open(&S, &cfg), the sequence, em_close(S) ...
**     CHECK(f.live_bytes == 0 && f.live_blocks == 0 && f.bad_sizes == 0);
**
** Each block carries its size in a 16-byte header, so that frees can be checked
** against it (the lua_Alloc contract: osize is the size allocated). Worker threads
** free memory too, hence the mutex.
*/
#ifndef EMBER_TEST_FAILALLOC_H
#define EMBER_TEST_FAILALLOC_H

#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>

typedef struct fa_state {
  pthread_mutex_t mu;
  long count;            /* allocation requests so far */
  long fail_at;          /* refuse request number fail_at (0 = never) */
  int injected;          /* the refusal happened */
  int64_t live_bytes;
  long live_blocks;
  long bad_sizes;        /* frees whose osize differed from the allocated size */
} fa_state;

#define FA_STATE_INIT {.mu = PTHREAD_MUTEX_INITIALIZER}

enum { FA_HDR = 16 };

/* Starts a run that refuses request number fail_at (0: none); the mutex stays. */
static inline void fa_reset(fa_state *f, long fail_at) {
  f->count = 0;
  f->fail_at = fail_at;
  f->injected = 0;
  f->live_bytes = 0;
  f->live_blocks = 0;
  f->bad_sizes = 0;
}

static void *fa_alloc(void *ud, void *ptr, size_t osize, size_t nsize) {
  fa_state *f = ud;
  void *res = NULL;
  pthread_mutex_lock(&f->mu);
  char *h = ptr ? (char *)ptr - FA_HDR : NULL;
  size_t old = h ? *(size_t *)h : 0;
  if (h && old != osize) f->bad_sizes++;
  if (nsize == 0) {
    if (h) { f->live_bytes -= (int64_t)old; f->live_blocks--; free(h); }
  } else if (++f->count == f->fail_at) {
    f->injected = 1;                        /* refuse: ptr (if any) stays valid */
  } else {
    char *n = realloc(h, nsize + FA_HDR);
    if (n) {
      *(size_t *)n = nsize;
      f->live_bytes += (int64_t)nsize - (int64_t)old;
      if (!h) f->live_blocks++;
      res = n + FA_HDR;
    }
  }
  pthread_mutex_unlock(&f->mu);
  return res;
}

#endif

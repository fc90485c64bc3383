/*
** blas.c -- OpenBLAS's thread count, which is one for the whole process.
**
** Every state wants BLAS to use its own thread count, but OpenBLAS has a single
** setting: a state that set it before each call would undo what another state in
** the same process (a replica thread) had just set, back and forth. Instead each
** live state registers the count it wants (its workers object holds the entry,
** cpu/workers.c) and OpenBLAS is set to the largest count wanted, under one mutex,
** once each time that changes -- never per call. A host running replicas as
** threads pins the count (em_blas_pin_threads): then nobody changes it.
**
** Serial sections: conv2d splits a batch into shares run by the state's workers,
** each calling single-threaded BLAS side by side; OpenBLAS threads on top would
** oversubscribe the cores. While any such section is open (process-wide count),
** OpenBLAS runs 1 thread; the last one to close restores the registry's count.
** A pinned count wins over both.
*/
#include "cpu.h"
#include <cblas.h>

static pthread_mutex_t blas_mu = PTHREAD_MUTEX_INITIALIZER;
static emi_blas_want *blas_wants;   /* the live states' entries */
static int blas_pinned;             /* em_blas_pin_threads' count, 0 if none */
static int blas_serial;             /* open serial sections */
static int blas_set;                /* what OpenBLAS was last set to by us, 0: never */

/* The count OpenBLAS should have now, 0 when no state wants one. */
static int blas_target(void) {
  if (blas_pinned) return blas_pinned;
  if (blas_serial) return 1;
  int n = 0;
  for (const emi_blas_want *w = blas_wants; w; w = w->next)
    if (w->n > n) n = w->n;
  return n;
}

/* Sets OpenBLAS when the target changed. Called with blas_mu held. */
static void blas_apply(void) {
  int n = blas_target();
  if (n > 0 && n != blas_set) {
    openblas_set_num_threads(n);
    blas_set = n;
  }
}

void emi_blas_register(emi_blas_want *w, int n) {
  pthread_mutex_lock(&blas_mu);
  w->n = n > 0 ? n : 1;
  w->next = blas_wants;
  w->live = 1;
  blas_wants = w;
  blas_apply();
  pthread_mutex_unlock(&blas_mu);
}

void emi_blas_unregister(emi_blas_want *w) {
  pthread_mutex_lock(&blas_mu);
  if (w->live) {
    for (emi_blas_want **p = &blas_wants; *p; p = &(*p)->next)
      if (*p == w) { *p = w->next; break; }
    w->live = 0;
    blas_apply();   /* the count drops once the largest wisher is gone */
  }
  pthread_mutex_unlock(&blas_mu);
}

void emi_blas_serial_begin(void) {
  pthread_mutex_lock(&blas_mu);
  blas_serial++;
  blas_apply();
  pthread_mutex_unlock(&blas_mu);
}

void emi_blas_serial_end(void) {
  pthread_mutex_lock(&blas_mu);
  if (blas_serial > 0) blas_serial--;
  blas_apply();
  pthread_mutex_unlock(&blas_mu);
}

void em_blas_pin_threads(int n) {
  pthread_mutex_lock(&blas_mu);
  blas_pinned = n > 0 ? n : 0;
  blas_apply();
  pthread_mutex_unlock(&blas_mu);
}

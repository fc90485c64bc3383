/*
** workers.c -- the state's worker threads for large CPU ops.
**
** Design: a fixed set of n-1 workers plus the calling thread. A job is a range
** [0, n) cut into one contiguous share per thread (static partition: the same
** element always lands on the same thread for a given thread count, and kernels
** never depend on it for their results). The caller publishes the job under a
** mutex, bumps a generation counter and works on share 0; workers wake on the
** condition variable, run their share, and the last one to finish signals the
** caller. Jobs are small and frequent, so workers spin briefly before sleeping.
** Small ranges (n <= grain) never touch the workers: a 16-element add must not
** pay for a thread wake-up. The workers object also carries the state's wish for
** OpenBLAS's thread count (blas.c), registered for as long as it lives.
*/
#include "cpu.h"
#include <pthread.h>
#include <sched.h>

struct emi_workers {
  em_state *S;
  int nthreads;                 /* including the caller */
  int capacity;                 /* entries allocated in threads[] */
  pthread_t *threads;
  pthread_mutex_t mu;
  pthread_cond_t wake, done;
  uint64_t generation;          /* bumped once per job */
  int remaining;                /* workers still running the current job */
  int stop;
  /* the current job */
  emi_range_fn fn;
  void *ctx;
  int64_t n, chunk;
  emi_blas_want blas;           /* this state's entry in the OpenBLAS registry */
};

/* Set while this thread runs a share: a kernel called from inside one (em.compile's
** tiled chains call kernels per tile) runs its loop inline, never re-entering the
** pool, whose one job slot is taken. */
static _Thread_local int in_share;

static void run_share(emi_workers *w, int i) {
  int64_t b = (int64_t)i * w->chunk, e = b + w->chunk;
  if (e > w->n) e = w->n;
  in_share++;
  if (b < e) w->fn(w->ctx, b, e);
  in_share--;
}

typedef struct worker_arg { emi_workers *w; int index; } worker_arg;

static void *worker_main(void *arg) {
  worker_arg wa = *(worker_arg *)arg;
  emi_workers *w = wa.w;
  emi_free(w->S, arg, sizeof wa);
  uint64_t seen = 0;
  for (;;) {
    /* Spin a little before sleeping: back-to-back ops arrive microseconds apart. */
    for (int spin = 0; spin < 2000; spin++) {
      if (__atomic_load_n(&w->generation, __ATOMIC_ACQUIRE) != seen ||
          __atomic_load_n(&w->stop, __ATOMIC_ACQUIRE))
        break;
      sched_yield();
    }
    pthread_mutex_lock(&w->mu);
    while (w->generation == seen && !w->stop) pthread_cond_wait(&w->wake, &w->mu);
    if (w->stop) { pthread_mutex_unlock(&w->mu); return NULL; }
    seen = w->generation;
    pthread_mutex_unlock(&w->mu);
    run_share(w, wa.index);
    pthread_mutex_lock(&w->mu);
    if (--w->remaining == 0) pthread_cond_signal(&w->done);
    pthread_mutex_unlock(&w->mu);
  }
}

emi_workers *emi_workers_new(em_state *S, int nthreads) {
  emi_workers *w = emi_malloc(S, sizeof *w);
  if (!w) return NULL;
  memset(w, 0, sizeof *w);
  w->S = S;
  w->nthreads = nthreads;
  w->capacity = nthreads;
  w->threads = emi_malloc(S, sizeof(pthread_t) * (size_t)nthreads);
  if (!w->threads) { emi_free(S, w, sizeof *w); return NULL; }
  pthread_mutex_init(&w->mu, NULL);
  pthread_cond_init(&w->wake, NULL);
  pthread_cond_init(&w->done, NULL);
  int started = 0;
  for (int i = 1; i < nthreads; i++) {
    worker_arg *wa = emi_malloc(S, sizeof *wa);
    if (!wa) break;
    wa->w = w;
    wa->index = i;
    if (pthread_create(&w->threads[i], NULL, worker_main, wa) != 0) {
      emi_free(S, wa, sizeof *wa);
      break;
    }
    started++;
  }
  if (started != nthreads - 1) {
    w->nthreads = started + 1;   /* so that emi_workers_free joins exactly these */
    emi_workers_free(w);
    return NULL;
  }
  emi_blas_register(&w->blas, nthreads);
  return w;
}

void emi_workers_free(emi_workers *w) {
  if (!w) return;
  emi_blas_unregister(&w->blas);   /* a no-op when it was never registered */
  pthread_mutex_lock(&w->mu);
  __atomic_store_n(&w->stop, 1, __ATOMIC_RELEASE);   /* spinning workers read it unlocked */
  pthread_cond_broadcast(&w->wake);
  pthread_mutex_unlock(&w->mu);
  for (int i = 1; i < w->nthreads; i++) pthread_join(w->threads[i], NULL);
  pthread_mutex_destroy(&w->mu);
  pthread_cond_destroy(&w->wake);
  pthread_cond_destroy(&w->done);
  em_state *S = w->S;
  emi_free(S, w->threads, sizeof(pthread_t) * (size_t)w->capacity);
  emi_free(S, w, sizeof *w);
}

int emi_workers_size(const emi_workers *w) { return w ? w->nthreads : 1; }

void emi_parallel_for(em_state *S, int64_t n, int64_t grain, emi_range_fn fn, void *ctx) {
  emi_workers *w = S->workers;
  if (n <= 0) return;
  if (grain < 1) grain = 1;
  if (!w || w->nthreads == 1 || n <= grain || in_share) { fn(ctx, 0, n); return; }
  int64_t shares = (n + grain - 1) / grain;
  if (shares > w->nthreads) shares = w->nthreads;
  pthread_mutex_lock(&w->mu);
  w->fn = fn;
  w->ctx = ctx;
  w->n = n;
  w->chunk = (n + shares - 1) / shares;
  w->remaining = w->nthreads - 1;
  __atomic_add_fetch(&w->generation, 1, __ATOMIC_RELEASE);
  pthread_cond_broadcast(&w->wake);
  pthread_mutex_unlock(&w->mu);
  run_share(w, 0);
  pthread_mutex_lock(&w->mu);
  while (w->remaining > 0) pthread_cond_wait(&w->done, &w->mu);
  pthread_mutex_unlock(&w->mu);
}

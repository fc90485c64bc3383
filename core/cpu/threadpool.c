/*
** threadpool.c -- the state's worker threads for large CPU ops.
**
** Design: a fixed set of n-1 workers plus the calling thread. A job is a range
** [0, n) cut into one contiguous share per thread (static partition: the same
** element always lands on the same thread for a given thread count, and kernels
** never depend on it for their results). The caller publishes the job under a
** mutex, bumps a generation counter and works on share 0; workers wake on the
** condition variable, run their share, and the last one to finish signals the
** caller. Jobs are small and frequent, so workers spin briefly before sleeping.
** Small ranges (n <= grain) never touch the pool: a 16-element add must not pay
** for a thread wake-up.
*/
#include "../internal.h"
#include <pthread.h>
#include <sched.h>

struct emi_pool {
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
};

static void run_share(emi_pool *p, int i) {
  int64_t b = (int64_t)i * p->chunk, e = b + p->chunk;
  if (e > p->n) e = p->n;
  if (b < e) p->fn(p->ctx, b, e);
}

typedef struct worker_arg { emi_pool *p; int index; } worker_arg;

static void *worker_main(void *arg) {
  worker_arg wa = *(worker_arg *)arg;
  emi_pool *p = wa.p;
  emi_free(p->S, arg, sizeof wa);
  uint64_t seen = 0;
  for (;;) {
    /* Spin a little before sleeping: back-to-back ops arrive microseconds apart. */
    for (int spin = 0; spin < 2000; spin++) {
      if (__atomic_load_n(&p->generation, __ATOMIC_ACQUIRE) != seen ||
          __atomic_load_n(&p->stop, __ATOMIC_ACQUIRE))
        break;
      sched_yield();
    }
    pthread_mutex_lock(&p->mu);
    while (p->generation == seen && !p->stop) pthread_cond_wait(&p->wake, &p->mu);
    if (p->stop) { pthread_mutex_unlock(&p->mu); return NULL; }
    seen = p->generation;
    pthread_mutex_unlock(&p->mu);
    run_share(p, wa.index);
    pthread_mutex_lock(&p->mu);
    if (--p->remaining == 0) pthread_cond_signal(&p->done);
    pthread_mutex_unlock(&p->mu);
  }
}

emi_pool *emi_pool_new(em_state *S, int nthreads) {
  emi_pool *p = emi_malloc(S, sizeof *p);
  if (!p) return NULL;
  memset(p, 0, sizeof *p);
  p->S = S;
  p->nthreads = nthreads;
  p->capacity = nthreads;
  p->threads = emi_malloc(S, sizeof(pthread_t) * (size_t)nthreads);
  if (!p->threads) { emi_free(S, p, sizeof *p); return NULL; }
  pthread_mutex_init(&p->mu, NULL);
  pthread_cond_init(&p->wake, NULL);
  pthread_cond_init(&p->done, NULL);
  int started = 0;
  for (int i = 1; i < nthreads; i++) {
    worker_arg *wa = emi_malloc(S, sizeof *wa);
    if (!wa) break;
    wa->p = p;
    wa->index = i;
    if (pthread_create(&p->threads[i], NULL, worker_main, wa) != 0) {
      emi_free(S, wa, sizeof *wa);
      break;
    }
    started++;
  }
  if (started != nthreads - 1) {
    p->nthreads = started + 1;   /* so that emi_pool_free joins exactly these */
    emi_pool_free(p);
    return NULL;
  }
  return p;
}

void emi_pool_free(emi_pool *p) {
  if (!p) return;
  pthread_mutex_lock(&p->mu);
  __atomic_store_n(&p->stop, 1, __ATOMIC_RELEASE);   // spinning workers read it unlocked
  pthread_cond_broadcast(&p->wake);
  pthread_mutex_unlock(&p->mu);
  for (int i = 1; i < p->nthreads; i++) pthread_join(p->threads[i], NULL);
  pthread_mutex_destroy(&p->mu);
  pthread_cond_destroy(&p->wake);
  pthread_cond_destroy(&p->done);
  em_state *S = p->S;
  emi_free(S, p->threads, sizeof(pthread_t) * (size_t)p->capacity);
  emi_free(S, p, sizeof *p);
}

int emi_pool_size(const emi_pool *p) { return p ? p->nthreads : 1; }

void emi_parallel_for(em_state *S, int64_t n, int64_t grain, emi_range_fn fn, void *ctx) {
  emi_pool *p = S->pool;
  if (n <= 0) return;
  if (grain < 1) grain = 1;
  if (!p || n <= grain) { fn(ctx, 0, n); return; }
  int64_t shares = (n + grain - 1) / grain;
  if (shares > p->nthreads) shares = p->nthreads;
  pthread_mutex_lock(&p->mu);
  p->fn = fn;
  p->ctx = ctx;
  p->n = n;
  p->chunk = (n + shares - 1) / shares;
  p->remaining = p->nthreads - 1;
  __atomic_add_fetch(&p->generation, 1, __ATOMIC_RELEASE);
  pthread_cond_broadcast(&p->wake);
  pthread_mutex_unlock(&p->mu);
  run_share(p, 0);
  pthread_mutex_lock(&p->mu);
  while (p->remaining > 0) pthread_cond_wait(&p->done, &p->mu);
  pthread_mutex_unlock(&p->mu);
}

/*
** dynfor.h -- a dynamically scheduled parallel loop on top of emi_parallel_for,
** for the reduction and softmax kernels.
**
** emi_parallel_for hands each thread one fixed share. On a busy machine one
** thread often starts late or runs slowly (the other core is taken by another
** process) and the caller then waits for the whole of that share. Here every
** thread instead takes chunks of `grain` tasks from a shared counter until
** none are left, so a late thread just does less. Which thread runs a task
** never matters for the result: every task writes its own output (or its own
** partial, combined later in a fixed order).
*/
#ifndef EMBER_CPU_DYNFOR_H
#define EMBER_CPU_DYNFOR_H
#include "../internal.h"

typedef struct emx_dyn {
  emi_range_fn fn;
  void *ctx;
  int64_t n, grain;
  int64_t next;            /* atomic: first task not yet taken */
} emx_dyn;

static void emx_dyn_worker(void *ctx, int64_t b, int64_t e) {
  emx_dyn *d = ctx;
  (void)b; (void)e;
  for (;;) {
    int64_t t = __atomic_fetch_add(&d->next, d->grain, __ATOMIC_RELAXED);
    if (t >= d->n) return;
    d->fn(d->ctx, t, t + d->grain < d->n ? t + d->grain : d->n);
  }
}

/* fn(ctx, begin, end) over [0, n) in chunks of grain tasks; inline when one
** chunk covers it or the state has one thread. */
static inline void emx_parallel_dynamic(em_state *S, int64_t n, int64_t grain,
                                        emi_range_fn fn, void *ctx) {
  if (n <= 0) return;
  if (grain < 1) grain = 1;
  int nt = S->num_threads;
  if (n <= grain || nt <= 1) { fn(ctx, 0, n); return; }
  emx_dyn d = {fn, ctx, n, grain, 0};
  int64_t chunks = (n + grain - 1) / grain;
  if (chunks < (int64_t)nt) nt = (int)chunks;
  emi_parallel_for(S, nt, 1, emx_dyn_worker, &d);
}

#endif

/*
** reduce.h -- what the reduction-family CPU kernels share (reduce.c,
** reduce_arg.c, softmax.c): the reduction plan, a stepping multi-index, row
** loaders for any dtype, and a dynamically scheduled parallel loop.
*/
#ifndef EMBER_CPU_REDUCE_H
#define EMBER_CPU_REDUCE_H
#include "cpu.h"

enum {
  EMI_CB = 256,             /* columns per OUTER task: a 2 KB accumulator row in L1 */
  EMI_CHUNK = 256,          /* conversion buffer for dtypes without a native kernel */
  EMI_CHUNK_WORK = 32768,   /* elements a thread takes at a time */
  /* Below this much work (in elements of a plain sum) everything stays on the
  ** calling thread: waking the workers costs about 10 us on this kind of VM. */
  EMI_PAR_MIN = 262144,
};

/* -- Plan ----------------------------------------------------------------------
** A reduction is "res[k] = COMB over r of f(a[k, r])" for K outputs of R
** elements each. Kept dims stay in logical order (so the linear index over them
** is the offset into the contiguous `out`), reduced dims are sorted by stride,
** innermost last; size-1 dims are dropped and neighbours merged when their
** strides allow. There is always at least one reduced dim (size 1, stride 0 if
** nothing is reduced). */
typedef struct emi_rplan {
  const char *base;
  em_dtype dt;
  int64_t esz;
  int nk, nr;
  int64_t ksz[EM_MAX_DIMS], kst[EM_MAX_DIMS], kos[EM_MAX_DIMS]; /* a bytes, out elems */
  int64_t rsz[EM_MAX_DIMS], rst[EM_MAX_DIMS];                   /* a bytes */
  int64_t K, R;
  int outer;     /* OUTER shape: kept dim vk is contiguous in a */
  int vk;
} emi_rplan;

void emi_reduce_plan(emi_rplan *pl, const em_tensor *a, unsigned mask);

/* n elements st bytes apart into a double / int64 buffer, from any dtype. */
void emi_load_row_f64(double *buf, const char *p, int64_t n, int64_t st, em_dtype dt);
void emi_load_row_i64(int64_t *buf, const char *p, int64_t n, int64_t st, em_dtype dt);

/* A multi-index over n dims that tracks two offsets (e.g. input bytes and
** output elements) as it steps, so hot loops never divide. */
typedef struct emi_walker {
  int n;
  int64_t sz[EM_MAX_DIMS], idx[EM_MAX_DIMS], st[EM_MAX_DIMS], st2[EM_MAX_DIMS];
  int64_t off, off2;
} emi_walker;

static inline void emi_walk_init(emi_walker *w, int n, const int64_t *sz, const int64_t *st,
                      const int64_t *st2, int64_t lin) {
  w->n = n;
  w->off = w->off2 = 0;
  for (int d = n - 1; d >= 0; d--) {
    w->sz[d] = sz[d];
    w->st[d] = st[d];
    w->st2[d] = st2 ? st2[d] : 0;
    w->idx[d] = lin % sz[d];
    lin /= sz[d];
    w->off += w->idx[d] * w->st[d];
    w->off2 += w->idx[d] * w->st2[d];
  }
}

static inline void emi_walk_next(emi_walker *w) {
  for (int d = w->n - 1; d >= 0; d--) {
    w->off += w->st[d];
    w->off2 += w->st2[d];
    if (++w->idx[d] < w->sz[d]) return;
    w->off -= w->st[d] * w->sz[d];
    w->off2 -= w->st2[d] * w->sz[d];
    w->idx[d] = 0;
  }
}


/* -- Dynamic parallel loop ---------------------------------------------------------
** emi_parallel_for hands each thread one fixed share. On a busy machine one
** thread often starts late or runs slowly (its core is taken by another process)
** and the caller then waits for the whole of that share. Here every thread takes
** chunks of tasks from a shared counter until none are left, so a late thread
** just does less. Which thread runs a task never changes a result: every task
** writes its own outputs, or its own partial that is combined later in a fixed
** order. */
typedef struct emi_dyn {
  emi_range_fn fn;
  void *ctx;
  int64_t n, grain;
  int64_t next;            /* atomic: first task not yet taken */
} emi_dyn;

/* Share b == 0 is the calling thread. The workers make the caller sleep until
** every worker is done, and that wake-up costs several microseconds, so the
** workers leave the last chunk to the caller: it then finishes last and finds
** them done. */
static void emi_dyn_worker(void *ctx, int64_t b, int64_t e) {
  emi_dyn *d = ctx;
  (void)e;
  int64_t stop = b == 0 ? d->n : d->n - d->grain;
  for (;;) {
    int64_t t = __atomic_load_n(&d->next, __ATOMIC_RELAXED);
    do {
      if (t >= stop) return;
    } while (!__atomic_compare_exchange_n(&d->next, &t, t + d->grain, 1, __ATOMIC_RELAXED,
                                          __ATOMIC_RELAXED));
    d->fn(d->ctx, t, t + d->grain < d->n ? t + d->grain : d->n);
  }
}

/* fn(ctx, begin, end) over tasks [0, n), each worth `per` elements of work. */
static inline void emi_parallel_dynamic(em_state *S, int64_t n, int64_t per,
                                        emi_range_fn fn, void *ctx) {
  if (n <= 0) return;
  if (per < 1) per = 1;
  int nt = S->num_threads;
  if (nt <= 1 || n < 2 || (double)n * (double)per < EMI_PAR_MIN) { fn(ctx, 0, n); return; }
  int64_t grain = per >= EMI_CHUNK_WORK ? 1 : EMI_CHUNK_WORK / per;
  emi_dyn d = {fn, ctx, n, grain, 0};
  int64_t chunks = (n + grain - 1) / grain;
  if (chunks < (int64_t)nt) nt = (int)chunks;
  emi_parallel_for(S, nt, 1, emi_dyn_worker, &d);
}

#endif

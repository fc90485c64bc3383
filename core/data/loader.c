/*
** loader.c -- worker threads that compute a dataset's items (usually batches)
** ahead of the consumer, and hand them out in index order.
**
** Design. An epoch is the items 0 .. total-1 of the dataset. Workers claim the
** next unclaimed index, but never more than `prefetch` beyond the consumer's
** position: that bound is the whole of the flow control, and it also means
** slot (i % prefetch) is free when a worker finishes item i (the item that
** used it, i - prefetch, has been taken). The consumer waits only on the slot
** of the item it wants next, so items come out in order however the workers
** race, and since every item is a pure function of (epoch, index) the batches
** are the same for any worker count.
**
** Threads live for one epoch: started by em_loader_start, they exit when the
** last index is claimed; em_loader_stop (a new epoch, an error, a break out of
** the loop followed by another epoch, em_loader_free from the Lua GC) raises
** the stop flag and joins them. A worker finishes the item it is computing
** first, so stopping takes at most one item's time; nothing is left running.
**
** Errors. A failed item is stored in its slot with its message; the consumer
** gets it when it reaches that index, after every earlier item, and the epoch
** is stopped. Workers stop claiming beyond a failed index.
**
** Time the consumer spends blocked in em_loader_next is summed as wait time;
** with workers = 0 the whole computation of each item is wait time, since the
** step waits for it either way.
**
** Devices. em_loader_to_device puts a feed (feed.c) between the slots
** and the consumer: it takes items through emi_loader_take -- also without
** waiting, to copy the next batch to the device ahead of its step -- and with
** pin_memory its pool of pinned buffers becomes the loader's buffer allocator.
** The workers then make sure every field of an item lies in such a buffer
** (pin_fields), copying the ones a view or a transform left elsewhere, so
** that every batch can be copied asynchronously.
*/
#include "../profile/profile.h"
#include "data.h"
#include <signal.h>
#include <stdio.h>
#include <time.h>

typedef struct slot {
  int64_t index;                 /* the item held, or -1 */
  em_status st;                  /* its result */
  em_tensor *f[EM_DATA_MAX_FIELDS];
  char err[EMI_ERRMSG_SIZE];
} slot;

typedef struct worker_arg { em_loader *l; int id; } worker_arg;

struct em_loader {
  em_state *S;
  em_dataset *d;
  em_loader_config cfg;
  int nworkers, prefetch;
  pthread_mutex_t mu;
  pthread_cond_t work_cv;        /* workers wait for room or stop */
  pthread_cond_t ready_cv;       /* the consumer waits for its slot */
  slot *slots;                   /* prefetch of them */
  pthread_t *threads;
  worker_arg *args;
  int nthreads;                  /* started and not yet joined */
  int stop;
  int64_t epoch, total, claim, pos, fail_at;
  emi_feed *feed;                /* em_loader_to_device, or NULL */
  int pin_all;                   /* every field must lie in a buffer_alloc buffer */
  em_status kept_st;             /* an error met computing ahead (workers = 0) */
  char kept_err[EMI_ERRMSG_SIZE];
  int64_t items, samples;
  double t_start, wait_s, t_last;
};

static void slot_clear(em_loader *l, slot *s) {
  for (int k = 0; k < EM_DATA_MAX_FIELDS; k++) { em_tensor_release(s->f[k]); s->f[k] = NULL; }
  s->index = -1;
  s->st = EM_OK;
  s->err[0] = 0;
}

/* Copies each field of out that does not lie in a whole buffer of the
** context's allocator (a view of an in-memory source, a transform's result)
** into one, so the device feed can copy every field without staging. */
static em_status pin_fields(em_loader *l, emi_dctx *c, em_tensor **out) {
  for (int k = 0; k < l->d->nfields; k++) {
    em_tensor *x = out[k], *y = NULL;
    if (!x || (x->storage->ext_free == c->buffer_free && x->storage->ext_ud == c->buffer_ud &&
               em_tensor_is_contiguous(x)))
      continue;
    em_status st = emi_dbuffer_new(c, "pin_memory", x->sizes, x->ndim, x->dtype, &y);
    if (st) return st;
    if (x->numel) emi_copy_strided(em_tensor_data(y), x);
    em_tensor_release(x);
    out[k] = y;
  }
  return EM_OK;
}

/* Computes item i into out with a context for worker `id`. */
static em_status compute(em_loader *l, int id, int64_t i, em_tensor **out, char *err) {
  emi_dctx c;
  emi_dctx_init(&c, l->S, id, l->epoch);
  c.buffer_alloc = l->cfg.buffer_alloc;
  c.buffer_free = l->cfg.buffer_free;
  c.buffer_ud = l->cfg.buffer_ud;
  em_status st = emi_dataset_get(l->d, &c, i, out);
  if (!st && l->pin_all && (st = pin_fields(l, &c, out)))
    for (int k = 0; k < EM_DATA_MAX_FIELDS; k++) { em_tensor_release(out[k]); out[k] = NULL; }
  if (st) memcpy(err, c.err, sizeof c.err);
  return st;
}

static void *worker_main(void *arg) {
  worker_arg *a = arg;
  em_loader *l = a->l;
  emi_profile_thread_label("loader worker", a->id + 1);
  pthread_mutex_lock(&l->mu);
  for (;;) {
    while (!l->stop && l->claim < l->total && l->claim < l->fail_at &&
           l->claim >= l->pos + l->prefetch)
      pthread_cond_wait(&l->work_cv, &l->mu);
    if (l->stop || l->claim >= l->total || l->claim >= l->fail_at) break;
    int64_t i = l->claim++;
    pthread_mutex_unlock(&l->mu);

    em_tensor *f[EM_DATA_MAX_FIELDS] = {0};
    char err[EMI_ERRMSG_SIZE];
    double t0 = emi_now();
    em_status st = compute(l, a->id, i, f, err);
    if (emi_profiler_of(l->S)) emi_profile_span(l->S, EM_PROF_LOADER_WORK, "batch", t0, emi_now(), 0);

    pthread_mutex_lock(&l->mu);
    slot *s = &l->slots[i % l->prefetch];
    if (l->stop) {                     /* nobody will take it */
      for (int k = 0; k < EM_DATA_MAX_FIELDS; k++) em_tensor_release(f[k]);
      continue;
    }
    s->index = i;
    s->st = st;
    memcpy(s->f, f, sizeof f);
    if (st) {
      memcpy(s->err, err, sizeof err);
      if (i < l->fail_at) l->fail_at = i;
    }
    pthread_cond_signal(&l->ready_cv);
  }
  pthread_mutex_unlock(&l->mu);
  return NULL;
}

/* The step thread's wait for this batch, with the settings a diagnosis would change;
** the batch handed out may end a step (em_profile_config.auto_step). */
static void profile_wait(em_state *S, em_loader *l, double t0, double t1) {
  em_profile_event ev;
  memset(&ev, 0, sizeof ev);
  ev.t0 = t0;
  ev.t1 = t1;
  ev.name = "data wait";
  ev.kind = EM_PROF_DATA_WAIT;
  ev.device = EM_CPU;
  ev.arg0 = l->nworkers;
  ev.arg1 = l->prefetch;
  emi_profile_record(S->profiler, &ev);
  emi_profile_batch_out(S, t1);
}

/* -- Public ------------------------------------------------------------------------------ */

void em_loader_config_init(em_loader_config *cfg) { memset(cfg, 0, sizeof *cfg); }

em_status em_loader_new(em_state *S, em_dataset *d, const em_loader_config *cfg,
                        em_loader **out) {
  if (!out) return emi_error(S, EM_ERR_ARG, "loader: out is required");
  *out = NULL;
  if (!d) return emi_error(S, EM_ERR_ARG, "loader: no dataset given");
  em_loader_config def;
  if (!cfg) { em_loader_config_init(&def); cfg = &def; }
  if (cfg->workers < 0 || cfg->workers > 256)
    return emi_error(S, EM_ERR_ARG, "loader: workers must be 0 .. 256, got %d", cfg->workers);
  if (cfg->prefetch < 0)
    return emi_error(S, EM_ERR_ARG, "loader: prefetch must be >= 0, got %d", cfg->prefetch);
  if (!cfg->buffer_alloc != !cfg->buffer_free)
    return emi_error(S, EM_ERR_ARG, "loader: buffer_alloc and buffer_free go together");
  em_loader *l = emi_malloc(S, sizeof *l);
  if (!l) return emi_error(S, EM_ERR_NOMEM, "loader: out of memory");
  memset(l, 0, sizeof *l);
  l->S = S;
  l->cfg = *cfg;
  l->nworkers = cfg->workers;
  l->prefetch = cfg->prefetch ? cfg->prefetch : 2 * (cfg->workers ? cfg->workers : 1);
  if (l->prefetch < l->nworkers) l->prefetch = l->nworkers;   /* else workers idle */
  l->slots = emi_malloc(S, (size_t)l->prefetch * sizeof *l->slots);
  l->threads = emi_malloc(S, (size_t)(l->nworkers ? l->nworkers : 1) * sizeof *l->threads);
  l->args = emi_malloc(S, (size_t)(l->nworkers ? l->nworkers : 1) * sizeof *l->args);
  if (!l->slots || !l->threads || !l->args) {
    emi_free(S, l->slots, (size_t)l->prefetch * sizeof *l->slots);
    emi_free(S, l->threads, (size_t)(l->nworkers ? l->nworkers : 1) * sizeof *l->threads);
    emi_free(S, l->args, (size_t)(l->nworkers ? l->nworkers : 1) * sizeof *l->args);
    emi_free(S, l, sizeof *l);
    return emi_error(S, EM_ERR_NOMEM, "loader: out of memory");
  }
  memset(l->slots, 0, (size_t)l->prefetch * sizeof *l->slots);
  for (int k = 0; k < l->prefetch; k++) l->slots[k].index = -1;
  pthread_mutex_init(&l->mu, NULL);
  pthread_cond_init(&l->work_cv, NULL);
  pthread_cond_init(&l->ready_cv, NULL);
  l->d = d;
  em_dataset_retain(d);
  l->epoch = -1;
  *out = l;
  return EM_OK;
}

/* Joins the workers and drops what they computed ahead (the feed's too). */
static void stop_epoch(em_loader *l) {
  pthread_mutex_lock(&l->mu);
  l->stop = 1;
  pthread_cond_broadcast(&l->work_cv);
  pthread_mutex_unlock(&l->mu);
  for (int k = 0; k < l->nthreads; k++) pthread_join(l->threads[k], NULL);
  l->nthreads = 0;
  for (int k = 0; k < l->prefetch; k++) slot_clear(l, &l->slots[k]);
  l->pos = l->total;                 /* the epoch is over */
  l->kept_st = EM_OK;
  emi_feed_drop(l->feed);
}

void em_loader_stop(em_loader *l) {
  if (!l) return;
  stop_epoch(l);
  emi_feed_trim(l->feed);            /* and the pinned buffers go back */
}

em_status em_loader_to_device(em_state *S, em_loader *l, int device, int pin_memory,
                              int ahead) {
  if (!l) return emi_error(S, EM_ERR_ARG, "loader: no loader given");
  if (l->feed) return emi_error(S, EM_ERR_ARG, "loader: to_device was called already");
  if (l->epoch >= 0)
    return emi_error(S, EM_ERR_ARG, "loader: to_device must come before the first epoch");
  if (pin_memory && l->cfg.buffer_alloc)
    return emi_error(S, EM_ERR_ARG, "loader: pin_memory brings its own buffer_alloc; the "
                     "config has one already");
  /* The pinned buffers in use at once: an item per slot (computing or ready),
  ** one more per worker for a transform's copy (pin_fields), the batches whose
  ** copies run ahead and the one handed out, each a buffer per field. */
  int copied = device == EM_CPU ? 0 : (ahead < 0 ? 1 : ahead) + 1;
  int buffers = (l->prefetch + l->nworkers + copied) * l->d->nfields;
  emi_feed *f = NULL;
  em_status st = emi_feed_new(S, device, pin_memory, ahead, buffers, &f);
  if (st) return st;
  if (pin_memory) {
    emi_feed_buffers(f, &l->cfg.buffer_alloc, &l->cfg.buffer_free, &l->cfg.buffer_ud);
    l->pin_all = 1;
  }
  l->feed = f;
  return EM_OK;
}

em_status em_loader_start(em_state *S, em_loader *l, int64_t epoch) {
  return em_loader_start_at(S, l, epoch, 0);
}

em_status em_loader_start_at(em_state *S, em_loader *l, int64_t epoch, int64_t first) {
  if (!l) return emi_error(S, EM_ERR_ARG, "loader: no loader given");
  if (first < 0 || first > l->d->len)
    return emi_error(S, EM_ERR_INDEX, "loader: can't start at item %lld of an epoch of %lld",
                     (long long)first, (long long)l->d->len);
  stop_epoch(l);
  l->stop = 0;
  l->epoch = epoch;
  l->total = l->d->len;
  l->claim = l->pos = first;
  l->fail_at = INT64_MAX;
  l->items = first;                  /* the bar counts skipped items as done */
  l->samples = 0;
  l->wait_s = 0;
  l->t_start = l->t_last = emi_now();
  /* Workers must not take the host's signals (Ctrl-C belongs to the consumer). */
  sigset_t all, old;
  sigfillset(&all);
  pthread_sigmask(SIG_BLOCK, &all, &old);
  int started = 0, rc = 0;
  for (; started < l->nworkers; started++) {
    l->args[started] = (worker_arg){l, started};
    rc = pthread_create(&l->threads[started], NULL, worker_main, &l->args[started]);
    if (rc) break;
    l->nthreads = started + 1;
  }
  pthread_sigmask(SIG_SETMASK, &old, NULL);
  if (rc) {
    stop_epoch(l);
    return emi_error(S, EM_ERR_NOMEM, "loader: could not start worker thread %d of %d",
                     started + 1, l->nworkers);
  }
  return EM_OK;
}

em_status emi_loader_take(em_state *S, em_loader *l, int wait, em_tensor **out, int *got) {
  *got = 0;
  for (int k = 0; k < EM_DATA_MAX_FIELDS; k++) out[k] = NULL;
  em_status st;
  char err[EMI_ERRMSG_SIZE];
  if (l->kept_st) {                  /* met while computing ahead: its turn now */
    if (!wait) return EM_OK;
    st = l->kept_st;
    memcpy(err, l->kept_err, sizeof err);
    stop_epoch(l);
    return emi_error(S, st, "%s", err);
  }
  if (l->pos >= l->total) return EM_OK;   /* the end: the workers have exited */
  if (l->nworkers == 0) {
    st = compute(l, -1, l->pos, out, err);
    if (!st) l->pos++;
    else if (!wait) {                /* not this item's turn to fail yet */
      l->kept_st = st;
      memcpy(l->kept_err, err, sizeof err);
      return EM_OK;
    }
  } else {
    pthread_mutex_lock(&l->mu);
    slot *s = &l->slots[l->pos % l->prefetch];
    if (!wait && (s->index != l->pos || s->st)) {   /* not ready (or failed: later) */
      pthread_mutex_unlock(&l->mu);
      return EM_OK;
    }
    while (s->index != l->pos) pthread_cond_wait(&l->ready_cv, &l->mu);
    st = s->st;
    memcpy(out, s->f, sizeof s->f);
    if (st) memcpy(err, s->err, sizeof err);
    for (int k = 0; k < EM_DATA_MAX_FIELDS; k++) s->f[k] = NULL;
    s->index = -1;
    if (!st) l->pos++;                 /* under the lock: workers read pos */
    pthread_cond_signal(&l->work_cv);  /* one slot is free: one more claim fits */
    pthread_mutex_unlock(&l->mu);
  }
  if (st) {
    stop_epoch(l);
    for (int k = 0; k < EM_DATA_MAX_FIELDS; k++) { em_tensor_release(out[k]); out[k] = NULL; }
    return emi_error(S, st, "%s", err);
  }
  *got = 1;
  return EM_OK;
}

em_status em_loader_next(em_state *S, em_loader *l, em_tensor **out, int *nfields) {
  if (!l || !out || !nfields) return emi_error(S, EM_ERR_ARG, "loader next: bad arguments");
  *nfields = 0;
  for (int k = 0; k < EM_DATA_MAX_FIELDS; k++) out[k] = NULL;
  if (l->epoch < 0)
    return emi_error(S, EM_ERR_ARG, "loader next: no epoch started (em_loader_start)");
  double t0 = emi_now();
  int got = 0;
  em_status st = l->feed ? emi_feed_next(S, l->feed, l, out, &got)
                         : emi_loader_take(S, l, 1, out, &got);
  if (st || !got) {                  /* an error, or the end of the epoch */
    stop_epoch(l);
    return st;
  }
  double t1 = emi_now();
  l->wait_s += t1 - t0;
  l->t_last = t1;
  if (S->profiler) profile_wait(S, l, t0, t1);
  l->items++;
  const em_tensor *x = out[0];
  l->samples += l->d->batched && x && x->ndim > 0 ? x->sizes[0] : 1;
  *nfields = l->d->nfields;
  return EM_OK;
}

void em_loader_stats_get(const em_loader *l, em_loader_stats *out) {
  memset(out, 0, sizeof *out);
  if (!l) return;
  out->epoch = l->epoch;
  out->items = l->items;
  out->samples = l->samples;
  out->total_items = l->total;
  out->elapsed_s = l->epoch < 0 ? 0 : (l->pos < l->total ? emi_now() : l->t_last) - l->t_start;
  out->wait_s = l->wait_s;
  em_loader *m = (em_loader *)l;     /* the lock only */
  pthread_mutex_lock(&m->mu);
  for (int k = 0; k < l->prefetch; k++)
    out->ready += l->slots[k].index >= l->pos && l->slots[k].st == EM_OK;
  pthread_mutex_unlock(&m->mu);
  if (l->feed) emi_feed_stats(l->feed, out);
}

void em_loader_free(em_loader *l) {
  if (!l) return;
  stop_epoch(l);
  emi_feed_free(l->feed);            /* after the workers: they allocate from its pool */
  em_state *S = l->S;
  pthread_mutex_destroy(&l->mu);
  pthread_cond_destroy(&l->work_cv);
  pthread_cond_destroy(&l->ready_cv);
  em_dataset_release(l->d);
  int nw = l->nworkers ? l->nworkers : 1;
  emi_free(S, l->slots, (size_t)l->prefetch * sizeof *l->slots);
  emi_free(S, l->threads, (size_t)nw * sizeof *l->threads);
  emi_free(S, l->args, (size_t)nw * sizeof *l->args);
  emi_free(S, l, sizeof *l);
}

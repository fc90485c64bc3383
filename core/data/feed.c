/*
** feed.c -- the device side of a loader (em_loader_to_device): batches handed
** out on an accelerator device, copied there from pinned memory on the device's
** copy stream while the step before them computes. Written on the device's
** services table (core/backend.h) alone: its pinned pool, streams, events and
** host callbacks.
**
** Design. The loader's workers assemble each batch straight into a pinned
** buffer from the loader's pool (the services' pool); a batch whose fields came out
** elsewhere (a view of an in-memory source, a transform run after `batch`) is
** copied into one by the worker that made it (loader.c), so the consumer's
** thread never touches batch bytes. The consumer's thread -- the only one that
** calls the runtime for copies -- keeps a short queue of batches whose copies
** are already queued:
**
**   em_loader_next:  [ take batch i if the queue is empty ]
**                    hand out batch i: the compute stream waits for its event
**                    top up: take batch i+1 .. i+ahead if a worker has them
**                    ready (never waiting for one) and queue their copies
**
** So when the step of batch i starts, the copy of batch i+1 is on the copy
** stream already and runs beside the step's kernels; the step of i+1 finds it
** done. Each batch's copies are one run on the copy stream: a host callback
** stamps the start, the fields' copies (the services' copy_pinned: a block of the
** copy stream's own, the pinned source held by the copy until it ran), an
** event, and a host callback that adds the copy's time and counts it done.
**
** The compute stream's wait is queued when the batch is handed out, not when
** its copy is: waiting at copy time would make the ops of batch i (queued
** after it) wait for the copy of batch i+1 as well.
**
** Reuse. A pinned buffer goes back to the pool when its tensor dies; the feed
** lets go of the host tensors as soon as their copies are queued, so the last
** reference is the copy's own, dropped by the host callback after the copy
** (the CUDA backend's kernels/pinned.c, step 2). The pool is told which buffers
** a pending copy holds, so a worker short of buffers waits for those rather than
** allocating more.
**
** Without pin_memory, a batch is staged and copied on the compute stream when
** it is handed out (kernels/backend.c's pageable path); nothing is copied ahead.
*/
#include "data.h"

enum { FEED_MAX_AHEAD = 8, FEED_Q = FEED_MAX_AHEAD + 1 };

typedef struct fbatch {
  em_tensor *f[EM_DATA_MAX_FIELDS];
  emi_event *ready;              /* after its copies on the copy stream, or NULL */
} fbatch;

struct emi_feed {
  em_state *S;
  int device;                    /* EM_CPU: pinned CPU batches, nothing copied */
  emi_device *d;                 /* the device whose services serve the feed */
  const emi_services *svc;
  int pinned, ahead;
  emi_pinned_pool *pool;
  fbatch q[FEED_Q];              /* copies queued, not handed out yet */
  int head, n;
  int64_t copies, bytes, late;
  double host_copy_s;            /* staged copies: the host's time */
  int64_t done;                  /* atomic: copies that ran (host callbacks) */
  int64_t copy_ns;               /* atomic: their time on the copy stream */
};

/* One batch's time on the copy stream, between two host callbacks. */
typedef struct stamp { emi_feed *f; double t0; } stamp;

static void stamp_begin(void *ud) { ((stamp *)ud)->t0 = emi_now(); }

static void stamp_end(void *ud) {
  stamp *sp = ud;
  emi_feed *f = sp->f;
  int64_t ns = (int64_t)((emi_now() - sp->t0) * 1e9);
  __atomic_add_fetch(&f->copy_ns, ns > 0 ? ns : 0, __ATOMIC_RELAXED);
  __atomic_add_fetch(&f->done, 1, __ATOMIC_RELEASE);
  emi_free(f->S, sp, sizeof *sp);  /* the state's allocator is thread-safe; not the runtime */
}

em_status emi_feed_new(em_state *S, int device, int pin_memory, int ahead, int buffers,
                       emi_feed **out) {
  *out = NULL;
  int ndev = emi_accel_count(S);
  if (!ndev)
    return emi_error(S, EM_ERR_DEVICE, "loader: %s needs a CUDA device: %s",
                     device >= 0 ? "device 'cuda'" : "pin_memory", emi_accel_why(S));
  if (device >= ndev || device < EM_CPU)
    return emi_error(S, EM_ERR_DEVICE, "loader: no device cuda:%d (this state has %d)",
                     device, ndev);
  if (device == EM_CPU && !pin_memory)
    return emi_error(S, EM_ERR_ARG, "loader: to_device with neither a device nor pin_memory");
  emi_feed *f = emi_malloc(S, sizeof *f);
  if (!f) return emi_error(S, EM_ERR_NOMEM, "loader: out of memory");
  memset(f, 0, sizeof *f);
  f->S = S;
  f->device = device;
  /* pinned memory for CPU batches: through the current device, the one the state
  ** uses ('cuda'), so that a replica on cuda:1 opens no context on cuda:0 */
  int dev = device == EM_CPU ? S->current_device : device;
  f->d = emi_device_of(S, dev);
  if (!f->d) {
    emi_free(S, f, sizeof *f);
    return emi_error(S, EM_ERR_DEVICE, "loader: %s", emi_accel_why(S));
  }
  f->svc = emi_services_of(S, f->d->index);
  f->pinned = pin_memory != 0;
  f->ahead = !f->pinned || device == EM_CPU ? 0 : ahead < 0 ? 1 :
             ahead > FEED_MAX_AHEAD ? FEED_MAX_AHEAD : ahead;
  em_status st;
  if (f->pinned && (st = f->svc->pool_new(f->d, buffers, &f->pool))) {
    emi_free(S, f, sizeof *f);
    return st;
  }
  *out = f;
  return EM_OK;
}

void emi_feed_buffers(emi_feed *f, void *(**alloc)(void *, size_t),
                      void (**release)(void *, void *, size_t), void **ud) {
  *alloc = f->pool ? f->svc->pool_alloc : NULL;
  *release = f->pool ? f->svc->pool_put : NULL;
  *ud = f->pool;
}

static void batch_clear(emi_feed *f, fbatch *b) {
  for (int k = 0; k < EM_DATA_MAX_FIELDS; k++) { em_tensor_release(b->f[k]); b->f[k] = NULL; }
  if (b->ready) f->svc->event_free(f->d, b->ready);
  b->ready = NULL;
}

/* Queues the copies of host batch h (references taken over) as the queue's last. */
static em_status enqueue(emi_feed *f, em_tensor **h) {
  em_state *S = f->S;
  emi_device *d = f->d;
  const emi_services *svc = f->svc;
  fbatch *b = &f->q[(f->head + f->n) % FEED_Q];
  memset(b, 0, sizeof *b);
  int any = 0, on_copy = 0;
  for (int k = 0; k < EM_DATA_MAX_FIELDS; k++)
    any |= h[k] && svc->is_pinned(h[k]) && em_tensor_is_contiguous(h[k]);
  stamp *sp = any ? emi_malloc(S, sizeof *sp) : NULL;
  if (sp) {
    sp->f = f;
    sp->t0 = emi_now();
    if (svc->host_callback(d, EMI_STREAM_COPY, stamp_begin, sp)) {
      emi_free(S, sp, sizeof *sp);
      sp = NULL;
    }
  }
  em_status st = EM_OK;
  double th = 0;
  int64_t bytes = 0;
  for (int k = 0; k < EM_DATA_MAX_FIELDS && !st; k++) {
    em_tensor *x = h[k];
    if (!x) continue;
    if (svc->is_pinned(x) && em_tensor_is_contiguous(x)) {
      int oc = 0;
      st = emi_tensor_new(S, "loader", x->sizes, x->ndim, x->dtype, f->device, &b->f[k]);
      if (!st) st = svc->copy_pinned(d, b->f[k], x, &oc);
      /* the copy holds x now; the pool learns that this buffer comes back by itself */
      if (!st && oc && f->pool) svc->pool_copying(f->pool, x->storage->data);
      on_copy |= oc;
    } else {                       /* pageable: staged, on the compute stream */
      double t0 = emi_now();
      st = em_to(S, x, x->dtype, f->device, &b->f[k]);
      th += emi_now() - t0;
    }
    bytes += x->numel * (int64_t)em_dtype_size(x->dtype);
  }
  for (int k = 0; k < EM_DATA_MAX_FIELDS; k++) em_tensor_release(h[k]);
  if (!st && on_copy) {
    emi_event *e = NULL;
    if (svc->event_new(d, EMI_STREAM_COPY, &e)) {
      svc->stream_sync(d, EMI_STREAM_COPY);  /* no event: then the data is there already */
      e = NULL;
    }
    b->ready = e;
  }
  if (sp && svc->host_callback(d, EMI_STREAM_COPY, stamp_end, sp)) {
    svc->stream_sync(d, EMI_STREAM_COPY);
    stamp_end(sp);
  }
  if (!sp) __atomic_add_fetch(&f->done, 1, __ATOMIC_RELEASE);   /* staged: queued in order */
  if (st) {
    batch_clear(f, b);
    return st;
  }
  f->copies++;
  f->bytes += bytes;
  f->host_copy_s += th;
  f->n++;
  return EM_OK;
}

em_status emi_feed_next(em_state *S, emi_feed *f, em_loader *l, em_tensor **out, int *got) {
  *got = 0;
  if (f->device == EM_CPU) return emi_loader_take(S, l, 1, out, got);
  emi_device *d = f->d;
  const emi_services *svc = f->svc;
  svc->host_collect(d);
  em_tensor *h[EM_DATA_MAX_FIELDS];
  em_status st;
  if (f->n == 0) {
    int g = 0;
    if ((st = emi_loader_take(S, l, 1, h, &g))) return st;
    if (!g) {
      /* The epoch's end: every copy is handed out and each step waits for its own.
      ** Waiting here for the copy stream's last stamps costs next to nothing and
      ** lets the stats read after an epoch count every copy as done. */
      svc->stream_sync(d, EMI_STREAM_COPY);
      return EM_OK;
    }
    if ((st = enqueue(f, h))) return st;
  }
  /* Hand out the oldest: the compute stream waits for its copy from here on. */
  fbatch *b = &f->q[f->head];
  f->head = (f->head + 1) % FEED_Q;
  f->n--;
  if (b->ready) {
    int done = 1;
    if (svc->event_query(d, b->ready, &done) == EM_OK && !done) f->late++;
    if ((st = svc->event_wait(d, EMI_STREAM_COMPUTE, b->ready)) &&
        (st = svc->stream_sync(d, EMI_STREAM_COPY))) {
      batch_clear(f, b);
      return emi_error(S, st, "loader: copy to device: cuda:%d: %s", d->index,
                       svc->errmsg(d));
    }
    svc->event_free(d, b->ready);   /* the queued wait keeps its point */
    b->ready = NULL;
  }
  memcpy(out, b->f, sizeof b->f);
  memset(b->f, 0, sizeof b->f);
  *got = 1;
  /* Top up: the next batches' copies go on the copy stream now, under this step. */
  while (f->n < f->ahead) {
    int g = 0;
    if (emi_loader_take(S, l, 0, h, &g) || !g) break;   /* not ready: next time */
    if ((st = enqueue(f, h))) {
      for (int k = 0; k < EM_DATA_MAX_FIELDS; k++) { em_tensor_release(out[k]); out[k] = NULL; }
      *got = 0;
      return st;
    }
  }
  return EM_OK;
}

void emi_feed_drop(emi_feed *f) {
  if (!f || !f->n) return;
  for (; f->n > 0; f->n--, f->head = (f->head + 1) % FEED_Q) batch_clear(f, &f->q[f->head]);
}

/* After the copies: every buffer a copy held is back in the pool. */
static void drain(emi_feed *f) {
  if (f->device != EM_CPU) {
    f->svc->stream_sync(f->d, EMI_STREAM_COPY);
    f->svc->stream_sync(f->d, EMI_STREAM_COMPUTE);
  }
}

void emi_feed_trim(emi_feed *f) {
  if (!f) return;
  emi_feed_drop(f);
  drain(f);
  if (f->pool) f->svc->pool_trim(f->pool);
}

void emi_feed_stats(emi_feed *f, em_loader_stats *out) {
  out->copies = f->copies;
  out->copies_done = __atomic_load_n(&f->done, __ATOMIC_ACQUIRE);
  out->copy_bytes = f->bytes;
  out->copy_s = f->host_copy_s + 1e-9 * (double)__atomic_load_n(&f->copy_ns, __ATOMIC_RELAXED);
  out->copies_late = f->late;
  if (f->pool)
    f->svc->pool_stats(f->pool, &out->pinned_buffers, &out->pinned_bytes,
                          &out->buffer_waits, &out->buffer_wait_s);
}

void emi_feed_free(emi_feed *f) {
  if (!f) return;
  emi_feed_drop(f);
  drain(f);                        /* the stamps' callbacks point at f */
  if (f->pool) f->svc->pool_close(f->pool);
  emi_free(f->S, f, sizeof *f);
}

/*
** stream_emu.c -- the emulated runtime's streams, events and launches.
**
** A stream is a worker thread and a FIFO of work items (copy, memset, kernel,
** host callback, event marker, wait, and library work such as gemm_emu.c's).
** Calls that queue work return once the item is queued; the worker runs items
** one at a time, in order, and counts them: item k (its sequence number, from
** 1) has run once `completed >= k`. That count is the whole synchronisation
** story:
**   - an event records (stream, sequence number of a marker item queued at the
**     record); it is done once that stream's count reaches it, and an event never
**     recorded is done. Recording again moves the point;
**   - stream_sync waits for the count to reach what was queued at the call;
**   - stream_wait_event queues an item that, when the worker reaches it, sleeps on
**     the other stream's condition variable until its count reaches the event's
**     point -- no busy waiting, and no cycle is possible: a wait only ever names
**     work queued before it.
** Errors of asynchronous work (a copy outside a live block, a kernel the grid
** emulator refused) are kept by the stream, as CUDA's sticky errors: the first
** one and how many followed. The next call on that stream reports and clears it;
** a call that reports an earlier error queues nothing, so that the caller never
** mistakes "queued, and an old error" for "not queued". event_sync/event_query
** report it only when the failed item lay before the event's point. Items after
** a failure still run, so that markers, waits and the callbacks that free memory
** are never skipped, and a failed stream stays usable.
** Streams are reference counted under E->mu (the handle, each event recorded on
** it, each queued wait on it), so that a stream destroyed while another stream
** still waits on it or an event still names it stays readable until the last
** user lets go; its thread was joined when its handle went.
*/
#include "emu.h"
#include "grid.h"
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define EMU_STREAM_MAGIC 0x53747265u
#define EMU_EVENT_MAGIC 0x45766e74u

typedef enum { IT_COPY, IT_MEMSET, IT_KERNEL, IT_CALLBACK, IT_MARKER, IT_WAIT, IT_WORK } item_kind;

struct emu_item {
  emu_item *next;
  item_kind kind;
  size_t size;                  /* bytes of this item, args included (a graph copies it) */
  unsigned long long seq;
  union {
    /* dst_dev, src_dev: the devices a peer copy names (-1: not checked) */
    struct { void *dst; const void *src; size_t n; emk_copy_kind kind; int dst_dev, src_dev; } copy;
    struct { void *dst; int byte; size_t n; } set;
    struct { const emk_kernel *k; emk_dim3 grid, block; size_t shared, args_size; } kern;
    struct { void (*fn)(void *ud); void *ud; } cb;
    struct { emk_stream *s; unsigned long long target; } wait;
    struct { em_status (*fn)(emu *E, void *args, char *err, size_t errlen); } work;
  } u;
  max_align_t args[];           /* a kernel's arguments, copied at the launch */
};

static emu *emu_of(emk_runtime *rt) { return rt ? (emu *)rt->impl : NULL; }

static const char *copy_name(emk_copy_kind k) {
  return k == EMK_HOST_TO_DEVICE ? "host to device"
       : k == EMK_DEVICE_TO_HOST ? "device to host" : "device to device";
}

/* -- References and checks --------------------------------------------------------- */

/* Under E->mu. */
static void stream_ref(emk_stream *s) { s->refs++; }
static void stream_unref(emk_stream *s) {
  if (--s->refs) return;
  pthread_cond_destroy(&s->done_cv);
  pthread_cond_destroy(&s->work_cv);
  pthread_mutex_destroy(&s->mu);
  free(s);
}
static void stream_unref_locked(emu *E, emk_stream *s) {
  pthread_mutex_lock(&E->mu);
  stream_unref(s);
  pthread_mutex_unlock(&E->mu);
}

static em_status check_stream(emu *E, emk_stream *s, const char *what) {
  if (!s) return emi_emu_fail(E, EM_ERR_ARG, "%s: no stream (NULL)", what);
  if (s->magic != EMU_STREAM_MAGIC || s->E != E)
    return emi_emu_fail(E, EM_ERR_ARG, "%s: %p is not a live stream of this runtime", what,
                        (void *)s);
  return EM_OK;
}

static em_status check_event(emu *E, emk_event *e, const char *what) {
  if (!e) return emi_emu_fail(E, EM_ERR_ARG, "%s: no event (NULL)", what);
  if (e->magic != EMU_EVENT_MAGIC)
    return emi_emu_fail(E, EM_ERR_ARG, "%s: %p is not a live event", what, (void *)e);
  return EM_OK;
}

/* A call that waits for streams, made on a stream's own thread (from a host
** callback, which must not call the runtime), would wait for itself. */
static em_status check_not_worker(emu *E, const char *what) {
  pthread_t self = pthread_self();
  int on = 0;
  pthread_mutex_lock(&E->mu);
  for (emk_stream *s = E->streams; s && !on; s = s->next) on = pthread_equal(s->thread, self);
  pthread_mutex_unlock(&E->mu);
  return on ? emi_emu_fail(E, EM_ERR_ARG, "%s: called on a stream's thread (a host callback "
                           "must not call the runtime)", what)
            : EM_OK;
}

/* -- Sticky errors ------------------------------------------------------------------ */

/* Records the failure of item seq on s (on the worker). */
static void stream_error(emk_stream *s, unsigned long long seq, em_status code,
                         const char *fmt, ...) __attribute__((format(printf, 4, 5)));
static void stream_error(emk_stream *s, unsigned long long seq, em_status code,
                         const char *fmt, ...) {
  pthread_mutex_lock(&s->mu);
  if (s->err) s->err_more++;
  else {
    int k = snprintf(s->errmsg, sizeof s->errmsg, "cuda:%d stream %u: ", s->dev, s->id);
    va_list ap;
    va_start(ap, fmt);
    if (k > 0 && (size_t)k < sizeof s->errmsg)
      vsnprintf(s->errmsg + k, sizeof s->errmsg - (size_t)k, fmt, ap);
    va_end(ap);
    s->err = code;
    s->err_seq = seq;
  }
  pthread_mutex_unlock(&s->mu);
}

/* With s->mu held: the pending error, if any and if it lies at or before
** `upto`, moved into rt->errmsg and cleared. */
static em_status take_error(emu *E, emk_stream *s, unsigned long long upto) {
  if (!s->err || s->err_seq > upto) return EM_OK;
  em_status code = s->err;
  if (s->err_more)
    emi_emu_fail(E, code, "%s (and %u later error%s on this stream)", s->errmsg, s->err_more,
                 s->err_more == 1 ? "" : "s");
  else
    emi_emu_fail(E, code, "%s", s->errmsg);
  s->err = EM_OK;
  s->err_more = 0;
  return code;
}

/* -- The worker --------------------------------------------------------------------- */

static void run_copy(emu *E, emk_stream *s, emu_item *it) {
  void *dst = it->u.copy.dst;
  const void *src = it->u.copy.src;
  size_t n = it->u.copy.n;
  emk_copy_kind kind = it->u.copy.kind;
  emu_block *bd = NULL, *bs = NULL;
  char why[400];
  const char *side = NULL;
  if (kind != EMK_HOST_TO_DEVICE && !emi_emu_pin(E, src, n, &bs, why, sizeof why))
    side = "source";
  else if (kind != EMK_DEVICE_TO_HOST && !emi_emu_pin(E, dst, n, &bd, why, sizeof why))
    side = "destination";
  else if (kind == EMK_HOST_TO_DEVICE && emi_emu_is_device(E, src, n, why, sizeof why))
    side = "host source";
  else if (kind == EMK_DEVICE_TO_HOST && emi_emu_is_device(E, dst, n, why, sizeof why))
    side = "host destination";
  else if (bs && it->u.copy.src_dev >= 0 && bs->dev != it->u.copy.src_dev) {
    side = "source";
    snprintf(why, sizeof why, "is memory of cuda:%d, not of cuda:%d", bs->dev,
             it->u.copy.src_dev);
  } else if (bd && it->u.copy.dst_dev >= 0 && bd->dev != it->u.copy.dst_dev) {
    side = "destination";
    snprintf(why, sizeof why, "is memory of cuda:%d, not of cuda:%d", bd->dev,
             it->u.copy.dst_dev);
  }
  if (side)
    stream_error(s, it->seq, EM_ERR_ARG, "memcpy_async (%s) of %zu bytes: the %s %s",
                 copy_name(kind), n, side, why);
  else
    memmove(dst, src, n);        /* device-to-device ranges may overlap */
  if (bs) emi_emu_unpin(E, bs);
  if (bd) emi_emu_unpin(E, bd);
}

static void run_memset(emu *E, emk_stream *s, emu_item *it) {
  emu_block *b;
  char why[400];
  if (!emi_emu_pin(E, it->u.set.dst, it->u.set.n, &b, why, sizeof why)) {
    stream_error(s, it->seq, EM_ERR_ARG, "memset_async of %zu bytes: the destination %s",
                 it->u.set.n, why);
    return;
  }
  memset(it->u.set.dst, it->u.set.byte, it->u.set.n);
  emi_emu_unpin(E, b);
}

static void run_item(emu *E, emk_stream *s, emu_item *it) {
  switch (it->kind) {
  case IT_COPY: run_copy(E, s, it); break;
  case IT_MEMSET: run_memset(E, s, it); break;
  case IT_KERNEL: {
    char err[EMK_ERRMSG_SIZE] = "";
    em_status st = emk_grid_run(it->u.kern.k, it->u.kern.grid, it->u.kern.block,
                                it->u.kern.shared, it->args, err, sizeof err);
    if (st) stream_error(s, it->seq, st, "%s", err[0] ? err : "the kernel failed");
    break;
  }
  case IT_CALLBACK: it->u.cb.fn(it->u.cb.ud); break;
  case IT_MARKER: break;
  case IT_WORK: {
    char err[EMK_ERRMSG_SIZE] = "";
    em_status st = it->u.work.fn(E, it->args, err, sizeof err);
    if (st) stream_error(s, it->seq, st, "%s", err[0] ? err : "the work item failed");
    break;
  }
  case IT_WAIT: {
    emk_stream *w = it->u.wait.s;
    pthread_mutex_lock(&w->mu);
    while (w->completed < it->u.wait.target) pthread_cond_wait(&w->done_cv, &w->mu);
    pthread_mutex_unlock(&w->mu);
    stream_unref_locked(E, w);
    break;
  }
  }
}

static void *worker(void *arg) {
  emk_stream *s = arg;
  emu *E = s->E;
  pthread_mutex_lock(&s->mu);
  for (;;) {
    while (!s->head && !s->stop) pthread_cond_wait(&s->work_cv, &s->mu);
    emu_item *it = s->head;
    if (!it) break;                            /* stopped, and nothing left */
    s->head = it->next;
    if (!s->head) s->tail = NULL;
    pthread_mutex_unlock(&s->mu);
    run_item(E, s, it);
    pthread_mutex_lock(&s->mu);
    s->completed = it->seq;
    pthread_cond_broadcast(&s->done_cv);
    free(it);
  }
  pthread_mutex_unlock(&s->mu);
  return NULL;
}

/* Queues it on s, or reports s's pending error and frees it (then the caller
** undoes what the item held). *seq is its sequence number. */
static em_status capture_item(emu *E, emk_stream *s, emu_item *it);

static em_status enqueue(emu *E, emk_stream *s, emu_item *it, unsigned long long *seq) {
  pthread_mutex_lock(&s->mu);
  if (s->capture) {                        /* recorded for a graph, not run */
    em_status st = capture_item(E, s, it);
    pthread_mutex_unlock(&s->mu);
    return st;
  }
  em_status st = take_error(E, s, (unsigned long long)-1);
  if (!st) {
    it->next = NULL;
    it->seq = ++s->queued;
    if (s->tail) s->tail->next = it;
    else s->head = it;
    s->tail = it;
    if (seq) *seq = it->seq;
    pthread_cond_signal(&s->work_cv);
  }
  pthread_mutex_unlock(&s->mu);
  if (st) free(it);
  return st;
}

static emu_item *new_item(emu *E, item_kind kind, size_t extra, const char *what) {
  emu_item *it = calloc(1, sizeof *it + extra);
  if (!it) emi_emu_fail(E, EM_ERR_NOMEM, "%s: out of host memory for a work item", what);
  else {
    it->kind = kind;
    it->size = sizeof *it + extra;
  }
  return it;
}

/* Waits until s finished item `target`. */
static void wait_point(emk_stream *s, unsigned long long target) {
  pthread_mutex_lock(&s->mu);
  while (s->completed < target) pthread_cond_wait(&s->done_cv, &s->mu);
  pthread_mutex_unlock(&s->mu);
}

/* -- Streams ------------------------------------------------------------------------ */

em_status emi_emu_stream_create(emk_runtime *rt, int dev, emk_stream **out) {
  emu *E = emu_of(rt);
  if (!out) return emi_emu_fail(E, EM_ERR_ARG, "stream_create: no output (NULL)");
  *out = NULL;
  if (dev < 0 || dev >= E->ndev)
    return emi_emu_fail(E, EM_ERR_DEVICE, "stream_create: no device cuda:%d (the emulated "
                        "runtime has %d)", dev, E->ndev);
  em_status cst = emi_emu_context(E, dev, "stream_create");
  if (cst) return cst;
  emk_stream *s = calloc(1, sizeof *s);
  if (!s) return emi_emu_fail(E, EM_ERR_NOMEM, "stream_create: out of host memory");
  s->magic = EMU_STREAM_MAGIC;
  s->E = E;
  s->dev = dev;
  s->refs = 1;
  pthread_mutex_init(&s->mu, NULL);
  pthread_cond_init(&s->work_cv, NULL);
  pthread_cond_init(&s->done_cv, NULL);
  /* The worker blocks every signal: Ctrl-C stays with the host's threads. */
  sigset_t all, old;
  sigfillset(&all);
  pthread_mutex_lock(&E->mu);        /* check_not_worker must see a complete thread id */
  s->id = ++E->next_stream;
  pthread_sigmask(SIG_SETMASK, &all, &old);
  int rc = pthread_create(&s->thread, NULL, worker, s);
  pthread_sigmask(SIG_SETMASK, &old, NULL);
  if (!rc) {
    s->next = E->streams;
    if (E->streams) E->streams->prev = s;
    E->streams = s;
  }
  pthread_mutex_unlock(&E->mu);
  if (rc) {
    pthread_cond_destroy(&s->done_cv);
    pthread_cond_destroy(&s->work_cv);
    pthread_mutex_destroy(&s->mu);
    free(s);
    return emi_emu_fail(E, EM_ERR_NOMEM, "stream_create on cuda:%d: could not start the "
                        "stream's thread (%s)", dev, strerror(rc));
  }
  *out = s;
  return EM_OK;
}

/* Under E->mu: takes s off the list of live streams. */
static void unlink_stream(emu *E, emk_stream *s) {
  if (s->prev) s->prev->next = s->next;
  else E->streams = s->next;
  if (s->next) s->next->prev = s->prev;
  s->prev = s->next = NULL;
}

static void stop_stream(emk_stream *s) {
  pthread_mutex_lock(&s->mu);
  s->stop = 1;
  pthread_cond_signal(&s->work_cv);
  pthread_mutex_unlock(&s->mu);
}

em_status emi_emu_stream_destroy(emk_runtime *rt, emk_stream *s) {
  emu *E = emu_of(rt);
  em_status st = check_stream(E, s, "stream_destroy");
  if (!st) st = check_not_worker(E, "stream_destroy");
  if (st) return st;
  pthread_mutex_lock(&E->mu);
  unlink_stream(E, s);
  s->magic = 0;
  pthread_mutex_unlock(&E->mu);
  stop_stream(s);                                 /* it drains its queue, then leaves */
  pthread_join(s->thread, NULL);
  pthread_mutex_lock(&s->mu);
  st = take_error(E, s, (unsigned long long)-1);
  pthread_mutex_unlock(&s->mu);
  stream_unref_locked(E, s);
  return st;
}

static em_status refuse_while_capturing(emu *E, emk_stream *s, const char *what);

em_status emi_emu_stream_sync(emk_runtime *rt, emk_stream *s) {
  emu *E = emu_of(rt);
  em_status st = check_stream(E, s, "stream_sync");
  if (!st) st = check_not_worker(E, "stream_sync");
  if (st) return st;
  pthread_mutex_lock(&s->mu);
  if (s->capture) {
    st = refuse_while_capturing(E, s, "stream_sync (a wait for the stream's work)");
    pthread_mutex_unlock(&s->mu);
    return st;
  }
  unsigned long long target = s->queued;
  while (s->completed < target) pthread_cond_wait(&s->done_cv, &s->mu);
  st = take_error(E, s, (unsigned long long)-1);
  pthread_mutex_unlock(&s->mu);
  return st;
}

em_status emi_emu_drain(emu *E, int dev, const char *what) {
  em_status st = check_not_worker(E, what);
  if (st) return st;
  /* Take a reference on each stream and note its last queued item, then wait
  ** outside E->mu (the workers need it to drop references). */
  pthread_mutex_lock(&E->mu);
  size_t n = 0;
  for (emk_stream *s = E->streams; s; s = s->next) n += dev < 0 || s->dev == dev;
  emk_stream **v = n ? malloc(n * sizeof *v) : NULL;
  unsigned long long *t = n ? malloc(n * sizeof *t) : NULL;
  if (n && (!v || !t)) {
    pthread_mutex_unlock(&E->mu);
    free(v);
    free(t);
    return emi_emu_fail(E, EM_ERR_NOMEM, "%s: out of host memory", what);
  }
  size_t k = 0;
  for (emk_stream *s = E->streams; s; s = s->next)
    if (dev < 0 || s->dev == dev) {
      stream_ref(s);
      pthread_mutex_lock(&s->mu);
      t[k] = s->queued;
      pthread_mutex_unlock(&s->mu);
      v[k++] = s;
    }
  pthread_mutex_unlock(&E->mu);
  for (size_t i = 0; i < n; i++) wait_point(v[i], t[i]);
  pthread_mutex_lock(&E->mu);
  for (size_t i = 0; i < n; i++) stream_unref(v[i]);
  pthread_mutex_unlock(&E->mu);
  free(v);
  free(t);
  return EM_OK;
}

void emi_emu_streams_close(emu *E) {
  /* Every stream gets its stop first, so all drain together (a wait on one may
  ** need another's work), then each is joined. */
  pthread_mutex_lock(&E->mu);
  emk_stream *list = E->streams;
  E->streams = NULL;
  pthread_mutex_unlock(&E->mu);
  for (emk_stream *s = list; s; s = s->next) {
    s->magic = 0;
    stop_stream(s);
  }
  for (emk_stream *s = list; s; s = s->next) pthread_join(s->thread, NULL);
  pthread_mutex_lock(&E->mu);
  while (E->events) {
    emk_event *e = E->events;
    E->events = e->next;
    if (e->s) stream_unref(e->s);
    free(e);
  }
  for (emk_stream *s = list, *next; s; s = next) {
    next = s->next;
    stream_unref(s);
  }
  pthread_mutex_unlock(&E->mu);
}

/* What a call on s that queues nothing reports: s's pending error. */
static em_status pending(emu *E, emk_stream *s) {
  pthread_mutex_lock(&s->mu);
  em_status st = take_error(E, s, (unsigned long long)-1);
  pthread_mutex_unlock(&s->mu);
  return st;
}

/* -- Queued work ---------------------------------------------------------------------- */

/* Queues a copy item; dst_dev / src_dev: the devices the sides must be on (-1:
** not checked). */
static em_status queue_copy(emu *E, emk_stream *s, const char *what, void *dst, int dst_dev,
                            const void *src, int src_dev, size_t n, emk_copy_kind kind) {
  emu_item *it = new_item(E, IT_COPY, 0, what);
  if (!it) return EM_ERR_NOMEM;
  it->u.copy.dst = dst;
  it->u.copy.src = src;
  it->u.copy.n = n;
  it->u.copy.kind = kind;
  it->u.copy.dst_dev = dst_dev;
  it->u.copy.src_dev = src_dev;
  return enqueue(E, s, it, NULL);
}

em_status emi_emu_memcpy_async(emk_runtime *rt, void *dst, const void *src, size_t n,
                               emk_copy_kind kind, emk_stream *s) {
  emu *E = emu_of(rt);
  em_status st = check_stream(E, s, "memcpy_async");
  if (st) return st;
  if (kind != EMK_HOST_TO_DEVICE && kind != EMK_DEVICE_TO_HOST && kind != EMK_DEVICE_TO_DEVICE)
    return emi_emu_fail(E, EM_ERR_ARG, "memcpy_async: unknown copy kind %d", (int)kind);
  if (n && (!dst || !src))
    return emi_emu_fail(E, EM_ERR_ARG, "memcpy_async (%s) of %zu bytes: NULL %s",
                        copy_name(kind), n, dst ? "source" : "destination");
  if (!n) return pending(E, s);
  if (kind == EMK_HOST_TO_DEVICE) emi_emu_note_host_side(E, src, n);
  if (kind == EMK_DEVICE_TO_HOST) emi_emu_note_host_side(E, dst, n);
  return queue_copy(E, s, "memcpy_async", dst, -1, src, -1, n, kind);
}

/* A device-to-device copy whose two sides name their devices, checked when it
** runs (each range must lie in a live block of its device). */
em_status emi_emu_memcpy_peer_async(emk_runtime *rt, void *dst, int dst_dev,
                                    const void *src, int src_dev, size_t n, emk_stream *s) {
  emu *E = emu_of(rt);
  em_status st = check_stream(E, s, "memcpy_peer_async");
  if (st) return st;
  if (dst_dev < 0 || dst_dev >= E->ndev || src_dev < 0 || src_dev >= E->ndev)
    return emi_emu_fail(E, EM_ERR_ARG, "memcpy_peer_async: no device cuda:%d",
                        dst_dev < 0 || dst_dev >= E->ndev ? dst_dev : src_dev);
  if (n && (!dst || !src))
    return emi_emu_fail(E, EM_ERR_ARG, "memcpy_peer_async of %zu bytes: NULL %s", n,
                        dst ? "source" : "destination");
  if (!n) return pending(E, s);
  return queue_copy(E, s, "memcpy_peer_async", dst, dst_dev, src, src_dev, n,
                    EMK_DEVICE_TO_DEVICE);
}

em_status emi_emu_memset_async(emk_runtime *rt, void *dst, int byte, size_t n,
                               emk_stream *s) {
  emu *E = emu_of(rt);
  em_status st = check_stream(E, s, "memset_async");
  if (st) return st;
  if (!n) return pending(E, s);
  emu_item *it = new_item(E, IT_MEMSET, 0, "memset_async");
  if (!it) return EM_ERR_NOMEM;
  it->u.set.dst = dst;
  it->u.set.byte = byte;
  it->u.set.n = n;
  return enqueue(E, s, it, NULL);
}

/* Work queued on s whose argument bytes hold a pointer into another device's
** memory fails here, naming both devices (what + name: the call). */
static em_status own_device_args(emu *E, const emk_stream *s, const char *what,
                                 const char *name, const void *args, size_t n) {
  size_t off;
  int owner;
  if (!emi_emu_foreign_pointer(E, args, n, s->dev, &off, &owner)) return EM_OK;
  return emi_emu_fail(E, EM_ERR_DEVICE, "%s%s on a stream of cuda:%d: the argument at byte "
                      "%zu is memory of cuda:%d (another device's memory is an illegal "
                      "address there without peer access; copy it with memcpy_peer_async)",
                      what, name, s->dev, off, owner);
}

em_status emi_emu_queue_work(emu *E, emk_stream *s, const char *what,
                             em_status (*fn)(emu *E, void *args, char *err, size_t errlen),
                             const void *args, size_t n) {
  em_status st = check_stream(E, s, what);
  if (st) return st;
  if ((st = own_device_args(E, s, what, "", args, n))) return st;
  emu_item *it = new_item(E, IT_WORK, n, what);
  if (!it) return EM_ERR_NOMEM;
  it->u.work.fn = fn;
  if (n) memcpy(it->args, args, n);
  return enqueue(E, s, it, NULL);
}

em_status emi_emu_host_callback(emk_runtime *rt, emk_stream *s, void (*fn)(void *ud),
                                void *ud) {
  emu *E = emu_of(rt);
  em_status st = check_stream(E, s, "host_callback");
  if (st) return st;
  if (!fn) return emi_emu_fail(E, EM_ERR_ARG, "host_callback: no function (NULL)");
  emu_item *it = new_item(E, IT_CALLBACK, 0, "host_callback");
  if (!it) return EM_ERR_NOMEM;
  it->u.cb.fn = fn;
  it->u.cb.ud = ud;
  return enqueue(E, s, it, NULL);
}

em_status emi_emu_launch(emk_runtime *rt, const emk_kernel *k, emk_dim3 grid,
                         emk_dim3 block, size_t dyn_shared, emk_stream *s,
                         const void *args, size_t args_size) {
  emu *E = emu_of(rt);
  em_status st = check_stream(E, s, "launch");
  if (st) return st;
  if (!k) return emi_emu_fail(E, EM_ERR_ARG, "launch: no kernel (NULL)");
  const char *name = k->name ? k->name : "(unnamed kernel)";
  unsigned long long threads = (unsigned long long)block.x * block.y * block.z;
  /* The checks a real launch makes before queuing (cudaErrorInvalidConfiguration). */
  if (!grid.x || !grid.y || !grid.z || !block.x || !block.y || !block.z)
    return emi_emu_fail(E, EM_ERR_ARG, "launch %s: empty grid or block (%ux%ux%u blocks of "
                        "%ux%ux%u threads)", name, grid.x, grid.y, grid.z, block.x, block.y,
                        block.z);
  if (threads > EMU_MAX_BLOCK_THREADS || block.z > 64)
    return emi_emu_fail(E, EM_ERR_ARG, "launch %s: a block of %ux%ux%u threads; at most %d "
                        "threads, and z at most 64", name, block.x, block.y, block.z,
                        EMU_MAX_BLOCK_THREADS);
  if (grid.x > 2147483647u || grid.y > 65535 || grid.z > 65535)
    return emi_emu_fail(E, EM_ERR_ARG, "launch %s: a grid of %ux%ux%u blocks; at most "
                        "2147483647x65535x65535", name, grid.x, grid.y, grid.z);
  if (dyn_shared > EMU_SHARED_PER_BLOCK)
    return emi_emu_fail(E, EM_ERR_ARG, "launch %s: %zu bytes of dynamic shared memory; a "
                        "block has %zu", name, dyn_shared, EMU_SHARED_PER_BLOCK);
  if (args_size > EMU_MAX_ARGS_SIZE || (args_size && !args))
    return emi_emu_fail(E, EM_ERR_ARG, "launch %s: %zu bytes of arguments at %p (at most %zu)",
                        name, args_size, args, EMU_MAX_ARGS_SIZE);
  if ((st = own_device_args(E, s, "launch ", name, args, args_size))) return st;
  emu_item *it = new_item(E, IT_KERNEL, args_size, "launch");
  if (!it) return EM_ERR_NOMEM;
  it->u.kern.k = k;
  it->u.kern.grid = grid;
  it->u.kern.block = block;
  it->u.kern.shared = dyn_shared;
  it->u.kern.args_size = args_size;
  if (args_size) memcpy(it->args, args, args_size);
  return enqueue(E, s, it, NULL);
}

/* -- Events ------------------------------------------------------------------------- */

em_status emi_emu_event_create(emk_runtime *rt, int dev, emk_event **out) {
  emu *E = emu_of(rt);
  if (!out) return emi_emu_fail(E, EM_ERR_ARG, "event_create: no output (NULL)");
  *out = NULL;
  if (dev < 0 || dev >= E->ndev)
    return emi_emu_fail(E, EM_ERR_DEVICE, "event_create: no device cuda:%d (the emulated "
                        "runtime has %d)", dev, E->ndev);
  em_status cst = emi_emu_context(E, dev, "event_create");
  if (cst) return cst;
  emk_event *e = calloc(1, sizeof *e);
  if (!e) return emi_emu_fail(E, EM_ERR_NOMEM, "event_create: out of host memory");
  e->magic = EMU_EVENT_MAGIC;
  e->dev = dev;
  pthread_mutex_lock(&E->mu);
  e->next = E->events;
  if (E->events) E->events->prev = e;
  E->events = e;
  pthread_mutex_unlock(&E->mu);
  *out = e;
  return EM_OK;
}

em_status emi_emu_event_destroy(emk_runtime *rt, emk_event *e) {
  emu *E = emu_of(rt);
  em_status st = check_event(E, e, "event_destroy");
  if (st) return st;
  pthread_mutex_lock(&E->mu);
  if (e->prev) e->prev->next = e->next;
  else E->events = e->next;
  if (e->next) e->next->prev = e->prev;
  if (e->s) stream_unref(e->s);      /* waits already queued hold their own reference */
  e->magic = 0;
  pthread_mutex_unlock(&E->mu);
  free(e);
  return EM_OK;
}

em_status emi_emu_event_record(emk_runtime *rt, emk_event *e, emk_stream *s) {
  emu *E = emu_of(rt);
  em_status st = check_event(E, e, "event_record");
  if (!st) st = check_stream(E, s, "event_record");
  if (st) return st;
  if (e->dev != s->dev)
    return emi_emu_fail(E, EM_ERR_DEVICE, "event_record: an event of cuda:%d on stream %u of "
                        "cuda:%d", e->dev, s->id, s->dev);
  emu_item *it = new_item(E, IT_MARKER, 0, "event_record");
  if (!it) return EM_ERR_NOMEM;
  unsigned long long seq;
  if ((st = enqueue(E, s, it, &seq))) return st;
  pthread_mutex_lock(&E->mu);
  stream_ref(s);
  if (e->s) stream_unref(e->s);
  e->s = s;
  e->target = seq;
  pthread_mutex_unlock(&E->mu);
  return EM_OK;
}

/* The event's point, with a reference on its stream (NULL: never recorded). */
static emk_stream *event_point(emu *E, emk_event *e, unsigned long long *target) {
  pthread_mutex_lock(&E->mu);
  emk_stream *s = e->s;
  *target = e->target;
  if (s) stream_ref(s);
  pthread_mutex_unlock(&E->mu);
  return s;
}

em_status emi_emu_stream_wait_event(emk_runtime *rt, emk_stream *s, emk_event *e) {
  emu *E = emu_of(rt);
  em_status st = check_stream(E, s, "stream_wait_event");
  if (!st) st = check_event(E, e, "stream_wait_event");
  if (st) return st;
  unsigned long long target;
  emk_stream *w = event_point(E, e, &target);
  if (!w) return pending(E, s);   /* never recorded: nothing to wait for */
  emu_item *it = new_item(E, IT_WAIT, 0, "stream_wait_event");
  if (!it) {
    stream_unref_locked(E, w);
    return EM_ERR_NOMEM;
  }
  it->u.wait.s = w;               /* the item owns the reference now */
  it->u.wait.target = target;
  if ((st = enqueue(E, s, it, NULL))) stream_unref_locked(E, w);
  return st;
}

em_status emi_emu_event_query(emk_runtime *rt, emk_event *e, int *done) {
  emu *E = emu_of(rt);
  em_status st = check_event(E, e, "event_query");
  if (st) return st;
  if (!done) return emi_emu_fail(E, EM_ERR_ARG, "event_query: no output (NULL)");
  unsigned long long target;
  emk_stream *s = event_point(E, e, &target);
  *done = 1;
  if (!s) return EM_OK;
  pthread_mutex_lock(&s->mu);
  *done = s->completed >= target;
  if (*done) st = take_error(E, s, target);
  pthread_mutex_unlock(&s->mu);
  stream_unref_locked(E, s);
  return st;
}

em_status emi_emu_event_sync(emk_runtime *rt, emk_event *e) {
  emu *E = emu_of(rt);
  em_status st = check_event(E, e, "event_sync");
  if (!st) st = check_not_worker(E, "event_sync");
  if (st) return st;
  unsigned long long target;
  emk_stream *s = event_point(E, e, &target);
  if (!s) return EM_OK;
  pthread_mutex_lock(&s->mu);
  while (s->completed < target) pthread_cond_wait(&s->done_cv, &s->mu);
  st = take_error(E, s, target);
  pthread_mutex_unlock(&s->mu);
  stream_unref_locked(E, s);
  return st;
}

/* -- Graphs ---------------------------------------------------------------------------
** While a stream captures, enqueue() hands its items here instead of to the worker:
** kernels, memsets, device-to-device copies, copies from pinned host memory and
** queued work (GEMM) are kept, in
** order, in the graph; anything else spoils the capture with a message, which
** capture_end returns. A launch queues a copy of every kept item on the stream,
** so the worker runs them exactly as it would have (same pointers, same argument
** bytes), once per launch. */
struct emk_graph {
  emu_item *head, *tail;
  size_t items;
  em_status err;                   /* the first refusal while capturing */
  char errmsg[EMK_ERRMSG_SIZE];
};

static void graph_free(emk_graph *g) {
  while (g->head) {
    emu_item *next = g->head->next;
    free(g->head);
    g->head = next;
  }
  free(g);
}

/* Under s->mu: the capture is spoiled (the first reason is kept). */
static em_status refuse_while_capturing(emu *E, emk_stream *s, const char *what) {
  emk_graph *g = s->capture;
  if (!g->err) {
    g->err = EM_ERR_UNSUPPORTED;
    snprintf(g->errmsg, sizeof g->errmsg, "cuda:%d stream %u is capturing a graph: %s "
             "can't be captured (only kernels, memsets, copies within device memory "
             "and from pinned memory can)", s->dev, s->id, what);
  }
  return emi_emu_fail(E, g->err, "%s", g->errmsg);
}

/* Under s->mu. Takes it (kept or freed). */
static em_status capture_item(emu *E, emk_stream *s, emu_item *it) {
  const char *refused = NULL;
  switch (it->kind) {
  case IT_KERNEL: case IT_MEMSET: case IT_WORK: break;
  case IT_COPY:       /* from pinned memory, as CUDA allows: the graph's constants */
    if (it->u.copy.kind == EMK_DEVICE_TO_HOST ||
        (it->u.copy.kind == EMK_HOST_TO_DEVICE &&
         !emi_emu_is_pinned(E, it->u.copy.src, it->u.copy.n)))
      refused = it->u.copy.kind == EMK_DEVICE_TO_HOST ? "a copy to the host"
                                                      : "a copy from pageable host memory";
    break;
  case IT_CALLBACK: refused = "a host callback"; break;
  case IT_MARKER: refused = "an event record"; break;
  case IT_WAIT: refused = "a wait for another stream's event"; break;
  }
  if (refused) {
    free(it);
    return refuse_while_capturing(E, s, refused);
  }
  emk_graph *g = s->capture;
  it->next = NULL;
  if (g->tail) g->tail->next = it;
  else g->head = it;
  g->tail = it;
  g->items++;
  return EM_OK;
}

em_status emi_emu_capture_begin(emk_runtime *rt, emk_stream *s) {
  emu *E = emu_of(rt);
  em_status st = check_stream(E, s, "capture_begin");
  if (st) return st;
  emk_graph *g = calloc(1, sizeof *g);
  if (!g) return emi_emu_fail(E, EM_ERR_NOMEM, "capture_begin: out of host memory");
  pthread_mutex_lock(&s->mu);
  if (s->capture) {
    pthread_mutex_unlock(&s->mu);
    free(g);
    return emi_emu_fail(E, EM_ERR_ARG, "capture_begin: cuda:%d stream %u is already "
                        "capturing", s->dev, s->id);
  }
  s->capture = g;
  pthread_mutex_unlock(&s->mu);
  return EM_OK;
}

em_status emi_emu_capture_end(emk_runtime *rt, emk_stream *s, emk_graph **out) {
  emu *E = emu_of(rt);
  *out = NULL;
  em_status st = check_stream(E, s, "capture_end");
  if (st) return st;
  pthread_mutex_lock(&s->mu);
  emk_graph *g = s->capture;
  s->capture = NULL;
  pthread_mutex_unlock(&s->mu);
  if (!g)
    return emi_emu_fail(E, EM_ERR_ARG, "capture_end: cuda:%d stream %u is not capturing",
                        s->dev, s->id);
  if (g->err) {
    st = emi_emu_fail(E, g->err, "%s", g->errmsg);
    graph_free(g);
    return st;
  }
  *out = g;
  return EM_OK;
}

em_status emi_emu_graph_launch(emk_runtime *rt, emk_graph *g, emk_stream *s) {
  emu *E = emu_of(rt);
  em_status st = check_stream(E, s, "graph_launch");
  if (st) return st;
  if (!g) return emi_emu_fail(E, EM_ERR_ARG, "graph_launch: no graph (NULL)");
  for (emu_item *it = g->head; it; it = it->next) {
    emu_item *copy = malloc(it->size);
    if (!copy) return emi_emu_fail(E, EM_ERR_NOMEM, "graph_launch: out of host memory");
    memcpy(copy, it, it->size);
    if ((st = enqueue(E, s, copy, NULL))) return st;
  }
  return EM_OK;
}

em_status emi_emu_graph_destroy(emk_runtime *rt, emk_graph *g) {
  (void)rt;
  if (g) graph_free(g);
  return EM_OK;
}

/*
** comm.c -- the public em_comm_* calls and what every backend shares: argument
** checks, staging of strided tensors, the work queue and the comm thread, work
** handles, and failure (see comm.h for the model).
**
** Why one thread per communicator rather than running collectives on the
** caller's thread: gradient buckets are allreduced while backward goes on
** computing, and MPI's non-blocking collectives only progress while somebody
** calls into MPI. The comm thread is that somebody, and as it runs the items in
** call order, every replica meets every collective in the same order without
** any further agreement.
**
** Device tensors (c->dev: commdev.c, nccl.c). The same queue and thread serve a
** communicator whose tensors live on a CUDA device: submission marks the
** compute stream (an event after the work that wrote the input), the comm thread
** waits for that mark before it reads, and a wait makes the compute stream wait
** for the collective's end before anything queued later reads the result. A
** backend that reads device memory itself (NCCL) does the middle part on the
** device; for the others (the host backends standing in for NCCL on emulated
** devices) the comm thread stages the buffers through host memory around run.
*/
#include "comm.h"
#include "../profile/profile.h"
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

/* One channel's counters of point-to-point (comm.h). */
struct emi_p2p_chan {
  int chan;
  struct emi_p2p_chan *next;
  uint64_t seq[];            /* [2 * size]: sends to / recvs from each peer */
};

const char *emi_coll_name(emi_coll_kind k) {
  static const char *names[] = {"allreduce", "broadcast", "allgather", "reduce_scatter",
                                "barrier", "send", "recv"};
  return names[k];
}

const char *emi_comm_who(char *buf, const em_comm *c, int rank) {
  if (c && c->world_of && rank >= 0 && rank < c->size)
    snprintf(buf, 64, "replica %d (world %d)", rank, c->world_of[rank]);
  else
    snprintf(buf, 64, "replica %d", rank);
  return buf;
}

const char *emi_coll_describe(char *buf, const em_comm_work *w) {
  char who[64];
  if (w->kind == EMI_COLL_SEND || w->kind == EMI_COLL_RECV)
    snprintf(buf, EMI_COMM_MSG, "%s #%llu %s %s (%s x %lld)", emi_coll_name(w->kind),
             (unsigned long long)w->seq, w->kind == EMI_COLL_SEND ? "to" : "from",
             emi_comm_who(who, w->comm, w->peer), em_dtype_name(w->dtype),
             (long long)w->count);
  else if (w->kind == EMI_COLL_BARRIER)
    snprintf(buf, EMI_COMM_MSG, "barrier #%llu", (unsigned long long)w->seq);
  else
    snprintf(buf, EMI_COMM_MSG, "%s #%llu (%s x %lld)", emi_coll_name(w->kind),
             (unsigned long long)w->seq, em_dtype_name(w->dtype), (long long)w->count);
  return buf;
}

void emi_comm_fail(em_comm *c, int own, const char *fmt, ...) {
  pthread_mutex_lock(&c->mu);
  int first = !c->failed;
  if (first) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->failure, sizeof c->failure, fmt, ap);
    va_end(ap);
    __atomic_store_n(&c->failed, 1, __ATOMIC_RELEASE);
  }
  pthread_cond_broadcast(&c->cv);
  pthread_mutex_unlock(&c->mu);
  if (first && c->be->abort_notify) c->be->abort_notify(c, own);
}

/* -- The comm thread ------------------------------------------------------------- */

static void profile_collective(em_comm *c, const em_comm_work *w);

/* The item is the waiter's once done is set (it may free it at once), so the
** profiler reads it before. */
static int is_p2p(const em_comm_work *w) {
  return w->kind == EMI_COLL_SEND || w->kind == EMI_COLL_RECV;
}

static void profile_p2p(em_comm *c, const em_comm_work *w);

static void finish(em_comm *c, em_comm_work *w, em_status st) {
  w->t_end = emi_now();
  if (!st && emi_profiler_of(c->S)) {
    if (is_p2p(w)) profile_p2p(c, w);
    else profile_collective(c, w);
  }
  pthread_mutex_lock(&c->mu);
  w->status = st;
  w->done = 1;
  pthread_cond_broadcast(&c->cv);
  pthread_mutex_unlock(&c->mu);
}

static int64_t work_bytes(const em_comm_work *w) {
  return w->count * (int64_t)em_dtype_size(w->dtype);
}

/* Test-only (EMBER_TEST_COMM_GBPS): stretches a collective so that its bytes move
** at no more than the given rate once every replica is there, as a slow link would. */
static void cap_bandwidth(em_comm *c, em_comm_work *w) {
  double until = w->t_ready + (double)work_bytes(w) * 8 / (c->test_gbps * 1e9);
  double left = until - emi_now();
  if (left <= 0) return;
  struct timespec ts = {(time_t)left, (long)((left - (double)(time_t)left) * 1e9)};
  nanosleep(&ts, NULL);
}

/* The collective on the comm thread's track: how long it waited for the other
** replicas (t_begin to t_ready) and moved data (to t_end); flow = its sequence
** number, which the reducer's BUCKET_READY mark shares. */
static void profile_collective(em_comm *c, const em_comm_work *w) {
  em_profile_event ev;
  memset(&ev, 0, sizeof ev);
  ev.t0 = w->t_begin;
  ev.t1 = w->t_end;
  ev.name = emi_coll_name(w->kind);
  ev.kind = EM_PROF_COLLECTIVE;
  ev.dtype = w->dtype;
  ev.device = EM_CPU;
  ev.ndim = 1;
  ev.sizes[0] = w->count;
  ev.bytes = work_bytes(w);
  ev.flow = (int64_t)w->seq;
  ev.wait = w->t_ready - w->t_begin;
  ev.arg0 = c->size;
  emi_profile_record(emi_profiler_of(c->S), &ev);
}

/* "send #3 to 1" / "recv #3 from 0": the pair's own numbering (comm.h). */
static const char *p2p_name(char *buf, size_t n, const em_comm_work *w) {
  snprintf(buf, n, "%s #%llu %s %d", emi_coll_name(w->kind), (unsigned long long)w->seq,
           w->kind == EMI_COLL_SEND ? "to" : "from", w->peer);
  return buf;
}

/* A send or recv is a communication event like a collective, on this
** communicator's comm track (emi_comm_p2p_done sees that it is recorded
** there): t_begin is when it was posted, wait the part before the peer was
** there, flow 0 (no gradient bucket launched it), arg1 the peer. */
static void profile_p2p(em_comm *c, const em_comm_work *w) {
  struct emi_profiler *p = emi_profiler_of(c->S);
  if (!p) return;
  char name[64];
  em_profile_event ev;
  memset(&ev, 0, sizeof ev);
  ev.t0 = w->t_begin;
  ev.t1 = w->t_end;
  ev.name = emi_profile_intern(p, p2p_name(name, sizeof name, w));
  ev.kind = EM_PROF_COLLECTIVE;
  ev.dtype = w->dtype;
  ev.device = EM_CPU;
  ev.ndim = 1;
  ev.sizes[0] = w->count;
  ev.bytes = work_bytes(w);
  ev.wait = w->t_ready > w->t_begin ? w->t_ready - w->t_begin : 0;
  ev.arg0 = c->size;
  ev.arg1 = w->peer;
  emi_profile_record(p, &ev);
}

/* Comm thread, c->mu held (released meanwhile): finishes the sends and recvs
** that other threads handed over. */
static void finish_handed(em_comm *c) {
  em_comm_work *w = c->p2p_fin;
  c->p2p_fin = NULL;
  pthread_mutex_unlock(&c->mu);
  while (w) {
    em_comm_work *next = w->p2p_next;
    finish(c, w, w->status);
    w = next;
  }
  pthread_mutex_lock(&c->mu);
}

/* One collective. On a device communicator whose backend moves host memory,
** the device buffers are staged around it: wait for the compute stream's mark,
** copy in, run, copy back (and mark the communicator's stream for the caller's join). */
static em_status run_one(em_comm *c, em_comm_work *w) {
  if (!c->dev || c->be->device_native || !w->dev_in) return c->be->run(c, w);
  em_status st = emi_commdev_wait_mark(c, w);
  if (!st) st = emi_commdev_stage_in(c, w);
  if (!st) st = c->be->run(c, w);
  if (!st) st = emi_commdev_stage_out(c, w);
  return st;
}

/* A send or recv may end on another thread (a local group's peer that posted
** the match). While profiling, it is handed to this communicator's own thread
** to finish, so that its event is on this replica's comm track and recorded
** before its waiter goes on (and, say, stops the profiler). */
void emi_comm_p2p_done(em_comm_work *w, em_status st) {
  em_comm *c = w->comm;
  int hand = emi_profiler_of(c->S) && !pthread_equal(pthread_self(), c->thread);
  pthread_mutex_lock(&c->mu);
  c->p2p_pending--;
  if (hand) {               /* one step with the count: the thread ends on neither */
    w->status = st;
    w->p2p_next = c->p2p_fin;
    c->p2p_fin = w;
    pthread_cond_broadcast(&c->cv);
  }
  pthread_mutex_unlock(&c->mu);
  if (!hand) finish(c, w, st);
}

/* Posts a send or recv (comm thread): it stays pending unless it failed at once. */
static void post_p2p(em_comm *c, em_comm_work *w, int failed) {
  w->t_begin = w->t_ready = emi_now();
  pthread_mutex_lock(&c->mu);
  c->p2p_pending++;
  pthread_mutex_unlock(&c->mu);
  em_status st = EM_ERR_IO;
  if (!failed) st = c->be->p2p_post(c, w);
  if (!st) return;
  if (emi_comm_failed(c) && !w->errmsg[0]) {
    pthread_mutex_lock(&c->mu);
    snprintf(w->errmsg, sizeof w->errmsg, "%s", c->failure);
    pthread_mutex_unlock(&c->mu);
  }
  emi_comm_p2p_done(w, st);
}

static void *comm_thread(void *arg) {
  em_comm *c = arg;
  emi_profile_thread_label("comm", 0);
  pthread_mutex_lock(&c->mu);
  for (;;) {
    while (!c->head && !c->stopping && !c->p2p_fin) {
      if (c->be->idle || c->p2p_pending) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        long ns = ts.tv_nsec + (long)(EMI_COMM_IDLE_S * 1e9);
        ts.tv_sec += ns / 1000000000L;
        ts.tv_nsec = ns % 1000000000L;
        if (pthread_cond_timedwait(&c->cv, &c->mu, &ts) == ETIMEDOUT && !c->head) {
          int pending = c->p2p_pending;
          pthread_mutex_unlock(&c->mu);
          if (c->be->idle) c->be->idle(c);
          if (pending) c->be->p2p_progress(c, 0);
          pthread_mutex_lock(&c->mu);
        }
      } else {
        pthread_cond_wait(&c->cv, &c->mu);
      }
    }
    if (c->p2p_fin) {
      finish_handed(c);
      continue;
    }
    if (!c->head) {                           /* stopping, queue drained */
      if (!c->p2p_pending) break;
      pthread_mutex_unlock(&c->mu);
      c->be->p2p_progress(c, 1);              /* fails every pending send / recv */
      pthread_mutex_lock(&c->mu);
      continue;
    }
    if (is_p2p(c->head)) {
      em_comm_work *w = c->head;
      c->head = w->next;
      if (!c->head) c->tail = NULL;
      int failed = c->failed;
      pthread_mutex_unlock(&c->mu);
      post_p2p(c, w, failed);
      pthread_mutex_lock(&c->mu);
      continue;
    }
    /* One collective at a time, in queue order: every replica runs the same
    ** sequence, whatever its timing (nccl.c: why NCCL must not see batches). */
    em_comm_work *w = c->head;
    c->head = w->next;
    if (!c->head) c->tail = NULL;
    int failed = c->failed;
    pthread_mutex_unlock(&c->mu);
    w->t_begin = w->t_ready = emi_now();
    em_status st = EM_ERR_IO;
    if (!failed) {
      st = run_one(c, w);
      if (!st && c->test_gbps > 0) cap_bandwidth(c, w);
    }
    if (st && emi_comm_failed(c)) {           /* the communicator's failure says it best */
      pthread_mutex_lock(&c->mu);
      snprintf(w->errmsg, sizeof w->errmsg, "%s", c->failure);
      pthread_mutex_unlock(&c->mu);
    }
    finish(c, w, st);
    pthread_mutex_lock(&c->mu);
    if (c->p2p_pending) {
      pthread_mutex_unlock(&c->mu);
      c->be->p2p_progress(c, 0);
      pthread_mutex_lock(&c->mu);
    }
  }
  pthread_mutex_unlock(&c->mu);
  if (c->be->thread_stop) c->be->thread_stop(c);
  return NULL;
}

struct start_ctx { em_comm *c; em_status st; char err[EMI_COMM_MSG]; int ready; };

static void *comm_thread_entry(void *arg) {
  struct start_ctx *sc = arg;
  em_comm *c = sc->c;
  em_status st = c->be->thread_start ? c->be->thread_start(c, sc->err) : EM_OK;
  pthread_mutex_lock(&c->mu);
  sc->st = st;
  sc->ready = 1;
  pthread_cond_broadcast(&c->cv);
  pthread_mutex_unlock(&c->mu);
  if (st) return NULL;                     /* sc belongs to the creator from here */
  return comm_thread(c);
}

em_status emi_comm_new(em_state *S, const emi_comm_backend *be, void *impl, int rank,
                       int size, double timeout_s, em_comm **out) {
  return emi_comm_new_dev(S, be, impl, rank, size, timeout_s, NULL, out);
}

em_status emi_comm_new_dev(em_state *S, const emi_comm_backend *be, void *impl, int rank,
                           int size, double timeout_s, struct emi_commdev *dev,
                           em_comm **out) {
  *out = NULL;
  em_comm *c = calloc(1, sizeof *c);
  if (!c) return emi_error(S, EM_ERR_NOMEM, "comm: out of memory");
  c->S = S;
  c->be = be;
  c->impl = impl;
  c->dev = dev;
  const char *cap = getenv("EMBER_TEST_COMM_GBPS");
  c->test_gbps = cap ? atof(cap) : 0;
  c->rank = rank;
  c->size = size;
  c->timeout_s = timeout_s > 0 ? timeout_s : 300;
  c->next_seq = 1;
  c->next_chan = EMI_CHAN_FIRST_GROUP;
  pthread_mutex_init(&c->mu, NULL);
  pthread_cond_init(&c->cv, NULL);
  struct start_ctx sc = {.c = c};
  /* The thread blocks every signal: Ctrl-C stays with the host's threads. */
  sigset_t all, old;
  sigfillset(&all);
  pthread_sigmask(SIG_SETMASK, &all, &old);
  int rc = pthread_create(&c->thread, NULL, comm_thread_entry, &sc);
  pthread_sigmask(SIG_SETMASK, &old, NULL);
  if (rc) {
    pthread_cond_destroy(&c->cv);
    pthread_mutex_destroy(&c->mu);
    free(c);
    return emi_error(S, EM_ERR_NOMEM, "comm: could not start the communicator's thread");
  }
  pthread_mutex_lock(&c->mu);
  while (!sc.ready) pthread_cond_wait(&c->cv, &c->mu);
  pthread_mutex_unlock(&c->mu);
  if (sc.st) {
    pthread_join(c->thread, NULL);
    pthread_cond_destroy(&c->cv);
    pthread_mutex_destroy(&c->mu);
    free(c);
    return emi_error(S, sc.st, "%s", sc.err);
  }
  c->thread_started = 1;
  *out = c;
  return EM_OK;
}

void em_comm_free(em_comm *c) {
  if (!c) return;
  pthread_mutex_lock(&c->mu);
  c->stopping = 1;
  pthread_cond_broadcast(&c->cv);
  pthread_mutex_unlock(&c->mu);
  if (c->be->abort_notify && emi_comm_failed(c)) c->be->abort_notify(c, 0);
  if (c->thread_started) pthread_join(c->thread, NULL);
  if (c->be->destroy) c->be->destroy(c);
  if (c->dev) emi_commdev_close(c->dev);
  pthread_cond_destroy(&c->cv);
  pthread_mutex_destroy(&c->mu);
  while (c->chans) {
    struct emi_p2p_chan *k = c->chans;
    c->chans = k->next;
    free(k);
  }
  free(c);
}

int em_comm_rank(const em_comm *c) { return c ? c->rank : 0; }
int em_comm_size(const em_comm *c) { return c ? c->size : 1; }
const char *em_comm_backend(const em_comm *c) {
  return !c ? "none" : c->label ? c->label : c->be->name;
}

void em_comm_abort(em_comm *c, const char *message) {
  if (!c) return;
  char who[64];
  emi_comm_fail(c, 1, "%s failed: %s", emi_comm_who(who, c, c->rank),
                message ? message : "aborted");
}

em_status em_comm_status(em_state *S, em_comm *c) {
  if (!c) return emi_error(S, EM_ERR_ARG, "comm: NULL communicator");
  if (!emi_comm_failed(c)) return EM_OK;
  pthread_mutex_lock(&c->mu);
  emi_error(S, EM_ERR_IO, "%s", c->failure);
  pthread_mutex_unlock(&c->mu);
  return EM_ERR_IO;
}

/* -- Submitting work ------------------------------------------------------------------ */

static em_status check_comm_tensor(em_state *S, const char *op, em_comm *c,
                                   const em_tensor *t, int any_dtype) {
  em_status st = emi_check_tensor(S, op, t);
  if (st) return st;
  if (!c) return emi_error(S, EM_ERR_ARG, "%s: NULL communicator", op);
  /* a device communicator takes its device's tensors and CPU ones (checksums,
  ** metrics: those go through the host communicator) */
  int want = c->dev ? emi_commdev_device(c->dev) : EM_CPU;
  if (t->device != want && t->device != EM_CPU) {
    char b[16], b2[16];
    return emi_error(S, EM_ERR_DEVICE, "%s: the %s communicator takes tensors on %s%s, got "
                     "one on %s", op, em_comm_backend(c), emi_device_name(b2, want),
                     c->dev ? " or the CPU" : "", emi_device_name(b, t->device));
  }
  if (any_dtype) return EM_OK;   /* send / recv move bytes: uint8 and bool too */
  switch (t->dtype) {
  case EM_FLOAT32: case EM_FLOAT64: case EM_FLOAT16: case EM_BFLOAT16: case EM_INT32:
  case EM_INT64: return EM_OK;
  default:
    return emi_error(S, EM_ERR_DTYPE, "%s: dtype %s is not supported (float32, float64, "
                     "float16, bfloat16, int32, int64)", op, em_dtype_name(t->dtype));
  }
}

static em_status check_op(em_state *S, const char *op, em_comm_op rop, em_dtype dt) {
  if ((int)rop < EM_COMM_SUM || rop > EM_COMM_MIN)
    return emi_error(S, EM_ERR_ARG, "%s: unknown reduction %d", op, (int)rop);
  if (rop == EM_COMM_MEAN && !em_dtype_is_floating(dt))
    return emi_error(S, EM_ERR_DTYPE, "%s: 'mean' needs a floating dtype, got %s (use 'sum')",
                     op, em_dtype_name(dt));
  return EM_OK;
}

static void work_release_tensors(em_comm_work *w) {
  em_tensor_release(w->in_t);
  em_tensor_release(w->out_t);
  em_tensor_release(w->user);
  w->in_t = w->out_t = w->user = NULL;
}

/* A contiguous tensor holding t's values: t itself (retained) when it already is. */
static em_status contiguous_of(em_state *S, const em_tensor *t, em_tensor **out) {
  if (em_tensor_is_contiguous(t)) {
    em_tensor_retain((em_tensor *)t);
    *out = (em_tensor *)t;
    return EM_OK;
  }
  return em_contiguous(S, t, out);
}

static void *tensor_bytes_at(const em_tensor *t) {
  return (char *)t->storage->data + t->offset * em_dtype_size(t->dtype);
}

/* Copies the result back into a strided user tensor (in-place collectives). */
static em_status work_copy_back(em_state *S, em_comm_work *w) {
  if (!w->user || w->status) return EM_OK;
  int was = em_is_grad_enabled(S);
  em_set_grad_enabled(S, 0);
  em_tensor *src = NULL;        /* a recv into a device tensor landed on the host */
  em_status st;
  if (w->stage_dev && w->user->device != EM_CPU) {   /* through pinned memory */
    em_tensor *u = w->user;
    int direct = em_tensor_is_contiguous(u);
    if (direct) src = u, em_tensor_retain(u);
    else st = emi_tensor_new(S, "recv", u->sizes, u->ndim, u->dtype, u->device, &src);
    if (direct || !st)
      st = emi_commdev_from_host(S, w->stage_dev, tensor_bytes_at(src), w->in,
                                 (size_t)w->count * em_dtype_size(w->dtype), "recv");
    if (!st && !direct) st = em_copy_(S, u, src);
  } else {
    st = em_to(S, w->in_t, w->in_t->dtype, w->user->device, &src);
    if (!st) st = em_copy_(S, w->user, src);
  }
  em_tensor_release(src);
  em_set_grad_enabled(S, was);
  return st;
}

/* -- Channels of point-to-point (comm.h) ----------------------------------------- */

/* Under c->mu: the channel's counters, made on first use (NULL: out of memory). */
static uint64_t *chan_seq_locked(em_comm *c, int chan) {
  for (struct emi_p2p_chan *k = c->chans; k; k = k->next)
    if (k->chan == chan) return k->seq;
  struct emi_p2p_chan *k = calloc(1, sizeof *k + 2 * (size_t)c->size * sizeof(uint64_t));
  if (!k) return NULL;
  k->chan = chan;
  k->next = c->chans;
  c->chans = k;
  return k->seq;
}

em_comm *emi_comm_p2p_carrier(em_comm *c) {
  em_comm *pc = c->be->p2p_post && !c->be->device_native ? c
              : c->be->p2p_via ? c->be->p2p_via(c) : NULL;
  return pc && pc->be->p2p_post ? pc : NULL;
}

em_status emi_comm_p2p_queue(em_comm *c, em_comm_work *w) {
  w->comm = c;
  w->done = 0;
  w->next = NULL;
  pthread_mutex_lock(&c->mu);
  uint64_t *seq = chan_seq_locked(c, w->chan);
  if (!seq) {
    pthread_mutex_unlock(&c->mu);
    return EM_ERR_NOMEM;
  }
  w->seq = ++seq[2 * w->peer + (w->kind == EMI_COLL_RECV)];
  if (c->be->p2p_any_thread) {
    int failed = c->failed;
    pthread_mutex_unlock(&c->mu);
    post_p2p(c, w, failed);
    pthread_mutex_lock(&c->mu);        /* the comm thread now polls it (timeouts) */
    pthread_cond_broadcast(&c->cv);
    pthread_mutex_unlock(&c->mu);
    return EM_OK;
  }
  if (c->tail) c->tail->next = w;
  else c->head = w;
  c->tail = w;
  pthread_cond_broadcast(&c->cv);
  pthread_mutex_unlock(&c->mu);
  return EM_OK;
}

static em_status submit(em_state *S, em_comm *c, em_comm_work *w, em_comm_work **work) {
  w->comm = c;
  /* a compiled step replays in-place collectives on CPU tensors (submit_inplace
  ** records them); the others would be skipped */
  if (S->recorder && ((w->kind != EMI_COLL_ALLREDUCE && w->kind != EMI_COLL_BROADCAST) ||
                      c->dev || w->user))
    emi_compile_unfit(S, "it runs a collective compiled steps do not replay (%s)",
                      c->dev ? "on a device communicator" : w->user ? "on a strided tensor"
                      : "a gather, scatter, barrier, send or receive: a sharded model's, say");
  if (c->dev && w->in_t && w->in_t->device != EM_CPU) {   /* where their values are final */
    w->dev_in = w->in;
    w->dev_out = w->out;
    em_status st = emi_commdev_mark(S, c->dev, w);
    if (st) {
      emi_commdev_release(c->dev, w);
      work_release_tensors(w);
      free(w);
      return st;
    }
  }
  pthread_mutex_lock(&c->mu);
  if (is_p2p(w))        /* the channel's counters exist: submit_p2p made them */
    w->seq = ++chan_seq_locked(c, w->chan)[2 * w->peer + (w->kind == EMI_COLL_RECV)];
  else
    w->seq = c->next_seq++;
  if (c->tail) c->tail->next = w;
  else c->head = w;
  c->tail = w;
  pthread_cond_broadcast(&c->cv);
  pthread_mutex_unlock(&c->mu);
  if (work) { *work = w; return EM_OK; }
  em_status st = em_comm_work_wait(S, w);
  em_comm_work_free(w);
  return st;
}

em_status emi_comm_call(em_comm *c, em_comm_work *w) {
  w->comm = c;
  pthread_mutex_lock(&c->mu);
  w->seq = c->next_seq++;
  if (c->tail) c->tail->next = w;
  else c->head = w;
  c->tail = w;
  pthread_cond_broadcast(&c->cv);
  while (!w->done) pthread_cond_wait(&c->cv, &c->mu);
  pthread_mutex_unlock(&c->mu);
  return w->status;
}

static em_comm_work *work_new(em_state *S, const char *op, emi_coll_kind kind) {
  em_comm_work *w = calloc(1, sizeof *w);
  if (!w) { emi_error(S, EM_ERR_NOMEM, "%s: out of memory", op); return NULL; }
  w->kind = kind;
  return w;
}

/* in place: allreduce and broadcast */
static em_status submit_inplace(em_state *S, const char *op, em_comm *c, em_tensor *t,
                                emi_coll_kind kind, em_comm_op rop, int root,
                                em_comm_work **work) {
  if (work) *work = NULL;
  em_status st = check_comm_tensor(S, op, c, t, 0);
  if (st) return st;
  if (kind == EMI_COLL_ALLREDUCE && (st = check_op(S, op, rop, t->dtype))) return st;
  if (kind == EMI_COLL_BROADCAST && (root < 0 || root >= c->size))
    return emi_error(S, EM_ERR_ARG, "%s: root %d is not a rank of this job (0..%d)", op, root,
                     c->size - 1);
  if ((st = em_comm_status(S, c))) return st;
  em_comm_work *w = work_new(S, op, kind);
  if (!w) return EM_ERR_NOMEM;
  if ((st = contiguous_of(S, t, &w->in_t))) { free(w); return st; }
  if (w->in_t != t) { em_tensor_retain(t); w->user = t; }
  w->op = rop;
  w->root = root;
  w->dtype = t->dtype;
  w->count = t->numel;
  w->in = w->out = (char *)w->in_t->storage->data + w->in_t->offset * em_dtype_size(t->dtype);
  em_comm_work *mine = NULL;
  if ((st = submit(S, c, w, &mine))) return st;
  if (S->recorder && !c->dev && w->in_t == t)   /* (a compiled step replays it) */
    emi_compile_note_collective(S, c, t, kind == EMI_COLL_BROADCAST, rop, root, mine);
  if (work) { *work = mine; return EM_OK; }
  st = em_comm_work_wait(S, mine);
  em_comm_work_free(mine);
  return st;
}

em_status em_comm_allreduce(em_state *S, em_comm *c, em_tensor *t, em_comm_op op,
                            em_comm_work **work) {
  return submit_inplace(S, "allreduce", c, t, EMI_COLL_ALLREDUCE, op, 0, work);
}

em_status em_comm_broadcast(em_state *S, em_comm *c, em_tensor *t, int root,
                            em_comm_work **work) {
  return submit_inplace(S, "broadcast", c, t, EMI_COLL_BROADCAST, EM_COMM_SUM, root, work);
}

/* allgather and reduce_scatter: a new output */
static em_status submit_out(em_state *S, const char *op, em_comm *c, const em_tensor *t,
                            emi_coll_kind kind, em_comm_op rop, em_tensor **out,
                            em_comm_work **work) {
  if (work) *work = NULL;
  em_status st = check_comm_tensor(S, op, c, t, 0);
  if (st) return st;
  if (!out) return emi_error(S, EM_ERR_ARG, "%s: NULL output", op);
  *out = NULL;
  if (kind == EMI_COLL_REDUCE_SCATTER && (st = check_op(S, op, rop, t->dtype))) return st;
  int64_t sizes[EM_MAX_DIMS];
  int nd = t->ndim > 0 ? t->ndim : 1;
  for (int d = 0; d < nd; d++) sizes[d] = t->ndim > 0 ? t->sizes[d] : 1;
  if (kind == EMI_COLL_ALLGATHER) {
    sizes[0] *= c->size;
  } else {
    if (t->ndim == 0 || sizes[0] % c->size != 0)
      return emi_error(S, EM_ERR_SHAPE, "%s: dimension %lld of a tensor of shape %s does "
                       "not split into %d equal parts (one per replica)", op, emi_ix(S, 0),
                       emi_tshape(S, t), c->size);
    sizes[0] /= c->size;
  }
  if ((st = em_comm_status(S, c))) return st;
  em_comm_work *w = work_new(S, op, kind);
  if (!w) return EM_ERR_NOMEM;
  if ((st = contiguous_of(S, t, &w->in_t))) { free(w); return st; }
  if ((st = emi_tensor_new(S, op, sizes, nd, t->dtype, t->device, &w->out_t))) {
    work_release_tensors(w);
    free(w);
    return st;
  }
  size_t es = em_dtype_size(t->dtype);
  w->op = rop;
  w->dtype = t->dtype;
  w->count = t->numel;
  w->in = (char *)w->in_t->storage->data + w->in_t->offset * es;
  w->out = (char *)w->out_t->storage->data;
  em_tensor_retain(w->out_t);
  *out = w->out_t;
  st = submit(S, c, w, work);
  if (st) { em_tensor_release(*out); *out = NULL; }
  return st;
}

em_status em_comm_allgather(em_state *S, em_comm *c, const em_tensor *t, em_tensor **out,
                            em_comm_work **work) {
  return submit_out(S, "allgather", c, t, EMI_COLL_ALLGATHER, EM_COMM_SUM, out, work);
}

em_status em_comm_reduce_scatter(em_state *S, em_comm *c, const em_tensor *t,
                                 em_comm_op op, em_tensor **out, em_comm_work **work) {
  return submit_out(S, "reduce_scatter", c, t, EMI_COLL_REDUCE_SCATTER, op, out, work);
}

em_status em_comm_barrier(em_state *S, em_comm *c, em_comm_work **work) {
  if (work) *work = NULL;
  if (!c) return emi_error(S, EM_ERR_ARG, "barrier: NULL communicator");
  em_status st = em_comm_status(S, c);
  if (st) return st;
  em_comm_work *w = work_new(S, "barrier", EMI_COLL_BARRIER);
  if (!w) return EM_ERR_NOMEM;
  w->dtype = EM_FLOAT32;
  return submit(S, c, w, work);
}

/* send and recv: the tensor travels in place (a recv into a strided tensor lands
** in a contiguous copy first, copied back at the wait, as an allreduce's does).
** On a backend that reads device memory itself (NCCL on real GPUs) a device
** tensor stays there: ncclSend / ncclRecv, ordered by the same events as a
** collective; its CPU tensors go through its host communicator (p2p_via).
** Elsewhere device tensors are staged through host memory on this thread: a
** send copies its tensor to the host now (after the work that wrote it), a
** recv copies into its tensor at the wait -- both through the device
** communicator's pinned buffer (commdev.c, "Why pinned, always"). */
static em_status submit_p2p(em_state *S, const char *op, em_comm *c, em_tensor *t, int peer,
                            emi_coll_kind kind, em_comm_work **work) {
  if (work) *work = NULL;
  em_status st = check_comm_tensor(S, op, c, t, 1);
  if (st) return st;
  /* a real GPU's device tensor goes by NCCL itself; everything else by the host
  ** communicator that carries this one's point-to-point */
  int native = c->dev && c->be->device_native && t->device != EM_CPU && c->be->p2p_post;
  em_comm *pc = native ? c : emi_comm_p2p_carrier(c);
  emi_commdev *cd = c->dev;
  if (!pc)
    return emi_error(S, EM_ERR_UNSUPPORTED, "%s: the %s communicator has no point-to-point "
                     "(the local and mpi ones have)", op, em_comm_backend(c));
  if (peer < 0 || peer >= c->size || peer == c->rank)
    return emi_error(S, EM_ERR_ARG, "%s: peer %d is not another rank of this job (0..%d, "
                     "this one is %d)", op, peer, c->size - 1, c->rank);
  if ((st = em_comm_status(S, c)) || (pc != c && (st = em_comm_status(S, pc)))) return st;
  c = pc;
  pthread_mutex_lock(&c->mu);
  int ok = chan_seq_locked(c, EMI_CHAN_USER) != NULL;
  pthread_mutex_unlock(&c->mu);
  if (!ok) return emi_error(S, EM_ERR_NOMEM, "%s: out of memory", op);
  em_comm_work *w = work_new(S, op, kind);
  if (!w) return EM_ERR_NOMEM;
  if (t->device == EM_CPU || native) {
    st = contiguous_of(S, t, &w->in_t);
  } else if (kind == EMI_COLL_SEND && cd) {
    /* its values as the compute stream leaves them, through pinned memory */
    em_tensor *dc = NULL;
    if (!(st = contiguous_of(S, t, &dc)) &&
        !(st = emi_tensor_new(S, op, t->sizes, t->ndim, t->dtype, EM_CPU, &w->in_t)))
      st = emi_commdev_to_host(S, cd, tensor_bytes_at(w->in_t), tensor_bytes_at(dc),
                               (size_t)t->numel * em_dtype_size(t->dtype), op);
    em_tensor_release(dc);
  } else if (kind == EMI_COLL_SEND) {
    em_tensor *h = NULL;
    if (!(st = em_to(S, t, t->dtype, EM_CPU, &h))) st = contiguous_of(S, h, &w->in_t);
    em_tensor_release(h);
  } else {
    st = emi_tensor_new(S, op, t->sizes, t->ndim, t->dtype, EM_CPU, &w->in_t);
  }
  if (st) { free(w); return st; }
  if (kind == EMI_COLL_RECV && w->in_t != t) {
    em_tensor_retain(t);
    w->user = t;
    if (t->device != EM_CPU && !native) w->stage_dev = cd;
  }
  w->peer = peer;
  w->dtype = t->dtype;
  w->count = t->numel;
  w->in = w->out = (char *)w->in_t->storage->data + w->in_t->offset * em_dtype_size(t->dtype);
  return submit(S, c, w, work);
}

em_status em_comm_send(em_state *S, em_comm *c, const em_tensor *t, int peer,
                       em_comm_work **work) {
  return submit_p2p(S, "send", c, (em_tensor *)t, peer, EMI_COLL_SEND, work);
}

em_status em_comm_recv(em_state *S, em_comm *c, em_tensor *t, int peer, em_comm_work **work) {
  return submit_p2p(S, "recv", c, t, peer, EMI_COLL_RECV, work);
}

/* -- Handles ---------------------------------------------------------------------------- */

/* The caller blocked on a collective from t0 to t1: exposed communication; the
** part of it before every replica was there is time spent waiting for peers. */
static void profile_wait(em_state *S, const em_comm_work *w, double t0, double t1) {
  em_profile_event ev;
  memset(&ev, 0, sizeof ev);
  ev.t0 = t0;
  ev.t1 = t1;
  ev.name = emi_coll_name(w->kind);
  if (is_p2p(w)) {
    char b[64];
    ev.name = emi_profile_intern(S->profiler, p2p_name(b, sizeof b, w));
  }
  ev.kind = EM_PROF_COMM_WAIT;
  ev.device = EM_CPU;
  ev.bytes = work_bytes(w);
  ev.flow = is_p2p(w) ? 0 : (int64_t)w->seq;
  double peers_end = w->t_ready < t1 ? w->t_ready : t1;
  double peers_begin = w->t_begin > t0 ? w->t_begin : t0;
  ev.wait = peers_end > peers_begin ? peers_end - peers_begin : 0;
  emi_profile_record(S->profiler, &ev);
}

em_status em_comm_work_wait(em_state *S, em_comm_work *w) {
  if (!w) return emi_error(S, EM_ERR_ARG, "wait: NULL work handle");
  if (S->recorder) emi_compile_note_wait(S, w);
  em_comm *c = w->comm;
  double t0 = S->profiler ? emi_now() : 0;
  pthread_mutex_lock(&c->mu);
  while (!w->done) pthread_cond_wait(&c->cv, &c->mu);
  pthread_mutex_unlock(&c->mu);
  if (S->profiler) profile_wait(S, w, t0, emi_now());
  if (w->status) return emi_error(S, w->status, "%s", w->errmsg);
  if (c->dev && w->dev_in) {       /* later work on the compute stream reads the result */
    em_status jst = emi_commdev_join(S, c->dev, w);
    if (jst) return jst;
  }
  em_status st = work_copy_back(S, w);
  em_tensor_release(w->user);       /* copied once: a second wait does not repeat it */
  w->user = NULL;
  return st;
}

em_status em_comm_work_test(em_state *S, em_comm_work *w, int *done) {
  if (!w || !done) return emi_error(S, EM_ERR_ARG, "test: NULL argument");
  em_comm *c = w->comm;
  pthread_mutex_lock(&c->mu);
  *done = w->done;
  pthread_mutex_unlock(&c->mu);
  return EM_OK;
}

void em_comm_work_free(em_comm_work *w) {
  if (!w) return;
  em_comm *c = w->comm;
  pthread_mutex_lock(&c->mu);
  while (!w->done) pthread_cond_wait(&c->cv, &c->mu);
  pthread_mutex_unlock(&c->mu);
  if (c->dev) emi_commdev_release(c->dev, w);
  work_release_tensors(w);
  free(w);
}

/*
** commdev.c -- the device side of a communicator whose tensors live on an
** accelerator device (comm.h, "Device communicators"): the events that order a
** collective against the device's compute stream, the communicator's own
** streams it runs on, host staging where the host communicator stands in, and the device's
** own collective engine (NCCL on real GPUs). Written on the device's services
** table (core/backend.h) alone.
**
** Why events and streams of its own. Ops only queue work: when the reducer
** hands a bucket to the communicator, the kernels that write its gradients may
** not have run yet. So the submitting thread records an event on the compute
** stream ("ready"), and nothing reads the bucket before that event is reached.
** The collective then runs on the communicator's collective stream, beside the
** compute stream that goes on with backward, and ends with a second event
** ("done"); the caller's wait makes the compute stream wait for it, so the
** optimizer's kernels, queued after the wait, read averaged gradients -- and the
** host thread never blocks on the device for the ordering.
**
** Streams per communicator. Each communicator makes its own two (stream_new,
** at open): one for its collectives (and the staging copies around them), one
** for its sends and recvs. A collective stuck on one communicator (a failed
** peer, until the abort) then holds up nothing of another's, nor their staging
** or waits; and a recv waiting for its peer's send does not hold up a
** collective or a later send queued after it on this replica (nccl.c, "Point-
** to-point on real GPUs", has the ordering rule that follows). Order between
** the two streams is the caller's: a collective that reads what a recv wrote
** waits for that recv first (em_comm_work_wait joins the compute stream to it,
** and the collective's mark is recorded there after).
**
** Bounded waits. The comm thread never blocks on the device without a limit: it
** polls the events (spinning at first, then naps of at most 200 us; see
** emi_poll_nap_s) and gives up when the communicator has
** failed (another replica died) or after the communicator's timeout (this
** device is stuck), so a dead GPU replica makes the others fail, never hang.
**
** Emulated devices. NCCL's stand-in is the host communicator (local group or
** MPI): the comm thread copies the input to pinned host memory on the
** collective stream after "ready", runs the host collective there, copies the
** result back on that stream and records "done" -- the same ordering as with
** NCCL. Sends and recvs there are staged on the caller's thread (comm.c),
** through a second pinned buffer (emi_commdev_to_host / from_host). With
** EMBER_NCCL_EMULATE=1 the device's engine is the stand-in NCCL of
** kernels/emu/nccl_emu.c instead: native() says 1 (emulated device memory is
** host memory, which it reads and writes in place from the stream) and
** nothing is staged, as on real GPUs.
**
** Why pinned, always. A copy between the device and pageable host memory is
** synchronous in CUDA and takes locks a cudaMalloc on another thread also takes;
** with one process of several GPU replicas, such a copy behind a collective on
** one thread and an allocation on another can deadlock (XLA met it: jax#11637).
** Copies to and from page-locked memory are plain stream work. Both buffers are
** reused, grow to the largest transfer (buckets and activations repeat) and are
** freed with the communicator.
*/
#include "comm.h"
#include <stdio.h>
#include <stdlib.h>
#include <sched.h>
#include <time.h>

struct emi_commdev {
  em_state *S;
  int device;
  emi_device *d;
  const emi_services *svc;
  int native;                /* the device's own engine (NCCL) reads device memory */
  void *host;                /* pinned staging, in then out (comm thread only) */
  size_t host_cap;
  emi_stream coll, p2p;      /* the communicator's own streams */
  int has_coll, has_p2p;
  pthread_mutex_t xfer_mu;   /* the callers' pinned staging of sends and recvs */
  void *xfer;
  size_t xfer_cap;
};

/* -- Opening -------------------------------------------------------------------- */

em_status emi_commdev_open(em_state *S, int device, emi_commdev **out) {
  *out = NULL;
  emi_device *d = device >= 0 ? emi_device_attach(S, device) : NULL;
  const emi_services *svc = d ? emi_services_of(S, device) : NULL;
  if (!svc)
    return emi_error(S, EM_ERR_DEVICE, "comm_nccl: no device cuda:%d (%s)", device,
                     S->kinds[0].ctx && (device < 0 || device >= emi_accel_count(S))
                         ? "not one of this state's devices" : emi_accel_why(S));
  emi_commdev *cd = calloc(1, sizeof *cd);
  if (!cd) return emi_error(S, EM_ERR_NOMEM, "comm_nccl: out of memory");
  cd->S = S;
  cd->device = device;
  cd->d = d;
  cd->svc = svc;
  cd->native = svc->native(d);
  pthread_mutex_init(&cd->xfer_mu, NULL);
  if (svc->stream_new(d, &cd->coll) || !(cd->has_coll = 1) || svc->stream_new(d, &cd->p2p)) {
    em_status st = emi_error(S, EM_ERR_DEVICE, "comm_nccl: cuda:%d: %s", device,
                             svc->errmsg(d));
    emi_commdev_close(cd);
    return st;
  }
  cd->has_p2p = 1;
  *out = cd;
  return EM_OK;
}

void emi_commdev_close(emi_commdev *cd) {
  if (!cd) return;
  /* stream_free waits for what is queued: a last copy back may still read the
  ** staging memory */
  if (cd->has_coll) cd->svc->stream_free(cd->d, cd->coll);
  if (cd->has_p2p) cd->svc->stream_free(cd->d, cd->p2p);
  if (cd->host) cd->svc->host_free(cd->d, cd->host);
  if (cd->xfer) cd->svc->host_free(cd->d, cd->xfer);
  pthread_mutex_destroy(&cd->xfer_mu);
  free(cd);
}

size_t emi_commdev_staging(const emi_commdev *cd, size_t *xfer) {
  if (xfer) *xfer = cd->xfer_cap;
  return cd->host_cap;
}

int emi_commdev_stream(const emi_commdev *cd, int p2p) { return p2p ? cd->p2p : cd->coll; }

/* A send's or recv's stream, or a collective's. */
static emi_stream stream_for(const emi_commdev *cd, const em_comm_work *w) {
  return w->kind == EMI_COLL_SEND || w->kind == EMI_COLL_RECV ? cd->p2p : cd->coll;
}

/* -- The callers' staging of sends and recvs (emulation) ----------------------------- */

/* The pinned buffer grown to n bytes (xfer_mu held). */
static em_status xfer_grow(em_state *S, emi_commdev *cd, size_t n, const char *op) {
  if (n <= cd->xfer_cap) return EM_OK;
  if (cd->xfer) cd->svc->host_free(cd->d, cd->xfer);
  cd->xfer = NULL;
  cd->xfer_cap = 0;
  if (cd->svc->host_alloc(cd->d, n, &cd->xfer))
    return emi_error(S, EM_ERR_NOMEM, "%s: cuda:%d: pinned staging of %zu bytes: %s", op,
                     cd->device, n, cd->svc->errmsg(cd->d));
  cd->xfer_cap = n;
  return EM_OK;
}

/* n bytes: device memory src (as the compute stream leaves it) into host
** memory dst, through the pinned buffer. */
em_status emi_commdev_to_host(em_state *S, emi_commdev *cd, void *dst, const void *src,
                              size_t n, const char *op) {
  if (!n) return EM_OK;
  pthread_mutex_lock(&cd->xfer_mu);
  em_status st = xfer_grow(S, cd, n, op);
  if (!st && (cd->svc->memcpy_async(cd->d, EMI_STREAM_COMPUTE, cd->xfer, src, n, EMI_COPY_D2H) ||
              cd->svc->stream_sync(cd->d, EMI_STREAM_COMPUTE)))
    st = emi_error(S, EM_ERR_DEVICE, "%s: cuda:%d: copy to the host: %s", op, cd->device,
                   cd->svc->errmsg(cd->d));
  if (!st) memcpy(dst, cd->xfer, n);
  pthread_mutex_unlock(&cd->xfer_mu);
  return st;
}

/* n bytes: host memory src into device memory dst, queued on the compute
** stream through the pinned buffer (waited for: the buffer is reused). */
em_status emi_commdev_from_host(em_state *S, emi_commdev *cd, void *dst, const void *src,
                                size_t n, const char *op) {
  if (!n) return EM_OK;
  pthread_mutex_lock(&cd->xfer_mu);
  em_status st = xfer_grow(S, cd, n, op);
  if (!st) {
    memcpy(cd->xfer, src, n);
    if (cd->svc->memcpy_async(cd->d, EMI_STREAM_COMPUTE, dst, cd->xfer, n, EMI_COPY_H2D) ||
        cd->svc->stream_sync(cd->d, EMI_STREAM_COMPUTE))
      st = emi_error(S, EM_ERR_DEVICE, "%s: cuda:%d: copy to the device: %s", op, cd->device,
                     cd->svc->errmsg(cd->d));
  }
  pthread_mutex_unlock(&cd->xfer_mu);
  return st;
}

int emi_commdev_device(const emi_commdev *cd) { return cd->device; }
int emi_commdev_native(const emi_commdev *cd) { return cd->native; }

/* -- The caller's side ------------------------------------------------------------ */

em_status emi_commdev_mark(em_state *S, emi_commdev *cd, em_comm_work *w) {
  emi_event *e = NULL;
  if (cd->svc->event_new(cd->d, EMI_STREAM_COMPUTE, &e))
    return emi_error(S, EM_ERR_DEVICE, "%s: cuda:%d: %s", emi_coll_name(w->kind), cd->device,
                     cd->svc->errmsg(cd->d));
  w->ev_ready = e;
  return EM_OK;
}

em_status emi_commdev_join(em_state *S, emi_commdev *cd, em_comm_work *w) {
  if (!w->ev_done) return EM_OK;
  if (cd->svc->event_wait(cd->d, EMI_STREAM_COMPUTE, w->ev_done))
    return emi_error(S, EM_ERR_DEVICE, "%s: cuda:%d: %s", emi_coll_name(w->kind), cd->device,
                     cd->svc->errmsg(cd->d));
  return EM_OK;
}

void emi_commdev_release(emi_commdev *cd, em_comm_work *w) {
  if (w->ev_ready) cd->svc->event_free(cd->d, w->ev_ready);
  if (w->ev_done) cd->svc->event_free(cd->d, w->ev_done);
  w->ev_ready = w->ev_done = NULL;
}

/* -- The comm thread's side -------------------------------------------------------- */

static em_status rt_failed(em_comm *c, em_comm_work *w, const char *step);

/* Polling an event, cheap for latency. A collective of a small bucket ends
** within tens of microseconds, and each microsecond the comm thread sleeps past
** its end is a microsecond the next collective (and the caller's wait) starts
** later: so the first EMI_POLL_SPIN_S only yield the core (another thread that
** wants it runs). After that a nap of a quarter of the time waited so far keeps
** the lateness within 25% of the wait, at least EMI_POLL_NAP_MIN_S (below that a
** nap costs its syscall for nothing) and at most EMI_POLL_NAP_MAX_S (a long
** collective is seen within 200 us; 5000 wake-ups a second cost nothing to
** speak of). */
#define EMI_POLL_SPIN_S 40e-6
#define EMI_POLL_NAP_MIN_S 10e-6
#define EMI_POLL_NAP_MAX_S 200e-6

double emi_poll_nap_s(double waited_s) {
  if (waited_s < EMI_POLL_SPIN_S) return 0;
  double s = waited_s / 4;
  if (s < EMI_POLL_NAP_MIN_S) return EMI_POLL_NAP_MIN_S;
  return s > EMI_POLL_NAP_MAX_S ? EMI_POLL_NAP_MAX_S : s;
}

static void nap(double s) {
  if (s <= 0) {
    sched_yield();
    return;
  }
  struct timespec ts = {0, (long)(s * 1e9)};
  nanosleep(&ts, NULL);
}

/* Polls event e until reached. The communicator's failure ends the wait at once;
** after the timeout this device is taken as stuck: this replica fails (own), so
** that the others hear it. poll (may be NULL) is asked between looks. */
static em_status wait_event(em_comm *c, em_comm_work *w, emi_event *e, const char *what,
                            em_status (*poll)(em_comm *c, char *err)) {
  emi_commdev *cd = c->dev;
  double t0 = emi_now();
  char desc[EMI_COMM_MSG];
  for (;;) {
    int done = 0;
    if (cd->svc->event_query(cd->d, e, &done)) {
      emi_coll_describe(desc, w);
      snprintf(w->errmsg, sizeof w->errmsg, "%.160s: cuda:%d: %.300s", desc, cd->device,
               cd->svc->errmsg(cd->d));
      emi_comm_fail(c, 1, "replica %d failed: %s", c->rank, w->errmsg);
      return EM_ERR_DEVICE;
    }
    if (done) return EM_OK;
    if (emi_comm_failed(c)) return EM_ERR_IO;
    if (poll) {
      char err[EMI_COMM_MSG] = "";
      if (poll(c, err)) {
        snprintf(w->errmsg, sizeof w->errmsg, "%s", err);
        emi_comm_fail(c, 1, "replica %d failed: %s", c->rank, err);
        return EM_ERR_IO;
      }
    }
    if (emi_now() - w->t_begin > c->timeout_s) {
      emi_coll_describe(desc, w);
      snprintf(w->errmsg, sizeof w->errmsg, "%.160s timed out after %g s: cuda:%d did not "
               "finish %s", desc, c->timeout_s, c->dev->device, what);
      emi_comm_fail(c, 1, "replica %d failed: %s", c->rank, w->errmsg);
      return EM_ERR_IO;
    }
    nap(emi_poll_nap_s(emi_now() - t0));
  }
}

em_status emi_commdev_wait_mark(em_comm *c, em_comm_work *w) {
  if (!w->ev_ready) return EM_OK;
  return wait_event(c, w, w->ev_ready, "the work that writes the collective's input", NULL);
}

/* Real GPUs: the communicator's stream itself waits for the mark (no host round trip
** before NCCL is launched); a device that never gets there shows as a "done"
** event that never comes, which finish polls with the same bound. */
em_status emi_commdev_order(em_comm *c, em_comm_work *w) {
  if (!w->ev_ready) return EM_OK;
  if (c->dev->svc->event_wait(c->dev->d, stream_for(c->dev, w), w->ev_ready))
    return rt_failed(c, w, "stream_wait_event");
  return EM_OK;
}

static size_t out_bytes(const em_comm *c, const em_comm_work *w) {
  size_t es = em_dtype_size(w->dtype);
  switch (w->kind) {
  case EMI_COLL_ALLGATHER: return (size_t)w->count * (size_t)c->size * es;
  case EMI_COLL_REDUCE_SCATTER: return (size_t)(w->count / c->size) * es;
  default: return (size_t)w->count * es;
  }
}

static em_status rt_failed(em_comm *c, em_comm_work *w, const char *step) {
  snprintf(w->errmsg, sizeof w->errmsg, "%s: %s: cuda:%d: %.300s", emi_coll_name(w->kind), step,
           c->dev->device, c->dev->svc->errmsg(c->dev->d));
  emi_comm_fail(c, 1, "replica %d failed: %s", c->rank, w->errmsg);
  return EM_ERR_DEVICE;
}

em_status emi_commdev_stage_in(em_comm *c, em_comm_work *w) {
  emi_commdev *cd = c->dev;
  const emi_services *svc = cd->svc;
  size_t in_b = (size_t)w->count * em_dtype_size(w->dtype);
  int inplace = w->dev_in == w->dev_out;
  size_t need = in_b + (inplace ? 0 : out_bytes(c, w));
  if (need > cd->host_cap) {                 /* grows, never shrinks: buckets repeat */
    if (cd->host) svc->host_free(cd->d, cd->host);
    cd->host = NULL;
    cd->host_cap = 0;
    if (svc->host_alloc(cd->d, need, &cd->host)) return rt_failed(c, w, "staging");
    cd->host_cap = need;
  }
  if (in_b && (svc->memcpy_async(cd->d, cd->coll, cd->host, w->dev_in, in_b, EMI_COPY_D2H) ||
               svc->stream_sync(cd->d, cd->coll)))
    return rt_failed(c, w, "copy to the host");
  w->in = cd->host;
  w->out = inplace ? cd->host : (char *)cd->host + in_b;
  return EM_OK;
}

em_status emi_commdev_stage_out(em_comm *c, em_comm_work *w) {
  emi_commdev *cd = c->dev;
  const emi_services *svc = cd->svc;
  size_t ob = out_bytes(c, w);
  emi_event *e = NULL;
  /* No wait here: the copy runs on the collective stream while the comm thread goes on;
  ** the next collective's copy into the staging memory queues behind it on the
  ** same stream (and its sync comes before the host writes there), and the
  ** caller's join orders the compute stream after it. */
  if ((ob && svc->memcpy_async(cd->d, cd->coll, w->dev_out, w->out, ob, EMI_COPY_H2D)) ||
      svc->event_new(cd->d, cd->coll, &e))
    return rt_failed(c, w, "copy to the device");
  w->ev_done = e;
  w->in = w->dev_in;
  w->out = w->dev_out;
  return EM_OK;
}

em_status emi_commdev_finish(em_comm *c, em_comm_work *w,
                             em_status (*poll)(em_comm *c, char *err)) {
  emi_commdev *cd = c->dev;
  emi_event *e = NULL;
  if (cd->svc->event_new(cd->d, stream_for(cd, w), &e)) return rt_failed(c, w, "event");
  w->ev_done = e;
  return wait_event(c, w, e, "the collective in NCCL (a replica did not join it, or this "
                    "device stopped)", poll);
}

/* Real GPUs, point-to-point: the "done" event after a send or recv queued on
** the p2p stream, and a look at it that does not wait (nccl.c polls its
** pending ones from p2p_progress, beside the comm thread's other work). */
em_status emi_commdev_record_done(em_comm *c, em_comm_work *w) {
  emi_event *e = NULL;
  if (c->dev->svc->event_new(c->dev->d, stream_for(c->dev, w), &e))
    return rt_failed(c, w, "event");
  w->ev_done = e;
  return EM_OK;
}

em_status emi_commdev_query_done(em_comm *c, em_comm_work *w, int *done) {
  *done = 0;
  if (c->dev->svc->event_query(c->dev->d, w->ev_done, done))
    return rt_failed(c, w, "event_query");
  return EM_OK;
}

/* -- The device's collective engine ---------------------------------------------------
** NCCL's id and version need no device: they come from the kind's library,
** loaded if need be. */
static const emi_services *engine(char *err, size_t errlen) {
  const emi_backend_kind *k = emi_accel_library(err, errlen);
  return k ? k->svc : NULL;
}

em_status emi_nccl_unique_id(unsigned char id[EMI_NCCL_ID_BYTES], char *err, size_t errlen) {
  const emi_services *svc = engine(err, errlen);
  return svc ? svc->coll_unique_id(id, err, errlen) : EM_ERR_UNSUPPORTED;
}

em_status emi_nccl_version(int *code, char *err, size_t errlen) {
  *code = 0;
  const emi_services *svc = engine(err, errlen);
  return svc ? svc->coll_version(code, err, errlen) : EM_ERR_UNSUPPORTED;
}

em_status emi_nccl_init(emi_commdev *cd, const unsigned char id[EMI_NCCL_ID_BYTES], int rank,
                        int size, double timeout_s, void **out, char *err, size_t errlen) {
  return cd->svc->coll_init(cd->d, id, rank, size, timeout_s, (emi_collective **)out, err,
                            errlen);
}

em_status emi_nccl_group(emi_commdev *cd, void *n, int start, char *err, size_t errlen) {
  return cd->svc->coll_group(n, start, err, errlen);
}

em_status emi_nccl_issue(void *n, emi_commdev *cd, em_comm_work *w, char *err, size_t errlen) {
  int peer = w->kind == EMI_COLL_SEND || w->kind == EMI_COLL_RECV ? w->peer : w->root;
  emi_coll_call k = {(int)w->kind, (int)w->dtype, (int)w->op, peer, stream_for(cd, w),
                     w->dev_in, w->dev_out, w->count};
  return cd->svc->coll_issue(n, &k, err, errlen);
}

em_status emi_nccl_async_error(emi_commdev *cd, void *n, char *err, size_t errlen) {
  return cd->svc->coll_async_error(n, err, errlen);
}

void emi_nccl_free(emi_commdev *cd, void *n, int abort) {
  if (n) cd->svc->coll_free(n, abort);
}

/*
** nccl.c -- the `nccl` communicator: replicas on CUDA devices (GPU replicas of
** `ember --replicas N --devices cuda:0,...`, or one GPU per MPI process).
**
** Two ways, one ordering. Every GPU replica first makes a host communicator,
** the "boot" one -- the local group of its threads, or MPI between processes --
** and shares rank 0's NCCL unique id through it (ncclGetUniqueId needs no GPU,
** so this part runs and is tested everywhere). Then:
**   - on real GPUs, a communicator with the backend below: its comm thread
**     joins NCCL (ncclCommInitRankConfig, non-blocking and bounded by the
**     timeout), and runs each collective on the communicator's own stream
**     -- made to wait (on the device) for the compute stream's "ready" event,
**     each in a ncclGroupStart/End of its own (run_nccl says why) -- then polls
**     the "done" event and ncclCommGetAsyncError. The boot communicator stays:
**     barriers and CPU tensors go through it, and so does failure -- a replica
**     that fails aborts the boot communicator (the others hear "replica K
**     failed: ..."), its peers see it while polling, stop waiting and
**     ncclCommAbort their NCCL communicator; a replica that exits (leaves the
**     local group) fails the collectives that wait for it, "replica K exited",
**     as the local communicator's do (nccl_poll);
**   - on emulated devices the boot communicator itself becomes the `nccl`
**     communicator: the host collective is NCCL's stand-in, and comm.c stages
**     the device buffers through host memory around it with the very same
**     events (commdev.c), so that ordering logic runs in CI;
**   - on emulated devices with EMBER_NCCL_EMULATE=1 (opt-in: the default
**     above lets replicas share an emulated device) the device counts as
**     native and the backend below runs as on real GPUs, against a stand-in
**     NCCL that groups, blocks and refuses one GPU twice as NCCL does
**     (kernels/emu/nccl_emu.c; ranks are threads of one process), so that
**     this file's NCCL path -- its groups, the p2p communicator, the abort,
**     the held tensors, the replica that left -- runs in CI too.
** Sends and recvs of device tensors are ncclSend / ncclRecv on real GPUs (see
** "Point-to-point on real GPUs" below); on emulated devices the host
** communicator's, staged through host memory by comm.c.
** What CI does not run: the NCCL calls themselves (kernels/real/nccl_real.c) --
** its machines have no GPU, and the stand-in is what answers there; the code compiles against nccl.h, and the GPU tests
** (make gpu-tests, test_comm_nccl) run them where a GPU is.
*/
#include "comm.h"
#include <stdio.h>
#include <stdlib.h>

int emi_comm_nccl_id(const em_comm *c, unsigned char id[128]) {
  if (!c || !c->nccl_id_ok) return 0;
  memcpy(id, c->nccl_id, 128);
  return 1;
}

/* -- The id exchange ------------------------------------------------------------ */

/* Rank 0 makes the ids, every rank gets them through boot: 65 int32s, the
** first saying whether rank 0 has them (its failure is everyone's answer), then
** the collectives' id and the point-to-point one (p2p, may be NULL; "Point-to-
** point on real GPUs" says why a second NCCL communicator). */
static em_status share_id(em_state *S, em_comm *boot, unsigned char id[EMI_NCCL_ID_BYTES],
                          unsigned char *p2p, int *ok, char *why, size_t whylen) {
  int64_t n = 1 + 2 * EMI_NCCL_ID_BYTES / 4;
  em_tensor *t;
  em_status st = em_full(S, &n, 1, 0.0, EM_INT32, EM_CPU, &t);
  if (st) return st;
  int32_t *v = (int32_t *)t->storage->data + t->offset;
  why[0] = 0;
  if (em_comm_rank(boot) == 0) {
    unsigned char mine[2 * EMI_NCCL_ID_BYTES];
    v[0] = emi_nccl_unique_id(mine, why, whylen) == EM_OK &&
           emi_nccl_unique_id(mine + EMI_NCCL_ID_BYTES, why, whylen) == EM_OK;
    if (v[0]) memcpy(v + 1, mine, sizeof mine);
  }
  if (!(st = em_comm_broadcast(S, boot, t, 0, NULL))) {
    *ok = v[0] != 0;
    memcpy(id, v + 1, EMI_NCCL_ID_BYTES);
    if (p2p) memcpy(p2p, (unsigned char *)(v + 1) + EMI_NCCL_ID_BYTES, EMI_NCCL_ID_BYTES);
  }
  em_tensor_release(t);
  return st;
}

em_status emi_nccl_share_id(em_state *S, em_comm *boot, unsigned char id[EMI_NCCL_ID_BYTES]) {
  int ok = 0;
  char why[EMI_COMM_MSG];
  em_status st = share_id(S, boot, id, NULL, &ok, why, sizeof why);
  if (st) return st;
  if (!ok)
    return emi_error(S, EM_ERR_UNSUPPORTED, "comm_nccl: replica 0 could not make NCCL's "
                     "unique id%s%.300s", why[0] ? ": " : "", why);
  return EM_OK;
}

/* -- The backend on real GPUs ---------------------------------------------------- */

/* A tensor NCCL may still read or write after its collective, send or recv
** failed: kept until the communicator is aborted. */
typedef struct held_tensor {
  em_tensor *t;
  struct held_tensor *next;
} held_tensor;

/* Sends and recvs queued back to back go to NCCL in one group (p2p_flush). */
enum { P2P_BATCH = 32 };

typedef struct nccl_comm {
  em_comm *boot;             /* host communicator: id, barriers, failure */
  em_local_group *g;         /* the threads' group (NULL under MPI) */
  void *nc;                  /* NCCL's communicator for collectives (nccl_real.c) */
  void *pc;                  /* and the one for sends and recvs */
  unsigned char id[EMI_NCCL_ID_BYTES], p2p_id[EMI_NCCL_ID_BYTES];
  em_comm_work *p2p;         /* sends and recvs on the p2p stream, not yet done */
  em_comm_work *batch[P2P_BATCH];  /* posted, not yet given to NCCL */
  int nbatch;
  int aborted;               /* NCCL's communicators were aborted (nccl_abort_failed) */
  held_tensor *held;
} nccl_comm;

/* Both NCCL communicators, one after the other in the same order everywhere
** (each init is collective). */
static em_status nccl_thread_start(em_comm *c, char *err) {
  nccl_comm *nc = c->impl;
  em_status st = emi_nccl_init(c->dev, nc->id, c->rank, c->size, c->timeout_s, &nc->nc, err,
                               EMI_COMM_MSG);
  if (!st && (st = emi_nccl_init(c->dev, nc->p2p_id, c->rank, c->size, c->timeout_s, &nc->pc,
                                 err, EMI_COMM_MSG))) {
    emi_nccl_free(c->dev, nc->nc, 1);       /* no thread_stop follows a failed start */
    nc->nc = NULL;
  }
  return st;
}

/* A replica that exits (its script ended; em_local_group_leave) has finished
** every NCCL call of its own before: it freed its communicator, whose finalize
** waits for them. So a collective or recv that still waits for it never ends
** -- except one it took part in, which ends on this device moments after it
** ended there. EMI_NCCL_LEFT_GRACE_S, counted from the moment it left, is that
** moment with a wide margin (a GPU is microseconds behind its peer, the exit
** itself takes milliseconds); then the wait fails with the host communicators'
** words, "replica K exited", instead of at the timeout. peer < 0: any replica
** of the group but self (a collective needs them all); otherwise that one (a
** send or recv). 1 with the message in msg, 0 while nobody left or within the
** grace. */
int emi_nccl_peer_left(em_local_group *g, int self, int peer, double now, char *msg,
                       size_t n) {
  double at = 0;
  int who = emi_local_group_left(g, peer, &at);
  if (who < 0 || who == self || now - at < EMI_NCCL_LEFT_GRACE_S) return 0;
  snprintf(msg, n, "replica %d exited", who);
  return 1;
}

/* Between looks at an event: has NCCL failed, or another replica? Failures that
** are not this replica's go into c (wait_event and p2p_progress see c failed);
** NCCL's own error into err. */
static em_status nccl_poll_failed(em_comm *c, char *err) {
  nccl_comm *nc = c->impl;
  char msg[EMI_COMM_MSG];
  if (nc->g && em_local_group_failure(nc->g, msg, sizeof msg)) {
    emi_comm_fail(c, 0, "%s", msg);
    return EM_OK;
  }
  if (emi_comm_failed(nc->boot)) {
    pthread_mutex_lock(&nc->boot->mu);
    snprintf(msg, sizeof msg, "%s", nc->boot->failure);
    pthread_mutex_unlock(&nc->boot->mu);
    emi_comm_fail(c, 0, "%s", msg);
    return EM_OK;
  }
  if (nc->aborted) return EM_OK;
  em_status st = emi_nccl_async_error(c->dev, nc->nc, err, EMI_COMM_MSG);
  return st ? st : emi_nccl_async_error(c->dev, nc->pc, err, EMI_COMM_MSG);
}

/* While a collective waits: the above, and a replica of the group that left. */
static em_status nccl_poll(em_comm *c, char *err) {
  nccl_comm *nc = c->impl;
  char msg[EMI_COMM_MSG];
  if (nc->g && emi_nccl_peer_left(nc->g, c->rank, -1, emi_now(), msg, sizeof msg)) {
    emi_comm_fail(c, 0, "%s", msg);
    return EM_OK;
  }
  return nccl_poll_failed(c, err);
}

/* Barriers and CPU tensors: through the host communicator, from this comm thread,
** so they keep their place in the order of this communicator's collectives. */
static int host_item(const em_comm_work *w) { return w->kind == EMI_COLL_BARRIER || !w->dev_in; }

static em_status nccl_host(em_comm *c, em_comm_work *w) {
  nccl_comm *nc = c->impl;
  em_comm_work b;
  memset(&b, 0, sizeof b);
  b.kind = w->kind;
  b.op = w->op;
  b.root = w->root;
  b.dtype = w->dtype;
  b.count = w->count;
  b.in = w->in;
  b.out = w->out;
  em_status st = emi_comm_call(nc->boot, &b);
  if (st) {
    snprintf(w->errmsg, sizeof w->errmsg, "%s", b.errmsg);
    if (emi_comm_failed(nc->boot)) emi_comm_fail(c, 0, "%s", b.errmsg);
  }
  return st;
}

static void hold_tensor(nccl_comm *nc, em_tensor *t) {
  if (!t || nc->aborted) return;     /* aborted: NCCL has let go of it */
  held_tensor *h = malloc(sizeof *h);
  if (!h) return;             /* out of memory: the tensor is released with the work */
  em_tensor_retain(t);
  h->t = t;
  h->next = nc->held;
  nc->held = h;
}

/* w failed after NCCL took it: its buffers stay until nccl_thread_stop. */
static void hold(nccl_comm *nc, em_comm_work *w) {
  hold_tensor(nc, w->in_t);
  if (w->out_t != w->in_t) hold_tensor(nc, w->out_t);
}

/* The n items of w -- one collective, or sends and recvs -- on their stream of
** this communicator, in one NCCL group, on NCCL communicator n (its streams
** already wait for the compute stream's marks). Error: the text in err. */
static em_status issue_group(em_comm *c, void *n, em_comm_work **w, int count, char *err) {
  em_status st = emi_nccl_group(c->dev, n, 1, err, EMI_COMM_MSG);
  if (st) return st;
  for (int i = 0; i < count && !st; i++) st = emi_nccl_issue(n, c->dev, w[i], err, EMI_COMM_MSG);
  em_status end = emi_nccl_group(c->dev, n, 0, err[0] ? NULL : err, err[0] ? 0 : EMI_COMM_MSG);
  return st ? st : end;
}

/* Abort at the failure. Once this communicator failed -- another replica died,
** a wait timed out, this replica aborted -- a kernel of NCCL's may be stuck on
** its streams for good, waiting for a peer that never comes: ncclCommAbort is
** the one call that ends it. Done at once, on the comm thread, where the
** failure is seen (after a failed collective, while the p2p ones are polled,
** and idle for a failure set on another thread), rather than when the
** communicator is freed: until then a stuck kernel holds up everything waiting
** on the device behind it (a cudaFree that synchronizes, in the allocator's
** out-of-memory retry, hangs on it). The abort frees NCCL's handles too; then
** the tensors NCCL held are released. */
static void nccl_abort_failed(em_comm *c) {
  nccl_comm *nc = c->impl;
  if (nc->aborted || !emi_comm_failed(c)) return;
  nc->aborted = 1;
  emi_nccl_free(c->dev, nc->nc, 1);
  emi_nccl_free(c->dev, nc->pc, 1);
  nc->nc = nc->pc = NULL;
  for (held_tensor *h = nc->held, *n; h; h = n) {
    n = h->next;
    em_tensor_release(h->t);
    free(h);
  }
  nc->held = NULL;
}

/* One collective on the device, waited for. Each is a NCCL group of its own,
** in queue order: NCCL plans a group as a whole, so every rank must put the
** same collectives in it, and a group made of whatever happens to be queued
** follows each host's timing (rank 0 {b1, b2}, rank 1 {b1} {b2}) -- a hang or
** mixed data. Queue order is call order, the same on every rank. Once NCCL has
** the collective, a failure (at issue or while waiting) leaves its buffers to
** NCCL until the abort: held. */
static em_status run_nccl(em_comm *c, em_comm_work *w) {
  nccl_comm *nc = c->impl;
  em_status st = emi_commdev_order(c, w);
  if (st) return st;
  char err[EMI_COMM_MSG] = "";
  if ((st = issue_group(c, nc->nc, &w, 1, err))) {
    snprintf(w->errmsg, sizeof w->errmsg, "%s", err);
    emi_comm_fail(c, 1, "replica %d failed: %s", c->rank, err);
    hold(nc, w);
    return st;
  }
  st = emi_commdev_finish(c, w, nccl_poll);
  if (st) hold(nc, w);
  w->t_ready = w->t_begin;
  return st;
}

static void p2p_flush(em_comm *c);

static em_status nccl_run(em_comm *c, em_comm_work *w) {
  p2p_flush(c);                /* sends and recvs queued before it go first */
  em_status st = host_item(w) ? nccl_host(c, w) : run_nccl(c, w);
  nccl_abort_failed(c);
  return st;
}

/* Idle: a failure set by another thread (em_comm_abort, a peer's) aborts. */
static void nccl_idle(em_comm *c) {
  p2p_flush(c);
  nccl_abort_failed(c);
}

/* This replica failed: the others hear it through the boot communicator. */
static void nccl_abort_notify(em_comm *c, int own) {
  nccl_comm *nc = c->impl;
  if (!own) return;
  char msg[EMI_COMM_MSG];
  pthread_mutex_lock(&c->mu);
  snprintf(msg, sizeof msg, "%s", c->failure);
  pthread_mutex_unlock(&c->mu);
  emi_comm_fail(nc->boot, 1, "%s", msg);
}

/* A failure not yet acted on aborts (nccl_abort_failed); otherwise NCCL's
** communicators are destroyed, which waits for their work. */
static void nccl_thread_stop(em_comm *c) {
  nccl_comm *nc = c->impl;
  nccl_abort_failed(c);
  emi_nccl_free(c->dev, nc->nc, 0);
  emi_nccl_free(c->dev, nc->pc, 0);
  nc->nc = nc->pc = NULL;
}

static void nccl_destroy(em_comm *c) {
  nccl_comm *nc = c->impl;
  em_comm_free(nc->boot);
  free(nc);
}

/* -- Point-to-point on real GPUs ----------------------------------------------------
** A send or recv of a device tensor is ncclSend / ncclRecv, device to device:
** the p2p stream waits for the compute stream's mark, the call is issued in a
** NCCL group, and a "done" event follows it. The comm thread does not wait for
** that event (comm.h, "progress"): p2p_progress looks at every pending one
** about every EMI_COMM_IDLE_S, as it polls NCCL's asynchronous error and the
** boot communicator for another replica's failure.
**
** Apart from the collectives. A NCCL send or recv is a kernel that blocks until
** the peer's matching one runs, and NCCL runs one communicator's kernels in the
** order they were issued, whatever stream each is on. So sends and recvs have
** an NCCL communicator of their own (pc, made beside nc from a second id) and a
** stream of their own (commdev.c): a recv pending for its peer's send holds up
** neither a collective queued after it nor the next training step's
** allreduces, and the pattern async recv, allreduce, send completes on every
** replica. The ordering rule that follows: collectives are in call order among
** themselves, sends and recvs among themselves (send #k to j meets j's recv #k
** from us), and the two run beside each other; a collective that reads a
** recv's tensor waits for the recv first (em_comm_work_wait), as on the host
** backends.
**
** Rings of sends. Within pc a send still blocks the sends and recvs issued
** after it until its peer receives (for messages past NCCL's eager buffer; a
** pair's first send also sets up its connection inside ncclGroupEnd, which
** needs the peer's recv at that moment). So sends and recvs already queued back
** to back when the comm thread posts them go to NCCL in one group (p2p_post
** defers, p2p_flush issues), where NCCL runs them together. That depends on the
** caller's timing, so it is no guarantee: a caller whose replicas each send
** before they receive (a ring; 1F1B's activation forward against the
** gradient back) orders the calls so that the cycle cannot form -- even
** positions in the ring send then recv, odd ones recv then send -- or moves
** host copies over the boot communicator, which matches sends and recvs out of
** order (pipeline/wire.lua does this over a real NCCL communicator).
**
** The never-hang rule still holds: such a wait ends at the timeout with an
** error naming the peer; the timeout fails the communicator, whose NCCL
** communicators are then aborted (nccl_abort_failed). NCCL does not compare the
** two sides' sizes either: a mismatch shows as that timeout. CPU tensors on
** this communicator go through the host one (p2p_via). */
static em_comm *nccl_p2p_via(em_comm *c) { return ((nccl_comm *)c->impl)->boot; }

/* Whether the next item queued on c is a send or recv (its device tensors are
** this backend's: CPU ones go to the boot communicator). */
static int p2p_next_queued(em_comm *c) {
  pthread_mutex_lock(&c->mu);
  int yes = c->head && (c->head->kind == EMI_COLL_SEND || c->head->kind == EMI_COLL_RECV);
  pthread_mutex_unlock(&c->mu);
  return yes;
}

/* w failed before it was pending: finished here (its error in w->errmsg). */
static void p2p_fail_now(em_comm *c, em_comm_work *w, em_status st, const char *err) {
  nccl_comm *nc = c->impl;
  char d[EMI_COMM_MSG];
  if (!w->errmsg[0])
    snprintf(w->errmsg, sizeof w->errmsg, "%.200s: %.300s", emi_coll_describe(d, w), err);
  hold(nc, w);
  emi_comm_p2p_done(w, st);
}

/* The deferred sends and recvs to NCCL, in one group, each then "done". */
static void p2p_flush(em_comm *c) {
  nccl_comm *nc = c->impl;
  int n = nc->nbatch;
  if (!n) return;
  nc->nbatch = 0;
  char err[EMI_COMM_MSG] = "";
  em_status st = EM_ERR_IO;
  if (emi_comm_failed(c)) {
    pthread_mutex_lock(&c->mu);
    snprintf(err, sizeof err, "%s", c->failure);
    pthread_mutex_unlock(&c->mu);
  } else if ((st = issue_group(c, nc->pc, nc->batch, n, err))) {
    char d[EMI_COMM_MSG];
    emi_comm_fail(c, 1, "replica %d failed: %.200s: %.280s", c->rank,
                  emi_coll_describe(d, nc->batch[0]), err);
  }
  for (int i = 0; i < n; i++) {
    em_comm_work *w = nc->batch[i];
    if (!st && !(st = emi_commdev_record_done(c, w))) {
      w->p2p_next = nc->p2p;
      nc->p2p = w;
      continue;
    }
    p2p_fail_now(c, w, st ? st : EM_ERR_IO, err);
  }
  nccl_abort_failed(c);
}

static em_status nccl_p2p_post(em_comm *c, em_comm_work *w) {
  nccl_comm *nc = c->impl;
  em_status st = emi_commdev_order(c, w);
  if (st) return st;
  nc->batch[nc->nbatch++] = w;
  if (nc->nbatch == P2P_BATCH || !p2p_next_queued(c)) p2p_flush(c);
  return EM_OK;
}

/* Why pending item w ends now (text into msg), or 0 while it may go on. */
static int p2p_why(em_comm *c, const em_comm_work *w, int stopping, char *msg) {
  nccl_comm *nc = c->impl;
  char d[EMI_COMM_MSG], left[64];
  emi_coll_describe(d, w);
  int send = w->kind == EMI_COLL_SEND;
  if (emi_comm_failed(c)) {
    pthread_mutex_lock(&c->mu);
    snprintf(msg, EMI_COMM_MSG, "%.200s: %.280s", d, c->failure);
    pthread_mutex_unlock(&c->mu);
  } else if (nc->g && emi_nccl_peer_left(nc->g, c->rank, w->peer, emi_now(), left,
                                         sizeof left)) {
    snprintf(msg, EMI_COMM_MSG, "%.200s: %s", d, left);
  } else if (emi_now() - w->t_begin > c->timeout_s) {
    snprintf(msg, EMI_COMM_MSG, "%.200s timed out after %g s: replica %d did not %s (or the "
             "two sides' sizes differ, which NCCL does not check)", d, c->timeout_s, w->peer,
             send ? "receive it" : "send");
  } else if (stopping) {
    snprintf(msg, EMI_COMM_MSG, "%.200s: the communicator was freed before replica %d %s", d,
             w->peer, send ? "received it" : "sent");
  } else {
    return 0;
  }
  return 1;
}

static void nccl_p2p_progress(em_comm *c, int stopping) {
  nccl_comm *nc = c->impl;
  char err[EMI_COMM_MSG] = "";
  p2p_flush(c);
  /* a replica that left fails only the sends and recvs with it (p2p_why) */
  if (!emi_comm_failed(c) && nccl_poll_failed(c, err))
    emi_comm_fail(c, 1, "replica %d failed: %s", c->rank, err);
  for (em_comm_work **pp = &nc->p2p; *pp;) {
    em_comm_work *w = *pp;
    int done = 0;
    em_status st = emi_commdev_query_done(c, w, &done);
    if (!st && !done) {
      char msg[EMI_COMM_MSG];
      if (!p2p_why(c, w, stopping, msg)) { pp = &w->p2p_next; continue; }
      snprintf(w->errmsg, sizeof w->errmsg, "%s", msg);
      st = EM_ERR_IO;
      /* the p2p stream is stuck behind it: nothing after it can run */
      if (!emi_comm_failed(c)) emi_comm_fail(c, 1, "replica %d failed: %s", c->rank, msg);
    }
    *pp = w->p2p_next;
    if (st) hold(nc, w);
    emi_comm_p2p_done(w, st);
  }
  nccl_abort_failed(c);
}

static const emi_comm_backend nccl_backend = {
  .name = "nccl",
  .thread_start = nccl_thread_start,
  .run = nccl_run,
  .p2p_post = nccl_p2p_post,
  .p2p_progress = nccl_p2p_progress,
  .p2p_via = nccl_p2p_via,
  .device_native = 1,
  .idle = nccl_idle,
  .abort_notify = nccl_abort_notify,
  .thread_stop = nccl_thread_stop,
  .destroy = nccl_destroy,
};

/* -- Public --------------------------------------------------------------------------- */

em_status em_comm_nccl(em_state *S, int device, em_local_group *g, int rank, double timeout_s,
                       em_comm **out) {
  if (!out) return emi_error(S, EM_ERR_ARG, "comm_nccl: NULL output");
  *out = NULL;
  emi_commdev *dev;
  em_status st = emi_commdev_open(S, device, &dev);
  if (st) return st;
  em_comm *boot;
  st = g ? em_comm_local(S, g, rank, timeout_s, &boot) : em_comm_mpi(S, timeout_s, &boot);
  if (st) { emi_commdev_close(dev); return st; }
  unsigned char id[EMI_NCCL_ID_BYTES];
  int ok = 0;
  char why[EMI_COMM_MSG];
  unsigned char p2p_id[EMI_NCCL_ID_BYTES];
  if ((st = share_id(S, boot, id, p2p_id, &ok, why, sizeof why))) {
    em_comm_free(boot);
    emi_commdev_close(dev);
    return st;
  }
  if (!emi_commdev_native(dev)) {
    /* emulated devices: the host communicator stands in for NCCL (comm.c
    ** stages); the id is shared all the same, when libnccl is there, so that
    ** the exchange is what CI tests (EMBER_NCCL_EMULATE=1 makes an emulated
    ** device native: the backend below then runs, on the stand-in NCCL) */
    memcpy(boot->nccl_id, id, sizeof id);
    boot->nccl_id_ok = ok;
    boot->label = "nccl";
    boot->dev = dev;
    *out = boot;
    return EM_OK;
  }
  if (!ok) {
    em_comm_free(boot);
    emi_commdev_close(dev);
    return emi_error(S, EM_ERR_UNSUPPORTED, "comm_nccl: replica 0 could not make NCCL's "
                     "unique id%s%.300s", why[0] ? ": " : "", why);
  }
  nccl_comm *nc = calloc(1, sizeof *nc);
  if (!nc) {
    em_comm_free(boot);
    emi_commdev_close(dev);
    return emi_error(S, EM_ERR_NOMEM, "comm_nccl: out of memory");
  }
  nc->boot = boot;
  nc->g = g;
  memcpy(nc->id, id, sizeof id);
  memcpy(nc->p2p_id, p2p_id, sizeof p2p_id);
  /* c->dev must be there when thread_start runs: made here, handed over below */
  em_comm *c;
  st = emi_comm_new_dev(S, &nccl_backend, nc, em_comm_rank(boot), em_comm_size(boot),
                        timeout_s, dev, &c);
  if (st) {
    /* the others are left waiting in NCCL's init: tell them */
    em_comm_abort(boot, S->errmsg);
    em_comm_free(boot);
    emi_commdev_close(dev);
    free(nc);
    return st;
  }
  memcpy(c->nccl_id, id, sizeof id);
  c->nccl_id_ok = 1;
  *out = c;
  return EM_OK;
}

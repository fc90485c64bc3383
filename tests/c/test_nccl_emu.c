/*
** test_nccl_emu.c -- the stand-in NCCL of emulated devices (kernels/emu/
** nccl_emu.c, EMBER_NCCL_EMULATE=1 under EMBER_CUDA_EMULATE=2:64), two ranks
** as two threads on cuda:0 and cuda:1:
**   - through the nccl communicator (core/dist/nccl.c's real path, no host
**     staging): allreduce (sum, mean, max, min), broadcast, allgather,
**     reduce-scatter and sends and recvs agree with the host's arithmetic;
**   - two ranks on one device are refused on both, in NCCL's words;
** and through the services table's collective entries directly, where the
** groups are the caller's:
**   - groups of different composition are an asynchronous error, and no
**     data moves;
**   - a send waits for its recv (and within one group a send and a recv
**     pair up); a ring whose ranks both send first deadlocks on the device
**     and ends in the timeout's error;
**   - abort unblocks a recv that waits for a send that never comes;
** and through the nccl communicator again:
**   - a recv that failed while its group still sits on the device keeps its
**     tensor's memory, after the caller let go of it, until the abort is done.
*/
#include "check.h"
#include "../../core/dist/comm.h"
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double clock_s(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + t.tv_nsec * 1e-9;
}

static void nap(double s) {
  struct timespec ts = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
  nanosleep(&ts, NULL);
}

static double at(em_state *S, const em_tensor *t, int64_t i) {
  em_tensor *c = NULL;
  if (em_to(S, t, em_tensor_dtype(t), EM_CPU, &c)) return -1e300;
  double v = t_get(c, i);
  em_tensor_release(c);
  return v;
}

static void *dptr(const em_tensor *t) {
  return (char *)t->storage->data + t->offset * (int64_t)em_dtype_size(t->dtype);
}

/* -- Through the nccl communicator ------------------------------------------------- */

typedef struct job {
  em_local_group *g;
  int rank, dev, fails;
  char err[EMI_COMM_MSG];
  double sum, mean, max, min, bcast, gathered, scattered, recv_first, recv_second;
  size_t staging;
  const char *label;
} job;

static void *comm_replica(void *arg) {
  job *j = arg;
  em_state *S;
  if (em_open(&S, NULL)) { j->fails++; return NULL; }
  em_comm *c = NULL;
  if (em_comm_nccl(S, j->dev, j->g, j->rank, 10, &c)) {
    snprintf(j->err, sizeof j->err, "%s", em_errmsg(S));
    em_close(S);
    return NULL;
  }
  j->label = em_comm_backend(c);
  int dev = j->dev, peer = 1 - j->rank;
  int64_t n = 6;
  em_tensor *a = NULL, *m = NULL, *hi = NULL, *lo = NULL, *b = NULL, *all = NULL, *rs = NULL;
  em_tensor *s1 = NULL, *s2 = NULL, *r1 = NULL, *r2 = NULL, *ag = NULL;
  double v = j->rank + 1;                        /* 1 on rank 0, 2 on rank 1 */
  if (em_full(S, &n, 1, v, EM_FLOAT32, dev, &a) || em_full(S, &n, 1, v, EM_FLOAT32, dev, &m) ||
      em_full(S, &n, 1, v, EM_FLOAT32, dev, &hi) || em_full(S, &n, 1, v, EM_FLOAT32, dev, &lo) ||
      em_full(S, &n, 1, 10 * v, EM_FLOAT32, dev, &b) ||
      em_comm_allreduce(S, c, a, EM_COMM_SUM, NULL) ||
      em_comm_allreduce(S, c, m, EM_COMM_MEAN, NULL) ||
      em_comm_allreduce(S, c, hi, EM_COMM_MAX, NULL) ||
      em_comm_allreduce(S, c, lo, EM_COMM_MIN, NULL) || em_comm_broadcast(S, c, b, 1, NULL) ||
      em_full(S, &n, 1, 7 * v, EM_FLOAT32, dev, &ag) || em_comm_allgather(S, c, ag, &all, NULL) ||
      em_arange(S, 0, 6, 1, EM_FLOAT32, dev, &s1) ||
      em_comm_reduce_scatter(S, c, s1, EM_COMM_SUM, &rs, NULL))
    j->fails++;
  /* sends and recvs: two in a row, matched in order */
  if (em_arange(S, 100, 106, 1, EM_FLOAT32, dev, &s2) || em_full(S, &n, 1, -1, EM_FLOAT32, dev, &r1) ||
      em_full(S, &n, 1, -1, EM_FLOAT32, dev, &r2))
    j->fails++;
  else if (j->rank == 0 ? em_comm_send(S, c, s1, peer, NULL) || em_comm_send(S, c, s2, peer, NULL)
                        : em_comm_recv(S, c, r1, peer, NULL) || em_comm_recv(S, c, r2, peer, NULL))
    j->fails++;
  if (j->fails) snprintf(j->err, sizeof j->err, "%s", em_errmsg(S));
  j->sum = at(S, a, 2);
  j->mean = at(S, m, 2);
  j->max = at(S, hi, 2);
  j->min = at(S, lo, 2);
  j->bcast = at(S, b, 0);
  j->gathered = all ? at(S, all, 7) : -1;
  j->scattered = rs ? at(S, rs, 1) : -1;
  j->recv_first = at(S, r1, 4);
  j->recv_second = at(S, r2, 4);
  j->staging = emi_commdev_staging(c->dev, NULL);
  em_tensor *ts[] = {a, m, hi, lo, b, all, rs, s1, s2, r1, r2, ag};
  for (size_t i = 0; i < sizeof ts / sizeof ts[0]; i++) em_tensor_release(ts[i]);
  em_comm_free(c);
  em_close(S);
  return NULL;
}

static void run_pair(job *jobs, int dev0, int dev1) {
  pthread_t th[2];
  em_local_group *g = em_local_group_new(2);
  for (int r = 0; r < 2; r++) {
    memset(&jobs[r], 0, sizeof jobs[r]);
    jobs[r].g = g;
    jobs[r].rank = r;
    jobs[r].dev = r ? dev1 : dev0;
    pthread_create(&th[r], NULL, comm_replica, &jobs[r]);
  }
  for (int r = 0; r < 2; r++) pthread_join(th[r], NULL);
  em_local_group_release(g);
}

static void test_communicator(void) {
  job jobs[2];
  run_pair(jobs, 0, 1);
  for (int r = 0; r < 2; r++) {
    job *j = &jobs[r];
    REQUIRE(!j->err[0] && !j->fails, "rank %d: %s", r, j->err);
    CHECK(j->label && strcmp(j->label, "nccl") == 0, "rank %d: backend %s", r,
          j->label ? j->label : "?");
    CHECK(j->staging == 0, "rank %d: %zu bytes of host staging (the stand-in reads device "
          "memory)", r, j->staging);
    CHECK_CLOSE(j->sum, 3, 0);
    CHECK_CLOSE(j->mean, 1.5, 0);
    CHECK_CLOSE(j->max, 2, 0);
    CHECK_CLOSE(j->min, 1, 0);
    CHECK_CLOSE(j->bcast, 20, 0);                /* rank 1's */
    CHECK_CLOSE(j->gathered, 14, 0);             /* all[7]: rank 1's part */
    CHECK_CLOSE(j->scattered, 2 * (3 * r + 1), 0);
  }
  CHECK_CLOSE(jobs[1].recv_first, 4, 0);
  CHECK_CLOSE(jobs[1].recv_second, 104, 0);
}

static void test_duplicate_gpu(void) {
  job jobs[2];
  run_pair(jobs, 0, 0);
  for (int r = 0; r < 2; r++) {
    CHECK(strstr(jobs[r].err, "Duplicate GPU detected: rank") &&
          strstr(jobs[r].err, "both on CUDA device 0"), "rank %d: %s", r, jobs[r].err);
  }
}

/* -- Through the services table --------------------------------------------------------- */

typedef struct raw {
  unsigned char id[128];
  pthread_barrier_t *bar;
  int rank, scenario, fails;
  double timeout_s;
  char err[400];
  double t_error, t_unblocked, out0, out1;
  int done_before;
} raw;

enum { MISMATCH, PAIRS, RING, ABORT };

static em_status issue(const emi_services *svc, emi_collective *c, int kind, int stream,
                       em_tensor *t, int peer, char *err) {
  emi_coll_call k = {kind, EM_FLOAT32, EM_COMM_SUM, peer, stream, dptr(t), dptr(t),
                     em_tensor_numel(t)};
  return svc->coll_issue(c, &k, err, 400);
}

/* Polls the stand-in's asynchronous error for at most s seconds. */
static int await_error(const emi_services *svc, emi_collective *c, double s, char *err) {
  double t0 = clock_s();
  while (clock_s() - t0 < s) {
    if (svc->coll_async_error(c, err, 400)) return 1;
    nap(0.005);
  }
  return 0;
}

static void *raw_replica(void *arg) {
  raw *j = arg;
  em_state *S;
  if (em_open(&S, NULL)) { j->fails++; return NULL; }
  int dev = j->rank, peer = 1 - j->rank;
  emi_device *d = emi_device_attach(S, dev);
  const emi_services *svc = emi_services_of(S, dev);
  emi_stream st = 0;
  emi_collective *c = NULL;
  char err[400] = "";
  int64_t n = 8;
  em_tensor *x = NULL, *y = NULL;
  int ready = d && svc && !svc->stream_new(d, &st) &&
              !em_full(S, &n, 1, j->rank + 1, EM_FLOAT32, dev, &x) &&
              !em_full(S, &n, 1, -1, EM_FLOAT32, dev, &y) &&
              !svc->synchronize(d);   /* x and y written before the stream reads them */
  /* both ranks start the init together: its timeout may be short */
  pthread_barrier_wait(j->bar);
  if (!ready || svc->coll_init(d, j->id, j->rank, 2, j->timeout_s, &c, err, sizeof err)) {
    snprintf(j->err, sizeof j->err, "setup: %.380s", err);
    j->fails++;
    /* the other rank's barriers still meet this one's */
    pthread_barrier_wait(j->bar);
    if (j->scenario == ABORT) pthread_barrier_wait(j->bar);
    goto out;
  }
  double t0 = clock_s();
  emi_event *e = NULL;
  switch (j->scenario) {
  case MISMATCH:       /* rank 0 {allreduce x, allreduce y}, rank 1 {allreduce x} */
    if (svc->coll_group(c, 1, err, 400) || issue(svc, c, EMI_COLL_ALLREDUCE, st, x, 0, err) ||
        (j->rank == 0 && issue(svc, c, EMI_COLL_ALLREDUCE, st, y, 0, err)) ||
        svc->coll_group(c, 0, err, 400))
      j->fails++;
    if (await_error(svc, c, 5, err)) snprintf(j->err, sizeof j->err, "%s", err);
    break;
  case PAIRS:          /* {send x, recv y} in one group, then send-first on rank 0 only */
    if (svc->coll_group(c, 1, err, 400) || issue(svc, c, EMI_COLL_SEND, st, x, peer, err) ||
        issue(svc, c, EMI_COLL_RECV, st, y, peer, err) || svc->coll_group(c, 0, err, 400))
      j->fails++;
    if (j->rank == 0 ? issue(svc, c, EMI_COLL_SEND, st, y, peer, err) ||
                           issue(svc, c, EMI_COLL_RECV, st, x, peer, err)
                     : issue(svc, c, EMI_COLL_RECV, st, x, peer, err) ||
                           issue(svc, c, EMI_COLL_SEND, st, x, peer, err))
      j->fails++;
    if (svc->stream_sync(d, st)) j->fails++;
    if (svc->coll_async_error(c, err, 400)) snprintf(j->err, sizeof j->err, "%s", err);
    break;
  case RING:           /* both send first, each in a group of its own: a cycle */
    if (issue(svc, c, EMI_COLL_SEND, st, x, peer, err) ||
        issue(svc, c, EMI_COLL_RECV, st, y, peer, err) || svc->event_new(d, st, &e))
      j->fails++;
    if (await_error(svc, c, 5, err)) snprintf(j->err, sizeof j->err, "%s", err);
    j->t_error = clock_s() - t0;
    if (e && svc->event_query(d, e, &j->done_before)) j->fails++;
    break;
  case ABORT:          /* rank 0 waits for a send rank 1 never makes */
    if (j->rank == 0) {
      if (issue(svc, c, EMI_COLL_RECV, st, y, peer, err) || svc->event_new(d, st, &e))
        j->fails++;
      nap(0.3);
      if (e && svc->event_query(d, e, &j->done_before)) j->fails++;
    }
    break;
  }
  pthread_barrier_wait(j->bar);                /* both saw what they wait for */
  if (j->scenario == ABORT && j->rank == 1) {
    pthread_barrier_wait(j->bar);              /* rank 0 aborted */
    if (await_error(svc, c, 2, err)) snprintf(j->err, sizeof j->err, "%s", err);
  }
  t0 = clock_s();
  svc->coll_free(c, j->scenario != PAIRS);
  if (j->scenario == ABORT && j->rank == 0) pthread_barrier_wait(j->bar);
  if (svc->stream_sync(d, st)) j->fails++;
  j->t_unblocked = clock_s() - t0;
  if (e) svc->event_free(d, e);
  j->out0 = at(S, x, 0);
  j->out1 = at(S, y, 0);
out:
  if (st) svc->stream_free(d, st);
  em_tensor_release(x);
  em_tensor_release(y);
  em_close(S);
  return NULL;
}

static void run_raw(raw *jobs, int scenario, double timeout_s) {
  pthread_t th[2];
  pthread_barrier_t bar;
  pthread_barrier_init(&bar, NULL, 2);
  em_state *S = NULL;
  unsigned char id[128] = {0};
  char err[400] = "";
  const emi_services *svc = NULL;
  if (!em_open(&S, NULL) && (svc = emi_services_of(S, 0)))
    svc->coll_unique_id(id, err, sizeof err);
  for (int r = 0; r < 2; r++) {
    memset(&jobs[r], 0, sizeof jobs[r]);
    memcpy(jobs[r].id, id, sizeof id);
    jobs[r].bar = &bar;
    jobs[r].rank = r;
    jobs[r].scenario = scenario;
    jobs[r].timeout_s = timeout_s;
    pthread_create(&th[r], NULL, raw_replica, &jobs[r]);
  }
  for (int r = 0; r < 2; r++) pthread_join(th[r], NULL);
  pthread_barrier_destroy(&bar);
  em_close(S);
}

static void test_mismatched_groups(void) {
  raw j[2];
  run_raw(j, MISMATCH, 10);
  for (int r = 0; r < 2; r++) {
    CHECK(j[r].fails == 0, "rank %d: %d calls failed: %s", r, j[r].fails, j[r].err);
    CHECK(strstr(j[r].err, "groups differ") != NULL, "rank %d: %s", r, j[r].err);
    CHECK(j[r].t_unblocked < 2, "rank %d: the abort took %.2f s", r, j[r].t_unblocked);
    CHECK_CLOSE(j[r].out0, r + 1, 0);           /* no data moved */
    CHECK_CLOSE(j[r].out1, -1, 0);
  }
}

static void test_send_recv_pairs(void) {
  raw j[2];
  run_raw(j, PAIRS, 10);
  for (int r = 0; r < 2; r++) {
    CHECK(j[r].fails == 0 && !j[r].err[0], "rank %d: %d calls failed: %s", r, j[r].fails,
          j[r].err);
  }
  /* the group swapped x into the peer's y; then rank 0 sent y (= 2) back into rank
  ** 1's x, and rank 1 sent that x (now 2) into rank 0's x */
  CHECK_CLOSE(j[0].out1, 2, 0);
  CHECK_CLOSE(j[1].out1, 1, 0);
  CHECK_CLOSE(j[1].out0, 2, 0);
  CHECK_CLOSE(j[0].out0, 2, 0);
}

static void test_send_first_ring(void) {
  raw j[2];
  run_raw(j, RING, 0.3);
  for (int r = 0; r < 2; r++) {
    CHECK(j[r].fails == 0, "rank %d: %d calls failed: %s", r, j[r].fails, j[r].err);
    CHECK(strstr(j[r].err, "did not complete within 0.3 s") != NULL, "rank %d: %s", r, j[r].err);
    CHECK(j[r].t_error >= 0.29 && j[r].t_error < 3, "rank %d: the error after %.2f s", r,
          j[r].t_error);
    CHECK(!j[r].done_before, "rank %d: the stream went past the deadlocked send", r);
    CHECK(j[r].t_unblocked < 2, "rank %d: the abort took %.2f s", r, j[r].t_unblocked);
    CHECK_CLOSE(j[r].out1, -1, 0);
  }
}

static void test_abort_unblocks(void) {
  raw j[2];
  run_raw(j, ABORT, 30);
  CHECK(j[0].fails == 0 && j[1].fails == 0, "%d %d calls failed", j[0].fails, j[1].fails);
  CHECK(!j[0].done_before, "the recv did not wait for its send");
  CHECK(j[0].t_unblocked < 1, "the abort unblocked the stream after %.2f s", j[0].t_unblocked);
  CHECK(strstr(j[1].err, "rank 0 aborted") != NULL, "rank 1 heard: %s", j[1].err);
  CHECK_CLOSE(j[0].out1, -1, 0);
}

/* -- A failed recv's tensor outlives the caller's reference until the abort ------- */

/* The gate: a host callback on cuda:0's compute stream that holds the stream
** (and with it the recv's group, which waits for the stream's "ready" mark)
** until the test opens it -- bounded, so that nothing hangs. */
static pthread_mutex_t gate_mu = PTHREAD_MUTEX_INITIALIZER;
static int gate_open;

static void gate_wait(void *ud) {
  (void)ud;
  double until = clock_s() + 3;
  pthread_mutex_lock(&gate_mu);
  while (!gate_open && clock_s() < until) {
    pthread_mutex_unlock(&gate_mu);
    nap(0.002);
    pthread_mutex_lock(&gate_mu);
  }
  pthread_mutex_unlock(&gate_mu);
}

static void gate_set(int open) {
  pthread_mutex_lock(&gate_mu);
  gate_open = open;
  pthread_mutex_unlock(&gate_mu);
}

typedef struct holdjob {
  em_local_group *g;
  pthread_barrier_t *bar;
  int rank, fails;
  char err[EMI_COMM_MSG], recv_err[EMI_COMM_MSG];
  int64_t before, with_t, after_release, after_abort;
  double t_abort;
} holdjob;

static int64_t allocated(em_state *S, int dev) {
  em_cuda_memory m;
  return em_cuda_memory_stats(S, dev, &m) ? -1 : m.allocated;
}

static void *hold_replica(void *arg) {
  holdjob *j = arg;
  em_state *S;
  if (em_open(&S, NULL)) { j->fails++; pthread_barrier_wait(j->bar); return NULL; }
  em_comm *c = NULL;
  if (em_comm_nccl(S, j->rank, j->g, j->rank, 0.2, &c)) {
    snprintf(j->err, sizeof j->err, "%s", em_errmsg(S));
    j->fails++;
    pthread_barrier_wait(j->bar);
    em_close(S);
    return NULL;
  }
  if (j->rank == 0) {
    /* rank 0 receives from rank 1, which never sends: the recv times out after
    ** 0.2 s while its group has not yet run (the gate holds the stream it
    ** waits behind), so the abort that follows waits for that group to leave
    ** the device -- the window in which NCCL may still write the buffer */
    const emi_services *svc = emi_services_of(S, 0);
    emi_device *d = emi_device_attach(S, 0);
    int64_t n = 256 * 1024;                       /* 1 MiB of float32 */
    em_tensor *x = NULL;
    em_comm_work *w = NULL;
    if (!svc || !d || svc->synchronize(d)) j->fails++;
    j->before = allocated(S, 0);
    if (!j->fails && !em_full(S, &n, 1, -1, EM_FLOAT32, 0, &x) && !svc->synchronize(d)) {
      j->with_t = allocated(S, 0);
      gate_set(0);
      if (svc->host_callback(d, EMI_STREAM_COMPUTE, gate_wait, NULL) ||
          em_comm_recv(S, c, x, 1, &w)) {
        j->fails++;
        gate_set(1);
      } else {
        if (!em_comm_work_wait(S, w)) j->fails++;       /* it must fail */
        snprintf(j->recv_err, sizeof j->recv_err, "%s", em_errmsg(S));
        em_comm_work_free(w);
        em_tensor_release(x);                          /* the caller lets go */
        x = NULL;
        nap(0.1);                                      /* a free would show by now */
        j->after_release = allocated(S, 0);
        double t0 = clock_s();
        gate_set(1);                                   /* the abort can end now */
        while (allocated(S, 0) > j->before && clock_s() - t0 < 2) nap(0.005);
        j->t_abort = clock_s() - t0;
        j->after_abort = allocated(S, 0);
      }
    } else {
      j->fails++;
    }
    em_tensor_release(x);
    if (j->fails && !j->err[0]) snprintf(j->err, sizeof j->err, "%s", em_errmsg(S));
  }
  pthread_barrier_wait(j->bar);                 /* rank 1 stays until rank 0 is done */
  em_comm_free(c);
  em_close(S);
  return NULL;
}

static void test_failed_recv_holds_tensor(void) {
  pthread_t th[2];
  pthread_barrier_t bar;
  pthread_barrier_init(&bar, NULL, 2);
  holdjob j[2];
  em_local_group *g = em_local_group_new(2);
  double t0 = clock_s();
  for (int r = 0; r < 2; r++) {
    memset(&j[r], 0, sizeof j[r]);
    j[r].g = g;
    j[r].bar = &bar;
    j[r].rank = r;
    pthread_create(&th[r], NULL, hold_replica, &j[r]);
  }
  for (int r = 0; r < 2; r++) pthread_join(th[r], NULL);
  double took = clock_s() - t0;
  pthread_barrier_destroy(&bar);
  em_local_group_release(g);
  REQUIRE(j[0].fails == 0 && j[1].fails == 0, "rank 0: %s; rank 1: %s", j[0].err, j[1].err);
  CHECK(strstr(j[0].recv_err, "timed out after 0.2 s") != NULL, "the recv: %s", j[0].recv_err);
  CHECK(j[0].with_t - j[0].before >= 1 << 20, "the tensor took %lld bytes",
        (long long)(j[0].with_t - j[0].before));
  /* the caller's reference is gone, NCCL's hold is not: the bytes stay */
  CHECK(j[0].after_release == j[0].with_t, "before the abort ended: %lld bytes allocated, "
        "%lld with the tensor, %lld without", (long long)j[0].after_release,
        (long long)j[0].with_t, (long long)j[0].before);
  /* the abort ends once the group left the device, and lets go of them */
  CHECK(j[0].after_abort == j[0].before, "after the abort: %lld bytes allocated, %lld before "
        "the tensor", (long long)j[0].after_abort, (long long)j[0].before);
  CHECK(j[0].t_abort < 1.5, "the abort took %.2f s after the gate opened", j[0].t_abort);
  CHECK(took < 3, "the test took %.2f s", took);
}

int main(void) {
  setenv("EMBER_CUDA_EMULATE", "2:64", 1);
  setenv("EMBER_NCCL_EMULATE", "1", 1);
  RUN(test_communicator);
  RUN(test_duplicate_gpu);
  RUN(test_mismatched_groups);
  RUN(test_send_recv_pairs);
  RUN(test_send_first_ring);
  RUN(test_abort_unblocks);
  RUN(test_failed_recv_holds_tensor);
  return check_done();
}

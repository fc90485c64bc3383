/*
** test_comm_nccl_streams.c -- the nccl communicator's device side on the
** emulated runtime (EMBER_CUDA_EMULATE=2:64):
**   - every communicator has streams of its own (commdev.c): one for its
**     collectives, one for its sends and recvs, none shared with another
**     communicator -- and the emulator keeps them independent: a collective
**     stream held up on one communicator does not hold up another's allreduce;
**   - device tensors reach host memory only through pinned staging, reused and
**     grown: the comm thread's buffer for collectives, the callers' for staged
**     sends and recvs; the emulator counts no copy to or from pageable memory
**     in the communicator's calls, and both buffers go with the communicator;
**   - an async recv queued before an allreduce, then the send, completes.
** On emulated devices sends and recvs go through the host communicator (comm.c
** stages them); the NCCL path with its own p2p communicator and stream, the
** grouping of queued sends and recvs, and the abort at the failure
** (core/dist/nccl.c) run on real GPUs and, on emulated devices, against the
** stand-in NCCL (EMBER_NCCL_EMULATE=1): test_nccl_emu.c.
*/
#include "check.h"
#include "../../core/dist/comm.h"
#include "../../kernels/cuda.h"
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* -- Two replicas on two emulated devices ------------------------------------------ */

typedef struct job {
  em_local_group *ga, *gb;
  int rank;
  int fails;
  int coll_a, p2p_a, coll_b;
  size_t stage[5];           /* the comm thread's staging after each step */
  size_t xfer;               /* the callers' staging after the sends and recvs */
  size_t pageable;           /* copies to or from pageable memory in the calls */
  size_t pinned_before, pinned_open, pinned_after;
  double recv0, recvN, sum, pattern_recv, pattern_sum;
  double b_secs;             /* B's allreduce while A's collective stream sleeps */
} job;

static double at(em_state *S, const em_tensor *t, int64_t i) {
  em_tensor *c = NULL;
  if (em_to(S, t, em_tensor_dtype(t), EM_CPU, &c)) return -1e300;
  double v = t_get(c, i);
  em_tensor_release(c);
  return v;
}

static void sleep_1s(void *ud) {
  (void)ud;
  struct timespec ts = {1, 0};
  nanosleep(&ts, NULL);
}

static int allreduce_n(em_state *S, em_comm *c, int dev, int64_t n, double v) {
  em_tensor *t = NULL;
  int bad = em_full(S, &n, 1, v, EM_FLOAT32, dev, &t) || em_comm_allreduce(S, c, t, EM_COMM_SUM,
                                                                          NULL);
  em_tensor_release(t);
  return bad;
}

#define NS 2000

static void *replica(void *arg) {
  job *j = arg;
  em_state *S;
  if (em_open(&S, NULL)) { j->fails++; return NULL; }
  int dev = j->rank, peer = 1 - j->rank;
  em_comm *a = NULL, *b = NULL;
  emk_runtime *rt = NULL;
  if (em_cuda_device_count(S) < 2 || !(rt = emk_ctx(S)->rt)) { j->fails++; goto out; }
  j->pinned_before = emk_emu_bytes_in_use(rt, -1);
  if (em_comm_nccl(S, dev, j->ga, j->rank, 20, &a) ||
      em_comm_nccl(S, dev, j->gb, j->rank, 20, &b)) {
    fprintf(stderr, "rank %d: %s\n", j->rank, em_errmsg(S));
    j->fails++;
    goto out;
  }
  j->coll_a = emi_commdev_stream(a->dev, 0);
  j->p2p_a = emi_commdev_stream(a->dev, 1);
  j->coll_b = emi_commdev_stream(b->dev, 0);

  /* The comm thread's staging: grows to the largest, never shrinks. */
  size_t pg0 = emk_emu_pageable_copies(rt);
  j->fails += allreduce_n(S, a, dev, 1000, 1);
  j->stage[0] = emi_commdev_staging(a->dev, NULL);
  j->fails += allreduce_n(S, a, dev, 1000, 1);
  j->stage[1] = emi_commdev_staging(a->dev, NULL);
  j->fails += allreduce_n(S, a, dev, 500, 1);
  j->stage[2] = emi_commdev_staging(a->dev, NULL);
  j->fails += allreduce_n(S, a, dev, 3000, 1);
  j->stage[3] = emi_commdev_staging(a->dev, NULL);
  em_tensor *g = NULL, *all = NULL;
  int64_t n100 = 100;
  if (em_full(S, &n100, 1, j->rank, EM_FLOAT32, dev, &g) ||
      em_comm_allgather(S, a, g, &all, NULL))
    j->fails++;
  j->stage[4] = emi_commdev_staging(a->dev, NULL);

  /* Sends and recvs of device tensors, staged by the callers through pinned
  ** memory: a strided recv too (a copy on the device after). */
  int64_t ns = NS, two[2] = {NS / 2, 2};
  em_tensor *s = NULL, *r = NULL, *rt2 = NULL, *rs = NULL;
  if (em_arange(S, 0, NS, 1, EM_FLOAT32, dev, &s) || em_full(S, &ns, 1, -1, EM_FLOAT32, dev, &r) ||
      em_full(S, two, 2, -1, EM_FLOAT32, dev, &rt2) || em_transpose(S, rt2, 0, 1, &rs))
    j->fails++;
  if (j->rank == 0) {
    if (em_comm_send(S, a, s, peer, NULL) || em_comm_send(S, a, s, peer, NULL)) j->fails++;
  } else {
    if (em_comm_recv(S, a, r, peer, NULL) || em_comm_recv(S, a, rs, peer, NULL)) j->fails++;
  }
  emi_commdev_staging(a->dev, &j->xfer);

  /* An async recv, then an allreduce, then the send: on every replica. */
  em_tensor *pr = NULL, *pa = NULL;
  int64_t n8 = 8;
  em_comm_work *wr = NULL;
  if (em_full(S, &n8, 1, 0, EM_FLOAT32, dev, &pr) ||
      em_full(S, &n8, 1, j->rank + 1, EM_FLOAT32, dev, &pa) ||
      em_comm_recv(S, a, pr, peer, &wr) || em_comm_allreduce(S, a, pa, EM_COMM_SUM, NULL) ||
      em_comm_send(S, a, pa, peer, NULL) || em_comm_work_wait(S, wr))
    j->fails++;
  em_comm_work_free(wr);
  j->pageable = emk_emu_pageable_copies(rt) - pg0;
  if (j->rank == 1) {
    j->recv0 = at(S, r, 1);
    j->recvN = at(S, rt2, 1);       /* rt2[0][1] = rs[1][0]: element NS/2 of the arange */
  }
  j->pattern_recv = at(S, pr, 3);
  j->pattern_sum = at(S, pa, 5);
  j->sum = at(S, all, 150);

  /* Independent streams: A's collective stream sleeps a second (a device stuck
  ** there); B's allreduce goes on beside it. */
  emi_device *d = emi_device_attach(S, dev);
  const emi_services *svc = emi_services_of(S, dev);
  if (!d || !svc || svc->host_callback(d, (emi_stream)j->coll_a, sleep_1s, NULL)) j->fails++;
  double t0 = em_profile_clock();
  j->fails += allreduce_n(S, b, dev, 64, 1);
  j->b_secs = em_profile_clock() - t0;

  em_tensor_release(g);
  em_tensor_release(all);
  em_tensor_release(s);
  em_tensor_release(r);
  em_tensor_release(rt2);
  em_tensor_release(rs);
  em_tensor_release(pr);
  em_tensor_release(pa);
  j->pinned_open = emk_emu_bytes_in_use(rt, -1);
  em_comm_free(a);
  em_comm_free(b);
  a = b = NULL;
  j->pinned_after = emk_emu_bytes_in_use(rt, -1);
out:
  em_comm_free(a);
  em_comm_free(b);
  em_close(S);
  return NULL;
}

static void test_streams_and_staging(void) {
  job jobs[2];
  pthread_t th[2];
  em_local_group *ga = em_local_group_new(2), *gb = em_local_group_new(2);
  REQUIRE(ga && gb, "groups");
  for (int r = 0; r < 2; r++) {
    memset(&jobs[r], 0, sizeof jobs[r]);
    jobs[r].ga = ga;
    jobs[r].gb = gb;
    jobs[r].rank = r;
    pthread_create(&th[r], NULL, replica, &jobs[r]);
  }
  for (int r = 0; r < 2; r++) pthread_join(th[r], NULL);
  em_local_group_release(ga);
  em_local_group_release(gb);
  for (int r = 0; r < 2; r++) {
    job *j = &jobs[r];
    CHECK(j->fails == 0, "rank %d: %d calls failed", r, j->fails);
    /* streams of its own, none shared */
    CHECK(j->coll_a >= EMI_STREAM_OWN && j->p2p_a >= EMI_STREAM_OWN && j->coll_b >= EMI_STREAM_OWN,
          "rank %d: streams %d %d %d are not the communicators' own", r, j->coll_a, j->p2p_a,
          j->coll_b);
    CHECK(j->coll_a != j->p2p_a && j->coll_a != j->coll_b && j->p2p_a != j->coll_b,
          "rank %d: streams shared: %d %d %d", r, j->coll_a, j->p2p_a, j->coll_b);
    CHECK(j->b_secs < 0.7, "rank %d: B's allreduce took %.2f s behind A's stuck stream", r,
          j->b_secs);
    /* the comm thread's staging: 4000 bytes, reused, kept, grown to 12000 */
    CHECK(j->stage[0] == 4000 && j->stage[1] == 4000 && j->stage[2] == 4000,
          "rank %d: staging %zu %zu %zu, not 4000 kept", r, j->stage[0], j->stage[1],
          j->stage[2]);
    CHECK(j->stage[3] == 12000 && j->stage[4] == 12000, "rank %d: staging %zu %zu, not 12000",
          r, j->stage[3], j->stage[4]);
    /* the callers': the largest message (NS floats) */
    CHECK(j->xfer == NS * 4, "rank %d: the callers' staging %zu, not %d", r, j->xfer, NS * 4);
    CHECK(j->pageable == 0, "rank %d: %zu copies to or from pageable memory", r, j->pageable);
    CHECK(j->pinned_open >= j->pinned_before + 12000 + NS * 4,
          "rank %d: %zu pinned bytes while open (%zu before)", r, j->pinned_open,
          j->pinned_before);
    CHECK(j->pinned_after == j->pinned_before, "rank %d: %zu pinned bytes after the free, %zu "
          "before", r, j->pinned_after, j->pinned_before);
    CHECK_CLOSE(j->sum, 1, 0);                     /* allgather: rank 1's part */
    CHECK_CLOSE(j->pattern_recv, 3, 0);            /* the peer's allreduced values */
    CHECK_CLOSE(j->pattern_sum, 3, 0);
  }
  CHECK_CLOSE(jobs[1].recv0, 1, 0);
  CHECK_CLOSE(jobs[1].recvN, NS / 2, 0);
}

int main(void) {
  setenv("EMBER_CUDA_EMULATE", "2:64", 1);     /* the counts are the emulator's */
  RUN(test_streams_and_staging);
  return check_done();
}

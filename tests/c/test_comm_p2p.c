/*
** test_comm_p2p.c -- point-to-point (em_comm_send / em_comm_recv) on the local
** communicator, replicas being threads of this program with one em_state each.
**
** Each group starts N threads (replicas.h) that run one scenario and record
** what they saw; the checks run on the main thread after the join. Scenarios: every dtype (uint8 and bool too) from a strided source into a
** contiguous and a strided destination and back; a ring exchange on 3 and 4
** replicas; async receives posted before the sends they wait for, sends pending
** across an allreduce (the collective's numbering is not disturbed by them);
** a size mismatch (both sides' errors name both ranks, shapes and dtypes); a
** peer that aborts, one that leaves, one that never sends (timeout); the
** profile's events for sends and recvs; bad arguments. Runs under ThreadSanitizer in `make test SANITIZE=thread`.
*/
#include "replicas.h"
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

enum { MAXR = 4, ROWS = 7, COLS = 5 };

static const em_dtype dts[] = {EM_FLOAT32, EM_FLOAT64, EM_FLOAT16, EM_BFLOAT16, EM_INT32,
                               EM_INT64, EM_UINT8, EM_BOOL};
enum { NDT = sizeof dts / sizeof *dts };

/* small integers: exact in every dtype (0 .. 49: uint8 too) */
static double value(int from, int k, int64_t i) { return (double)((from + 1) * 10 + k * 3 + i % 17 - 8); }
/* bool holds their parity, so that its elements differ */
static double dvalue(em_dtype dt, int from, int k, int64_t i) {
  double v = value(from, k, i);
  return dt == EM_BOOL ? v - 2 * (double)(int64_t)(v / 2) : v;
}

/* A [ROWS, COLS] tensor whose row-major element i is value(from, k, i), made as
** the transpose of a [COLS, ROWS] one (so it is not contiguous). */
static em_status strided_source(em_state *S, em_dtype dt, int from, int k, em_tensor **out) {
  double v[ROWS * COLS];
  for (int r = 0; r < ROWS; r++)
    for (int c = 0; c < COLS; c++) v[c * ROWS + r] = dvalue(dt, from, k, r * COLS + c);
  em_tensor *base;
  em_status st = em_from_data(S, (int64_t[]){COLS, ROWS}, 2, dt, v, EM_FLOAT64, &base);
  if (st) return st;
  st = em_transpose(S, base, 0, 1, out);
  em_tensor_release(base);
  return st;
}

/* Compares t (any strides) with value(from, k, i) in row-major order. */
static em_status expect(em_state *S, replica *j, const char *what, const em_tensor *t, int from,
                        int k) {
  (void)S;
  int64_t n = em_tensor_numel(t);
  em_dtype dt = em_tensor_dtype(t);
  for (int64_t i = 0; i < n; i++) {
    j->checks++;
    double want = dvalue(dt, from, k, i);
    if (t_get(t, i) != want) replica_bad(j, what, i, t_get(t, i), want);
  }
  return EM_OK;
}

/* mode 0: rank 0 sends each dtype (strided) to rank 1, which receives into a
** contiguous tensor, then into a strided one, and sends the first back. */
static em_status run_dtypes(em_state *S, em_comm *c, replica *j) {
  em_status st = EM_OK;
  for (int d = 0; d < NDT && !st; d++) {
    em_dtype dt = dts[d];
    em_tensor *a = NULL, *b = NULL, *bt = NULL, *tmp = NULL;
    if (j->rank == 0) {
      if ((st = strided_source(S, dt, 0, d, &a))) break;
      if (!(st = em_comm_send(S, c, a, 1, NULL)) && !(st = em_comm_send(S, c, a, 1, NULL)) &&
          !(st = em_full(S, (int64_t[]){ROWS, COLS}, 2, 0, dt, EM_CPU, &b)) &&
          !(st = em_comm_recv(S, c, b, 1, NULL)))
        st = expect(S, j, em_dtype_name(dt), b, 1, d);
    } else {
      if (!(st = em_full(S, (int64_t[]){ROWS, COLS}, 2, 0, dt, EM_CPU, &b)) &&
          !(st = em_comm_recv(S, c, b, 0, NULL)) &&
          !(st = expect(S, j, em_dtype_name(dt), b, 0, d)) &&
          !(st = em_full(S, (int64_t[]){COLS, ROWS}, 2, 0, dt, EM_CPU, &tmp)) &&
          !(st = em_transpose(S, tmp, 0, 1, &bt)) &&
          !(st = em_comm_recv(S, c, bt, 0, NULL)) &&
          !(st = expect(S, j, "strided destination", bt, 0, d)) &&
          !(st = strided_source(S, dt, 1, d, &a)))
        st = em_comm_send(S, c, a, 0, NULL);
    }
    em_tensor_release(a);
    em_tensor_release(b);
    em_tensor_release(bt);
    em_tensor_release(tmp);
  }
  return st;
}

/* mode 1: a ring: everyone sends to the next rank (async) and receives from the
** previous one, twice. */
static em_status run_ring(em_state *S, em_comm *c, replica *j) {
  int next = (j->rank + 1) % j->size, prev = (j->rank + j->size - 1) % j->size;
  em_status st = EM_OK;
  for (int k = 0; k < 2 && !st; k++) {
    em_tensor *a = NULL, *b = NULL;
    em_comm_work *w = NULL;
    if (!(st = strided_source(S, EM_FLOAT32, j->rank, k, &a)) &&
        !(st = em_comm_send(S, c, a, next, &w)) &&
        !(st = em_full(S, (int64_t[]){ROWS, COLS}, 2, 0, EM_FLOAT32, EM_CPU, &b)) &&
        !(st = em_comm_recv(S, c, b, prev, NULL)))
      st = expect(S, j, "ring", b, prev, k);
    if (w) {
      em_status ws = em_comm_work_wait(S, w);
      if (!st) st = ws;
      em_comm_work_free(w);
    }
    em_tensor_release(a);
    em_tensor_release(b);
  }
  return st;
}

/* mode 2: out of order. Rank 0 posts two async receives from rank 1 before it
** sends; rank 1 posts its async receive first and then sends twice; then rank 0
** sends three async messages, both allreduce (while those are pending), and rank
** 1 receives the three afterwards. */
static em_status run_async(em_state *S, em_comm *c, replica *j) {
  em_status st = EM_OK;
  em_tensor *t[3] = {NULL, NULL, NULL}, *src = NULL, *sum = NULL;
  em_comm_work *w[3] = {NULL, NULL, NULL};
  int peer = 1 - j->rank;
  for (int k = 0; k < 3 && !st; k++)
    st = em_full(S, (int64_t[]){ROWS, COLS}, 2, 0, EM_FLOAT64, EM_CPU, &t[k]);
  if (!st && j->rank == 0) {
    if (!(st = em_comm_recv(S, c, t[0], peer, &w[0])) &&
        !(st = em_comm_recv(S, c, t[1], peer, &w[1])) &&
        !(st = strided_source(S, EM_FLOAT64, 0, 0, &src)) &&
        !(st = em_comm_send(S, c, src, peer, NULL)) &&
        !(st = em_comm_work_wait(S, w[1])) && !(st = em_comm_work_wait(S, w[0])) &&
        !(st = expect(S, j, "first recv", t[0], 1, 0)))
      st = expect(S, j, "second recv", t[1], 1, 1);
  } else if (!st) {
    em_tensor *a = NULL, *b = NULL;
    if (!(st = em_comm_recv(S, c, t[0], peer, &w[0])) &&
        !(st = strided_source(S, EM_FLOAT64, 1, 0, &a)) &&
        !(st = strided_source(S, EM_FLOAT64, 1, 1, &b)) &&
        !(st = em_comm_send(S, c, a, peer, NULL)) && !(st = em_comm_send(S, c, b, peer, NULL)) &&
        !(st = em_comm_work_wait(S, w[0])))
      st = expect(S, j, "recv after posting", t[0], 0, 0);
    em_tensor_release(a);
    em_tensor_release(b);
  }
  for (int k = 0; k < 3; k++) { em_comm_work_free(w[k]); w[k] = NULL; }
  /* sends pending across a collective */
  em_tensor *s[3] = {NULL, NULL, NULL};
  if (!st && j->rank == 0)
    for (int k = 0; k < 3 && !st; k++)
      if (!(st = strided_source(S, EM_FLOAT64, 0, 10 + k, &s[k])))
        st = em_comm_send(S, c, s[k], peer, &w[k]);
  if (!st && !(st = em_full(S, (int64_t[]){4}, 1, j->rank + 1, EM_FLOAT32, EM_CPU, &sum)) &&
      !(st = em_comm_allreduce(S, c, sum, EM_COMM_SUM, NULL))) {
    for (int i = 0; i < 4; i++) {
      j->checks++;
      if (t_get(sum, i) != 3) replica_bad(j, "allreduce among pending sends", i, t_get(sum, i), 3);
    }
  }
  if (!st && j->rank == 1)
    for (int k = 0; k < 3 && !st; k++)
      if (!(st = em_comm_recv(S, c, t[k], peer, NULL))) st = expect(S, j, "late recv", t[k], 0, 10 + k);
  for (int k = 0; k < 3; k++) {
    if (w[k]) {
      em_status ws = em_comm_work_wait(S, w[k]);
      if (!st) st = ws;
    }
    em_comm_work_free(w[k]);
    em_tensor_release(s[k]);
    em_tensor_release(t[k]);
  }
  em_tensor_release(src);
  em_tensor_release(sum);
  return st;
}

/* mode 3: rank 0 sends float32 [3, 4], rank 1 receives into float32 [5]; both
** fail; then a matching pair still goes through. */
static em_status run_mismatch(em_state *S, em_comm *c, replica *j) {
  em_tensor *t = NULL, *u = NULL;
  em_status st = j->rank == 0 ? em_full(S, (int64_t[]){3, 4}, 2, 1, EM_FLOAT32, EM_CPU, &t)
                              : em_full(S, (int64_t[]){5}, 1, 0, EM_FLOAT32, EM_CPU, &t);
  if (st) return st;
  st = j->rank == 0 ? em_comm_send(S, c, t, 1, NULL) : em_comm_recv(S, c, t, 0, NULL);
  if (st) snprintf(j->msg, sizeof j->msg, "%s", em_errmsg(S));
  if (st != EM_ERR_SHAPE) replica_bad(j, "mismatch status", 0, st, EM_ERR_SHAPE);
  j->st = st;
  if (!(st = em_full(S, (int64_t[]){6}, 1, 42, EM_INT64, EM_CPU, &u))) {
    if (j->rank == 1) em_fill_(S, u, 0);
    st = j->rank == 0 ? em_comm_send(S, c, u, 1, NULL) : em_comm_recv(S, c, u, 0, NULL);
    for (int i = 0; i < 6 && !st; i++) {
      j->checks++;
      if (t_get(u, i) != 42) replica_bad(j, "after the mismatch", i, t_get(u, i), 42);
    }
  }
  em_tensor_release(t);
  em_tensor_release(u);
  return st ? st : j->st;
}

/* modes 4 (replica 1 aborts), 5 (replica 1 leaves), 6 (replica 1 never sends):
** the others wait to receive from replica 1 (rank 2 with a send to it pending) */
static em_status run_dead_peer(em_state *S, em_comm *c, replica *j) {
  if (j->rank == 1) {
    if (j->mode == 4) { usleep(100000); em_comm_abort(c, "boom"); }
    if (j->mode == 5) { usleep(100000); em_local_group_leave(j->g, 1); }
    return EM_OK;
  }
  em_tensor *t = NULL;
  em_status st = em_full(S, (int64_t[]){8}, 1, 0, EM_FLOAT32, EM_CPU, &t);
  if (!st) st = j->rank == 2 ? em_comm_send(S, c, t, 1, NULL) : em_comm_recv(S, c, t, 1, NULL);
  em_tensor_release(t);
  return st;
}

/* mode 7: profiled. Rank 0 sends a strided float32 [7, 5] to rank 1 twice and
** receives an int64 [6] from it. Each replica's profile must hold every send
** and recv once as a communication event on its comm track, named after the
** pair's numbering, with its bytes and peer -- on the track of the same thread
** as its barrier: a local pair ends on whichever replica's thread posts second,
** so half of them were handed over -- and the caller's wait on each, under the
** same name. */
static void profile_expect(em_state *S, replica *j, const char *name, int64_t bytes, int peer) {
  const em_profile_event *ev;
  int64_t n = 0;
  int coll = 0, wait = 0, comm_track = -1;
  em_profile_events(S, &ev, &n);
  for (int64_t i = 0; i < n; i++)       /* this replica's comm thread ran the barrier */
    if (ev[i].kind == EM_PROF_COLLECTIVE && ev[i].name && !strcmp(ev[i].name, "barrier"))
      comm_track = ev[i].track;
  if (comm_track < 0) replica_bad(j, "no barrier in the profile", 0, 0, 1);
  for (int64_t i = 0; i < n; i++) {
    if (!ev[i].name || strcmp(ev[i].name, name) != 0) continue;
    const char *track = em_profile_track_name(S, ev[i].track);
    if (ev[i].kind == EM_PROF_COLLECTIVE) {
      coll++;
      j->checks++;
      if (ev[i].bytes != bytes || ev[i].arg1 != peer || ev[i].t1 < ev[i].t0 ||
          ev[i].flow != 0 || ev[i].track != comm_track || !track || strcmp(track, "comm"))
        replica_bad(j, name, ev[i].arg1, (double)ev[i].bytes, (double)bytes);
    } else if (ev[i].kind == EM_PROF_COMM_WAIT) {
      wait++;
      j->checks++;
      if (ev[i].bytes != bytes || (track && strcmp(track, "comm") == 0))
        replica_bad(j, name, -1, (double)ev[i].bytes, (double)bytes);
    }
  }
  if (coll != 1 || wait != 1) replica_bad(j, name, coll, wait, 1);
}

static em_status run_profile(em_state *S, em_comm *c, replica *j) {
  em_tensor *a = NULL, *b = NULL;
  int r = j->rank;
  em_status st = em_profile_start(S, NULL);
  if (!st) st = r == 0 ? strided_source(S, EM_FLOAT32, 0, 0, &a)
                       : em_full(S, (int64_t[]){ROWS, COLS}, 2, 0, EM_FLOAT32, EM_CPU, &a);
  if (!st) st = em_full(S, (int64_t[]){6}, 1, 7, EM_INT64, EM_CPU, &b);
  for (int k = 0; k < 2 && !st; k++)
    st = r == 0 ? em_comm_send(S, c, a, 1, NULL) : em_comm_recv(S, c, a, 0, NULL);
  if (!st) st = r == 0 ? em_comm_recv(S, c, b, 1, NULL) : em_comm_send(S, c, b, 0, NULL);
  if (!st) st = em_comm_barrier(S, c, NULL);
  em_status stop = em_profile_stop(S);
  if (!st) st = stop;
  if (!st && r == 0) {
    profile_expect(S, j, "send #1 to 1", ROWS * COLS * 4, 1);
    profile_expect(S, j, "send #2 to 1", ROWS * COLS * 4, 1);
    profile_expect(S, j, "recv #1 from 1", 48, 1);
  } else if (!st) {
    profile_expect(S, j, "recv #1 from 0", ROWS * COLS * 4, 0);
    profile_expect(S, j, "recv #2 from 0", ROWS * COLS * 4, 0);
    profile_expect(S, j, "send #1 to 0", 48, 0);
  }
  em_tensor_release(a);
  em_tensor_release(b);
  return st;
}

/* The scenario of each mode; see the tests below. */
static em_status scenario(em_state *S, em_comm *c, replica *j) {
  switch (j->mode) {
  case 0: return run_dtypes(S, c, j);
  case 1: return run_ring(S, c, j);
  case 2: return run_async(S, c, j);
  case 3: return run_mismatch(S, c, j);
  case 7: return run_profile(S, c, j);
  default: return run_dead_peer(S, c, j);
  }
}

static void test_dtypes(void) {
  static replica jobs[2];
  RUN_REPLICAS(2, 0, 60, scenario, jobs);
  CHECK_REPLICAS(jobs, 2, -1, NDT * ROWS * COLS);
}

static void test_ring(void) {
  static replica jobs[MAXR];
  for (int n = 3; n <= 4; n++) {
    RUN_REPLICAS(n, 1, 60, scenario, jobs);
    CHECK_REPLICAS(jobs, n, -1, 2 * ROWS * COLS);
  }
}

static void test_async(void) {
  static replica jobs[2];
  RUN_REPLICAS(2, 2, 60, scenario, jobs);
  CHECK_REPLICAS(jobs, 2, -1, ROWS * COLS + 4);
}

static void test_mismatch(void) {
  static replica jobs[2];
  RUN_REPLICAS(2, 3, 60, scenario, jobs);
  for (int r = 0; r < 2; r++) {
    CHECK(jobs[r].st == EM_ERR_SHAPE, "replica %d: status %d: %s", r, (int)jobs[r].st,
          jobs[r].msg);
    CHECK(strstr(jobs[r].msg, r ? "recv #1" : "send #1") &&
          strstr(jobs[r].msg, "replica 0 sent float32 [3, 4] (48 bytes)") &&
          strstr(jobs[r].msg, "replica 1 receives into float32 [5] (20 bytes)"),
          "message: %s", jobs[r].msg);
    CHECK(jobs[r].bad == 0 && jobs[r].checks == 6, "%s", jobs[r].why);
  }
}

static void test_dead_peer(void) {
  static replica jobs[3];
  static const char *want[] = {"replica 1 failed: boom", "replica 1 exited",
                               "timed out after 1 s: replica 1 did not"};
  for (int mode = 4; mode <= 6; mode++) {
    RUN_REPLICAS(3, mode, mode == 6 ? 1.0 : 60, scenario, jobs);
    CHECK(jobs[1].st == EM_OK, "mode %d, replica 1: %s", mode, jobs[1].msg);
    for (int r = 0; r < 3; r += 2) {
      CHECK(jobs[r].st == EM_ERR_IO, "mode %d, replica %d failed (%d)", mode, r, (int)jobs[r].st);
      CHECK(strstr(jobs[r].msg, r ? "send #1 to replica 1" : "recv #1 from replica 1") &&
            strstr(jobs[r].msg, want[mode - 4]), "mode %d, replica %d: %s", mode, r,
            jobs[r].msg);
    }
  }
}

static void test_profile(void) {
  static replica jobs[2];
  RUN_REPLICAS(2, 7, 60, scenario, jobs);
  CHECK_REPLICAS(jobs, 2, -1, 6);
}

static void test_arguments(em_state *S) {
  em_local_group *g = em_local_group_new(2);
  em_comm *c = NULL;
  REQUIRE_OK(S, em_comm_local(S, g, 0, 5, &c));
  em_tensor *t = NULL, *b = NULL;
  REQUIRE_OK(S, em_full(S, (int64_t[]){3}, 1, 0, EM_FLOAT32, EM_CPU, &t));
  CHECK(em_comm_send(S, c, t, 0, NULL) == EM_ERR_ARG &&
        strstr(em_errmsg(S), "send: peer 0 is not another rank of this job (0..1, this one is 0)"),
        "self: %s", em_errmsg(S));
  CHECK(em_comm_recv(S, c, t, 2, NULL) == EM_ERR_ARG && strstr(em_errmsg(S), "recv: peer 2"),
        "out of range: %s", em_errmsg(S));
  CHECK(em_comm_recv(S, c, t, -1, NULL) == EM_ERR_ARG, "negative: %s", em_errmsg(S));
  CHECK(em_comm_send(S, NULL, t, 1, NULL) == EM_ERR_ARG, "NULL comm: %s", em_errmsg(S));
  /* send and recv take bool (test_dtypes); the reductions do not */
  if (!em_full(S, (int64_t[]){3}, 1, 0, EM_BOOL, EM_CPU, &b)) {
    CHECK(em_comm_allreduce(S, c, b, EM_COMM_SUM, NULL) == EM_ERR_DTYPE &&
          strstr(em_errmsg(S), "allreduce: dtype bool"), "bool: %s", em_errmsg(S));
    em_tensor_release(b);
  }
  em_tensor_release(t);
  em_comm_free(c);
  em_local_group_release(g);
}

int main(void) {
  em_state *S;
  if (em_open(&S, NULL)) return 1;
  RUN(test_dtypes);
  RUN(test_ring);
  RUN(test_async);
  RUN(test_mismatch);
  RUN(test_dead_peer);
  RUN(test_profile);
  RUN(test_arguments, S);
  em_close(S);
  return check_done();
}

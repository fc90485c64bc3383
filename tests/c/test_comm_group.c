/*
** test_comm_group.c -- sub-communicators (em_comm_group) of the local
** communicator, replicas being threads of this program with one em_state each.
**
** Each run starts N threads (replicas.h) that run one scenario and record what
** they saw; the checks run on the main thread after the join. Scenarios: the groups {0, 2} and {1, 3} of 4 replicas at
** once, every collective and dtype from strided inputs against sums computed
** here, the group's own sends, and the world's sends and collectives between
** the same replicas interleaved with the group's (channels keep them apart), a
** group collective in flight across a world collective; a
** group of 3 of 4 with chunks of unequal size, and a group of that group; a
** member that aborts, one that exits, one that stays silent (timeout), members
** that call different collectives, members that ask for different groups; bad
** arguments. Runs under ThreadSanitizer in
** `make test SANITIZE=thread`.
*/
#include "replicas.h"
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

enum { MAXR = 4, ROWS = 6, COLS = 5, N = ROWS * COLS };

/* a replica's record and what it saw of its group */
typedef struct job {
  replica rp;
  char backend[32];
  int grank, gsize;
} job;

static const em_dtype dts[] = {EM_FLOAT32, EM_FLOAT64, EM_FLOAT16, EM_BFLOAT16, EM_INT32,
                               EM_INT64};
enum { NDT = sizeof dts / sizeof *dts };

/* small integers: sums of up to 4 are exact in every dtype */
static double value(int from, int k, int64_t i) { return (double)((from + 1) * 10 + k * 3 + i % 17 - 8); }

static void compare(job *j, const char *what, const em_tensor *t, const double *want, int64_t n) {
  if (em_tensor_numel(t) != n) {
    replica_bad(&j->rp, what, -1, (double)em_tensor_numel(t), (double)n);
    return;
  }
  for (int64_t i = 0; i < n; i++) {
    j->rp.checks++;
    if (t_get(t, i) != want[i]) replica_bad(&j->rp, what, i, t_get(t, i), want[i]);
  }
}

/* A [ROWS, COLS] tensor whose row-major element i is value(from, k, i), made as
** the transpose of a [COLS, ROWS] one (so it is not contiguous). */
static em_status strided_source(em_state *S, em_dtype dt, int from, int k, em_tensor **out) {
  double v[N];
  for (int r = 0; r < ROWS; r++)
    for (int c = 0; c < COLS; c++) v[c * ROWS + r] = value(from, k, r * COLS + c);
  em_tensor *base;
  em_status st = em_from_data(S, (int64_t[]){COLS, ROWS}, 2, dt, v, EM_FLOAT64, &base);
  if (st) return st;
  st = em_transpose(S, base, 0, 1, out);
  em_tensor_release(base);
  return st;
}

/* Every collective and dtype on group c whose members are world ranks m[0..n). */
static em_status collectives(em_state *S, em_comm *c, job *j, const int *m, int n) {
  em_status st = EM_OK;
  double want[MAXR * N];
  for (int d = 0; d < NDT && !st; d++) {
    em_dtype dt = dts[d];
    int fl = em_dtype_is_floating(dt);
    static const em_comm_op ops[] = {EM_COMM_SUM, EM_COMM_MEAN, EM_COMM_MAX, EM_COMM_MIN};
    for (int o = 0; o < 4 && !st; o++) {
      if (ops[o] == EM_COMM_MEAN && (!fl || n != 2)) continue;   /* x.5: exact */
      em_tensor *t = NULL;
      if ((st = strided_source(S, dt, j->rp.rank, d + o, &t))) break;
      if (!(st = em_comm_allreduce(S, c, t, ops[o], NULL))) {
        for (int64_t i = 0; i < N; i++) {
          double a = 0, mx = -1e9, mn = 1e9;
          for (int k = 0; k < n; k++) {
            double v = value(m[k], d + o, i);
            a += v, mx = v > mx ? v : mx, mn = v < mn ? v : mn;
          }
          want[i] = ops[o] == EM_COMM_SUM ? a : ops[o] == EM_COMM_MEAN ? a / n
                  : ops[o] == EM_COMM_MAX ? mx : mn;
        }
        compare(j, "allreduce", t, want, N);
      }
      em_tensor_release(t);
    }
    em_tensor *t = NULL, *out = NULL;
    /* broadcast from the group's rank 1 */
    if (!st && !(st = strided_source(S, dt, j->rp.rank, d, &t)) &&
        !(st = em_comm_broadcast(S, c, t, 1, NULL))) {
      for (int64_t i = 0; i < N; i++) want[i] = value(m[1], d, i);
      compare(j, "broadcast", t, want, N);
    }
    em_tensor_release(t);
    t = NULL;
    if (!st && !(st = strided_source(S, dt, j->rp.rank, d + 1, &t)) &&
        !(st = em_comm_allgather(S, c, t, &out, NULL))) {
      for (int k = 0; k < n; k++)
        for (int64_t i = 0; i < N; i++) want[k * N + i] = value(m[k], d + 1, i);
      compare(j, "allgather", out, want, (int64_t)n * N);
    }
    em_tensor_release(out);
    out = NULL;
    if (!st && !(st = em_comm_reduce_scatter(S, c, t, EM_COMM_SUM, &out, NULL))) {
      int me = em_comm_rank(c);
      for (int64_t i = 0; i < N / n; i++) {
        want[i] = 0;
        for (int k = 0; k < n; k++) want[i] += value(m[k], d + 1, me * (N / n) + i);
      }
      compare(j, "reduce_scatter", out, want, N / n);
    }
    em_tensor_release(out);
    em_tensor_release(t);
    if (!st) st = em_comm_barrier(S, c, NULL);
  }
  return st;
}

/* mode 0: world of 4, groups {0, 2} and {1, 3}. Rank 0 (2) first posts a world
** send to 2 (0), and the group's rank 0 a group send to its rank 1; both are
** received after the collectives, and a world allreduce runs between them. */
static em_status run_pairs(em_state *S, em_comm *w, job *j) {
  int m[2] = {j->rp.rank % 2, j->rp.rank % 2 + 2};
  em_comm *c = NULL;
  em_status st = em_comm_group(S, w, 2, m, &c);
  if (st) return st;
  j->grank = em_comm_rank(c);
  j->gsize = em_comm_size(c);
  snprintf(j->backend, sizeof j->backend, "%s", em_comm_backend(c));
  int other = j->rp.rank ^ 2;
  em_tensor *ws = NULL, *gs = NULL, *wr = NULL, *gr = NULL, *sum = NULL;
  em_comm_work *wsw = NULL, *gsw = NULL;
  double want[N];
  /* the group's rank 0 has its allreduce in flight across a world barrier, which
  ** its partner reaches only once that allreduce is done: the group's transfers
  ** do not wait behind the world's collective */
  em_tensor *early = NULL;
  em_comm_work *ew = NULL;
  if (!(st = em_full(S, (int64_t[]){5}, 1, j->rp.rank, EM_INT32, EM_CPU, &early))) {
    if (j->grank == 0) {
      if (!(st = em_comm_allreduce(S, c, early, EM_COMM_SUM, &ew)) &&
          !(st = em_comm_barrier(S, w, NULL)))
        st = em_comm_work_wait(S, ew);
    } else if (!(st = em_comm_allreduce(S, c, early, EM_COMM_SUM, NULL))) {
      st = em_comm_barrier(S, w, NULL);
    }
    double e = 2 * (j->rp.rank % 2) + 2;
    compare(j, "allreduce across a world barrier", early, (double[]){e, e, e, e, e}, 5);
  }
  em_comm_work_free(ew);
  em_tensor_release(early);
  if (!st && !(st = strided_source(S, EM_FLOAT32, j->rp.rank, 40, &ws)) &&
      !(st = em_comm_send(S, w, ws, other, &wsw)) &&
      !(st = strided_source(S, EM_INT64, j->rp.rank, 41, &gs)) &&
      !(st = em_comm_send(S, c, gs, 1 - j->grank, &gsw)) &&
      !(st = collectives(S, c, j, m, 2)) &&
      !(st = em_full(S, (int64_t[]){4}, 1, j->rp.rank, EM_FLOAT64, EM_CPU, &sum)) &&
      !(st = em_comm_allreduce(S, w, sum, EM_COMM_SUM, NULL))) {
    double six[4] = {6, 6, 6, 6};
    compare(j, "world allreduce", sum, six, 4);
    /* in the other order than sent: the group's and the world's are apart */
    if (!(st = em_full(S, (int64_t[]){ROWS, COLS}, 2, 0, EM_INT64, EM_CPU, &gr)) &&
        !(st = em_comm_recv(S, c, gr, 1 - j->grank, NULL))) {
      for (int64_t i = 0; i < N; i++) want[i] = value(other, 41, i);
      compare(j, "group recv", gr, want, N);
    }
    if (!st && !(st = em_full(S, (int64_t[]){ROWS, COLS}, 2, 0, EM_FLOAT32, EM_CPU, &wr)) &&
        !(st = em_comm_recv(S, w, wr, other, NULL))) {
      for (int64_t i = 0; i < N; i++) want[i] = value(other, 40, i);
      compare(j, "world recv", wr, want, N);
    }
  }
  em_comm_work *ws2[2] = {wsw, gsw};
  for (int k = 0; k < 2; k++) {
    if (!ws2[k]) continue;
    em_status s2 = em_comm_work_wait(S, ws2[k]);
    if (!st) st = s2;
    em_comm_work_free(ws2[k]);
  }
  em_tensor_release(ws);
  em_tensor_release(gs);
  em_tensor_release(wr);
  em_tensor_release(gr);
  em_tensor_release(sum);
  em_comm_free(c);
  return st;
}

/* mode 1: world of 4, group {0, 1, 3} (rank 2 makes none): every collective,
** an async allreduce of 7 elements (chunks of 2, 2, 3), then the group {0, 2}
** of that group (world 0 and 3). */
static em_status run_three(em_state *S, em_comm *w, job *j) {
  if (j->rp.rank == 2) return EM_OK;
  int m[3] = {0, 1, 3};
  em_comm *c = NULL, *cc = NULL;
  em_status st = em_comm_group(S, w, 3, m, &c);
  if (st) return st;
  j->grank = em_comm_rank(c);
  j->gsize = em_comm_size(c);
  em_tensor *t = NULL;
  em_comm_work *wk = NULL;
  if (!(st = collectives(S, c, j, m, 3)) &&
      !(st = em_full(S, (int64_t[]){7}, 1, j->rp.rank + 1, EM_FLOAT32, EM_CPU, &t)) &&
      !(st = em_comm_allreduce(S, c, t, EM_COMM_SUM, &wk)) &&
      !(st = em_comm_work_wait(S, wk))) {
    double seven[7] = {7, 7, 7, 7, 7, 7, 7};      /* 1 + 2 + 4 */
    compare(j, "allreduce of 7", t, seven, 7);
  }
  em_comm_work_free(wk);
  em_tensor_release(t);
  t = NULL;
  if (!st && j->grank != 1) {
    int mm[2] = {0, 2};
    if (!(st = em_comm_group(S, c, 2, mm, &cc)) &&
        !(st = em_full(S, (int64_t[]){3}, 1, j->rp.rank, EM_INT32, EM_CPU, &t)) &&
        !(st = em_comm_allreduce(S, cc, t, EM_COMM_SUM, NULL))) {
      double three[3] = {3, 3, 3};                  /* world 0 + world 3 */
      compare(j, "group of a group", t, three, 3);
      if (em_comm_rank(cc) != (j->rp.rank == 3) || em_comm_size(cc) != 2)
        replica_bad(&j->rp, "group of a group's rank", 0, em_comm_rank(cc), j->rp.rank == 3);
    }
    em_tensor_release(t);
    em_comm_free(cc);
  }
  em_comm_free(c);
  return st;
}

/* modes 2 (world 2 aborts), 3 (world 2 exits), 4 (world 2 stays silent), 5
** (world 2 calls a broadcast where the others allreduce): the group {1, 2, 3};
** world 0 is in no group. */
static em_status run_dead(em_state *S, em_comm *w, job *j) {
  if (j->rp.rank == 0) return EM_OK;
  int m[3] = {1, 2, 3};
  em_comm *c = NULL;
  em_status st = em_comm_group(S, w, 3, m, &c);
  if (st) return st;
  em_tensor *t = NULL;
  if ((st = em_full(S, (int64_t[]){8}, 1, 1, EM_FLOAT32, EM_CPU, &t))) goto done;
  if (j->rp.rank == 2 && j->rp.mode != 5) {
    usleep(100000);
    if (j->rp.mode == 2) em_comm_abort(w, "boom");
    if (j->rp.mode == 3) em_local_group_leave(j->rp.g, 2);
    if (j->rp.mode == 4) usleep(1500000);
    goto done;
  }
  st = j->rp.rank == 2 ? em_comm_broadcast(S, c, t, 0, NULL)
                       : em_comm_allreduce(S, c, t, EM_COMM_SUM, NULL);
done:
  em_tensor_release(t);
  em_comm_free(c);
  return st;
}

/* mode 6: world 0 and 1 make the group {0, 1, 2}, world 2 the group {0, 2}. */
static em_status run_disagree(em_state *S, em_comm *w, job *j) {
  if (j->rp.rank == 3) return EM_OK;
  em_comm *c = NULL;
  em_status st = j->rp.rank == 2 ? em_comm_group(S, w, 2, (int[]){0, 2}, &c)
                                 : em_comm_group(S, w, 3, (int[]){0, 1, 2}, &c);
  em_comm_free(c);
  return st;
}

/* The scenario of each mode; see the tests below. */
static em_status scenario(em_state *S, em_comm *c, replica *rp) {
  job *j = (job *)rp;
  switch (rp->mode) {
  case 0: return run_pairs(S, c, j);
  case 1: return run_three(S, c, j);
  case 6: return run_disagree(S, c, j);
  default: return run_dead(S, c, j);
  }
}

static void test_pairs(void) {
  static job jobs[4];
  RUN_REPLICAS(4, 0, 60, scenario, jobs);
  /* per dtype: allreduce (3 ops, 4 for floats), broadcast, allgather (2N), reduce_scatter
  ** (N/2); then the world allreduce (4), the world's and the group's recv */
  CHECK_REPLICAS(jobs, 4, -1, 5 + NDT * (6 * N + N / 2) + 4 * N + 4 + 2 * N);
  for (int r = 0; r < 4; r++) {
    CHECK(jobs[r].grank == r / 2 && jobs[r].gsize == 2, "replica %d: group rank %d of %d", r,
          jobs[r].grank, jobs[r].gsize);
    CHECK(!strcmp(jobs[r].backend, "group(local)"), "backend %s", jobs[r].backend);
  }
}

static void test_three(void) {
  static job jobs[4];
  RUN_REPLICAS(4, 1, 60, scenario, jobs);
  CHECK_REPLICAS(jobs, 4, 2, NDT * (3 * N + N + 3 * N + N / 3) + 7);
  CHECK(jobs[0].grank == 0 && jobs[1].grank == 1 && jobs[3].grank == 2 && jobs[3].gsize == 3,
        "ranks %d %d %d", jobs[0].grank, jobs[1].grank, jobs[3].grank);
  CHECK(jobs[0].rp.checks == jobs[3].rp.checks && jobs[0].rp.checks == jobs[1].rp.checks + 3,
        "the group of a group compared (%d, %d, %d)", jobs[0].rp.checks, jobs[1].rp.checks,
        jobs[3].rp.checks);
}

static void test_dead(void) {
  static job jobs[4];
  static const char *want[] = {"replica 1 (world 2) failed: boom", "replica 1 (world 2) exited",
                               "timed out after 1 s", "called different collectives"};
  for (int mode = 2; mode <= 5; mode++) {
    RUN_REPLICAS(4, mode, mode == 4 ? 1.0 : 60, scenario, jobs);
    CHECK(jobs[0].rp.st == EM_OK, "mode %d, world 0 (no group): %s", mode, jobs[0].rp.msg);
    for (int r = 1; r < 4; r++) {
      if (r == 2 && mode != 5) {
        CHECK(jobs[r].rp.st == EM_OK, "mode %d, world 2: %s", mode, jobs[r].rp.msg);
        continue;
      }
      CHECK(jobs[r].rp.st == EM_ERR_IO, "mode %d, world %d: status %d: %s", mode, r,
            (int)jobs[r].rp.st, jobs[r].rp.msg);
      CHECK(strstr(jobs[r].rp.msg, want[mode - 2]) != NULL, "mode %d, world %d: %s", mode, r,
            jobs[r].rp.msg);
      if (mode == 4)   /* the silent one, named in both numberings */
        CHECK(strstr(jobs[r].rp.msg, "replica 1 (world 2)") != NULL, "mode 4, world %d: %s", r,
              jobs[r].rp.msg);
      else if (mode != 5)
        CHECK(strstr(jobs[r].rp.msg, "allreduce #1") != NULL, "mode %d, world %d: %s", mode, r,
              jobs[r].rp.msg);
    }
  }
}

static void test_disagree(void) {
  static job jobs[4];
  RUN_REPLICAS(4, 6, 60, scenario, jobs);
  for (int r = 0; r < 3; r++)
    CHECK(jobs[r].rp.st == EM_ERR_ARG && strstr(jobs[r].rp.msg, "the members asked for different "
          "groups: replica 2 (world 2) asked for a group of 2 replicas, replica 0 (world 0) "
          "for 3"), "world %d: %s", r, jobs[r].rp.msg);
  CHECK(jobs[3].rp.st == EM_OK, "world 3: %s", jobs[3].rp.msg);
}

static void test_arguments(em_state *S) {
  em_local_group *g = em_local_group_new(4);
  em_comm *w = NULL, *c = (em_comm *)1;
  REQUIRE_OK(S, em_comm_local(S, g, 1, 5, &w));
  static const struct { int n; int r[4]; const char *msg; } bad[] = {
    {0, {0}, "a group of 0 replicas of a communicator of 4"},
    {5, {0, 1, 2, 3}, "a group of 5 replicas"},
    {2, {1, 4}, "rank 4 (ranks[1]) is not a rank of the parent communicator (0..3)"},
    {2, {-1, 1}, "rank -1 (ranks[0])"},
    {3, {0, 2, 1}, "ascending and distinct: ranks[2] = 1 follows ranks[1] = 2"},
    {2, {1, 1}, "ranks[1] = 1 follows ranks[0] = 1"},
    {2, {0, 2}, "this replica (rank 1 of the parent) is not one of the 2 ranks"},
  };
  for (size_t k = 0; k < sizeof bad / sizeof *bad; k++) {
    CHECK(em_comm_group(S, w, bad[k].n, bad[k].r, &c) == EM_ERR_ARG &&
          strstr(em_errmsg(S), bad[k].msg) && c == NULL, "case %d: %s", (int)k, em_errmsg(S));
    c = (em_comm *)1;
  }
  CHECK(em_comm_group(S, NULL, 1, (int[]){0}, &c) == EM_ERR_ARG &&
        strstr(em_errmsg(S), "NULL parent"), "NULL parent: %s", em_errmsg(S));
  CHECK(em_comm_group(S, w, 1, NULL, &c) == EM_ERR_ARG, "NULL ranks: %s", em_errmsg(S));
  /* a group of one: no other member to agree with; collectives are copies */
  REQUIRE_OK(S, em_comm_group(S, w, 1, (int[]){1}, &c));
  CHECK(em_comm_rank(c) == 0 && em_comm_size(c) == 1, "group of one");
  em_tensor *t = NULL, *out = NULL;
  REQUIRE_OK(S, em_full(S, (int64_t[]){4}, 1, 3, EM_FLOAT32, EM_CPU, &t));
  CHECK_OK(S, em_comm_allreduce(S, c, t, EM_COMM_SUM, NULL));
  CHECK_VALS(t, 0, V(3, 3, 3, 3));
  CHECK_OK(S, em_comm_allgather(S, c, t, &out, NULL));
  CHECK_VALS(out, 0, V(3, 3, 3, 3));
  em_tensor_release(out);
  CHECK(em_comm_broadcast(S, c, t, 1, NULL) == EM_ERR_ARG &&
        strstr(em_errmsg(S), "root 1 is not a rank of this job (0..0)"), "root: %s", em_errmsg(S));
  CHECK(em_comm_send(S, c, t, 0, NULL) == EM_ERR_ARG, "send to itself: %s", em_errmsg(S));
  /* aborting a group fails its parent too: the job hears it */
  em_comm_abort(c, "stage 3 broke");
  CHECK(em_comm_status(S, c) == EM_ERR_IO && strstr(em_errmsg(S), "replica 0 (world 1) failed: "
        "stage 3 broke"), "group: %s", em_errmsg(S));
  CHECK(em_comm_status(S, w) == EM_ERR_IO && strstr(em_errmsg(S), "replica 0 (world 1) failed: "
        "stage 3 broke"), "parent: %s", em_errmsg(S));
  em_tensor_release(t);
  em_comm_free(c);
  em_comm_free(w);
  em_local_group_release(g);
}

int main(void) {
  em_state *S;
  if (em_open(&S, NULL)) return 1;
  RUN(test_pairs);
  RUN(test_three);
  RUN(test_dead);
  RUN(test_disagree);
  RUN(test_arguments, S);
  em_close(S);
  return check_done();
}

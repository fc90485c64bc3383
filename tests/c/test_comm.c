/*
** test_comm.c -- the local communicator and the gradient reducer through the C
** API, as an embedding host would use them: replicas are threads of this program,
** each with its own em_state, joined by one em_local_group.
**
** Each group starts N threads (replicas.h) that run a scenario and record what
** they saw; the checks happen on the main thread after the join. Scenarios:
** collectives against values computed in double,
** bit-identical sums across replicas, a replica that aborts while the others wait,
** a replica that never arrives (timeout naming it), replicas that call different
** collectives, and the reducer averaging gradients in several buckets during
** em_backward. Runs under ThreadSanitizer in `make test SANITIZE=thread`.
*/
#include "replicas.h"
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

enum { MAXR = 4, N_ELEMS = 1001 };

/* what test_collectives compares across replicas, after the replica's record */
typedef struct job {
  replica rp;
  double out[N_ELEMS];
  int64_t nout;
} job;

static double input(int r, int64_t i) { return (double)((r + 1) * (i % 13) - 6 + r); }

static em_status make_input(em_state *S, int r, em_dtype dt, int64_t n, em_tensor **t) {
  double *v = malloc(sizeof *v * (size_t)n);
  if (!v) return EM_ERR_NOMEM;
  for (int64_t i = 0; i < n; i++) v[i] = input(r, i);
  em_status st = em_from_data(S, &n, 1, dt, v, EM_FLOAT64, t);
  free(v);
  return st;
}

/* mode 0: collectives and their values */
static em_status run_collectives(em_state *S, em_comm *c, replica *rp) {
  job *j = (job *)rp;
  static const em_dtype dts[] = {EM_FLOAT32, EM_FLOAT64, EM_FLOAT16, EM_BFLOAT16, EM_INT32,
                                 EM_INT64};
  em_status st = EM_OK;
  for (size_t d = 0; d < sizeof dts / sizeof *dts && !st; d++) {
    em_dtype dt = dts[d];
    for (int op = EM_COMM_SUM; op <= EM_COMM_MIN && !st; op++) {
      if (op == EM_COMM_MEAN && !em_dtype_is_floating(dt)) continue;
      em_tensor *t;
      if ((st = make_input(S, rp->rank, dt, N_ELEMS, &t))) break;
      em_comm_work *w = NULL;
      st = em_comm_allreduce(S, c, t, (em_comm_op)op, op == EM_COMM_MAX ? &w : NULL);
      if (!st && w) st = em_comm_work_wait(S, w);
      em_comm_work_free(w);
      for (int64_t i = 0; i < N_ELEMS && !st; i++) {
        double want = op == EM_COMM_MAX ? -1e300 : op == EM_COMM_MIN ? 1e300 : 0;
        for (int r = 0; r < rp->size; r++) {
          double x = input(r, i);
          if (op == EM_COMM_MAX) want = x > want ? x : want;
          else if (op == EM_COMM_MIN) want = x < want ? x : want;
          else want += x;
        }
        if (op == EM_COMM_MEAN) want /= rp->size;
        double got = t_get(t, i), tol = dt == EM_FLOAT16 || dt == EM_BFLOAT16 ? 0.02 : 1e-6;
        rp->checks++;
        if (!chk_close(got, want, tol)) replica_bad(rp, em_dtype_name(dt), i, got, want);
      }
      if (!st && dt == EM_FLOAT32 && op == EM_COMM_MEAN) {
        j->nout = N_ELEMS;
        for (int64_t i = 0; i < N_ELEMS; i++) j->out[i] = t_get(t, i);
      }
      em_tensor_release(t);
    }
  }
  /* allgather of a transposed (strided) (2, 3) view: rank order along dim 0 */
  em_tensor *base = NULL, *tt = NULL, *g = NULL;
  if (!st) st = make_input(S, rp->rank, EM_FLOAT64, 6, &base);
  if (!st) st = em_reshape(S, base, (int64_t[]){3, 2}, 2, &tt);
  if (!st) {
    em_tensor *tr;
    st = em_transpose(S, tt, 0, 1, &tr);
    em_tensor_release(tt);
    tt = tr;
  }
  if (!st) st = em_comm_allgather(S, c, tt, &g, NULL);
  if (!st) {
    if (em_tensor_sizes(g)[0] != 2 * rp->size)
      replica_bad(rp, "allgather rows", 0, em_tensor_sizes(g)[0], 2 * rp->size);
    for (int r = 0; r < rp->size; r++)
      for (int64_t i = 0; i < 6; i++) {
        int64_t row = i / 3, col = i % 3;      /* of the transposed (2, 3) */
        double want = input(r, col * 2 + row), got = t_get(g, r * 6 + i);
        rp->checks++;
        if (got != want) replica_bad(rp, "allgather", r * 6 + i, got, want);
      }
  }
  em_tensor_release(base);
  em_tensor_release(tt);
  em_tensor_release(g);
  if (!st) st = em_comm_barrier(S, c, NULL);
  return st;
}

/* mode 3: the reducer. loss = sum(x_r * w1) + sum(x_r * w2) + sum(x_r * w3):
** d loss / d w_k = x_r, averaged = mean over r of x_r. Small buckets: several. */
static em_status run_reducer(em_state *S, em_comm *c, replica *rp) {
  em_tensor *w[3] = {0}, *x = NULL, *loss = NULL;
  const char *names[3] = {"w1", "w2", "w3"};
  em_reducer *red = NULL;
  em_status st = EM_OK;
  for (int k = 0; k < 3 && !st; k++) {
    st = em_full(S, (int64_t[]){300}, 1, 0.5, EM_FLOAT32, EM_CPU, &w[k]);
    if (!st) st = em_tensor_set_requires_grad(S, w[k], 1);
  }
  if (!st) st = make_input(S, rp->rank, EM_FLOAT32, 300, &x);
  if (!st) st = em_reducer_new(S, c, w, names, 3, 1000, 1000, 0, &red);
  if (!st && em_reducer_num_buckets(red) != 3)
    replica_bad(rp, "buckets", 0, em_reducer_num_buckets(red), 3);
  for (int step = 0; step < 2 && !st; step++) {
    st = em_reducer_prepare(S, red);
    em_tensor *acc = NULL;
    for (int k = 0; k < 3 && !st; k++) {
      em_tensor *p, *s, *sum;
      if ((st = em_binary(S, EM_MUL, x, w[k], &p))) break;
      st = em_reduce(S, EM_SUM, p, (int[]){0}, 1, 0, &s);
      em_tensor_release(p);
      if (st) break;
      if (acc) {
        st = em_binary(S, EM_ADD, acc, s, &sum);
        em_tensor_release(acc);
        em_tensor_release(s);
        acc = sum;
      } else {
        acc = s;
      }
    }
    if (!st) st = em_backward(S, acc, NULL);
    em_tensor_release(acc);
    for (int k = 0; k < 3 && !st; k++) {
      em_tensor *gk = em_tensor_grad(w[k]);
      for (int64_t i = 0; i < 300 && gk; i++) {
        double want = 0;
        for (int r = 0; r < rp->size; r++) want += input(r, i);
        want = want / rp->size * (step + 1);      /* grads accumulate: not zeroed */
        double got = t_get(gk, i);
        rp->checks++;
        if (!chk_close(got, want, 1e-5)) replica_bad(rp, names[k], i, got, want);
      }
      if (!gk) replica_bad(rp, "no grad", k, 0, 1);
      em_tensor_release(gk);
    }
  }
  em_reducer_free(red);
  for (int k = 0; k < 3; k++) em_tensor_release(w[k]);
  em_tensor_release(x);
  em_tensor_release(loss);
  return st;
}

/* The scenario of each mode; see the tests below. */
static em_status scenario(em_state *S, em_comm *c, replica *rp) {
  em_tensor *t = NULL;
  em_status st = EM_OK;
  switch (rp->mode) {
  case 0: return run_collectives(S, c, rp);
  case 3: return run_reducer(S, c, rp);
  case 1:               /* replica 1 aborts, the others wait in an allreduce */
    if (rp->rank == 1) { usleep(100000); em_comm_abort(c, "boom"); return EM_OK; }
    if (!(st = em_full(S, (int64_t[]){8}, 1, 1, EM_FLOAT32, EM_CPU, &t)))
      st = em_comm_allreduce(S, c, t, EM_COMM_SUM, NULL);
    break;
  case 2:               /* replica 1 never arrives */
    if (rp->rank == 1) return EM_OK;
    if (!(st = em_full(S, (int64_t[]){8}, 1, 1, EM_FLOAT32, EM_CPU, &t)))
      st = em_comm_allreduce(S, c, t, EM_COMM_SUM, NULL);
    break;
  case 5:               /* all meet once; then replica 1 leaves while the others wait */
    if ((st = em_comm_barrier(S, c, NULL))) break;
    if (rp->rank == 1) { usleep(100000); em_local_group_leave(rp->g, 1); return EM_OK; }
    if (!(st = em_full(S, (int64_t[]){8}, 1, 1, EM_FLOAT32, EM_CPU, &t)))
      st = em_comm_allreduce(S, c, t, EM_COMM_SUM, NULL);
    break;
  case 4:               /* replica 1 broadcasts while the others allreduce */
    if (!(st = em_full(S, (int64_t[]){8}, 1, 1, EM_FLOAT32, EM_CPU, &t)))
      st = rp->rank == 1 ? em_comm_broadcast(S, c, t, 0, NULL)
                         : em_comm_allreduce(S, c, t, EM_COMM_SUM, NULL);
    break;
  }
  em_tensor_release(t);
  /* after a failure every later call fails the same way (the message kept is
  ** the first failure's) */
  if (st) {
    snprintf(rp->msg, sizeof rp->msg, "%s", em_errmsg(S));
    if (!em_comm_barrier(S, c, NULL)) replica_bad(rp, "a later collective succeeded", 0, 0, 1);
  }
  return st;
}

static void test_collectives(void) {
  static job jobs[MAXR];
  for (int n = 1; n <= MAXR; n++) {
    RUN_REPLICAS(n, 0, 60, scenario, jobs);
    /* per dtype, each op's N_ELEMS values (mean: floats only); the allgather */
    CHECK_REPLICAS(jobs, n, -1, (4 * 4 + 2 * 3) * N_ELEMS + 6 * n);
    for (int r = 0; r < n; r++)
      CHECK(jobs[r].nout == N_ELEMS &&
            memcmp(jobs[r].out, jobs[0].out, sizeof jobs[0].out) == 0,
            "%d replicas: replica %d's mean differs from replica 0's", n, r);
  }
}

static void test_abort(void) {
  static replica jobs[3];
  RUN_REPLICAS(3, 1, 60, scenario, jobs);
  for (int r = 0; r < 3; r += 2) {
    CHECK(jobs[r].st != EM_OK, "replica %d's allreduce failed", r);
    CHECK(strstr(jobs[r].msg, "replica 1 failed: boom") != NULL, "message: %s", jobs[r].msg);
    CHECK(jobs[r].secs < 5, "ended after %.2f s", jobs[r].secs);
    CHECK(jobs[r].bad == 0, "%s", jobs[r].why);
  }
}

static void test_timeout(void) {
  static replica jobs[3];
  RUN_REPLICAS(3, 2, 1.0, scenario, jobs);
  for (int r = 0; r < 3; r += 2) {
    CHECK(jobs[r].st != EM_OK, "replica %d's allreduce failed", r);
    CHECK(strstr(jobs[r].msg, "allreduce #1 (float32 x 8) timed out after 1 s: replica 1 "
                               "(at collective #0) did not arrive") != NULL,
          "message: %s", jobs[r].msg);
    CHECK(jobs[r].secs >= 0.9 && jobs[r].secs < 5, "ended after %.2f s", jobs[r].secs);
  }
}

static void test_mismatch(void) {
  static replica jobs[3];
  RUN_REPLICAS(3, 4, 60, scenario, jobs);
  for (int r = 0; r < 3; r++) {
    CHECK(jobs[r].st != EM_OK, "replica %d failed", r);
    CHECK(strstr(jobs[r].msg, "replicas called different collectives") &&
          strstr(jobs[r].msg, "replica 1 called broadcast"), "message: %s", jobs[r].msg);
  }
}

static void test_leave(void) {
  static replica jobs[3];
  RUN_REPLICAS(3, 5, 60, scenario, jobs);
  CHECK(jobs[1].st == EM_OK, "replica 1: %s", jobs[1].msg);
  for (int r = 0; r < 3; r += 2) {
    CHECK(jobs[r].st == EM_ERR_IO, "replica %d's allreduce failed (%d)", r, (int)jobs[r].st);
    CHECK(strstr(jobs[r].msg, "replica 1 exited") != NULL && !strstr(jobs[r].msg, "timed out"),
          "message: %s", jobs[r].msg);
    CHECK(jobs[r].bad == 0, "%s", jobs[r].why);
  }
}

static void test_reducer(void) {
  static replica jobs[MAXR];
  for (int n = 1; n <= MAXR; n += 2) {
    RUN_REPLICAS(n, 3, 60, scenario, jobs);
    CHECK_REPLICAS(jobs, n, -1, 2 * 3 * 300);       /* 2 steps, 3 weights, 300 values */
  }
}

static void test_arguments_and_plan(em_state *S) {
  em_local_group *g = em_local_group_new(1);
  em_comm *c = NULL;
  CHECK_ERR(S, em_comm_local(S, g, 1, 0, &c), EM_ERR_ARG, "rank 1", "1 replicas");
  REQUIRE_OK(S, em_comm_local(S, g, 0, 0, &c));
  em_tensor *t, *u;
  REQUIRE_OK(S, em_full(S, (int64_t[]){4}, 1, 1, EM_UINT8, EM_CPU, &t));
  CHECK_ERR(S, em_comm_allreduce(S, c, t, EM_COMM_SUM, NULL), EM_ERR_DTYPE, "allreduce", "uint8");
  em_tensor_release(t);
  REQUIRE_OK(S, em_full(S, (int64_t[]){4}, 1, 1, EM_INT32, EM_CPU, &t));
  CHECK_ERR(S, em_comm_allreduce(S, c, t, EM_COMM_MEAN, NULL), EM_ERR_DTYPE, "'mean'", "int32");
  CHECK_ERR(S, em_comm_broadcast(S, c, t, 2, NULL), EM_ERR_ARG, "root 2");
  em_tensor_release(t);
  REQUIRE_OK(S, em_full(S, (int64_t[]){0}, 1, 1, EM_FLOAT32, EM_CPU, &t));
  CHECK_OK(S, em_comm_allreduce(S, c, t, EM_COMM_SUM, NULL));     /* empty is fine */
  CHECK_OK(S, em_comm_allgather(S, c, t, &u, NULL));
  em_tensor_release(u);
  em_tensor_release(t);
  /* the plan: buckets close once they hold their cap (first 1000 bytes, then
  ** 2400), in reverse order of the parameters: {w3}, {w2, w1} */
  em_tensor *w[3];
  const char *names[3] = {"w1", "w2", "w3"};
  for (int k = 0; k < 3; k++) {
    REQUIRE_OK(S, em_full(S, (int64_t[]){300}, 1, 0.5, EM_FLOAT32, EM_CPU, &w[k]));
    REQUIRE_OK(S, em_tensor_set_requires_grad(S, w[k], 1));
  }
  em_reducer *red;
  REQUIRE_OK(S, em_reducer_new(S, c, w, names, 3, 2400, 1000, 0, &red));
  CHECK(em_reducer_num_buckets(red) == 2 && em_reducer_bucket_size(red, 0) == 1 &&
        em_reducer_bucket_size(red, 1) == 2, "buckets %d: %d, %d", em_reducer_num_buckets(red),
        em_reducer_bucket_size(red, 0), em_reducer_bucket_size(red, 1));
  em_reducer_free(red);
  CHECK_ERR(S, em_reducer_new(S, c, w, NULL, 3, 0, 0, 0, NULL), EM_ERR_ARG, "wrap");
  for (int k = 0; k < 3; k++) em_tensor_release(w[k]);
  em_comm_abort(c, "stop");
  CHECK_ERR(S, em_comm_barrier(S, c, NULL), EM_ERR_IO, "replica 0 failed: stop");
  em_comm_free(c);
  em_local_group_release(g);
}

int main(void) {
  em_state *S;
  if (em_open(&S, NULL)) return 1;
  RUN(test_collectives);
  RUN(test_abort);
  RUN(test_timeout);
  RUN(test_mismatch);
  RUN(test_leave);
  RUN(test_reducer);
  RUN(test_arguments_and_plan, S);
  em_close(S);
  return check_done();
}

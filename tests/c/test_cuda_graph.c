/*
** test_cuda_graph.c -- CUDA graphs on the emulated runtime: a captured step runs
** nothing until launched, each launch recomputes it from the current inputs
** (copied into static input tensors between launches) and equals the same ops
** run directly; the tensors made while capturing are kept by the graph (the
** memory statistics show it, and freeing the graph gives it back); a storage
** that died while capturing is freed with the graph, not before; a copy from the
** CPU is a constant of the graph; what can't be captured (reading a value, a
** copy between devices) fails
** naming it, the capture fails with it, and the state goes on; one capture at a
** time; the runtime's own refusals (a sync, a host copy) spoil the capture.
*/
#include "cuda_check.h"
#include "internal.h"
#include "../../kernels/cuda.h"
#include <math.h>

static em_tensor *on_cpu(em_state *S, const em_tensor *t) {
  em_tensor *r = NULL;
  if (em_to(S, t, em_tensor_dtype(t), EM_CPU, &r)) return NULL;
  return r;
}

static em_status random_cpu(em_state *S, int64_t r, int64_t c, double shift, em_tensor **out) {
  double v[64];
  for (int i = 0; i < r * c; i++) v[i] = (double)((cuda_check_rand() % 2001)) / 1000.0 - 1 + shift;
  return t_make(S, out, EM_FLOAT32, (int64_t[]){r, c}, 2, v, r * c);
}

/* y = relu(x @ w) * 2 + b, the step captured and run directly. */
static em_status step(em_state *S, em_tensor *x, em_tensor *w, em_tensor *b, em_tensor **y) {
  em_tensor *xw = NULL, *r = NULL, *r2 = NULL;
  em_status st;
  if ((st = em_matmul(S, x, w, &xw)) || (st = em_unary(S, EM_RELU, xw, &r)) ||
      (st = em_binary_scalar(S, EM_MUL, r, 2.0, 0, &r2)) || (st = em_binary(S, EM_ADD, r2, b, y)))
    *y = NULL;
  em_tensor_release(xw); em_tensor_release(r); em_tensor_release(r2);
  return st;
}

static void test_capture_and_launch(em_state *S) {
  em_tensor *hx, *hw, *hb, *x, *w, *b, *y = NULL;
  REQUIRE_OK(S, random_cpu(S, 4, 3, 0, &hx));
  REQUIRE_OK(S, random_cpu(S, 3, 5, 0, &hw));
  REQUIRE_OK(S, random_cpu(S, 1, 5, 0, &hb));
  REQUIRE_OK(S, em_to(S, hx, EM_FLOAT32, 0, &x));
  REQUIRE_OK(S, em_to(S, hw, EM_FLOAT32, 0, &w));
  REQUIRE_OK(S, em_to(S, hb, EM_FLOAT32, 0, &b));
  REQUIRE_OK(S, em_cuda_synchronize(S, 0));
  em_cuda_memory m0, m1, m2;
  REQUIRE_OK(S, em_cuda_memory_stats(S, 0, &m0));
  REQUIRE_OK(S, em_cuda_graph_begin(S, 0));
  REQUIRE_OK(S, step(S, x, w, b, &y));
  em_cuda_graph *g = NULL;
  REQUIRE_OK(S, em_cuda_graph_end(S, &g));
  REQUIRE_OK(S, em_cuda_memory_stats(S, 0, &m1));
  /* the temporaries (x@w, relu, *2) died in step() but the graph keeps them */
  CHECK(m1.allocated >= m0.allocated + 4 * 20 * 4, "the graph holds its memory: %lld more",
        (long long)(m1.allocated - m0.allocated));
  for (int round = 0; round < 3; round++) {
    if (round > 0) {                      /* new data into the static input */
      em_tensor *nx;
      REQUIRE_OK(S, random_cpu(S, 4, 3, round, &nx));
      REQUIRE_OK(S, em_copy_(S, x, nx));
      em_tensor_release(hx);
      hx = nx;
    }
    REQUIRE_OK(S, em_cuda_graph_launch(S, g));
    em_tensor *want = NULL, *got = on_cpu(S, y);
    REQUIRE_OK(S, step(S, hx, hw, hb, &want));
    int ok = got != NULL;
    for (int i = 0; ok && i < 20; i++) ok = fabs(t_get(got, i) - t_get(want, i)) < 1e-5;
    CHECK(ok, "launch %d equals the step run directly", round + 1);
    em_tensor_release(want); em_tensor_release(got);
  }
  em_tensor_release(y);
  em_cuda_graph_free(S, g);
  REQUIRE_OK(S, em_cuda_synchronize(S, 0));
  REQUIRE_OK(S, em_cuda_memory_stats(S, 0, &m2));
  CHECK(m2.allocated == m0.allocated, "freeing the graph gave its memory back: %lld vs %lld",
        (long long)m2.allocated, (long long)m0.allocated);
  em_tensor_release(hx); em_tensor_release(hw); em_tensor_release(hb);
  em_tensor_release(x); em_tensor_release(w); em_tensor_release(b);
}

/* Nothing captured runs before the launch. */
static void test_nothing_runs_while_capturing(em_state *S) {
  em_tensor *z, *back;
  REQUIRE_OK(S, em_full(S, (int64_t[]){8}, 1, 1.0, EM_FLOAT32, 0, &z));
  REQUIRE_OK(S, em_cuda_graph_begin(S, 0));
  REQUIRE_OK(S, em_fill_(S, z, 7.0));
  em_cuda_graph *g = NULL;
  REQUIRE_OK(S, em_cuda_graph_end(S, &g));
  back = on_cpu(S, z);
  CHECK(back && t_get(back, 3) == 1.0, "not run by the capture: %g", back ? t_get(back, 3) : -1);
  em_tensor_release(back);
  REQUIRE_OK(S, em_cuda_graph_launch(S, g));
  back = on_cpu(S, z);
  CHECK(back && t_get(back, 3) == 7.0, "run by the launch");
  em_tensor_release(back);
  em_cuda_graph_free(S, g);
  em_tensor_release(z);
}

/* A tensor made before the capture and dropped during it is read by the
** captured work: its memory must not be reused before the graph is freed. */
static void test_dead_storage_kept(em_state *S) {
  em_tensor *a, *b = NULL, *back;
  REQUIRE_OK(S, em_full(S, (int64_t[]){1000}, 1, 3.0, EM_FLOAT32, 0, &a));
  REQUIRE_OK(S, em_cuda_graph_begin(S, 0));
  REQUIRE_OK(S, em_binary_scalar(S, EM_MUL, a, 2.0, 0, &b));
  em_tensor_release(a);                     /* dies while capturing */
  em_cuda_graph *g = NULL;
  REQUIRE_OK(S, em_cuda_graph_end(S, &g));
  em_tensor *other;                         /* would take a's block if it were free */
  REQUIRE_OK(S, em_full(S, (int64_t[]){1000}, 1, -5.0, EM_FLOAT32, 0, &other));
  REQUIRE_OK(S, em_cuda_graph_launch(S, g));
  back = on_cpu(S, b);
  CHECK(back && t_get(back, 999) == 6.0, "the graph read the old values: %g",
        back ? t_get(back, 999) : -1);
  em_tensor_release(back); em_tensor_release(other); em_tensor_release(b);
  em_cuda_graph_free(S, g);
}

static void test_refusals(em_state *S) {
  em_tensor *x, *h, *r = NULL;
  em_cuda_graph *g = NULL;
  double v;
  REQUIRE_OK(S, em_full(S, (int64_t[]){4}, 1, 1.0, EM_FLOAT32, 0, &x));
  REQUIRE_OK(S, em_full(S, (int64_t[]){4}, 1, 1.0, EM_FLOAT32, EM_CPU, &h));
  /* reading a value */
  em_tensor *one;
  REQUIRE_OK(S, em_full(S, (int64_t[]){1}, 1, 2.0, EM_FLOAT32, 0, &one));
  REQUIRE_OK(S, em_cuda_graph_begin(S, 0));
  CHECK_ERR(S, em_tensor_item(S, one, &v), EM_ERR_UNSUPPORTED, "capturing",
            "copy to the CPU");
  em_tensor_release(one);
  CHECK_ERR(S, em_cuda_graph_end(S, &g), EM_ERR_UNSUPPORTED, "capture failed",
            "copy to the CPU");
  CHECK(g == NULL, "no graph");
  /* a copy between devices */
  if (em_cuda_device_count(S) > 1) {
    REQUIRE_OK(S, em_cuda_graph_begin(S, 0));
    CHECK_ERR(S, em_to(S, x, EM_FLOAT32, 1, &r), EM_ERR_UNSUPPORTED, "between devices");
    CHECK_ERR(S, em_cuda_graph_end(S, &g), EM_ERR_UNSUPPORTED, "capture failed");
  }
  /* one at a time; end without begin; the runtime's own refusal (a sync) */
  REQUIRE_OK(S, em_cuda_graph_begin(S, 0));
  CHECK_ERR(S, em_cuda_graph_begin(S, 0), EM_ERR_ARG, "capturing already");
  CHECK_ERR(S, em_cuda_synchronize(S, 0), EM_ERR_UNSUPPORTED, "stream_sync");
  CHECK_ERR(S, em_cuda_graph_end(S, &g), EM_ERR_UNSUPPORTED, "capture failed", "stream_sync");
  CHECK_ERR(S, em_cuda_graph_end(S, &g), EM_ERR_ARG, "nothing is being captured");
  CHECK_ERR(S, em_cuda_graph_begin(S, 9), EM_ERR_DEVICE, "cuda:9");
  /* and the state goes on */
  REQUIRE_OK(S, em_binary_scalar(S, EM_ADD, x, 1.0, 0, &r));
  em_tensor *rs;
  REQUIRE_OK(S, em_reduce(S, EM_SUM, r, NULL, 0, 0, &rs));
  REQUIRE_OK(S, em_tensor_item(S, rs, &v));
  CHECK(v == 8.0, "usable after the failed captures: %g", v);
  em_tensor_release(rs); em_tensor_release(r); em_tensor_release(x); em_tensor_release(h);
}

/* A copy from the CPU while capturing is a constant: each launch copies the
** values of the capture, whatever the CPU tensor holds since. */
static void test_constants_from_the_cpu(em_state *S) {
  em_tensor *h, *x, *d = NULL, *y = NULL, *back;
  REQUIRE_OK(S, em_full(S, (int64_t[]){5}, 1, 4.0, EM_FLOAT32, EM_CPU, &h));
  REQUIRE_OK(S, em_full(S, (int64_t[]){5}, 1, 1.0, EM_FLOAT32, 0, &x));
  REQUIRE_OK(S, em_cuda_graph_begin(S, 0));
  REQUIRE_OK(S, em_to(S, h, EM_FLOAT32, 0, &d));
  REQUIRE_OK(S, em_binary(S, EM_ADD, x, d, &y));
  em_tensor_release(d);
  em_cuda_graph *g = NULL;
  REQUIRE_OK(S, em_cuda_graph_end(S, &g));
  REQUIRE_OK(S, em_fill_(S, h, -100.0));        /* the capture took the values already */
  for (int round = 1; round <= 2; round++) {
    REQUIRE_OK(S, em_fill_(S, x, (double)round));
    REQUIRE_OK(S, em_cuda_graph_launch(S, g));
    back = on_cpu(S, y);
    CHECK(back && t_get(back, 4) == round + 4.0, "launch %d: %g", round,
          back ? t_get(back, 4) : -1);
    em_tensor_release(back);
  }
  em_tensor_release(y);
  em_cuda_graph_free(S, g);
  em_tensor_release(h); em_tensor_release(x);
}

int main(void) {
  em_state *S;
  if (cuda_check_open(&S, "2:64")) return 1;
  RUN(test_capture_and_launch, S);
  RUN(test_nothing_runs_while_capturing, S);
  RUN(test_dead_storage_kept, S);
  RUN(test_constants_from_the_cpu, S);
  RUN(test_refusals, S);
  em_close(S);
  return check_done();
}

/*
** test_blas_threads.c -- OpenBLAS's thread count is one setting for the whole
** process: two states with different thread counts must not undo each other's
** setting. It stays at the largest count wanted by a live state (cpu/blas.c),
** whatever BLAS calls the states make in between, follows states as they come,
** change and go, and a pinned count (em_blas_pin_threads) wins until unpinned.
*/
#include "check.h"
#include <cblas.h>
#include <pthread.h>

enum { MM = 128 };   /* 128^3 multiply-adds: past matmul's BLAS threshold */

/* a (MM x MM) of 1s times b (MM x MM) of 2s: every element is 2*MM. */
static int matmul_ok(em_state *S, em_dtype dt) {
  em_tensor *a = NULL, *b = NULL, *c = NULL;
  int ok = em_full(S, SHP(MM, MM), 1.0, dt, EM_CPU, &a) == EM_OK &&
           em_full(S, SHP(MM, MM), 2.0, dt, EM_CPU, &b) == EM_OK &&
           em_matmul(S, a, b, &c) == EM_OK && t_get(c, 0) == 2 * MM &&
           t_get(c, MM * MM - 1) == 2 * MM;
  em_tensor_release(a); em_tensor_release(b); em_tensor_release(c);
  return ok;
}

/* A float64 conv2d whose batch is split into shares (each calling BLAS on its own
** thread, inside a serial section): x (4, 8, 12, 12) of 1s, w (16, 8, 3, 3) of 1s,
** every output element 72. */
static int conv_ok(em_state *S) {
  em_tensor *x = NULL, *w = NULL, *y = NULL;
  int64_t one[2] = {1, 1}, zero[2] = {0, 0};
  int ok = em_full(S, (int64_t[]){4, 8, 12, 12}, 4, 1.0, EM_FLOAT64, EM_CPU, &x) == EM_OK &&
           em_full(S, (int64_t[]){16, 8, 3, 3}, 4, 1.0, EM_FLOAT64, EM_CPU, &w) == EM_OK &&
           em_conv2d(S, x, w, NULL, one, zero, one, 1, &y) == EM_OK && t_get(y, 0) == 72 &&
           t_get(y, em_tensor_numel(y) - 1) == 72;
  em_tensor_release(x); em_tensor_release(w); em_tensor_release(y);
  return ok;
}

static em_state *open_with(int threads) {
  em_config cfg;
  em_config_init(&cfg);
  cfg.num_threads = threads;
  em_state *S = NULL;
  return em_open(&S, &cfg) == EM_OK ? S : NULL;
}

#define COUNT_IS(n, when) \
  CHECK(openblas_get_num_threads() == (n), "%s: OpenBLAS runs %d threads, want %d", (when), \
        openblas_get_num_threads(), (n))

static void test_interleaved(void) {
  em_state *A = open_with(3), *B = NULL;
  REQUIRE(A, "em_open with 3 threads");
  COUNT_IS(3, "A open");
  B = open_with(2);
  REQUIRE(B, "em_open with 2 threads");
  COUNT_IS(3, "B open (A still wants 3)");
  /* B's calls must not undo A's count, nor A's calls B's */
  for (int i = 0; i < 3; i++) {
    CHECK(matmul_ok(B, EM_FLOAT32), "matmul on B");
    COUNT_IS(3, "after a float32 matmul on B");
    CHECK(matmul_ok(A, EM_FLOAT64), "matmul on A");
    COUNT_IS(3, "after a float64 matmul on A");
    CHECK(conv_ok(B), "conv2d on B");
    COUNT_IS(3, "after a batch-split conv2d on B");
    CHECK(conv_ok(A), "conv2d on A");
    COUNT_IS(3, "after a batch-split conv2d on A");
  }
  /* a state changing its count moves the maximum, once */
  CHECK_OK(B, em_set_num_threads(B, 5));
  COUNT_IS(5, "B set to 5");
  CHECK(matmul_ok(A, EM_FLOAT32), "matmul on A");
  COUNT_IS(5, "after a matmul on A (B wants 5)");
  CHECK_OK(B, em_set_num_threads(B, 2));
  COUNT_IS(3, "B back to 2");
  /* pinned: nobody changes it, until unpinned */
  em_blas_pin_threads(1);
  COUNT_IS(1, "pinned to 1");
  CHECK(matmul_ok(A, EM_FLOAT32) && conv_ok(B), "calls while pinned");
  COUNT_IS(1, "calls while pinned");
  em_blas_pin_threads(0);
  COUNT_IS(3, "unpinned");
  /* the largest wisher gone: the next largest */
  em_close(A);
  COUNT_IS(2, "A closed");
  CHECK(matmul_ok(B, EM_FLOAT64), "matmul on B alone");
  COUNT_IS(2, "after a matmul on B alone");
  em_close(B);
}

/* Two states on their own threads, calls truly interleaved: when both are done the
** count is still the larger one (no call of the smaller state left it behind). */
typedef struct runner { em_state *S; int ok; } runner;
static void *run_calls(void *arg) {
  runner *r = arg;
  r->ok = 1;
  for (int i = 0; i < 10; i++)
    r->ok &= matmul_ok(r->S, i & 1 ? EM_FLOAT64 : EM_FLOAT32) && conv_ok(r->S);
  return NULL;
}

static void test_threads(void) {
  runner r[2] = {{open_with(4), 0}, {open_with(2), 0}};
  REQUIRE(r[0].S && r[1].S, "em_open");
  pthread_t th[2];
  for (int i = 0; i < 2; i++) REQUIRE(pthread_create(&th[i], NULL, run_calls, &r[i]) == 0);
  for (int i = 0; i < 2; i++) pthread_join(th[i], NULL);
  CHECK(r[0].ok && r[1].ok, "results: %d %d", r[0].ok, r[1].ok);
  COUNT_IS(4, "after both threads' calls");
  em_close(r[0].S);
  COUNT_IS(2, "the 4-thread state closed");
  em_close(r[1].S);
}

int main(void) {
  RUN(test_interleaved);
  RUN(test_threads);
  return check_done();
}

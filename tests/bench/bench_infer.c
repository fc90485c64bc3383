/*
** bench_infer.c -- small-net inference from C (bench_infer.lua builds and runs it):
** a 32-64-4 MLP (Linear 32->64, ReLU, Linear 64->4), batch 1, with grad mode off,
** through nothing but ember.h, as a game or another C host would call it.
**
**   bench_infer [iterations]     prints  RESULT infer_mlp_c <us> us/op lower <= 1 us
**
** The weights are (out, in) as PyTorch keeps them; each layer is one em_linear
** (x @ w^T + b), which with grad mode off creates nothing but its result, and
** ReLU goes in place: a forward creates two tensors and releases the hidden one.
** The figure is the median of 7 timed runs.
*/
#include <ember.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#define CHECK(S, call)                                                     \
  do {                                                                     \
    if ((call) != EM_OK) {                                                 \
      fprintf(stderr, "bench_infer: %s: %s\n", #call, em_errmsg(S));       \
      exit(1);                                                             \
    }                                                                      \
  } while (0)

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static em_tensor *randn(em_state *S, int64_t r, int64_t c, int nd) {
  int64_t shape[2] = {r, c};
  em_tensor *t;
  CHECK(S, em_empty(S, nd == 1 ? shape + 1 : shape, nd, EM_FLOAT32, EM_CPU, &t));
  CHECK(S, em_normal_(S, t, 0.0, 0.1));
  return t;
}

typedef struct mlp { em_tensor *w1, *b1, *w2, *b2; } mlp;

/* y (1, 4) = relu(x @ w1^T + b1) @ w2^T + b2; the caller releases y. em_linear
** with grad mode off creates only its result; ReLU goes in place. */
static em_tensor *forward(em_state *S, const mlp *m, const em_tensor *x) {
  em_tensor *h, *y;
  CHECK(S, em_linear(S, x, m->w1, m->b1, &h));
  CHECK(S, em_unary_(S, EM_RELU, h));
  CHECK(S, em_linear(S, h, m->w2, m->b2, &y));
  em_tensor_release(h);
  return y;
}

static int cmp(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

int main(int argc, char **argv) {
  long n = argc > 1 ? atol(argv[1]) : 200000;
  em_config cfg;
  em_config_init(&cfg);
  const char *th = getenv("EMBER_NUM_THREADS");
  cfg.num_threads = th ? atoi(th) : 2;
  em_state *S;
  if (em_open(&S, &cfg) != EM_OK) { fprintf(stderr, "bench_infer: em_open failed\n"); return 1; }
  em_manual_seed(S, 1);
  mlp m = {randn(S, 64, 32, 2), randn(S, 0, 64, 1), randn(S, 4, 64, 2), randn(S, 0, 4, 1)};
  em_tensor *x = randn(S, 1, 32, 2);
  CHECK(S, em_set_grad_enabled(S, 0));

  for (long i = 0; i < n / 4; i++) em_tensor_release(forward(S, &m, x));   /* warm up */
  double ts[7];
  for (int r = 0; r < 7; r++) {
    double t0 = now();
    for (long i = 0; i < n; i++) em_tensor_release(forward(S, &m, x));
    ts[r] = (now() - t0) / (double)n;
  }
  qsort(ts, 7, sizeof ts[0], cmp);
  printf("RESULT infer_mlp_c %.6g us/op lower <= 1 us\n", ts[3] * 1e6);

  em_tensor_release(x);
  em_tensor_release(m.w1); em_tensor_release(m.b1);
  em_tensor_release(m.w2); em_tensor_release(m.b2);
  em_close(S);
  return 0;
}

/*
** bench_xsmm.c -- the batch-1 inference path's small GEMMs: ember's em_matmul
** against libxsmm's JIT kernels (Debian's libxsmm-dev ships it as a static library
** only). Built and run by bench_cpu_kernels.lua when /usr/lib/libxsmm.a exists:
**
**   cc -O2 -Icore/include bench_xsmm.c -Lbuild -lember -l:libxsmm.a -l:libxsmmnoblas.a
**
** Per shape it prints ember's whole op (dispatch, output allocation, kernel), the
** op on a 1x1x1 product (the fixed cost), their difference (ember's kernel) and
** libxsmm's kernel alone: what adopting libxsmm could save per call at most.
*/
#include <ember.h>
#include <libxsmm.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* Best of 7 rounds of n calls of em_matmul(a (M,K), b (K,N)), seconds per call. */
static double time_em(em_state *S, int64_t M, int64_t N, int64_t K, int n) {
  int64_t sa[2] = {M, K}, sb[2] = {K, N};
  em_tensor *a = NULL, *b = NULL;
  if (em_empty(S, sa, 2, EM_FLOAT32, EM_CPU, &a) || em_normal_(S, a, 0.0, 1.0) ||
      em_empty(S, sb, 2, EM_FLOAT32, EM_CPU, &b) || em_normal_(S, b, 0.0, 1.0)) {
    fprintf(stderr, "bench_xsmm: %s\n", em_errmsg(S));
    exit(1);
  }
  double best = 1e9;
  for (int r = 0; r < 7; r++) {
    double t = now();
    for (int i = 0; i < n; i++) {
      em_tensor *c = NULL;
      if (em_matmul(S, a, b, &c)) exit(1);
      em_tensor_release(c);
    }
    t = (now() - t) / n;
    if (t < best) best = t;
  }
  em_tensor_release(a);
  em_tensor_release(b);
  return best;
}

/* libxsmm's column-major C (m,n) = A (m,k) B (k,n): ember's row-major c (M,N) =
** a (M,K) b (K,N) is the column-major product b^T-as-stored times a: m = N, n = M. */
static double time_xsmm(int64_t M, int64_t N, int64_t K, int n) {
  float *a = calloc((size_t)(M * K), 4), *b = calloc((size_t)(K * N), 4),
        *c = calloc((size_t)(M * N), 4);
  for (int64_t i = 0; i < M * K; i++) a[i] = (float)(i % 7) * 0.1f;
  for (int64_t i = 0; i < K * N; i++) b[i] = (float)(i % 5) * 0.1f;
  float alpha = 1, beta = 0;
  libxsmm_smmfunction f = libxsmm_smmdispatch((libxsmm_blasint)N, (libxsmm_blasint)M,
                                              (libxsmm_blasint)K, NULL, NULL, NULL, &alpha,
                                              &beta, NULL, NULL);
  if (!f) return -1;
  double best = 1e9;
  for (int r = 0; r < 7; r++) {
    double t = now();
    for (int i = 0; i < n; i++) f(b, a, c);
    t = (now() - t) / n;
    if (t < best) best = t;
  }
  free(a), free(b), free(c);
  return best;
}

int main(int argc, char **argv) {
  int n = argc > 1 ? atoi(argv[1]) : 100000;
  em_config cfg;
  em_config_init(&cfg);
  const char *th = getenv("EMBER_NUM_THREADS");
  cfg.num_threads = th ? atoi(th) : 2;
  em_state *S;
  if (em_open(&S, &cfg) != EM_OK) { fprintf(stderr, "bench_xsmm: em_open failed\n"); return 1; }
  em_set_grad_enabled(S, 0);
  libxsmm_init();
  static const int64_t shapes[][3] = {{1, 64, 32}, {1, 4, 64}, {1, 128, 128}, {32, 10, 2048}};
  double fixed = time_em(S, 1, 1, 1, n);
  printf("%-14s %10s %10s %10s %10s\n", "M x N x K", "ember op", "ember kern", "libxsmm",
         "kern ratio");
  for (int i = 0; i < 4; i++) {
    int64_t M = shapes[i][0], N = shapes[i][1], K = shapes[i][2];
    int reps = (int)(n / (1 + M * N * K / 4096));
    if (reps < 100) reps = 100;
    double e = time_em(S, M, N, K, reps), x = time_xsmm(M, N, K, reps);
    double kern = e - fixed > 0 ? e - fixed : 0;
    printf("%3lldx%-4lldx%-5lld %9.3fus %9.3fus %9.3fus %10.2f\n", (long long)M,
           (long long)N, (long long)K, e * 1e6, kern * 1e6, x * 1e6, x > 0 ? kern / x : 0);
    printf("RESULT cpu_xsmm_%lldx%lldx%lld %.4g us lower ember op %.3f us, 1x1x1 op %.3f us\n",
           (long long)M, (long long)N, (long long)K, x * 1e6, e * 1e6, fixed * 1e6);
  }
  libxsmm_finalize();
  em_close(S);
  return 0;
}

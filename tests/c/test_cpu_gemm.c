/*
** test_cpu_gemm.c -- the single-threaded float32 GEMM kernels under conv2d
** (core/cpu/nn_gemm*.c), each one this CPU can run, called directly: the AVX-512
** and AVX2 kernels, plain and with rows by pointer, the plain C fallback of the
** latter, the AVX2 kernel of C += A B^T (the weight gradient of a conv with few
** weight columns) and the AVX2 transpose. Each is compared with a float64 reference over shapes that reach
** every register-block instance (row tails of 1 to 3 rows, 1 to 3 vectors, a
** partial last vector), K slices of unequal count, accumulation into C, a
** transposed A (read by strides), and C's columns past N left untouched. A value
** must also not depend on where in C it lies: an element computed inside a large
** block equals, bit for bit, the same element computed alone.
*/
#include "check.h"
#include "cpu/nn.h"
#include <math.h>

typedef void (*plain_fn)(int64_t, int64_t, int64_t, const float *, int64_t, int64_t,
                         const float *, int64_t, float *, int64_t, int);
typedef void (*rows_fn)(int64_t, int64_t, int64_t, const float *const *, int64_t,
                        const float *const *, float *, int64_t, int);

/* A deterministic fill in [-1, 1) from a seed. */
static float val(uint32_t *s) {
  *s = *s * 1664525u + 1013904223u;
  return (float)((*s >> 8) & 0xffff) / 32768.0f - 1.0f;
}

/* The plain C rows fallback, reached through emi_nn_sgemm_rows only where none
** of our kernels runs; here it is called as a kernel of its own. */
static void rows_reference_c(int64_t M, int64_t N, int64_t K, const float *const *A,
                             int64_t acs, const float *const *B, float *C, int64_t ldc,
                             int acc) {
  for (int64_t i = 0; i < M; i++) {
    float *c = C + i * ldc;
    if (!acc) memset(c, 0, sizeof(float) * (size_t)N);
    for (int64_t k = 0; k < K; k++)
      for (int64_t j = 0; j < N; j++) c[j] += A[i][k * acs] * B[k][j];
  }
}

/* C = [C0 +] A B in float64, A (M x K) with strides ars/acs. */
static void reference(int64_t M, int64_t N, int64_t K, const float *A, int64_t ars,
                      int64_t acs, const float *B, int64_t ldb, const float *C0,
                      int64_t ldc, int acc, double *R) {
  for (int64_t i = 0; i < M; i++)
    for (int64_t j = 0; j < N; j++) {
      double s = acc ? C0[i * ldc + j] : 0;
      for (int64_t k = 0; k < K; k++) s += (double)A[i * ars + k * acs] * B[k * ldb + j];
      R[i * N + j] = s;
    }
}

/* One shape through one kernel (plain or rows); returns whether all checks held. */
static int one_case(const char *name, plain_fn pf, rows_fn rf, int64_t M, int64_t N,
                    int64_t K, int transA, int acc, int position_free) {
  int64_t ldb = N + 3, ldc = N + 5;   /* row strides past the width: edges must hold */
  int64_t ars = transA ? 1 : K + 2, acs = transA ? M + 1 : 1;
  size_t na = (size_t)(transA ? K * acs : M * ars) + 1, nb = (size_t)(K * ldb) + 1;
  float *A = malloc(sizeof(float) * na), *B = malloc(sizeof(float) * nb);
  float *C = malloc(sizeof(float) * (size_t)(M * ldc)), *C0 = malloc(sizeof(float) * (size_t)(M * ldc));
  double *R = malloc(sizeof(double) * (size_t)(M * N));
  const float **ar = malloc(sizeof(float *) * (size_t)M), **br = malloc(sizeof(float *) * (size_t)(K + 1));
  uint32_t s = (uint32_t)(M * 7919 + N * 104729 + K * 31 + transA * 2 + acc);
  for (size_t i = 0; i < na; i++) A[i] = val(&s);
  for (size_t i = 0; i < nb; i++) B[i] = val(&s);
  for (int64_t i = 0; i < M * ldc; i++) C[i] = C0[i] = val(&s);
  for (int64_t i = 0; i < M; i++) ar[i] = A + i * ars;
  for (int64_t k = 0; k < K; k++) br[k] = B + k * ldb;
  if (pf) pf(M, N, K, A, ars, acs, B, ldb, C, ldc, acc);
  else rf(M, N, K, ar, acs, br, C, ldc, acc);
  reference(M, N, K, A, ars, acs, B, ldb, C0, ldc, acc, R);
  double worst = 0;
  int untouched = 1;
  for (int64_t i = 0; i < M; i++) {
    for (int64_t j = 0; j < N; j++) {
      double e = fabs(C[i * ldc + j] - R[i * N + j]) / (1.0 + fabs(R[i * N + j]));
      if (e > worst) worst = e;
    }
    for (int64_t j = N; j < ldc; j++) untouched &= C[i * ldc + j] == C0[i * ldc + j];
  }
  /* the last element alone (its own 1x1 call) equals the one of the full call,
  ** where the kernel promises it (not BLAS; not the AVX-512 kernel, whose row
  ** tail sums in two chains) */
  float alone = C0[(M - 1) * ldc + N - 1];
  const float *a1 = A + (M - 1) * ars;
  if (pf) pf(1, 1, K, a1, ars, acs, B + N - 1, ldb, &alone, 1, acc);
  else {
    const float **bk = malloc(sizeof(float *) * (size_t)(K + 1));
    for (int64_t k = 0; k < K; k++) bk[k] = B + k * ldb + N - 1;
    rf(1, 1, K, &a1, acs, bk, &alone, 1, acc);
    free(bk);
  }
  float full = C[(M - 1) * ldc + N - 1];
  if (!position_free) alone = full;
  double tol = 4e-6 * sqrt((double)K + 1);
  int ok = worst <= tol && untouched && memcmp(&alone, &full, sizeof alone) == 0;
  CHECK(worst <= tol, "%s M=%lld N=%lld K=%lld transA=%d acc=%d: error %.3g > %.3g", name,
        (long long)M, (long long)N, (long long)K, transA, acc, worst, tol);
  CHECK(untouched, "%s M=%lld N=%lld K=%lld: wrote past column N", name, (long long)M,
        (long long)N, (long long)K);
  CHECK(memcmp(&alone, &full, sizeof alone) == 0,
        "%s M=%lld N=%lld K=%lld: the last element alone %.9g, in the block %.9g", name,
        (long long)M, (long long)N, (long long)K, (double)alone, (double)full);
  free(A); free(B); free(C); free(C0); free(R); free(ar); free(br);
  return ok;
}

static void sweep(const char *name, plain_fn pf, rows_fn rf, int position_free) {
  static const int64_t Ms[] = {1, 2, 3, 4, 5, 7, 8, 9, 13, 64};
  static const int64_t Ns[] = {1, 7, 8, 9, 16, 17, 23, 24, 25, 33, 47, 48, 49, 100};
  static const int64_t Ks[] = {1, 5, 127, 128, 129, 300};
  int bad = 0;
  for (size_t a = 0; a < sizeof Ms / sizeof *Ms; a++)
    for (size_t b = 0; b < sizeof Ns / sizeof *Ns; b++)
      for (size_t c = 0; c < sizeof Ks / sizeof *Ks; c++) {
        int t = (int)((a + b + c) % 2), acc = (int)((a + c) % 2);
        if (!one_case(name, pf, rf, Ms[a], Ns[b], Ks[c], t, acc, position_free) && ++bad > 5) return;
      }
}

#if EMI_HAVE_AVX2_KERNELS
/* Whether this CPU runs the AVX2 kernels; where not, the group says skipped. */
static int avx2_here(void) {
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return 1;
  check_skip("this CPU has no AVX2 and FMA");
  return 0;
}

static void avx2_plain(int64_t M, int64_t N, int64_t K, const float *A, int64_t ars,
                       int64_t acs, const float *B, int64_t ldb, float *C, int64_t ldc, int acc) {
  emi_nn_sgemm_avx2(M, N, K, A, ars, acs, B, ldb, C, ldc, acc, NULL, 0);
}
#endif

static void test_avx2(void) {
#if EMI_HAVE_AVX2_KERNELS
  if (!avx2_here()) return;
  sweep("avx2", avx2_plain, NULL, 1);
  sweep("avx2 rows", NULL, emi_nn_sgemm_rows_avx2, 1);
#else
  check_skip("not an x86-64 GCC/clang build: no AVX2 kernels");
#endif
}

static void test_avx512(void) {
#if EMI_HAVE_AVX512_KERNELS
  __builtin_cpu_init();
  if (!__builtin_cpu_supports("avx512f")) {
    check_skip("this CPU has no AVX-512");
    return;
  }
  sweep("avx512", emi_nn_sgemm_avx512, NULL, 0);
  sweep("avx512 rows", NULL, emi_nn_sgemm_rows_avx512, 0);
#else
  check_skip("not an x86-64 GCC/clang build: no AVX-512 kernels");
#endif
}

/* C += A B^T (both along rows), C written with strides cm, cn (the conv's
** transposed weight gradient): every block instance, rows that end inside a
** vector, and C's untouched neighbours. */
static void test_avx2_nt(void) {
#if EMI_HAVE_AVX2_KERNELS
  if (!avx2_here()) return;
  static const int64_t Ms[] = {1, 2, 3, 4, 5, 8, 9, 32}, Ns[] = {1, 2, 3, 4, 7, 9, 16},
                       Ls[] = {1, 7, 8, 9, 100, 784};
  for (size_t a = 0; a < sizeof Ms / sizeof *Ms; a++)
    for (size_t b = 0; b < sizeof Ns / sizeof *Ns; b++)
      for (size_t c = 0; c < sizeof Ls / sizeof *Ls; c++) {
        int64_t M = Ms[a], N = Ns[b], L = Ls[c], lda = L + 3, ldb = L + 1;
        int64_t cm = 1, cn = M + 2;   /* C transposed, with a gap after each column */
        size_t nc = (size_t)(N * cn);
        float *A = malloc(sizeof(float) * (size_t)(M * lda)), *B = malloc(sizeof(float) * (size_t)(N * ldb));
        float *C = malloc(sizeof(float) * nc), *C0 = malloc(sizeof(float) * nc);
        uint32_t s = (uint32_t)(M * 31 + N * 7 + L);
        for (int64_t i = 0; i < M * lda; i++) A[i] = val(&s);
        for (int64_t i = 0; i < N * ldb; i++) B[i] = val(&s);
        for (size_t i = 0; i < nc; i++) C[i] = C0[i] = val(&s);
        emi_nn_sgemm_nt_avx2(M, N, L, A, lda, B, ldb, C, cm, cn);
        double worst = 0;
        int untouched = 1;
        for (int64_t n = 0; n < N; n++) {
          for (int64_t m = 0; m < M; m++) {
            double r = C0[m * cm + n * cn];
            for (int64_t l = 0; l < L; l++) r += (double)A[m * lda + l] * B[n * ldb + l];
            double e = fabs(C[m * cm + n * cn] - r) / (1 + fabs(r));
            if (e > worst) worst = e;
          }
          for (int64_t m = M; m < cn; m++) untouched &= C[n * cn + m] == C0[n * cn + m];
        }
        double tol = 4e-6 * sqrt((double)L + 1);
        CHECK(worst <= tol, "nt M=%lld N=%lld L=%lld: error %.3g > %.3g", (long long)M,
              (long long)N, (long long)L, worst, tol);
        CHECK(untouched, "nt M=%lld N=%lld L=%lld: wrote outside C", (long long)M, (long long)N,
              (long long)L);
        free(A); free(B); free(C); free(C0);
      }
#else
  check_skip("not an x86-64 GCC/clang build: no AVX2 kernels");
#endif
}

/* The GEMM with the conv's epilogue, C = relu(A B + bias[row]), through whichever
** path this process runs (inside the AVX2 kernel, or a pass after): against the
** reference, over K slices and edges, with a NaN row (ReLU keeps NaN). */
static void test_epilogue(void) {
  static const int64_t Ms[] = {1, 3, 4, 5, 9, 32}, Ns[] = {1, 8, 9, 23, 24, 25, 100},
                       Ks[] = {1, 9, 128, 300};
  int bad = 0;
  for (size_t a = 0; a < sizeof Ms / sizeof *Ms; a++)
    for (size_t b = 0; b < sizeof Ns / sizeof *Ns; b++)
      for (size_t c = 0; c < sizeof Ks / sizeof *Ks; c++)
        for (int relu = 0; relu < 2; relu++) {
          int64_t M = Ms[a], N = Ns[b], K = Ks[c], ldc = N + 2;
          float *A = malloc(sizeof(float) * (size_t)(M * K)), *B = malloc(sizeof(float) * (size_t)(K * N));
          float *bias = malloc(sizeof(float) * (size_t)M), *C = malloc(sizeof(float) * (size_t)(M * ldc));
          uint32_t s = (uint32_t)(M * 5 + N * 11 + K * 3 + relu);
          for (int64_t i = 0; i < M * K; i++) A[i] = val(&s);
          for (int64_t i = 0; i < K * N; i++) B[i] = val(&s);
          for (int64_t i = 0; i < M; i++) bias[i] = val(&s);
          for (int64_t i = 0; i < M * ldc; i++) C[i] = 7;
          if (M > 1) A[K] = NAN;                       /* row 1 all NaN */
          emi_nn_sgemm_ep(M, N, K, A, K, 1, B, N, C, ldc, bias, relu);
          for (int64_t i = 0; i < M; i++) {
            for (int64_t j = 0; j < N; j++) {
              double r = bias[i];
              for (int64_t k = 0; k < K; k++) r += (double)A[i * K + k] * B[k * N + j];
              float got = C[i * ldc + j];
              if (relu && r < 0) r = 0;
              int ok = isnan(r) ? isnan(got) : fabs(got - r) <= 4e-6 * sqrt((double)K + 1) * (1 + fabs(r));
              if (!ok && bad++ < 5)
                CHECK(0, "epilogue M=%lld N=%lld K=%lld relu=%d: C[%lld][%lld] %.9g, want %.9g",
                      (long long)M, (long long)N, (long long)K, relu, (long long)i, (long long)j,
                      (double)got, r);
            }
            for (int64_t j = N; j < ldc; j++) bad += C[i * ldc + j] != 7;
          }
          free(A); free(B); free(bias); free(C);
        }
  CHECK(bad == 0, "epilogue: %d elements wrong or written past N", bad);
}

/* The 8x8-tiled transpose: every element moved exactly, nothing written outside
** dst's R x C block, for sizes around the tile's edges. */
static void test_avx2_transpose(void) {
#if EMI_HAVE_AVX2_KERNELS
  if (!avx2_here()) return;
  int bad = 0;
  for (int64_t R = 1; R <= 17; R++)
    for (int64_t C = 1; C <= 17; C++) {
      int64_t lds = C + 3, ldd = R + 2;
      float *src = malloc(sizeof(float) * (size_t)(R * lds)), *dst = malloc(sizeof(float) * (size_t)(C * ldd));
      for (int64_t i = 0; i < R * lds; i++) src[i] = (float)i;
      for (int64_t i = 0; i < C * ldd; i++) dst[i] = -1;
      emi_transpose_avx2(R, C, src, lds, dst, ldd);
      for (int64_t c = 0; c < C; c++)
        for (int64_t r = 0; r < ldd; r++)
          bad += dst[c * ldd + r] != (r < R ? src[r * lds + c] : -1);
      free(src); free(dst);
    }
  CHECK(bad == 0, "transpose: %d elements wrong or written outside", bad);
#else
  check_skip("not an x86-64 GCC/clang build: no AVX2 kernels");
#endif
}

/* The entry the conv calls: whichever kernel this process picked (or BLAS). */
static void test_dispatch(void) {
  sweep("emi_nn_sgemm", emi_nn_sgemm, NULL, 0);
  sweep("plain C rows", NULL, rows_reference_c, 1);
}

int main(void) {
  RUN(test_avx2);
  RUN(test_avx2_nt);
  RUN(test_avx2_transpose);
  RUN(test_avx512);
  RUN(test_dispatch);
  RUN(test_epilogue);
  return check_done();
}

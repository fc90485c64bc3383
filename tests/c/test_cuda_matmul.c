/*
** test_cuda_matmul.c -- the CUDA backend's matmul (kernels/k_matmul.c, through
** the runtime's gemm: OpenBLAS on the emulator, kernels/emu/gemm_emu.c) against
** the CPU's: float32/float64/float16/bfloat16 and the integer kernel; 2-D shapes
** (square, tall, wide, k = 1, m or n = 1, sizes 1 .. 130), matmul's 1-D rules,
** batched 3-D/4-D with broadcast batch dims, transposed and strided operands,
** empty (k = 0 gives zeros), mixed dtypes, and the gradient of (A x B):sum().
** Tolerance per output: tol * sum_k |a||b| (float32 1e-6, float64 1e-12,
** float16 / bfloat16 twice their epsilon: both sides round one float32 value).
*/
#include "cuda_check.h"
#include "../../kernels/runtime.h"
#include <math.h>
#include <string.h>
#include <stdlib.h>

static uint64_t rnd(void) { return cuda_check_rand(); }

typedef struct pair { em_tensor *h, *d; } pair;

static void pair_free(pair *p) {
  em_tensor_release(p->h);
  em_tensor_release(p->d);
  p->h = p->d = NULL;
}

/* Random values: floats in [-1, 1], integers in [-5, 5] (0/1 for bool). */
static pair pair_rand(em_state *S, em_dtype dt, const int64_t *shape, int nd) {
  pair p = {NULL, NULL};
  int64_t n = 1;
  for (int i = 0; i < nd; i++) n *= shape[i];
  double *v = malloc(sizeof(double) * (size_t)(n ? n : 1));
  for (int64_t i = 0; i < n; i++) {
    uint64_t r = rnd();
    if (dt == EM_BOOL) v[i] = (double)(r % 3 == 0);
    else if (em_dtype_is_floating(dt)) v[i] = (double)(r >> 11) / 9007199254740992.0 * 2 - 1;
    else v[i] = (double)((int64_t)(r % 11) - 5);
  }
  if (em_from_data(S, shape, nd, dt, v, EM_FLOAT64, &p.h) ||
      em_to(S, p.h, dt, 0, &p.d))
    CHECK(0, "pair_rand: %s", em_errmsg(S));
  free(v);
  return p;
}

static void pair_transpose(em_state *S, pair *p, int d1, int d2) {
  pair q;
  REQUIRE_OK(S, em_transpose(S, p->h, d1, d2, &q.h));
  REQUIRE_OK(S, em_transpose(S, p->d, d1, d2, &q.d));
  pair_free(p);
  *p = q;
}

static void pair_narrow(em_state *S, pair *p, int dim, int64_t start, int64_t len) {
  pair q;
  REQUIRE_OK(S, em_narrow(S, p->h, dim, start, len, &q.h));
  REQUIRE_OK(S, em_narrow(S, p->d, dim, start, len, &q.d));
  pair_free(p);
  *p = q;
}

static void pair_expand(em_state *S, pair *p, const int64_t *shape, int nd) {
  pair q;
  REQUIRE_OK(S, em_expand(S, p->h, shape, nd, &q.h));
  REQUIRE_OK(S, em_expand(S, p->d, shape, nd, &q.d));
  pair_free(p);
  *p = q;
}

static double tol_of(em_dtype dt) {
  switch (dt) {
  case EM_FLOAT32: return 1e-6;
  case EM_FLOAT64: return 1e-12;
  case EM_FLOAT16: return 2 * 9.765625e-4;     /* 2^-10 */
  case EM_BFLOAT16: return 2 * 7.8125e-3;      /* 2^-7 */
  default: return 0;
  }
}

/* matmul on both sides, compared per output against tol * (|a| @ |b|). */
static void check_mm(em_state *S, const pair *a, const pair *b, const char *what) {
  em_tensor *want = NULL, *got = NULL, *gh = NULL, *w64 = NULL, *aa = NULL, *ab = NULL,
            *a64 = NULL, *b64 = NULL, *bound = NULL;
  REQUIRE_OK(S, em_matmul(S, a->h, b->h, &want));
  if (!CHECK_OK(S, em_matmul(S, a->d, b->d, &got))) {
    em_tensor_release(want);
    return;
  }
  em_dtype dt = em_tensor_dtype(want);
  CHECK(em_tensor_dtype(got) == dt, "%s: dtype %s vs %s", what,
        em_dtype_name(em_tensor_dtype(got)), em_dtype_name(dt));
  int nd = em_tensor_ndim(want);
  int same_shape = em_tensor_ndim(got) == nd;
  for (int i = 0; same_shape && i < nd; i++)
    same_shape = em_tensor_sizes(got)[i] == em_tensor_sizes(want)[i];
  CHECK(same_shape, "%s: shapes differ", what);
  REQUIRE_OK(S, em_to(S, got, EM_FLOAT64, EM_CPU, &gh));
  REQUIRE_OK(S, em_to(S, want, EM_FLOAT64, EM_CPU, &w64));
  REQUIRE_OK(S, em_to(S, a->h, EM_FLOAT64, EM_CPU, &a64));
  REQUIRE_OK(S, em_to(S, b->h, EM_FLOAT64, EM_CPU, &b64));
  REQUIRE_OK(S, em_unary(S, EM_ABS, a64, &aa));
  REQUIRE_OK(S, em_unary(S, EM_ABS, b64, &ab));
  REQUIRE_OK(S, em_matmul(S, aa, ab, &bound));
  double tol = tol_of(dt);
  const double *g = em_tensor_data(gh), *w = em_tensor_data(w64), *bd = em_tensor_data(bound);
  int64_t n = em_tensor_numel(w64), bad = 0, first = -1;
  for (int64_t i = 0; same_shape && i < n; i++) {
    double lim = tol * bd[i];
    if (!(fabs(g[i] - w[i]) <= lim)) {
      if (!bad++) first = i;
    }
  }
  CHECK(!bad, "%s (%s): %lld of %lld outputs differ, first at %lld: %.17g vs %.17g (bound %g)",
        what, em_dtype_name(dt), (long long)bad, (long long)n, (long long)first,
        first >= 0 ? g[first] : 0.0, first >= 0 ? w[first] : 0.0,
        first >= 0 ? tol * bd[first] : 0.0);
  em_tensor_release(want); em_tensor_release(got); em_tensor_release(gh);
  em_tensor_release(w64); em_tensor_release(aa); em_tensor_release(ab);
  em_tensor_release(a64); em_tensor_release(b64); em_tensor_release(bound);
}

static const em_dtype FLOATS[] = {EM_FLOAT32, EM_FLOAT64, EM_FLOAT16, EM_BFLOAT16};
static const em_dtype INTS[] = {EM_INT32, EM_INT64, EM_UINT8, EM_BOOL};

static void mm_case(em_state *S, em_dtype da, const int64_t *sa, int na, em_dtype db,
                    const int64_t *sb, int nb, const char *what) {
  pair a = pair_rand(S, da, sa, na), b = pair_rand(S, db, sb, nb);
  char buf[160];
  snprintf(buf, sizeof buf, "%s %s x %s", what, em_dtype_name(da), em_dtype_name(db));
  check_mm(S, &a, &b, buf);
  pair_free(&a); pair_free(&b);
}

static void test_2d(em_state *S) {
  static const int64_t mnk[][3] = {
    {1, 1, 1}, {7, 7, 7}, {64, 64, 64}, {130, 130, 130}, {130, 7, 64}, {7, 130, 64},
    {64, 64, 1}, {1, 64, 130}, {130, 1, 7}, {1, 1, 130}, {3, 5, 7}, {65, 33, 17},
  };
  for (size_t t = 0; t < sizeof FLOATS / sizeof *FLOATS; t++)
    for (size_t i = 0; i < sizeof mnk / sizeof *mnk; i++) {
      int64_t sa[2] = {mnk[i][0], mnk[i][2]}, sb[2] = {mnk[i][2], mnk[i][1]};
      char what[64];
      snprintf(what, sizeof what, "2-D m %lld n %lld k %lld", (long long)mnk[i][0],
               (long long)mnk[i][1], (long long)mnk[i][2]);
      mm_case(S, FLOATS[t], sa, 2, FLOATS[t], sb, 2, what);
    }
}

static void test_vectors(em_state *S) {
  for (size_t t = 0; t < sizeof FLOATS / sizeof *FLOATS; t++) {
    em_dtype dt = FLOATS[t];
    int64_t v[1] = {37}, m[2] = {37, 9}, m2[2] = {9, 37}, b3[3] = {4, 37, 5}, b3v[3] = {4, 6, 37};
    mm_case(S, dt, v, 1, dt, v, 1, "vector . vector");
    mm_case(S, dt, v, 1, dt, m, 2, "vector x matrix");
    mm_case(S, dt, m2, 2, dt, v, 1, "matrix x vector");
    mm_case(S, dt, v, 1, dt, b3, 3, "vector x batch");
    mm_case(S, dt, b3v, 3, dt, v, 1, "batch x vector");
  }
}

static void test_batched(em_state *S) {
  for (size_t t = 0; t < sizeof FLOATS / sizeof *FLOATS; t++) {
    em_dtype dt = FLOATS[t];
    int64_t a3[3] = {5, 7, 9}, b3[3] = {5, 9, 6}, b2[2] = {9, 6}, a2[2] = {7, 9};
    mm_case(S, dt, a3, 3, dt, b3, 3, "3-D batched");
    mm_case(S, dt, a3, 3, dt, b2, 2, "3-D x shared 2-D");
    mm_case(S, dt, a2, 2, dt, b3, 3, "shared 2-D x 3-D");
    int64_t a4[4] = {2, 3, 7, 9}, b4[4] = {2, 3, 9, 6}, b41[4] = {2, 1, 9, 6},
            a41[4] = {1, 3, 7, 9}, b31[3] = {3, 9, 6};
    mm_case(S, dt, a4, 4, dt, b4, 4, "4-D batched");
    mm_case(S, dt, a4, 4, dt, b41, 4, "4-D, b broadcast in dim 1");
    mm_case(S, dt, a41, 4, dt, b4, 4, "4-D, a broadcast in dim 0");
    mm_case(S, dt, a41, 4, dt, b41, 4, "4-D, both broadcast (different dims)");
    mm_case(S, dt, a4, 4, dt, b31, 3, "4-D x 3-D");
    /* an explicitly expanded operand (stride 0 in a batch dim) */
    pair a = pair_rand(S, dt, a4, 4), b = pair_rand(S, dt, b2, 2);
    int64_t ex[4] = {2, 3, 9, 6};
    pair_expand(S, &b, ex, 4);
    check_mm(S, &a, &b, "expanded b");
    pair_free(&a); pair_free(&b);
    /* stride 0 inside the matrix: a column expanded to 6 columns, and as
    ** another dtype (converted once, still broadcast) */
    int64_t col[2] = {9, 1}, ex2[2] = {9, 6};
    for (int other = 0; other < 2; other++) {
      a = pair_rand(S, dt, a4, 4);
      b = pair_rand(S, other ? (dt == EM_FLOAT64 ? EM_FLOAT32 : EM_FLOAT64) : dt, col, 2);
      pair_expand(S, &b, ex2, 2);
      check_mm(S, &a, &b, other ? "expanded column, other dtype" : "expanded column");
      pair bt;
      REQUIRE_OK(S, em_transpose(S, b.h, 0, 1, &bt.h));
      REQUIRE_OK(S, em_transpose(S, b.d, 0, 1, &bt.d));
      check_mm(S, &bt, &b, "expanded column, transposed x itself");
      pair_free(&bt);
      pair_free(&a); pair_free(&b);
    }
  }
}

static void test_strided(em_state *S) {
  for (size_t t = 0; t < sizeof FLOATS / sizeof *FLOATS; t++) {
    em_dtype dt = FLOATS[t];
    int64_t sa[2] = {33, 70}, sb[2] = {21, 33};
    pair a = pair_rand(S, dt, sa, 2), b = pair_rand(S, dt, sb, 2);
    pair_transpose(S, &a, 0, 1);      /* (70, 33) */
    pair_transpose(S, &b, 0, 1);      /* (33, 21) */
    check_mm(S, &a, &b, "both transposed");
    pair_narrow(S, &a, 1, 3, 20);     /* (70, 20), rows strided */
    pair_narrow(S, &b, 0, 5, 20);     /* (20, 21) */
    check_mm(S, &a, &b, "transposed and narrowed");
    pair_free(&a); pair_free(&b);
    /* neither stride 1: every other column of a, every other row of a 3-D slice */
    int64_t s3[3] = {4, 30, 40}, s3b[3] = {4, 40, 11};
    a = pair_rand(S, dt, s3, 3);
    b = pair_rand(S, dt, s3b, 3);
    pair_transpose(S, &a, 0, 2);      /* (40, 30, 4) */
    pair_narrow(S, &a, 2, 1, 3);      /* (40, 30, 3) */
    pair_transpose(S, &a, 0, 2);      /* (3, 30, 40): neither stride 1 */
    pair_narrow(S, &b, 0, 1, 3);      /* (3, 40, 11) */
    check_mm(S, &a, &b, "no unit stride");
    pair_transpose(S, &b, 1, 2);      /* (3, 11, 40) */
    pair_transpose(S, &a, 1, 2);      /* (3, 40, 30) */
    check_mm(S, &b, &a, "batched transposed, no unit stride");
    pair_free(&a); pair_free(&b);
    /* out column-major-like only through the operands: a transposed batch */
    int64_t sc[3] = {6, 17, 5}, sd[3] = {6, 17, 8};
    a = pair_rand(S, dt, sc, 3);
    b = pair_rand(S, dt, sd, 3);
    pair_transpose(S, &a, 1, 2);      /* (6, 5, 17) */
    check_mm(S, &a, &b, "batched a^T b");
    pair_free(&a); pair_free(&b);
  }
}

static void test_empty(em_state *S) {
  for (size_t t = 0; t < sizeof FLOATS / sizeof *FLOATS; t++) {
    em_dtype dt = FLOATS[t];
    int64_t a0[2] = {5, 0}, b0[2] = {0, 4}, am[2] = {0, 3}, bm[2] = {3, 4}, a3[3] = {2, 3, 0},
            b3[3] = {2, 0, 6};
    mm_case(S, dt, a0, 2, dt, b0, 2, "k = 0 (zeros)");
    mm_case(S, dt, am, 2, dt, bm, 2, "m = 0");
    mm_case(S, dt, a3, 3, dt, b3, 3, "batched k = 0");
    /* k = 0 really writes zeros into fresh memory that held something else */
    pair a = pair_rand(S, dt, a0, 2), b = pair_rand(S, dt, b0, 2);
    em_tensor *x, *h;
    REQUIRE_OK(S, em_matmul(S, a.d, b.d, &x));
    REQUIRE_OK(S, em_to(S, x, EM_FLOAT64, EM_CPU, &h));
    const double *v = em_tensor_data(h);
    int zeros = 1;
    for (int64_t i = 0; i < em_tensor_numel(h); i++) zeros &= v[i] == 0;
    CHECK(zeros && em_tensor_numel(h) == 20, "k = 0 gives zeros (%s)", em_dtype_name(dt));
    em_tensor_release(x); em_tensor_release(h);
    pair_free(&a); pair_free(&b);
  }
}

static void test_mixed_and_ints(em_state *S) {
  int64_t sa[3] = {3, 9, 12}, sb[2] = {12, 7};
  static const em_dtype ALL[] = {EM_BOOL, EM_UINT8, EM_INT32, EM_INT64, EM_FLOAT16,
                                 EM_BFLOAT16, EM_FLOAT32, EM_FLOAT64};
  em_cuda_memory m0, m1;
  REQUIRE_OK(S, em_cuda_synchronize(S, 0));
  REQUIRE_OK(S, em_cuda_memory_stats(S, 0, &m0));
  for (int i = 0; i < 8; i++)
    for (int j = 0; j < 8; j++) mm_case(S, ALL[i], sa, 3, ALL[j], sb, 2, "mixed");
  REQUIRE_OK(S, em_cuda_synchronize(S, 0));
  REQUIRE_OK(S, em_cuda_memory_stats(S, 0, &m1));
  CHECK(m1.allocated == m0.allocated, "the converted temporaries are freed (%lld vs %lld)",
        (long long)m1.allocated, (long long)m0.allocated);
  for (size_t t = 0; t < sizeof INTS / sizeof *INTS; t++) {
    int64_t a2[2] = {130, 33}, b2[2] = {33, 70};
    pair a = pair_rand(S, INTS[t], a2, 2), b = pair_rand(S, INTS[t], b2, 2);
    pair_transpose(S, &a, 0, 1);
    pair_transpose(S, &b, 0, 1);
    check_mm(S, &b, &a, "integer transposed");
    pair_free(&a); pair_free(&b);
    int64_t v[1] = {10}, b4[4] = {2, 1, 10, 3};
    mm_case(S, INTS[t], v, 1, INTS[t], b4, 4, "integer vector x 4-D");
  }
}

/* d/dA and d/dB of (A x B):sum() on cuda equal the CPU's. */
static void test_autograd(em_state *S) {
  for (size_t t = 0; t < 2; t++) {
    em_dtype dt = FLOATS[t];
    int64_t sa[3] = {3, 8, 5}, sb[2] = {5, 6};
    pair a = pair_rand(S, dt, sa, 3), b = pair_rand(S, dt, sb, 2);
    em_tensor *ga[2], *gb[2];
    for (int side = 0; side < 2; side++) {
      em_tensor *x = side ? a.d : a.h, *y = side ? b.d : b.h, *m, *s;
      REQUIRE_OK(S, em_tensor_set_requires_grad(S, x, 1));
      REQUIRE_OK(S, em_tensor_set_requires_grad(S, y, 1));
      REQUIRE_OK(S, em_matmul(S, x, y, &m));
      REQUIRE_OK(S, em_reduce(S, EM_SUM, m, NULL, 0, 0, &s));
      REQUIRE_OK(S, em_backward(S, s, NULL));
      em_tensor *g1 = em_tensor_grad(x), *g2 = em_tensor_grad(y);
      CHECK(g1 && g2, "gradients exist");
      if (!g1 || !g2) return;
      REQUIRE_OK(S, em_to(S, g1, EM_FLOAT64, EM_CPU, &ga[side]));
      REQUIRE_OK(S, em_to(S, g2, EM_FLOAT64, EM_CPU, &gb[side]));
      em_tensor_release(g1); em_tensor_release(g2);
      em_tensor_release(m); em_tensor_release(s);
    }
    for (int w = 0; w < 2; w++) {
      em_tensor *x = w ? gb[0] : ga[0], *y = w ? gb[1] : ga[1];
      const double *p = em_tensor_data(x), *q = em_tensor_data(y);
      int ok = em_tensor_numel(x) == em_tensor_numel(y);
      for (int64_t i = 0; ok && i < em_tensor_numel(x); i++)
        ok = fabs(p[i] - q[i]) <= 1e-5 * (1 + fabs(p[i]));
      CHECK(ok, "grad of %s (%s) on cuda equals the CPU's", w ? "B" : "A",
            em_dtype_name(dt));
    }
    for (int i = 0; i < 2; i++) {
      em_tensor_release(ga[i]);
      em_tensor_release(gb[i]);
    }
    pair_free(&a); pair_free(&b);
  }
}

/* The runtime's gemm directly: a column-major C, argument errors, and an operand
** out of device memory as the stream's sticky error (the stream stays usable). */
static void test_runtime_gemm(void) {
  emk_emu_config cfg = {1, 0};
  emk_runtime *rt = NULL;
  char err[256];
  if (emk_emu_open(&cfg, &rt, err, sizeof err)) {
    CHECK(0, "emk_emu_open: %s", err);
    return;
  }
  emk_stream *s = NULL;
  void *da = NULL, *db = NULL, *dc = NULL;
  CHECK(!rt->ops->stream_create(rt, 0, &s), "stream_create: %s", rt->errmsg);
  CHECK(!rt->ops->malloc(rt, 0, 6 * sizeof(double), &da) &&
        !rt->ops->malloc(rt, 0, 6 * sizeof(double), &db) &&
        !rt->ops->malloc(rt, 0, 4 * sizeof(double), &dc), "malloc: %s", rt->errmsg);
  double a[6] = {1, 2, 3, 4, 5, 6}, b[6] = {1, 0, -1, 2, 3, 1}, c[4] = {0};
  /* A 2x3 row-major, B 3x2 row-major, C column-major (rs 1, cs 2) */
  rt->ops->memcpy_async(rt, da, a, sizeof a, EMK_HOST_TO_DEVICE, s);
  rt->ops->memcpy_async(rt, db, b, sizeof b, EMK_HOST_TO_DEVICE, s);
  CHECK(!rt->ops->gemm(rt, s, EM_FLOAT64, 2, 2, 3, 1, da, 3, 1, 0, db, 2, 1, 0, dc, 1, 2, 0, 0),
        "gemm: %s", rt->errmsg);
  rt->ops->memcpy_async(rt, c, dc, sizeof c, EMK_DEVICE_TO_HOST, s);
  CHECK(!rt->ops->stream_sync(rt, s), "sync: %s", rt->errmsg);
  /* [1 2 3; 4 5 6] x [1 0; -1 2; 3 1] = [8 7; 17 16], stored by columns */
  CHECK(c[0] == 8 && c[1] == 17 && c[2] == 7 && c[3] == 16, "column-major C: %g %g %g %g",
        c[0], c[1], c[2], c[3]);
  CHECK(rt->ops->gemm(rt, s, EM_INT32, 2, 2, 3, 1, da, 3, 1, 0, db, 2, 1, 0, dc, 2, 1, 0, 0) ==
            EM_ERR_DTYPE, "int32 gemm refused");
  CHECK(rt->ops->gemm(rt, s, EM_FLOAT64, 2, 2, 3, 1, da, -3, 1, 0, db, 2, 1, 0, dc, 2, 1, 0,
                      0) == EM_ERR_ARG, "negative stride refused");
  /* C's batch stride runs past its block: found on the stream's thread */
  CHECK(!rt->ops->gemm(rt, s, EM_FLOAT64, 2, 2, 3, 2, da, 3, 1, 0, db, 2, 1, 0, dc, 2, 1, 4, 0),
        "queued: %s", rt->errmsg);
  CHECK(rt->ops->stream_sync(rt, s) == EM_ERR_ARG && strstr(rt->errmsg, "gemm") &&
        strstr(rt->errmsg, "operand C"), "out-of-range C is the stream's error: %s",
        rt->errmsg);
  CHECK(!rt->ops->stream_sync(rt, s), "the stream is usable after it: %s", rt->errmsg);
  CHECK(!emk_emu_check_guards(rt, err, sizeof err), "guards intact: %s", err);
  rt->ops->free(rt, 0, da);
  rt->ops->free(rt, 0, db);
  rt->ops->free(rt, 0, dc);
  rt->ops->stream_destroy(rt, s);
  rt->ops->close(rt);
}

int main(void) {
  cuda_check_rng = 0x9E3779B97F4A7C15ull;
  em_state *S;
  if (cuda_check_open(&S, "1")) return 1;
  RUN(test_2d, S);
  RUN(test_vectors, S);
  RUN(test_batched, S);
  RUN(test_strided, S);
  RUN(test_empty, S);
  RUN(test_mixed_and_ints, S);
  RUN(test_autograd, S);
  RUN(test_runtime_gemm);
  em_close(S);
  return check_done();
}

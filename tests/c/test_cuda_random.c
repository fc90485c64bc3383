/*
** test_cuda_random.c -- the CUDA backend's uniform_, normal_, randint_ and arange
** (kernels/k_random.c) on the emulated runtime: for the same seed and offset the
** device draws exactly the CPU's numbers, for every dtype, contiguous and strided
** targets (transposed, stepped), sizes crossing block boundaries, odd sizes
** (normal's last pair), empty tensors, and over several consecutive calls the
** state's offset advances identically (CPU and device stay in lock step).
*/
#include "cuda_check.h"
#include <math.h>
#include <stdlib.h>
#include <string.h>

static const em_dtype ALL[] = {EM_BOOL, EM_UINT8, EM_INT32, EM_INT64, EM_FLOAT16,
                               EM_BFLOAT16, EM_FLOAT32, EM_FLOAT64};
static const em_dtype FLOATS[] = {EM_FLOAT16, EM_BFLOAT16, EM_FLOAT32, EM_FLOAT64};

/* got (any device) equals want element for element, bit for bit. */
static em_status em_zeros(em_state *S, const int64_t *shape, int ndim, em_dtype dt,
                          int dev, em_tensor **out) {
  return em_full(S, shape, ndim, 0, dt, dev, out);
}

/* Element i (logical order) of CPU tensor t. */
static const char *at(const em_tensor *t, int64_t i) {
  int nd = em_tensor_ndim(t);
  const int64_t *sz = em_tensor_sizes(t), *st = em_tensor_strides(t);
  int64_t off = 0;
  for (int d = nd - 1; d >= 0; d--) {
    off += (i % sz[d]) * st[d];
    i /= sz[d];
  }
  return (const char *)em_tensor_data(t) + off * (int64_t)em_dtype_size(em_tensor_dtype(t));
}

/* Bit for bit, except float64 normal draws on a real GPU: those take CUDA's log, sin
** and cos (within an ulp or two of glibc's), so they match to 1e-14 relative there.
** The emulator runs glibc's, and float32 draws use ember's own formulas: exact. */
static double normal64_tol = 0;

static int same(em_state *S, const em_tensor *want, const em_tensor *got) {
  em_tensor *g = NULL, *w = NULL;
  if (em_to(S, got, em_tensor_dtype(got), EM_CPU, &g) ||
      em_to(S, want, em_tensor_dtype(want), EM_CPU, &w)) {
    printf("  to host: %s\n", em_errmsg(S));
    em_tensor_release(g);
    return 0;
  }
  int ok = em_tensor_numel(g) == em_tensor_numel(w);
  size_t es = em_dtype_size(em_tensor_dtype(g));
  int64_t n = ok ? em_tensor_numel(g) : 0;
  for (int64_t i = 0; ok && i < n; i++) {
    if (memcmp(at(g, i), at(w, i), es) &&
        !(normal64_tol > 0 && em_tensor_dtype(g) == EM_FLOAT64 &&
          fabs(t_get(g, i) - t_get(w, i)) <= normal64_tol * (1 + fabs(t_get(w, i))))) {
      printf("  element %lld: got %.17g want %.17g\n", (long long)i, t_get(g, i), t_get(w, i));
      ok = 0;
    }
  }
  em_tensor_release(g);
  em_tensor_release(w);
  return ok;
}

enum { K_UNIFORM, K_NORMAL, K_RANDINT, K_RANDINT_WIDE };

static em_status draw(em_state *S, int kind, em_tensor *t) {
  switch (kind) {
  case K_UNIFORM: return em_uniform_(S, t, -2.5, 3.0);
  case K_NORMAL: return em_normal_(S, t, 0.5, 2.0);
  case K_RANDINT:
    return em_dtype_is_floating(em_tensor_dtype(t)) || em_tensor_dtype(t) == EM_INT32 ||
                   em_tensor_dtype(t) == EM_INT64
               ? em_randint_(S, t, -7, 100)
               : em_randint_(S, t, 0, em_tensor_dtype(t) == EM_BOOL ? 2 : 200);
  default: return em_randint_(S, t, -(1ll << 40), 1ll << 41);   /* two words */
  }
}

/* shape `shape` on device dev; views: 0 plain, 1 transposed, 2 stepped (every
** other column of a wider tensor). *base gets what to release besides *view. */
static em_tensor *target(em_state *S, em_dtype dt, int dev, int view, int64_t r, int64_t c,
                         em_tensor **base) {
  em_tensor *t = NULL, *v = NULL;
  *base = NULL;
  if (view == 0) {
    em_zeros(S, (int64_t[]){r, c}, 2, dt, dev, &t);
    return t;
  }
  if (view == 1) {
    em_zeros(S, (int64_t[]){c, r}, 2, dt, dev, &t);
    em_transpose(S, t, 0, 1, &v);
  } else {
    em_zeros(S, (int64_t[]){r, 2 * c}, 2, dt, dev, &t);
    em_as_strided(S, t, (int64_t[]){r, c}, (int64_t[]){2 * c, 2}, 2, r * c != 0 ? 1 : 0, &v);
  }
  *base = t;
  return v;
}

static void run_kind(em_state *S, int kind, em_dtype dt) {
  const int64_t shapes[][2] = {{37, 29}, {1, 1}, {3, 5}, {300, 7}, {0, 4}, {1, 513}};
  for (unsigned s = 0; s < sizeof shapes / sizeof *shapes; s++)
    for (int view = 0; view < 3; view++) {
      em_tensor *bc, *bd;
      em_tensor *tc = target(S, dt, EM_CPU, view, shapes[s][0], shapes[s][1], &bc);
      em_tensor *td = target(S, dt, 0, view, shapes[s][0], shapes[s][1], &bd);
      REQUIRE(tc && td, "targets");
      normal64_tol = kind == K_NORMAL && !em_cuda_emulated(S) ? 1e-14 : 0;
      /* three draws each, from the same state: lock step */
      uint64_t seed0 = 1234567ull + (uint64_t)s * 77 + (uint64_t)kind, off0 = 5 + s;
      for (int call = 0; call < 3; call++) {
        uint64_t sc, oc, sd, od;
        em_rng_set_state(S, seed0, off0);
        for (int j = 0; j <= call; j++) CHECK_OK(S, draw(S, kind, tc));
        em_rng_get_state(S, &sc, &oc);
        em_rng_set_state(S, seed0, off0);
        for (int j = 0; j <= call; j++) CHECK_OK(S, draw(S, kind, td));
        em_rng_get_state(S, &sd, &od);
        CHECK(sc == sd && oc == od, "offsets after %d calls: cpu %llu cuda %llu", call + 1,
              (unsigned long long)oc, (unsigned long long)od);
        CHECK(same(S, tc, td), "kind %d %s shape %lldx%lld view %d call %d", kind,
              em_dtype_name(dt), (long long)shapes[s][0], (long long)shapes[s][1], view, call);
      }
      em_tensor_release(tc); em_tensor_release(td);
      em_tensor_release(bc); em_tensor_release(bd);
    }
}

static void test_uniform(em_state *S) {
  for (int k = 0; k < 4; k++) run_kind(S, K_UNIFORM, FLOATS[k]);
  /* the top of the range: hi just above lo, where scaling rounds up to hi */
  for (int k = 0; k < 4; k++) {
    em_tensor *c = NULL, *d = NULL;
    em_zeros(S, SHP(1000), FLOATS[k], EM_CPU, &c);
    em_zeros(S, SHP(1000), FLOATS[k], 0, &d);
    em_manual_seed(S, 99);
    CHECK_OK(S, em_uniform_(S, c, 1.0, 1.0 + 1e-3));
    em_manual_seed(S, 99);
    CHECK_OK(S, em_uniform_(S, d, 1.0, 1.0 + 1e-3));
    CHECK(same(S, c, d), "narrow range %s", em_dtype_name(FLOATS[k]));
    em_tensor_release(c); em_tensor_release(d);
  }
}

static void test_normal(em_state *S) {
  for (int k = 0; k < 4; k++) run_kind(S, K_NORMAL, FLOATS[k]);
}

static void test_randint(em_state *S) {
  for (int k = 0; k < 8; k++) run_kind(S, K_RANDINT, ALL[k]);
  run_kind(S, K_RANDINT_WIDE, EM_INT64);
}

/* Mixed draws in sequence, alternating kinds: the offsets stay in lock step. */
static void test_lock_step(em_state *S) {
  em_tensor *c[4], *d[4];
  const em_dtype dts[4] = {EM_FLOAT32, EM_FLOAT64, EM_INT64, EM_FLOAT16};
  for (int j = 0; j < 4; j++) {
    em_zeros(S, SHP(13, 11), dts[j], EM_CPU, &c[j]);
    em_zeros(S, SHP(13, 11), dts[j], 0, &d[j]);
  }
  em_manual_seed(S, 4242);
  uint64_t s0, o0, s1, o1, s2, o2;
  em_rng_get_state(S, &s0, &o0);
  for (int j = 0; j < 4; j++) CHECK_OK(S, draw(S, j == 2 ? K_RANDINT : j & 1, c[j]));
  em_rng_get_state(S, &s1, &o1);
  em_rng_set_state(S, s0, o0);
  for (int j = 0; j < 4; j++) CHECK_OK(S, draw(S, j == 2 ? K_RANDINT : j & 1, d[j]));
  em_rng_get_state(S, &s2, &o2);
  CHECK(o1 == o2 && o1 > o0, "offset %llu vs %llu", (unsigned long long)o1,
        (unsigned long long)o2);
  normal64_tol = em_cuda_emulated(S) ? 0 : 1e-14;   /* draw 1: float64 normal */
  for (int j = 0; j < 4; j++) {
    CHECK(same(S, c[j], d[j]), "draw %d", j);
    em_tensor_release(c[j]);
    em_tensor_release(d[j]);
  }
}

static void test_arange(em_state *S) {
  const double args[][3] = {{0, 1000, 1}, {-3.5, 7.25, 0.37}, {10, -10, -0.5}, {5, 5, 1},
                            {1, 600, 3}};
  for (int k = 0; k < 8; k++)
    for (unsigned a = 0; a < sizeof args / sizeof *args; a++) {
      em_dtype dt = ALL[k];
      if (dt == EM_BOOL) continue;
      if (!em_dtype_is_floating(dt) && args[a][2] != (int)args[a][2]) continue;
      if (dt == EM_UINT8 && (args[a][0] < 0 || args[a][1] < 0)) continue;
      em_tensor *c = NULL, *d = NULL;
      em_status sc = em_arange(S, args[a][0], args[a][1], args[a][2], dt, EM_CPU, &c);
      em_status sd = em_arange(S, args[a][0], args[a][1], args[a][2], dt, 0, &d);
      CHECK(sc == sd, "arange %s %u: statuses %d %d (%s)", em_dtype_name(dt), a, sc, sd,
            em_errmsg(S));
      if (!sc && !sd) CHECK(same(S, c, d), "arange %s %u", em_dtype_name(dt), a);
      em_tensor_release(c);
      em_tensor_release(d);
    }
}

int main(void) {
  em_state *S;
  if (cuda_check_open(&S, "1")) return 1;
  RUN(test_uniform, S);
  RUN(test_normal, S);
  RUN(test_randint, S);
  RUN(test_lock_step, S);
  RUN(test_arange, S);
  em_close(S);
  return check_done();
}

/*
** test_cuda_index.c -- the CUDA backend's index_select, gather, index_add and
** scatter_add (kernels/k_index.c) on the emulated runtime against the CPU's:
** every dtype, int32/int64 indices, index_base 0 and 1, strided operands and
** indices, sizes crossing block boundaries, duplicates in the adds, empty cases,
** and out-of-range indices (the CPU's message, out untouched). Bit-exact.
*/
#include "cuda_check.h"
#include <stdlib.h>
#include <string.h>

static const em_dtype ALL[] = {EM_BOOL, EM_UINT8, EM_INT32, EM_INT64, EM_FLOAT16,
                               EM_BFLOAT16, EM_FLOAT32, EM_FLOAT64};
enum { NDT = 8 };

static uint64_t rnd(void) { return cuda_check_rand(); }

static int64_t numel_of(const int64_t *shape, int nd) {
  int64_t n = 1;
  for (int d = 0; d < nd; d++) n *= shape[d];
  return n;
}

/* Random values of dt's kind (floats with fractions, so sums round). */
static em_tensor *rand_t(em_state *S, em_dtype dt, const int64_t *shape, int nd) {
  int64_t n = numel_of(shape, nd);
  double *v = malloc(sizeof(double) * (size_t)(n ? n : 1));
  for (int64_t i = 0; i < n; i++) {
    uint64_t r = rnd();
    switch (dt) {
    case EM_BOOL: v[i] = (double)(r % 3 == 0); break;
    case EM_UINT8: v[i] = (double)(r % 256); break;
    case EM_INT32: case EM_INT64: v[i] = (double)((int64_t)(r % 2001) - 1000); break;
    default: v[i] = ((double)(r >> 11) / 9007199254740992.0) * 20 - 10; break;
    }
  }
  em_tensor *t = NULL;
  if (em_from_data(S, shape, nd, dt, v, EM_FLOAT64, &t)) printf("  from_data: %s\n", em_errmsg(S));
  free(v);
  return t;
}

/* Indices in [base, base + size), as idt. */
static em_tensor *rand_idx(em_state *S, em_dtype idt, const int64_t *shape, int nd,
                           int64_t size, int base) {
  int64_t n = numel_of(shape, nd);
  double *v = malloc(sizeof(double) * (size_t)(n ? n : 1));
  for (int64_t i = 0; i < n; i++) v[i] = (double)((int64_t)(rnd() % (uint64_t)size) + base);
  em_tensor *t = NULL;
  if (em_from_data(S, shape, nd, idt, v, EM_FLOAT64, &t)) printf("  from_data: %s\n", em_errmsg(S));
  free(v);
  return t;
}

static em_tensor *dev(em_state *S, const em_tensor *t) {
  em_tensor *d = NULL;
  if (em_to(S, t, em_tensor_dtype(t), 0, &d)) printf("  to device: %s\n", em_errmsg(S));
  return d;
}

/* got (device) equals want (CPU) element for element, bit for bit (NaN = NaN). */
static int same(em_state *S, const em_tensor *want, const em_tensor *got) {
  em_tensor *g = NULL;
  if (em_to(S, got, em_tensor_dtype(got), EM_CPU, &g)) {
    printf("  to host: %s\n", em_errmsg(S));
    return 0;
  }
  int ok = em_tensor_ndim(g) == em_tensor_ndim(want) && em_tensor_dtype(g) == em_tensor_dtype(want);
  for (int d = 0; ok && d < em_tensor_ndim(g); d++)
    ok = em_tensor_sizes(g)[d] == em_tensor_sizes(want)[d];
  int64_t n = ok ? em_tensor_numel(g) : 0;
  for (int64_t i = 0; ok && i < n; i++) {
    double x = t_get(g, i), y = t_get(want, i);
    if (!(x == y && signbit(x) == signbit(y)) && !(isnan(x) && isnan(y))) {
      printf("  element %lld: got %.17g want %.17g\n", (long long)i, x, y);
      ok = 0;
    }
  }
  em_tensor_release(g);
  return ok;
}

/* A view of t with every other element along dim 0 of a doubled tensor:
** t_full has twice t's dim-0 size; returns the strided view (size shape[0]). */
static em_tensor *step2(em_state *S, em_tensor *full, int64_t n) {
  em_tensor *v = NULL;
  int64_t shp[1] = {n}, str[1] = {2 * em_tensor_strides(full)[0]};
  if (em_as_strided(S, full, shp, str, 1, 0, &v)) printf("  as_strided: %s\n", em_errmsg(S));
  return v;
}

static void test_index_select(em_state *S) {
  const em_dtype idts[2] = {EM_INT32, EM_INT64};
  for (int k = 0; k < NDT; k++)
    for (int it = 0; it < 2; it++)
      for (int base = 0; base < 2; base++)
        for (int tr = 0; tr < 2; tr++)
          for (int dim = 0; dim < 3; dim++) {
            em_dtype dt = ALL[k];
            em_tensor *a0 = rand_t(S, dt, SHP(5, 300, 3)), *ad0 = dev(S, a0), *a = a0, *ad = ad0;
            if (tr) {
              em_transpose(S, a0, 0, 2, &a);
              em_transpose(S, ad0, 0, 2, &ad);
            }
            int64_t size = em_tensor_sizes(a)[dim];
            int64_t n = dim == 1 ? 270 : 9;            /* duplicates; crosses blocks */
            em_tensor *full = rand_idx(S, idts[it], SHP(2 * n), size, base), *fulld = dev(S, full);
            em_tensor *idx = step2(S, full, n), *idxd = step2(S, fulld, n);
            em_tensor *w = NULL, *g = NULL;
            CHECK_OK(S, em_index_select(S, a, dim, idx, base, &w));
            CHECK_OK(S, em_index_select(S, ad, dim, idxd, base, &g));
            CHECK(w && g && same(S, w, g), "index_select %s idx %d base %d tr %d dim %d",
                  em_dtype_name(dt), it, base, tr, dim);
            em_tensor_release(w); em_tensor_release(g);
            em_tensor_release(idx); em_tensor_release(idxd);
            em_tensor_release(full); em_tensor_release(fulld);
            if (tr) { em_tensor_release(a); em_tensor_release(ad); }
            em_tensor_release(a0); em_tensor_release(ad0);
          }
}

static void test_gather(em_state *S) {
  const em_dtype idts[2] = {EM_INT32, EM_INT64};
  for (int k = 0; k < NDT; k++)
    for (int it = 0; it < 2; it++)
      for (int base = 0; base < 2; base++)
        for (int dim = 0; dim < 3; dim++) {
          em_dtype dt = ALL[k];
          em_tensor *a0 = rand_t(S, dt, SHP(6, 90, 4)), *ad0 = dev(S, a0), *a = NULL, *ad = NULL;
          em_transpose(S, a0, 0, 2, &a);     /* (4, 90, 6), strided */
          em_transpose(S, ad0, 0, 2, &ad);
          int64_t size = em_tensor_sizes(a)[dim];
          /* idx: a narrowed (strided) view of a larger index tensor */
          em_tensor *full = rand_idx(S, idts[it], SHP(4, 90, 6), size, base), *fulld = dev(S, full);
          em_tensor *i1 = NULL, *i1d = NULL, *idx = NULL, *idxd = NULL;
          em_narrow(S, full, 1, 3, 80, &i1);
          em_narrow(S, fulld, 1, 3, 80, &i1d);
          em_narrow(S, i1, 2, 1, 5, &idx);
          em_narrow(S, i1d, 2, 1, 5, &idxd);
          em_tensor *w = NULL, *g = NULL;
          CHECK_OK(S, em_gather(S, a, dim, idx, base, &w));
          CHECK_OK(S, em_gather(S, ad, dim, idxd, base, &g));
          CHECK(w && g && same(S, w, g), "gather %s idx %d base %d dim %d", em_dtype_name(dt),
                it, base, dim);
          em_tensor_release(w); em_tensor_release(g);
          em_tensor_release(idx); em_tensor_release(idxd);
          em_tensor_release(i1); em_tensor_release(i1d);
          em_tensor_release(full); em_tensor_release(fulld);
          em_tensor_release(a); em_tensor_release(ad);
          em_tensor_release(a0); em_tensor_release(ad0);
        }
}

static void test_index_add(em_state *S) {
  const em_dtype idts[2] = {EM_INT32, EM_INT64};
  for (int k = 0; k < NDT; k++)
    for (int it = 0; it < 2; it++)
      for (int base = 0; base < 2; base++)
        for (int dim = 0; dim < 3; dim++) {
          em_dtype dt = ALL[k];
          /* out: a transposed (strided) view, (3, 130, 6) */
          em_tensor *o0 = rand_t(S, dt, SHP(6, 130, 3)), *od0 = dev(S, o0), *o = NULL, *od = NULL;
          em_transpose(S, o0, 0, 2, &o);
          em_transpose(S, od0, 0, 2, &od);
          int64_t size = em_tensor_sizes(o)[dim], n = 11;    /* n > size somewhere: duplicates */
          int64_t ss[3] = {3, 130, 6};
          ss[dim] = n;
          em_tensor *src0 = rand_t(S, dt, (int64_t[]){ss[2], ss[1], ss[0]}, 3), *srcd0 = dev(S, src0);
          em_tensor *src = NULL, *srcd = NULL;
          em_transpose(S, src0, 0, 2, &src);
          em_transpose(S, srcd0, 0, 2, &srcd);
          em_tensor *full = rand_idx(S, idts[it], SHP(2 * n), size, base), *fulld = dev(S, full);
          em_tensor *idx = step2(S, full, n), *idxd = step2(S, fulld, n);
          CHECK_OK(S, em_index_add_(S, o, dim, idx, src, base));
          CHECK_OK(S, em_index_add_(S, od, dim, idxd, srcd, base));
          CHECK(same(S, o, od), "index_add_ %s idx %d base %d dim %d", em_dtype_name(dt), it,
                base, dim);
          em_tensor_release(idx); em_tensor_release(idxd);
          em_tensor_release(full); em_tensor_release(fulld);
          em_tensor_release(src); em_tensor_release(srcd);
          em_tensor_release(src0); em_tensor_release(srcd0);
          em_tensor_release(o); em_tensor_release(od);
          em_tensor_release(o0); em_tensor_release(od0);
        }
}

static void test_scatter_add(em_state *S) {
  const em_dtype idts[2] = {EM_INT32, EM_INT64};
  for (int k = 0; k < NDT; k++)
    for (int it = 0; it < 2; it++)
      for (int base = 0; base < 2; base++)
        for (int dim = 0; dim < 3; dim++) {
          em_dtype dt = ALL[k];
          em_tensor *o0 = rand_t(S, dt, SHP(5, 140, 4)), *od0 = dev(S, o0), *o = NULL, *od = NULL;
          em_transpose(S, o0, 0, 2, &o);     /* (4, 140, 5) strided */
          em_transpose(S, od0, 0, 2, &od);
          int64_t size = em_tensor_sizes(o)[dim];
          em_tensor *src = rand_t(S, dt, SHP(4, 140, 6)), *srcd = dev(S, src);
          em_tensor *full = rand_idx(S, idts[it], SHP(4, 140, 6), size, base), *fulld = dev(S, full);
          em_tensor *idx = NULL, *idxd = NULL;          /* (4, 140, 4), strided */
          em_narrow(S, full, 2, 1, 4, &idx);
          em_narrow(S, fulld, 2, 1, 4, &idxd);
          CHECK_OK(S, em_scatter_add_(S, o, dim, idx, src, base));
          CHECK_OK(S, em_scatter_add_(S, od, dim, idxd, srcd, base));
          CHECK(same(S, o, od), "scatter_add_ %s idx %d base %d dim %d", em_dtype_name(dt),
                it, base, dim);
          em_tensor_release(idx); em_tensor_release(idxd);
          em_tensor_release(full); em_tensor_release(fulld);
          em_tensor_release(src); em_tensor_release(srcd);
          em_tensor_release(o); em_tensor_release(od);
          em_tensor_release(o0); em_tensor_release(od0);
        }
}

/* The same failure on both sides, with the same message; out untouched. */
static void check_same_error(em_state *S, em_status sc, em_status sd, const char *cpumsg,
                             const char *what) {
  CHECK(sc == EM_ERR_INDEX && sd == EM_ERR_INDEX, "%s: statuses %d %d", what, sc, sd);
  CHECK(strcmp(cpumsg, em_errmsg(S)) == 0, "%s: cpu '%s' cuda '%s'", what, cpumsg, em_errmsg(S));
}

static void test_errors(em_state *S) {
  char msg[512];
  for (int base = 0; base < 2; base++)
    for (int it = 0; it < 2; it++) {
      em_dtype idt = it ? EM_INT64 : EM_INT32;
      em_tensor *a = rand_t(S, EM_FLOAT32, SHP(4, 5)), *ad = dev(S, a);
      double bad[4] = {1, 2, 9, -3};
      for (int j = 0; j < 4; j++) bad[j] += base;
      em_tensor *idx = NULL, *idx2 = NULL;
      em_from_data(S, SHP(4), idt, bad, EM_FLOAT64, &idx);
      em_from_data(S, SHP(1, 4), idt, bad, EM_FLOAT64, &idx2);
      em_tensor *idxd = dev(S, idx), *idx2d = dev(S, idx2), *w = NULL;
      em_status sc = em_index_select(S, a, 1, idx, base, &w);
      snprintf(msg, sizeof msg, "%s", em_errmsg(S));
      em_status sd = em_index_select(S, ad, 1, idxd, base, &w);
      check_same_error(S, sc, sd, msg, "index_select");
      sc = em_gather(S, a, 1, idx2, base, &w);
      snprintf(msg, sizeof msg, "%s", em_errmsg(S));
      sd = em_gather(S, ad, 1, idx2d, base, &w);
      check_same_error(S, sc, sd, msg, "gather");
      em_tensor *src = rand_t(S, EM_FLOAT32, SHP(4, 4)), *srcd = dev(S, src);
      sc = em_index_add_(S, a, 1, idx, src, base);
      snprintf(msg, sizeof msg, "%s", em_errmsg(S));
      sd = em_index_add_(S, ad, 1, idxd, srcd, base);
      check_same_error(S, sc, sd, msg, "index_add_");
      em_tensor *src2 = rand_t(S, EM_FLOAT32, SHP(1, 4)), *src2d = dev(S, src2);
      sc = em_scatter_add_(S, a, 1, idx2, src2, base);
      snprintf(msg, sizeof msg, "%s", em_errmsg(S));
      sd = em_scatter_add_(S, ad, 1, idx2d, src2d, base);
      check_same_error(S, sc, sd, msg, "scatter_add_");
      CHECK(same(S, a, ad), "out untouched after the errors");
      em_tensor *t[] = {a, ad, idx, idx2, idxd, idx2d, src, srcd, src2, src2d};
      for (unsigned j = 0; j < sizeof t / sizeof *t; j++) em_tensor_release(t[j]);
    }
}

static void test_empty(em_state *S) {
  em_tensor *a = rand_t(S, EM_FLOAT32, SHP(4, 5)), *ad = dev(S, a);
  em_tensor *idx = NULL, *idxd = NULL, *w = NULL, *g = NULL;
  REQUIRE_OK(S, em_empty(S, SHP(0), EM_INT64, EM_CPU, &idx));
  idxd = dev(S, idx);
  CHECK_OK(S, em_index_select(S, a, 0, idx, 0, &w));
  CHECK_OK(S, em_index_select(S, ad, 0, idxd, 0, &g));
  CHECK(w && g && same(S, w, g), "index_select with no indices");
  em_tensor_release(w); em_tensor_release(g);
  em_tensor *src = NULL, *srcd = NULL;
  REQUIRE_OK(S, em_empty(S, SHP(0, 5), EM_FLOAT32, EM_CPU, &src));
  srcd = dev(S, src);
  CHECK_OK(S, em_index_add_(S, a, 0, idx, src, 0));
  CHECK_OK(S, em_index_add_(S, ad, 0, idxd, srcd, 0));
  CHECK(same(S, a, ad), "index_add_ with no indices");
  em_tensor *i2 = NULL, *i2d = NULL;
  REQUIRE_OK(S, em_empty(S, SHP(0, 5), EM_INT64, EM_CPU, &i2));
  i2d = dev(S, i2);
  w = g = NULL;
  CHECK_OK(S, em_gather(S, a, 0, i2, 0, &w));
  CHECK_OK(S, em_gather(S, ad, 0, i2d, 0, &g));
  CHECK(w && g && same(S, w, g), "gather with no indices");
  CHECK_OK(S, em_scatter_add_(S, a, 0, i2, src, 0));
  CHECK_OK(S, em_scatter_add_(S, ad, 0, i2d, srcd, 0));
  CHECK(same(S, a, ad), "scatter_add_ with no indices");
  em_tensor *t[] = {a, ad, idx, idxd, w, g, src, srcd, i2, i2d};
  for (unsigned j = 0; j < sizeof t / sizeof *t; j++) em_tensor_release(t[j]);
}

/* 0-d operands (act as [1]); the messages when the state numbers from 1. */
static void test_zero_dim_and_base(em_state *S) {
  for (int k = 0; k < NDT; k++) {
    em_dtype dt = ALL[k];
    em_tensor *o = rand_t(S, dt, NULL, 0), *od = dev(S, o), *src = rand_t(S, dt, NULL, 0);
    em_tensor *srcd = dev(S, src), *idx = NULL, *idxd;
    double zero = 0;
    em_from_data(S, NULL, 0, EM_INT64, &zero, EM_FLOAT64, &idx);
    idxd = dev(S, idx);
    em_status sc = em_index_add_(S, o, 0, idx, src, 0), sd = em_index_add_(S, od, 0, idxd, srcd, 0);
    CHECK(sc == sd, "0-d index_add_ %s: %d %d (%s)", em_dtype_name(dt), sc, sd, em_errmsg(S));
    CHECK(same(S, o, od), "0-d index_add_ %s", em_dtype_name(dt));
    sc = em_scatter_add_(S, o, 0, idx, src, 0);
    sd = em_scatter_add_(S, od, 0, idxd, srcd, 0);
    CHECK(sc == sd, "0-d scatter_add_ %s: %d %d (%s)", em_dtype_name(dt), sc, sd, em_errmsg(S));
    CHECK(same(S, o, od), "0-d scatter_add_ %s", em_dtype_name(dt));
    em_tensor *t[] = {o, od, src, srcd, idx, idxd};
    for (unsigned j = 0; j < sizeof t / sizeof *t; j++) em_tensor_release(t[j]);
  }
  /* src is out itself: each thread's column of out is its own source */
  for (int dim = 0; dim < 2; dim++) {
    em_tensor *o = rand_t(S, EM_FLOAT32, SHP(6, 300)), *od = dev(S, o);
    int64_t size = em_tensor_sizes(o)[dim];
    em_tensor *ix = rand_idx(S, EM_INT64, &size, 1, size, 0), *ixd = dev(S, ix);
    CHECK_OK(S, em_index_add_(S, o, dim, ix, o, 0));
    CHECK_OK(S, em_index_add_(S, od, dim, ixd, od, 0));
    CHECK(same(S, o, od), "index_add_ into its own source, dim %d", dim);
    em_tensor *t[] = {o, od, ix, ixd};
    for (unsigned j = 0; j < sizeof t / sizeof *t; j++) em_tensor_release(t[j]);
  }
  /* state numbering from 1: dims in messages shift, indices count from 1 */
  char msg[512];
  REQUIRE_OK(S, em_set_index_base(S, 1));
  em_tensor *a = rand_t(S, EM_FLOAT64, SHP(3, 4)), *ad = dev(S, a), *idx = NULL, *w = NULL;
  em_from_data(S, SHP(2), EM_INT32, (double[]){1, 0}, EM_FLOAT64, &idx);
  em_tensor *idxd = dev(S, idx);
  em_status sc = em_index_select(S, a, 1, idx, 1, &w);
  snprintf(msg, sizeof msg, "%s", em_errmsg(S));
  em_status sd = em_index_select(S, ad, 1, idxd, 1, &w);
  check_same_error(S, sc, sd, msg, "index_select base 1");
  REQUIRE_OK(S, em_set_index_base(S, 0));
  em_tensor *t[] = {a, ad, idx, idxd};
  for (unsigned j = 0; j < sizeof t / sizeof *t; j++) em_tensor_release(t[j]);
}

int main(void) {
  em_state *S;
  if (cuda_check_open(&S, "1")) return 1;
  RUN(test_index_select, S);
  RUN(test_gather, S);
  RUN(test_index_add, S);
  RUN(test_scatter_add, S);
  RUN(test_errors, S);
  RUN(test_empty, S);
  RUN(test_zero_dim_and_base, S);
  em_close(S);
  return check_done();
}

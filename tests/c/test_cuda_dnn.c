/*
** test_cuda_dnn.c -- the CUDA backend's nn entries (kernels/k_dnn.c): conv2d,
** max / avg / adaptive-avg pooling and batch norm, forward and backward, on
** `cuda` (the emulated runtime unless EMBER_TEST_REAL_CUDA) against the CPU
** backend, float32 and float64, with strided inputs and stride / padding /
** dilation / groups; batch norm's running statistics over several steps and eval
** mode; the convolution-algorithm cache (a hit on the second call of a shape),
** the emulator's workspace contract, a clear out-of-memory error for the
** workspace, and cuDNN's descriptors built from our geometry without a GPU;
** the math modes (dnn.h's emk_conv_math: float32 without TF32 runs FMA only)
** as a rule, on the emulator through the backend, and set on cuDNN's descriptor.
** On a real GPU the descriptor sets are reused per geometry (the plan table's
** hits are checked).
*/
#include "cuda_check.h"
#include "../../kernels/cuda.h"
#include "../../kernels/dnn.h"

/* Built only with the CUDA headers (kernels/real/dnn_real.c). */
extern em_status emk_dnn_describe_check(const emk_conv_desc *c, int dims[4], char *err,
                                        size_t errlen) __attribute__((weak));
extern em_status emk_dnn_math_check(const emk_conv_desc *c, int math, int *got, char *err,
                                    size_t errlen) __attribute__((weak));
extern int emk_dnn_find_bytes(const emk_conv_desc *c, size_t bytes[3]) __attribute__((weak));
extern int emk_dnn_find_on(void) __attribute__((weak));
extern em_status emk_dnn_find_symbols(int *count, char *err, size_t errlen)
    __attribute__((weak));
typedef struct emk_plan_cache_stats {   /* kernels/real/plan_cache.h */
  uint64_t hits, misses, busy, evictions, not_kept;
  size_t entries, capacity;
} emk_plan_cache_stats;
extern int emk_real_conv_plans(emk_runtime *rt, emk_plan_cache_stats *out)
    __attribute__((weak));

static int emulated = 1;

/* -- Helpers ------------------------------------------------------------------------- */

static em_tensor *rnd(em_state *S, const int64_t *shape, int nd, em_dtype dt) {
  em_tensor *t = NULL;
  if (em_empty(S, shape, nd, dt, EM_CPU, &t) || em_uniform_(S, t, -1, 1)) return NULL;
  return t;
}

static em_tensor *on(em_state *S, const em_tensor *t, int device) {
  em_tensor *o = NULL;
  if (!t || em_to(S, t, em_tensor_dtype(t), device, &o)) return NULL;
  return o;
}

/* The CPU result want and the cuda result got agree: same shape, every element
** within tol (exactly for integers). */
static int same(em_state *S, const char *what, const em_tensor *want, const em_tensor *got,
                double tol) {
  if (!want || !got)
    return CHECK(!want && !got, "%s: %s is missing", what, want ? "cuda's" : "cpu's");
  /* want too may be a device tensor (two cuda results compared): its data is read
  ** here on the host, which on a GPU is device memory, so it is copied first (the
  ** emulator's device memory happens to be host memory: a test that skips this
  ** passes there and dies with SIGSEGV on a GPU) */
  em_tensor *hw = NULL;
  if (em_tensor_device(want) != EM_CPU) {
    if (!CHECK((hw = on(S, want, EM_CPU)) != NULL, "%s: copy to host: %s", what,
               em_errmsg(S)))
      return 0;
    want = hw;
  }
  em_tensor *h = on(S, got, EM_CPU);
  if (!CHECK(h != NULL, "%s: copy to host: %s", what, em_errmsg(S))) {
    em_tensor_release(hw);
    return 0;
  }
  int ok = em_tensor_ndim(h) == em_tensor_ndim(want) && em_tensor_numel(h) == em_tensor_numel(want);
  for (int d = 0; ok && d < em_tensor_ndim(h); d++) ok = h->sizes[d] == want->sizes[d];
  int64_t bad = -1;
  for (int64_t i = 0; ok && i < em_tensor_numel(want) && bad < 0; i++)
    if (!chk_close(t_get(h, i), t_get(want, i), tol)) bad = i;
  int r = CHECK(ok && bad < 0, "%s: %s", what, !ok ? "shapes differ"
                : "values differ");
  if (bad >= 0)
    printf("    first at %lld: cuda %.9g, cpu %.9g\n", (long long)bad, t_get(h, bad),
           t_get(want, bad));
  em_tensor_release(h);
  em_tensor_release(hw);
  return r;
}

static double tol_of(em_dtype dt) { return dt == EM_FLOAT64 ? 1e-10 : 2e-5; }

/* A (N, C, H, W) input as a strided view: a (N, C, W, H) tensor transposed. The
** CPU tensor and its cuda copy are made the same way. */
static int strided_pair(em_state *S, const int64_t *sh, em_dtype dt, em_tensor **c,
                        em_tensor **d) {
  int64_t b[4] = {sh[0], sh[1], sh[3], sh[2]};
  em_tensor *base = rnd(S, b, 4, dt), *dbase = on(S, base, 0);
  int ok = base && dbase && !em_transpose(S, base, 2, 3, c) && !em_transpose(S, dbase, 2, 3, d);
  em_tensor_release(base);
  em_tensor_release(dbase);
  return ok;
}

static void release_all(em_tensor **t, int n) {
  for (int i = 0; i < n; i++) em_tensor_release(t[i]);
}

/* -- conv2d ------------------------------------------------------------------------------ */

typedef struct conv_case {
  int64_t N, C, H, W, O, kH, kW, s[2], p[2], d[2], G;
  int bias, strided;
} conv_case;

static const conv_case conv_cases[] = {
  {2, 3, 9, 8, 4, 3, 3, {1, 1}, {1, 1}, {1, 1}, 1, 1, 0},
  {2, 4, 10, 9, 6, 3, 2, {2, 1}, {1, 0}, {2, 1}, 2, 0, 1},
  {1, 6, 7, 7, 6, 3, 3, {1, 1}, {2, 2}, {1, 1}, 6, 1, 1},    /* depthwise */
  {3, 2, 5, 6, 3, 1, 1, {2, 2}, {0, 0}, {1, 1}, 1, 1, 0},
  {2, 4, 6, 11, 4, 2, 4, {3, 2}, {0, 3}, {1, 2}, 2, 1, 1},
};

static void conv_one(em_state *S, const conv_case *k, em_dtype dt) {
  char what[160];
  snprintf(what, sizeof what, "conv2d %lldx%lldx%lldx%lld k%lldx%lld G%lld %s",
           (long long)k->N, (long long)k->C, (long long)k->H, (long long)k->W,
           (long long)k->kH, (long long)k->kW, (long long)k->G, em_dtype_name(dt));
  int64_t xs[4] = {k->N, k->C, k->H, k->W}, ws[4] = {k->O, k->C / k->G, k->kH, k->kW};
  int64_t bs[1] = {k->O};
  em_tensor *t[16] = {0};
  em_tensor **x = &t[0], **dx = &t[1], **w = &t[2], **dw = &t[3], **b = &t[4], **db = &t[5];
  em_tensor **y = &t[6], **dy = &t[7], **gy = &t[8], **dgy = &t[9];
  em_tensor **gx = &t[10], **gw = &t[11], **gb = &t[12], **dgx = &t[13], **dgw = &t[14],
            **dgb = &t[15];
  if (k->strided) {
    if (!CHECK(strided_pair(S, xs, dt, x, dx), "%s: inputs", what)) goto done;
  } else {
    *x = rnd(S, xs, 4, dt);
    *dx = on(S, *x, 0);
  }
  *w = rnd(S, ws, 4, dt);
  *dw = on(S, *w, 0);
  if (k->bias) { *b = rnd(S, bs, 1, dt); *db = on(S, *b, 0); }
  if (!CHECK(*x && *dx && *w && *dw, "%s: inputs", what)) goto done;
  if (!CHECK_OK(S, em_conv2d(S, *x, *w, *b, k->s, k->p, k->d, k->G, y)) ||
      !CHECK_OK(S, em_conv2d(S, *dx, *dw, *db, k->s, k->p, k->d, k->G, dy)))
    goto done;
  same(S, what, *y, *dy, tol_of(dt));
  *gy = rnd(S, (*y)->sizes, 4, dt);
  *dgy = on(S, *gy, 0);
  if (!CHECK_OK(S, em_conv2d_backward(S, *gy, *x, *w, k->s, k->p, k->d, k->G, gx, gw,
                                      k->bias ? gb : NULL)) ||
      !CHECK_OK(S, em_conv2d_backward(S, *dgy, *dx, *dw, k->s, k->p, k->d, k->G, dgx, dgw,
                                      k->bias ? dgb : NULL)))
    goto done;
  same(S, "conv2d grad input", *gx, *dgx, tol_of(dt));
  same(S, "conv2d grad weight", *gw, *dgw, tol_of(dt) * 10);
  if (k->bias) same(S, "conv2d grad bias", *gb, *dgb, tol_of(dt) * 10);
  /* the bias gradient alone: the filter pass writes a scratch weight gradient */
  if (k->bias) {
    em_tensor *gb2 = NULL;
    if (CHECK_OK(S, em_conv2d_backward(S, *dgy, *dx, *dw, k->s, k->p, k->d, k->G, NULL, NULL,
                                       &gb2)))
      same(S, "conv2d grad bias alone", *gb, gb2, tol_of(dt) * 10);
    em_tensor_release(gb2);
  }
done:
  release_all(t, 16);
}

static void test_conv2d(em_state *S) {
  for (size_t i = 0; i < sizeof conv_cases / sizeof conv_cases[0]; i++) {
    conv_one(S, &conv_cases[i], EM_FLOAT32);
    conv_one(S, &conv_cases[i], EM_FLOAT64);
  }
}

/* -- Pooling -------------------------------------------------------------------------- */

static void test_pooling(em_state *S) {
  em_dtype dts[2] = {EM_FLOAT32, EM_FLOAT64};
  for (int di = 0; di < 2; di++) {
    em_dtype dt = dts[di];
    int64_t xs[4] = {2, 3, 9, 8};
    em_tensor *x = NULL, *dx = NULL;
    REQUIRE(strided_pair(S, xs, dt, &x, &dx), "pool inputs");
    struct { int64_t k[2], s[2], p[2], d[2]; int ceil, base; } mp[] = {
      {{2, 2}, {2, 2}, {0, 0}, {1, 1}, 0, 0},
      {{3, 2}, {2, 2}, {1, 1}, {1, 2}, 1, 1},
      {{3, 3}, {1, 2}, {1, 0}, {2, 1}, 0, 0},
    };
    for (int i = 0; i < 3; i++) {
      em_tensor *y, *ind, *dy, *dind, *gy, *dgy, *gx, *dgx;
      REQUIRE_OK(S, em_max_pool2d(S, x, mp[i].k, mp[i].s, mp[i].p, mp[i].d, mp[i].ceil,
                                  mp[i].base, &y, &ind));
      REQUIRE_OK(S, em_max_pool2d(S, dx, mp[i].k, mp[i].s, mp[i].p, mp[i].d, mp[i].ceil,
                                  mp[i].base, &dy, &dind));
      same(S, "max_pool2d", y, dy, 0);
      same(S, "max_pool2d indices", ind, dind, 0);
      gy = rnd(S, y->sizes, 4, dt);
      dgy = on(S, gy, 0);
      REQUIRE_OK(S, em_max_pool2d_backward(S, gy, x, ind, mp[i].base, &gx));
      REQUIRE_OK(S, em_max_pool2d_backward(S, dgy, dx, dind, mp[i].base, &dgx));
      same(S, "max_pool2d backward", gx, dgx, tol_of(dt));
      em_tensor *all[] = {y, ind, dy, dind, gy, dgy, gx, dgx};
      release_all(all, 8);
    }
    struct { int64_t k[2], s[2], p[2]; int ceil, pad; } ap[] = {
      {{3, 3}, {2, 2}, {1, 1}, 1, 0},
      {{3, 3}, {2, 2}, {1, 1}, 1, 1},
      {{2, 3}, {1, 3}, {0, 1}, 0, 1},
    };
    for (int i = 0; i < 3; i++) {
      em_tensor *y, *dy, *gy, *dgy, *gx, *dgx;
      REQUIRE_OK(S, em_avg_pool2d(S, x, ap[i].k, ap[i].s, ap[i].p, ap[i].ceil, ap[i].pad, &y));
      REQUIRE_OK(S, em_avg_pool2d(S, dx, ap[i].k, ap[i].s, ap[i].p, ap[i].ceil, ap[i].pad, &dy));
      same(S, "avg_pool2d", y, dy, tol_of(dt));
      gy = rnd(S, y->sizes, 4, dt);
      dgy = on(S, gy, 0);
      REQUIRE_OK(S, em_avg_pool2d_backward(S, gy, x, ap[i].k, ap[i].s, ap[i].p, ap[i].ceil,
                                           ap[i].pad, &gx));
      REQUIRE_OK(S, em_avg_pool2d_backward(S, dgy, dx, ap[i].k, ap[i].s, ap[i].p, ap[i].ceil,
                                           ap[i].pad, &dgx));
      same(S, "avg_pool2d backward", gx, dgx, tol_of(dt));
      em_tensor *all[] = {y, dy, gy, dgy, gx, dgx};
      release_all(all, 6);
    }
    int64_t os[3][2] = {{4, 3}, {1, 1}, {9, 8}};
    for (int i = 0; i < 3; i++) {
      em_tensor *y, *dy, *gy, *dgy, *gx, *dgx;
      REQUIRE_OK(S, em_adaptive_avg_pool2d(S, x, os[i], &y));
      REQUIRE_OK(S, em_adaptive_avg_pool2d(S, dx, os[i], &dy));
      same(S, "adaptive_avg_pool2d", y, dy, tol_of(dt));
      gy = rnd(S, y->sizes, 4, dt);
      dgy = on(S, gy, 0);
      REQUIRE_OK(S, em_adaptive_avg_pool2d_backward(S, gy, x, &gx));
      REQUIRE_OK(S, em_adaptive_avg_pool2d_backward(S, dgy, dx, &dgx));
      same(S, "adaptive_avg_pool2d backward", gx, dgx, tol_of(dt));
      em_tensor *all[] = {y, dy, gy, dgy, gx, dgx};
      release_all(all, 6);
    }
    em_tensor_release(x);
    em_tensor_release(dx);
  }
}

static void test_max_pool_bad_index(em_state *S) {
  int64_t xs[4] = {1, 1, 4, 4}, k[2] = {2, 2}, p[2] = {0, 0}, dl[2] = {1, 1};
  em_tensor *x = rnd(S, xs, 4, EM_FLOAT32), *dx = on(S, x, 0), *y, *ind;
  REQUIRE(dx != NULL, "input");
  REQUIRE_OK(S, em_max_pool2d(S, dx, k, NULL, p, dl, 0, 0, &y, &ind));
  int64_t is[4] = {1, 1, 2, 2};
  int64_t bad_v[4] = {0, 5, 16, 3};
  em_tensor *bad = NULL, *dbad = NULL, *gx = NULL;
  REQUIRE_OK(S, em_from_data(S, is, 4, EM_INT64, bad_v, EM_INT64, &bad));
  dbad = on(S, bad, 0);
  CHECK_ERR(S, em_max_pool2d_backward(S, y, dx, dbad, 0, &gx), EM_ERR_INDEX,
            "max_pool2d_backward", "16", "out of range");
  /* channels last (the backend pools NHWC natively): the same check */
  int64_t xs2[4] = {1, 2, 4, 4}, is2[4] = {1, 2, 2, 2};
  int64_t bad2[8] = {0, 5, 3, 2, 1, 17, 4, 6};
  em_tensor *x2 = rnd(S, xs2, 4, EM_FLOAT32), *dx2 = on(S, x2, 0), *cx = NULL, *y2 = NULL;
  em_tensor *ind2 = NULL, *b2 = NULL, *db2 = NULL, *cb2 = NULL, *gx2 = NULL;
  REQUIRE_OK(S, em_to_channels_last(S, dx2, &cx));
  REQUIRE_OK(S, em_max_pool2d(S, cx, k, NULL, p, dl, 0, 0, &y2, &ind2));
  CHECK(em_tensor_is_channels_last(y2) && em_tensor_is_channels_last(ind2),
        "NHWC max_pool2d on cuda: NHWC output and indices");
  REQUIRE_OK(S, em_from_data(S, is2, 4, EM_INT64, bad2, EM_INT64, &b2));
  db2 = on(S, b2, 0);
  REQUIRE_OK(S, em_to_channels_last(S, db2, &cb2));
  CHECK_ERR(S, em_max_pool2d_backward(S, y2, cx, cb2, 0, &gx2), EM_ERR_INDEX,
            "max_pool2d_backward", "17", "out of range");
  REQUIRE_OK(S, em_max_pool2d_backward(S, y2, cx, ind2, 0, &gx2));
  CHECK(em_tensor_is_channels_last(gx2), "NHWC max_pool2d_backward: NHWC gradient");
  em_tensor *all[] = {x, dx, y, ind, bad, dbad, gx, x2, dx2, cx, y2, ind2, b2, db2, cb2, gx2};
  release_all(all, 16);
}

/* -- Batch norm ----------------------------------------------------------------------- */

static void bn_case(em_state *S, em_dtype dt, const int64_t *xs, int nd, int affine,
                    int running, int strided_running) {
  char what[96];
  snprintf(what, sizeof what, "batch_norm %s %dd affine %d running %d%s", em_dtype_name(dt),
           nd, affine, running, strided_running ? " strided" : "");
  int64_t C = xs[1], cs[1] = {C}, c2[1] = {2 * C}, st2[1] = {2};
  em_tensor *w = NULL, *b = NULL, *dw = NULL, *db = NULL;
  em_tensor *rm = NULL, *rv = NULL, *drm = NULL, *drv = NULL, *rbase[4] = {0};
  if (affine) {
    w = rnd(S, cs, 1, dt), b = rnd(S, cs, 1, dt);
    dw = on(S, w, 0), db = on(S, b, 0);
  }
  if (running) {
    if (strided_running) {   /* every other element of a (2C) tensor */
      for (int i = 0; i < 4; i++) em_full(S, c2, 1, i & 1 ? 1.0 : 0.0, dt, i < 2 ? EM_CPU : 0,
                                          &rbase[i]);
      em_as_strided(S, rbase[0], cs, st2, 1, 0, &rm);
      em_as_strided(S, rbase[1], cs, st2, 1, 1, &rv);
      em_as_strided(S, rbase[2], cs, st2, 1, 0, &drm);
      em_as_strided(S, rbase[3], cs, st2, 1, 1, &drv);
    } else {
      em_full(S, cs, 1, 0, dt, EM_CPU, &rm), em_full(S, cs, 1, 1, dt, EM_CPU, &rv);
      em_full(S, cs, 1, 0, dt, 0, &drm), em_full(S, cs, 1, 1, dt, 0, &drv);
    }
    if (running == 2) {      /* only the mean is tracked */
      em_tensor_release(rv), em_tensor_release(drv);
      rv = drv = NULL;
    }
  }
  for (int step = 0; step < 3; step++) {
    em_tensor *x = rnd(S, xs, nd, dt), *dx = on(S, x, 0);
    em_tensor *y, *m, *is, *dy, *dm, *dis;
    REQUIRE_OK(S, em_batch_norm(S, x, w, b, rm, rv, 1, 0.1, 1e-5, &y, &m, &is));
    REQUIRE_OK(S, em_batch_norm(S, dx, dw, db, drm, drv, 1, 0.1, 1e-5, &dy, &dm, &dis));
    same(S, what, y, dy, tol_of(dt) * 10);
    same(S, "batch_norm save_mean", m, dm, tol_of(dt));
    same(S, "batch_norm save_invstd", is, dis, tol_of(dt));
    if (rm) same(S, "batch_norm running_mean", rm, drm, tol_of(dt));
    if (rv) same(S, "batch_norm running_var", rv, drv, tol_of(dt));
    if (step == 2) {         /* backward, every gradient, then gx alone */
      em_tensor *gy = rnd(S, xs, nd, dt), *dgy = on(S, gy, 0);
      em_tensor *gx, *gw = NULL, *gb = NULL, *dgx, *dgw = NULL, *dgb = NULL, *gx2 = NULL;
      REQUIRE_OK(S, em_batch_norm_backward(S, gy, x, w, m, is, 1, &gx, affine ? &gw : NULL,
                                           affine ? &gb : NULL));
      REQUIRE_OK(S, em_batch_norm_backward(S, dgy, dx, dw, dm, dis, 1, &dgx,
                                           affine ? &dgw : NULL, affine ? &dgb : NULL));
      same(S, "batch_norm backward gx", gx, dgx, tol_of(dt) * 100);
      if (affine) {
        same(S, "batch_norm backward gw", gw, dgw, tol_of(dt) * 10);
        same(S, "batch_norm backward gb", gb, dgb, tol_of(dt) * 10);
      }
      if (CHECK_OK(S, em_batch_norm_backward(S, dgy, dx, dw, dm, dis, 1, &gx2, NULL, NULL)))
        same(S, "batch_norm backward gx alone", gx, gx2, tol_of(dt) * 100);
      em_tensor *all[] = {gy, dgy, gx, gw, gb, dgx, dgw, dgb, gx2};
      release_all(all, 9);
    }
    em_tensor *all[] = {x, dx, y, m, is, dy, dm, dis};
    release_all(all, 8);
  }
  if (running == 1) {        /* evaluation with the statistics gathered, and its backward */
    em_tensor *x = rnd(S, xs, nd, dt), *dx = on(S, x, 0);
    em_tensor *y, *m, *is, *dy, *dm, *dis;
    REQUIRE_OK(S, em_batch_norm(S, x, w, b, rm, rv, 0, 0.1, 1e-5, &y, &m, &is));
    REQUIRE_OK(S, em_batch_norm(S, dx, dw, db, drm, drv, 0, 0.1, 1e-5, &dy, &dm, &dis));
    same(S, "batch_norm eval", y, dy, tol_of(dt));
    /* eval's mean is the running mean as it is, but that running mean was moved by
    ** cuDNN on a GPU, whose update rounds differently from the CPU's (1 ulp in
    ** float32 on the H100): the float tolerance, not 0 */
    same(S, "batch_norm eval save_mean", m, dm, tol_of(dt));
    same(S, "batch_norm eval save_invstd", is, dis, tol_of(dt));
    em_tensor *gy = rnd(S, xs, nd, dt), *dgy = on(S, gy, 0);
    em_tensor *gx, *gw = NULL, *gb = NULL, *dgx, *dgw = NULL, *dgb = NULL;
    REQUIRE_OK(S, em_batch_norm_backward(S, gy, x, w, m, is, 0, &gx, affine ? &gw : NULL,
                                         affine ? &gb : NULL));
    REQUIRE_OK(S, em_batch_norm_backward(S, dgy, dx, dw, dm, dis, 0, &dgx,
                                         affine ? &dgw : NULL, affine ? &dgb : NULL));
    same(S, "batch_norm eval backward gx", gx, dgx, tol_of(dt));
    if (affine) {
      same(S, "batch_norm eval backward gw", gw, dgw, tol_of(dt) * 10);
      same(S, "batch_norm eval backward gb", gb, dgb, tol_of(dt) * 10);
    }
    em_tensor *all[] = {x, dx, y, m, is, dy, dm, dis, gy, dgy, gx, gw, gb, dgx, dgw, dgb};
    release_all(all, 16);
  }
  em_tensor *all[] = {w, b, dw, db, rm, rv, drm, drv};
  release_all(all, 8);
  release_all(rbase, 4);
}

static void test_batch_norm(em_state *S) {
  int64_t x4[4] = {4, 3, 5, 6}, x2[2] = {8, 5}, x3[3] = {2, 4, 7};
  em_dtype dts[2] = {EM_FLOAT32, EM_FLOAT64};
  for (int i = 0; i < 2; i++) {
    bn_case(S, dts[i], x4, 4, 1, 1, 0);
    bn_case(S, dts[i], x4, 4, 1, 1, 1);
    bn_case(S, dts[i], x2, 2, 1, 1, 0);
    bn_case(S, dts[i], x3, 3, 0, 0, 0);
    bn_case(S, dts[i], x3, 3, 0, 2, 0);
  }
}

/* -- The algorithm cache ---------------------------------------------------------------- */

static void test_algo_cache(em_state *S) {
  int64_t xs[4] = {2, 3, 13, 11}, ws[4] = {5, 3, 3, 3};
  int64_t s[2] = {1, 1}, p[2] = {1, 1}, d[2] = {1, 1};
  em_tensor *x = rnd(S, xs, 4, EM_FLOAT32), *w = rnd(S, ws, 4, EM_FLOAT32);
  em_tensor *dx = on(S, x, 0), *dw = on(S, w, 0), *y1 = NULL, *y2 = NULL, *gy = NULL;
  em_tensor *gx = NULL, *gw = NULL;
  REQUIRE(dx && dw, "inputs");
  emk_dnn_cache_stats a, b, c, e;
  emk_plan_cache_stats pa, pb;
  int plans = !emulated && emk_real_conv_plans;
  emk_algo_cache_stats(emk_ctx(S)->algos, &a);
  REQUIRE_OK(S, em_conv2d(S, dx, dw, NULL, s, p, d, 1, &y1));
  if (plans) plans = emk_real_conv_plans(emk_ctx(S)->rt, &pa) == 0;
  emk_algo_cache_stats(emk_ctx(S)->algos, &b);
  CHECK(b.misses == a.misses + 1 && b.hits == a.hits, "first call: a miss (%llu -> %llu "
        "misses, %llu -> %llu hits)", (unsigned long long)a.misses,
        (unsigned long long)b.misses, (unsigned long long)a.hits, (unsigned long long)b.hits);
  CHECK(b.entries == a.entries + 1, "one entry more");
  REQUIRE_OK(S, em_conv2d(S, dx, dw, NULL, s, p, d, 1, &y2));
  emk_algo_cache_stats(emk_ctx(S)->algos, &c);
  CHECK(c.hits == b.hits + 1 && c.misses == b.misses, "second call of the shape: a hit");
  if (plans) {              /* cuDNN's descriptors: built once per geometry */
    CHECK(emk_real_conv_plans(emk_ctx(S)->rt, &pb) == 0 && pb.hits == pa.hits + 1 &&
          pb.misses == pa.misses, "descriptor sets: %llu -> %llu hits, %llu -> %llu misses",
          (unsigned long long)pa.hits, (unsigned long long)pb.hits,
          (unsigned long long)pa.misses, (unsigned long long)pb.misses);
  }
  same(S, "the cached algorithm gives the same result", y1, y2, 0);
  /* backward: data and filter are two more keys, then hits */
  gy = on(S, y1, 0);
  REQUIRE_OK(S, em_conv2d_backward(S, gy, dx, dw, s, p, d, 1, &gx, &gw, NULL));
  em_tensor_release(gx), em_tensor_release(gw);
  REQUIRE_OK(S, em_conv2d_backward(S, gy, dx, dw, s, p, d, 1, &gx, &gw, NULL));
  emk_algo_cache_stats(emk_ctx(S)->algos, &e);
  CHECK(e.misses == c.misses + 2 && e.hits == c.hits + 2, "backward: 2 misses then 2 hits "
        "(%llu misses, %llu hits)", (unsigned long long)(e.misses - c.misses),
        (unsigned long long)(e.hits - c.hits));
  /* the same geometry channels last is a key of its own (cuDNN ranks it apart) */
  em_tensor *cx = NULL, *y3 = NULL;
  REQUIRE_OK(S, em_to_channels_last(S, dx, &cx));
  emk_dnn_cache_stats f, h;
  emk_algo_cache_stats(emk_ctx(S)->algos, &f);
  REQUIRE_OK(S, em_conv2d(S, cx, dw, NULL, s, p, d, 1, &y3));
  emk_algo_cache_stats(emk_ctx(S)->algos, &h);
  CHECK(h.misses == f.misses + 1 && h.hits == f.hits && em_tensor_is_channels_last(y3),
        "NHWC conv: a miss of its own and an NHWC output");
  em_tensor *y3c = NULL;        /* compared in NCHW order */
  REQUIRE_OK(S, em_contiguous(S, y3, &y3c));
  same(S, "NHWC conv gives the NCHW result", y1, y3c, 1e-5);
  em_tensor *all[] = {x, w, dx, dw, y1, y2, gy, gx, gw, cx, y3, y3c};
  release_all(all, 12);
}

/* The emulator's conv refuses a workspace smaller than its algorithm needs. */
static void test_emu_workspace_contract(em_state *S) {
  if (!emulated) return;
  emk_runtime *rt = emk_ctx(S)->rt;
  emk_conv_desc c;
  memset(&c, 0, sizeof c);
  c.dir = EMK_CONV_FWD, c.dtype = EM_FLOAT32;
  c.N = 2, c.C = 3, c.H = 8, c.W = 8, c.O = 4, c.kH = 3, c.kW = 3, c.OH = 6, c.OW = 6;
  c.sH = c.sW = c.dH = c.dW = c.G = 1;
  emk_conv_algo list[8];
  int n = 0;
  REQUIRE(rt->ops->conv_algos(rt, 0, &c, list, 8, &n) == EM_OK, "%s", rt->errmsg);
  CHECK(n == 3 && list[0].workspace > list[1].workspace && list[2].workspace == 0,
        "three made-up algorithms, best (largest workspace) first");
  CHECK(list[0].workspace == emk_emu_conv_workspace(&c, list[0].algo), "sizes agree");
  CHECK(n == 3 && list[0].math == EMK_MATH_FMA && list[1].math == EMK_MATH_FMA &&
        list[2].math == EMK_MATH_FMA, "float32 without TF32: FMA only");
  int dummy;
  em_status st = rt->ops->conv(rt, emk_ctx(S)->dev[0]->compute, &c, &list[0], &dummy, 4,
                               &dummy, &dummy, &dummy, NULL);
  CHECK(st == EM_ERR_ARG && strstr(rt->errmsg, "workspace"), "too small a workspace: %s",
        rt->errmsg);
  /* a tensor-core mode where TF32 is off is refused before anything runs */
  emk_conv_algo tc = {2, 0, EMK_MATH_TENSOR_OP};
  tc.workspace = emk_emu_conv_workspace(&c, 2);
  st = rt->ops->conv(rt, emk_ctx(S)->dev[0]->compute, &c, &tc, &dummy, tc.workspace, &dummy,
                     &dummy, &dummy, NULL);
  CHECK(st == EM_ERR_ARG && strstr(rt->errmsg, "math mode") && strstr(rt->errmsg, "float32"),
        "TENSOR_OP without TF32: %s", rt->errmsg);
  /* with TF32: the tensor-core variant first, four in all */
  c.allow_tf32 = 1;
  REQUIRE(rt->ops->conv_algos(rt, 0, &c, list, 8, &n) == EM_OK, "%s", rt->errmsg);
  CHECK(n == 4 && list[0].algo == 2 && list[0].math == EMK_MATH_TENSOR_OP &&
        list[1].algo == 2 && list[1].math == EMK_MATH_DEFAULT, "float32 with TF32: %d", n);
  c.allow_tf32 = 0, c.dtype = EM_FLOAT64;
  REQUIRE(rt->ops->conv_algos(rt, 0, &c, list, 8, &n) == EM_OK, "%s", rt->errmsg);
  CHECK(n == 4 && list[0].math == EMK_MATH_TENSOR_OP, "float64 keeps the modes offered");
}

/* The rule for math modes (dnn.h), the same for both runtimes. */
static void test_conv_math_rule(void *unused) {
  int use = -1;
  CHECK(!emk_conv_math(EM_FLOAT32, 0, EMK_MATH_TENSOR_OP, &use), "f32 no TF32: TENSOR_OP out");
  CHECK(emk_conv_math(EM_FLOAT32, 0, EMK_MATH_DEFAULT, &use) && use == EMK_MATH_FMA,
        "f32 no TF32: DEFAULT runs as FMA");
  CHECK(emk_conv_math(EM_FLOAT32, 0, EMK_MATH_FMA, &use) && use == EMK_MATH_FMA, "FMA stays");
  CHECK(emk_conv_math(EM_FLOAT32, 1, EMK_MATH_TENSOR_OP, &use) && use == EMK_MATH_TENSOR_OP,
        "f32 with TF32: TENSOR_OP");
  CHECK(emk_conv_math(EM_FLOAT32, 1, EMK_MATH_DEFAULT, &use) && use == EMK_MATH_DEFAULT,
        "f32 with TF32: DEFAULT");
  for (int t = 0; t < 2; t++) {
    CHECK(!emk_conv_math(EM_FLOAT32, t, EMK_MATH_TENSOR_OP_CONVERT, &use),
          "float32 is never rounded to float16 (TF32 %d)", t);
    CHECK(!emk_conv_math(EM_FLOAT64, t, EMK_MATH_TENSOR_OP_CONVERT, &use), "nor float64");
    CHECK(emk_conv_math(EM_FLOAT64, t, EMK_MATH_TENSOR_OP, &use) && use == EMK_MATH_TENSOR_OP,
          "float64's tensor-core path is exact float64");
    CHECK(!emk_conv_math(EM_FLOAT32, t, 7, &use), "an unknown mode is left out");
  }
  CHECK(emk_conv_query_math(EM_FLOAT32, 0) == EMK_MATH_FMA &&
        emk_conv_query_math(EM_FLOAT32, 1) == EMK_MATH_DEFAULT &&
        emk_conv_query_math(EM_FLOAT64, 0) == EMK_MATH_DEFAULT, "the modes asked in");
  (void)unused;
}

/* TF32 allowed: another key of the algorithm cache, and on the emulator the
** tensor-core variant reaches the runtime through the backend (which refuses a
** mode the descriptor does not allow): results as the CPU's within TF32's error. */
static void test_conv_tf32(em_state *S) {
  int64_t xs[4] = {2, 3, 9, 7}, ws[4] = {4, 3, 3, 3};
  int64_t s[2] = {1, 1}, p[2] = {1, 1}, d[2] = {1, 1};
  em_tensor *x = rnd(S, xs, 4, EM_FLOAT32), *w = rnd(S, ws, 4, EM_FLOAT32);
  em_tensor *dx = on(S, x, 0), *dw = on(S, w, 0), *y = NULL, *dy = NULL, *dy2 = NULL;
  REQUIRE(dx && dw, "inputs");
  REQUIRE_OK(S, em_conv2d(S, x, w, NULL, s, p, d, 1, &y));
  REQUIRE_OK(S, em_conv2d(S, dx, dw, NULL, s, p, d, 1, &dy));
  emk_dnn_cache_stats a, b;
  emk_algo_cache_stats(emk_ctx(S)->algos, &a);
  em_cuda_set_allow_tf32(S, 1);
  em_status st = em_conv2d(S, dx, dw, NULL, s, p, d, 1, &dy2);
  em_cuda_set_allow_tf32(S, 0);
  emk_algo_cache_stats(emk_ctx(S)->algos, &b);
  if (CHECK_OK(S, st)) {
    CHECK(b.misses == a.misses + 1, "TF32 is a key of its own");
    same(S, "conv2d with TF32", y, dy2, emulated ? tol_of(EM_FLOAT32) : 5e-3);
  }
  same(S, "conv2d without TF32", y, dy, tol_of(EM_FLOAT32));
  em_tensor *all[] = {x, w, dx, dw, y, dy, dy2};
  release_all(all, 7);
}

/* No room for the chosen algorithm's workspace: a clear error, then usable. */
static void test_workspace_oom(void) {
  if (!emulated) return;
  em_state *S2;
  setenv("EMBER_CUDA_EMULATE", "1:32", 1);
  if (!CHECK(em_open(&S2, NULL) == EM_OK && em_cuda_device_count(S2) == 1, "a 32 MiB device"))
    return;
  int64_t xs[4] = {16, 8, 32, 32}, ws[4] = {8, 8, 3, 3}, big[1] = {26 << 18};   /* 26 MiB */
  int64_t s[2] = {1, 1}, p[2] = {1, 1}, d[2] = {1, 1};
  em_tensor *x = rnd(S2, xs, 4, EM_FLOAT32), *w = rnd(S2, ws, 4, EM_FLOAT32);
  em_tensor *dx = on(S2, x, 0), *dw = on(S2, w, 0), *y = NULL, *fill = NULL;
  if (CHECK(dx && dw, "inputs") && CHECK_OK(S2, em_conv2d(S2, dx, dw, NULL, s, p, d, 1, &y))) {
    em_tensor_release(y);
    y = NULL;
    if (CHECK_OK(S2, em_empty(S2, big, 1, EM_FLOAT32, 0, &fill))) {
      CHECK_ERR(S2, em_conv2d(S2, dx, dw, NULL, s, p, d, 1, &y), EM_ERR_NOMEM, "conv2d",
                "cuda:0", "out of memory", "workspace", "x [16,8,32,32]", "float32");
      em_tensor_release(fill);
      CHECK_OK(S2, em_conv2d(S2, dx, dw, NULL, s, p, d, 1, &y));   /* usable after */
    }
  }
  em_tensor *all[] = {x, w, dx, dw, y};
  release_all(all, 5);
  em_close(S2);
  setenv("EMBER_CUDA_EMULATE", "2:256", 1);
}

/* cuDNN's descriptors from our geometry, without a GPU: its output dims are ours. */
static void test_cudnn_descriptors(void) {
  if (!emk_dnn_describe_check) {
    check_skip("cuDNN descriptors: built without the CUDA headers");
    return;
  }
  for (size_t i = 0; i < sizeof conv_cases / sizeof conv_cases[0]; i++) {
    const conv_case *k = &conv_cases[i];
    emk_conv_desc c;
    memset(&c, 0, sizeof c);
    c.dir = EMK_CONV_FWD, c.dtype = i & 1 ? EM_FLOAT64 : EM_FLOAT32;
    c.N = k->N, c.C = k->C, c.H = k->H, c.W = k->W, c.O = k->O, c.kH = k->kH, c.kW = k->kW;
    c.sH = k->s[0], c.sW = k->s[1], c.pH = k->p[0], c.pW = k->p[1];
    c.dH = k->d[0], c.dW = k->d[1], c.G = k->G;
    c.OH = (c.H + 2 * c.pH - c.dH * (c.kH - 1) - 1) / c.sH + 1;
    c.OW = (c.W + 2 * c.pW - c.dW * (c.kW - 1) - 1) / c.sW + 1;
    /* NCHW, then NHWC descriptors (channels last; the half types too) */
    static const em_dtype nhwc_dt[4] = {EM_FLOAT32, EM_FLOAT64, EM_FLOAT16, EM_BFLOAT16};
    for (int nhwc = 0; nhwc < 2; nhwc++) {
      c.nhwc = nhwc;
      if (nhwc) c.dtype = nhwc_dt[i % 4];
      int dims[4] = {0};
      char err[512];
      em_status st = emk_dnn_describe_check(&c, dims, err, sizeof err);
      if (st == EM_ERR_UNSUPPORTED) {
        printf("  (no cuDNN: %s)\n", err);
        return;
      }
      CHECK(st == EM_OK && dims[0] == c.N && dims[1] == c.O && dims[2] == c.OH &&
            dims[3] == c.OW, "case %zu%s: cuDNN says %d %d %d %d, we say %lld %lld %lld %lld "
            "(%s)", i, nhwc ? " NHWC" : "", dims[0], dims[1], dims[2], dims[3], (long long)c.N,
            (long long)c.O, (long long)c.OH, (long long)c.OW, st ? err : "ok");
    }
  }
  /* a geometry cuDNN refuses is an error with its words, not a crash */
  emk_conv_desc c;
  memset(&c, 0, sizeof c);
  c.dtype = EM_FLOAT32, c.N = 1, c.C = 3, c.H = 4, c.W = 4, c.O = 4, c.kH = 3, c.kW = 3;
  c.sH = c.sW = 1, c.dH = c.dW = 1, c.G = 2;      /* 3 channels in 2 groups */
  int dims[4];
  char err[512] = "";
  em_status st = emk_dnn_describe_check(&c, dims, err, sizeof err);
  CHECK(st != EM_OK && strstr(err, "cuDNN"), "bad groups refused: %s", err);
  /* the math mode conv sets on the descriptor is the one cuDNN holds */
  if (!emk_dnn_math_check) return;
  c.C = 4, c.G = 2, c.OH = 2, c.OW = 2;
  int modes[3] = {EMK_MATH_FMA, EMK_MATH_TENSOR_OP, EMK_MATH_DEFAULT};
  for (int i = 0; i < 3; i++) {
    int got = -1;
    st = emk_dnn_math_check(&c, modes[i], &got, err, sizeof err);
    CHECK(st == EM_OK && got == modes[i], "math mode %d: cuDNN holds %d (%s)", modes[i], got,
          st ? err : "ok");
  }
}

/* cuDNN's Find trial (dnn_real.c), what can be checked without a GPU: the operand
** bytes it allocates, the switch, and the three Find functions in the loaded cuDNN
** (a misspelt name would leave conv_algos on the heuristics silently). */
static void test_cudnn_find(void) {
  if (!emk_dnn_find_bytes || !emk_dnn_find_on || !emk_dnn_find_symbols) {
    check_skip("cuDNN Find: built without the CUDA headers");
    return;
  }
  emk_conv_desc c;
  memset(&c, 0, sizeof c);
  c.N = 3, c.C = 6, c.H = 7, c.W = 5, c.O = 4, c.kH = 3, c.kW = 2, c.OH = 5, c.OW = 4, c.G = 2;
  c.sH = c.sW = c.dH = c.dW = 1;
  static const em_dtype dts[4] = {EM_FLOAT32, EM_FLOAT64, EM_FLOAT16, EM_BFLOAT16};
  static const size_t el[4] = {4, 8, 2, 2};
  for (int i = 0; i < 4; i++) {
    for (int nhwc = 0; nhwc < 2; nhwc++) {
      size_t b[3] = {1, 1, 1};
      c.dtype = dts[i], c.nhwc = nhwc;
      int ok = emk_dnn_find_bytes(&c, b);
      /* x 3*6*7*5, w 4*(6/2)*3*2, y 3*4*5*4 elements, whatever the layout */
      CHECK(ok == 1 && b[0] == 630 * el[i] && b[1] == 72 * el[i] && b[2] == 240 * el[i],
            "%s%s: %d, %zu %zu %zu bytes", em_dtype_name(dts[i]), nhwc ? " NHWC" : "", ok,
            b[0], b[1], b[2]);
    }
  }
  /* refused: groups not dividing C, a size below 1, an integer dtype, overflow */
  emk_conv_desc bad[4];
  for (int i = 0; i < 4; i++) bad[i] = c, bad[i].dtype = EM_FLOAT32;
  bad[0].G = 4;
  bad[1].OW = 0;
  bad[2].dtype = EM_INT32;
  bad[3].N = bad[3].H = bad[3].W = (int64_t)1 << 40;
  for (int i = 0; i < 4; i++) {
    size_t b[3] = {1, 1, 1};
    int ok = emk_dnn_find_bytes(&bad[i], b);
    CHECK(ok == 0 && !b[0] && !b[1] && !b[2], "bad case %d refused (%d: %zu %zu %zu)", i, ok,
          b[0], b[1], b[2]);
  }
  /* the switch: on unless EMBER_CUDNN_FIND says 0 / off / false / no */
  const char *was = getenv("EMBER_CUDNN_FIND");
  char keep[64] = "";
  if (was) snprintf(keep, sizeof keep, "%s", was);
  static const struct { const char *v; int on; } sw[] = {
      {NULL, 1}, {"1", 1}, {"", 1}, {"yes", 1}, {"0", 0}, {"off", 0}, {"false", 0}, {"no", 0}};
  for (size_t i = 0; i < sizeof sw / sizeof sw[0]; i++) {
    if (sw[i].v) setenv("EMBER_CUDNN_FIND", sw[i].v, 1);
    else unsetenv("EMBER_CUDNN_FIND");
    CHECK(emk_dnn_find_on() == sw[i].on, "EMBER_CUDNN_FIND=%s: %d", sw[i].v ? sw[i].v : "(unset)",
          emk_dnn_find_on());
  }
  if (was) setenv("EMBER_CUDNN_FIND", keep, 1);
  else unsetenv("EMBER_CUDNN_FIND");
  /* the loaded cuDNN 9 has all three */
  int count = -1;
  char err[512] = "";
  em_status st = emk_dnn_find_symbols(&count, err, sizeof err);
  if (st == EM_ERR_UNSUPPORTED) {
    printf("  (no cuDNN: %s)\n", err);
    return;
  }
  CHECK(st == EM_OK && count == 3, "Find functions in the loaded cuDNN: %d (%s)", count,
        st ? err : "ok");
}

int main(void) {
  em_state *S;
  if (cuda_check_open(&S, "2:256")) return 1;
  emk_device_props props;
  if (emk_ctx(S)->rt->ops->device_props(emk_ctx(S)->rt, 0, &props) == EM_OK)
    emulated = props.emulated;
  RUN(test_conv2d, S);
  RUN(test_pooling, S);
  RUN(test_max_pool_bad_index, S);
  RUN(test_batch_norm, S);
  RUN(test_algo_cache, S);
  RUN(test_conv_math_rule, NULL);
  RUN(test_conv_tf32, S);
  RUN(test_emu_workspace_contract, S);
  RUN(test_workspace_oom);
  RUN(test_cudnn_descriptors);
  RUN(test_cudnn_find);
  em_close(S);
  return check_done();
}

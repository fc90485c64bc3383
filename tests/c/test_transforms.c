/*
** test_transforms.c -- the image transforms of core/data/transforms*.c:
** to_float, normalize, center_crop and resize against torchvision 0.14 values
** from tests/fixtures/transforms.txt (gen_transforms.py), each with contiguous
** and strided inputs (transposed, narrowed, channels-last storage); random_crop,
** hflip and cutout checked against their definitions (a padded window at some
** valid offset, a mirror, one clipped zeroed square) and for determinism per
** (seed, index); compose against torchvision's pipeline and against running its
** children on one stream; custom transforms (errors, copies of tensors from
** another state, release); and the error messages.
**
** Uses the internal data.h to run transforms as a loader worker does (a
** context, a random stream) and to see which state owns a tensor's storage.
*/
#include "check.h"
#include "data/data.h"

#include "fixtures.h"

/* -- Inputs in several layouts -----------------------------------------------------
** mode 0: contiguous; 1: the last two dims transposed in memory; 2: a window
** narrowed out of a bigger tensor (offset, row stride > width); 3: channels-last
** storage, (H, W, C) permuted to (C, H, W) (as mode 1 for 2-D images). */
enum { NMODES = 4 };
static const char *MODE_NAME[NMODES] = {"contiguous", "transposed", "narrowed",
                                        "channels-last"};

static em_tensor *in_layout(em_state *S, em_tensor *t, int mode) {
  int nd = em_tensor_ndim(t);
  const int64_t *sz = em_tensor_sizes(t);
  em_dtype dt = em_tensor_dtype(t);
  em_tensor *p = NULL, *v = NULL;
  int64_t ps[8];
  if (mode == 0) { em_tensor_retain(t); return t; }
  if (mode == 1 || (mode == 3 && (nd != 3 || sz[0] == 1))) {
    memcpy(ps, sz, sizeof(int64_t) * nd);
    ps[nd - 1] = sz[nd - 2];
    ps[nd - 2] = sz[nd - 1];
    if (em_empty(S, ps, nd, dt, EM_CPU, &p) || em_transpose(S, p, nd - 2, nd - 1, &v)) v = NULL;
  } else if (mode == 2) {
    for (int d = 0; d < nd; d++) ps[d] = sz[d] + 3;
    if (em_empty(S, ps, nd, dt, EM_CPU, &p)) return NULL;
    em_fill_(S, p, 77);
    em_tensor *cur = p;
    em_tensor_retain(cur);
    for (int d = 0; d < nd; d++) {
      em_tensor *n = NULL;
      em_narrow(S, cur, d, 1 + (d & 1), sz[d], &n);
      em_tensor_release(cur);
      cur = n;
      if (!cur) break;
    }
    v = cur;
  } else {
    int64_t hwc[3] = {sz[1], sz[2], sz[0]};
    int perm[3] = {2, 0, 1};
    if (em_empty(S, hwc, 3, dt, EM_CPU, &p) || em_permute(S, p, perm, 3, &v)) v = NULL;
  }
  em_tensor_release(p);
  if (v && em_copy_(S, v, t)) { em_tensor_release(v); v = NULL; }
  if (v && em_tensor_is_contiguous(v)) printf("  test bug: layout %d is contiguous\n", mode);
  return v;
}

static em_tensor *mk(em_state *S, const fx_arr *a, em_dtype dt) {
  em_tensor *t = NULL;
  if (a && em_from_data(S, a->sizes, a->ndim, dt, a->v, EM_FLOAT64, &t)) return NULL;
  return t;
}

/* Runs t on a sample whose field 0 is x (a new reference is handed over);
** *y is the resulting field 0, or NULL on failure. */
static em_status run1(em_state *S, em_transform *t, em_tensor *x, uint64_t seed,
                      int64_t index, em_tensor **y) {
  em_tensor *f[1] = {x};
  em_tensor_retain(x);
  em_status st = em_transform_apply(S, t, f, 1, seed, index);
  if (st) {
    em_tensor_release(f[0]);
    *y = NULL;
    return st;
  }
  *y = f[0];
  return EM_OK;
}

#define SAME(t, a, tol, ...) do { \
    char why_[160], what_[96]; const fx_arr *a_ = (a); \
    snprintf(what_, sizeof what_, __VA_ARGS__); \
    CHECK(a_ && t_values((t), a_->v, a_->n, (tol), why_, sizeof why_), "%s: %s", what_, why_); \
  } while (0)

/* Two tensors hold the same shape and values (exactly). */
static int same_values(const em_tensor *a, const em_tensor *b) {
  if (!a || !b || em_tensor_ndim(a) != em_tensor_ndim(b)) return 0;
  for (int d = 0; d < em_tensor_ndim(a); d++)
    if (em_tensor_size(a, d) != em_tensor_size(b, d)) return 0;
  for (int64_t i = 0; i < em_tensor_numel(a); i++)
    if (t_get(a, i) != t_get(b, i)) return 0;
  return 1;
}

/* A float32 or uint8 (C, H, W) image with values 1 .. C*H*W (mod 250 + 1 for uint8). */
static em_tensor *ramp(em_state *S, int64_t C, int64_t H, int64_t W, em_dtype dt) {
  int64_t n = C * H * W;
  double *v = malloc(sizeof(double) * n);
  for (int64_t i = 0; i < n; i++) v[i] = dt == EM_UINT8 ? (double)(i % 250 + 1) : (double)(i + 1);
  em_tensor *t = NULL;
  em_from_data(S, (int64_t[]){C, H, W}, 3, dt, v, EM_FLOAT64, &t);
  free(v);
  return t;
}

/* -- to_float ---------------------------------------------------------------------- */
static void test_to_float(em_state *S) {
  em_transform *t;
  REQUIRE_OK(S, em_transform_to_float(S, &t));
  CHECK(!strcmp(em_transform_name(t), "to_float"), "name %s", em_transform_name(t));
  em_tensor *x = mk(S, get("tofloat.x", 0), EM_UINT8);
  REQUIRE(x, "fixture");
  for (int mode = 0; mode < NMODES; mode++) {
    em_tensor *xv = in_layout(S, x, mode), *y;
    CHECK_OK(S, run1(S, t, xv, 0, 0, &y));
    CHECK_DTYPE(y, EM_FLOAT32);
    CHECK(y && em_tensor_is_contiguous(y), "contiguous");
    SAME(y, get("tofloat.y", 0), 0, "uint8 %s", MODE_NAME[mode]);
    em_tensor_release(xv);
    em_tensor_release(y);
  }
  em_tensor_release(x);
  /* other dtypes keep their values */
  em_tensor *xi, *xd, *y;
  REQUIRE_OK(S, t_make(S, &xi, EM_INT32, SHP(2, 3), V(-3, 0, 1, 255, 300, 70000)));
  CHECK_OK(S, run1(S, t, xi, 0, 0, &y));
  CHECK_DTYPE(y, EM_FLOAT32);
  CHECK_VALS(y, 0, V(-3, 0, 1, 255, 300, 70000));
  em_tensor_release(y);
  REQUIRE_OK(S, t_make(S, &xd, EM_FLOAT64, SHP(1, 2, 2), V(0.5, -2.25, 1e10, 3)));
  CHECK_OK(S, run1(S, t, xd, 0, 0, &y));
  CHECK_DTYPE(y, EM_FLOAT32);
  CHECK_VALS(y, 0, V(0.5, -2.25, 1e10, 3));
  /* float32 contiguous input is already what to_float makes */
  em_tensor *y2;
  CHECK_OK(S, run1(S, t, y, 0, 0, &y2));
  CHECK(y2 == y, "float32 contiguous kept as is");
  em_tensor_release(y2);
  em_tensor_release(y);
  em_tensor_release(xi);
  em_tensor_release(xd);
  em_transform_release(t);
}

/* -- normalize --------------------------------------------------------------------- */
static void test_normalize(em_state *S) {
  for (int i = 0; i < 4; i++) {
    const fx_arr *p = get("norm%d.p", i), *xa = get("norm%d.x", i);
    REQUIRE(p && xa, "fixture");
    int n = (int)(p->n / 2);
    em_transform *t;
    REQUIRE_OK(S, em_transform_normalize(S, p->v, p->v + n, n, &t));
    for (int k = 0; k < NMODES * 2; k++) {
      em_dtype dt = k < NMODES ? EM_FLOAT32 : EM_FLOAT64;
      em_tensor *x = mk(S, xa, dt), *xv = in_layout(S, x, k % NMODES), *y;
      CHECK_OK(S, run1(S, t, xv, 0, 0, &y));
      CHECK_DTYPE(y, dt);
      /* float32 exactly as torchvision computes it; float64 from the same inputs */
      SAME(y, get("norm%d.y", i), dt == EM_FLOAT32 ? 0 : 1e-6, "case %d %s %s", i,
           em_dtype_name(dt), MODE_NAME[k % NMODES]);
      em_tensor_release(x);
      em_tensor_release(xv);
      em_tensor_release(y);
    }
    em_transform_release(t);
  }
  /* (H, W) images have one channel */
  em_transform *t;
  REQUIRE_OK(S, em_transform_normalize(S, (double[]){1}, (double[]){2}, 1, &t));
  em_tensor *x, *y;
  REQUIRE_OK(S, t_make(S, &x, EM_FLOAT32, SHP(2, 2), V(1, 3, -1, 0)));
  CHECK_OK(S, run1(S, t, x, 0, 0, &y));
  CHECK_VALS(y, 0, V(0, 1, -1, -0.5));
  em_tensor_release(y);
  em_tensor_release(x);
  em_transform_release(t);
  /* errors */
  REQUIRE_OK(S, em_transform_normalize(S, (double[]){.1, .2, .3}, (double[]){1, 1, 1}, 3, &t));
  REQUIRE_OK(S, t_make(S, &x, EM_FLOAT32, SHP(1, 2, 2), V(1, 2, 3, 4)));
  CHECK_ERR(S, run1(S, t, x, 0, 0, &y), EM_ERR_SHAPE, "normalize", "3 means",
            "1 channel", "[1,2,2]");
  em_tensor_release(x);
  REQUIRE_OK(S, t_make(S, &x, EM_UINT8, SHP(3, 1, 1), V(1, 2, 3)));
  CHECK_ERR(S, run1(S, t, x, 0, 0, &y), EM_ERR_DTYPE, "normalize", "uint8", "to_float");
  em_tensor_release(x);
  /* a (B, C, H, W) batch is normalized image by image */
  REQUIRE_OK(S, t_make(S, &x, EM_FLOAT32, SHP(2, 3, 1, 1), V(1, 2, 3, 4, 5, 6)));
  if (CHECK_OK(S, run1(S, t, x, 0, 0, &y))) {
    static const double want[6] = {0.9, 1.8, 2.7, 3.9, 4.8, 5.7};
    for (int i = 0; i < 6; i++) CHECK_CLOSE(t_get(y, i), want[i], 1e-6);
    em_tensor_release(y);
  }
  em_tensor_release(x);
  REQUIRE_OK(S, em_full(S, SHP(1, 1, 3, 1, 1), 1, EM_FLOAT32, EM_CPU, &x));
  CHECK_ERR(S, run1(S, t, x, 0, 0, &y), EM_ERR_SHAPE, "normalize", "(B, C, H, W)", "[1,1,3,1,1]");
  em_tensor_release(x);
  em_transform_release(t);
  CHECK_ERR(S, em_transform_normalize(S, (double[]){0, 0}, (double[]){1, 0}, 2, &t),
            EM_ERR_ARG, "normalize", "std[2] = 0");
  CHECK(t == NULL, "out cleared");
  CHECK_ERR(S, em_transform_normalize(S, (double[]){0}, (double[]){1}, 0, &t), EM_ERR_ARG,
            "normalize");
}

/* -- center_crop ------------------------------------------------------------------- */
static void test_center_crop(em_state *S) {
  em_tensor *x = mk(S, get("cc.x", 0), EM_FLOAT32);
  REQUIRE(x, "fixture");
  for (int i = 0; i < 13; i++) {
    const fx_arr *p = get("cc%d.p", i), *want = get("cc%d.y", i);
    REQUIRE(p && want, "fixture");
    em_transform *t;
    REQUIRE_OK(S, em_transform_center_crop(S, (int64_t)p->v[0], (int64_t)p->v[1], &t));
    for (int k = 0; k < NMODES * 2; k++) {
      em_dtype dt = k < NMODES ? EM_FLOAT32 : EM_UINT8;   /* values 1..84 fit */
      em_tensor *xd = NULL, *y;
      em_to(S, x, dt, EM_CPU, &xd);
      em_tensor *xv = in_layout(S, xd, k % NMODES);
      CHECK_OK(S, run1(S, t, xv, 0, 0, &y));
      CHECK_SHAPE(y, want->sizes, want->ndim);
      CHECK_DTYPE(y, dt);
      SAME(y, want, 0, "crop %gx%g %s %s", p->v[0], p->v[1], em_dtype_name(dt),
           MODE_NAME[k % NMODES]);
      em_tensor_release(xd);
      em_tensor_release(xv);
      em_tensor_release(y);
    }
    /* a (H, W) image: channel 0 of the same */
    em_tensor *x2, *y, *want2;
    em_select(S, x, 0, 0, &x2);
    CHECK_OK(S, run1(S, t, x2, 0, 0, &y));
    em_tensor *w = mk(S, want, EM_FLOAT32);
    em_select(S, w, 0, 0, &want2);
    CHECK(same_values(y, want2), "crop %gx%g of a 2-D image", p->v[0], p->v[1]);
    em_tensor_release(x2);
    em_tensor_release(y);
    em_tensor_release(w);
    em_tensor_release(want2);
    em_transform_release(t);
  }
  em_tensor_release(x);
}

/* -- resize ------------------------------------------------------------------------ */
static void test_resize(em_state *S) {
  for (int i = 0; i < 8; i++) {
    const fx_arr *p = get("rs%d.p", i), *xa = get("rs%d.x", i);
    REQUIRE(p && xa, "fixture");
    em_transform *t;
    REQUIRE_OK(S, em_transform_resize(S, (int64_t)p->v[0], (int64_t)p->v[1], &t));
    for (int k = 0; k < NMODES * 2; k++) {
      em_dtype dt = k < NMODES ? EM_FLOAT32 : EM_FLOAT64;
      em_tensor *x = mk(S, xa, dt), *xv = in_layout(S, x, k % NMODES), *y;
      CHECK_OK(S, run1(S, t, xv, 0, 0, &y));
      CHECK_DTYPE(y, dt);
      const fx_arr *want = get(dt == EM_FLOAT32 ? "rs%d.y" : "rs%d.yd", i);
      CHECK_SHAPE(y, want->sizes, want->ndim);
      /* bit for bit, but for one-channel images (PyTorch's other path) */
      SAME(y, want, xa->sizes[0] == 1 ? 2e-6 : 0, "resize case %d %s %s", i,
           em_dtype_name(dt), MODE_NAME[k % NMODES]);
      em_tensor_release(x);
      em_tensor_release(xv);
      em_tensor_release(y);
    }
    em_transform_release(t);
  }
  /* uint8: torchvision's rounded result, exactly; for one-channel images (where
  ** PyTorch's float results may differ in the last bit) a value within 1e-3 of
  ** a .5 tie may round the other way, nothing else. */
  int ties = 0;
  for (int i = 0; i < 5; i++) {
    const fx_arr *p = get("rsu%d.p", i), *xa = get("rsu%d.x", i), *want = get("rsu%d.y", i),
                 *f = get("rsu%d.f", i);
    REQUIRE(p && xa && want && f, "fixture");
    em_transform *t;
    REQUIRE_OK(S, em_transform_resize(S, (int64_t)p->v[0], (int64_t)p->v[1], &t));
    em_tensor *x = mk(S, xa, EM_UINT8);
    for (int mode = 0; mode < NMODES; mode++) {
      em_tensor *xv = in_layout(S, x, mode), *y;
      CHECK_OK(S, run1(S, t, xv, 0, 0, &y));
      CHECK_DTYPE(y, EM_UINT8);
      CHECK_SHAPE(y, want->sizes, want->ndim);
      int bad = 0;
      int64_t first = -1;
      for (int64_t j = 0; y && j < want->n && j < em_tensor_numel(y); j++) {
        double g = t_get(y, j), w = want->v[j];
        if (g == w) continue;
        double fr = f->v[j] - floor(f->v[j]);
        if (xa->sizes[0] == 1 && fabs(g - w) == 1 && fabs(fr - 0.5) < 1e-3) {
          ties++;
          continue;
        }
        if (first < 0) first = j;
        bad++;
      }
      CHECK(bad == 0, "uint8 case %d %s: %d values differ, first at %lld", i,
            MODE_NAME[mode], bad, (long long)first);
      em_tensor_release(xv);
      em_tensor_release(y);
    }
    em_tensor_release(x);
    em_transform_release(t);
  }
  printf("  (uint8 resize: %d values rounded the other way at .5 ties)\n", ties);
  /* a (H, W) image is resized like a one-channel one */
  em_transform *t;
  REQUIRE_OK(S, em_transform_resize(S, 3, 17, &t));
  em_tensor *x3 = mk(S, get("rs3.x", 0), EM_FLOAT32), *x2, *y;
  REQUIRE(x3, "fixture");
  em_select(S, x3, 0, 0, &x2);
  CHECK_OK(S, run1(S, t, x2, 0, 0, &y));
  CHECK_SHAPE(y, SHP(3, 17));
  SAME(y, get("rs3.y", 0), 2e-6, "2-D image");
  em_tensor_release(x3);
  em_tensor_release(x2);
  em_tensor_release(y);
  /* errors */
  REQUIRE_OK(S, t_make(S, &x2, EM_INT32, SHP(1, 2, 2), V(1, 2, 3, 4)));
  CHECK_ERR(S, run1(S, t, x2, 0, 0, &y), EM_ERR_DTYPE, "resize", "int32", "[1,2,2]");
  em_tensor_release(x2);
  em_transform_release(t);
  CHECK_ERR(S, em_transform_resize(S, 0, 5, &t), EM_ERR_ARG, "resize", "0x5");
}

/* -- hflip ------------------------------------------------------------------------- */
static void test_hflip(em_state *S) {
  em_transform *t1, *t0, *th;
  REQUIRE_OK(S, em_transform_hflip(S, 1, &t1));
  REQUIRE_OK(S, em_transform_hflip(S, 0, &t0));
  REQUIRE_OK(S, em_transform_hflip(S, 0.5, &th));
  em_dtype dts[3] = {EM_UINT8, EM_FLOAT32, EM_FLOAT64};
  for (int k = 0; k < 3 * NMODES; k++) {
    em_tensor *x = ramp(S, 2, 3, 5, dts[k / NMODES]), *xv = in_layout(S, x, k % NMODES), *y;
    CHECK_OK(S, run1(S, t1, xv, 1, 2, &y));
    int ok = y && em_tensor_is_contiguous(y);
    for (int64_t i = 0; ok && i < 30; i++)
      ok = t_get(y, i) == t_get(x, i - i % 5 + 4 - i % 5);
    CHECK(ok, "p = 1 mirrors the rows (%s %s)", em_dtype_name(dts[k / NMODES]),
          MODE_NAME[k % NMODES]);
    em_tensor_release(y);
    CHECK_OK(S, run1(S, t0, xv, 1, 2, &y));
    CHECK(same_values(y, x), "p = 0 keeps the image");
    em_tensor_release(y);
    em_tensor_release(x);
    em_tensor_release(xv);
  }
  /* p = 0.5: both outcomes occur; the same (seed, index) gives the same one */
  em_tensor *x = ramp(S, 1, 2, 3, EM_FLOAT32), *y, *y2;
  int flips = 0, same = 1;
  for (int64_t i = 0; i < 200; i++) {
    run1(S, th, x, 9, i, &y);
    run1(S, th, x, 9, i, &y2);
    if (y && t_get(y, 0) == 3) flips++;
    same &= same_values(y, y2);
    em_tensor_release(y);
    em_tensor_release(y2);
  }
  CHECK(flips > 70 && flips < 130, "%d of 200 flipped", flips);
  CHECK(same, "same (seed, index), same outcome");
  /* one draw is taken whether or not the image flips: a palindromic image
  ** goes through hflip(1) + random_crop and hflip(0) + random_crop alike */
  em_tensor *pal;
  REQUIRE_OK(S, t_make(S, &pal, EM_FLOAT32, SHP(4, 5), V(1, 2, 3, 2, 1, 4, 5, 6, 5, 4, 7, 8,
                                                         9, 8, 7, 1, 3, 5, 3, 1)));
  em_transform *rc, *ca, *cb;
  REQUIRE_OK(S, em_transform_random_crop(S, 3, 3, 1, &rc));
  REQUIRE_OK(S, em_transform_compose(S, (em_transform *[]){t1, rc}, 2, &ca));
  REQUIRE_OK(S, em_transform_compose(S, (em_transform *[]){t0, rc}, 2, &cb));
  int eq = 1;
  for (int64_t i = 0; i < 50; i++) {
    run1(S, ca, pal, 5, i, &y);
    run1(S, cb, pal, 5, i, &y2);
    eq &= same_values(y, y2);
    em_tensor_release(y);
    em_tensor_release(y2);
  }
  CHECK(eq, "the draw after hflip does not depend on its outcome");
  em_tensor_release(pal);
  em_transform_release(rc);
  em_transform_release(ca);
  em_transform_release(cb);
  em_tensor_release(x);
  em_transform_release(th);
  CHECK_ERR(S, em_transform_hflip(S, 1.5, &th), EM_ERR_ARG, "hflip", "1.5");
  em_transform_release(t1);
  em_transform_release(t0);
}

/* -- random_crop ------------------------------------------------------------------- */

/* Is y the h x w window at (top, left) of x zero-padded by p? x is (C, H, W). */
static int is_window(const em_tensor *y, const em_tensor *x, int64_t p, int64_t top,
                     int64_t left) {
  int64_t C = em_tensor_size(x, 0), H = em_tensor_size(x, 1), W = em_tensor_size(x, 2);
  int64_t h = em_tensor_size(y, 1), w = em_tensor_size(y, 2);
  for (int64_t c = 0; c < C; c++)
    for (int64_t i = 0; i < h; i++)
      for (int64_t j = 0; j < w; j++) {
        int64_t sy = top + i - p, sx = left + j - p;
        double want = sy < 0 || sy >= H || sx < 0 || sx >= W ? 0 : t_get(x, (c * H + sy) * W + sx);
        if (t_get(y, (c * h + i) * w + j) != want) return 0;
      }
  return 1;
}

static void test_random_crop(em_state *S) {
  const int64_t C = 3, H = 6, W = 5, h = 6, w = 6, p = 2;   /* padded 10 x 9 */
  em_transform *t;
  REQUIRE_OK(S, em_transform_random_crop(S, h, w, p, &t));
  em_dtype dts[3] = {EM_FLOAT32, EM_UINT8, EM_FLOAT64};
  for (int k = 0; k < 3; k++) {
    em_tensor *x = ramp(S, C, H, W, dts[k]);
    int seen[5][4] = {{0}};
    int found_all = 1, det = 1, layouts = 1, distinct = 0;
    for (int64_t i = 0; i < 200; i++) {
      em_tensor *y, *y2;
      if (run1(S, t, x, 11, i, &y)) { found_all = 0; break; }
      int found = 0;
      for (int64_t a = 0; a <= 10 - h && !found; a++)
        for (int64_t b = 0; b <= 9 - w && !found; b++)
          if (is_window(y, x, p, a, b)) { found = 1; distinct += !seen[a][b]++; }
      found_all &= found && em_tensor_size(y, 0) == C && em_tensor_is_contiguous(y);
      run1(S, t, x, 11, i, &y2);
      det &= same_values(y, y2);
      em_tensor_release(y2);
      if (i < 8)
        for (int mode = 1; mode < NMODES; mode++) {
          em_tensor *xv = in_layout(S, x, mode);
          run1(S, t, xv, 11, i, &y2);
          layouts &= same_values(y, y2);
          em_tensor_release(y2);
          em_tensor_release(xv);
        }
      em_tensor_release(y);
    }
    CHECK(found_all, "every crop is a window of the padded image (%s)", em_dtype_name(dts[k]));
    CHECK(det, "same (seed, index), same crop");
    CHECK(layouts, "strided inputs crop alike");
    CHECK(distinct == 20, "%d of the 20 offsets seen in 200 samples", distinct);
    em_tensor_release(x);
  }
  /* another seed gives other crops; a (H, W) image works the same */
  em_tensor *x = ramp(S, 1, H, W, EM_FLOAT32), *x2, *y, *y2;
  int differ = 0;
  for (int64_t i = 0; i < 20; i++) {
    run1(S, t, x, 11, i, &y);
    run1(S, t, x, 12, i, &y2);
    differ += !same_values(y, y2);
    em_tensor_release(y2);
    em_select(S, x, 0, 0, &x2);
    run1(S, t, x2, 11, i, &y2);
    em_tensor *y0 = NULL;
    em_select(S, y, 0, 0, &y0);
    CHECK(same_values(y0, y2), "2-D image, index %lld", (long long)i);
    em_tensor_release(y0);
    em_tensor_release(y2);
    em_tensor_release(x2);
    em_tensor_release(y);
  }
  CHECK(differ > 10, "seeds 11 and 12 differ on %d of 20", differ);
  em_tensor_release(x);
  em_transform_release(t);
  /* a crop the size of the padded image has one place */
  REQUIRE_OK(S, em_transform_random_crop(S, H + 2, W + 2, 1, &t));
  x = ramp(S, 2, H, W, EM_FLOAT32);
  CHECK_OK(S, run1(S, t, x, 3, 4, &y));
  CHECK(y && is_window(y, x, 1, 0, 0), "the whole padded image");
  em_tensor_release(y);
  em_tensor_release(x);
  em_transform_release(t);
  /* errors */
  REQUIRE_OK(S, em_transform_random_crop(S, 32, 32, 0, &t));
  x = ramp(S, 1, 28, 28, EM_UINT8);
  CHECK_ERR(S, run1(S, t, x, 0, 0, &y), EM_ERR_SHAPE,
            "random_crop: crop 32x32 larger than the padded image 28x28 (padding 0");
  em_tensor_release(x);
  em_transform_release(t);
  CHECK_ERR(S, em_transform_random_crop(S, 0, 3, 0, &t), EM_ERR_ARG, "random_crop", "0x3");
  CHECK_ERR(S, em_transform_random_crop(S, 3, 3, -1, &t), EM_ERR_ARG, "random_crop",
            "padding -1");
}

/* -- cutout ------------------------------------------------------------------------ */
static void test_cutout(em_state *S) {
  const int64_t C = 2, H = 7, W = 8;
  for (int64_t size = 3; size <= 4; size++) {
    em_transform *t;
    REQUIRE_OK(S, em_transform_cutout(S, size, &t));
    em_tensor *x = ramp(S, C, H, W, EM_FLOAT32);
    int ok = 1, det = 1, clipped = 0, full = 0, layouts = 1;
    int centres[7][8] = {{0}}, distinct = 0;
    for (int64_t i = 0; i < 300 && ok; i++) {
      em_tensor *y, *y2;
      if (run1(S, t, x, 21, i, &y)) { ok = 0; break; }
      /* the zeroed box, from channel 0 */
      int64_t ya = H, yb = -1, xa = W, xb = -1;
      for (int64_t r = 0; r < H; r++)
        for (int64_t c = 0; c < W; c++)
          if (t_get(y, r * W + c) == 0) {
            if (r < ya) ya = r;
            if (r > yb) yb = r;
            if (c < xa) xa = c;
            if (c > xb) xb = c;
          }
      yb++, xb++;
      /* exactly that box is zero in every channel, the rest is the input */
      for (int64_t j = 0; j < C * H * W; j++) {
        int64_t r = j / W % H, c = j % W;
        int in = r >= ya && r < yb && c >= xa && c < xb;
        if (t_get(y, j) != (in ? 0 : t_get(x, j))) ok = 0;
      }
      /* a size x size square centred at (cy, cx), clipped */
      int64_t hh = yb - ya, ww = xb - xa;
      ok &= hh >= 1 && ww >= 1 && hh <= size && ww <= size;
      ok &= (hh == size || ya == 0 || yb == H) && (ww == size || xa == 0 || xb == W);
      int64_t cy = ya == 0 && hh < size ? yb - (size - size / 2) : ya + size / 2;
      int64_t cx = xa == 0 && ww < size ? xb - (size - size / 2) : xa + size / 2;
      if (cy >= 0 && cy < H && cx >= 0 && cx < W) distinct += !centres[cy][cx]++;
      clipped += hh < size || ww < size;
      full += hh == size && ww == size;
      run1(S, t, x, 21, i, &y2);
      det &= same_values(y, y2);
      em_tensor_release(y2);
      if (i < 6)
        for (int mode = 1; mode < NMODES; mode++) {
          em_tensor *xv = in_layout(S, x, mode);
          run1(S, t, xv, 21, i, &y2);
          layouts &= same_values(y, y2);
          em_tensor_release(y2);
          em_tensor_release(xv);
        }
      em_tensor_release(y);
    }
    CHECK(ok, "one clipped %lldx%lld square zeroed, the rest unchanged", (long long)size,
          (long long)size);
    CHECK(clipped > 10 && full > 10, "clipped %d, whole %d of 300", clipped, full);
    CHECK(distinct > 45, "%d distinct centres of 56", distinct);
    CHECK(det && layouts, "deterministic, strided inputs alike");
    /* the input is never written */
    em_tensor *fresh = ramp(S, C, H, W, EM_FLOAT32);
    CHECK(same_values(x, fresh), "input untouched");
    em_tensor_release(fresh);
    em_tensor_release(x);
    em_transform_release(t);
  }
  em_transform *t;
  CHECK_ERR(S, em_transform_cutout(S, 0, &t), EM_ERR_ARG, "cutout", "size 0");
}

/* -- compose ------------------------------------------------------------------------ */
static void test_compose(em_state *S) {
  /* torchvision's center_crop -> resize (uint8) -> to_float -> normalize */
  em_transform *ts[4], *c;
  REQUIRE_OK(S, em_transform_center_crop(S, 12, 10, &ts[0]));
  REQUIRE_OK(S, em_transform_resize(S, 8, 9, &ts[1]));
  REQUIRE_OK(S, em_transform_to_float(S, &ts[2]));
  REQUIRE_OK(S, em_transform_normalize(S, (double[]){.4, .5, .6}, (double[]){.2, .25, .3},
                                       3, &ts[3]));
  REQUIRE_OK(S, em_transform_compose(S, ts, 4, &c));
  for (int k = 0; k < 4; k++) em_transform_release(ts[k]);   /* compose holds them */
  CHECK(!strcmp(em_transform_name(c), "compose"), "name");
  em_tensor *x = mk(S, get("pipe.x", 0), EM_UINT8), *y;
  REQUIRE(x, "fixture");
  for (int mode = 0; mode < NMODES; mode++) {
    em_tensor *xv = in_layout(S, x, mode);
    CHECK_OK(S, run1(S, c, xv, 0, 0, &y));
    CHECK_SHAPE(y, SHP(3, 8, 9));
    SAME(y, get("pipe.y", 0), 0, "pipeline %s", MODE_NAME[mode]);
    em_tensor_release(y);
    em_tensor_release(xv);
  }
  em_transform_release(c);
  /* random children draw from one stream in order: the same as running them
  ** one after another on one stream */
  em_transform *r[3];
  REQUIRE_OK(S, em_transform_random_crop(S, 5, 5, 2, &r[0]));
  REQUIRE_OK(S, em_transform_hflip(S, 0.5, &r[1]));
  REQUIRE_OK(S, em_transform_cutout(S, 2, &r[2]));
  REQUIRE_OK(S, em_transform_compose(S, r, 3, &c));
  em_tensor *img = ramp(S, 2, 6, 7, EM_FLOAT32);
  int same = 1, varied = 0;
  em_tensor *prev = NULL;
  for (int64_t i = 0; i < 30; i++) {
    emi_dctx ctx;
    emi_dctx_init(&ctx, S, 0, 0);
    emi_drng a, b;
    emi_drng_init(&a, 77, 0, i);
    emi_drng_init(&b, 77, 0, i);
    em_tensor *f1[1] = {img}, *f2[1] = {img};
    em_tensor_retain(img);
    em_tensor_retain(img);
    em_status st = emi_transform_run(c, &ctx, &a, f1, 1);
    for (int k = 0; k < 3 && !st; k++) st = emi_transform_run(r[k], &ctx, &b, f2, 1);
    same &= !st && same_values(f1[0], f2[0]);
    /* and em_transform_apply uses (seed, epoch 0, index) */
    CHECK_OK(S, run1(S, c, img, 77, i, &y));
    same &= same_values(y, f1[0]);
    varied += prev && !same_values(prev, y);
    em_tensor_release(prev);
    prev = y;
    em_tensor_release(f1[0]);
    em_tensor_release(f2[0]);
  }
  em_tensor_release(prev);
  CHECK(same, "compose = its children on one stream");
  CHECK(varied > 25, "results vary with the index (%d of 29)", varied);
  for (int k = 0; k < 3; k++) em_transform_release(r[k]);
  em_transform_release(c);
  /* an empty compose is the identity */
  REQUIRE_OK(S, em_transform_compose(S, NULL, 0, &c));
  CHECK_OK(S, run1(S, c, img, 0, 0, &y));
  CHECK(y == img, "identity");
  em_tensor_release(y);
  em_transform_release(c);
  em_tensor_release(img);
  em_transform *none[2] = {NULL, NULL};
  CHECK_ERR(S, em_transform_compose(S, none, 2, &c), EM_ERR_ARG, "compose", "1 of 2");
  em_tensor_release(x);
}

/* -- custom ------------------------------------------------------------------------- */
typedef struct cu_ud {
  em_state *other;       /* the "worker's" state */
  int calls, released, last_worker, fail, transposed;
} cu_ud;

/* Replaces field 1 by 10 * field 0 made in another state (as a worker's own
** LuaJIT state would), optionally as a transposed view. */
static int cu_fn(void *ud, int worker, uint64_t seed, em_tensor **fields, int nfields, char *err,
                 size_t errlen) {
  cu_ud *u = ud;
  u->calls++;
  u->last_worker = worker;
  if (u->fail == 1) { snprintf(err, errlen, "bad sample: %d fields", nfields); return 1; }
  if (u->fail == 2) return 7;
  em_tensor *x = fields[0], *y = NULL, *yt = NULL;
  int64_t n = em_tensor_numel(x);
  double *v = malloc(sizeof(double) * n);
  for (int64_t i = 0; i < n; i++) v[i] = 10 * t_get(x, i);
  /* sizes of x with the last two dims swapped, filled so that the transpose
  ** holds x's layout */
  em_from_data(u->other, em_tensor_sizes(x), em_tensor_ndim(x), EM_FLOAT32, v, EM_FLOAT64, &y);
  free(v);
  if (u->transposed && y) {
    int nd = em_tensor_ndim(x);
    int64_t ps[8];
    memcpy(ps, em_tensor_sizes(x), sizeof(int64_t) * nd);
    ps[nd - 1] = em_tensor_size(x, nd - 2);
    ps[nd - 2] = em_tensor_size(x, nd - 1);
    em_tensor *p = NULL;
    em_empty(u->other, ps, nd, EM_FLOAT32, EM_CPU, &p);
    em_transpose(u->other, p, nd - 2, nd - 1, &yt);
    em_copy_(u->other, yt, y);
    em_tensor_release(p);
    em_tensor_release(y);
    y = yt;
  }
  em_tensor_release(fields[1]);
  fields[1] = y;
  return 0;
}

static void cu_release(void *ud) { ((cu_ud *)ud)->released++; }

static void test_custom(em_state *S) {
  em_state *S2;
  em_config cfg;
  em_config_init(&cfg);
  cfg.num_threads = 1;
  REQUIRE(em_open(&S2, &cfg) == EM_OK, "second state");
  cu_ud u = {S2, 0, 0, 99, 0, 0};
  em_transform *t;
  REQUIRE_OK(S, em_transform_custom(S, "times_ten", cu_fn, &u, cu_release, &t));
  CHECK(!strcmp(em_transform_name(t), "times_ten"), "name %s", em_transform_name(t));
  em_tensor *x, *lab;
  REQUIRE_OK(S, t_make(S, &x, EM_FLOAT32, SHP(2, 3), V(1, 2, 3, 4, 5, 6)));
  REQUIRE_OK(S, t_make(S, &lab, EM_INT64, SHP(1), V(4)));
  for (u.transposed = 0; u.transposed < 2; u.transposed++) {
    em_tensor *f[2] = {x, lab};
    em_tensor_retain(x);
    em_tensor_retain(lab);
    CHECK_OK(S, em_transform_apply(S, t, f, 2, 0, 0));
    CHECK(u.last_worker == -1, "worker %d on the caller's thread", u.last_worker);
    CHECK(f[0] == x, "field 0 untouched");
    CHECK(f[1] && f[1]->storage->S == S, "the other state's tensor was copied into S");
    CHECK(f[1] && em_tensor_is_contiguous(f[1]), "as a contiguous tensor");
    CHECK_VALS(f[1], 0, V(10, 20, 30, 40, 50, 60));
    CHECK(em_memory_allocated(S2) == 0, "nothing of the other state is left (%lld bytes)",
          (long long)em_memory_allocated(S2));
    em_tensor_release(f[0]);
    em_tensor_release(f[1]);
  }
  /* on a worker: the context's number, the context's state */
  emi_dctx ctx;
  emi_dctx_init(&ctx, S, 3, 0);
  em_tensor *f[2] = {x, lab};
  em_tensor_retain(x);
  em_tensor_retain(lab);
  CHECK(emi_transform_run(t, &ctx, NULL, f, 2) == EM_OK, "%s", ctx.err);
  CHECK(u.last_worker == 3, "worker %d", u.last_worker);
  em_tensor_release(f[0]);
  em_tensor_release(f[1]);
  /* failures: the function's message, or one naming the transform */
  u.fail = 1;
  f[0] = x; f[1] = lab;
  em_tensor_retain(x);
  em_tensor_retain(lab);
  CHECK_ERR(S, em_transform_apply(S, t, f, 2, 0, 0), EM_ERR_ARG, "bad sample: 2 fields");
  u.fail = 2;
  CHECK_ERR(S, em_transform_apply(S, t, f, 2, 0, 0), EM_ERR_ARG, "times_ten", "7");
  em_tensor_release(f[0]);
  em_tensor_release(f[1]);
  /* in a compose, with built-ins before it */
  em_transform *tf, *c;
  REQUIRE_OK(S, em_transform_to_float(S, &tf));
  REQUIRE_OK(S, em_transform_compose(S, (em_transform *[]){tf, t}, 2, &c));
  em_transform_release(tf);
  em_transform_release(t);
  CHECK(u.released == 0, "the compose holds the custom transform");
  u.fail = 0;
  em_tensor *xu;
  REQUIRE_OK(S, t_make(S, &xu, EM_UINT8, SHP(1, 2), V(51, 255)));
  f[0] = xu; f[1] = lab;
  em_tensor_retain(lab);
  CHECK_OK(S, em_transform_apply(S, c, f, 2, 0, 0));
  CHECK_VALS(f[1], 1e-6, V(2, 10));
  em_tensor_release(f[0]);
  em_tensor_release(f[1]);
  em_transform_release(c);
  CHECK(u.released == 1, "release(ud) ran once when the transform died (%d)", u.released);
  CHECK_ERR(S, em_transform_custom(S, "x", NULL, &u, cu_release, &t), EM_ERR_ARG,
            "NULL function");
  CHECK(u.released == 2, "a transform that can't be made releases ud at once");
  em_tensor_release(x);
  em_tensor_release(lab);
  em_close(S2);
}

/* -- Errors ------------------------------------------------------------------------- */
static void test_errors(em_state *S) {
  em_transform *ts[6];
  REQUIRE_OK(S, em_transform_random_crop(S, 2, 2, 0, &ts[0]));
  REQUIRE_OK(S, em_transform_center_crop(S, 2, 2, &ts[1]));
  REQUIRE_OK(S, em_transform_resize(S, 2, 2, &ts[2]));
  REQUIRE_OK(S, em_transform_hflip(S, 0.5, &ts[3]));
  REQUIRE_OK(S, em_transform_cutout(S, 2, &ts[4]));
  REQUIRE_OK(S, em_transform_normalize(S, (double[]){0}, (double[]){1}, 1, &ts[5]));
  const char *names[6] = {"random_crop", "center_crop", "resize", "hflip", "cutout",
                          "normalize"};
  em_tensor *v1, *v4, *y;
  REQUIRE_OK(S, t_make(S, &v1, EM_FLOAT32, SHP(4), V(1, 2, 3, 4)));
  REQUIRE_OK(S, em_full(S, SHP(1, 1, 3, 3), 1, EM_FLOAT32, EM_CPU, &v4));
  for (int k = 0; k < 6; k++) {
    CHECK(!strcmp(em_transform_name(ts[k]), names[k]), "name %s", em_transform_name(ts[k]));
    CHECK_ERR(S, run1(S, ts[k], v1, 0, 0, &y), EM_ERR_SHAPE, names[k], "(C, H, W)", "[4]");
    if (k == 5) continue;        /* normalize takes (B, C, H, W) batches */
    CHECK_ERR(S, run1(S, ts[k], v4, 0, 0, &y), EM_ERR_SHAPE, names[k], "[1,1,3,3]");
  }
  /* random transforms need a stream; errors go to the context, not to S */
  em_tensor *img = ramp(S, 1, 3, 3, EM_FLOAT32);
  emi_error(S, EM_ERR_ARG, "earlier message");
  for (int k = 0; k < 5; k++) {
    emi_dctx ctx;
    emi_dctx_init(&ctx, S, 1, 0);
    em_tensor *f[1] = {img};
    em_tensor_retain(img);
    em_status st = emi_transform_run(ts[k], &ctx, NULL, f, 1);
    int random = k == 0 || k == 3 || k == 4;
    if (random)
      CHECK(st == EM_ERR_ARG && strstr(ctx.err, names[k]) && strstr(ctx.err, "random"),
            "%s without a stream: %d \"%s\"", names[k], st, ctx.err);
    else
      CHECK(st == EM_OK, "%s needs no stream: %s", names[k], ctx.err);
    em_tensor_release(f[0]);
  }
  CHECK(!strcmp(em_errmsg(S), "earlier message"), "S's message untouched: %s", em_errmsg(S));
  /* empty images, bad field lists */
  em_tensor *e;
  REQUIRE_OK(S, em_empty(S, SHP(3, 0, 4), EM_FLOAT32, EM_CPU, &e));
  CHECK_ERR(S, run1(S, ts[1], e, 0, 0, &y), EM_ERR_SHAPE, "center_crop", "empty", "[3,0,4]");
  em_tensor *f[2] = {img, NULL};
  CHECK_ERR(S, em_transform_apply(S, ts[1], f, 0, 0, 0), EM_ERR_ARG, "center_crop", "got 0");
  CHECK_ERR(S, em_transform_apply(S, ts[1], f, 2, 0, 0), EM_ERR_ARG, "center_crop",
            "field 2", "NULL");
  CHECK_ERR(S, em_transform_apply(S, NULL, f, 1, 0, 0), EM_ERR_ARG, "NULL transform");
  CHECK(f[0] == img, "the sample is left as it was");
  em_tensor_release(e);
  em_tensor_release(img);
  em_tensor_release(v1);
  em_tensor_release(v4);
  for (int k = 0; k < 6; k++) em_transform_release(ts[k]);
}


/* -- Allocation failures -------------------------------------------------------------
** A state whose allocator refuses its Nth request once armed: every transform's
** construction and a whole pipeline's apply, for N = 1, 2, ... until one runs
** through, must fail with EM_ERR_NOMEM and a message, leave a valid sample
** (which the caller releases) and give back every byte. */
typedef struct fa_state { long count, fail_at; int64_t live; } fa_state;

static void *fa_alloc(void *ud, void *ptr, size_t osize, size_t nsize) {
  fa_state *f = ud;   /* one thread here: em_transform_apply runs on the caller's */
  char *h = ptr ? (char *)ptr - 16 : NULL;
  if (nsize == 0) {
    if (h) { f->live -= (int64_t)*(size_t *)h; free(h); }
    return NULL;
  }
  if (f->fail_at && ++f->count == f->fail_at) return NULL;
  size_t old = h ? *(size_t *)h : 0;
  char *n = realloc(h, nsize + 16);
  if (!n) return NULL;
  f->live += (int64_t)nsize - (int64_t)old;
  *(size_t *)n = nsize;
  return n + 16;
}

static em_status make_all(em_state *S, em_transform **c) {
  em_transform *ts[7] = {NULL};
  em_status st;
  if ((st = em_transform_random_crop(S, 9, 9, 2, &ts[0])) ||
      (st = em_transform_resize(S, 12, 11, &ts[1])) ||
      (st = em_transform_hflip(S, 1, &ts[2])) ||
      (st = em_transform_cutout(S, 3, &ts[3])) ||
      (st = em_transform_center_crop(S, 10, 10, &ts[4])) ||
      (st = em_transform_to_float(S, &ts[5])) ||
      (st = em_transform_normalize(S, (double[]){.5}, (double[]){.2}, 1, &ts[6])))
    goto done;
  st = em_transform_compose(S, ts, 7, c);
done:
  for (int k = 0; k < 7; k++) em_transform_release(ts[k]);
  return st;
}

static void test_failalloc(void) {
  fa_state f = {0, 0, 0};
  em_config cfg;
  em_config_init(&cfg);
  cfg.num_threads = 1;
  cfg.alloc = fa_alloc;
  cfg.alloc_ud = &f;
  em_state *S;
  REQUIRE(em_open(&S, &cfg) == EM_OK, "open");
  em_tensor *x = ramp(S, 3, 10, 8, EM_UINT8);
  REQUIRE(x, "input");
  em_memory_release_cached(S);
  int64_t base = f.live;
  int n, bad = 0;
  for (n = 1; n < 200; n++) {   /* construction */
    em_transform *c = NULL;
    f.count = 0;
    f.fail_at = n;
    em_status st = make_all(S, &c);
    f.fail_at = 0;
    em_transform_release(c);
    em_memory_release_cached(S);
    if (st == EM_OK) break;
    if (st != EM_ERR_NOMEM || !strstr(em_errmsg(S), "out of memory") || f.live != base) {
      printf("  construction, failing allocation %d: status %d \"%s\", %lld bytes left\n",
             n, st, em_errmsg(S), (long long)(f.live - base));
      bad++;
    }
  }
  CHECK(!bad && n > 7 && n < 200, "%d construction failure points, %d bad", n - 1, bad);
  em_transform *c;
  REQUIRE_OK(S, make_all(S, &c));
  em_memory_release_cached(S);
  base = f.live;
  bad = 0;
  for (n = 1; n < 200; n++) {   /* apply */
    em_tensor *fl[1] = {x};
    em_tensor_retain(x);
    f.count = 0;
    f.fail_at = n;
    em_status st = em_transform_apply(S, c, fl, 1, 5, 6);
    f.fail_at = 0;
    int intact = fl[0] != NULL;   /* x, or what the steps before made of it */
    em_tensor_release(fl[0]);
    em_memory_release_cached(S);
    if (st == EM_OK) break;
    if (st != EM_ERR_NOMEM || !strstr(em_errmsg(S), "out of memory") || !intact ||
        f.live != base) {
      printf("  apply, failing allocation %d: status %d \"%s\", %lld bytes left\n", n,
             st, em_errmsg(S), (long long)(f.live - base));
      bad++;
    }
  }
  CHECK(!bad && n > 7 && n < 200, "%d apply failure points, %d bad", n - 1, bad);
  em_transform_release(c);
  em_tensor_release(x);
  em_close(S);
}

int main(void) {
  em_state *S = fx_open("fixtures/transforms.txt");
  if (!S) return 1;
  RUN(test_to_float, S);
  RUN(test_normalize, S);
  RUN(test_center_crop, S);
  RUN(test_resize, S);
  RUN(test_hflip, S);
  RUN(test_random_crop, S);
  RUN(test_cutout, S);
  RUN(test_compose, S);
  RUN(test_custom, S);
  RUN(test_errors, S);
  RUN(test_failalloc);
  chk_group_begin("no_leaks");
  CHECK(em_memory_allocated(S) == 0, "%lld bytes of tensors still live",
        (long long)em_memory_allocated(S));
  em_close(S);
  for (int k = 0; k < nfx; k++) free(fx[k].v);
  free(fx);
  return check_done();
}

/*
** test_cuda_reduce.c -- the CUDA backend's reductions (kernels/k_reduce.c) on an
** emulated device, against the CPU backend: every reduction op x every dtype the
** CPU accepts for it, dims masks (one, several, all, keepdim), transposed and
** expanded (stride 0) inputs, sizes that cross block boundaries, empty
** reductions and their errors, NaN/inf, var/std corrections, p-norms, argmax /
** argmin ties and index bases, softmax / log_softmax along each dim. Every
** device result is computed twice and must be bit-identical (determinism).
** test_split covers the work that k_reduce.c cuts across many blocks (few
** outputs, long slices: n = 2^20+3 and 2^24 elements; 2^14+3 and 2^16 under
** the sanitizers), with contiguous, transposed, expanded (stride 0) and
** misaligned (narrowed by one element) inputs, and sums of integer-valued
** floats, which double accumulation makes exact in any order: those must equal the CPU's and the closed form bit for bit.
*/
#include "cuda_check.h"

static const em_dtype ALL_DT[] = {EM_FLOAT32, EM_FLOAT64, EM_FLOAT16, EM_BFLOAT16,
                                  EM_INT32,   EM_INT64,   EM_UINT8,   EM_BOOL};
static const em_dtype FLOAT_DT[] = {EM_FLOAT32, EM_FLOAT64, EM_FLOAT16, EM_BFLOAT16};

enum { OP_REDUCE, OP_VAR, OP_NORM, OP_MAXDIM, OP_ARGMAX, OP_ARGMIN, OP_SOFTMAX };

typedef struct spec {
  int op;
  em_redop redop;
  const int *dims;
  int ndims, keepdim;
  double arg;          /* var: correction; norm: p */
  int flag;            /* var: sqrt; maxdim: want_max; softmax: log */
  int dim, base;       /* arg ops, softmax */
} spec;

static uint64_t rng = 88172645463325252ull;
static double urand(void) {
  rng ^= rng << 13; rng ^= rng >> 7; rng ^= rng << 17;
  return (double)(rng >> 11) / 9007199254740992.0;
}

static double rand_value(em_dtype dt) {
  switch (dt) {
  case EM_BOOL: return urand() < 0.5;
  case EM_UINT8: return floor(urand() * 11);
  case EM_INT32: case EM_INT64: return floor(urand() * 11) - 5;
  default: return urand() * 6 - 3;
  }
}

static double tol_of(em_dtype dt) {
  switch (dt) {
  case EM_FLOAT64: return 1e-12;
  case EM_FLOAT32: return 4e-6;
  case EM_FLOAT16: return 2e-3;
  case EM_BFLOAT16: return 1.6e-2;
  default: return 0;
  }
}

static em_status run_spec(em_state *S, const spec *sp, const em_tensor *a, em_tensor **out,
                          em_tensor **out2) {
  *out2 = NULL;
  switch (sp->op) {
  case OP_REDUCE: return em_reduce(S, sp->redop, a, sp->dims, sp->ndims, sp->keepdim, out);
  case OP_VAR: return em_var(S, a, sp->dims, sp->ndims, sp->arg, sp->keepdim, sp->flag, out);
  case OP_NORM: return em_norm(S, a, sp->arg, sp->dims, sp->ndims, sp->keepdim, out);
  case OP_MAXDIM:
    return sp->flag ? em_max_dim(S, a, sp->dim, sp->keepdim, sp->base, out, out2)
                    : em_min_dim(S, a, sp->dim, sp->keepdim, sp->base, out, out2);
  case OP_ARGMAX: return em_argmax(S, a, sp->dim, sp->ndims, sp->keepdim, sp->base, out);
  case OP_ARGMIN: return em_argmin(S, a, sp->dim, sp->ndims, sp->keepdim, sp->base, out);
  default: return em_softmax(S, a, sp->dim, sp->flag, out);
  }
}

static int same_bits(const em_tensor *x, const em_tensor *y) {
  if (!x || !y) return x == y;
  if (em_tensor_numel(x) != em_tensor_numel(y)) return 0;
  for (int64_t i = 0; i < em_tensor_numel(x); i++) {
    double u = t_get(x, i), v = t_get(y, i);
    if (memcmp(&u, &v, sizeof u) && !(isnan(u) && isnan(v))) return 0;
  }
  return 1;
}

static int close_all(const em_tensor *g, const em_tensor *w, double tol, double scale,
                     char *why, size_t n) {
  if (!g || !w) { snprintf(why, n, "missing result"); return g == w; }
  int ok = em_tensor_ndim(g) == em_tensor_ndim(w) && em_tensor_dtype(g) == em_tensor_dtype(w);
  for (int d = 0; ok && d < em_tensor_ndim(g); d++)
    ok = em_tensor_sizes(g)[d] == em_tensor_sizes(w)[d];
  if (!ok) { snprintf(why, n, "shape or dtype differs"); return 0; }
  for (int64_t i = 0; i < em_tensor_numel(g); i++) {
    double x = t_get(g, i), y = t_get(w, i);
    int good = isnan(y) ? isnan(x) : isinf(y) ? x == y
                                                : fabs(x - y) <= tol * (1 + fabs(y) + scale);
    if (!good) {
      snprintf(why, n, "element %lld: cuda %.10g, cpu %.10g", (long long)i, x, y);
      return 0;
    }
  }
  return 1;
}

/* Runs sp on host tensor h (through view: 0 none, 1 transpose(0, last), 2 expand
** the first dim of size 1 to 5, 3 narrow the last dim by its first element, so
** float32 rows start off a 16-byte boundary) on the CPU and on cuda:0 twice;
** compares. */
static void compare(em_state *S, const char *what, const spec *sp, em_tensor *h, int view) {
  em_tensor *d = NULL, *hv = NULL, *dv = NULL, *w = NULL, *w2 = NULL, *g[2] = {NULL, NULL},
            *g2[2] = {NULL, NULL}, *gh[2] = {NULL, NULL}, *gh2[2] = {NULL, NULL};
  em_dtype dt = em_tensor_dtype(h);
  char why[200];
  if (em_to(S, h, dt, 0, &d)) { CHECK(0, "%s: to device", what); return; }
  int nd = em_tensor_ndim(h);
  if (view == 1) {
    CHECK_OK(S, em_transpose(S, h, 0, nd - 1, &hv));
    CHECK_OK(S, em_transpose(S, d, 0, nd - 1, &dv));
  } else if (view == 2) {
    int64_t shp[EM_MAX_DIMS];
    for (int k = 0; k < nd; k++) shp[k] = em_tensor_sizes(h)[k];
    for (int k = 0; k < nd; k++)
      if (shp[k] == 1) { shp[k] = 5; break; }
    CHECK_OK(S, em_expand(S, h, shp, nd, &hv));
    CHECK_OK(S, em_expand(S, d, shp, nd, &dv));
  } else if (view == 3) {
    int64_t n = em_tensor_sizes(h)[nd - 1];
    CHECK_OK(S, em_narrow(S, h, nd - 1, 1, n - 1, &hv));
    CHECK_OK(S, em_narrow(S, d, nd - 1, 1, n - 1, &dv));
  } else {
    em_tensor_retain(h); hv = h;
    em_tensor_retain(d); dv = d;
  }
  if (!hv || !dv) goto done;
  em_status sc = run_spec(S, sp, hv, &w, &w2);
  for (int r = 0; r < 2; r++) {
    em_status sg = run_spec(S, sp, dv, &g[r], &g2[r]);
    if (sc || sg) {
      CHECK(sc && sg, "%s: cpu status %d, cuda status %d (%s)", what, sc, sg, em_errmsg(S));
      goto done;
    }
    CHECK_OK(S, em_to(S, g[r], em_tensor_dtype(g[r]), EM_CPU, &gh[r]));
    if (g2[r]) CHECK_OK(S, em_to(S, g2[r], em_tensor_dtype(g2[r]), EM_CPU, &gh2[r]));
  }
  /* tolerance: per dtype of the arithmetic, relative to the slice's sum of |x| */
  double tol = tol_of(em_tensor_dtype(w)), scale = 0;
  if (sp->op == OP_REDUCE && (sp->redop == EM_SUM || sp->redop == EM_LOGSUMEXP) &&
      em_dtype_is_floating(dt)) {
    for (int64_t i = 0; i < em_tensor_numel(hv); i++) scale += fabs(t_get(hv, i));
    scale /= em_tensor_numel(w) ? (double)em_tensor_numel(w) : 1;
    if (!isfinite(scale)) scale = 0;
  }
  if (dt == EM_FLOAT32 && sp->op == OP_SOFTMAX) tol = 2e-5;
  if (em_dtype_is_floating(dt) && !em_dtype_is_floating(em_tensor_dtype(w)) &&
      sp->op == OP_REDUCE && (sp->redop == EM_SUM || sp->redop == EM_PROD))
    tol = 0;
  CHECK(close_all(gh[0], w, tol, scale, why, sizeof why), "%s: %s", what, why);
  if (w2) CHECK(close_all(gh2[0], w2, 0, 0, why, sizeof why), "%s (indices): %s", what, why);
  CHECK(same_bits(gh[0], gh[1]) && same_bits(gh2[0], gh2[1]), "%s: two runs differ", what);
done:
  em_tensor_release(d); em_tensor_release(hv); em_tensor_release(dv);
  em_tensor_release(w); em_tensor_release(w2);
  for (int r = 0; r < 2; r++) {
    em_tensor_release(g[r]); em_tensor_release(g2[r]);
    em_tensor_release(gh[r]); em_tensor_release(gh2[r]);
  }
}

static em_tensor *make_rand(em_state *S, em_dtype dt, const int64_t *shape, int nd) {
  int64_t n = 1;
  for (int k = 0; k < nd; k++) n *= shape[k];
  double *v = malloc(sizeof(double) * (size_t)(n ? n : 1));
  for (int64_t i = 0; i < n; i++) v[i] = rand_value(dt);
  em_tensor *t = NULL;
  em_from_data(S, shape, nd, dt, v, EM_FLOAT64, &t);
  free(v);
  return t;
}

static const em_redop ALL_OPS[] = {EM_SUM, EM_MEAN, EM_PROD, EM_AMAX, EM_AMIN,
                                   EM_LOGSUMEXP, EM_ANY, EM_ALL};
static const char *const OPN[] = {"sum", "mean", "prod", "amax", "amin", "logsumexp",
                                  "any", "all"};

static const int D0[] = {0}, D1[] = {1}, D2[] = {2}, D02[] = {0, 2}, DM1[] = {-1};

/* every redop x every dtype x several masks and layouts */
static void test_reduce_ops(em_state *S) {
  struct { const int *dims; int nd; } masks[] = {{D0, 1}, {D1, 1}, {NULL, 0}, {D02, 1},
                                                  {D02, 2}, {DM1, 1}};
  for (size_t t = 0; t < sizeof ALL_DT / sizeof *ALL_DT; t++) {
    em_dtype dt = ALL_DT[t];
    em_tensor *h2 = make_rand(S, dt, SHP(5, 7)), *h3 = make_rand(S, dt, SHP(3, 4, 6)),
              *h1 = make_rand(S, dt, SHP(1, 9));
    for (size_t o = 0; o < sizeof ALL_OPS / sizeof *ALL_OPS; o++) {
      em_redop op = ALL_OPS[o];
      if (op == EM_MEAN && !em_dtype_is_floating(dt)) {
        em_tensor *x = NULL, *dx = NULL;
        em_to(S, h2, dt, 0, &dx);
        CHECK_ERR(S, em_reduce(S, op, dx, NULL, 0, 0, &x), EM_ERR_DTYPE, "floating");
        em_tensor_release(dx);
        continue;
      }
      char what[160];
      for (size_t m = 0; m < sizeof masks / sizeof *masks; m++) {
        for (int keep = 0; keep < 2; keep++) {
          spec sp = {OP_REDUCE, op, masks[m].dims, masks[m].nd, keep, 0, 0, 0, 0};
          snprintf(what, sizeof what, "%s %s mask %zu keep %d", OPN[o], em_dtype_name(dt), m,
                   keep);
          compare(S, what, &sp, h3, 0);
          if (masks[m].nd < 2 && (!masks[m].dims || masks[m].dims[0] != 2)) {
            compare(S, what, &sp, h2, 0);
            compare(S, what, &sp, h2, 1);   /* transposed */
            compare(S, what, &sp, h1, 2);   /* expanded, stride 0 */
          }
        }
      }
    }
    em_tensor_release(h1); em_tensor_release(h2); em_tensor_release(h3);
  }
}

/* NaN / inf in floating inputs; 0-dim; large sizes across blocks; empties */
static void test_special(em_state *S) {
  char what[160];
  for (size_t t = 0; t < sizeof FLOAT_DT / sizeof *FLOAT_DT; t++) {
    em_dtype dt = FLOAT_DT[t];
    em_tensor *h;
    REQUIRE_OK(S, t_make(S, &h, dt, SHP(4, 5), V(1, NAN, -2, 3, 0,   INFINITY, 1, 2, 3, 4,
                                              -INFINITY, 1, 2, 3, 4, -INFINITY, -INFINITY,
                                              -INFINITY, -INFINITY, -INFINITY)));
    for (size_t o = 0; o < sizeof ALL_OPS / sizeof *ALL_OPS; o++)
      for (int dim = 0; dim < 2; dim++) {
        int dd[1] = {dim};
        spec sp = {OP_REDUCE, ALL_OPS[o], dd, 1, 0, 0, 0, 0, 0};
        snprintf(what, sizeof what, "%s %s nan/inf dim %d", OPN[o], em_dtype_name(dt), dim);
        compare(S, what, &sp, h, 0);
      }
    for (int dim = 0; dim < 2; dim++)
      for (int mx = 0; mx < 2; mx++) {
        spec sp = {OP_MAXDIM, EM_SUM, NULL, 0, 0, 0, mx, dim, 0};
        snprintf(what, sizeof what, "max/min %s nan/inf dim %d", em_dtype_name(dt), dim);
        compare(S, what, &sp, h, 0);
        spec sm = {OP_SOFTMAX, EM_SUM, NULL, 0, 0, 0, mx, dim, 0};
        snprintf(what, sizeof what, "softmax %s nan/inf dim %d", em_dtype_name(dt), dim);
        compare(S, what, &sm, h, 0);
      }
    em_tensor_release(h);
    /* 0-dim */
    REQUIRE_OK(S, t_make(S, &h, dt, NULL, 0, V(2.5)));
    for (size_t o = 0; o < sizeof ALL_OPS / sizeof *ALL_OPS; o++) {
      spec sp = {OP_REDUCE, ALL_OPS[o], NULL, 0, 0, 0, 0, 0, 0};
      snprintf(what, sizeof what, "%s %s 0-dim", OPN[o], em_dtype_name(dt));
      compare(S, what, &sp, h, 0);
    }
    spec sm = {OP_SOFTMAX, EM_SUM, NULL, 0, 0, 0, 1, 0, 0};
    compare(S, "log_softmax 0-dim", &sm, h, 0);
    spec sa = {OP_ARGMAX, EM_SUM, NULL, 1, 0, 0, 0, 0, 1};
    compare(S, "argmax 0-dim", &sa, h, 0);
    em_tensor_release(h);
  }
  /* empty reductions: sum/prod/mean/any/all/logsumexp/norm allowed, amax/argmax not */
  for (size_t t = 0; t < sizeof ALL_DT / sizeof *ALL_DT; t++) {
    em_dtype dt = ALL_DT[t];
    em_tensor *h = make_rand(S, dt, SHP(0, 3)), *d = NULL, *x = NULL;
    REQUIRE_OK(S, em_to(S, h, dt, 0, &d));
    for (size_t o = 0; o < sizeof ALL_OPS / sizeof *ALL_OPS; o++) {
      em_redop op = ALL_OPS[o];
      if (op == EM_MEAN && !em_dtype_is_floating(dt)) continue;
      spec sp = {OP_REDUCE, op, D0, 1, 0, 0, 0, 0, 0};
      snprintf(what, sizeof what, "%s %s empty", OPN[o], em_dtype_name(dt));
      if (op == EM_AMAX || op == EM_AMIN)
        CHECK_ERR(S, em_reduce(S, op, d, D0, 1, 0, &x), EM_ERR_SHAPE, "size 0");
      else
        compare(S, what, &sp, h, 0);
      spec s2 = {OP_REDUCE, op, D1, 1, 0, 0, 0, 0, 0};   /* no output at all */
      if (op != EM_MEAN || em_dtype_is_floating(dt)) compare(S, what, &s2, h, 0);
    }
    CHECK_ERR(S, em_argmax(S, d, 0, 0, 0, 0, &x), EM_ERR_SHAPE, "size 0");
    if (em_dtype_is_floating(dt)) {
      spec sn = {OP_NORM, EM_SUM, D0, 1, 0, 3, 0, 0, 0};
      compare(S, "norm empty", &sn, h, 0);
      spec sv = {OP_VAR, EM_SUM, D0, 1, 0, 1, 0, 0, 0};
      compare(S, "var empty", &sv, h, 0);
    } else {
      CHECK_ERR(S, em_norm(S, d, 2, NULL, 0, 0, &x), EM_ERR_DTYPE, "floating");
      CHECK_ERR(S, em_var(S, d, NULL, 0, 1, 0, 0, &x), EM_ERR_DTYPE, "floating");
      CHECK_ERR(S, em_softmax(S, d, 0, 0, &x), EM_ERR_DTYPE, "floating");
    }
    em_tensor_release(h); em_tensor_release(d);
  }
}

static void test_large(em_state *S) {
  em_dtype dts[] = {EM_FLOAT32, EM_FLOAT64, EM_INT32, EM_FLOAT16};
  for (int t = 0; t < 4; t++) {
    em_tensor *h = make_rand(S, dts[t], SHP(70000));
    char what[120];
    em_redop ops[] = {EM_SUM, EM_AMAX, EM_ANY};
    for (int o = 0; o < 3; o++) {
      spec sp = {OP_REDUCE, ops[o], NULL, 0, 0, 0, 0, 0, 0};
      snprintf(what, sizeof what, "70000 %s %s", em_dtype_name(dts[t]), OPN[ops[o]]);
      compare(S, what, &sp, h, 0);
    }
    spec sa = {OP_ARGMIN, EM_SUM, NULL, 1, 0, 0, 0, 0, 0};
    compare(S, "70000 argmin", &sa, h, 0);
    if (em_dtype_is_floating(dts[t])) {
      spec sv = {OP_VAR, EM_SUM, NULL, 0, 0, 1, 1, 0, 0};
      compare(S, "70000 std", &sv, h, 0);
    }
    em_tensor_release(h);
  }
  /* one thread per output: columns (400, 2048) over dim 0, short rows (5000, 8) */
  em_dtype cdt[] = {EM_FLOAT32, EM_FLOAT64, EM_BFLOAT16, EM_INT32, EM_UINT8};
  for (int t = 0; t < 5; t++) {
    em_tensor *hc = make_rand(S, cdt[t], SHP(400, 2048)), *hr = make_rand(S, cdt[t], SHP(5000, 8));
    char what[120];
    em_redop ops[] = {EM_SUM, EM_MEAN, EM_PROD, EM_AMAX, EM_AMIN, EM_LOGSUMEXP, EM_ALL};
    for (int o = 0; o < 7; o++) {
      if (ops[o] == EM_MEAN && !em_dtype_is_floating(cdt[t])) continue;
      spec sc = {OP_REDUCE, ops[o], D0, 1, 0, 0, 0, 0, 0};
      spec sr = {OP_REDUCE, ops[o], D1, 1, 1, 0, 0, 0, 0};
      snprintf(what, sizeof what, "columns %s %s", em_dtype_name(cdt[t]), OPN[ops[o]]);
      if (ops[o] != EM_PROD || !em_dtype_is_floating(cdt[t])) compare(S, what, &sc, hc, 0);
      snprintf(what, sizeof what, "short rows %s %s", em_dtype_name(cdt[t]), OPN[ops[o]]);
      compare(S, what, &sr, hr, 0);
    }
    if (em_dtype_is_floating(cdt[t])) {
      spec sv = {OP_VAR, EM_SUM, D0, 1, 0, 1, 1, 0, 0};
      compare(S, "columns std", &sv, hc, 0);
      spec sn = {OP_NORM, EM_SUM, D1, 1, 0, 3, 0, 0, 0};
      compare(S, "short rows norm 3", &sn, hr, 0);
      spec sv2 = {OP_VAR, EM_SUM, D1, 1, 0, 0, 0, 0, 0};
      compare(S, "short rows var", &sv2, hr, 1);
    }
    em_tensor_release(hc); em_tensor_release(hr);
  }
  em_tensor *h = make_rand(S, EM_FLOAT32, SHP(1000, 333));
  spec sp = {OP_REDUCE, EM_SUM, D1, 1, 0, 0, 0, 0, 0};
  compare(S, "1000x333 sum(1)", &sp, h, 0);
  spec s0 = {OP_REDUCE, EM_MEAN, D0, 1, 0, 0, 0, 0, 0};
  compare(S, "1000x333 mean(0)", &s0, h, 0);
  spec sm = {OP_SOFTMAX, EM_SUM, NULL, 0, 0, 0, 0, 1, 0};
  compare(S, "1000x333 softmax(1)", &sm, h, 0);
  em_tensor_release(h);
}

static void test_var_norm(em_state *S) {
  char what[160];
  double ps[] = {1, 2, 3, INFINITY, -INFINITY, 0, 0.5};
  for (size_t t = 0; t < sizeof FLOAT_DT / sizeof *FLOAT_DT; t++) {
    em_dtype dt = FLOAT_DT[t];
    em_tensor *h = make_rand(S, dt, SHP(4, 1, 6));
    for (int c = 0; c < 2; c++)
      for (int sq = 0; sq < 2; sq++)
        for (int m = 0; m < 3; m++) {
          const int *dims = m == 0 ? D0 : m == 1 ? D2 : NULL;
          spec sp = {OP_VAR, EM_SUM, dims, m < 2, m == 1, (double)c, sq, 0, 0};
          snprintf(what, sizeof what, "%s %s c=%d mask %d", sq ? "std" : "var",
                   em_dtype_name(dt), c, m);
          compare(S, what, &sp, h, 0);
          compare(S, what, &sp, h, 1);
        }
    for (int i = 0; i < 7; i++)
      for (int m = 0; m < 3; m++) {
        const int *dims = m == 0 ? D0 : m == 1 ? D2 : NULL;
        spec sp = {OP_NORM, EM_SUM, dims, m < 2, 0, ps[i], 0, 0, 0};
        snprintf(what, sizeof what, "norm p=%g %s mask %d", ps[i], em_dtype_name(dt), m);
        compare(S, what, &sp, h, 0);
        compare(S, what, &sp, h, 2);
      }
    /* correction larger than the count: inf/nan as the CPU */
    spec sv = {OP_VAR, EM_SUM, D0, 1, 0, 5, 0, 0, 0};
    compare(S, "var correction 5", &sv, h, 0);
    em_tensor_release(h);
  }
}

static void test_arg_softmax(em_state *S) {
  char what[160];
  for (size_t t = 0; t < sizeof ALL_DT / sizeof *ALL_DT; t++) {
    em_dtype dt = ALL_DT[t];
    em_tensor *h = make_rand(S, dt, SHP(6, 5, 4)), *h1 = make_rand(S, dt, SHP(1, 5, 4)),
              *ties;
    /* many ties: each row holds its extreme several times */
    REQUIRE_OK(S, t_make(S, &ties, dt, SHP(3, 40), V(
      1,0,1,0,1,1,0,0,1,0, 1,0,1,0,1,1,0,0,1,0, 1,0,1,0,1,1,0,0,1,0, 1,0,1,0,1,1,0,0,1,0,
      0,0,0,0,0,0,0,0,0,0, 0,0,0,0,0,0,0,0,0,0, 0,0,0,0,0,0,0,0,0,0, 0,0,0,0,0,0,0,0,0,1,
      1,1,1,1,1,1,1,1,1,1, 1,1,1,1,1,1,1,1,1,1, 1,1,1,1,1,1,1,1,1,1, 1,1,1,1,1,1,1,1,1,0)));
    for (int base = 0; base < 2; base++)
      for (int dim = -1; dim < 3; dim++)
        for (int k = 0; k < 4; k++) {
          int op = k < 2 ? OP_MAXDIM : k == 2 ? OP_ARGMAX : OP_ARGMIN;
          spec sp = {op, EM_SUM, NULL, 0, dim == 1, 0, k == 0, dim, base};
          snprintf(what, sizeof what, "arg op %d %s dim %d base %d", k, em_dtype_name(dt),
                   dim, base);
          compare(S, what, &sp, h, 0);
          if (dim < 2) {
            compare(S, what, &sp, ties, 0);
            compare(S, what, &sp, ties, 1);
          }
          if (dim == 0) {
            spec all = sp;
            all.ndims = 1;     /* over the flattened tensor */
            if (op != OP_MAXDIM) compare(S, what, &all, h, 1);
          }
        }
    if (em_dtype_is_floating(dt))
      for (int lg = 0; lg < 2; lg++)
        for (int dim = -1; dim < 3; dim++) {
          spec sp = {OP_SOFTMAX, EM_SUM, NULL, 0, 0, 0, lg, dim, 0};
          snprintf(what, sizeof what, "%s %s dim %d", lg ? "log_softmax" : "softmax",
                   em_dtype_name(dt), dim);
          compare(S, what, &sp, h, 0);
          compare(S, what, &sp, h, 1);
          compare(S, what, &sp, h1, 2);   /* expanded, stride 0 */
        }
    em_tensor_release(h); em_tensor_release(h1); em_tensor_release(ties);
  }
}

/* A tensor of n integer values (i % m) - off: sums of these in double are exact
** whatever the order, so the device's split sums must match exactly. */
static em_tensor *make_ints(em_state *S, em_dtype dt, const int64_t *shape, int nd, int m,
                            int off, double *sum) {
  int64_t n = 1;
  for (int k = 0; k < nd; k++) n *= shape[k];
  double *v = malloc(sizeof(double) * (size_t)n);
  *sum = 0;
  for (int64_t i = 0; i < n; i++) *sum += v[i] = (double)(i % m - off);
  em_tensor *t = NULL;
  em_from_data(S, shape, nd, dt, v, EM_FLOAT64, &t);
  free(v);
  return t;
}

/* the device's full sum of h (keeps dtype) as a double; NAN on failure */
static double device_sum(em_state *S, em_tensor *h) {
  em_tensor *d = NULL, *g = NULL, *gh = NULL;
  double r = NAN;
  if (!em_to(S, h, em_tensor_dtype(h), 0, &d) && !em_reduce(S, EM_SUM, d, NULL, 0, 0, &g) &&
      !em_to(S, g, em_tensor_dtype(g), EM_CPU, &gh))
    r = t_get(gh, 0);
  em_tensor_release(d); em_tensor_release(g); em_tensor_release(gh);
  return r;
}

/* Few outputs with long slices: the split work (many blocks per output and a
** combine in chunk order) against the CPU, within tol_of's per-dtype tolerance
** relative to the slice's mean |x| for sums (the order of a double sum differs
** from the CPU's; the error is ~1e-16 * sqrt(n) of that), bit-identical twice. */
static void test_split(em_state *S) {
  char what[160];
  /* Under the sanitizers 2^14 + 3: still split (split_of needs 2 * SPLIT_MIN =
  ** 8192 elements), in 4 chunks with a short last one, where 2^20 + 3 makes 256. */
  const int64_t N1 = (CHECK_SANITIZED ? (1 << 14) : (1 << 20)) + 3;
  const int64_t N24 = CHECK_SANITIZED ? (1 << 16) : (1 << 24);
  em_dtype dts[] = {EM_FLOAT32, EM_FLOAT64};
  for (int t = 0; t < 2; t++) {
    em_dtype dt = dts[t];
    const char *dn = em_dtype_name(dt);
    em_tensor *h = make_rand(S, dt, SHP(N1)), *h2 = make_rand(S, dt, SHP(3, N1)),
              *hc = make_rand(S, dt, SHP(N1, 3)), *he = make_rand(S, dt, SHP(1, N1));
    em_redop ops[] = {EM_SUM, EM_MEAN, EM_AMAX, EM_AMIN, EM_LOGSUMEXP, EM_ALL};
    const char *on[] = {"sum", "mean", "amax", "amin", "logsumexp", "all"};
    for (int o = 0; o < 6; o++) {
      spec sp = {OP_REDUCE, ops[o], NULL, 0, 0, 0, 0, 0, 0};
      snprintf(what, sizeof what, "split %s %s n", on[o], dn);
      compare(S, what, &sp, h, 0);
      compare(S, what, &sp, h, 3);                   /* misaligned start */
      snprintf(what, sizeof what, "split %s %s (3, n) all", on[o], dn);
      compare(S, what, &sp, h2, 1);                  /* transposed */
      spec sr = {OP_REDUCE, ops[o], DM1, 1, 1, 0, 0, 0, 0};
      snprintf(what, sizeof what, "split %s %s (3, n) dim -1", on[o], dn);
      compare(S, what, &sr, h2, 0);
      compare(S, what, &sr, h2, 3);
      spec sc = {OP_REDUCE, ops[o], D0, 1, 0, 0, 0, 0, 0};
      snprintf(what, sizeof what, "split %s %s (n, 3) dim 0 (strided)", on[o], dn);
      compare(S, what, &sc, hc, 0);
      snprintf(what, sizeof what, "split %s %s expanded (5, n)", on[o], dn);
      compare(S, what, &sp, he, 2);                  /* stride 0 */
    }
    for (int sq = 0; sq < 2; sq++) {
      spec sv = {OP_VAR, EM_SUM, NULL, 0, 0, 1, sq, 0, 0};
      snprintf(what, sizeof what, "split %s %s", sq ? "std" : "var", dn);
      compare(S, what, &sv, h, 0);
      compare(S, what, &sv, he, 2);
      spec sv1 = {OP_VAR, EM_SUM, DM1, 1, 0, 0, sq, 0, 0};
      compare(S, what, &sv1, h2, 3);
    }
    double ps[] = {2, 1, 3, INFINITY};
    for (int i = 0; i < 4; i++) {
      spec sn = {OP_NORM, EM_SUM, NULL, 0, 0, ps[i], 0, 0, 0};
      snprintf(what, sizeof what, "split norm p=%g %s", ps[i], dn);
      compare(S, what, &sn, h, 0);
      compare(S, what, &sn, h2, 1);
    }
    for (int mx = 0; mx < 2; mx++) {
      spec sa = {mx ? OP_ARGMAX : OP_ARGMIN, EM_SUM, NULL, 1, 0, 0, 0, 0, 1};
      snprintf(what, sizeof what, "split %s %s", mx ? "argmax" : "argmin", dn);
      compare(S, what, &sa, h, 0);
      compare(S, what, &sa, h, 3);
      spec sm = {OP_MAXDIM, EM_SUM, NULL, 0, 0, 0, mx, 1, 0};
      snprintf(what, sizeof what, "split max/min dim 1 %s", dn);
      compare(S, what, &sm, h2, 0);
      compare(S, what, &sm, hc, 1);
    }
    /* long rows for softmax (a block per row) and many short ones (a warp per row) */
    em_tensor *hs = make_rand(S, dt, SHP(4, 100003)), *hw = make_rand(S, dt, SHP(3000, 77));
    for (int lg = 0; lg < 2; lg++) {
      spec sm = {OP_SOFTMAX, EM_SUM, NULL, 0, 0, 0, lg, 1, 0};
      snprintf(what, sizeof what, "%s %s long rows", lg ? "log_softmax" : "softmax", dn);
      compare(S, what, &sm, hs, 0);
      compare(S, what, &sm, hs, 3);
      snprintf(what, sizeof what, "%s %s warp rows", lg ? "log_softmax" : "softmax", dn);
      compare(S, what, &sm, hw, 0);
      compare(S, what, &sm, hw, 3);
      spec s0 = {OP_SOFTMAX, EM_SUM, NULL, 0, 0, 0, lg, 0, 0};
      compare(S, what, &s0, hs, 1);
    }
    spec rs = {OP_REDUCE, EM_SUM, DM1, 1, 0, 0, 0, 0, 0};
    compare(S, "warp rows sum", &rs, hw, 0);
    compare(S, "warp rows sum", &rs, hw, 3);
    em_tensor_release(hs); em_tensor_release(hw);
    em_tensor_release(h); em_tensor_release(h2); em_tensor_release(hc);
    em_tensor_release(he);
  }
  /* integer-valued floats: exact sums, so the split must give the closed form */
  struct { em_dtype dt; int64_t n; } ex[] = {{EM_FLOAT64, N1}, {EM_FLOAT32, N1},
                                             {EM_FLOAT32, N24}, {EM_FLOAT64, N24}};
  for (int t = 0; t < 4; t++) {
    double want;
    int64_t n = ex[t].n;
    em_tensor *h = make_ints(S, ex[t].dt, &n, 1, 13, 5, &want);
    if (!h) { CHECK(0, "make_ints %lld", (long long)n); continue; }
    double w = ex[t].dt == EM_FLOAT32 ? (double)(float)want : want;
    double g1 = device_sum(S, h), g2 = device_sum(S, h);
    CHECK(g1 == w, "exact sum %s %lld: cuda %.17g, closed form %.17g",
          em_dtype_name(ex[t].dt), (long long)n, g1, w);
    CHECK(memcmp(&g1, &g2, sizeof g1) == 0, "exact sum %s: two runs differ",
          em_dtype_name(ex[t].dt));
    spec sp = {OP_REDUCE, EM_SUM, NULL, 0, 0, 0, 0, 0, 0};
    snprintf(what, sizeof what, "split sum %s %lld", em_dtype_name(ex[t].dt), (long long)n);
    if (n < N24 || ex[t].dt == EM_FLOAT32) {
      compare(S, what, &sp, h, 0);
      spec sm = {OP_REDUCE, EM_MEAN, NULL, 0, 0, 0, 0, 0, 0};
      compare(S, what, &sm, h, 0);
      spec sn = {OP_NORM, EM_SUM, NULL, 0, 0, 2, 0, 0, 0};
      compare(S, what, &sn, h, 0);
      spec sa = {OP_ARGMAX, EM_SUM, NULL, 1, 0, 0, 0, 0, 0};
      compare(S, what, &sa, h, 0);
    }
    em_tensor_release(h);
  }
  /* integers: int64 sums wrap the same in any order */
  em_tensor *hi = make_rand(S, EM_INT32, SHP(N1)), *hl = make_rand(S, EM_INT64, SHP(2, N1));
  em_redop iops[] = {EM_SUM, EM_AMAX, EM_PROD, EM_ANY};
  for (int o = 0; o < 4; o++) {
    spec sp = {OP_REDUCE, iops[o], NULL, 0, 0, 0, 0, 0, 0};
    snprintf(what, sizeof what, "split int32 %s", OPN[iops[o]]);
    compare(S, what, &sp, hi, 0);
    spec sr = {OP_REDUCE, iops[o], DM1, 1, 0, 0, 0, 0, 0};
    snprintf(what, sizeof what, "split int64 rows %s", OPN[iops[o]]);
    compare(S, what, &sr, hl, 0);
    compare(S, what, &sr, hl, 3);
  }
  spec sa = {OP_ARGMIN, EM_SUM, NULL, 1, 0, 0, 0, 0, 0};
  compare(S, "split int32 argmin", &sa, hi, 0);
  em_tensor_release(hi); em_tensor_release(hl);
}

int main(void) {
  em_state *S;
  if (cuda_check_open(&S, "1:256")) return 1;
  RUN(test_reduce_ops, S);
  RUN(test_special, S);
  RUN(test_var_norm, S);
  RUN(test_arg_softmax, S);
  RUN(test_large, S);
  RUN(test_split, S);
  em_close(S);
  return check_done();
}

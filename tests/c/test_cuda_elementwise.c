/*
** test_cuda_elementwise.c -- the CUDA backend's element-wise kernels and
** conversions (kernels/k_elementwise.c) on the emulated runtime: every unary and
** binary op for every dtype the CPU accepts, tensor-scalar (both sides, pow's
** special exponents), a + alpha*b, clamp, where, the in-place forms, and casts
** between every pair of dtypes, run on the CPU and on cuda:0 and compared element
** by element. Shapes cross block boundaries, broadcast, are strided (transposed,
** stepped), 0-d and empty. Tolerances: bit-exact except the float32 ops the CPU
** computes with its vectorised approximations (vmath.h: exp log tanh sigmoid
** gelu silu erf gelu_tanh, up to 2.6 ulp), which get 1e-5 relative + 1e-6
** absolute in float32 (one unit of the result's rounding in float16/bfloat16).
*/
#include "cuda_check.h"
#include <stdlib.h>

static const em_dtype ALL[] = {EM_BOOL, EM_UINT8, EM_INT32, EM_INT64, EM_FLOAT16,
                               EM_BFLOAT16, EM_FLOAT32, EM_FLOAT64};
enum { NDT = 8 };

static uint64_t rnd(void) { return cuda_check_rand(); }

/* Random values of dt's kind: floats mostly in [-10, 10] with zeros, -0, large
** values, inf and NaN sprinkled in; integers negative and positive, some large;
** nonzero: no zeros (integer divisors). */
static em_status rand_tensor(em_state *S, em_dtype dt, const int64_t *shape, int ndim,
                             int nonzero, em_tensor **out) {
  int64_t n = 1;
  for (int d = 0; d < ndim; d++) n *= shape[d];
  double *v = malloc(sizeof(double) * (size_t)(n ? n : 1));
  for (int64_t i = 0; i < n; i++) {
    uint64_t r = rnd();
    double x;
    switch (dt) {
    case EM_BOOL: x = r & 1; break;
    case EM_UINT8: x = (double)(r % 256); break;
    case EM_INT32:
      x = r % 17 == 0 ? (double)(int32_t)(uint32_t)(r >> 20) : (double)((int64_t)(r % 41) - 20);
      break;
    case EM_INT64:
      x = r % 17 == 0 ? (double)((int64_t)(r >> 12) - (1ll << 51)) : (double)((int64_t)(r % 41) - 20);
      break;
    default: {
      unsigned k = (unsigned)(r % 64);
      x = ((double)(r >> 11) / 9007199254740992.0) * 20 - 10;
      if (k == 0) x = 0;
      else if (k == 1) x = -0.0;
      else if (k == 2) x = NAN;
      else if (k == 3) x = INFINITY;
      else if (k == 4) x = -INFINITY;
      else if (k == 5) x = x * 1e4;
      else if (k == 6) x = x * 1e-4;
      else if (k == 7) x = (double)((int)x);          /* integral values, halves */
      else if (k == 8) x = (double)((int)x) + 0.5;
      break;
    }
    }
    if (nonzero && x == 0) x = dt == EM_BOOL ? 1 : 3;
    v[i] = x;
  }
  em_status st = em_from_data(S, shape, ndim, dt, v, EM_FLOAT64, out);
  free(v);
  return st;
}

/* On a real GPU (EMBER_TEST_REAL_CUDA set: no emulation) every libm function is
** CUDA's own, within a few ulp of the host's; on the emulator they are the host's. */
static int real_gpu;

static int approx_op(int unop) {
  switch (unop) {
  case EM_EXP: case EM_LOG: case EM_TANH: case EM_SIGMOID: case EM_GELU: case EM_SILU:
  case EM_ERF: case EM_GELU_TANH:
    return 1;
  case EM_SIN: case EM_COS: case EM_LOG1P: case EM_EXPM1: case EM_LOG2: case EM_LOG10:
  case EM_TAN: case EM_ASIN: case EM_ACOS: case EM_ATAN: case EM_SINH: case EM_COSH:
    return real_gpu ? 2 : 0;
  default: return 0;
  }
}

static double bin_tol(int op, em_dtype dt) {
  if (!real_gpu || (op != EM_POW && op != EM_ATAN2)) return 0;
  return dt == EM_FLOAT64 ? 1e-14 : dt == EM_FLOAT32 ? 1e-5 : dt == EM_FLOAT16 ? 1.0 / 1024
         : dt == EM_BFLOAT16 ? 1.0 / 128 : 0;
}

/* Tolerance for a result of dtype dt: 0 (bit-exact), or a relative one when the
** CPU's value came from an approximation. */
static double tol_of(em_dtype dt, int approx) {
  if (!approx) return 0;
  switch (dt) {
  case EM_FLOAT32: return 1e-5;
  case EM_FLOAT16: return 1.0 / 1024;
  case EM_BFLOAT16: return 1.0 / 128;
  case EM_FLOAT64: return real_gpu ? 1e-14 : 0;     /* the host libm on the emulator */
  default: return 0;
  }
}

static char why[512];

/* got (on the device) equals want (on the CPU) element by element: same dtype and
** shape, NaN where NaN, within tol relative (+ tol/10 absolute). */
static int same(em_state *S, const em_tensor *want, const em_tensor *got, double tol) {
  em_tensor *g = NULL;
  why[0] = 0;
  if (em_tensor_device(got) != 0) { snprintf(why, sizeof why, "not on cuda:0"); return 0; }
  if (em_tensor_dtype(want) != em_tensor_dtype(got)) {
    snprintf(why, sizeof why, "dtype %s, want %s", em_dtype_name(em_tensor_dtype(got)),
             em_dtype_name(em_tensor_dtype(want)));
    return 0;
  }
  if (!t_shape_is(got, em_tensor_sizes(want), em_tensor_ndim(want), why, sizeof why)) return 0;
  if (em_to(S, got, em_tensor_dtype(got), EM_CPU, &g)) {
    snprintf(why, sizeof why, "to cpu: %s", em_errmsg(S));
    return 0;
  }
  int ok = 1;
  for (int64_t i = 0; i < em_tensor_numel(want) && ok; i++) {
    double w = t_get(want, i), x = t_get(g, i);
    if (w != w && x != x) continue;
    if (w == x && signbit(w) == signbit(x)) continue;
    if (tol > 0 && isfinite(w) && isfinite(x) && fabs(x - w) <= tol * fabs(w) + tol / 10)
      continue;
    if (w == 0 && x == 0 && em_tensor_dtype(want) != EM_FLOAT32 &&
        em_tensor_dtype(want) != EM_FLOAT64 && tol > 0)
      continue;
    snprintf(why, sizeof why, "element %lld is %.17g, want %.17g", (long long)i, x, w);
    ok = 0;
  }
  em_tensor_release(g);
  return ok;
}

static em_tensor *dev(em_state *S, const em_tensor *h) {
  em_tensor *d = NULL;
  if (em_to(S, h, em_tensor_dtype(h), 0, &d)) {
    printf("  em_to cuda:0 failed: %s\n", em_errmsg(S));
    return NULL;
  }
  /* A copy to the device reads the host tensor when the stream gets to it: the
  ** tests change host inputs in place later, so wait for it here (a read back
  ** syncs the stream). */
  em_tensor *sync = NULL;
  if (em_to(S, d, em_tensor_dtype(d), EM_CPU, &sync)) printf("  sync: %s\n", em_errmsg(S));
  em_tensor_release(sync);
  return d;
}

/* Input layouts: contiguous (1000), long (70000, crossing blocks and the grid),
** transposed (40, 30)^T, stepped (every 3rd element, as_strided), 0-d, empty. */
enum { L_FLAT, L_LONG, L_T, L_STEP, L_0D, L_EMPTY, NLAYOUT };
static const char *LNAME[] = {"flat", "long", "transposed", "stepped", "0-d", "empty"};

/* a host tensor of layout l and its device twin with the same layout */
static int make_pair(em_state *S, em_dtype dt, int l, int nonzero, em_tensor **h,
                     em_tensor **d) {
  em_tensor *base = NULL, *dbase = NULL;
  em_status st = EM_OK;
  *h = *d = NULL;
  switch (l) {
  case L_FLAT: st = rand_tensor(S, dt, SHP(1000), nonzero, &base); break;
  case L_LONG: st = rand_tensor(S, dt, SHP(70000), nonzero, &base); break;
  case L_T: st = rand_tensor(S, dt, SHP(30, 40), nonzero, &base); break;
  case L_STEP: st = rand_tensor(S, dt, SHP(600), nonzero, &base); break;
  case L_0D: st = rand_tensor(S, dt, NULL, 0, nonzero, &base); break;
  default: st = rand_tensor(S, dt, SHP(0, 3), nonzero, &base); break;
  }
  if (st || !(dbase = dev(S, base))) { em_tensor_release(base); return 0; }
  if (l == L_T) {
    em_transpose(S, base, 0, 1, h);
    em_transpose(S, dbase, 0, 1, d);
  } else if (l == L_STEP) {
    em_as_strided(S, base, (const int64_t[]){10, 20}, (const int64_t[]){60, 3}, 2, 1, h);
    em_as_strided(S, dbase, (const int64_t[]){10, 20}, (const int64_t[]){60, 3}, 2, 1, d);
  } else {
    em_tensor_retain(base);
    em_tensor_retain(dbase);
    *h = base;
    *d = dbase;
  }
  em_tensor_release(base);
  em_tensor_release(dbase);
  return *h && *d;
}

static void test_unary(em_state *S) {
  for (int op = 0; op < EM_NUM_UNOPS; op++)
    for (int k = 0; k < NDT; k++)
      for (int l = 0; l < NLAYOUT; l++) {
        em_dtype dt = ALL[k];
        if (l == L_LONG && dt != EM_FLOAT32 && dt != EM_INT32) continue;
        em_tensor *h, *d, *want = NULL, *got = NULL;
        if (!make_pair(S, dt, l, 0, &h, &d)) { CHECK(0, "inputs"); continue; }
        em_status sw = em_unary(S, op, h, &want);
        em_status sg = em_unary(S, op, d, &got);
        if (sw) {
          CHECK(sg != EM_OK, "%s %s: the cpu refuses, so does cuda", em_unop_name(op),
                em_dtype_name(dt));
        } else if (sg) {
          CHECK(0, "%s %s %s: %s", em_unop_name(op), em_dtype_name(dt), LNAME[l],
                em_errmsg(S));
        } else {
          double tol = tol_of(em_tensor_dtype(want), approx_op(op));
          CHECK(same(S, want, got, tol), "%s %s %s: %s", em_unop_name(op),
                em_dtype_name(dt), LNAME[l], why);
        }
        em_tensor_release(h); em_tensor_release(d);
        em_tensor_release(want); em_tensor_release(got);
      }
}

/* b for a: same layout, or broadcast shapes */
static void test_binary(em_state *S) {
  for (int op = 0; op < EM_NUM_BINOPS; op++)
    for (int k = 0; k < NDT; k++)
      for (int l = 0; l <= NLAYOUT; l++) {      /* NLAYOUT: broadcast (3,1,5) op (4,5) */
        em_dtype dt = ALL[k];
        if (l == L_LONG && dt != EM_FLOAT32 && dt != EM_INT64) continue;
        int nz = op == EM_REMAINDER;
        em_tensor *ha, *da, *hb, *db, *want = NULL, *got = NULL;
        if (l == NLAYOUT) {
          REQUIRE_OK(S, rand_tensor(S, dt, SHP(3, 1, 5), 0, &ha));
          REQUIRE_OK(S, rand_tensor(S, dt, SHP(4, 5), nz, &hb));
          da = dev(S, ha);
          db = dev(S, hb);
        } else if (!make_pair(S, dt, l, 0, &ha, &da) || !make_pair(S, dt, l, nz, &hb, &db)) {
          CHECK(0, "inputs");
          continue;
        }
        em_status sw = em_binary(S, op, ha, hb, &want);
        em_status sg = em_binary(S, op, da, db, &got);
        const char *ln = l == NLAYOUT ? "broadcast" : LNAME[l];
        if (sw) {
          CHECK(sg != EM_OK, "%s %s: the cpu refuses, so does cuda", em_binop_name(op),
                em_dtype_name(dt));
        } else if (sg) {
          CHECK(0, "%s %s %s: %s", em_binop_name(op), em_dtype_name(dt), ln, em_errmsg(S));
        } else {
          CHECK(same(S, want, got, bin_tol(op, em_tensor_dtype(want))), "%s %s %s: %s",
                em_binop_name(op), em_dtype_name(dt), ln, why);
        }
        em_tensor_release(ha); em_tensor_release(da);
        em_tensor_release(hb); em_tensor_release(db);
        em_tensor_release(want); em_tensor_release(got);
      }
}

/* mixed dtypes: the ops layer converts on the device (casts), then the kernel */
static void test_mixed(em_state *S) {
  for (int i = 0; i < NDT; i++)
    for (int j = 0; j < NDT; j++) {
      em_tensor *ha, *hb, *da, *db, *want = NULL, *got = NULL;
      REQUIRE_OK(S, rand_tensor(S, ALL[i], SHP(4, 5), 0, &ha));
      REQUIRE_OK(S, rand_tensor(S, ALL[j], SHP(5), 0, &hb));
      da = dev(S, ha);
      db = dev(S, hb);
      em_binop ops[] = {EM_ADD, EM_MUL, EM_LT};
      for (int o = 0; o < 3; o++) {
        em_status sw = em_binary(S, ops[o], ha, hb, &want);
        em_status sg = em_binary(S, ops[o], da, db, &got);
        if (sw) CHECK(sg != EM_OK, "refused on both");
        else
          CHECK(!sg && same(S, want, got, 0), "%s %s %s: %s", em_binop_name(ops[o]),
                em_dtype_name(ALL[i]), em_dtype_name(ALL[j]), sg ? em_errmsg(S) : why);
        em_tensor_release(want); em_tensor_release(got);
        want = got = NULL;
      }
      em_tensor_release(ha); em_tensor_release(hb);
      em_tensor_release(da); em_tensor_release(db);
    }
}

static void test_scalar(em_state *S) {
  const double SC[] = {2.5, -3, 0, 2, 0.5, -1, -0.5, 3, -2, 1e10, 0.1};
  for (int op = 0; op < EM_NUM_BINOPS; op++)
    for (int k = 0; k < NDT; k++)
      for (size_t si = 0; si < sizeof SC / sizeof *SC; si++)
        for (int rev = 0; rev < 2; rev++) {
          em_dtype dt = ALL[k];
          em_tensor *h, *d, *want = NULL, *got = NULL;
          int l = si == 0 ? L_T : L_FLAT;
          if (!make_pair(S, dt, l, op == EM_REMAINDER && rev, &h, &d)) { CHECK(0, "in"); continue; }
          em_status sw = em_binary_scalar(S, op, h, SC[si], rev, &want);
          em_status sg = em_binary_scalar(S, op, d, SC[si], rev, &got);
          if (sw) {
            CHECK(sg != EM_OK, "%s %s %g: the cpu refuses (%s), so does cuda",
                  em_binop_name(op), em_dtype_name(dt), SC[si], em_errmsg(S));
          } else if (sg) {
            CHECK(0, "%s %s %g rev %d: %s", em_binop_name(op), em_dtype_name(dt), SC[si],
                  rev, em_errmsg(S));
          } else {
            CHECK(same(S, want, got, bin_tol(op, em_tensor_dtype(want))),
                  "%s %s %g rev %d: %s", em_binop_name(op), em_dtype_name(dt), SC[si],
                  rev, why);
          }
          em_tensor_release(h); em_tensor_release(d);
          em_tensor_release(want); em_tensor_release(got);
        }
}

static void test_division_by_zero(em_state *S) {
  em_tensor *h, *z, *d, *dz, *x;
  REQUIRE_OK(S, t_make(S, &h, EM_INT32, SHP(3), V(5, -7, 9)));
  REQUIRE_OK(S, t_make(S, &z, EM_INT32, SHP(3), V(2, 0, 3)));
  d = dev(S, h);
  dz = dev(S, z);
  CHECK_ERR(S, em_binary(S, EM_REMAINDER, d, dz, &x), EM_ERR_ARG, "remainder",
            "division by zero");
  CHECK_ERR(S, em_binary_scalar(S, EM_REMAINDER, d, 0, 0, &x), EM_ERR_ARG,
            "division by zero");
  REQUIRE_OK(S, em_binary(S, EM_REMAINDER, dz, d, &x));     /* zeros as dividends */
  em_tensor *w;
  REQUIRE_OK(S, em_binary(S, EM_REMAINDER, z, h, &w));
  CHECK(same(S, w, x, 0), "0 %% x: %s", why);
  em_tensor_release(w); em_tensor_release(x);
  em_tensor_release(h); em_tensor_release(z); em_tensor_release(d); em_tensor_release(dz);
}

static void test_add_scaled_clamp_where(em_state *S) {
  const double AL[] = {1, -2.5, 0, 0.1};
  const double LO[] = {-1.5, -INFINITY, 3, -1e30, 0}, HI[] = {2.5, 0, -3, 1e30, INFINITY};
  for (int k = 0; k < NDT; k++) {
    em_dtype dt = ALL[k];
    em_tensor *ha, *hb, *da, *db, *want, *got;
    REQUIRE_OK(S, rand_tensor(S, dt, SHP(3, 1, 5), 0, &ha));
    REQUIRE_OK(S, rand_tensor(S, dt, SHP(4, 5), 0, &hb));
    da = dev(S, ha);
    db = dev(S, hb);
    for (int i = 0; i < 4; i++) {
      want = got = NULL;
      em_status sw = em_add_scaled(S, ha, hb, AL[i], &want);
      em_status sg = em_add_scaled(S, da, db, AL[i], &got);
      if (sw) CHECK(sg, "add_scaled refused on both");
      else
        CHECK(!sg && same(S, want, got, tol_of(dt, 1) / 8), "add_scaled %s %g: %s",
              em_dtype_name(dt), AL[i], sg ? em_errmsg(S) : why);
      em_tensor_release(want); em_tensor_release(got);
    }
    for (int i = 0; i < 5; i++) {
      want = got = NULL;
      em_status sw = em_clamp(S, hb, LO[i], HI[i], &want);
      em_status sg = em_clamp(S, db, LO[i], HI[i], &got);
      if (sw) CHECK(sg, "clamp refused on both");
      else
        CHECK(!sg && same(S, want, got, 0), "clamp %s [%g, %g]: %s", em_dtype_name(dt),
              LO[i], HI[i], sg ? em_errmsg(S) : why);
      em_tensor_release(want); em_tensor_release(got);
    }
    /* where: cond (4, 1) broadcast against a (3, 1, 5) and b (4, 5) */
    em_tensor *hc, *dc;
    REQUIRE_OK(S, rand_tensor(S, EM_BOOL, SHP(4, 1), 0, &hc));
    dc = dev(S, hc);
    want = got = NULL;
    REQUIRE_OK(S, em_where(S, hc, ha, hb, &want));
    CHECK_OK(S, em_where(S, dc, da, db, &got));
    CHECK(same(S, want, got, 0), "where %s: %s", em_dtype_name(dt), why);
    em_tensor_release(want); em_tensor_release(got);
    em_tensor_release(hc); em_tensor_release(dc);
    em_tensor_release(ha); em_tensor_release(hb); em_tensor_release(da); em_tensor_release(db);
  }
}

/* in-place forms write into the device tensor (a transposed view, too) */
static void test_in_place(em_state *S) {
  for (int k = 0; k < NDT; k++) {
    em_dtype dt = ALL[k];
    for (int form = 0; form < 5; form++) {
      em_tensor *ha, *da, *hb, *db;
      if (!make_pair(S, dt, form & 1 ? L_T : L_FLAT, 0, &ha, &da) ||
          !make_pair(S, dt, form & 1 ? L_T : L_FLAT, 1, &hb, &db)) {
        CHECK(0, "inputs");
        continue;
      }
      em_status sw, sg;
      switch (form) {
      case 0: sg = em_binary_(S, EM_MUL, da, db); sw = em_binary_(S, EM_MUL, ha, hb); break;
      case 1: sg = em_unary_(S, EM_ABS, da); sw = em_unary_(S, EM_ABS, ha); break;
      case 2:
        sg = em_binary_scalar_(S, EM_ADD, da, 3);
        sw = em_binary_scalar_(S, EM_ADD, ha, 3);
        break;
      case 3: sg = em_add_scaled_(S, da, db, 2); sw = em_add_scaled_(S, ha, hb, 2); break;
      default: sg = em_clamp_(S, da, -2, 5); sw = em_clamp_(S, ha, -2, 5); break;
      }
      if (sw) CHECK(sg, "form %d %s refused on both", form, em_dtype_name(dt));
      else
        CHECK(!sg && same(S, ha, da, 0), "in-place form %d %s: %s", form,
              em_dtype_name(dt), sg ? em_errmsg(S) : why);
      em_tensor_release(ha); em_tensor_release(da);
      em_tensor_release(hb); em_tensor_release(db);
    }
  }
  /* a float tensor += an int tensor (converted on the device first) */
  em_tensor *ha, *hb, *da, *db;
  REQUIRE_OK(S, rand_tensor(S, EM_FLOAT32, SHP(4, 5), 0, &ha));
  REQUIRE_OK(S, rand_tensor(S, EM_INT32, SHP(5), 0, &hb));
  da = dev(S, ha);
  db = dev(S, hb);
  CHECK_OK(S, em_binary_(S, EM_ADD, da, db));
  REQUIRE_OK(S, em_binary_(S, EM_ADD, ha, hb));
  CHECK(same(S, ha, da, 0), "float32 += int32: %s", why);
  em_tensor_release(ha); em_tensor_release(da); em_tensor_release(hb); em_tensor_release(db);
}

static void test_casts(em_state *S) {
  for (int i = 0; i < NDT; i++)
    for (int j = 0; j < NDT; j++)
      for (int l = 0; l < NLAYOUT; l++) {
        if (l == L_LONG) continue;
        em_tensor *h, *d, *want = NULL, *got = NULL;
        if (!make_pair(S, ALL[i], l, 0, &h, &d)) { CHECK(0, "inputs"); continue; }
        REQUIRE_OK(S, em_to(S, h, ALL[j], EM_CPU, &want));
        CHECK_OK(S, em_to(S, d, ALL[j], 0, &got));
        CHECK(got && same(S, want, got, 0), "%s -> %s %s: %s", em_dtype_name(ALL[i]),
              em_dtype_name(ALL[j]), LNAME[l], why);
        em_tensor_release(want); em_tensor_release(got);
        /* into a strided (transposed) destination on the device */
        if (l == L_T) {
          em_tensor *hd, *dd, *hv, *dv;
          REQUIRE_OK(S, em_full(S, SHP(30, 40), 7, ALL[j], EM_CPU, &hd));
          REQUIRE_OK(S, em_full(S, SHP(30, 40), 7, ALL[j], 0, &dd));
          REQUIRE_OK(S, em_transpose(S, hd, 0, 1, &hv));
          REQUIRE_OK(S, em_transpose(S, dd, 0, 1, &dv));
          REQUIRE_OK(S, em_copy_(S, hv, h));
          CHECK_OK(S, em_copy_(S, dv, d));
          CHECK(same(S, hd, dd, 0), "%s -> %s into a transposed view: %s",
                em_dtype_name(ALL[i]), em_dtype_name(ALL[j]), why);
          em_tensor_release(hd); em_tensor_release(dd);
          em_tensor_release(hv); em_tensor_release(dv);
        }
        em_tensor_release(h); em_tensor_release(d);
      }
  /* conversions at the edges: NaN, inf, out of range, rounding to float16 */
  em_tensor *h, *d, *want, *got;
  REQUIRE_OK(S, t_make(S, &h, EM_FLOAT64, SHP(10),
                       V(NAN, INFINITY, -INFINITY, 1e20, -1e20, 300.7, -1.5, 65520,
                         1.0000001, 3e-8)));
  d = dev(S, h);
  for (int j = 0; j < NDT; j++) {
    want = got = NULL;
    REQUIRE_OK(S, em_to(S, h, ALL[j], EM_CPU, &want));
    CHECK_OK(S, em_to(S, d, ALL[j], 0, &got));
    CHECK(got && same(S, want, got, 0), "edges -> %s: %s", em_dtype_name(ALL[j]), why);
    em_tensor_release(want); em_tensor_release(got);
  }
  em_tensor_release(h); em_tensor_release(d);
}

int main(void) {
  real_gpu = getenv("EMBER_TEST_REAL_CUDA") != NULL;
  em_state *S;
  if (cuda_check_open(&S, "1")) return 1;
  RUN(test_casts, S);
  RUN(test_unary, S);
  RUN(test_binary, S);
  RUN(test_mixed, S);
  RUN(test_scalar, S);
  RUN(test_division_by_zero, S);
  RUN(test_add_scaled_clamp_where, S);
  RUN(test_in_place, S);
  em_close(S);
  return check_done();
}

/*
** test_nn_kernels.c -- the nn kernels (conv2d, pooling, losses, batch/layer
** norm, index_add_/scatter_add_) against PyTorch 1.13 values from
** tests/fixtures/nn_kernels.txt (gen_nn.py), forward and backward, in float32
** and float64, with contiguous and non-contiguous inputs; finite-difference
** checks of the backward kernels in float64; and the error messages.
*/
#include "check.h"

/* -- Fixture file: "name ndim sizes... values..." per line ---------------------- */
#include "fixtures.h"

/* A tensor of dtype dt from fixture array; nc: a non-contiguous view (last two
** dims transposed in memory) holding the same values. */
static em_tensor *mk(em_state *S, const fx_arr *a, em_dtype dt, int nc) {
  em_tensor *t = NULL, *p = NULL, *v = NULL;
  if (!a) return NULL;
  if (em_from_data(S, a->sizes, a->ndim, dt, a->v, EM_FLOAT64, &t)) return NULL;
  if (!nc || a->ndim < 2) return t;
  int64_t ps[8];
  memcpy(ps, a->sizes, sizeof ps);
  ps[a->ndim - 1] = a->sizes[a->ndim - 2];
  ps[a->ndim - 2] = a->sizes[a->ndim - 1];
  if (em_empty(S, ps, a->ndim, dt, EM_CPU, &p) ||
      em_transpose(S, p, a->ndim - 2, a->ndim - 1, &v) || em_copy_(S, v, t)) {
    em_tensor_release(p);
    em_tensor_release(v);
    em_tensor_release(t);
    return NULL;
  }
  em_tensor_release(p);
  em_tensor_release(t);
  return v;
}

/* Integer fixture (targets, indices) as int64 or int32. */
static em_tensor *mki(em_state *S, const fx_arr *a, em_dtype dt) {
  em_tensor *t = NULL;
  if (a && em_from_data(S, a->sizes, a->ndim, dt, a->v, EM_FLOAT64, &t)) return NULL;
  return t;
}

#define SAME(t, a, tol, what) do { \
    char why_[160]; const fx_arr *a_ = (a); \
    CHECK(a_ && t_values((t), a_->v, a_->n, (tol), why_, sizeof why_), "%s: %s", (what), why_); \
  } while (0)

static const em_dtype DTS[2] = {EM_FLOAT32, EM_FLOAT64};
static double tol_of(em_dtype dt) { return dt == EM_FLOAT32 ? 3e-4 : 1e-9; }

static void rel(em_tensor **ts, int n) { for (int i = 0; i < n; i++) em_tensor_release(ts[i]); }

/* -- conv2d ---------------------------------------------------------------------- */
static void test_conv2d(em_state *S) {
  for (int i = 0; i < 9; i++)
    for (int k = 0; k < 4; k++) {
      em_dtype dt = DTS[k & 1];
      int nc = k >> 1;
      const fx_arr *p = get("conv%d.p", i);
      REQUIRE(p, "fixture");
      const double *q = p->v;
      int64_t stride[2] = {q[7], q[8]}, pad[2] = {q[9], q[10]}, dil[2] = {q[11], q[12]};
      int64_t G = q[13];
      int hb = q[14] != 0;
      em_tensor *t[9] = {0};   /* x w b gy y gx gw gb */
      t[0] = mk(S, get("conv%d.x", i), dt, nc);
      t[1] = mk(S, get("conv%d.w", i), dt, nc);
      if (hb) t[2] = mk(S, get("conv%d.b", i), dt, 0);
      t[3] = mk(S, get("conv%d.gy", i), dt, nc);
      char what[64];
      snprintf(what, sizeof what, "conv%d %s%s", i, em_dtype_name(dt), nc ? " strided" : "");
      if (CHECK_OK(S, em_conv2d(S, t[0], t[1], t[2], stride, pad, dil, G, &t[4])))
        SAME(t[4], get("conv%d.y", i), tol_of(dt), what);
      if (CHECK_OK(S, em_conv2d_backward(S, t[3], t[0], t[1], stride, pad, dil, G, &t[5], &t[6],
                                         hb ? &t[7] : NULL))) {
        SAME(t[5], get("conv%d.gx", i), tol_of(dt), what);
        SAME(t[6], get("conv%d.gw", i), tol_of(dt), what);
        if (hb) SAME(t[7], get("conv%d.gb", i), tol_of(dt), what);
      }
      /* only the weight gradient */
      em_tensor *gw = NULL;
      if (CHECK_OK(S, em_conv2d_backward(S, t[3], t[0], t[1], stride, pad, dil, G, NULL, &gw,
                                         NULL)))
        SAME(gw, get("conv%d.gw", i), tol_of(dt), what);
      em_tensor_release(gw);
      rel(t, 9);
    }
}

/* -- pooling --------------------------------------------------------------------- */
static void test_pool(em_state *S) {
  for (int k = 0; k < 4; k++) {
    em_dtype dt = DTS[k & 1];
    int nc = k >> 1;
    for (int i = 0; i < 4; i++) {
      const double *q = get("maxpool%d.p", i)->v;
      int64_t ker[2] = {q[4], q[5]}, st[2] = {q[6], q[7]}, pd[2] = {q[8], q[9]},
              dl[2] = {q[10], q[11]};
      em_tensor *t[5] = {0};
      t[0] = mk(S, get("maxpool%d.x", i), dt, nc);
      t[1] = mk(S, get("maxpool%d.gy", i), dt, nc);
      if (CHECK_OK(S, em_max_pool2d(S, t[0], ker, st, pd, dl, (int)q[12], 1, &t[2], &t[3]))) {
        SAME(t[2], get("maxpool%d.y", i), tol_of(dt), "max_pool2d");
        const fx_arr *ind = get("maxpool%d.ind", i);
        int ok = t[3] && em_tensor_numel(t[3]) == ind->n;
        for (int64_t j = 0; ok && j < ind->n; j++)
          ok = ((int64_t *)em_tensor_data(t[3]))[j] == (int64_t)ind->v[j] + 1;
        CHECK(ok, "max_pool2d case %d indices", i);
        if (CHECK_OK(S, em_max_pool2d_backward(S, t[1], t[0], t[3], 1, &t[4])))
          SAME(t[4], get("maxpool%d.gx", i), tol_of(dt), "max_pool2d_backward");
      }
      rel(t, 5);
    }
    for (int i = 0; i < 4; i++) {
      const double *q = get("avgpool%d.p", i)->v;
      int64_t ker[2] = {q[4], q[5]}, st[2] = {q[6], q[7]}, pd[2] = {q[8], q[9]};
      em_tensor *t[4] = {0};
      t[0] = mk(S, get("avgpool%d.x", i), dt, nc);
      t[1] = mk(S, get("avgpool%d.gy", i), dt, nc);
      if (CHECK_OK(S, em_avg_pool2d(S, t[0], ker, st, pd, (int)q[10], (int)q[11], &t[2])))
        SAME(t[2], get("avgpool%d.y", i), tol_of(dt), "avg_pool2d");
      if (CHECK_OK(S, em_avg_pool2d_backward(S, t[1], t[0], ker, st, pd, (int)q[10], (int)q[11],
                                             &t[3])))
        SAME(t[3], get("avgpool%d.gx", i), tol_of(dt), "avg_pool2d_backward");
      rel(t, 4);
    }
    for (int i = 0; i < 3; i++) {
      const double *q = get("adapool%d.p", i)->v;
      int64_t os[2] = {q[4], q[5]};
      em_tensor *t[4] = {0};
      t[0] = mk(S, get("adapool%d.x", i), dt, nc);
      t[1] = mk(S, get("adapool%d.gy", i), dt, nc);
      if (CHECK_OK(S, em_adaptive_avg_pool2d(S, t[0], os, &t[2])))
        SAME(t[2], get("adapool%d.y", i), tol_of(dt), "adaptive_avg_pool2d");
      if (CHECK_OK(S, em_adaptive_avg_pool2d_backward(S, t[1], t[0], &t[3])))
        SAME(t[3], get("adapool%d.gx", i), tol_of(dt), "adaptive_avg_pool2d_backward");
      rel(t, 4);
    }
  }
}

/* -- losses ---------------------------------------------------------------------- */
static void test_losses(em_state *S) {
  for (int k = 0; k < 4; k++) {
    em_dtype dt = DTS[k & 1];
    int nc = k >> 1;
    for (int i = 0; i < 6; i++) {
      const double *q = get("ce%d.p", i)->v;
      int r = (int)q[2];
      double sm = q[3] / 100;
      int64_t ign = (int64_t)q[4];
      /* 1-based targets from Lua: shift the fixture's classes and ignore_index */
      const fx_arr *ta = get("ce%d.t", i);
      double tv[64];
      for (int64_t j = 0; j < ta->n; j++) tv[j] = ta->v[j] + 1;
      em_tensor *t[8] = {0};   /* x, t, gl, loss, lse, gx, lp, ... */
      t[0] = mk(S, get("ce%d.x", i), dt, nc);
      em_from_data(S, ta->sizes, 1, k & 2 ? EM_INT32 : EM_INT64, tv, EM_FLOAT64, &t[1]);
      const fx_arr *gl = get("ce%d.gl", i);
      em_from_data(S, gl->sizes, r ? 0 : 1, dt, gl->v, EM_FLOAT64, &t[2]);
      int64_t ig1 = ign >= 0 ? ign + 1 : ign;
      if (CHECK_OK(S, em_cross_entropy(S, t[0], t[1], 1, ig1, sm, r, &t[3], &t[4])))
        SAME(t[3], get("ce%d.loss", i), tol_of(dt), "cross_entropy");
      if (CHECK_OK(S, em_cross_entropy_backward(S, t[2], t[0], t[1], t[4], 1, ig1, sm, r, &t[5])))
        SAME(t[5], get("ce%d.gx", i), tol_of(dt), "cross_entropy_backward");
      em_tensor *lp = mk(S, get("nll%d.lp", i), dt, nc), *nl = NULL, *gn = NULL;
      if (CHECK_OK(S, em_nll_loss(S, lp, t[1], 1, ig1, r, &nl)))
        SAME(nl, get("nll%d.loss", i), tol_of(dt), "nll_loss");
      if (CHECK_OK(S, em_nll_loss_backward(S, t[2], lp, t[1], 1, ig1, r, &gn)))
        SAME(gn, get("nll%d.gx", i), tol_of(dt), "nll_loss_backward");
      em_tensor_release(lp);
      em_tensor_release(nl);
      em_tensor_release(gn);
      rel(t, 8);
    }
    for (int r = 0; r < 3; r++) {
      em_tensor *x = mk(S, get("pw%d.x", r), dt, nc), *y = mk(S, get("pw%d.y", r), dt, nc);
      em_tensor *p = mk(S, get("pw%d.p", r), dt, 0), *g = NULL, *l = NULL, *gx = NULL;
      const fx_arr *gl = get("pw%d.gl", r);
      if (r) em_from_data(S, NULL, 0, dt, gl->v, EM_FLOAT64, &g);
      else g = mk(S, get("pw%d.x", r), dt, 0), em_tensor_release(g),
           em_from_data(S, x ? em_tensor_sizes(x) : NULL, 3, dt, gl->v, EM_FLOAT64, &g);
      if (CHECK_OK(S, em_mse_loss(S, x, y, r, &l))) SAME(l, get("mse%d.loss", r), tol_of(dt), "mse");
      if (CHECK_OK(S, em_mse_loss_backward(S, g, x, y, r, &gx)))
        SAME(gx, get("mse%d.gx", r), tol_of(dt), "mse_backward");
      em_tensor_release(l); em_tensor_release(gx); l = gx = NULL;
      if (CHECK_OK(S, em_bce_with_logits(S, x, p, r, &l)))
        SAME(l, get("bce%d.loss", r), tol_of(dt), "bce_with_logits");
      if (CHECK_OK(S, em_bce_with_logits_backward(S, g, x, p, r, &gx)))
        SAME(gx, get("bce%d.gx", r), tol_of(dt), "bce_with_logits_backward");
      em_tensor *all[6] = {x, y, p, g, l, gx};
      rel(all, 6);
    }
  }
}

/* -- normalization layers -------------------------------------------------------- */
static void test_normalize(em_state *S) {
  for (int k = 0; k < 4; k++) {
    em_dtype dt = DTS[k & 1];
    int nc = k >> 1;
    for (int i = 0; i < 4; i++) {
      const double *q = get("bn%d.p", i)->v;
      int tr = (int)q[1], aff = (int)q[2];
      em_tensor *t[12] = {0};   /* x w b rm rv gy y sm si gx gw gb */
      t[0] = mk(S, get("bn%d.x", i), dt, nc);
      if (aff) { t[1] = mk(S, get("bn%d.w", i), dt, 0); t[2] = mk(S, get("bn%d.b", i), dt, 0); }
      t[3] = mk(S, get("bn%d.rm0", i), dt, 0);
      t[4] = mk(S, get("bn%d.rv0", i), dt, 0);
      t[5] = mk(S, get("bn%d.gy", i), dt, nc);
      if (CHECK_OK(S, em_batch_norm(S, t[0], t[1], t[2], t[3], t[4], tr, 0.1, 1e-5, &t[6], &t[7],
                                    &t[8]))) {
        SAME(t[6], get("bn%d.y", i), tol_of(dt), "batch_norm");
        SAME(t[3], get("bn%d.rm1", i), tol_of(dt), "batch_norm running_mean");
        SAME(t[4], get("bn%d.rv1", i), tol_of(dt), "batch_norm running_var");
        if (CHECK_OK(S, em_batch_norm_backward(S, t[5], t[0], t[1], t[7], t[8], tr, &t[9],
                                               aff ? &t[10] : NULL, aff ? &t[11] : NULL))) {
          SAME(t[9], get("bn%d.gx", i), tol_of(dt) * 3, "batch_norm_backward gx");
          if (aff) {
            SAME(t[10], get("bn%d.gw", i), tol_of(dt) * 3, "batch_norm_backward gw");
            SAME(t[11], get("bn%d.gb", i), tol_of(dt), "batch_norm_backward gb");
          }
        }
      }
      rel(t, 12);
    }
    for (int i = 0; i < 3; i++) {
      const double *q = get("ln%d.p", i)->v;
      int kk = (int)q[0], aff = (int)q[1];
      em_tensor *t[10] = {0};   /* x w b gy y mean rstd gx gw gb */
      t[0] = mk(S, get("ln%d.x", i), dt, nc);
      if (aff) { t[1] = mk(S, get("ln%d.w", i), dt, 0); t[2] = mk(S, get("ln%d.b", i), dt, 0); }
      t[3] = mk(S, get("ln%d.gy", i), dt, nc);
      if (CHECK_OK(S, em_layer_norm(S, t[0], kk, t[1], t[2], 1e-5, &t[4], &t[5], &t[6]))) {
        SAME(t[4], get("ln%d.y", i), tol_of(dt), "layer_norm");
        if (CHECK_OK(S, em_layer_norm_backward(S, t[3], t[0], kk, t[5], t[6], t[1], &t[7],
                                               aff ? &t[8] : NULL, aff ? &t[9] : NULL))) {
          SAME(t[7], get("ln%d.gx", i), tol_of(dt) * 3, "layer_norm_backward gx");
          if (aff) {
            SAME(t[8], get("ln%d.gw", i), tol_of(dt) * 3, "layer_norm_backward gw");
            SAME(t[9], get("ln%d.gb", i), tol_of(dt), "layer_norm_backward gb");
          }
        }
      }
      rel(t, 10);
    }
  }
}

/* -- index_add_ / scatter_add_ ---------------------------------------------------- */
static void test_scatter(em_state *S) {
  for (int k = 0; k < 4; k++) {
    em_dtype dt = DTS[k & 1];
    int nc = k >> 1;
    for (int dim = 0; dim < 2; dim++) {
      em_tensor *o = mk(S, get("ia%d.o", dim), dt, nc), *src = mk(S, get("ia%d.src", dim), dt, nc);
      em_tensor *idx = mki(S, get("ia%d.idx", dim), k & 2 ? EM_INT32 : EM_INT64);
      if (CHECK_OK(S, em_index_add_(S, o, dim, idx, src, 0)))
        SAME(o, get("ia%d.r", dim), tol_of(dt), "index_add_");
      em_tensor_release(o); em_tensor_release(src); em_tensor_release(idx);
      o = mk(S, get("ia%d.o", dim), dt, nc);
      src = mk(S, get("sa%d.src", dim), dt, nc);
      idx = mki(S, get("sa%d.idx", dim), EM_INT64);
      if (CHECK_OK(S, em_scatter_add_(S, o, dim, idx, src, 0)))
        SAME(o, get("sa%d.r", dim), tol_of(dt), "scatter_add_");
      em_tensor_release(o); em_tensor_release(src); em_tensor_release(idx);
    }
  }
}

/* -- finite differences (float64) --------------------------------------------------
** f = sum(forward(inputs) * gy); the backward's gradient for input k element j must
** match (f(x+h) - f(x-h)) / 2h. */
typedef em_status (*fwd_fn)(em_state *S, em_tensor **in, em_tensor **out);
static double dot(const em_tensor *a, const em_tensor *b) {
  double s = 0;
  for (int64_t i = 0; i < em_tensor_numel(a); i++) s += t_get(a, i) * t_get(b, i);
  return s;
}
static void fd_check(em_state *S, const char *what, fwd_fn f, em_tensor **in, int k,
                     const em_tensor *gy, const em_tensor *grad) {
  double *d = em_tensor_data(in[k]);
  int64_t n = em_tensor_numel(in[k]);
  int bad = 0;
  for (int64_t j = 0; j < n; j += 1 + n / 23) {
    double x0 = d[j], h = 1e-6, fp, fm;
    em_tensor *y = NULL;
    d[j] = x0 + h;
    if (f(S, in, &y)) { bad++; break; }
    fp = dot(y, gy);
    em_tensor_release(y);
    d[j] = x0 - h;
    if (f(S, in, &y)) { bad++; break; }
    fm = dot(y, gy);
    em_tensor_release(y);
    d[j] = x0;
    double num = (fp - fm) / (2 * h), got = t_get(grad, j);
    if (!chk_close(got, num, 1e-5)) {
      printf("  %s input %d element %lld: analytic %.9g, numeric %.9g\n", what, k,
             (long long)j, got, num);
      bad++;
    }
  }
  CHECK(!bad, "%s: finite differences for input %d", what, k);
}

static const int64_t C_ST[2] = {2, 1}, C_PD[2] = {1, 2}, C_DL[2] = {1, 2};
static em_status f_conv(em_state *S, em_tensor **in, em_tensor **out) {
  return em_conv2d(S, in[0], in[1], in[2], C_ST, C_PD, C_DL, 2, out);
}
static em_status f_avg(em_state *S, em_tensor **in, em_tensor **out) {
  return em_avg_pool2d(S, in[0], (int64_t[]){3, 2}, (int64_t[]){2, 1}, (int64_t[]){1, 1}, 1, 0, out);
}
static em_status f_ada(em_state *S, em_tensor **in, em_tensor **out) {
  return em_adaptive_avg_pool2d(S, in[0], (int64_t[]){3, 2}, out);
}
static em_status f_max(em_state *S, em_tensor **in, em_tensor **out) {
  return em_max_pool2d(S, in[0], (int64_t[]){2, 2}, NULL, (int64_t[]){1, 0}, NULL, 0, 0, out, NULL);
}
static em_status f_ce(em_state *S, em_tensor **in, em_tensor **out) {
  return em_cross_entropy(S, in[0], in[1], 0, 1, 0.15, EM_REDUCE_NONE, out, NULL);
}
static em_status f_bn(em_state *S, em_tensor **in, em_tensor **out) {
  return em_batch_norm(S, in[0], in[1], in[2], NULL, NULL, 1, 0.1, 1e-5, out, NULL, NULL);
}
static em_status f_ln(em_state *S, em_tensor **in, em_tensor **out) {
  return em_layer_norm(S, in[0], 2, in[1], in[2], 1e-5, out, NULL, NULL);
}
static em_status f_bce(em_state *S, em_tensor **in, em_tensor **out) {
  return em_bce_with_logits(S, in[0], in[1], EM_REDUCE_NONE, out);
}

static em_tensor *rnd(em_state *S, const int64_t *shape, int nd, double scale) {
  em_tensor *t = NULL;
  if (em_empty(S, shape, nd, EM_FLOAT64, EM_CPU, &t)) return NULL;
  double *d = em_tensor_data(t);
  for (int64_t i = 0; i < em_tensor_numel(t); i++)
    d[i] = scale * ((double)rand() / RAND_MAX * 2 - 1) + (scale > 5 ? 0 : 0.1 * (i % 7));
  return t;
}

static void test_finite_diff(em_state *S) {
  srand(7);
  {  /* conv2d, groups 2, stride/padding/dilation */
    em_tensor *in[3] = {rnd(S, (int64_t[]){2, 4, 7, 6}, 4, 1), rnd(S, (int64_t[]){6, 2, 3, 2}, 4, 1),
                        rnd(S, (int64_t[]){6}, 1, 1)};
    em_tensor *y = NULL, *gy = NULL, *g[3] = {0};
    REQUIRE_OK(S, f_conv(S, in, &y));
    gy = rnd(S, em_tensor_sizes(y), 4, 1);
    REQUIRE_OK(S, em_conv2d_backward(S, gy, in[0], in[1], C_ST, C_PD, C_DL, 2, &g[0], &g[1], &g[2]));
    for (int k = 0; k < 3; k++) fd_check(S, "conv2d", f_conv, in, k, gy, g[k]);
    rel(in, 3); rel(g, 3); em_tensor_release(y); em_tensor_release(gy);
  }
  {  /* pooling */
    em_tensor *in[1] = {rnd(S, (int64_t[]){2, 3, 7, 5}, 4, 1)};
    fwd_fn fs[3] = {f_avg, f_ada, f_max};
    for (int i = 0; i < 3; i++) {
      em_tensor *y = NULL, *gy = NULL, *gx = NULL, *ind = NULL;
      if (i == 2) REQUIRE_OK(S, em_max_pool2d(S, in[0], (int64_t[]){2, 2}, NULL, (int64_t[]){1, 0},
                                              NULL, 0, 0, &y, &ind));
      else REQUIRE_OK(S, fs[i](S, in, &y));
      gy = rnd(S, em_tensor_sizes(y), 4, 1);
      if (i == 0) REQUIRE_OK(S, em_avg_pool2d_backward(S, gy, in[0], (int64_t[]){3, 2}, (int64_t[]){2, 1},
                                                       (int64_t[]){1, 1}, 1, 0, &gx));
      if (i == 1) REQUIRE_OK(S, em_adaptive_avg_pool2d_backward(S, gy, in[0], &gx));
      if (i == 2) REQUIRE_OK(S, em_max_pool2d_backward(S, gy, in[0], ind, 0, &gx));
      fd_check(S, i == 0 ? "avg_pool2d" : i == 1 ? "adaptive_avg_pool2d" : "max_pool2d", fs[i],
               in, 0, gy, gx);
      em_tensor_release(y); em_tensor_release(gy); em_tensor_release(gx); em_tensor_release(ind);
    }
    rel(in, 1);
  }
  {  /* cross entropy with smoothing and an ignored row; bce */
    em_tensor *in[2] = {rnd(S, (int64_t[]){5, 4}, 2, 3), NULL};
    REQUIRE_OK(S, t_make(S, &in[1], EM_INT64, SHP(5), V(0, 1, 3, 2, 3)));
    em_tensor *y = NULL, *gy = NULL, *lse = NULL, *gx = NULL;
    REQUIRE_OK(S, em_cross_entropy(S, in[0], in[1], 0, 1, 0.15, EM_REDUCE_NONE, &y, &lse));
    gy = rnd(S, SHP(5), 1);
    REQUIRE_OK(S, em_cross_entropy_backward(S, gy, in[0], in[1], lse, 0, 1, 0.15, EM_REDUCE_NONE, &gx));
    fd_check(S, "cross_entropy", f_ce, in, 0, gy, gx);
    em_tensor_release(y); em_tensor_release(gy); em_tensor_release(gx); em_tensor_release(lse);
    rel(in, 2);
    em_tensor *b[2] = {rnd(S, SHP(3, 4), 8), rnd(S, SHP(3, 4), 0.4)};
    REQUIRE_OK(S, f_bce(S, b, &y));
    gy = rnd(S, SHP(3, 4), 1);
    REQUIRE_OK(S, em_bce_with_logits_backward(S, gy, b[0], b[1], EM_REDUCE_NONE, &gx));
    fd_check(S, "bce_with_logits", f_bce, b, 0, gy, gx);
    em_tensor_release(y); em_tensor_release(gy); em_tensor_release(gx);
    rel(b, 2);
  }
  {  /* batch norm (training) and layer norm */
    em_tensor *in[3] = {rnd(S, (int64_t[]){4, 3, 2, 2}, 4, 2), rnd(S, SHP(3), 1), rnd(S, SHP(3), 1)};
    em_tensor *y = NULL, *gy = NULL, *sm = NULL, *si = NULL, *g[3] = {0};
    REQUIRE_OK(S, em_batch_norm(S, in[0], in[1], in[2], NULL, NULL, 1, 0.1, 1e-5, &y, &sm, &si));
    gy = rnd(S, em_tensor_sizes(y), 4, 1);
    REQUIRE_OK(S, em_batch_norm_backward(S, gy, in[0], in[1], sm, si, 1, &g[0], &g[1], &g[2]));
    for (int k = 0; k < 3; k++) fd_check(S, "batch_norm", f_bn, in, k, gy, g[k]);
    em_tensor_release(y); em_tensor_release(gy); em_tensor_release(sm); em_tensor_release(si);
    rel(in, 3); rel(g, 3);
    em_tensor *l[3] = {rnd(S, (int64_t[]){3, 2, 4}, 3, 2), rnd(S, SHP(2, 4), 1), rnd(S, SHP(2, 4), 1)};
    em_tensor *m = NULL, *r = NULL;
    REQUIRE_OK(S, em_layer_norm(S, l[0], 2, l[1], l[2], 1e-5, &y, &m, &r));
    gy = rnd(S, em_tensor_sizes(y), 3, 1);
    REQUIRE_OK(S, em_layer_norm_backward(S, gy, l[0], 2, m, r, l[1], &g[0], &g[1], &g[2]));
    for (int k = 0; k < 3; k++) fd_check(S, "layer_norm", f_ln, l, k, gy, g[k]);
    em_tensor_release(y); em_tensor_release(gy); em_tensor_release(m); em_tensor_release(r);
    rel(l, 3); rel(g, 3);
  }
}

/* -- errors ---------------------------------------------------------------------- */
static void test_errors(em_state *S) {
  em_tensor *x = NULL, *w = NULL, *y = NULL, *t = NULL, *xi = NULL;
  int64_t one[2] = {1, 1}, zero[2] = {0, 0};
  REQUIRE_OK(S, em_full(S, (int64_t[]){2, 3, 8, 8}, 4, 1, EM_FLOAT32, EM_CPU, &x));
  REQUIRE_OK(S, em_full(S, (int64_t[]){4, 1, 3, 3}, 4, 1, EM_FLOAT32, EM_CPU, &w));
  CHECK_ERR(S, em_conv2d(S, x, w, NULL, one, one, one, 1, &y), EM_ERR_SHAPE, "conv2d",
            "[2,3,8,8]", "3 channels", "[4,1,3,3]", "expects 1");
  CHECK_ERR(S, em_conv2d(S, x, w, NULL, zero, one, one, 1, &y), EM_ERR_ARG, "conv2d", "stride");
  em_tensor_release(w);
  REQUIRE_OK(S, em_full(S, (int64_t[]){4, 3, 3, 3}, 4, 1, EM_FLOAT64, EM_CPU, &w));
  CHECK_ERR(S, em_conv2d(S, x, w, NULL, one, one, one, 1, &y), EM_ERR_DTYPE, "conv2d", "float64");
  REQUIRE_OK(S, em_full(S, (int64_t[]){2, 3, 8, 8}, 4, 1, EM_INT32, EM_CPU, &xi));
  CHECK_ERR(S, em_max_pool2d(S, xi, (int64_t[]){2, 2}, NULL, zero, NULL, 0, 0, &y, NULL),
            EM_ERR_DTYPE, "max_pool2d", "int32");
  CHECK_ERR(S, em_max_pool2d(S, x, (int64_t[]){2, 2}, NULL, (int64_t[]){2, 0}, NULL, 0, 0, &y, NULL),
            EM_ERR_ARG, "max_pool2d", "padding");
  CHECK_ERR(S, em_avg_pool2d(S, x, (int64_t[]){9, 9}, NULL, zero, 0, 1, &y), EM_ERR_SHAPE,
            "avg_pool2d", "[2,3,8,8]");
  em_tensor *lg = NULL;
  REQUIRE_OK(S, em_full(S, (int64_t[]){3, 4}, 2, 0, EM_FLOAT32, EM_CPU, &lg));
  REQUIRE_OK(S, t_make(S, &t, EM_INT64, SHP(3), V(1, 5, 2)));
  CHECK_ERR(S, em_cross_entropy(S, lg, t, 1, -100, 0, EM_REDUCE_MEAN, &y, NULL), EM_ERR_INDEX,
            "cross_entropy", "target 5", "4 classes");
  em_tensor_release(t);
  REQUIRE_OK(S, t_make(S, &t, EM_FLOAT32, SHP(3), V(1, 2, 2)));
  CHECK_ERR(S, em_cross_entropy(S, lg, t, 1, -100, 0, EM_REDUCE_MEAN, &y, NULL), EM_ERR_DTYPE,
            "cross_entropy", "target", "float32");
  CHECK_ERR(S, em_cross_entropy(S, lg, t, 1, -100, 0, 7, &y, NULL), EM_ERR_ARG, "reduction");
  CHECK_ERR(S, em_batch_norm(S, x, NULL, NULL, NULL, NULL, 0, 0.1, 1e-5, &y, NULL, NULL),
            EM_ERR_ARG, "batch_norm", "running");
  CHECK_ERR(S, em_layer_norm(S, x, 2, w, NULL, 1e-5, &y, NULL, NULL), EM_ERR_DTYPE, "layer_norm");
  em_tensor *idx = NULL;
  REQUIRE_OK(S, t_make(S, &idx, EM_INT64, SHP(2), V(0, 9)));
  CHECK_ERR(S, em_index_add_(S, lg, 0, idx, lg, 0), EM_ERR_SHAPE, "index_add_");
  em_tensor *src = NULL;
  REQUIRE_OK(S, em_full(S, (int64_t[]){2, 4}, 2, 1, EM_FLOAT32, EM_CPU, &src));
  CHECK_ERR(S, em_index_add_(S, lg, 0, idx, src, 0), EM_ERR_INDEX, "index_add_", "index 9");
  CHECK(t_get(lg, 0) == 0, "out left intact after an error");
  em_tensor *all[8] = {x, w, t, xi, lg, idx, src, NULL};
  rel(all, 8);
}


/* -- allocation failures ------------------------------------------------------------
** Every op under an allocator that refuses the Nth request: the call either works
** or returns EM_ERR_NOMEM with a message (AddressSanitizer checks for leaks). */
static long fa_left;
static void *fa_alloc(void *ud, void *ptr, size_t osize, size_t nsize) {
  (void)ud; (void)osize;
  if (nsize == 0) { free(ptr); return NULL; }
  if (fa_left-- == 0) return NULL;
  return realloc(ptr, nsize);
}

static em_status run_all(em_state *S, em_tensor **in) {
  em_tensor *r[12] = {0};
  int64_t one[2] = {1, 1}, two[2] = {2, 2}, zero[2] = {0, 0};
  em_status st;
  em_tensor *tg = in[5];
  if ((st = em_conv2d(S, in[0], in[1], in[2], one, one, one, 1, &r[0]))) goto out;
  if ((st = em_conv2d_backward(S, r[0], in[0], in[1], one, one, one, 1, &r[1], &r[2], &r[3]))) goto out;
  rel(r, 4); memset(r, 0, sizeof r);
  if ((st = em_conv2d(S, in[0], in[1], NULL, two, one, one, 1, &r[0]))) goto out;
  if ((st = em_conv2d_backward(S, r[0], in[0], in[1], two, one, one, 1, &r[1], &r[2], &r[3]))) goto out;
  rel(r, 4); memset(r, 0, sizeof r);
  /* stride 1 with 8 input channels: the im2col-free path where built with AVX-512 */
  if ((st = em_conv2d(S, in[3], in[6], NULL, one, one, one, 1, &r[0]))) goto out;
  if ((st = em_conv2d_backward(S, r[0], in[3], in[6], one, one, one, 1, &r[1], &r[2], &r[3]))) goto out;
  rel(r, 4); memset(r, 0, sizeof r);
  if ((st = em_max_pool2d(S, in[0], two, NULL, zero, NULL, 0, 0, &r[0], &r[1]))) goto out;
  if ((st = em_max_pool2d_backward(S, r[0], in[0], r[1], 0, &r[2]))) goto out;
  if ((st = em_avg_pool2d(S, in[0], two, NULL, zero, 0, 1, &r[3]))) goto out;
  if ((st = em_avg_pool2d_backward(S, r[3], in[0], two, NULL, zero, 0, 1, &r[4]))) goto out;
  if ((st = em_adaptive_avg_pool2d(S, in[0], two, &r[5]))) goto out;
  if ((st = em_adaptive_avg_pool2d_backward(S, r[5], in[0], &r[6]))) goto out;
  rel(r, 7); memset(r, 0, sizeof r);
  if ((st = em_cross_entropy(S, in[4], tg, 0, -100, 0.1, EM_REDUCE_MEAN, &r[0], &r[1]))) goto out;
  if ((st = em_cross_entropy_backward(S, r[0], in[4], tg, r[1], 0, -100, 0.1, EM_REDUCE_MEAN, &r[2]))) goto out;
  if ((st = em_nll_loss(S, in[4], tg, 0, -100, EM_REDUCE_SUM, &r[3]))) goto out;
  if ((st = em_nll_loss_backward(S, r[3], in[4], tg, 0, -100, EM_REDUCE_SUM, &r[4]))) goto out;
  if ((st = em_mse_loss(S, in[4], in[4], EM_REDUCE_NONE, &r[5]))) goto out;
  if ((st = em_mse_loss_backward(S, r[5], in[4], in[4], EM_REDUCE_NONE, &r[6]))) goto out;
  if ((st = em_bce_with_logits(S, in[4], in[4], EM_REDUCE_MEAN, &r[7]))) goto out;
  if ((st = em_bce_with_logits_backward(S, r[7], in[4], in[4], EM_REDUCE_MEAN, &r[8]))) goto out;
  rel(r, 9); memset(r, 0, sizeof r);
  if ((st = em_batch_norm(S, in[0], NULL, NULL, NULL, NULL, 1, 0.1, 1e-5, &r[0], &r[1], &r[2]))) goto out;
  if ((st = em_batch_norm_backward(S, r[0], in[0], NULL, r[1], r[2], 1, &r[3], NULL, NULL))) goto out;
  if ((st = em_layer_norm(S, in[0], 2, NULL, NULL, 1e-5, &r[4], &r[5], &r[6]))) goto out;
  if ((st = em_layer_norm_backward(S, r[4], in[0], 2, r[5], r[6], NULL, &r[7], NULL, NULL))) goto out;
  rel(r, 8); memset(r, 0, sizeof r);
  if ((st = em_index_add_(S, in[4], 0, tg, in[4], 0))) goto out;
out:
  rel(r, 12);
  return st;
}

static void test_failalloc(em_state *S0) {
  (void)S0;
  em_config cfg;
  em_config_init(&cfg);
  cfg.num_threads = 2;
  cfg.alloc = fa_alloc;
  cfg.cache_limit = -1;
  em_state *S;
  fa_left = -1;
  REQUIRE(em_open(&S, &cfg) == EM_OK, "em_open");
  em_tensor *in[7] = {0};
  REQUIRE_OK(S, em_full(S, (int64_t[]){2, 3, 6, 6}, 4, 0.5, EM_FLOAT32, EM_CPU, &in[0]));
  REQUIRE_OK(S, em_full(S, (int64_t[]){4, 3, 3, 3}, 4, 0.25, EM_FLOAT32, EM_CPU, &in[1]));
  REQUIRE_OK(S, em_full(S, (int64_t[]){4}, 1, 0.1, EM_FLOAT32, EM_CPU, &in[2]));
  REQUIRE_OK(S, em_full(S, (int64_t[]){2, 8, 5, 5}, 4, 0.5, EM_FLOAT32, EM_CPU, &in[3]));
  REQUIRE_OK(S, em_full(S, (int64_t[]){4, 8, 3, 3}, 4, 0.25, EM_FLOAT32, EM_CPU, &in[6]));
  REQUIRE_OK(S, em_full(S, (int64_t[]){3, 3}, 2, 0.3, EM_FLOAT32, EM_CPU, &in[4]));
  REQUIRE_OK(S, t_make(S, &in[5], EM_INT64, SHP(3), V(0, 2, 1)));
  int bad = 0, n;
  for (n = 0; n < 2000; n++) {
    fa_left = n;
    em_status st = run_all(S, in);
    fa_left = -1;
    if (st == EM_OK) break;
    if (st != EM_ERR_NOMEM || !strlen(em_errmsg(S))) {
      printf("  failing allocation %d: status %d, \"%s\"\n", n, (int)st, em_errmsg(S));
      bad++;
    }
  }
  CHECK(!bad && n > 10 && n < 2000, "%d allocation failure points, %d bad", n, bad);
  rel(in, 7);
  em_close(S);
}

/* The 2x2 / stride 2 fast path makes the general loop's choices: the first of
** equal maxima, a NaN over any number, a later NaN over an earlier one. Planes
** (2, 4) and (2, 5) (the last column is left out). */
static void test_pool_2x2_ties_nan(em_state *S) {
  em_tensor *x, *y, *ind;
  double v[] = {2, 2, NAN, 2, 9,
                2, 1, 3, NAN, 9};
  REQUIRE_OK(S, t_make(S, &x, EM_FLOAT32, SHP(1, 1, 2, 5), v, 10));
  REQUIRE_OK(S, em_max_pool2d(S, x, (int64_t[]){2, 2}, (int64_t[]){2, 2}, (int64_t[]){0, 0},
                              (int64_t[]){1, 1}, 0, 0, &y, &ind));
  CHECK(em_tensor_numel(y) == 2, "2 outputs, got %lld", (long long)em_tensor_numel(y));
  CHECK(t_get(y, 0) == 2 && t_get(ind, 0) == 0, "ties: %g at %g", t_get(y, 0), t_get(ind, 0));
  CHECK(isnan(t_get(y, 1)) && t_get(ind, 1) == 8, "NaN: %g at %g", t_get(y, 1), t_get(ind, 1));
  em_tensor_release(x);
  em_tensor_release(y);
  em_tensor_release(ind);
}

int main(void) {
  em_state *S = fx_open("fixtures/nn_kernels.txt");
  if (!S) return 1;
  RUN(test_conv2d, S);
  RUN(test_pool, S);
  RUN(test_pool_2x2_ties_nan, S);
  RUN(test_losses, S);
  RUN(test_normalize, S);
  RUN(test_scatter, S);
  RUN(test_finite_diff, S);
  RUN(test_errors, S);
  RUN(test_failalloc, S);
  em_close(S);
  for (int i = 0; i < nfx; i++) free(fx[i].v);
  free(fx);
  return check_done();
}

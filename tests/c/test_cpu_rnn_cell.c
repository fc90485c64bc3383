/*
** test_cpu_rnn_cell.c -- the fused LSTM step kernels (core/cpu/rnn_cell.c) against
** the cell's formulas written here in double: h, c and the activations of the
** forward, the gates' and c_prev's gradients of the backward, in float32 and
** float64, over widths around the kernel's 64-element blocks (1, 3, 64, 65, 130)
** and enough rows for two threads; the activations written over the gates
** themselves; the gates given as two addends or one; the backward with and
** without a second gradient of h; and the errors for a bad dtype, sizes and NULL
** buffers.
*/
#include "check.h"
#include <math.h>

static double sig(double x) { return 1 / (1 + exp(-x)); }

static double value(uint32_t *s, double scale) {
  *s = *s * 1664525u + 1013904223u;
  return ((double)(*s >> 8) / 16777216.0 - 0.5) * scale;
}

/* Buffers of n doubles, and their float copies. */
static void *as(em_dtype dt, const double *v, int64_t n) {
  if (dt == EM_FLOAT64) {
    double *d = malloc(sizeof(double) * (size_t)n);
    memcpy(d, v, sizeof(double) * (size_t)n);
    return d;
  }
  float *f = malloc(sizeof(float) * (size_t)n);
  for (int64_t i = 0; i < n; i++) f[i] = (float)v[i];
  return f;
}
static double at(em_dtype dt, const void *p, int64_t i) {
  return dt == EM_FLOAT64 ? ((const double *)p)[i] : ((const float *)p)[i];
}

/* The largest relative difference of n values of p from want (floor 1 on the scale). */
static double worst(em_dtype dt, const void *p, const double *want, int64_t n) {
  double w = 0;
  for (int64_t i = 0; i < n; i++) {
    double d = fabs(at(dt, p, i) - want[i]) / fmax(1, fabs(want[i]));
    if (!(d <= w)) w = d;   /* (NaN counts as the worst) */
  }
  return w;
}

/* two: a second gradient of h in the backward, and the forward's pre-activations
** given as two addends (gates + gates2). */
static void one_case(em_state *S, em_dtype dt, int64_t N, int64_t H, int in_place, int two) {
  uint32_t s = (uint32_t)(N * 131 + H * 7 + in_place * 3 + two);
  int64_t G = 4 * H, NG = N * G, NH = N * H;
  double *gates = malloc(sizeof(double) * (size_t)NG), *cp = malloc(sizeof(double) * (size_t)NH);
  double *dh = malloc(sizeof(double) * (size_t)NH), *dh2 = malloc(sizeof(double) * (size_t)NH);
  double *dc = malloc(sizeof(double) * (size_t)NH);
  double *g2 = malloc(sizeof(double) * (size_t)NG);
  for (int64_t i = 0; i < NG; i++) { gates[i] = value(&s, 8); g2[i] = two ? value(&s, 2) : 0; }
  for (int64_t i = 0; i < NH; i++) {
    cp[i] = value(&s, 4); dh[i] = value(&s, 2); dh2[i] = value(&s, 2); dc[i] = value(&s, 2);
  }
  /* the reference, row by row */
  double *act = malloc(sizeof(double) * (size_t)NG), *h = malloc(sizeof(double) * (size_t)NH);
  double *c = malloc(sizeof(double) * (size_t)NH), *dx = malloc(sizeof(double) * (size_t)NG);
  double *dcp = malloc(sizeof(double) * (size_t)NH);
  for (int64_t r = 0; r < N; r++)
    for (int64_t k = 0; k < H; k++) {
      const double *x = gates + r * G, *x2 = g2 + r * G;
      double i = sig(x[k] + x2[k]), f = sig(x[H + k] + x2[H + k]);
      double g = tanh(x[2 * H + k] + x2[2 * H + k]), o = sig(x[3 * H + k] + x2[3 * H + k]);
      double cn = f * cp[r * H + k] + i * g, tc = tanh(cn);
      double *a = act + r * G;
      a[k] = i; a[H + k] = f; a[2 * H + k] = g; a[3 * H + k] = o;
      c[r * H + k] = cn;
      h[r * H + k] = o * tc;
      double y = dh[r * H + k] + (two ? dh2[r * H + k] : 0);
      double d = dc[r * H + k] + y * o * (1 - tc * tc);
      double *e = dx + r * G;
      e[k] = d * g * i * (1 - i);
      e[H + k] = d * cp[r * H + k] * f * (1 - f);
      e[2 * H + k] = d * i * (1 - g * g);
      e[3 * H + k] = y * tc * o * (1 - o);
      dcp[r * H + k] = d * f;
    }
  void *xg = as(dt, gates, NG), *xg2 = as(dt, g2, NG), *xcp = as(dt, cp, NH), *xdh = as(dt, dh, NH);
  void *xdh2 = as(dt, dh2, NH), *xdc = as(dt, dc, NH);
  void *xact = in_place ? xg : as(dt, gates, NG), *xh = as(dt, h, NH), *xc = as(dt, c, NH);
  void *xdx = as(dt, dx, NG);
  memset(xh, 0, (size_t)NH * (dt == EM_FLOAT64 ? 8 : 4));
  double tol = dt == EM_FLOAT64 ? 1e-13 : 2e-6;
  const char *dn = em_dtype_name(dt);
  if (CHECK_OK(S, em_cpu_lstm_cell_forward(S, dt, N, H, xg, two ? xg2 : NULL, xcp, xact, xh,
                                           xc))) {
    CHECK(worst(dt, xh, h, NH) < tol, "%s N=%lld H=%lld: h off by %g", dn, (long long)N,
          (long long)H, worst(dt, xh, h, NH));
    CHECK(worst(dt, xc, c, NH) < tol, "%s N=%lld H=%lld: c off by %g", dn, (long long)N,
          (long long)H, worst(dt, xc, c, NH));
    CHECK(worst(dt, xact, act, NG) < tol, "%s N=%lld H=%lld%s: activations off by %g", dn,
          (long long)N, (long long)H, in_place ? " in place" : "", worst(dt, xact, act, NG));
  }
  /* the backward from the reference's own c and activations (the forward's
  ** float rounding stays out of the comparison) */
  void *ract = as(dt, act, NG), *rc = as(dt, c, NH);
  if (CHECK_OK(S, em_cpu_lstm_cell_backward(S, dt, N, H, ract, rc, xcp, xdh, two ? xdh2 : NULL,
                                            xdc, xdx))) {
    CHECK(worst(dt, xdx, dx, NG) < 4 * tol, "%s N=%lld H=%lld%s: gate gradients off by %g",
          dn, (long long)N, (long long)H, two ? " (two dh)" : "", worst(dt, xdx, dx, NG));
    CHECK(worst(dt, xdc, dcp, NH) < 4 * tol, "%s N=%lld H=%lld: c_prev's gradient off by %g",
          dn, (long long)N, (long long)H, worst(dt, xdc, dcp, NH));
  }
  if (!in_place) free(xact);
  free(xg); free(xg2); free(g2); free(xcp); free(xdh); free(xdh2); free(xdc); free(xh); free(xc); free(xdx);
  free(ract); free(rc);
  free(gates); free(cp); free(dh); free(dh2); free(dc); free(act); free(h); free(c); free(dx);
  free(dcp);
}

static void test_cell_values(em_state *S) {
  const int64_t widths[] = {1, 3, 64, 65, 130};
  for (int d = 0; d < 2; d++)
    for (size_t w = 0; w < sizeof widths / sizeof *widths; w++) {
      em_dtype dt = d ? EM_FLOAT64 : EM_FLOAT32;
      one_case(S, dt, 3, widths[w], 0, 0);
      one_case(S, dt, 2, widths[w], 1, 1);
    }
  /* rows enough for both threads: 16384 / (4 * 65) = 63 rows a share */
  one_case(S, EM_FLOAT32, 200, 65, 1, 1);
  one_case(S, EM_FLOAT64, 130, 130, 0, 1);
  one_case(S, EM_FLOAT32, 0, 5, 0, 0);   /* no rows: nothing to do */
}

static void test_cell_errors(em_state *S) {
  float b[16] = {0};
  CHECK_ERR(S, em_cpu_lstm_cell_forward(S, EM_INT32, 1, 1, b, NULL, b, b, b, b), EM_ERR_DTYPE,
            "lstm_cell_forward", "float32 or float64", "int32");
  CHECK_ERR(S, em_cpu_lstm_cell_backward(S, EM_BFLOAT16, 1, 1, b, b, b, b, NULL, b, b),
            EM_ERR_DTYPE, "lstm_cell_backward", "bfloat16");
  CHECK_ERR(S, em_cpu_lstm_cell_forward(S, EM_FLOAT32, 1, 0, b, NULL, b, b, b, b), EM_ERR_ARG,
            "lstm_cell_forward", "bad sizes", "H = 0");
  CHECK_ERR(S, em_cpu_lstm_cell_backward(S, EM_FLOAT32, -1, 2, b, b, b, b, NULL, b, b),
            EM_ERR_ARG, "lstm_cell_backward", "bad sizes", "N = -1");
  CHECK_ERR(S, em_cpu_lstm_cell_forward(S, EM_FLOAT32, 1, 1, b, NULL, NULL, b, b, b), EM_ERR_ARG,
            "NULL buffer");
  CHECK_ERR(S, em_cpu_lstm_cell_backward(S, EM_FLOAT32, 1, 1, b, b, b, b, NULL, NULL, b),
            EM_ERR_ARG, "NULL buffer");
}

int main(void) {
  em_config cfg;
  em_config_init(&cfg);
  cfg.num_threads = 2;
  em_state *S = NULL;
  if (em_open(&S, &cfg) != EM_OK) return 1;
  RUN(test_cell_values, S);
  RUN(test_cell_errors, S);
  em_close(S);
  return check_done();
}

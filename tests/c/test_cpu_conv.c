/*
** test_cpu_conv.c -- float32 conv2d on the shapes that take the im2col-free path
** (core/cpu/conv_fast.c: stride 1, eight or more input channels per group; with
** AVX2 the forward reads the output's columns through a column map and applies
** the bias as it stores), forward and backward, against the float64 conv2d of
** the same numbers (im2col and BLAS, another code path). Output widths below,
** at and above the kernel's 8-float vectors and 24-column panels, several runs
** per panel, padding, dilation, groups, a row tail of output channels, with and
** without bias.
*/
#include "check.h"
#include <math.h>

static double val(uint32_t *s) {
  *s = *s * 1664525u + 1013904223u;
  return (double)((*s >> 8) & 0xffff) / 32768.0 - 1.0;
}

/* One tensor of each dtype from the same numbers. */
static int pair(em_state *S, const int64_t *shape, uint32_t seed, em_tensor **f,
                em_tensor **d) {
  int64_t n = shape[0] * shape[1] * shape[2] * shape[3];
  double *v = malloc(sizeof(double) * (size_t)n);
  for (int64_t i = 0; i < n; i++) v[i] = val(&seed);
  int ok = t_make(S, f, EM_FLOAT32, shape, 4, v, n) == EM_OK &&
           t_make(S, d, EM_FLOAT64, shape, 4, v, n) == EM_OK;
  free(v);
  return ok;
}

/* The largest |a - b| / (1 + |b|) over the elements. */
static double worst(const em_tensor *a, const em_tensor *b) {
  double w = 0;
  for (int64_t i = 0; i < em_tensor_numel(b); i++) {
    double x = t_get(a, i), y = t_get(b, i), e = fabs(x - y) / (1 + fabs(y));
    if (!(e <= w)) w = e;   /* a NaN counts as the worst */
  }
  return w;
}

/* N C H W O k pad dil groups bias */
static const int64_t cases[][10] = {
    {2, 8, 5, 5, 8, 3, 1, 1, 1, 1},      /* OW 5: one run per row, several per panel */
    {2, 32, 14, 14, 64, 3, 1, 1, 1, 1},  /* the Fashion-MNIST CNN's second conv */
    {1, 16, 9, 30, 13, 3, 1, 1, 1, 0},   /* OW 30: a run across two panels; row tail */
    {2, 8, 12, 8, 8, 3, 0, 1, 1, 1},     /* OW 6, no padding */
    {1, 16, 11, 27, 10, 5, 2, 2, 2, 1},  /* dilation 2, groups 2 */
    {1, 8, 28, 28, 12, 3, 1, 1, 1, 1},   /* OW 28 */
};

static void test_conv_fast_vs_f64(em_state *S) {
  for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
    const int64_t *p = cases[c];
    int64_t N = p[0], C = p[1], H = p[2], W = p[3], O = p[4], k = p[5], G = p[8];
    int64_t st[2] = {1, 1}, pd[2] = {p[6], p[6]}, dl[2] = {p[7], p[7]};
    int64_t OH = H + 2 * p[6] - p[7] * (k - 1), OW = W + 2 * p[6] - p[7] * (k - 1);
    int64_t xs[4] = {N, C, H, W}, ws[4] = {O, C / G, k, k}, bs[4] = {1, 1, 1, O},
            ys[4] = {N, O, OH, OW};
    em_tensor *xf = NULL, *xd = NULL, *wf = NULL, *wd = NULL, *bf = NULL, *bd = NULL,
              *gf = NULL, *gd = NULL;
    REQUIRE(pair(S, xs, (uint32_t)c + 1, &xf, &xd) && pair(S, ws, (uint32_t)c + 11, &wf, &wd) &&
            pair(S, bs, (uint32_t)c + 21, &bf, &bd) && pair(S, ys, (uint32_t)c + 31, &gf, &gd),
            "inputs");
    em_tensor *b1f = NULL, *b1d = NULL;
    if (p[9]) {
      REQUIRE_OK(S, em_reshape(S, bf, (int64_t[]){O}, 1, &b1f));
      REQUIRE_OK(S, em_reshape(S, bd, (int64_t[]){O}, 1, &b1d));
    }
    em_tensor *yf = NULL, *yd = NULL, *gxf = NULL, *gwf = NULL, *gbf = NULL, *gxd = NULL,
              *gwd = NULL, *gbd = NULL;
    REQUIRE_OK(S, em_conv2d(S, xf, wf, b1f, st, pd, dl, G, &yf));
    REQUIRE_OK(S, em_conv2d(S, xd, wd, b1d, st, pd, dl, G, &yd));
    REQUIRE_OK(S, em_conv2d_backward(S, gf, xf, wf, st, pd, dl, G, &gxf, &gwf, p[9] ? &gbf : NULL));
    REQUIRE_OK(S, em_conv2d_backward(S, gd, xd, wd, st, pd, dl, G, &gxd, &gwd, p[9] ? &gbd : NULL));
    double tol = 2e-6 * (double)(C / G * k * k + OH * OW);
    double e[4] = {worst(yf, yd), worst(gxf, gxd), worst(gwf, gwd), p[9] ? worst(gbf, gbd) : 0};
    static const char *const what[4] = {"output", "input gradient", "weight gradient",
                                        "bias gradient"};
    for (int q = 0; q < 4; q++)
      CHECK(e[q] <= tol, "case %zu (%lldx%lld -> %lldx%lld, C %lld O %lld): %s off by %.3g > %.3g",
            c, (long long)H, (long long)W, (long long)OH, (long long)OW, (long long)C,
            (long long)O, what[q], e[q], tol);
    em_tensor *all[] = {xf, xd, wf, wd, bf, bd, gf, gd, b1f, b1d, yf, yd, gxf, gwf, gbf, gxd, gwd, gbd};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++) em_tensor_release(all[i]);
  }
}

int main(void) {
  em_config cfg;
  em_config_init(&cfg);
  cfg.num_threads = 2;   /* the batch split between threads, as in training */
  em_state *S = NULL;
  if (em_open(&S, &cfg) != EM_OK) return 1;
  RUN(test_conv_fast_vs_f64, S);
  em_close(S);
  return check_done();
}

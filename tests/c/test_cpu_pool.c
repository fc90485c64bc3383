/*
** test_cpu_pool.c -- max pooling with the 2x2 window and stride 2 (the forward
** in core/cpu/pool_avx2.c on CPUs with AVX2, pool_impl.h's loops elsewhere; the
** backward's scatter) against a plain reference written here, bit for bit:
** values and indices of the forward and the input gradient of the backward, in
** float32 and float64, over widths that leave 0 to 7 outputs after the last full
** vector, odd heights and widths (an uncovered last row or column), ties, NaNs,
** signed zeros and infinities, index_base 0 and 1, strided input, and indices a
** user passed that point outside their windows (the scatter then adds several
** gradients into one place).
*/
#include "check.h"
#include <math.h>

/* A value from a small set (ties), with NaN, -0, +0 and -inf among them. */
static double pick(uint32_t *s, int specials) {
  *s = *s * 1664525u + 1013904223u;
  uint32_t r = *s >> 8;
  if (specials && r % 23 == 0) return NAN;
  if (specials && r % 29 == 0) return -0.0;
  if (specials && r % 31 == 0) return -INFINITY;
  return (double)((int)(r % 9) - 4) * 0.5;
}

static em_tensor *filled(em_state *S, const int64_t *shape, int nd, em_dtype dt, uint32_t seed,
                         int specials) {
  int64_t n = 1;
  for (int i = 0; i < nd; i++) n *= shape[i];
  double *v = malloc(sizeof(double) * (size_t)n);
  for (int64_t i = 0; i < n; i++) v[i] = pick(&seed, specials);
  em_tensor *t = NULL;
  if (em_from_data(S, shape, nd, dt, v, EM_FLOAT64, &t) != EM_OK) t = NULL;
  free(v);
  return t;
}

static int same_bits(double a, double b, em_dtype dt) {
  if (dt == EM_FLOAT32) {
    float x = (float)a, y = (float)b;
    return memcmp(&x, &y, sizeof x) == 0;
  }
  return memcmp(&a, &b, sizeof a) == 0;
}

/* The reference forward and backward of one (planes, H, W) input x. */
static void reference(const double *x, const double *gy, int64_t P, int64_t H, int64_t W,
                      double *y, int64_t *ind, double *gx, int base) {
  int64_t OH = H / 2, OW = W / 2;
  for (int64_t i = 0; i < P * H * W; i++) gx[i] = 0;
  for (int64_t p = 0; p < P; p++)
    for (int64_t oh = 0; oh < OH; oh++)
      for (int64_t ow = 0; ow < OW; ow++) {
        int64_t at[4] = {2 * oh * W + 2 * ow, 2 * oh * W + 2 * ow + 1, (2 * oh + 1) * W + 2 * ow,
                         (2 * oh + 1) * W + 2 * ow + 1};
        int64_t bi = at[0];
        double best = x[p * H * W + at[0]];
        for (int q = 1; q < 4; q++) {
          double v = x[p * H * W + at[q]];
          if (v > best || v != v) {
            best = v;
            bi = at[q];
          }
        }
        int64_t o = (p * OH + oh) * OW + ow;
        y[o] = best;
        ind[o] = bi + base;
        gx[p * H * W + bi] += gy[o];
      }
}

static void one_shape(em_state *S, em_dtype dt, int64_t H, int64_t W, int base, int strided) {
  const int64_t N = 2, C = 3, P = N * C, OH = H / 2, OW = W / 2;
  int64_t xs[4] = {N, C, H, strided ? 2 * W : W}, ys[4] = {N, C, OH, OW};
  uint32_t seed = (uint32_t)(H * 131 + W * 7 + base + (dt == EM_FLOAT32));
  em_tensor *xw = filled(S, xs, 4, dt, seed, 1), *gy = filled(S, ys, 4, dt, seed + 1, 1);
  em_tensor *x = xw, *y = NULL, *ind = NULL, *gx = NULL;
  if (strided) {   /* every other column of a twice-as-wide tensor */
    int64_t sizes[4] = {N, C, H, W}, strides[4] = {C * H * 2 * W, H * 2 * W, 2 * W, 2};
    x = NULL;
    REQUIRE_OK(S, em_as_strided(S, xw, sizes, strides, 4, 0, &x));
  }
  int64_t k[2] = {2, 2}, zero[2] = {0, 0};
  REQUIRE_OK(S, em_max_pool2d(S, x, k, NULL, zero, NULL, 0, base, &y, &ind));
  REQUIRE_OK(S, em_max_pool2d_backward(S, gy, x, ind, base, &gx));
  double *xv = malloc(sizeof(double) * (size_t)(P * H * W)), *gv = malloc(sizeof(double) * (size_t)(P * OH * OW));
  double *ry = malloc(sizeof(double) * (size_t)(P * OH * OW)), *rg = malloc(sizeof(double) * (size_t)(P * H * W));
  int64_t *ri = malloc(sizeof(int64_t) * (size_t)(P * OH * OW));
  em_tensor *xc = NULL;
  REQUIRE_OK(S, em_contiguous(S, x, &xc));
  for (int64_t i = 0; i < P * H * W; i++) xv[i] = t_get(xc, i);
  for (int64_t i = 0; i < P * OH * OW; i++) gv[i] = t_get(gy, i);
  reference(xv, gv, P, H, W, ry, ri, rg, base);
  const int64_t *iv = em_tensor_data(ind);
  int bad_y = 0, bad_i = 0, bad_g = 0;
  for (int64_t i = 0; i < P * OH * OW; i++) {
    bad_y += !same_bits(t_get(y, i), ry[i], dt);
    bad_i += iv[i] != ri[i];
  }
  for (int64_t i = 0; i < P * H * W; i++) bad_g += !same_bits(t_get(gx, i), rg[i], dt);
  CHECK(!bad_y, "%s %lldx%lld base %d%s: %d outputs differ", em_dtype_name(dt), (long long)H,
        (long long)W, base, strided ? " strided" : "", bad_y);
  CHECK(!bad_i, "%s %lldx%lld base %d%s: %d indices differ", em_dtype_name(dt), (long long)H,
        (long long)W, base, strided ? " strided" : "", bad_i);
  CHECK(!bad_g, "%s %lldx%lld base %d%s: %d input gradients differ", em_dtype_name(dt),
        (long long)H, (long long)W, base, strided ? " strided" : "", bad_g);

  /* indices a user passed: every output of a plane points at the plane's second
  ** element (inside the first window only), so gradients add up there */
  em_tensor *uind = NULL, *ugx = NULL;
  REQUIRE_OK(S, em_full(S, ys, 4, 1 + base, EM_INT64, EM_CPU, &uind));
  REQUIRE_OK(S, em_max_pool2d_backward(S, gy, x, uind, base, &ugx));
  int bad_u = 0;
  for (int64_t p = 0; p < P; p++)
    for (int64_t i = 0; i < H * W; i++) {
      double want = 0;
      if (i == 1)
        for (int64_t o = 0; o < OH * OW; o++) want += gv[p * OH * OW + o];
      if (dt == EM_FLOAT32) {   /* float sums in float, in order */
        float f = 0;
        if (i == 1)
          for (int64_t o = 0; o < OH * OW; o++) f += (float)gv[p * OH * OW + o];
        want = f;
      }
      bad_u += !same_bits(t_get(ugx, p * H * W + i), want, dt);
    }
  CHECK(!bad_u, "%s %lldx%lld: user indices outside their windows: %d gradients differ",
        em_dtype_name(dt), (long long)H, (long long)W, bad_u);
  em_tensor_release(uind); em_tensor_release(ugx);
  free(xv); free(gv); free(ry); free(rg); free(ri);
  em_tensor_release(xc); em_tensor_release(y); em_tensor_release(ind); em_tensor_release(gx);
  if (x != xw) em_tensor_release(x);
  em_tensor_release(xw); em_tensor_release(gy);
}

static void test_max_pool_2x2(em_state *S) {
  static const int64_t Hs[] = {2, 3, 6}, Ws[] = {2, 3, 14, 15, 16, 17, 18, 28, 29, 30, 31, 32, 33, 47};
  for (int d = 0; d < 2; d++)
    for (size_t a = 0; a < sizeof Hs / sizeof *Hs; a++)
      for (size_t b = 0; b < sizeof Ws / sizeof *Ws; b++)
        one_shape(S, d ? EM_FLOAT64 : EM_FLOAT32, Hs[a], Ws[b], (int)((a + b) % 2),
                  (int)(b % 3 == 0));
}

int main(void) {
  em_config cfg;
  em_config_init(&cfg);
  cfg.num_threads = 2;   /* planes split between threads, as in training */
  em_state *S = NULL;
  if (em_open(&S, &cfg) != EM_OK) return 1;
  RUN(test_max_pool_2x2, S);
  em_close(S);
  return check_done();
}

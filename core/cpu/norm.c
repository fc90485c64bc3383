/*
** norm.c -- CPU batch norm and layer norm kernels. Statistics are summed in
** double (two passes: mean, then squared deviations) so that float32 inputs
** with large means keep their variance. Batch norm works channel by channel
** over an (N, C, L) view; layer norm row by row over (M, K). Compiled twice
** (float, double) by self-include.
*/
#ifndef NN_T
#include "nn.h"
#include <math.h>

typedef struct norm_job {
  int64_t N, C, L, M, K;
  const void *x, *gy, *w, *b, *cmean, *crstd;
  void *y, *gx, *gw, *gb, *mean_o, *rstd_o;
  const double *mean, *invstd;
  double *var, *dmean, eps;
  int training;
} norm_job;

static int64_t norm_grain(int64_t per) { int64_t g = 32768 / (per ? per : 1); return g < 1 ? 1 : g; }

#define NN_T float
#define NN_S(x) x##_f32
#include "norm.c"
#undef NN_T
#undef NN_S
#define NN_T double
#define NN_S(x) x##_f64
#include "norm.c"
#undef NN_T
#undef NN_S

#define PICK(fn, dt) ((dt) == EM_FLOAT32 ? fn##_f32 : fn##_f64)

void emi_cpu_batch_norm_stats(em_state *S, em_dtype dt, int64_t N, int64_t C, int64_t L,
                              const void *x, double *mean, double *var) {
  norm_job j = {.N = N, .C = C, .L = L, .x = x, .dmean = mean, .var = var};
  emi_parallel_for(S, C, norm_grain(N * L * 2), PICK(bn_stats, dt), &j);
}
void emi_cpu_batch_norm_apply(em_state *S, em_dtype dt, int64_t N, int64_t C, int64_t L,
                              const void *x, const double *mean, const double *invstd,
                              const void *w, const void *b, void *y) {
  norm_job j = {.N = N, .C = C, .L = L, .x = x, .mean = mean, .invstd = invstd, .w = w,
                .b = b, .y = y};
  emi_parallel_for(S, N * C, norm_grain(L), PICK(bn_apply, dt), &j);
}
void emi_cpu_batch_norm_backward(em_state *S, em_dtype dt, int64_t N, int64_t C,
                                 int64_t L, const void *gy, const void *x,
                                 const double *mean, const double *invstd, const void *w,
                                 int training, void *gx, void *gw, void *gb) {
  norm_job j = {.N = N, .C = C, .L = L, .gy = gy, .x = x, .mean = mean, .invstd = invstd,
                .w = w, .training = training, .gx = gx, .gw = gw, .gb = gb};
  emi_parallel_for(S, C, norm_grain(N * L * 3), PICK(bn_bwd, dt), &j);
}
void emi_cpu_layer_norm(em_state *S, em_dtype dt, int64_t M, int64_t K, const void *x,
                        const void *w, const void *b, double eps, void *y, void *mean,
                        void *rstd) {
  norm_job j = {.M = M, .K = K, .x = x, .w = w, .b = b, .eps = eps, .y = y, .mean_o = mean,
                .rstd_o = rstd};
  emi_parallel_for(S, M, norm_grain(K * 3), PICK(ln_fwd, dt), &j);
}
em_status emi_cpu_layer_norm_backward(em_state *S, em_dtype dt, int64_t M, int64_t K,
                                      const void *gy, const void *x, const void *mean,
                                      const void *rstd, const void *w, void *gx,
                                      void *gw, void *gb) {
  norm_job j = {.M = M, .K = K, .gy = gy, .x = x, .cmean = mean, .crstd = rstd, .w = w,
                .gx = gx};
  if (gx) emi_parallel_for(S, M, norm_grain(K * 4), PICK(ln_bwd_x, dt), &j);
  if (gw || gb) {
    size_t bytes = (size_t)K * 2 * sizeof(double) + 8;
    double *acc = emi_malloc(S, bytes);
    if (!acc)
      return emi_error(S, EM_ERR_NOMEM, "layer_norm_backward: out of memory for %zu bytes",
                       bytes);
    if (dt == EM_FLOAT32) ln_bwd_wb_f32(&j, acc, gw, gb);
    else ln_bwd_wb_f64(&j, acc, gw, gb);
    emi_free(S, acc, bytes);
  }
  return EM_OK;
}

#else /* ---- typed body ---- */

static void NN_S(bn_stats)(void *ctx, int64_t c0, int64_t c1) {
  const norm_job *j = ctx;
  const NN_T *x = j->x;
  for (int64_t c = c0; c < c1; c++) {
    double s = 0, q = 0;
    for (int64_t n = 0; n < j->N; n++) {
      const NN_T *r = x + (n * j->C + c) * j->L;
      NN_T a = 0;
      for (int64_t l = 0; l < j->L; l++) a += r[l];
      s += a;
    }
    double m = s / (double)(j->N * j->L);
    for (int64_t n = 0; n < j->N; n++) {
      const NN_T *r = x + (n * j->C + c) * j->L;
      double a = 0;
      for (int64_t l = 0; l < j->L; l++) {
        double d = (double)r[l] - m;
        a += d * d;
      }
      q += a;
    }
    j->dmean[c] = m;
    j->var[c] = q / (double)(j->N * j->L);
  }
}

static void NN_S(bn_apply)(void *ctx, int64_t p0, int64_t p1) {
  const norm_job *j = ctx;
  const NN_T *x = j->x, *w = j->w, *b = j->b;
  NN_T *y = j->y;
  for (int64_t p = p0; p < p1; p++) {
    int64_t c = p % j->C;
    NN_T sc = (NN_T)j->invstd[c] * (w ? w[c] : 1);
    NN_T sh = (b ? b[c] : 0) - (NN_T)j->mean[c] * sc;
    const NN_T *r = x + p * j->L;
    NN_T *o = y + p * j->L;
    for (int64_t l = 0; l < j->L; l++) o[l] = r[l] * sc + sh;
  }
}

static void NN_S(bn_bwd)(void *ctx, int64_t c0, int64_t c1) {
  const norm_job *j = ctx;
  const NN_T *x = j->x, *gy = j->gy, *w = j->w;
  NN_T *gx = j->gx, *gw = j->gw, *gb = j->gb;
  double cnt = (double)(j->N * j->L);
  for (int64_t c = c0; c < c1; c++) {
    double m = j->mean[c], is = j->invstd[c], sg = 0, sgx = 0;
    for (int64_t n = 0; n < j->N; n++) {
      const NN_T *r = x + (n * j->C + c) * j->L, *g = gy + (n * j->C + c) * j->L;
      NN_T a = 0, b = 0;
      for (int64_t l = 0; l < j->L; l++) {
        a += g[l];
        b += g[l] * (r[l] - (NN_T)m);
      }
      sg += a;
      sgx += b;
    }
    if (gw) gw[c] = (NN_T)(sgx * is);
    if (gb) gb[c] = (NN_T)sg;
    if (!gx) continue;
    double wc = w ? (double)w[c] : 1;
    NN_T k = (NN_T)(wc * is), mg = (NN_T)(sg / cnt), pr = (NN_T)(sgx * is * is / cnt);
    for (int64_t n = 0; n < j->N; n++) {
      const NN_T *r = x + (n * j->C + c) * j->L, *g = gy + (n * j->C + c) * j->L;
      NN_T *o = gx + (n * j->C + c) * j->L;
      if (j->training)
        for (int64_t l = 0; l < j->L; l++) o[l] = k * (g[l] - mg - (r[l] - (NN_T)m) * pr);
      else
        for (int64_t l = 0; l < j->L; l++) o[l] = k * g[l];
    }
  }
}

static void NN_S(ln_fwd)(void *ctx, int64_t r0, int64_t r1) {
  const norm_job *j = ctx;
  const NN_T *x = j->x, *w = j->w, *b = j->b;
  NN_T *y = j->y, *mo = j->mean_o, *ro = j->rstd_o;
  for (int64_t i = r0; i < r1; i++) {
    const NN_T *r = x + i * j->K;
    NN_T *o = y + i * j->K;
    double s = 0, q = 0;
    for (int64_t k = 0; k < j->K; k++) s += r[k];
    double m = s / (double)j->K;
    for (int64_t k = 0; k < j->K; k++) { double d = r[k] - m; q += d * d; }
    double rs = 1 / sqrt(q / (double)j->K + j->eps);
    mo[i] = (NN_T)m;
    ro[i] = (NN_T)rs;
    NN_T fm = (NN_T)m, fr = (NN_T)rs;
    for (int64_t k = 0; k < j->K; k++) {
      NN_T v = (r[k] - fm) * fr;
      o[k] = v * (w ? w[k] : 1) + (b ? b[k] : 0);
    }
  }
}

static void NN_S(ln_bwd_x)(void *ctx, int64_t r0, int64_t r1) {
  const norm_job *j = ctx;
  const NN_T *x = j->x, *gy = j->gy, *w = j->w, *mean = j->cmean, *rstd = j->crstd;
  NN_T *gx = j->gx;
  for (int64_t i = r0; i < r1; i++) {
    const NN_T *r = x + i * j->K, *g = gy + i * j->K;
    NN_T *o = gx + i * j->K, m = mean[i], rs = rstd[i];
    double a = 0, b = 0;   /* sum(g*w), sum(g*w*xhat) */
    for (int64_t k = 0; k < j->K; k++) {
      NN_T gw = g[k] * (w ? w[k] : 1);
      a += gw;
      b += gw * (r[k] - m) * rs;
    }
    NN_T ma = (NN_T)(a / (double)j->K), mb = (NN_T)(b / (double)j->K);
    for (int64_t k = 0; k < j->K; k++)
      o[k] = rs * (g[k] * (w ? w[k] : 1) - ma - (r[k] - m) * rs * mb);
  }
}

static void NN_S(ln_bwd_wb)(const norm_job *j, double *acc, NN_T *gw, NN_T *gb) {
  const NN_T *x = j->x, *gy = j->gy, *mean = j->cmean, *rstd = j->crstd;
  for (int64_t k = 0; k < 2 * j->K; k++) acc[k] = 0;
  for (int64_t i = 0; i < j->M; i++) {
    const NN_T *r = x + i * j->K, *g = gy + i * j->K;
    NN_T m = mean[i], rs = rstd[i];
    for (int64_t k = 0; k < j->K; k++) {
      acc[k] += g[k] * (r[k] - m) * rs;
      acc[j->K + k] += g[k];
    }
  }
  for (int64_t k = 0; k < j->K; k++) {
    if (gw) gw[k] = (NN_T)acc[k];
    if (gb) gb[k] = (NN_T)acc[j->K + k];
  }
}

#endif

/*
** normalize.c -- CPU kernels of the normalization layers, batch norm and layer
** norm. Statistics are summed in double (two passes: mean, then squared
** deviations) so that float32 inputs with large means keep their variance.
** Batch norm works channel by channel over an (N, C, L) view (and moves the
** running statistics, PyTorch's rule: the biased variance normalizes, the
** unbiased one goes into running_var); layer norm row by row over (M, K). The
** loops are written once, in NORMALIZE_KERNELS, for float and double.
*/
#include "cpu.h"
#include <math.h>

typedef struct normalize_job {
  int64_t N, C, L, M, K;
  const void *x, *gy, *w, *b, *cmean, *crstd;
  void *y, *gx, *gw, *gb, *mean_o, *rstd_o;
  const double *mean, *invstd;
  double *var, *dmean, eps;
  int training;
} normalize_job;

static int64_t normalize_grain(int64_t per) {
  int64_t g = 32768 / (per ? per : 1);
  return g < 1 ? 1 : g;
}

/* -- Per-dtype loops (T is float or double) ------------------------------------------ */
#define NORMALIZE_KERNELS(T, SFX)                                                           \
static void bn_stats_##SFX(void *ctx, int64_t c0, int64_t c1) {                             \
  const normalize_job *j = ctx;                                                             \
  const T *x = j->x;                                                                        \
  for (int64_t c = c0; c < c1; c++) {                                                       \
    double s = 0, q = 0;                                                                    \
    for (int64_t n = 0; n < j->N; n++) {                                                    \
      const T *r = x + (n * j->C + c) * j->L;                                               \
      T a = 0;                                                                              \
      for (int64_t l = 0; l < j->L; l++) a += r[l];                                         \
      s += a;                                                                               \
    }                                                                                       \
    double m = s / (double)(j->N * j->L);                                                   \
    for (int64_t n = 0; n < j->N; n++) {                                                    \
      const T *r = x + (n * j->C + c) * j->L;                                               \
      double a = 0;                                                                         \
      for (int64_t l = 0; l < j->L; l++) {                                                  \
        double d = (double)r[l] - m;                                                        \
        a += d * d;                                                                         \
      }                                                                                     \
      q += a;                                                                               \
    }                                                                                       \
    j->dmean[c] = m;                                                                        \
    j->var[c] = q / (double)(j->N * j->L);                                                  \
  }                                                                                         \
}                                                                                           \
                                                                                            \
static void bn_apply_##SFX(void *ctx, int64_t p0, int64_t p1) {                             \
  const normalize_job *j = ctx;                                                             \
  const T *x = j->x, *w = j->w, *b = j->b;                                                  \
  T *y = j->y;                                                                              \
  for (int64_t p = p0; p < p1; p++) {                                                       \
    int64_t c = p % j->C;                                                                   \
    T sc = (T)j->invstd[c] * (w ? w[c] : 1);                                                \
    T sh = (b ? b[c] : 0) - (T)j->mean[c] * sc;                                             \
    const T *r = x + p * j->L;                                                              \
    T *o = y + p * j->L;                                                                    \
    for (int64_t l = 0; l < j->L; l++) o[l] = r[l] * sc + sh;                               \
  }                                                                                         \
}                                                                                           \
                                                                                            \
static void bn_bwd_##SFX(void *ctx, int64_t c0, int64_t c1) {                               \
  const normalize_job *j = ctx;                                                             \
  const T *x = j->x, *gy = j->gy, *w = j->w;                                                \
  T *gx = j->gx, *gw = j->gw, *gb = j->gb;                                                  \
  double cnt = (double)(j->N * j->L);                                                       \
  for (int64_t c = c0; c < c1; c++) {                                                       \
    double m = (double)((const T *)j->cmean)[c], is = (double)((const T *)j->crstd)[c];     \
    double sg = 0, sgx = 0;                                                                 \
    for (int64_t n = 0; n < j->N; n++) {                                                    \
      const T *r = x + (n * j->C + c) * j->L, *g = gy + (n * j->C + c) * j->L;              \
      T a = 0, b = 0;                                                                       \
      for (int64_t l = 0; l < j->L; l++) {                                                  \
        a += g[l];                                                                          \
        b += g[l] * (r[l] - (T)m);                                                          \
      }                                                                                     \
      sg += a;                                                                              \
      sgx += b;                                                                             \
    }                                                                                       \
    if (gw) gw[c] = (T)(sgx * is);                                                          \
    if (gb) gb[c] = (T)sg;                                                                  \
    if (!gx) continue;                                                                      \
    double wc = w ? (double)w[c] : 1;                                                       \
    T k = (T)(wc * is), mg = (T)(sg / cnt), pr = (T)(sgx * is * is / cnt);                  \
    for (int64_t n = 0; n < j->N; n++) {                                                    \
      const T *r = x + (n * j->C + c) * j->L, *g = gy + (n * j->C + c) * j->L;              \
      T *o = gx + (n * j->C + c) * j->L;                                                    \
      if (j->training)                                                                      \
        for (int64_t l = 0; l < j->L; l++) o[l] = k * (g[l] - mg - (r[l] - (T)m) * pr);     \
      else                                                                                  \
        for (int64_t l = 0; l < j->L; l++) o[l] = k * g[l];                                 \
    }                                                                                       \
  }                                                                                         \
}                                                                                           \
                                                                                            \
static void ln_fwd_##SFX(void *ctx, int64_t r0, int64_t r1) {                               \
  const normalize_job *j = ctx;                                                             \
  const T *x = j->x, *w = j->w, *b = j->b;                                                  \
  T *y = j->y, *mo = j->mean_o, *ro = j->rstd_o;                                            \
  for (int64_t i = r0; i < r1; i++) {                                                       \
    const T *r = x + i * j->K;                                                              \
    T *o = y + i * j->K;                                                                    \
    double s = 0, q = 0;                                                                    \
    for (int64_t k = 0; k < j->K; k++) s += r[k];                                           \
    double m = s / (double)j->K;                                                            \
    for (int64_t k = 0; k < j->K; k++) { double d = r[k] - m; q += d * d; }                 \
    double rs = 1 / sqrt(q / (double)j->K + j->eps);                                        \
    mo[i] = (T)m;                                                                           \
    ro[i] = (T)rs;                                                                          \
    T fm = (T)m, fr = (T)rs;                                                                \
    for (int64_t k = 0; k < j->K; k++) {                                                    \
      T v = (r[k] - fm) * fr;                                                               \
      o[k] = v * (w ? w[k] : 1) + (b ? b[k] : 0);                                           \
    }                                                                                       \
  }                                                                                         \
}                                                                                           \
                                                                                            \
static void ln_bwd_x_##SFX(void *ctx, int64_t r0, int64_t r1) {                             \
  const normalize_job *j = ctx;                                                             \
  const T *x = j->x, *gy = j->gy, *w = j->w, *mean = j->cmean, *rstd = j->crstd;            \
  T *gx = j->gx;                                                                            \
  for (int64_t i = r0; i < r1; i++) {                                                       \
    const T *r = x + i * j->K, *g = gy + i * j->K;                                          \
    T *o = gx + i * j->K, m = mean[i], rs = rstd[i];                                        \
    double a = 0, b = 0;   /* sum(g*w), sum(g*w*xhat) */                                    \
    for (int64_t k = 0; k < j->K; k++) {                                                    \
      T gw = g[k] * (w ? w[k] : 1);                                                         \
      a += gw;                                                                              \
      b += gw * (r[k] - m) * rs;                                                            \
    }                                                                                       \
    T ma = (T)(a / (double)j->K), mb = (T)(b / (double)j->K);                               \
    for (int64_t k = 0; k < j->K; k++)                                                      \
      o[k] = rs * (g[k] * (w ? w[k] : 1) - ma - (r[k] - m) * rs * mb);                      \
  }                                                                                         \
}                                                                                           \
                                                                                            \
static void ln_bwd_wb_##SFX(const normalize_job *j, double *acc, T *gw, T *gb) {            \
  const T *x = j->x, *gy = j->gy, *mean = j->cmean, *rstd = j->crstd;                       \
  for (int64_t k = 0; k < 2 * j->K; k++) acc[k] = 0;                                        \
  for (int64_t i = 0; i < j->M; i++) {                                                      \
    const T *r = x + i * j->K, *g = gy + i * j->K;                                          \
    T m = mean[i], rs = rstd[i];                                                            \
    for (int64_t k = 0; k < j->K; k++) {                                                    \
      acc[k] += g[k] * (r[k] - m) * rs;                                                     \
      acc[j->K + k] += g[k];                                                                \
    }                                                                                       \
  }                                                                                         \
  for (int64_t k = 0; k < j->K; k++) {                                                      \
    if (gw) gw[k] = (T)acc[k];                                                              \
    if (gb) gb[k] = (T)acc[j->K + k];                                                       \
  }                                                                                         \
}

NORMALIZE_KERNELS(float, f32)
NORMALIZE_KERNELS(double, f64)
#undef NORMALIZE_KERNELS

/* -- Entries ---------------------------------------------------------------------------- */

#define PICK(fn, dt) ((dt) == EM_FLOAT32 ? fn##_f32 : fn##_f64)
static void *data_or_null(const em_tensor *t) { return t ? em_tensor_data(t) : NULL; }

/* Element i of a 1-D tensor of any stride, as a double. */
static double vget(const em_tensor *t, int64_t i) {
  return emi_load_f64((const char *)em_tensor_data(t) +
                      i * t->strides[0] * (int64_t)em_dtype_size(t->dtype), t->dtype);
}
static void vset(em_tensor *t, int64_t i, double v) {
  emi_store_f64((char *)em_tensor_data(t) + i * t->strides[0] * (int64_t)em_dtype_size(t->dtype),
                t->dtype, v);
}

/* x (N, C, ...) as (N, C, L). */
static void bn_dims(const em_tensor *x, int64_t *N, int64_t *C, int64_t *L) {
  *N = x->sizes[0];
  *C = x->sizes[1];
  *L = 1;
  for (int d = 2; d < x->ndim; d++) *L *= x->sizes[d];
}

em_status emi_cpu_batch_norm(emi_device *dev, em_tensor *y, em_tensor *mean,
                             em_tensor *invstd, em_tensor *running_mean,
                             em_tensor *running_var, const em_tensor *x, const em_tensor *w,
                             const em_tensor *b, int training, double momentum, double eps) {
  em_state *S = dev->S;
  em_dtype dt = x->dtype;
  int64_t N, C, L;
  bn_dims(x, &N, &C, &L);
  /* the statistics in double: apply rounds them exactly as the saved copies */
  size_t bytes = (size_t)C * 3 * sizeof(double) + 8;
  double *m = emi_malloc(S, bytes), *var = m + C, *inv = var + C;
  if (!m) return emi_error(S, EM_ERR_NOMEM, "batch_norm: out of memory");
  if (training) {
    normalize_job j = {.N = N, .C = C, .L = L, .x = em_tensor_data(x), .dmean = m, .var = var};
    emi_parallel_for(S, C, normalize_grain(N * L * 2), PICK(bn_stats, dt), &j);
    double cnt = (double)(N * L);
    for (int64_t c = 0; c < C; c++) {
      inv[c] = 1 / sqrt(var[c] + eps);
      if (running_mean)
        vset(running_mean, c, (1 - momentum) * vget(running_mean, c) + momentum * m[c]);
      if (running_var)
        vset(running_var, c, (1 - momentum) * vget(running_var, c) +
                                 momentum * var[c] * cnt / (cnt - 1));
    }
  } else {
    for (int64_t c = 0; c < C; c++) {
      m[c] = vget(running_mean, c);
      inv[c] = 1 / sqrt(vget(running_var, c) + eps);
    }
  }
  char *pm = em_tensor_data(mean), *pi = em_tensor_data(invstd);
  size_t es = em_dtype_size(dt);
  for (int64_t c = 0; c < C; c++) {
    emi_store_f64(pm + (size_t)c * es, dt, m[c]);
    emi_store_f64(pi + (size_t)c * es, dt, inv[c]);
  }
  normalize_job j = {.N = N, .C = C, .L = L, .x = em_tensor_data(x), .mean = m, .invstd = inv,
                     .w = data_or_null(w), .b = data_or_null(b), .y = em_tensor_data(y)};
  emi_parallel_for(S, N * C, normalize_grain(L), PICK(bn_apply, dt), &j);
  emi_free(S, m, bytes);
  return EM_OK;
}

em_status emi_cpu_batch_norm_backward(emi_device *dev, em_tensor *gx, em_tensor *gw,
                                      em_tensor *gb, const em_tensor *gy, const em_tensor *x,
                                      const em_tensor *mean, const em_tensor *invstd,
                                      const em_tensor *w, int training) {
  int64_t N, C, L;
  bn_dims(x, &N, &C, &L);
  normalize_job j = {.N = N, .C = C, .L = L, .gy = em_tensor_data(gy), .x = em_tensor_data(x),
                     .cmean = em_tensor_data(mean), .crstd = em_tensor_data(invstd),
                     .w = data_or_null(w), .training = training, .gx = data_or_null(gx),
                     .gw = data_or_null(gw), .gb = data_or_null(gb)};
  emi_parallel_for(dev->S, C, normalize_grain(N * L * 3), PICK(bn_bwd, x->dtype), &j);
  return EM_OK;
}

em_status emi_cpu_layer_norm(emi_device *dev, em_tensor *y, em_tensor *mean, em_tensor *rstd,
                             const em_tensor *x, const em_tensor *w, const em_tensor *b,
                             double eps) {
  int64_t M = mean->numel;
  if (M == 0) return EM_OK;
  int64_t K = x->numel / M;
  normalize_job j = {.M = M, .K = K, .x = em_tensor_data(x), .w = data_or_null(w),
                     .b = data_or_null(b), .eps = eps, .y = em_tensor_data(y),
                     .mean_o = em_tensor_data(mean), .rstd_o = em_tensor_data(rstd)};
  emi_parallel_for(dev->S, M, normalize_grain(K * 3), PICK(ln_fwd, x->dtype), &j);
  return EM_OK;
}

em_status emi_cpu_layer_norm_backward(emi_device *dev, em_tensor *gx, em_tensor *gw,
                                      em_tensor *gb, const em_tensor *gy, const em_tensor *x,
                                      const em_tensor *mean, const em_tensor *rstd,
                                      const em_tensor *w) {
  em_state *S = dev->S;
  em_dtype dt = x->dtype;
  int64_t M = mean->numel;
  int64_t K = M ? x->numel / M : gw ? gw->numel : gb ? gb->numel : 0;
  normalize_job j = {.M = M, .K = K, .gy = em_tensor_data(gy), .x = em_tensor_data(x),
                     .cmean = em_tensor_data(mean), .crstd = em_tensor_data(rstd),
                     .w = data_or_null(w), .gx = data_or_null(gx)};
  if (gx) emi_parallel_for(S, M, normalize_grain(K * 4), PICK(ln_bwd_x, dt), &j);
  if (gw || gb) {
    size_t bytes = (size_t)K * 2 * sizeof(double) + 8;
    double *acc = emi_malloc(S, bytes);
    if (!acc)
      return emi_error(S, EM_ERR_NOMEM, "layer_norm_backward: out of memory for %zu bytes",
                       bytes);
    void *pgw = data_or_null(gw), *pgb = data_or_null(gb);
    if (dt == EM_FLOAT32) ln_bwd_wb_f32(&j, acc, pgw, pgb);
    else ln_bwd_wb_f64(&j, acc, pgw, pgb);
    emi_free(S, acc, bytes);
  }
  return EM_OK;
}

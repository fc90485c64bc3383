/*
** normalize.c -- CPU kernels of the normalization layers, batch norm and layer
** norm. Statistics are summed in double (two passes: mean, then squared
** deviations) so that float32 inputs with large means keep their variance.
** Batch norm works channel by channel over an (N, C, L) view (and moves the
** running statistics, PyTorch's rule: the biased variance normalizes, the
** unbiased one goes into running_var); layer norm row by row over (M, K). The
** loops are written once, in normalize_impl.h, which this file includes for
** float and for double. A channels-last (non-contiguous) x takes bn_nhwc.c's loops,
** a float16/bfloat16 x (with float32 parameters and statistics) bn_half.c's.
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
  int relu;           /* batch norm's apply: then ReLU */
} normalize_job;

static int64_t normalize_grain(int64_t per) {
  int64_t g = 32768 / (per ? per : 1);
  return g < 1 ? 1 : g;
}

/* -- Per-dtype loops (normalize_impl.h, T float then double) ---------------------------- */

#define T float
#define FN(name) name##_f32
#include "normalize_impl.h"
#define T double
#define FN(name) name##_f64
#include "normalize_impl.h"

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

static em_status batch_norm(emi_device *dev, em_tensor *y, em_tensor *mean,
                            em_tensor *invstd, em_tensor *running_mean,
                            em_tensor *running_var, const em_tensor *x, const em_tensor *w,
                            const em_tensor *b, int training, double momentum, double eps,
                            int relu) {
  em_state *S = dev->S;
  em_dtype dt = x->dtype;
  int64_t N, C, L;
  bn_dims(x, &N, &C, &L);
  bool nhwc = !em_tensor_is_contiguous(x);   /* the ops layer gives NCHW or NHWC, dense */
  /* the statistics in double: apply rounds them exactly as the saved copies */
  size_t bytes = (size_t)C * 3 * sizeof(double) + 8;
  double *m = emi_malloc(S, bytes), *var = m + C, *inv = var + C;
  if (!m) return emi_error(S, EM_ERR_NOMEM, "batch_norm: out of memory");
  bool half = dt == EM_FLOAT16 || dt == EM_BFLOAT16;
  if (training) {
    normalize_job j = {.N = N, .C = C, .L = L, .x = em_tensor_data(x), .dmean = m, .var = var};
    em_status st = EM_OK;
    if (half) st = emi_cpu_bn_half_stats(S, dt, N, C, L, nhwc, em_tensor_data(x), m, var);
    else if (nhwc) st = emi_cpu_bn_nhwc_stats(S, dt, N * L, C, em_tensor_data(x), m, var);
    else emi_parallel_for(S, C, normalize_grain(N * L * 2), PICK(bn_stats, dt), &j);
    if (st != EM_OK) {   /* nothing written yet: the running statistics stay as they were */
      emi_free(S, m, bytes);
      return st;
    }
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
  em_dtype pdt = mean->dtype;   /* x's, or float32 for a half x */
  size_t es = em_dtype_size(pdt);
  for (int64_t c = 0; c < C; c++) {
    emi_store_f64(pm + (size_t)c * es, pdt, m[c]);
    emi_store_f64(pi + (size_t)c * es, pdt, inv[c]);
  }
  normalize_job j = {.N = N, .C = C, .L = L, .x = em_tensor_data(x), .mean = m, .invstd = inv,
                     .w = data_or_null(w), .b = data_or_null(b), .y = em_tensor_data(y),
                     .relu = relu};
  if (half)
    emi_cpu_bn_half_apply(S, dt, N, C, L, nhwc, j.x, m, inv, j.w, j.b, j.y, relu);
  else if (nhwc)
    emi_cpu_bn_nhwc_apply(S, dt, N * L, C, j.x, m, inv, j.w, j.b, j.y, relu);
  else
    emi_parallel_for(S, N * C, normalize_grain(L), PICK(bn_apply, dt), &j);
  emi_free(S, m, bytes);
  return EM_OK;
}

em_status emi_cpu_batch_norm(emi_device *dev, em_tensor *y, em_tensor *mean,
                             em_tensor *invstd, em_tensor *running_mean,
                             em_tensor *running_var, const em_tensor *x, const em_tensor *w,
                             const em_tensor *b, int training, double momentum, double eps) {
  return batch_norm(dev, y, mean, invstd, running_mean, running_var, x, w, b, training,
                    momentum, eps, 0);
}

em_status emi_cpu_batch_norm_relu(emi_device *dev, em_tensor *y, em_tensor *mean,
                                  em_tensor *invstd, em_tensor *running_mean,
                                  em_tensor *running_var, const em_tensor *x,
                                  const em_tensor *w, const em_tensor *b, int training,
                                  double momentum, double eps) {
  return batch_norm(dev, y, mean, invstd, running_mean, running_var, x, w, b, training,
                    momentum, eps, 1);
}

em_status emi_cpu_batch_norm_backward(emi_device *dev, em_tensor *gx, em_tensor *gw,
                                      em_tensor *gb, const em_tensor *gy, const em_tensor *x,
                                      const em_tensor *mean, const em_tensor *invstd,
                                      const em_tensor *w, int training) {
  int64_t N, C, L;
  bn_dims(x, &N, &C, &L);
  if (x->dtype == EM_FLOAT16 || x->dtype == EM_BFLOAT16)
    return emi_cpu_bn_half_backward(dev->S, x->dtype, N, C, L, !em_tensor_is_contiguous(x),
                                    em_tensor_data(gy), em_tensor_data(x),
                                    em_tensor_data(mean), em_tensor_data(invstd),
                                    data_or_null(w), training, data_or_null(gx),
                                    data_or_null(gw), data_or_null(gb));
  if (!em_tensor_is_contiguous(x))   /* channels last */
    return emi_cpu_bn_nhwc_backward(dev->S, x->dtype, N * L, C, em_tensor_data(gy),
                                    em_tensor_data(x), em_tensor_data(mean),
                                    em_tensor_data(invstd), data_or_null(w), training,
                                    data_or_null(gx), data_or_null(gw), data_or_null(gb));
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

/*
** nn_loss.c -- CPU loss kernels: fused log_softmax + nll (cross entropy) with
** label smoothing, nll_loss, and the pointwise losses (mse, binary cross entropy
** on logits, in its stable form max(x,0) - x*y + log1p(exp(-|x|))). Sums are
** kept in double. Targets are read (any int dtype and stride), range-checked and
** turned into 0-based int64 plus an ignore mask before any output is written.
** The typed loops are written once, in LOSS_KERNELS, for float and double.
*/
#include "cpu.h"
#include <math.h>

/* -- Per-dtype loops (T is float or double) ------------------------------------------ */
#define LOSS_KERNELS(T, SFX)                                                                \
static void ce_fwd_##SFX(int64_t N, int64_t C, const T *x, const int64_t *t,                \
                         const unsigned char *ign, double smooth, double *loss,             \
                         T *lse_out) {                                                      \
  for (int64_t i = 0; i < N; i++) {                                                         \
    const T *r = x + i * C;                                                                 \
    T m = r[0];                                                                             \
    for (int64_t c = 1; c < C; c++) m = r[c] > m || isnan(r[c]) ? r[c] : m;                 \
    double s = 0, sx = 0;                                                                   \
    if (isinf(m) && m < 0) m = 0;          /* a row of -inf: avoid -inf - -inf */           \
    for (int64_t c = 0; c < C; c++) {                                                       \
      s += exp((double)r[c] - (double)m);                                                   \
      sx += r[c];                                                                           \
    }                                                                                       \
    double lse = (double)m + log(s);                                                        \
    if (lse_out) lse_out[i] = (T)lse;                                                       \
    if (ign[i]) { loss[i] = 0; continue; }                                                  \
    double l = (1 - smooth) * (lse - (double)r[t[i]]);                                      \
    if (smooth > 0) l += smooth * (lse - sx / (double)C);                                   \
    loss[i] = l;                                                                            \
  }                                                                                         \
}                                                                                           \
                                                                                            \
/* d loss_i / d x_ic = p_c - (1-eps)*[c == t] - eps/C. */                                   \
static void ce_bwd_##SFX(int64_t N, int64_t C, const T *x, const int64_t *t,                \
                         const unsigned char *ign, double smooth, const double *gl,         \
                         const T *lse, T *gx) {                                             \
  T off = (T)(smooth / (double)C);                                                          \
  for (int64_t i = 0; i < N; i++) {                                                         \
    const T *r = x + i * C;                                                                 \
    T *o = gx + i * C;                                                                      \
    if (ign[i]) {                                                                           \
      for (int64_t c = 0; c < C; c++) o[c] = 0;                                             \
      continue;                                                                             \
    }                                                                                       \
    T g = (T)gl[i], l = lse[i];                                                             \
    for (int64_t c = 0; c < C; c++) o[c] = g * ((T)exp(r[c] - l) - off);                    \
    o[t[i]] -= g * (T)(1 - smooth);                                                         \
  }                                                                                         \
}                                                                                           \
                                                                                            \
static double pw_fwd_##SFX(int kind, int64_t n, const T *x, const T *y, T *out) {           \
  double sum = 0;                                                                           \
  for (int64_t i = 0; i < n; i++) {                                                         \
    double l;                                                                               \
    if (kind == EMI_LOSS_MSE) {                                                             \
      double d = (double)x[i] - (double)y[i];                                               \
      l = d * d;                                                                            \
    } else {                                                                                \
      double v = x[i];                                                                      \
      l = (v > 0 ? v : 0) - v * (double)y[i] + log1p(exp(-fabs(v)));                        \
    }                                                                                       \
    if (out) out[i] = (T)l;                                                                 \
    sum += l;                                                                               \
  }                                                                                         \
  return sum;                                                                               \
}                                                                                           \
                                                                                            \
static void pw_bwd_##SFX(int kind, int64_t n, const T *x, const T *y, const T *gl,          \
                         double g, T *gx) {                                                 \
  for (int64_t i = 0; i < n; i++) {                                                         \
    double s = gl ? (double)gl[i] : g, d;                                                   \
    if (kind == EMI_LOSS_MSE) d = 2 * ((double)x[i] - (double)y[i]);                        \
    else {                                                                                  \
      double v = x[i], e = exp(-fabs(v));                                                   \
      double sig = v >= 0 ? 1 / (1 + e) : e / (1 + e);                                      \
      d = sig - (double)y[i];                                                               \
    }                                                                                       \
    gx[i] = (T)(s * d);                                                                     \
  }                                                                                         \
}

LOSS_KERNELS(float, f32)
LOSS_KERNELS(double, f64)
#undef LOSS_KERNELS

/* -- Targets, reductions and gradient factors ------------------------------------------ */

/* Targets as 0-based int64 plus an ignore mask (ignored rows: ign[i] = 1, not
** counted); one scratch block of `bytes`, freed with targets_free. */
typedef struct targets { int64_t *t; unsigned char *ign; int64_t count; size_t bytes; } targets;

static void targets_free(em_state *S, targets *tg) { emi_free(S, tg->t, tg->bytes); }

static em_status read_targets(em_state *S, const char *op, const em_tensor *target, int64_t N,
                              int64_t C, int index_base, int64_t ignore_index, targets *tg) {
  tg->bytes = (size_t)N * 9 + 8;
  if (!(tg->t = emi_malloc(S, tg->bytes)))
    return emi_error(S, EM_ERR_NOMEM, "%s: out of memory for %lld targets", op, (long long)N);
  tg->ign = (unsigned char *)(tg->t + N);
  tg->count = 0;
  const char *base = (const char *)em_tensor_data(target);
  size_t es = em_dtype_size(target->dtype);
  for (int64_t i = 0; i < N; i++) {
    const char *p = base + i * target->strides[0] * (int64_t)es;
    int64_t v = target->dtype == EM_INT64 ? *(const int64_t *)p : *(const int32_t *)p;
    tg->ign[i] = v == ignore_index;
    tg->t[i] = 0;
    if (tg->ign[i]) continue;
    if (v - index_base < 0 || v - index_base >= C) {
      targets_free(S, tg);
      return emi_error(S, EM_ERR_INDEX, "%s: target %lld is out of range for %lld classes "
                       "(index_base %d)", op, (long long)v, (long long)C, index_base);
    }
    tg->t[i] = v - index_base;
    tg->count++;
  }
  return EM_OK;
}

/* Rows and the per-row scratch of N doubles, or EM_ERR_NOMEM (targets freed). */
static em_status row_scratch(em_state *S, const char *op, targets *tg, int64_t N,
                             double **rows, size_t *bytes) {
  *bytes = (size_t)N * sizeof(double) + 8;
  if ((*rows = emi_malloc(S, *bytes))) return EM_OK;
  targets_free(S, tg);
  return emi_error(S, EM_ERR_NOMEM, "%s: out of memory", op);
}

/* loss from per-row values: (n) for EM_REDUCE_NONE, else the 0-d sum or mean. */
static void store_loss(em_tensor *loss, const double *rows, int64_t n, double count,
                       int reduction) {
  em_dtype dt = loss->dtype;
  char *p = em_tensor_data(loss);
  if (reduction == EM_REDUCE_NONE) {
    for (int64_t i = 0; i < n; i++) emi_store_f64(p + i * em_dtype_size(dt), dt, rows[i]);
    return;
  }
  double s = 0;
  for (int64_t i = 0; i < n; i++) s += rows[i];
  if (reduction == EM_REDUCE_MEAN) s /= count;
  emi_store_f64(p, dt, s);
}

/* grad_loss as n per-row factors (times scale): (n), any stride, for
** EM_REDUCE_NONE, else its one element for every row. */
static void read_grad(const em_tensor *grad, int64_t n, int reduction, double scale,
                      double *out) {
  const char *p = em_tensor_data(grad);
  em_dtype dt = grad->dtype;
  if (reduction == EM_REDUCE_NONE) {
    int64_t step = grad->ndim ? grad->strides[0] * (int64_t)em_dtype_size(dt) : 0;
    for (int64_t i = 0; i < n; i++) out[i] = emi_load_f64(p + i * step, dt) * scale;
  } else {
    double g = emi_load_f64(p, dt) * scale;
    for (int64_t i = 0; i < n; i++) out[i] = g;
  }
}

/* -- Entries ---------------------------------------------------------------------------- */

em_status emi_cpu_cross_entropy(emi_device *dev, em_tensor *loss, em_tensor *lse,
                                const em_tensor *x, const em_tensor *target, int index_base,
                                int64_t ignore_index, double label_smoothing, int reduction) {
  em_state *S = dev->S;
  const char *op = "cross_entropy";
  int64_t N = x->sizes[0], C = x->sizes[1];
  targets tg;
  double *rows;
  size_t rbytes;
  em_status st = read_targets(S, op, target, N, C, index_base, ignore_index, &tg);
  if (st || (st = row_scratch(S, op, &tg, N, &rows, &rbytes))) return st;
  if (x->dtype == EM_FLOAT32)
    ce_fwd_f32(N, C, em_tensor_data(x), tg.t, tg.ign, label_smoothing, rows,
               em_tensor_data(lse));
  else
    ce_fwd_f64(N, C, em_tensor_data(x), tg.t, tg.ign, label_smoothing, rows,
               em_tensor_data(lse));
  store_loss(loss, rows, N, (double)tg.count, reduction);
  emi_free(S, rows, rbytes);
  targets_free(S, &tg);
  return EM_OK;
}

em_status emi_cpu_cross_entropy_backward(emi_device *dev, em_tensor *gx,
                                         const em_tensor *grad_loss, const em_tensor *x,
                                         const em_tensor *target, const em_tensor *lse,
                                         int index_base, int64_t ignore_index,
                                         double label_smoothing, int reduction) {
  em_state *S = dev->S;
  const char *op = "cross_entropy_backward";
  int64_t N = x->sizes[0], C = x->sizes[1];
  targets tg;
  double *gl;
  size_t gbytes;
  em_status st = read_targets(S, op, target, N, C, index_base, ignore_index, &tg);
  if (st || (st = row_scratch(S, op, &tg, N, &gl, &gbytes))) return st;
  read_grad(grad_loss, N, reduction,
            reduction == EM_REDUCE_MEAN ? 1.0 / (double)tg.count : 1.0, gl);
  if (x->dtype == EM_FLOAT32)
    ce_bwd_f32(N, C, em_tensor_data(x), tg.t, tg.ign, label_smoothing, gl,
               em_tensor_data(lse), em_tensor_data(gx));
  else
    ce_bwd_f64(N, C, em_tensor_data(x), tg.t, tg.ign, label_smoothing, gl,
               em_tensor_data(lse), em_tensor_data(gx));
  emi_free(S, gl, gbytes);
  targets_free(S, &tg);
  return EM_OK;
}

em_status emi_cpu_nll_loss(emi_device *dev, em_tensor *loss, const em_tensor *logp,
                           const em_tensor *target, int index_base, int64_t ignore_index,
                           int reduction) {
  em_state *S = dev->S;
  const char *op = "nll_loss";
  int64_t N = logp->sizes[0], C = logp->sizes[1];
  targets tg;
  double *rows;
  size_t rbytes, es = em_dtype_size(logp->dtype);
  em_status st = read_targets(S, op, target, N, C, index_base, ignore_index, &tg);
  if (st || (st = row_scratch(S, op, &tg, N, &rows, &rbytes))) return st;
  const char *x = em_tensor_data(logp);
  for (int64_t i = 0; i < N; i++)
    rows[i] = tg.ign[i] ? 0 : -emi_load_f64(x + (i * logp->strides[0] +
                                                  tg.t[i] * logp->strides[1]) * (int64_t)es,
                                             logp->dtype);
  store_loss(loss, rows, N, (double)tg.count, reduction);
  emi_free(S, rows, rbytes);
  targets_free(S, &tg);
  return EM_OK;
}

em_status emi_cpu_nll_loss_backward(emi_device *dev, em_tensor *gx, const em_tensor *grad_loss,
                                    const em_tensor *target, int index_base,
                                    int64_t ignore_index, int reduction) {
  em_state *S = dev->S;
  const char *op = "nll_loss_backward";
  int64_t N = gx->sizes[0], C = gx->sizes[1];
  targets tg;
  double *gl;
  size_t gbytes, es = em_dtype_size(gx->dtype);
  em_status st = read_targets(S, op, target, N, C, index_base, ignore_index, &tg);
  if (st || (st = row_scratch(S, op, &tg, N, &gl, &gbytes))) return st;
  read_grad(grad_loss, N, reduction,
            reduction == EM_REDUCE_MEAN ? 1.0 / (double)tg.count : 1.0, gl);
  char *p = em_tensor_data(gx);
  memset(p, 0, (size_t)gx->numel * es);
  for (int64_t i = 0; i < N; i++)
    if (!tg.ign[i]) emi_store_f64(p + (i * C + tg.t[i]) * (int64_t)es, gx->dtype, -gl[i]);
  emi_free(S, gl, gbytes);
  targets_free(S, &tg);
  return EM_OK;
}

em_status emi_cpu_pointwise_loss(emi_device *dev, int kind, em_tensor *loss,
                                 const em_tensor *x, const em_tensor *y, int reduction) {
  em_dtype dt = x->dtype;
  int64_t n = x->numel;
  void *out = reduction == EM_REDUCE_NONE ? em_tensor_data(loss) : NULL;
  double s = dt == EM_FLOAT32 ? pw_fwd_f32(kind, n, em_tensor_data(x), em_tensor_data(y), out)
                              : pw_fwd_f64(kind, n, em_tensor_data(x), em_tensor_data(y), out);
  if (reduction != EM_REDUCE_NONE) {
    if (reduction == EM_REDUCE_MEAN) s /= (double)n;
    emi_store_f64(em_tensor_data(loss), dt, s);
  }
  return EM_OK;
}

em_status emi_cpu_pointwise_loss_backward(emi_device *dev, int kind, em_tensor *gx,
                                          const em_tensor *grad_loss, const em_tensor *x,
                                          const em_tensor *y, int reduction) {
  em_dtype dt = x->dtype;
  int64_t n = x->numel;
  double g = 1;
  const void *gl = NULL;
  if (reduction == EM_REDUCE_NONE) gl = em_tensor_data(grad_loss);
  else {
    g = emi_load_f64(em_tensor_data(grad_loss), dt);
    if (reduction == EM_REDUCE_MEAN) g /= (double)n;
  }
  if (dt == EM_FLOAT32)
    pw_bwd_f32(kind, n, em_tensor_data(x), em_tensor_data(y), gl, g, em_tensor_data(gx));
  else
    pw_bwd_f64(kind, n, em_tensor_data(x), em_tensor_data(y), gl, g, em_tensor_data(gx));
  return EM_OK;
}

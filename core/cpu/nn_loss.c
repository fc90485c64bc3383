/*
** nn_loss.c -- CPU loss kernels: fused log_softmax + nll (cross entropy) with
** label smoothing, and the pointwise losses (mse, binary cross entropy on
** logits, in its stable form max(x,0) - x*y + log1p(exp(-|x|))). Sums are kept
** in double. Compiled twice (float, double) by self-include.
*/
#ifndef NN_T
#include "nn.h"
#include <math.h>

#define NN_T float
#define NN_S(x) x##_f32
#include "nn_loss.c"
#undef NN_T
#undef NN_S
#define NN_T double
#define NN_S(x) x##_f64
#include "nn_loss.c"
#undef NN_T
#undef NN_S

void emi_cpu_cross_entropy(em_dtype dt, int64_t N, int64_t C, const void *x,
                           const int64_t *t, const unsigned char *ign, double smooth,
                           double *loss_rows, void *lse) {
  if (dt == EM_FLOAT32) ce_fwd_f32(N, C, x, t, ign, smooth, loss_rows, lse);
  else ce_fwd_f64(N, C, x, t, ign, smooth, loss_rows, lse);
}
void emi_cpu_cross_entropy_backward(em_dtype dt, int64_t N, int64_t C, const void *x,
                                    const int64_t *t, const unsigned char *ign,
                                    double smooth, const double *gl, const void *lse,
                                    void *gx) {
  if (dt == EM_FLOAT32) ce_bwd_f32(N, C, x, t, ign, smooth, gl, lse, gx);
  else ce_bwd_f64(N, C, x, t, ign, smooth, gl, lse, gx);
}
double emi_cpu_pointwise_loss(em_dtype dt, int kind, int64_t n, const void *x,
                              const void *y, void *out) {
  return dt == EM_FLOAT32 ? pw_fwd_f32(kind, n, x, y, out) : pw_fwd_f64(kind, n, x, y, out);
}
void emi_cpu_pointwise_loss_backward(em_dtype dt, int kind, int64_t n, const void *x,
                                     const void *y, const void *gl, double g, void *gx) {
  if (dt == EM_FLOAT32) pw_bwd_f32(kind, n, x, y, gl, g, gx);
  else pw_bwd_f64(kind, n, x, y, gl, g, gx);
}

#else /* ---- typed body ---- */

static void NN_S(ce_fwd)(int64_t N, int64_t C, const NN_T *x, const int64_t *t,
                         const unsigned char *ign, double smooth, double *loss,
                         NN_T *lse_out) {
  for (int64_t i = 0; i < N; i++) {
    const NN_T *r = x + i * C;
    NN_T m = r[0];
    for (int64_t c = 1; c < C; c++) m = r[c] > m || isnan(r[c]) ? r[c] : m;
    double s = 0, sx = 0;
    if (isinf(m) && m < 0) m = 0;          /* a row of -inf: avoid -inf - -inf */
    for (int64_t c = 0; c < C; c++) {
      s += exp((double)r[c] - (double)m);
      sx += r[c];
    }
    double lse = (double)m + log(s);
    if (lse_out) lse_out[i] = (NN_T)lse;
    if (ign[i]) { loss[i] = 0; continue; }
    double l = (1 - smooth) * (lse - (double)r[t[i]]);
    if (smooth > 0) l += smooth * (lse - sx / (double)C);
    loss[i] = l;
  }
}

/* d loss_i / d x_ic = p_c - (1-eps)*[c == t] - eps/C. */
static void NN_S(ce_bwd)(int64_t N, int64_t C, const NN_T *x, const int64_t *t,
                         const unsigned char *ign, double smooth, const double *gl,
                         const NN_T *lse, NN_T *gx) {
  NN_T off = (NN_T)(smooth / (double)C);
  for (int64_t i = 0; i < N; i++) {
    const NN_T *r = x + i * C;
    NN_T *o = gx + i * C;
    if (ign[i]) {
      for (int64_t c = 0; c < C; c++) o[c] = 0;
      continue;
    }
    NN_T g = (NN_T)gl[i], l = lse[i];
    for (int64_t c = 0; c < C; c++) o[c] = g * ((NN_T)exp(r[c] - l) - off);
    o[t[i]] -= g * (NN_T)(1 - smooth);
  }
}

static double NN_S(pw_fwd)(int kind, int64_t n, const NN_T *x, const NN_T *y, NN_T *out) {
  double sum = 0;
  for (int64_t i = 0; i < n; i++) {
    double l;
    if (kind == EMI_LOSS_MSE) {
      double d = (double)x[i] - (double)y[i];
      l = d * d;
    } else {
      double v = x[i];
      l = (v > 0 ? v : 0) - v * (double)y[i] + log1p(exp(-fabs(v)));
    }
    if (out) out[i] = (NN_T)l;
    sum += l;
  }
  return sum;
}

static void NN_S(pw_bwd)(int kind, int64_t n, const NN_T *x, const NN_T *y, const NN_T *gl,
                         double g, NN_T *gx) {
  for (int64_t i = 0; i < n; i++) {
    double s = gl ? (double)gl[i] : g, d;
    if (kind == EMI_LOSS_MSE) d = 2 * ((double)x[i] - (double)y[i]);
    else {
      double v = x[i], e = exp(-fabs(v));
      double sig = v >= 0 ? 1 / (1 + e) : e / (1 + e);
      d = sig - (double)y[i];
    }
    gx[i] = (NN_T)(s * d);
  }
}

#endif

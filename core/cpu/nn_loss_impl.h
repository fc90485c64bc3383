/*
** nn_loss_impl.h -- the typed loss loops of nn_loss.c for one element type T:
** cross entropy forward and backward, the pointwise losses forward and backward.
** nn_loss.c includes this file twice, with T float and T double, and FN(name)
** gives each copy its suffix (ce_fwd_f32, ce_fwd_f64, ...). Sums are double for
** both types; the gradient of cross entropy is formed in T. C has no templates;
** a file included per type keeps these loops ordinary code, which compiler
** messages and debuggers see line by line, where a macro would be one line. The
** file is part of nn_loss.c and nothing else includes it.
**
** x is (N, C) for cross entropy (targets already 0-based, ignored rows masked),
** flat n elements for the pointwise losses.
*/

static void FN(ce_fwd)(int64_t N, int64_t C, const T *x, const int64_t *t,
                       const unsigned char *ign, double smooth, double *loss,
                       T *lse_out) {
  for (int64_t i = 0; i < N; i++) {
    const T *r = x + i * C;
    T m = r[0];
    for (int64_t c = 1; c < C; c++) m = r[c] > m || isnan(r[c]) ? r[c] : m;
    double s = 0, sx = 0;
    if (isinf(m) && m < 0) m = 0;          /* a row of -inf: avoid -inf - -inf */
    for (int64_t c = 0; c < C; c++) {
      s += exp((double)r[c] - (double)m);
      sx += r[c];
    }
    double lse = (double)m + log(s);
    if (lse_out) lse_out[i] = (T)lse;
    if (ign[i]) { loss[i] = 0; continue; }
    double l = (1 - smooth) * (lse - (double)r[t[i]]);
    if (smooth > 0) l += smooth * (lse - sx / (double)C);
    loss[i] = l;
  }
}

/* d loss_i / d x_ic = p_c - (1-eps)*[c == t] - eps/C. */
static void FN(ce_bwd)(int64_t N, int64_t C, const T *x, const int64_t *t,
                       const unsigned char *ign, double smooth, const double *gl,
                       const T *lse, T *gx) {
  T off = (T)(smooth / (double)C);
  for (int64_t i = 0; i < N; i++) {
    const T *r = x + i * C;
    T *o = gx + i * C;
    if (ign[i]) {
      for (int64_t c = 0; c < C; c++) o[c] = 0;
      continue;
    }
    T g = (T)gl[i], l = lse[i];
    for (int64_t c = 0; c < C; c++) o[c] = g * ((T)exp(r[c] - l) - off);
    o[t[i]] -= g * (T)(1 - smooth);
  }
}

static double FN(pw_fwd)(int kind, int64_t n, const T *x, const T *y, T *out) {
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
    if (out) out[i] = (T)l;
    sum += l;
  }
  return sum;
}

static void FN(pw_bwd)(int kind, int64_t n, const T *x, const T *y, const T *gl,
                       double g, T *gx) {
  for (int64_t i = 0; i < n; i++) {
    double s = gl ? (double)gl[i] : g, d;
    if (kind == EMI_LOSS_MSE) d = 2 * ((double)x[i] - (double)y[i]);
    else {
      double v = x[i], e = exp(-fabs(v));
      double sig = v >= 0 ? 1 / (1 + e) : e / (1 + e);
      d = sig - (double)y[i];
    }
    gx[i] = (T)(s * d);
  }
}

#undef T
#undef FN

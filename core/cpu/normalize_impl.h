/*
** normalize_impl.h -- the batch norm and layer norm loops of normalize.c for one
** element type T. normalize.c includes this file twice, with T float and T
** double, and FN(name) gives each copy its suffix (bn_apply_f32, bn_apply_f64,
** ...). Statistics are summed in double for both; the element-wise passes stay
** in T, so that float vectorizes at full width. C has no templates; a file
** included per type keeps these loops ordinary code, which compiler messages
** and debuggers see line by line, where a macro would be one line. The file is
** part of normalize.c (normalize_job comes from there) and nothing else
** includes it.
**
** Batch norm sees x as (N, C, L) and works per channel; layer norm sees it as
** (M, K) and works per row.
*/

static void FN(bn_stats)(void *ctx, int64_t c0, int64_t c1) {
  const normalize_job *j = ctx;
  const T *x = j->x;
  for (int64_t c = c0; c < c1; c++) {
    double s = 0, q = 0;
    for (int64_t n = 0; n < j->N; n++) {
      const T *r = x + (n * j->C + c) * j->L;
      T a = 0;
      for (int64_t l = 0; l < j->L; l++) a += r[l];
      s += a;
    }
    double m = s / (double)(j->N * j->L);
    for (int64_t n = 0; n < j->N; n++) {
      const T *r = x + (n * j->C + c) * j->L;
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

static void FN(bn_apply)(void *ctx, int64_t p0, int64_t p1) {
  const normalize_job *j = ctx;
  const T *x = j->x, *w = j->w, *b = j->b;
  T *y = j->y;
  for (int64_t p = p0; p < p1; p++) {
    int64_t c = p % j->C;
    T sc = (T)j->invstd[c] * (w ? w[c] : 1);
    T sh = (b ? b[c] : 0) - (T)j->mean[c] * sc;
    const T *r = x + p * j->L;
    T *o = y + p * j->L;
    if (j->relu)
      for (int64_t l = 0; l < j->L; l++) {
        T v = r[l] * sc + sh;
        o[l] = v < 0 ? (T)0 : v;
      }
    else
      for (int64_t l = 0; l < j->L; l++) o[l] = r[l] * sc + sh;
  }
}

static void FN(bn_bwd)(void *ctx, int64_t c0, int64_t c1) {
  const normalize_job *j = ctx;
  const T *x = j->x, *gy = j->gy, *w = j->w;
  T *gx = j->gx, *gw = j->gw, *gb = j->gb;
  double cnt = (double)(j->N * j->L);
  for (int64_t c = c0; c < c1; c++) {
    double m = (double)((const T *)j->cmean)[c], is = (double)((const T *)j->crstd)[c];
    double sg = 0, sgx = 0;
    for (int64_t n = 0; n < j->N; n++) {
      const T *r = x + (n * j->C + c) * j->L, *g = gy + (n * j->C + c) * j->L;
      T a = 0, b = 0;
      for (int64_t l = 0; l < j->L; l++) {
        a += g[l];
        b += g[l] * (r[l] - (T)m);
      }
      sg += a;
      sgx += b;
    }
    if (gw) gw[c] = (T)(sgx * is);
    if (gb) gb[c] = (T)sg;
    if (!gx) continue;
    double wc = w ? (double)w[c] : 1;
    T k = (T)(wc * is), mg = (T)(sg / cnt), pr = (T)(sgx * is * is / cnt);
    for (int64_t n = 0; n < j->N; n++) {
      const T *r = x + (n * j->C + c) * j->L, *g = gy + (n * j->C + c) * j->L;
      T *o = gx + (n * j->C + c) * j->L;
      if (j->training)
        for (int64_t l = 0; l < j->L; l++) o[l] = k * (g[l] - mg - (r[l] - (T)m) * pr);
      else
        for (int64_t l = 0; l < j->L; l++) o[l] = k * g[l];
    }
  }
}

static void FN(ln_fwd)(void *ctx, int64_t r0, int64_t r1) {
  const normalize_job *j = ctx;
  const T *x = j->x, *w = j->w, *b = j->b;
  T *y = j->y, *mo = j->mean_o, *ro = j->rstd_o;
  for (int64_t i = r0; i < r1; i++) {
    const T *r = x + i * j->K;
    T *o = y + i * j->K;
    double s = 0, q = 0;
    for (int64_t k = 0; k < j->K; k++) s += r[k];
    double m = s / (double)j->K;
    for (int64_t k = 0; k < j->K; k++) { double d = r[k] - m; q += d * d; }
    double rs = 1 / sqrt(q / (double)j->K + j->eps);
    mo[i] = (T)m;
    ro[i] = (T)rs;
    T fm = (T)m, fr = (T)rs;
    for (int64_t k = 0; k < j->K; k++) {
      T v = (r[k] - fm) * fr;
      o[k] = v * (w ? w[k] : 1) + (b ? b[k] : 0);
    }
  }
}

static void FN(ln_bwd_x)(void *ctx, int64_t r0, int64_t r1) {
  const normalize_job *j = ctx;
  const T *x = j->x, *gy = j->gy, *w = j->w, *mean = j->cmean, *rstd = j->crstd;
  T *gx = j->gx;
  for (int64_t i = r0; i < r1; i++) {
    const T *r = x + i * j->K, *g = gy + i * j->K;
    T *o = gx + i * j->K, m = mean[i], rs = rstd[i];
    double a = 0, b = 0;   /* sum(g*w), sum(g*w*xhat) */
    for (int64_t k = 0; k < j->K; k++) {
      T gw = g[k] * (w ? w[k] : 1);
      a += gw;
      b += gw * (r[k] - m) * rs;
    }
    T ma = (T)(a / (double)j->K), mb = (T)(b / (double)j->K);
    for (int64_t k = 0; k < j->K; k++)
      o[k] = rs * (g[k] * (w ? w[k] : 1) - ma - (r[k] - m) * rs * mb);
  }
}

static void FN(ln_bwd_wb)(const normalize_job *j, double *acc, T *gw, T *gb) {
  const T *x = j->x, *gy = j->gy, *mean = j->cmean, *rstd = j->crstd;
  for (int64_t k = 0; k < 2 * j->K; k++) acc[k] = 0;
  for (int64_t i = 0; i < j->M; i++) {
    const T *r = x + i * j->K, *g = gy + i * j->K;
    T m = mean[i], rs = rstd[i];
    for (int64_t k = 0; k < j->K; k++) {
      acc[k] += g[k] * (r[k] - m) * rs;
      acc[j->K + k] += g[k];
    }
  }
  for (int64_t k = 0; k < j->K; k++) {
    if (gw) gw[k] = (T)acc[k];
    if (gb) gb[k] = (T)acc[j->K + k];
  }
}

#undef T
#undef FN

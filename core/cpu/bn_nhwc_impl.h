/*
** bn_nhwc_impl.h -- the loops of bn_nhwc.c for one element type T (included
** twice, T float then double; FN(name) adds the suffix). Part of bn_nhwc.c,
** which alone includes it. x, gy, gx, y are M rows of C; statistics tasks are
** blocks of CBLK channels, element-wise tasks ranges of rows.
*/

/* s1 = per-channel mean, s2 = biased variance (two passes, as normalize.c). */
static void FN(bnh_stats)(void *ctx, int64_t b0, int64_t b1) {
  const bnh_job *j = ctx;
  const T *x = j->x;
  for (int64_t b = b0; b < b1; b++) {
    int64_t c0 = b * CBLK, c1 = c0 + CBLK < j->C ? c0 + CBLK : j->C, n = c1 - c0;
    double acc[CBLK] = {0}, m[CBLK];
    for (int64_t r = 0; r < j->M; r++) {
      const T *row = x + r * j->C + c0;
      for (int64_t c = 0; c < n; c++) acc[c] += (double)row[c];
    }
    for (int64_t c = 0; c < n; c++) { m[c] = acc[c] / (double)j->M; acc[c] = 0; }
    for (int64_t r = 0; r < j->M; r++) {
      const T *row = x + r * j->C + c0;
      for (int64_t c = 0; c < n; c++) {
        double d = (double)row[c] - m[c];
        acc[c] += d * d;
      }
    }
    for (int64_t c = 0; c < n; c++) {
      j->s1[c0 + c] = m[c];
      j->s2[c0 + c] = acc[c] / (double)j->M;
    }
  }
}

static void FN(bnh_apply)(void *ctx, int64_t r0, int64_t r1) {
  const bnh_job *j = ctx;
  const T *x = j->x, *w = j->w, *b = j->b;
  T *y = j->y;
  int64_t C = j->C;
  T sc[CBLK], sh[CBLK];
  for (int64_t c0 = 0; c0 < C; c0 += CBLK) {   /* channel blocks outside: sc, sh on the stack */
    int64_t n = c0 + CBLK < C ? CBLK : C - c0;
    for (int64_t c = 0; c < n; c++) {
      sc[c] = (T)j->invstd[c0 + c] * (w ? w[c0 + c] : 1);
      sh[c] = (b ? b[c0 + c] : 0) - (T)j->mean[c0 + c] * sc[c];
    }
    for (int64_t r = r0; r < r1; r++) {
      const T *restrict xr = x + r * C + c0;
      T *restrict yr = y + r * C + c0;
      for (int64_t c = 0; c < n; c++) yr[c] = xr[c] * sc[c] + sh[c];
    }
  }
}

/* s1 = sum of gy, s2 = sum of gy * (x - mean), per channel. */
static void FN(bnh_sums)(void *ctx, int64_t b0, int64_t b1) {
  const bnh_job *j = ctx;
  const T *x = j->x, *gy = j->gy, *cm = j->cmean;
  for (int64_t b = b0; b < b1; b++) {
    int64_t c0 = b * CBLK, c1 = c0 + CBLK < j->C ? c0 + CBLK : j->C, n = c1 - c0;
    double a[CBLK] = {0}, q[CBLK] = {0};
    for (int64_t r = 0; r < j->M; r++) {
      const T *xr = x + r * j->C + c0, *gr = gy + r * j->C + c0;
      for (int64_t c = 0; c < n; c++) {
        a[c] += (double)gr[c];
        q[c] += (double)gr[c] * (double)(xr[c] - cm[c0 + c]);
      }
    }
    for (int64_t c = 0; c < n; c++) { j->s1[c0 + c] = a[c]; j->s2[c0 + c] = q[c]; }
  }
}

static void FN(bnh_params)(const bnh_job *j) {
  const T *is = j->crstd;
  T *gw = j->gw, *gb = j->gb;
  for (int64_t c = 0; c < j->C; c++) {
    if (gw) gw[c] = (T)(j->s2[c] * (double)is[c]);
    if (gb) gb[c] = (T)j->s1[c];
  }
}

static void FN(bnh_gx)(void *ctx, int64_t r0, int64_t r1) {
  const bnh_job *j = ctx;
  const T *x = j->x, *gy = j->gy, *w = j->w, *cm = j->cmean, *is = j->crstd;
  T *gx = j->gx;
  int64_t C = j->C;
  double cnt = (double)j->M;
  T k[CBLK], mg[CBLK], pr[CBLK], m[CBLK];
  for (int64_t c0 = 0; c0 < C; c0 += CBLK) {
    int64_t n = c0 + CBLK < C ? CBLK : C - c0;
    for (int64_t c = 0; c < n; c++) {
      double isc = (double)is[c0 + c], wc = w ? (double)w[c0 + c] : 1;
      k[c] = (T)(wc * isc);
      mg[c] = (T)(j->s1[c0 + c] / cnt);
      pr[c] = (T)(j->s2[c0 + c] * isc * isc / cnt);
      m[c] = cm[c0 + c];
    }
    for (int64_t r = r0; r < r1; r++) {
      const T *restrict xr = x + r * C + c0, *restrict gr = gy + r * C + c0;
      T *restrict o = gx + r * C + c0;
      if (j->training)
        for (int64_t c = 0; c < n; c++) o[c] = k[c] * (gr[c] - mg[c] - (xr[c] - m[c]) * pr[c]);
      else
        for (int64_t c = 0; c < n; c++) o[c] = k[c] * gr[c];
    }
  }
}

#undef T
#undef FN

/*
** bn_nhwc_impl.h -- the loops of bn_nhwc.c for one element type T (included
** twice, T float then double; FN(name) adds the suffix). Part of bn_nhwc.c,
** which alone includes it. x, gy, gx, y are M rows of C; reduction tasks are
** bn_rows.h's row tasks, element-wise tasks ranges of rows.
*/

/* Task t of the row split (bn_rows.h): its rows' sums in double, per element as
** normalize.c keeps them, into part[t*2C ...] and (BNH_BWD) part[t*2C + C ...]. */
static void FN(bnh_red)(void *ctx, int64_t t0, int64_t t1) {
  const bnh_job *j = ctx;
  const T *x = j->x, *gy = j->gy, *cm = j->cmean;
  int64_t C = j->C;
  for (int64_t t = t0; t < t1; t++) {
    int64_t r0, r1;
    emi_bn_task_rows(j->M, j->nt, t, &r0, &r1);
    double *p1 = j->part + t * 2 * C, *p2 = p1 + C;
    for (int64_t c0 = 0; c0 < C; c0 += CBLK) {
      int64_t n = c0 + CBLK < C ? CBLK : C - c0;
      double a[CBLK] = {0}, q[CBLK] = {0}, m[CBLK];
      for (int64_t c = 0; c < n; c++)
        m[c] = j->kind == BNH_SQ ? j->mean[c0 + c] : j->kind == BNH_BWD ? (double)cm[c0 + c] : 0;
      if (j->kind == BNH_SUM) {
        for (int64_t r = r0; r < r1; r++) {
          const T *row = x + r * C + c0;
          for (int64_t c = 0; c < n; c++) a[c] += (double)row[c];
        }
      } else if (j->kind == BNH_SQ) {
        for (int64_t r = r0; r < r1; r++) {
          const T *row = x + r * C + c0;
          for (int64_t c = 0; c < n; c++) {
            double d = (double)row[c] - m[c];
            a[c] += d * d;
          }
        }
      } else {
        for (int64_t r = r0; r < r1; r++) {
          const T *xr = x + r * C + c0, *gr = gy + r * C + c0;
          for (int64_t c = 0; c < n; c++) {
            a[c] += (double)gr[c];
            q[c] += (double)gr[c] * (double)(xr[c] - (T)m[c]);
          }
        }
      }
      for (int64_t c = 0; c < n; c++) { p1[c0 + c] = a[c]; p2[c0 + c] = q[c]; }
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
      if (j->relu)
        for (int64_t c = 0; c < n; c++) {
          T v = xr[c] * sc[c] + sh[c];
          yr[c] = v < 0 ? (T)0 : v;
        }
      else
        for (int64_t c = 0; c < n; c++) yr[c] = xr[c] * sc[c] + sh[c];
    }
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

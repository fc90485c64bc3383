/*
** conv_nhwc_impl.h -- the loops of conv_nhwc.c for one element type T (included
** twice, T float then double; FN(name) adds the suffix). Part of conv_nhwc.c,
** which alone includes it. A share is a slice of the batch with its own scratch.
** Per sample and group gi: col (L x K, K = kH*kW*Cg) from x's channels
** [gi*Cg, (gi+1)*Cg); y's columns [gi*Og, (gi+1)*Og) (leading dimension O).
*/

/* col[l, (kh, kw, c)] = x[ih, iw, c0 + c], zero where the tap falls in the padding. */
static void FN(nhwc_im2col)(const emi_conv_geom *g, const T *xn, int64_t c0, T *col) {
  int64_t Cg = g->C / g->G, K = Cg * g->kH * g->kW;
  for (int64_t oh = 0; oh < g->OH; oh++)
    for (int64_t ow = 0; ow < g->OW; ow++) {
      T *row = col + (oh * g->OW + ow) * K;
      for (int64_t kh = 0; kh < g->kH; kh++) {
        int64_t ih = oh * g->sH - g->pH + kh * g->dH;
        for (int64_t kw = 0; kw < g->kW; kw++, row += Cg) {
          int64_t iw = ow * g->sW - g->pW + kw * g->dW;
          if (ih < 0 || ih >= g->H || iw < 0 || iw >= g->W) {
            for (int64_t c = 0; c < Cg; c++) row[c] = 0;
          } else {
            const T *src = xn + (ih * g->W + iw) * g->C + c0;
            for (int64_t c = 0; c < Cg; c++) row[c] = src[c];
          }
        }
      }
    }
}

/* gx[ih, iw, c0 + c] += col[l, (kh, kw, c)], the adjoint of nhwc_im2col. */
static void FN(nhwc_col2im)(const emi_conv_geom *g, const T *col, int64_t c0, T *gxn) {
  int64_t Cg = g->C / g->G, K = Cg * g->kH * g->kW;
  for (int64_t oh = 0; oh < g->OH; oh++)
    for (int64_t ow = 0; ow < g->OW; ow++) {
      const T *row = col + (oh * g->OW + ow) * K;
      for (int64_t kh = 0; kh < g->kH; kh++) {
        int64_t ih = oh * g->sH - g->pH + kh * g->dH;
        for (int64_t kw = 0; kw < g->kW; kw++, row += Cg) {
          int64_t iw = ow * g->sW - g->pW + kw * g->dW;
          if (ih < 0 || ih >= g->H || iw < 0 || iw >= g->W) continue;
          T *dst = gxn + (ih * g->W + iw) * g->C + c0;
          for (int64_t c = 0; c < Cg; c++) dst[c] += row[c];
        }
      }
    }
}

static void FN(nhwc_fwd)(void *ctx, int64_t s0, int64_t s1) {
  const nhwc_job *j = ctx;
  const emi_conv_geom *g = j->g;
  int64_t L = g->OH * g->OW, Cg = g->C / g->G, Og = g->O / g->G, K = Cg * g->kH * g->kW;
  const T *w = j->w, *b = j->b;
  for (int64_t s = s0; s < s1; s++) {
    T *col = (T *)(j->scratch + j->share_bytes * (size_t)s);
    for (int64_t n = share_begin(g->N, j->shares, s); n < share_begin(g->N, j->shares, s + 1);
         n++) {
      const T *xn = (const T *)j->x + n * g->H * g->W * g->C;
      T *yn = (T *)j->y + n * L * g->O;
      if (b)
        for (int64_t l = 0; l < L; l++)
          for (int64_t o = 0; o < g->O; o++) yn[l * g->O + o] = b[o];
      for (int64_t gi = 0; gi < g->G; gi++) {
        const T *a = xn + gi * Cg;   /* direct: the input rows, leading dimension C */
        int64_t lda = g->C;
        if (!direct(g)) {
          FN(nhwc_im2col)(g, xn, gi * Cg, col);
          a = col;
          lda = K;
        }
        FN(gemm)(false, true, L, Og, K, a, lda, w + gi * Og * K, K, yn + gi * Og, g->O,
                 b != NULL);
      }
      if (g->act == EMI_ACT_RELU)   /* while the sample's output is in cache */
        for (int64_t i = 0; i < L * g->O; i++) yn[i] = yn[i] < 0 ? (T)0 : yn[i];
    }
  }
}

static void FN(nhwc_bwd)(void *ctx, int64_t s0, int64_t s1) {
  const nhwc_job *j = ctx;
  const emi_conv_geom *g = j->g;
  int64_t L = g->OH * g->OW, Cg = g->C / g->G, Og = g->O / g->G, K = Cg * g->kH * g->kW;
  const T *w = j->w;
  size_t colsz = direct(g) ? 0 : (size_t)(L * K);
  for (int64_t s = s0; s < s1; s++) {
    T *col = (T *)(j->scratch + j->share_bytes * (size_t)s);
    T *gwa = col + colsz, *gba = gwa + g->O * K;
    for (int64_t i = 0; i < g->O * K + g->O; i++) gwa[i] = 0;
    for (int64_t n = share_begin(g->N, j->shares, s); n < share_begin(g->N, j->shares, s + 1);
         n++) {
      const T *xn = (const T *)j->x + n * g->H * g->W * g->C;
      const T *gyn = (const T *)j->gy + n * L * g->O;
      T *gxn = j->want_gx ? (T *)j->gx + n * g->H * g->W * g->C : NULL;
      if (j->want_gb)
        for (int64_t l = 0; l < L; l++)
          for (int64_t o = 0; o < g->O; o++) gba[o] += gyn[l * g->O + o];
      if (gxn && !direct(g))
        for (int64_t i = 0; i < g->H * g->W * g->C; i++) gxn[i] = 0;
      for (int64_t gi = 0; gi < g->G; gi++) {
        const T *gyg = gyn + gi * Og;   /* leading dimension O */
        if (j->want_gw) {   /* gW_g (Og x K) += gY_g^T (Og x L) cols (L x K) */
          const T *a = xn + gi * Cg;
          int64_t lda = g->C;
          if (!direct(g)) {
            FN(nhwc_im2col)(g, xn, gi * Cg, col);
            a = col;
            lda = K;
          }
          FN(gemm)(true, false, Og, K, L, gyg, g->O, a, lda, gwa + gi * Og * K, K, 1);
        }
        if (gxn) {   /* dcols (L x K) = gY_g (L x Og) W_g (Og x K) */
          if (direct(g)) {
            FN(gemm)(false, false, L, K, Og, gyg, g->O, w + gi * Og * K, K, gxn + gi * Cg,
                     g->C, 0);
          } else {
            FN(gemm)(false, false, L, K, Og, gyg, g->O, w + gi * Og * K, K, col, K, 0);
            FN(nhwc_col2im)(g, col, gi * Cg, gxn);
          }
        }
      }
    }
  }
}

/* Sums the shares' gw (O x K, w's own order) and gb, in share order. */
static void FN(nhwc_reduce)(const nhwc_job *j, size_t colbytes, void *gw_out, void *gb_out) {
  const emi_conv_geom *g = j->g;
  int64_t OK = g->O * (g->C / g->G) * g->kH * g->kW;
  T *gw = gw_out, *gb = gb_out;
  for (int64_t s = 0; s < j->shares; s++) {
    const T *sw = (const T *)(j->scratch + j->share_bytes * (size_t)s + colbytes);
    const T *sb = sw + OK;
    if (gw)
      for (int64_t i = 0; i < OK; i++) gw[i] = s ? gw[i] + sw[i] : sw[i];
    if (gb)
      for (int64_t i = 0; i < g->O; i++) gb[i] = s ? gb[i] + sb[i] : sb[i];
  }
}

#undef T
#undef FN

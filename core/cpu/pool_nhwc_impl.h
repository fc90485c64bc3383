/*
** pool_nhwc_impl.h -- the channels-last pooling loops of pool_nhwc.c for one
** element type T (included twice, T float then double; FN(name) adds the
** suffix). Part of pool_nhwc.c, which alone includes it. Rows are (n, oh) pairs
** for the forward loops, samples n for the backward ones.
*/

static void FN(pn_max_fwd)(void *ctx, int64_t r0, int64_t r1) {
  const pnhwc_job *j = ctx;
  const emi_pool_geom *g = j->g;
  int64_t C = g->C, W = g->W;
  for (int64_t r = r0; r < r1; r++) {
    int64_t n = r / g->OH, oh = r % g->OH;
    const T *xn = (const T *)j->x + n * g->H * W * C;
    for (int64_t ow = 0; ow < g->OW; ow++) {
      T *restrict y = (T *)j->y + ((r * g->OW) + ow) * C;
      int64_t *restrict ind = j->ind + ((r * g->OW) + ow) * C;
      int64_t h0 = oh * g->sH - g->pH, w0 = ow * g->sW - g->pW;
      int first = 1;
      for (int64_t kh = 0; kh < g->kH; kh++) {
        int64_t ih = h0 + kh * g->dH;
        if (ih < 0 || ih >= g->H) continue;
        for (int64_t kw = 0; kw < g->kW; kw++) {
          int64_t iw = w0 + kw * g->dW;
          if (iw < 0 || iw >= W) continue;
          const T *restrict v = xn + (ih * W + iw) * C;
          int64_t at = ih * W + iw + j->base;
          if (first) {
            for (int64_t c = 0; c < C; c++) { y[c] = v[c]; ind[c] = at; }
            first = 0;
            continue;
          }
          for (int64_t c = 0; c < C; c++) {
            int take = (v[c] > y[c]) | (v[c] != v[c]);
            y[c] = take ? v[c] : y[c];
            ind[c] = take ? at : ind[c];
          }
        }
      }
      if (first)   /* a window all in the padding */
        for (int64_t c = 0; c < C; c++) { y[c] = -INFINITY; ind[c] = j->base; }
    }
  }
}

static void FN(pn_max_bwd)(void *ctx, int64_t n0, int64_t n1) {
  const pnhwc_job *j = ctx;
  const emi_pool_geom *g = j->g;
  int64_t C = g->C, HW = g->H * g->W, L = g->OH * g->OW;
  for (int64_t n = n0; n < n1; n++) {
    T *gx = (T *)j->gx + n * HW * C;
    const T *gy = (const T *)j->gy + n * j->gs[0];
    const int64_t *ind = j->cind + n * L * C;
    for (int64_t i = 0; i < HW * C; i++) gx[i] = 0;
    for (int64_t l = 0; l < L; l++) {
      const T *gl = gy + (l / g->OW) * j->gs[2] + (l % g->OW) * j->gs[3];
      for (int64_t c = 0; c < C; c++) {
        int64_t k = ind[l * C + c] - j->base;
        if (k >= 0 && k < HW) gx[k * C + c] += gl[c * j->gs[1]];   /* the entry checked */
      }
    }
  }
}

static void FN(pn_avg_fwd)(void *ctx, int64_t r0, int64_t r1) {
  const pnhwc_job *j = ctx;
  const emi_pool_geom *g = j->g;
  int64_t C = g->C, W = g->W;
  for (int64_t r = r0; r < r1; r++) {
    int64_t n = r / g->OH, oh = r % g->OH;
    const T *xn = (const T *)j->x + n * g->H * W * C;
    for (int64_t ow = 0; ow < g->OW; ow++) {
      T *restrict y = (T *)j->y + ((r * g->OW) + ow) * C;
      int64_t h0, h1, w0, w1;
      int64_t cnt = avg_window(g, oh, ow, j->include_pad, &h0, &h1, &w0, &w1);
      T inv = cnt > 0 ? (T)1 / (T)cnt : 0;
      for (int64_t c = 0; c < C; c++) y[c] = 0;
      for (int64_t ih = h0; ih < h1; ih++)
        for (int64_t iw = w0; iw < w1; iw++) {
          const T *restrict v = xn + (ih * W + iw) * C;
          for (int64_t c = 0; c < C; c++) y[c] += v[c];
        }
      for (int64_t c = 0; c < C; c++) y[c] *= inv;
    }
  }
}

static void FN(pn_avg_bwd)(void *ctx, int64_t n0, int64_t n1) {
  const pnhwc_job *j = ctx;
  const emi_pool_geom *g = j->g;
  int64_t C = g->C, W = g->W;
  for (int64_t n = n0; n < n1; n++) {
    T *gx = (T *)j->gx + n * g->H * W * C;
    const T *gy = (const T *)j->gy + n * j->gs[0];
    int64_t gc = j->gs[1];
    for (int64_t i = 0; i < g->H * W * C; i++) gx[i] = 0;
    for (int64_t oh = 0; oh < g->OH; oh++)
      for (int64_t ow = 0; ow < g->OW; ow++) {
        int64_t h0, h1, w0, w1;
        int64_t cnt = avg_window(g, oh, ow, j->include_pad, &h0, &h1, &w0, &w1);
        T inv = cnt > 0 ? (T)1 / (T)cnt : 0;
        const T *gr = gy + oh * j->gs[2] + ow * j->gs[3];
        for (int64_t ih = h0; ih < h1; ih++)
          for (int64_t iw = w0; iw < w1; iw++) {
            T *restrict o = gx + (ih * W + iw) * C;
            for (int64_t c = 0; c < C; c++) o[c] += gr[c * gc] * inv;
          }
      }
  }
}

static void FN(pn_ada_fwd)(void *ctx, int64_t r0, int64_t r1) {
  const pnhwc_job *j = ctx;
  const emi_pool_geom *g = j->g;
  int64_t C = g->C, W = g->W;
  for (int64_t r = r0; r < r1; r++) {
    int64_t n = r / g->OH, oh = r % g->OH;
    const T *xn = (const T *)j->x + n * g->H * W * C;
    int64_t h0 = ada_start(oh, g->H, g->OH), h1 = ada_end(oh, g->H, g->OH);
    for (int64_t ow = 0; ow < g->OW; ow++) {
      int64_t w0 = ada_start(ow, W, g->OW), w1 = ada_end(ow, W, g->OW);
      T *restrict y = (T *)j->y + ((r * g->OW) + ow) * C;
      for (int64_t c = 0; c < C; c++) y[c] = 0;
      for (int64_t ih = h0; ih < h1; ih++)
        for (int64_t iw = w0; iw < w1; iw++) {
          const T *restrict v = xn + (ih * W + iw) * C;
          for (int64_t c = 0; c < C; c++) y[c] += v[c];
        }
      T cnt = (T)((h1 - h0) * (w1 - w0));
      for (int64_t c = 0; c < C; c++) y[c] /= cnt;
    }
  }
}

static void FN(pn_ada_bwd)(void *ctx, int64_t n0, int64_t n1) {
  const pnhwc_job *j = ctx;
  const emi_pool_geom *g = j->g;
  int64_t C = g->C, W = g->W;
  for (int64_t n = n0; n < n1; n++) {
    T *gx = (T *)j->gx + n * g->H * W * C;
    const T *gy = (const T *)j->gy + n * j->gs[0];
    int64_t gc = j->gs[1];
    for (int64_t i = 0; i < g->H * W * C; i++) gx[i] = 0;
    for (int64_t oh = 0; oh < g->OH; oh++) {
      int64_t h0 = ada_start(oh, g->H, g->OH), h1 = ada_end(oh, g->H, g->OH);
      for (int64_t ow = 0; ow < g->OW; ow++) {
        int64_t w0 = ada_start(ow, W, g->OW), w1 = ada_end(ow, W, g->OW);
        T cnt = (T)((h1 - h0) * (w1 - w0));
        const T *gr = gy + oh * j->gs[2] + ow * j->gs[3];
        for (int64_t ih = h0; ih < h1; ih++)
          for (int64_t iw = w0; iw < w1; iw++) {
            T *restrict o = gx + (ih * W + iw) * C;
            for (int64_t c = 0; c < C; c++) o[c] += gr[c * gc] / cnt;
          }
      }
    }
  }
}

#undef T
#undef FN

/*
** pool_impl.h -- the pooling loops of pool.c for one element type T. pool.c
** includes this file twice, with T float and T double, and FN(name) gives each
** copy its suffix (maxp_fwd_f32, maxp_fwd_f64, ...). The two copies are the same
** loops with different arithmetic: float stays float, so that gcc vectorizes it
** at full width, and double stays double for the gradient checks. C has no
** templates; a file included per type keeps these loops ordinary code, which
** compiler messages and debuggers see line by line, where a macro would be one
** line. The file is part of pool.c (pool_job, ada_start, ada_end, is_2x2 and
** the vector row FN(row2x2) come from there) and nothing else includes it.
**
** x is planes of (H, W), y and ind planes of (OH, OW); [p0, p1) are planes.
*/

/* The common 2x2 window with stride 2 and no padding or dilation (every CNN's
** MaxPool2d(2)): straight-line code over pairs of rows, same choices as the
** general loop below (the first maximum wins; a NaN is taken, then only a later
** NaN replaces it). The general loop spends most of its time on index arithmetic
** for so small a window: this runs several times faster, and the vector row
** (pool_avx2.c, where the CPU has AVX2) faster still. */
static void FN(maxp_fwd_2x2)(const pool_job *j, int64_t p0, int64_t p1) {
  const emi_pool_geom *g = j->g;
  int64_t W = g->W, OH = g->OH, OW = g->OW, base = j->base;
  for (int64_t p = p0; p < p1; p++) {
    const T *x = (const T *)j->x + p * g->H * W;
    T *y = (T *)j->y + p * OH * OW;
    int64_t *ind = j->ind + p * OH * OW;
    for (int64_t oh = 0; oh < OH; oh++) {
      const T *restrict r0 = x + 2 * oh * W, *restrict r1 = r0 + W;
      T *restrict yr = y + oh * OW;
      int64_t *restrict ir = ind + oh * OW;
      int64_t i0 = 2 * oh * W + base;
      /* selects rather than if-chains: random data would make every comparison a
      ** coin flip for the branch predictor */
      for (int64_t ow = FN(row2x2)(r0, r1, OW, W, i0, yr, ir); ow < OW; ow++) {
        T a = r0[2 * ow], b = r0[2 * ow + 1], c = r1[2 * ow], d = r1[2 * ow + 1];
        int64_t off = 0;
        T best = a;
        int take = (b > best) | (b != b);
        best = take ? b : best;
        off = take ? 1 : off;
        take = (c > best) | (c != c);
        best = take ? c : best;
        off = take ? W : off;
        take = (d > best) | (d != d);
        best = take ? d : best;
        off = take ? W + 1 : off;
        yr[ow] = best;
        ir[ow] = i0 + 2 * ow + off;
      }
    }
  }
}

static void FN(maxp_fwd)(void *ctx, int64_t p0, int64_t p1) {
  const pool_job *j = ctx;
  const emi_pool_geom *g = j->g;
  if (is_2x2(g)) {
    FN(maxp_fwd_2x2)(j, p0, p1);
    return;
  }
  for (int64_t p = p0; p < p1; p++) {
    const T *x = (const T *)j->x + p * g->H * g->W;
    T *y = (T *)j->y + p * g->OH * g->OW;
    int64_t *ind = j->ind + p * g->OH * g->OW;
    for (int64_t oh = 0; oh < g->OH; oh++)
      for (int64_t ow = 0; ow < g->OW; ow++) {
        int64_t h0 = oh * g->sH - g->pH, w0 = ow * g->sW - g->pW;
        T best = -INFINITY;
        int64_t bi = -1;
        if (h0 >= 0 && w0 >= 0 && h0 + (g->kH - 1) * g->dH < g->H &&
            w0 + (g->kW - 1) * g->dW < g->W) {
          /* window inside the plane: branch-free selects (random data would make
          ** "v > best" a coin flip for the branch predictor). A NaN is taken and
          ** then only replaced by a later NaN, as PyTorch does. */
          best = x[h0 * g->W + w0];
          bi = h0 * g->W + w0;
          for (int64_t kh = 0; kh < g->kH; kh++) {
            int64_t base = (h0 + kh * g->dH) * g->W + w0;
            for (int64_t kw = 0; kw < g->kW; kw++) {
              int64_t at = base + kw * g->dW;
              T v = x[at];
              int take = (v > best) | (v != v);
              best = take ? v : best;
              bi = take ? at : bi;
            }
          }
          goto found;
        }
        for (int64_t kh = 0; kh < g->kH; kh++) {
          int64_t ih = h0 + kh * g->dH;
          if (ih < 0 || ih >= g->H) continue;
          for (int64_t kw = 0; kw < g->kW; kw++) {
            int64_t iw = w0 + kw * g->dW;
            if (iw < 0 || iw >= g->W) continue;
            T v = x[ih * g->W + iw];
            if (bi < 0 || v > best || v != v) {
              best = v;
              bi = ih * g->W + iw;
            }
          }
        }
      found:
        y[oh * g->OW + ow] = best;
        ind[oh * g->OW + ow] = (bi < 0 ? 0 : bi) + j->base;
      }
  }
}

static void FN(maxp_bwd)(void *ctx, int64_t p0, int64_t p1) {
  const pool_job *j = ctx;
  const emi_pool_geom *g = j->g;
  int64_t HW = g->H * g->W, L = g->OH * g->OW;
  for (int64_t p = p0; p < p1; p++) {
    T *gx = (T *)j->gx + p * HW;
    const T *gy = (const T *)j->gy + p * L;
    const int64_t *ind = j->cind + p * L;
    for (int64_t i = 0; i < HW; i++) gx[i] = 0;
    for (int64_t l = 0; l < L; l++) {
      int64_t k = ind[l] - j->base;
      if (k >= 0 && k < HW) gx[k] += gy[l];   /* the entry checked the range */
    }
    if (j->relu_mask) {   /* ReLU's backward while the plane is in cache, as it computes */
      const T *m = (const T *)j->relu_mask + p * HW;
      for (int64_t i = 0; i < HW; i++) gx[i] = m[i] > 0 ? gx[i] : gx[i] * (T)0;
    }
  }
}

/* The window of output (oh, ow) clipped to the input, and torch's divisor. */
static inline T FN(avg_window)(const emi_pool_geom *g, int64_t oh, int64_t ow,
                               int include_pad, int64_t *h0, int64_t *h1, int64_t *w0,
                               int64_t *w1) {
  int64_t hs = oh * g->sH - g->pH, ws = ow * g->sW - g->pW;
  int64_t he = hs + g->kH, we = ws + g->kW;
  if (he > g->H + g->pH) he = g->H + g->pH;
  if (we > g->W + g->pW) we = g->W + g->pW;
  int64_t padded = (he - hs) * (we - ws);
  *h0 = hs < 0 ? 0 : hs;
  *w0 = ws < 0 ? 0 : ws;
  *h1 = he > g->H ? g->H : he;
  *w1 = we > g->W ? g->W : we;
  int64_t n = include_pad ? padded : (*h1 - *h0) * (*w1 - *w0);
  return n > 0 ? (T)1 / (T)n : 0;
}

static void FN(avgp_fwd)(void *ctx, int64_t p0, int64_t p1) {
  const pool_job *j = ctx;
  const emi_pool_geom *g = j->g;
  for (int64_t p = p0; p < p1; p++) {
    const T *x = (const T *)j->x + p * g->H * g->W;
    T *y = (T *)j->y + p * g->OH * g->OW;
    for (int64_t oh = 0; oh < g->OH; oh++)
      for (int64_t ow = 0; ow < g->OW; ow++) {
        int64_t h0, h1, w0, w1;
        T inv = FN(avg_window)(g, oh, ow, j->include_pad, &h0, &h1, &w0, &w1);
        T acc = 0;
        for (int64_t ih = h0; ih < h1; ih++)
          for (int64_t iw = w0; iw < w1; iw++) acc += x[ih * g->W + iw];
        y[oh * g->OW + ow] = acc * inv;
      }
  }
}

static void FN(avgp_bwd)(void *ctx, int64_t p0, int64_t p1) {
  const pool_job *j = ctx;
  const emi_pool_geom *g = j->g;
  for (int64_t p = p0; p < p1; p++) {
    T *gx = (T *)j->gx + p * g->H * g->W;
    const T *gy = (const T *)j->gy + p * g->OH * g->OW;
    for (int64_t i = 0; i < g->H * g->W; i++) gx[i] = 0;
    for (int64_t oh = 0; oh < g->OH; oh++)
      for (int64_t ow = 0; ow < g->OW; ow++) {
        int64_t h0, h1, w0, w1;
        T v = gy[oh * g->OW + ow] *
              FN(avg_window)(g, oh, ow, j->include_pad, &h0, &h1, &w0, &w1);
        for (int64_t ih = h0; ih < h1; ih++)
          for (int64_t iw = w0; iw < w1; iw++) gx[ih * g->W + iw] += v;
      }
  }
}

static void FN(adap_fwd)(void *ctx, int64_t p0, int64_t p1) {
  const pool_job *j = ctx;
  const emi_pool_geom *g = j->g;
  for (int64_t p = p0; p < p1; p++) {
    const T *x = (const T *)j->x + p * g->H * g->W;
    T *y = (T *)j->y + p * g->OH * g->OW;
    for (int64_t oh = 0; oh < g->OH; oh++) {
      int64_t h0 = ada_start(oh, g->H, g->OH), h1 = ada_end(oh, g->H, g->OH);
      for (int64_t ow = 0; ow < g->OW; ow++) {
        int64_t w0 = ada_start(ow, g->W, g->OW), w1 = ada_end(ow, g->W, g->OW);
        T acc = 0;
        for (int64_t ih = h0; ih < h1; ih++)
          for (int64_t iw = w0; iw < w1; iw++) acc += x[ih * g->W + iw];
        y[oh * g->OW + ow] = acc / (T)((h1 - h0) * (w1 - w0));
      }
    }
  }
}

static void FN(adap_bwd)(void *ctx, int64_t p0, int64_t p1) {
  const pool_job *j = ctx;
  const emi_pool_geom *g = j->g;
  for (int64_t p = p0; p < p1; p++) {
    T *gx = (T *)j->gx + p * g->H * g->W;
    const T *gy = (const T *)j->gy + p * g->OH * g->OW;
    for (int64_t i = 0; i < g->H * g->W; i++) gx[i] = 0;
    for (int64_t oh = 0; oh < g->OH; oh++) {
      int64_t h0 = ada_start(oh, g->H, g->OH), h1 = ada_end(oh, g->H, g->OH);
      for (int64_t ow = 0; ow < g->OW; ow++) {
        int64_t w0 = ada_start(ow, g->W, g->OW), w1 = ada_end(ow, g->W, g->OW);
        T v = gy[oh * g->OW + ow] / (T)((h1 - h0) * (w1 - w0));
        for (int64_t ih = h0; ih < h1; ih++)
          for (int64_t iw = w0; iw < w1; iw++) gx[ih * g->W + iw] += v;
      }
    }
  }
}

#undef T
#undef FN

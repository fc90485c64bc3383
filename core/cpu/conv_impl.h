/*
** conv_impl.h -- the conv2d loops of conv.c for one element type T: im2col and
** its adjoint col2im, the forward and backward share functions, and the sum of
** the shares' weight and bias gradients. conv.c includes this file twice, with
** T float and T double, and FN(name) gives each copy its suffix (conv_fwd_f32,
** conv_fwd_f64, ...); FN(gemm) is conv.c's GEMM of that type. float stays float
** and double stays double, so each vectorizes at its own width. C has no
** templates; a file included per type keeps these loops ordinary code, which
** compiler messages and debuggers see line by line, where a macro would be one
** line. The file is part of conv.c (conv_job, valid_range, share_begin,
** conv_direct, FN(gemm_ep), FN(gw_dots_fast) come from there) and nothing else
** includes it.
**
** x is (N, C, H, W), w (O, C/G, kH, kW), y and gy (N, O, OH, OW); a share is a
** slice of the batch with its own scratch.
*/

static void FN(im2col)(const emi_conv_geom *g, const T *x, T *col) {
  int64_t L = g->OH * g->OW;
  for (int64_t c = 0; c < g->C; c++) {
    const T *xc = x + c * g->H * g->W;
    for (int64_t kh = 0; kh < g->kH; kh++)
      for (int64_t kw = 0; kw < g->kW; kw++) {
        T *row = col + ((c * g->kH + kh) * g->kW + kw) * L;
        int64_t offw = kw * g->dW - g->pW, lo, hi;
        valid_range(g->OW, g->W, g->sW, offw, &lo, &hi);
        for (int64_t oh = 0; oh < g->OH; oh++) {
          T *r = row + oh * g->OW;
          int64_t ih = oh * g->sH - g->pH + kh * g->dH;
          if (ih < 0 || ih >= g->H) {
            for (int64_t ow = 0; ow < g->OW; ow++) r[ow] = 0;
            continue;
          }
          const T *xr = xc + ih * g->W + offw;
          for (int64_t ow = 0; ow < lo; ow++) r[ow] = 0;
          if (g->sW == 1)
            for (int64_t ow = lo; ow < hi; ow++) r[ow] = xr[ow];
          else
            for (int64_t ow = lo; ow < hi; ow++) r[ow] = xr[ow * g->sW];
          for (int64_t ow = hi; ow < g->OW; ow++) r[ow] = 0;
        }
      }
  }
}

/* x += col2im(col), the adjoint of im2col. */
static void FN(col2im)(const emi_conv_geom *g, const T *col, T *x) {
  int64_t L = g->OH * g->OW;
  for (int64_t c = 0; c < g->C; c++) {
    T *xc = x + c * g->H * g->W;
    for (int64_t kh = 0; kh < g->kH; kh++)
      for (int64_t kw = 0; kw < g->kW; kw++) {
        const T *row = col + ((c * g->kH + kh) * g->kW + kw) * L;
        int64_t offw = kw * g->dW - g->pW, lo, hi;
        valid_range(g->OW, g->W, g->sW, offw, &lo, &hi);
        for (int64_t oh = 0; oh < g->OH; oh++) {
          int64_t ih = oh * g->sH - g->pH + kh * g->dH;
          if (ih < 0 || ih >= g->H) continue;
          const T *r = row + oh * g->OW;
          T *xr = xc + ih * g->W + offw;
          if (g->sW == 1)
            for (int64_t ow = lo; ow < hi; ow++) xr[ow] += r[ow];
          else
            for (int64_t ow = lo; ow < hi; ow++) xr[ow * g->sW] += r[ow];
        }
      }
  }
}

static void FN(conv_fwd)(void *ctx, int64_t s0, int64_t s1) {
  const conv_job *j = ctx;
  const emi_conv_geom *g = j->g;
  int64_t L = g->OH * g->OW, Cg = g->C / g->G, Og = g->O / g->G, K = Cg * g->kH * g->kW;
  const T *w = j->w, *b = j->b;
  for (int64_t s = s0; s < s1; s++) {
    T *col = (T *)(j->scratch + j->share_bytes * (size_t)s);
    for (int64_t n = share_begin(g->N, j->shares, s); n < share_begin(g->N, j->shares, s + 1);
         n++) {
      const T *xn = (const T *)j->x + n * g->C * g->H * g->W;
      T *yn = (T *)j->y + n * g->O * L;
      const T *c = xn;
      if (!conv_direct(g)) {
        FN(im2col)(g, xn, col);
        c = col;
      }
      for (int64_t gi = 0; gi < g->G; gi++)   /* bias and ReLU as it writes */
        FN(gemm_ep)(Og, L, K, w + gi * Og * K, K, 1, c + gi * K * L, L, yn + gi * Og * L, L,
                    b ? b + gi * Og : NULL, g->act == EMI_ACT_RELU);
    }
  }
}

/* Per share: col (C*kH*kW x L), gy^T (L x O), then gw^T (K x O) and gb (O), which
** conv_reduce sums over the shares. gw^T = col * gy^T keeps B row-contiguous. */
static void FN(conv_bwd)(void *ctx, int64_t s0, int64_t s1) {
  const conv_job *j = ctx;
  const emi_conv_geom *g = j->g;
  int64_t L = g->OH * g->OW, Cg = g->C / g->G, Og = g->O / g->G, K = Cg * g->kH * g->kW;
  const T *w = j->w;
  size_t colsz = (size_t)(g->C * g->kH * g->kW * L);
  for (int64_t s = s0; s < s1; s++) {
    T *col = (T *)(j->scratch + j->share_bytes * (size_t)s);
    T *gyt = col + colsz, *gwt = gyt + L * g->O, *gb = gwt + g->O * K;
    for (int64_t i = 0; i < g->O * K + g->O; i++) gwt[i] = 0;
    for (int64_t n = share_begin(g->N, j->shares, s); n < share_begin(g->N, j->shares, s + 1);
         n++) {
      const T *xn = (const T *)j->x + n * g->C * g->H * g->W;
      const T *gyn = (const T *)j->gy + n * g->O * L;
      if (j->want_gb)
        for (int64_t o = 0; o < g->O; o++) {
          T part[16] = {0}, acc = 0;
          int64_t l = 0;
          for (; l + 16 <= L; l += 16)
            for (int q = 0; q < 16; q++) part[q] += gyn[o * L + l + q];
          for (; l < L; l++) acc += gyn[o * L + l];
          for (int q = 0; q < 16; q++) acc += part[q];
          gb[o] += acc;
        }
      if (j->want_gw) {
        const T *c = col;
        if (conv_direct(g)) c = xn;
        else FN(im2col)(g, xn, col);
        if (K <= 16) {   /* few weight columns (e.g. one input channel): dots */
          for (int64_t gi = 0; gi < g->G; gi++) {
            const T *gyg = gyn + gi * Og * L, *cg = c + gi * K * L;
            if (FN(gw_dots_fast)(Og, K, L, gyg, cg, gwt + gi * Og, g->O)) continue;
            for (int64_t o = 0; o < Og; o++)
              for (int64_t k = 0; k < K; k++) {
                const T *a = gyg + o * L, *bb = cg + k * L;
                T part[16] = {0}, acc = 0;
                int64_t l = 0;
                for (; l + 16 <= L; l += 16)
                  for (int q = 0; q < 16; q++) part[q] += a[l + q] * bb[l + q];
                for (; l < L; l++) acc += a[l] * bb[l];
                for (int q = 0; q < 16; q++) acc += part[q];
                gwt[k * g->O + gi * Og + o] += acc;
              }
          }
        } else {
        for (int64_t l0 = 0; l0 < L; l0 += 16)   /* gy^T, in tiles */
          for (int64_t o = 0; o < g->O; o++)
            for (int64_t l = l0; l < L && l < l0 + 16; l++) gyt[l * g->O + o] = gyn[o * L + l];
        for (int64_t gi = 0; gi < g->G; gi++)
          FN(gemm)(K, Og, L, c + gi * K * L, L, 1, gyt + gi * Og, g->O, gwt + gi * Og, g->O, 1);
        }
      }
      if (j->want_gx) {
        T *gxn = (T *)j->gx + n * g->C * g->H * g->W;
        T *c = conv_direct(g) ? gxn : col;
        for (int64_t gi = 0; gi < g->G; gi++)  /* col = W^T gy: A = W^T by strides */
          FN(gemm)(K, L, Og, w + gi * Og * K, 1, K, gyn + gi * Og * L, L, c + gi * K * L, L, 0);
        if (!conv_direct(g)) {
          for (int64_t i = 0; i < g->C * g->H * g->W; i++) gxn[i] = 0;
          FN(col2im)(g, col, gxn);
        }
      }
    }
  }
}

static void FN(conv_reduce)(const conv_job *j, void *gw_out, void *gb_out) {
  const emi_conv_geom *g = j->g;
  int64_t L = g->OH * g->OW, K = g->C / g->G * g->kH * g->kW;
  size_t colsz = (size_t)(g->C * g->kH * g->kW * L + L * g->O);
  T *gw = gw_out, *gb = gb_out;
  for (int64_t s = 0; s < j->shares; s++) {
    const T *sw = (const T *)(j->scratch + j->share_bytes * (size_t)s) + colsz;
    const T *sb = sw + g->O * K;
    if (gw)
      for (int64_t o = 0; o < g->O; o++)
        for (int64_t k = 0; k < K; k++)
          gw[o * K + k] = s ? gw[o * K + k] + sw[k * g->O + o] : sw[k * g->O + o];
    if (gb)
      for (int64_t i = 0; i < g->O; i++) gb[i] = s ? gb[i] + sb[i] : sb[i];
  }
}

#undef T
#undef FN

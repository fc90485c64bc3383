/*
** conv_fast.c -- float32 conv2d with stride 1 without im2col ("implicit GEMM").
**
** Each sample is copied once into a zero-padded image (C, Hp, Wp). For stride 1,
** the im2col row of (c, kh, kw) is then just the padded image read from offset
** c*Hp*Wp + kh*dH*Wp + kw*dW, over OH*Wp contiguous values: the output is
** computed on a grid Wp wide (the last Wp-OW columns of each row are junk and
** dropped). The GEMM kernel takes row pointers (emi_nn_sgemm_rows), so no
** column matrix (kH*kW times the input) is ever written. The AVX2 kernel can
** read only the output's columns of those rows (a column map: OW of every Wp),
** so the forward there computes no junk and writes y directly, with the bias and
** ReLU applied as it stores. The backward does the same: the input gradient is
** the full correlation of the padded grad_out with the flipped, transposed
** weight; the weight gradient reads the padded image rows against grad_out
** transposed (junk columns zeroed).
** Parallel over the batch, one share per thread, as conv.c. It runs only where
** our AVX-512 or AVX2 GEMM does (chosen at run time, nn_gemm.c); the code here
** is plain C, the same in every build.
*/
#include "nn.h"

typedef struct fast_job {
  const emi_conv_geom *g;
  const float *x, *w, *b, *gy, *wt;
  float *y, *gx;
  char *scratch;
  size_t share_bytes;
  int64_t shares;
  int want_gx, want_gw, want_gb;
} fast_job;

#define PADV(g) ((g)->kW * (g)->dW + 32)   /* slack after a padded image */

/* Only with our GEMM kernels: emi_nn_sgemm_rows's plain C fallback is slower
** than im2col and OpenBLAS, which conv.c uses otherwise. */
bool emi_conv_fast_ok(const emi_conv_geom *g) {
  return g->sH == 1 && g->sW == 1 && g->kH * g->kW > 1 && g->C / g->G >= 8 &&
         g->pH <= (g->kH - 1) * g->dH && g->pW <= (g->kW - 1) * g->dW && g->OH > 0 &&
         g->OW > 0 && emi_nn_sgemm_own();
}

static int64_t sb(const fast_job *j, int64_t s) { return j->g->N * s / j->shares; }

/* dst (C, H+2ph, W+2pw) + slack, zero-padded copy of src (C, H, W). The rows are
** short (14 floats on the Fashion-MNIST CNN), a few thousand per sample, where a
** call to memcpy per row costs more than the copy: the row loop stays a loop
** (GCC would turn it back into memcpy calls), which the compiler vectorizes. */
#if defined(__GNUC__) && !defined(__clang__)
__attribute__((optimize("no-tree-loop-distribute-patterns")))
#endif
static void pad_image(const float *src, int64_t C, int64_t H, int64_t W, int64_t ph,
                      int64_t pw, float *dst, int64_t slack) {
  int64_t Hp = H + 2 * ph, Wp = W + 2 * pw;
  for (int64_t c = 0; c < C; c++) {
    float *d = dst + c * Hp * Wp;
    memset(d, 0, sizeof(float) * (size_t)(ph * Wp));
    for (int64_t h = 0; h < H; h++) {
      float *r = d + (ph + h) * Wp;
      for (int64_t i = 0; i < pw; i++) r[i] = r[pw + W + i] = 0;
      const float *sr = src + (c * H + h) * W;
      for (int64_t w = 0; w < W; w++) r[pw + w] = sr[w];
    }
    memset(d + (ph + H) * Wp, 0, sizeof(float) * (size_t)(ph * Wp));
  }
  memset(dst + C * Hp * Wp, 0, sizeof(float) * (size_t)slack);
}

/* share layout: pointer tables (first, so that they are aligned) | xpad | wide
** output | gy^T wide | gypad | gx wide | gw^T (K x O) | gb (O), in floats. */
typedef struct fast_sizes { int64_t xpad, ywide, gyt, gypad, gxw, tabs, gwt, gb, total; } fast_sizes;
static fast_sizes sizes_of(const emi_conv_geom *g, int bwd) {
  int64_t Hp = g->H + 2 * g->pH, Wp = g->W + 2 * g->pW;
  int64_t ph2 = (g->kH - 1) * g->dH - g->pH, pw2 = (g->kW - 1) * g->dW - g->pW;
  int64_t Hq = g->OH + 2 * ph2, Wq = g->OW + 2 * pw2, Cg = g->C / g->G, Og = g->O / g->G;
  int64_t kk = g->kH * g->kW;
  fast_sizes z = {0};
  z.xpad = g->C * Hp * Wp + PADV(g);
  z.ywide = bwd ? 0 : g->O * g->OH * Wp;
  z.gyt = bwd ? g->OH * Wp * g->O : 0;
  z.gypad = bwd ? g->O * Hq * Wq + PADV(g) : 0;
  z.gxw = bwd ? g->C * g->H * Wq : 0;
  /* pointer tables, counted in floats (two per pointer) */
  /* A rows: max(K, Cg) + 8; B rows: max(OH*Wp, Og*kk) (see fast_bwd) */
  z.tabs = 2 * (Cg * kk + 2 * Og * kk + g->OH * Wp + Og + Cg + 32);
  z.gwt = bwd ? g->O * Cg * kk : 0;
  z.gb = bwd ? g->O : 0;
  z.total = z.xpad + z.ywide + z.gyt + z.gypad + z.gxw + z.tabs + z.gwt + z.gb + 16;
  return z;
}

static void fast_fwd(void *ctx, int64_t s0, int64_t s1) {
  const fast_job *j = ctx;
  const emi_conv_geom *g = j->g;
  int64_t Hp = g->H + 2 * g->pH, Wp = g->W + 2 * g->pW, Cg = g->C / g->G, Og = g->O / g->G;
  int64_t K = Cg * g->kH * g->kW, NW = g->OH * Wp, L = g->OH * g->OW;
  int relu = g->act == EMI_ACT_RELU;
  fast_sizes z = sizes_of(g, 0);
  emi_nn_colmap grid = {g->OW, Wp};   /* the output's columns inside the padded rows */
  for (int64_t s = s0; s < s1; s++) {
    const float **A = (const float **)(void *)(j->scratch + j->share_bytes * (size_t)s);
    const float **B = A + Og + 8;
    float *xpad = (float *)(void *)A + z.tabs, *yw = xpad + z.xpad;
    for (int64_t n = sb(j, s); n < sb(j, s + 1); n++) {
      pad_image(j->x + n * g->C * g->H * g->W, g->C, g->H, g->W, g->pH, g->pW, xpad, PADV(g));
      float *yn = j->y + n * g->O * L;
      bool wide = false;
      for (int64_t gi = 0; gi < g->G; gi++) {
        for (int64_t i = 0; i < Og; i++) A[i] = j->w + (gi * Og + i) * K;
        int64_t k = 0;
        for (int64_t c = 0; c < Cg; c++)
          for (int64_t kh = 0; kh < g->kH; kh++)
            for (int64_t kw = 0; kw < g->kW; kw++)
              B[k++] = xpad + (gi * Cg + c) * Hp * Wp + kh * g->dH * Wp + kw * g->dW;
        /* straight into y, bias and ReLU as it stores, where the kernel reads the
        ** output's columns through the map; else the wide grid, then a pass */
        if (!emi_nn_sgemm_rows_mapped(Og, L, K, A, 1, B, &grid, yn + gi * Og * L, L,
                                      j->b ? j->b + gi * Og : NULL, relu)) {
          emi_nn_sgemm_rows(Og, NW, K, A, 1, B, yw + gi * Og * NW, NW, 0);
          wide = true;
        }
      }
      if (!wide) continue;
      for (int64_t o = 0; o < g->O; o++) {
        float bv = j->b ? j->b[o] : 0;
        for (int64_t oh = 0; oh < g->OH; oh++) {
          const float *r = yw + o * NW + oh * Wp;
          float *d = yn + o * L + oh * g->OW;
          if (relu)
            for (int64_t ow = 0; ow < g->OW; ow++) {
              float v = r[ow] + bv;
              d[ow] = v < 0 ? 0.0f : v;
            }
          else
            for (int64_t ow = 0; ow < g->OW; ow++) d[ow] = r[ow] + bv;
        }
      }
    }
  }
}

/* dst[c*ldd + r] = src[r*lds + c], r < R, c < C: in 8x8 register tiles where the
** CPU has AVX2, else in strips of 8 columns. */
static void transpose(int64_t R, int64_t C, const float *src, int64_t lds, float *dst,
                      int64_t ldd) {
#if EMI_HAVE_AVX2_KERNELS
  if (emi_cpu_avx2()) {
    emi_transpose_avx2(R, C, src, lds, dst, ldd);
    return;
  }
#endif
  for (int64_t c0 = 0; c0 < C; c0 += 8)
    for (int64_t r = 0; r < R; r++)
      for (int64_t c = c0; c < c0 + 8 && c < C; c++) dst[c * ldd + r] = src[r * lds + c];
}

static void fast_bwd(void *ctx, int64_t s0, int64_t s1) {
  const fast_job *j = ctx;
  const emi_conv_geom *g = j->g;
  int64_t Hp = g->H + 2 * g->pH, Wp = g->W + 2 * g->pW, Cg = g->C / g->G, Og = g->O / g->G;
  int64_t ph2 = (g->kH - 1) * g->dH - g->pH, pw2 = (g->kW - 1) * g->dW - g->pW;
  int64_t Hq = g->OH + 2 * ph2, Wq = g->OW + 2 * pw2, kk = g->kH * g->kW;
  int64_t K = Cg * kk, NW = g->OH * Wp, L = g->OH * g->OW, O = g->O;
  fast_sizes z = sizes_of(g, 1);
  for (int64_t s = s0; s < s1; s++) {
    const float **A = (const float **)(void *)(j->scratch + j->share_bytes * (size_t)s);
    const float **B = A + (K > Og * kk ? K : Og * kk) + Cg + 8;
    float *xpad = (float *)(void *)A + z.tabs;
    float *gyt = xpad + z.xpad, *gyp = gyt + z.gyt, *gxw = gyp + z.gypad;
    float *gwt = gxw + z.gxw, *gb = gwt + z.gwt;
    memset(gwt, 0, sizeof(float) * (size_t)(z.gwt + z.gb));
    for (int64_t n = sb(j, s); n < sb(j, s + 1); n++) {
      const float *gyn = j->gy + n * O * L;
      if (j->want_gb)
        for (int64_t o = 0; o < O; o++) {
          float part[16] = {0}, acc = 0;
          int64_t l = 0;
          for (; l + 16 <= L; l += 16)
            for (int q = 0; q < 16; q++) part[q] += gyn[o * L + l + q];
          for (; l < L; l++) acc += gyn[o * L + l];
          for (int q = 0; q < 16; q++) acc += part[q];
          gb[o] += acc;
        }
      if (j->want_gw) {
        pad_image(j->x + n * g->C * g->H * g->W, g->C, g->H, g->W, g->pH, g->pW, xpad, PADV(g));
        /* gy^T on the wide grid: row oh*Wp+ow holds gy[:, oh, ow], junk rows zero */
        for (int64_t oh = 0; oh < g->OH; oh++) {
          transpose(O, g->OW, gyn + oh * g->OW, L, gyt + oh * Wp * O, O);
          memset(gyt + (oh * Wp + g->OW) * O, 0, sizeof(float) * (size_t)((Wp - g->OW) * O));
        }
        for (int64_t gi = 0; gi < g->G; gi++) {
          int64_t i = 0;
          for (int64_t c = 0; c < Cg; c++)
            for (int64_t kh = 0; kh < g->kH; kh++)
              for (int64_t kw = 0; kw < g->kW; kw++)
                A[i++] = xpad + (gi * Cg + c) * Hp * Wp + kh * g->dH * Wp + kw * g->dW;
          for (int64_t k = 0; k < NW; k++) B[k] = gyt + k * O + gi * Og;
          emi_nn_sgemm_rows(K, Og, NW, A, 1, B, gwt + gi * Og, O, 1);
        }
      }
      if (j->want_gx) {
        pad_image(gyn, O, g->OH, g->OW, ph2, pw2, gyp, PADV(g));
        int64_t NX = g->H * Wq, Kt = Og * kk;
        for (int64_t gi = 0; gi < g->G; gi++) {
          for (int64_t c = 0; c < Cg; c++) A[c] = j->wt + (gi * Cg + c) * Kt;
          int64_t k = 0;
          for (int64_t o = 0; o < Og; o++)
            for (int64_t kh = 0; kh < g->kH; kh++)
              for (int64_t kw = 0; kw < g->kW; kw++)
                B[k++] = gyp + (gi * Og + o) * Hq * Wq + kh * g->dH * Wq + kw * g->dW;
          emi_nn_sgemm_rows(Cg, NX, Kt, A, 1, B, gxw + gi * Cg * NX, NX, 0);
        }
        float *gxn = j->gx + n * g->C * g->H * g->W;
        for (int64_t c = 0; c < g->C; c++)
          for (int64_t h = 0; h < g->H; h++)
            memcpy(gxn + (c * g->H + h) * g->W, gxw + c * NX + h * Wq, sizeof(float) * (size_t)g->W);
      }
    }
  }
}

static int64_t blas_free_shares(em_state *S, const emi_conv_geom *g, int64_t shares) {
  (void)S;
  return shares < 1 ? 1 : (shares > g->N ? (g->N > 0 ? g->N : 1) : shares);
}

em_status emi_conv_fast_fwd(em_state *S, const emi_conv_geom *g, const float *x,
                            const float *w, const float *b, float *y, int64_t shares) {
  shares = blas_free_shares(S, g, shares);
  fast_job j = {.g = g, .x = x, .w = w, .b = b, .y = y, .shares = shares};
  j.share_bytes = ((size_t)sizes_of(g, 0).total * sizeof(float) + 63) & ~(size_t)63;
  size_t total = j.share_bytes * (size_t)shares;
  if (!(j.scratch = emi_malloc(S, total)))
    return emi_error(S, EM_ERR_NOMEM, "conv2d: out of memory for %zu bytes of scratch", total);
  if (shares > 1) emi_parallel_for(S, shares, 1, fast_fwd, &j);
  else fast_fwd(&j, 0, 1);
  emi_free(S, j.scratch, total);
  return EM_OK;
}

em_status emi_conv_fast_bwd(em_state *S, const emi_conv_geom *g, const float *gy,
                            const float *x, const float *w, float *gx, float *gw, float *gb,
                            int64_t shares) {
  shares = blas_free_shares(S, g, shares);
  int64_t Cg = g->C / g->G, Og = g->O / g->G, kk = g->kH * g->kW, K = Cg * kk;
  fast_job j = {.g = g, .x = x, .w = w, .gy = gy, .gx = gx, .shares = shares,
                .want_gx = gx != NULL, .want_gw = gw != NULL, .want_gb = gb != NULL};
  fast_sizes z = sizes_of(g, 1);
  j.share_bytes = ((size_t)z.total * sizeof(float) + 63) & ~(size_t)63;
  size_t wtb = (size_t)(g->O * K) * sizeof(float);
  size_t total = j.share_bytes * (size_t)shares + wtb;
  if (!(j.scratch = emi_malloc(S, total)))
    return emi_error(S, EM_ERR_NOMEM, "conv2d_backward: out of memory for %zu bytes of "
                     "scratch", total);
  /* flipped, transposed weight per group: wt[c][(o, kh, kw)] = w[o][c][kH-1-kh][kW-1-kw] */
  float *wt = (float *)(j.scratch + j.share_bytes * (size_t)shares);
  for (int64_t gi = 0; gi < g->G; gi++)
    for (int64_t c = 0; c < Cg; c++)
      for (int64_t o = 0; o < Og; o++)
        for (int64_t q = 0; q < kk; q++)
          wt[((gi * Cg + c) * Og + o) * kk + q] = w[((gi * Og + o) * Cg + c) * kk + (kk - 1 - q)];
  j.wt = wt;
  if (shares > 1) emi_parallel_for(S, shares, 1, fast_bwd, &j);
  else fast_bwd(&j, 0, 1);
  /* sum the shares' gw^T (K x O) and gb in share order */
  for (int64_t s = 0; s < shares; s++) {
    const float *sw = (const float *)(j.scratch + j.share_bytes * (size_t)s) + z.tabs + z.xpad +
                      z.gyt + z.gypad + z.gxw;
    const float *sbias = sw + z.gwt;
    if (gw)
      for (int64_t o = 0; o < g->O; o++)
        for (int64_t k = 0; k < K; k++)
          gw[o * K + k] = s ? gw[o * K + k] + sw[k * g->O + o] : sw[k * g->O + o];
    if (gb)
      for (int64_t o = 0; o < g->O; o++) gb[o] = s ? gb[o] + sbias[o] : sbias[o];
  }
  emi_free(S, j.scratch, total);
  return EM_OK;
}

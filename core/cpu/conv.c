/*
** conv.c -- CPU conv2d forward and backward (NCHW): im2col into a per-thread
** column buffer, then one GEMM per sample and group. The batch is split into one
** share per thread and each share calls single-threaded BLAS: the Fashion-MNIST
** sized convs (a few hundred columns per sample) are too small for BLAS's own
** threads to pay off, while whole samples split evenly. A 1x1/stride 1/no pad
** conv skips im2col (the input already is the column matrix).
**
** The loops are written once, in CONV_KERNELS, and stamped out for float and
** double, so that both get the same tight code.
*/
#include "nn.h"
#include <cblas.h>

typedef struct conv_job {
  const emi_conv_geom *g;
  const void *x, *w, *b, *gy;
  void *y, *gx;
  char *scratch;        /* per share: column buffer, then gw/gb accumulators */
  size_t share_bytes;
  int64_t shares;
  int want_gx, want_gw, want_gb;
} conv_job;

static int64_t share_begin(int64_t n, int64_t shares, int64_t s) { return n * s / shares; }

static bool conv_direct(const emi_conv_geom *g) {
  return g->kH == 1 && g->kW == 1 && g->sH == 1 && g->sW == 1 && g->pH == 0 && g->pW == 0;
}

/* Valid output columns [*lo, *hi) for which iw = ow*s + off lies in [0, W). */
static void valid_range(int64_t OW, int64_t W, int64_t s, int64_t off, int64_t *lo,
                        int64_t *hi) {
  int64_t a = off < 0 ? (-off + s - 1) / s : 0;
  int64_t b = W - 1 - off < 0 ? 0 : (W - 1 - off) / s + 1;
  if (b > OW) b = OW;
  if (a > b) a = b;
  *lo = a;
  *hi = b;
}

/* C = [C +] A*B with A of any strides (see nn_gemm.c); double goes to BLAS. */
static void gemm_f32(int64_t M, int64_t N, int64_t K, const float *A, int64_t ars,
                     int64_t acs, const float *B, int64_t ldb, float *C, int64_t ldc, int acc) {
  emi_nn_sgemm(M, N, K, A, ars, acs, B, ldb, C, ldc, acc);
}
static void gemm_f64(int64_t M, int64_t N, int64_t K, const double *A, int64_t ars,
                     int64_t acs, const double *B, int64_t ldb, double *C, int64_t ldc,
                     int acc) {
  enum CBLAS_TRANSPOSE ta = acs == 1 ? CblasNoTrans : CblasTrans;
  cblas_dgemm(CblasRowMajor, ta, CblasNoTrans, (int)M, (int)N, (int)K, 1.0, A,
              emi_blas_lda(M, K, ars, acs), B, (int)ldb, acc ? 1.0 : 0.0, C, (int)ldc);
}

/* -- Per-dtype loops (T is float or double) ------------------------------------------ */
#define CONV_KERNELS(T, SFX)                                                                \
static void im2col_##SFX(const emi_conv_geom *g, const T *x, T *col) {                      \
  int64_t L = g->OH * g->OW;                                                                \
  for (int64_t c = 0; c < g->C; c++) {                                                      \
    const T *xc = x + c * g->H * g->W;                                                      \
    for (int64_t kh = 0; kh < g->kH; kh++)                                                  \
      for (int64_t kw = 0; kw < g->kW; kw++) {                                              \
        T *row = col + ((c * g->kH + kh) * g->kW + kw) * L;                                 \
        int64_t offw = kw * g->dW - g->pW, lo, hi;                                          \
        valid_range(g->OW, g->W, g->sW, offw, &lo, &hi);                                    \
        for (int64_t oh = 0; oh < g->OH; oh++) {                                            \
          T *r = row + oh * g->OW;                                                          \
          int64_t ih = oh * g->sH - g->pH + kh * g->dH;                                     \
          if (ih < 0 || ih >= g->H) {                                                       \
            for (int64_t ow = 0; ow < g->OW; ow++) r[ow] = 0;                               \
            continue;                                                                       \
          }                                                                                 \
          const T *xr = xc + ih * g->W + offw;                                              \
          for (int64_t ow = 0; ow < lo; ow++) r[ow] = 0;                                    \
          if (g->sW == 1)                                                                   \
            for (int64_t ow = lo; ow < hi; ow++) r[ow] = xr[ow];                            \
          else                                                                              \
            for (int64_t ow = lo; ow < hi; ow++) r[ow] = xr[ow * g->sW];                    \
          for (int64_t ow = hi; ow < g->OW; ow++) r[ow] = 0;                                \
        }                                                                                   \
      }                                                                                     \
  }                                                                                         \
}                                                                                           \
                                                                                            \
/* x += col2im(col), the adjoint of im2col. */                                              \
static void col2im_##SFX(const emi_conv_geom *g, const T *col, T *x) {                      \
  int64_t L = g->OH * g->OW;                                                                \
  for (int64_t c = 0; c < g->C; c++) {                                                      \
    T *xc = x + c * g->H * g->W;                                                            \
    for (int64_t kh = 0; kh < g->kH; kh++)                                                  \
      for (int64_t kw = 0; kw < g->kW; kw++) {                                              \
        const T *row = col + ((c * g->kH + kh) * g->kW + kw) * L;                           \
        int64_t offw = kw * g->dW - g->pW, lo, hi;                                          \
        valid_range(g->OW, g->W, g->sW, offw, &lo, &hi);                                    \
        for (int64_t oh = 0; oh < g->OH; oh++) {                                            \
          int64_t ih = oh * g->sH - g->pH + kh * g->dH;                                     \
          if (ih < 0 || ih >= g->H) continue;                                               \
          const T *r = row + oh * g->OW;                                                    \
          T *xr = xc + ih * g->W + offw;                                                    \
          if (g->sW == 1)                                                                   \
            for (int64_t ow = lo; ow < hi; ow++) xr[ow] += r[ow];                           \
          else                                                                              \
            for (int64_t ow = lo; ow < hi; ow++) xr[ow * g->sW] += r[ow];                   \
        }                                                                                   \
      }                                                                                     \
  }                                                                                         \
}                                                                                           \
                                                                                            \
static void conv_fwd_##SFX(void *ctx, int64_t s0, int64_t s1) {                             \
  const conv_job *j = ctx;                                                                  \
  const emi_conv_geom *g = j->g;                                                            \
  int64_t L = g->OH * g->OW, Cg = g->C / g->G, Og = g->O / g->G, K = Cg * g->kH * g->kW;    \
  const T *w = j->w, *b = j->b;                                                             \
  for (int64_t s = s0; s < s1; s++) {                                                       \
    T *col = (T *)(j->scratch + j->share_bytes * (size_t)s);                                \
    for (int64_t n = share_begin(g->N, j->shares, s); n < share_begin(g->N, j->shares, s + 1); \
         n++) {                                                                             \
      const T *xn = (const T *)j->x + n * g->C * g->H * g->W;                               \
      T *yn = (T *)j->y + n * g->O * L;                                                     \
      const T *c = xn;                                                                      \
      if (!conv_direct(g)) {                                                                \
        im2col_##SFX(g, xn, col);                                                           \
        c = col;                                                                            \
      }                                                                                     \
      if (b)                                                                                \
        for (int64_t o = 0; o < g->O; o++)                                                  \
          for (int64_t l = 0; l < L; l++) yn[o * L + l] = b[o];                             \
      for (int64_t gi = 0; gi < g->G; gi++)                                                 \
        gemm_##SFX(Og, L, K, w + gi * Og * K, K, 1, c + gi * K * L, L, yn + gi * Og * L, L, \
                   b != NULL);                                                              \
    }                                                                                       \
  }                                                                                         \
}                                                                                           \
                                                                                            \
/* Per share: col (C*kH*kW x L), gy^T (L x O), then gw^T (K x O) and gb (O), which          \
** conv_reduce sums over the shares. gw^T = col * gy^T keeps B row-contiguous. */           \
static void conv_bwd_##SFX(void *ctx, int64_t s0, int64_t s1) {                             \
  const conv_job *j = ctx;                                                                  \
  const emi_conv_geom *g = j->g;                                                            \
  int64_t L = g->OH * g->OW, Cg = g->C / g->G, Og = g->O / g->G, K = Cg * g->kH * g->kW;    \
  const T *w = j->w;                                                                        \
  size_t colsz = (size_t)(g->C * g->kH * g->kW * L);                                        \
  for (int64_t s = s0; s < s1; s++) {                                                       \
    T *col = (T *)(j->scratch + j->share_bytes * (size_t)s);                                \
    T *gyt = col + colsz, *gwt = gyt + L * g->O, *gb = gwt + g->O * K;                      \
    for (int64_t i = 0; i < g->O * K + g->O; i++) gwt[i] = 0;                               \
    for (int64_t n = share_begin(g->N, j->shares, s); n < share_begin(g->N, j->shares, s + 1); \
         n++) {                                                                             \
      const T *xn = (const T *)j->x + n * g->C * g->H * g->W;                               \
      const T *gyn = (const T *)j->gy + n * g->O * L;                                       \
      if (j->want_gb)                                                                       \
        for (int64_t o = 0; o < g->O; o++) {                                                \
          T part[16] = {0}, acc = 0;                                                        \
          int64_t l = 0;                                                                    \
          for (; l + 16 <= L; l += 16)                                                      \
            for (int q = 0; q < 16; q++) part[q] += gyn[o * L + l + q];                     \
          for (; l < L; l++) acc += gyn[o * L + l];                                         \
          for (int q = 0; q < 16; q++) acc += part[q];                                      \
          gb[o] += acc;                                                                     \
        }                                                                                   \
      if (j->want_gw) {                                                                     \
        const T *c = col;                                                                   \
        if (conv_direct(g)) c = xn;                                                         \
        else im2col_##SFX(g, xn, col);                                                      \
        if (K <= 16) {   /* few weight columns (e.g. one input channel): plain dots */      \
          for (int64_t gi = 0; gi < g->G; gi++)                                             \
            for (int64_t o = 0; o < Og; o++)                                                \
              for (int64_t k = 0; k < K; k++) {                                             \
                const T *a = gyn + (gi * Og + o) * L, *bb = c + (gi * K + k) * L;           \
                T part[16] = {0}, acc = 0;                                                  \
                int64_t l = 0;                                                              \
                for (; l + 16 <= L; l += 16)                                                \
                  for (int q = 0; q < 16; q++) part[q] += a[l + q] * bb[l + q];             \
                for (; l < L; l++) acc += a[l] * bb[l];                                     \
                for (int q = 0; q < 16; q++) acc += part[q];                                \
                gwt[k * g->O + gi * Og + o] += acc;                                         \
              }                                                                             \
        } else {                                                                            \
        for (int64_t l0 = 0; l0 < L; l0 += 16)   /* gy^T, in tiles */                       \
          for (int64_t o = 0; o < g->O; o++)                                                \
            for (int64_t l = l0; l < L && l < l0 + 16; l++) gyt[l * g->O + o] = gyn[o * L + l]; \
        for (int64_t gi = 0; gi < g->G; gi++)                                               \
          gemm_##SFX(K, Og, L, c + gi * K * L, L, 1, gyt + gi * Og, g->O, gwt + gi * Og, g->O, 1); \
        }                                                                                   \
      }                                                                                     \
      if (j->want_gx) {                                                                     \
        T *gxn = (T *)j->gx + n * g->C * g->H * g->W;                                       \
        T *c = conv_direct(g) ? gxn : col;                                                  \
        for (int64_t gi = 0; gi < g->G; gi++)  /* col = W^T gy: A = W^T by strides */       \
          gemm_##SFX(K, L, Og, w + gi * Og * K, 1, K, gyn + gi * Og * L, L, c + gi * K * L, L, 0); \
        if (!conv_direct(g)) {                                                              \
          for (int64_t i = 0; i < g->C * g->H * g->W; i++) gxn[i] = 0;                      \
          col2im_##SFX(g, col, gxn);                                                        \
        }                                                                                   \
      }                                                                                     \
    }                                                                                       \
  }                                                                                         \
}                                                                                           \
                                                                                            \
static void conv_reduce_##SFX(const conv_job *j, void *gw_out, void *gb_out) {              \
  const emi_conv_geom *g = j->g;                                                            \
  int64_t L = g->OH * g->OW, K = g->C / g->G * g->kH * g->kW;                               \
  size_t colsz = (size_t)(g->C * g->kH * g->kW * L + L * g->O);                             \
  T *gw = gw_out, *gb = gb_out;                                                             \
  for (int64_t s = 0; s < j->shares; s++) {                                                 \
    const T *sw = (const T *)(j->scratch + j->share_bytes * (size_t)s) + colsz;             \
    const T *sb = sw + g->O * K;                                                            \
    if (gw)                                                                                 \
      for (int64_t o = 0; o < g->O; o++)                                                    \
        for (int64_t k = 0; k < K; k++)                                                     \
          gw[o * K + k] = s ? gw[o * K + k] + sw[k * g->O + o] : sw[k * g->O + o];          \
    if (gb)                                                                                 \
      for (int64_t i = 0; i < g->O; i++) gb[i] = s ? gb[i] + sb[i] : sb[i];                 \
  }                                                                                         \
}

CONV_KERNELS(float, f32)
CONV_KERNELS(double, f64)
#undef CONV_KERNELS

/* -- Entries ---------------------------------------------------------------------------- */

static int64_t plan_shares(em_state *S, int64_t N, int64_t work) {
  int nt = S->num_threads > 0 ? S->num_threads : 1;
  if (nt <= 1 || N < 2 || work < 200000) return 1;
  return N < nt ? N : nt;
}

/* Shares that call OpenBLAS side by side want it single-threaded meanwhile (the
** float32 GEMM calls it only on CPUs without AVX-512): see blas.c. */
static bool shares_use_blas(em_dtype dt, int64_t shares) {
  return shares > 1 && (dt == EM_FLOAT64 || EMI_NN_SGEMM_BLAS);
}

em_status emi_cpu_conv2d(emi_device *dev, const emi_conv_geom *g, em_tensor *y,
                         const em_tensor *x, const em_tensor *w, const em_tensor *b) {
  em_state *S = dev->S;
  em_dtype dt = x->dtype;
  size_t es = em_dtype_size(dt);
  int64_t L = g->OH * g->OW, K = g->C / g->G * g->kH * g->kW;
  int64_t shares = plan_shares(S, g->N, g->N * g->O * K * L);
  if (dt == EM_FLOAT32 && emi_conv_fast_ok(g))
    return emi_conv_fast_fwd(S, g, em_tensor_data(x), em_tensor_data(w),
                             b ? em_tensor_data(b) : NULL, em_tensor_data(y), shares);
  conv_job j = {.g = g, .x = em_tensor_data(x), .w = em_tensor_data(w),
                .b = b ? em_tensor_data(b) : NULL, .y = em_tensor_data(y), .shares = shares};
  j.share_bytes = conv_direct(g) ? 0 : (size_t)(g->C * g->kH * g->kW * L) * es;
  size_t total = j.share_bytes * (size_t)shares;
  if (total && !(j.scratch = emi_malloc(S, total)))
    return emi_error(S, EM_ERR_NOMEM, "conv2d: out of memory for a %zu-byte column buffer",
                     total);
  bool serial = shares_use_blas(dt, shares);
  if (serial) emi_blas_serial_begin();
  emi_range_fn fn = dt == EM_FLOAT32 ? conv_fwd_f32 : conv_fwd_f64;
  if (shares > 1) emi_parallel_for(S, shares, 1, fn, &j);
  else fn(&j, 0, 1);
  if (serial) emi_blas_serial_end();
  if (total) emi_free(S, j.scratch, total);
  return EM_OK;
}

em_status emi_cpu_conv2d_backward(emi_device *dev, const emi_conv_geom *g, em_tensor *gx,
                                  em_tensor *gw, em_tensor *gb, const em_tensor *gy,
                                  const em_tensor *x, const em_tensor *w) {
  em_state *S = dev->S;
  em_dtype dt = x->dtype;
  size_t es = em_dtype_size(dt);
  void *pgx = gx ? em_tensor_data(gx) : NULL, *pgw = gw ? em_tensor_data(gw) : NULL,
       *pgb = gb ? em_tensor_data(gb) : NULL;
  int64_t L = g->OH * g->OW, K = g->C / g->G * g->kH * g->kW;
  int64_t shares = plan_shares(S, g->N, g->N * g->O * K * L * 2);
  if (dt == EM_FLOAT32 && emi_conv_fast_ok(g))
    return emi_conv_fast_bwd(S, g, em_tensor_data(gy), em_tensor_data(x), em_tensor_data(w),
                             pgx, pgw, pgb, shares);
  conv_job j = {.g = g, .x = em_tensor_data(x), .w = em_tensor_data(w),
                .gy = em_tensor_data(gy), .gx = pgx, .shares = shares,
                .want_gx = gx != NULL, .want_gw = gw != NULL, .want_gb = gb != NULL};
  size_t col = (size_t)(g->C * g->kH * g->kW * L + L * g->O) * es;  /* col, gy^T */
  size_t acc = (size_t)(g->O * K + g->O) * es;                        /* gw^T, gb */
  j.share_bytes = (col + acc + 63) & ~(size_t)63;
  size_t total = j.share_bytes * (size_t)shares;
  if (!(j.scratch = emi_malloc(S, total)))
    return emi_error(S, EM_ERR_NOMEM, "conv2d_backward: out of memory for %zu bytes of "
                     "scratch", total);
  bool serial = shares_use_blas(dt, shares);
  if (serial) emi_blas_serial_begin();
  emi_range_fn fn = dt == EM_FLOAT32 ? conv_bwd_f32 : conv_bwd_f64;
  if (shares > 1) emi_parallel_for(S, shares, 1, fn, &j);
  else fn(&j, 0, 1);
  if (serial) emi_blas_serial_end();
  /* Sum the shares' weight and bias gradients, in share order (deterministic). */
  if (dt == EM_FLOAT32) conv_reduce_f32(&j, pgw, pgb);
  else conv_reduce_f64(&j, pgw, pgb);
  emi_free(S, j.scratch, total);
  return EM_OK;
}

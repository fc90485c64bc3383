/*
** conv.c -- CPU conv2d forward and backward (NCHW): im2col into a per-thread
** column buffer, then one GEMM per sample and group. The batch is split into one
** share per thread and each share calls single-threaded BLAS: the Fashion-MNIST
** sized convs (a few hundred columns per sample) are too small for BLAS's own
** threads to pay off, while whole samples split evenly. A 1x1/stride 1/no pad
** conv skips im2col (the input already is the column matrix).
**
** The loops are written once, in conv_impl.h, which this file includes for float
** and for double, so that both get the same tight code.
*/
#include "nn.h"
#include "lowp.h"
#include "dnnl.h"
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

/* y = [relu](w * col + b[row]): the epilogue inside the float32 GEMM; float64
** runs BLAS, then one pass over the rows while they are in cache. */
static void gemm_ep_f32(int64_t M, int64_t N, int64_t K, const float *A, int64_t ars,
                        int64_t acs, const float *B, int64_t ldb, float *C, int64_t ldc,
                        const float *bias, int relu) {
  emi_nn_sgemm_ep(M, N, K, A, ars, acs, B, ldb, C, ldc, bias, relu);
}
static void gemm_ep_f64(int64_t M, int64_t N, int64_t K, const double *A, int64_t ars,
                        int64_t acs, const double *B, int64_t ldb, double *C, int64_t ldc,
                        const double *bias, int relu) {
  gemm_f64(M, N, K, A, ars, acs, B, ldb, C, ldc, 0);
  if (!bias && !relu) return;
  for (int64_t i = 0; i < M; i++)
    for (int64_t j = 0; j < N; j++) {
      double v = bias ? C[i * ldc + j] + bias[i] : C[i * ldc + j];
      C[i * ldc + j] = relu && v < 0 ? 0.0 : v;
    }
}

/* The weight gradient's dots where K (weight columns) is small, gwt (K x O) +=
** gy (Og x L) col^T: the AVX2 kernel for float32 where the CPU has it (true),
** else conv_impl.h's plain loop (false). */
static bool gw_dots_fast_f32(int64_t Og, int64_t K, int64_t L, const float *gy,
                             const float *col, float *gwt, int64_t O) {
#if EMI_HAVE_AVX2_KERNELS
  if (emi_cpu_avx2()) {
    emi_nn_sgemm_nt_avx2(Og, K, L, gy, L, col, L, gwt, 1, O);
    return true;
  }
#endif
  return false;
}
static bool gw_dots_fast_f64(int64_t Og, int64_t K, int64_t L, const double *gy,
                             const double *col, double *gwt, int64_t O) {
  return false;
}

/* -- Per-dtype loops (conv_impl.h, T float then double) --------------------------------- */

#define T float
#define FN(name) name##_f32
#include "conv_impl.h"
#define T double
#define FN(name) name##_f64
#include "conv_impl.h"

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
  /* Who serves: oneDNN where it wins (dnnl.c declines the rest), then float16 /
  ** bfloat16 widened to float32 (conv_lowp.c, which comes back here), then ours in
  ** NHWC (conv_nhwc.c) or NCHW (below). Ours apply g->act as they write. */
  bool served;
  em_status dst = emi_dnnl_conv2d(S, g, y, x, w, b, &served);
  /* oneDNN's ReLU post-op turns NaN into 0, where ReLU keeps it: a pass of ours */
  if (served && !dst && g->act == EMI_ACT_RELU) dst = emi_cpu_unary(dev, EM_RELU, y, y);
  if (served || dst) return dst;
  if (emi_lowp(x->dtype)) return emi_cpu_conv2d_lowp(dev, g, y, x, w, b);
  if (g->nhwc) return emi_cpu_conv2d_nhwc(dev, g, y, x, w, b);
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
  /* the order of emi_cpu_conv2d; oneDNN computes the gradients it wins at and
  ** clears their pointers, the rest fall through */
  em_status dst = emi_dnnl_conv2d_backward(S, g, &gx, &gw, &gb, gy, x, w);
  if (dst || (!gx && !gw && !gb)) return dst;
  if (emi_lowp(x->dtype)) return emi_cpu_conv2d_backward_lowp(dev, g, gx, gw, gb, gy, x, w);
  if (g->nhwc) return emi_cpu_conv2d_nhwc_backward(dev, g, gx, gw, gb, gy, x, w);
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

/*
** conv_nhwc.c -- CPU conv2d forward and backward on channels-last tensors
** (g->nhwc): x (N, H, W, C), w (O, kH, kW, C/G), y and gy (N, OH, OW, O), all
** dense, float32 and float64.
**
** In NHWC a conv is a GEMM over pixels: Y[pixels, O] = X_cols[pixels, K] W^T
** with K = kH*kW*C/G ordered (kh, kw, c), which is exactly w's memory order. The
** column matrix of a sample is built from contiguous runs of C/G channels, one
** per kernel tap (a padded tap is a run of zeros); a 1x1, stride-1, unpadded conv
** needs none: the input rows are the columns (leading dimension C). The backward
** is the same GEMMs turned around: gW += gY^T X_cols, dX_cols = gY W, and dX_cols
** added back tap by tap (col2im). The batch is split into one share per thread,
** each with its own column buffer and weight-gradient accumulator, summed in
** share order afterwards (deterministic), and BLAS is kept single-threaded
** meanwhile, as conv.c does.
*/
#include "nn.h"
#include <cblas.h>

typedef struct nhwc_job {
  const emi_conv_geom *g;
  const void *x, *w, *b, *gy;
  void *y, *gx;
  char *scratch;      /* per share: column buffer | gw accumulator (O x K) | gb (O) */
  size_t share_bytes;
  int64_t shares;
  int want_gx, want_gw, want_gb;
} nhwc_job;

static int64_t share_begin(int64_t n, int64_t shares, int64_t s) { return n * s / shares; }

static bool direct(const emi_conv_geom *g) {
  return g->kH == 1 && g->kW == 1 && g->sH == 1 && g->sW == 1 && g->pH == 0 && g->pW == 0;
}

/* C[M,N] = alpha-free op(A) op(B) (+ C when acc), row major, for both types. */
static void gemm_f32(bool ta, bool tb, int64_t M, int64_t N, int64_t K, const float *A,
                     int64_t lda, const float *B, int64_t ldb, float *C, int64_t ldc, int acc) {
  cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans,
              (int)M, (int)N, (int)K, 1.0f, A, (int)lda, B, (int)ldb, acc ? 1.0f : 0.0f, C,
              (int)ldc);
}
static void gemm_f64(bool ta, bool tb, int64_t M, int64_t N, int64_t K, const double *A,
                     int64_t lda, const double *B, int64_t ldb, double *C, int64_t ldc,
                     int acc) {
  cblas_dgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans,
              (int)M, (int)N, (int)K, 1.0, A, (int)lda, B, (int)ldb, acc ? 1.0 : 0.0, C,
              (int)ldc);
}

#define T float
#define FN(name) name##_f32
#include "conv_nhwc_impl.h"
#define T double
#define FN(name) name##_f64
#include "conv_nhwc_impl.h"

static int64_t plan(em_state *S, int64_t N, int64_t work) {
  int nt = S->num_threads > 0 ? S->num_threads : 1;
  if (nt <= 1 || N < 2 || work < 200000) return 1;
  return N < nt ? N : nt;
}

static void run(em_state *S, nhwc_job *j, emi_range_fn fn) {
  if (j->shares > 1) {
    emi_blas_serial_begin();
    emi_parallel_for(S, j->shares, 1, fn, j);
    emi_blas_serial_end();
  } else {
    fn(j, 0, 1);
  }
}

em_status emi_cpu_conv2d_nhwc(emi_device *dev, const emi_conv_geom *g, em_tensor *y,
                              const em_tensor *x, const em_tensor *w, const em_tensor *b) {
  em_state *S = dev->S;
  em_dtype dt = x->dtype;
  size_t es = em_dtype_size(dt);
  int64_t L = g->OH * g->OW, K = g->C / g->G * g->kH * g->kW;
  nhwc_job j = {.g = g, .x = em_tensor_data(x), .w = em_tensor_data(w),
                .b = b ? em_tensor_data(b) : NULL, .y = em_tensor_data(y)};
  j.shares = plan(S, g->N, g->N * g->O * K * L);
  j.share_bytes = direct(g) ? 0 : ((size_t)(L * K) * es + 63) & ~(size_t)63;
  size_t total = j.share_bytes * (size_t)j.shares;
  if (total && !(j.scratch = emi_malloc(S, total)))
    return emi_error(S, EM_ERR_NOMEM, "conv2d: out of memory for a %zu-byte column buffer",
                     total);
  run(S, &j, dt == EM_FLOAT32 ? nhwc_fwd_f32 : nhwc_fwd_f64);
  if (total) emi_free(S, j.scratch, total);
  return EM_OK;
}

em_status emi_cpu_conv2d_nhwc_backward(emi_device *dev, const emi_conv_geom *g,
                                       em_tensor *gx, em_tensor *gw, em_tensor *gb,
                                       const em_tensor *gy, const em_tensor *x,
                                       const em_tensor *w) {
  em_state *S = dev->S;
  em_dtype dt = x->dtype;
  size_t es = em_dtype_size(dt);
  int64_t L = g->OH * g->OW, K = g->C / g->G * g->kH * g->kW;
  nhwc_job j = {.g = g, .x = em_tensor_data(x), .w = em_tensor_data(w),
                .gy = em_tensor_data(gy), .gx = gx ? em_tensor_data(gx) : NULL,
                .want_gx = gx != NULL, .want_gw = gw != NULL, .want_gb = gb != NULL};
  j.shares = plan(S, g->N, g->N * g->O * K * L * 2);
  size_t col = direct(g) ? 0 : (size_t)(L * K) * es;
  j.share_bytes = (col + (size_t)(g->O * K + g->O) * es + 63) & ~(size_t)63;
  size_t total = j.share_bytes * (size_t)j.shares;
  if (!(j.scratch = emi_malloc(S, total)))
    return emi_error(S, EM_ERR_NOMEM, "conv2d_backward: out of memory for %zu bytes of "
                     "scratch", total);
  run(S, &j, dt == EM_FLOAT32 ? nhwc_bwd_f32 : nhwc_bwd_f64);
  void *pgw = gw ? em_tensor_data(gw) : NULL, *pgb = gb ? em_tensor_data(gb) : NULL;
  if (dt == EM_FLOAT32) nhwc_reduce_f32(&j, col, pgw, pgb);
  else nhwc_reduce_f64(&j, col, pgw, pgb);
  emi_free(S, j.scratch, total);
  return EM_OK;
}

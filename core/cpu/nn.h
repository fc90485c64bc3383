/*
** nn.h -- helpers shared by the CPU nn kernels, inside the CPU backend only: the
** single-threaded float32 GEMM (nn_gemm.c) and the im2col-free float32 conv
** (conv_fast.c) that conv.c calls. They take raw pointers to contiguous data; the
** backend table entries themselves are declared in cpu.h.
*/
#ifndef EMBER_CPU_NN_H
#define EMBER_CPU_NN_H
#include "cpu.h"

/* nn_gemm.c -- C (MxN) = [C +] A (MxK, any strides) * B (KxN, rows of stride ldb),
** single-threaded float32 (our AVX-512 or AVX2 kernel where the CPU has one, else
** cblas). With the fallback, A must have acs == 1 or ars == 1. */
void emi_nn_sgemm(int64_t M, int64_t N, int64_t K, const float *A, int64_t ars, int64_t acs,
                  const float *B, int64_t ldb, float *C, int64_t ldc, int acc);

/* Where a row of B keeps its columns: column l at (l / run) * stride + l % run (a
** conv's output grid inside the wider padded rows of its input). */
typedef struct emi_nn_colmap { int64_t run, stride; } emi_nn_colmap;

/* C = [relu](A*B + bias[row]) with B's rows by pointer read through map, each
** readable 7 floats past the end of each run; false (nothing done) where this
** process runs no kernel that reads through a map (then the caller computes the
** wide grid). */
bool emi_nn_sgemm_rows_mapped(int64_t M, int64_t N, int64_t K, const float *const *A,
                              int64_t acs, const float *const *B, const emi_nn_colmap *map,
                              float *C, int64_t ldc, const float *bias, int relu);

/* C = [relu](A*B + bias[row]), bias NULL for none: the GEMM with the conv's
** epilogue, applied as the AVX2 kernel stores C (elsewhere, a pass after). */
void emi_nn_sgemm_ep(int64_t M, int64_t N, int64_t K, const float *A, int64_t ars,
                     int64_t acs, const float *B, int64_t ldb, float *C, int64_t ldc,
                     const float *bias, int relu);

/* The same with rows given by pointers: A row i element k at A[i][k*acs], B row
** k at B[k] (conv_fast.c reads shifted windows of a padded image this way). */
void emi_nn_sgemm_rows(int64_t M, int64_t N, int64_t K, const float *const *A, int64_t acs,
                       const float *const *B, float *C, int64_t ldc, int acc);

/* The leading dimension to give cblas_?gemm for A (MxK, strides ars/acs, row-major,
** transposed where acs != 1). BLAS checks lda against the row length even where A
** has one row (or A^T one column), whose stride is then never used but may be 1:
** the input gradient of a 1x1 conv with one input channel per group is such a GEMM. */
static inline int emi_blas_lda(int64_t M, int64_t K, int64_t ars, int64_t acs) {
  int64_t lda = acs == 1 ? ars : acs;
  if (acs == 1 && M == 1 && lda < K) lda = K;
  if (acs != 1 && K == 1 && lda < M) lda = M;
  return (int)(lda < 1 ? 1 : lda);
}

/* Whether this process runs the AVX-512 kernels: the CPU and OS support them and
** EMBER_CPU_AVX512 is not 0; the AVX2 + FMA ones, EMBER_CPU_AVX2 not 0. Decided
** once, on the first call; any thread. */
bool emi_cpu_avx512(void);
bool emi_cpu_avx2(void);

/* Whether emi_nn_sgemm runs one of our kernels (AVX-512 or AVX2), not OpenBLAS. */
static inline bool emi_nn_sgemm_own(void) { return emi_cpu_avx512() || emi_cpu_avx2(); }
#define EMI_NN_SGEMM_BLAS (!emi_nn_sgemm_own())
/* Which serves emi_nn_sgemm, for `ember --info`: "its AVX-512 kernel", ... */
const char *emi_nn_sgemm_name(void);

/* nn_gemm_avx512.c -- the kernels behind the two above, compiled for AVX-512
** whatever the build's -march (x86-64 with GCC or clang only); call them only
** where emi_cpu_avx512() is true, with K > 0. */
#if defined(__x86_64__) && defined(__GNUC__)
#define EMI_HAVE_AVX512_KERNELS 1
void emi_nn_sgemm_avx512(int64_t M, int64_t N, int64_t K, const float *A, int64_t ars,
                         int64_t acs, const float *B, int64_t ldb, float *C, int64_t ldc,
                         int acc);
void emi_nn_sgemm_rows_avx512(int64_t M, int64_t N, int64_t K, const float *const *A,
                              int64_t acs, const float *const *B, float *C, int64_t ldc,
                              int acc);
#else
#define EMI_HAVE_AVX512_KERNELS 0
#endif

/* nn_gemm_avx2.c -- the same two, compiled for AVX2 + FMA whatever the build's
** -march; call them only where emi_cpu_avx2() is true, with K > 0. The plain one
** takes emi_nn_sgemm_ep's epilogue (bias NULL and relu 0: none). */
#if defined(__x86_64__) && defined(__GNUC__)
#define EMI_HAVE_AVX2_KERNELS 1
void emi_nn_sgemm_avx2(int64_t M, int64_t N, int64_t K, const float *A, int64_t ars,
                       int64_t acs, const float *B, int64_t ldb, float *C, int64_t ldc, int acc,
                       const float *bias, int relu);
void emi_nn_sgemm_rows_avx2(int64_t M, int64_t N, int64_t K, const float *const *A,
                            int64_t acs, const float *const *B, float *C, int64_t ldc,
                            int acc);
void emi_nn_sgemm_rows_mapped_avx2(int64_t M, int64_t N, int64_t K, const float *const *A,
                                   int64_t acs, const float *const *B,
                                   const emi_nn_colmap *map, float *C, int64_t ldc,
                                   const float *bias, int relu);
/* C[m*cm + n*cn] += sum over l < L of A[m*lda + l] * B[n*ldb + l], for m < M,
** n < N: the weight gradient of a conv with few weight columns (one input
** channel: K = kH*kW), where A is grad_out and B the im2col rows. */
void emi_nn_sgemm_nt_avx2(int64_t M, int64_t N, int64_t L, const float *A, int64_t lda,
                          const float *B, int64_t ldb, float *C, int64_t cm, int64_t cn);
/* dst[c*ldd + r] = src[r*lds + c] for r < R, c < C (the conv's gy^T). */
void emi_transpose_avx2(int64_t R, int64_t C, const float *src, int64_t lds, float *dst,
                        int64_t ldd);
#else
#define EMI_HAVE_AVX2_KERNELS 0
#endif

/* pool_avx2.c -- float32 max pooling's forward, 2x2 window, stride 2, one output
** row: OW outputs and their indices from input rows r0, r1 of width W (i0: the
** index of r0's first element); returns how many it did. Call only where
** emi_cpu_avx2(). */
#if EMI_HAVE_AVX2_KERNELS
int64_t emi_maxpool2x2_row_avx2(const float *r0, const float *r1, int64_t OW, int64_t W,
                                int64_t i0, float *y, int64_t *ind);
#endif

/* conv_nhwc.c -- conv2d on channels-last tensors (g->nhwc), float32 and float64;
** the entries of conv.c hand such geometries over. */
em_status emi_cpu_conv2d_nhwc(emi_device *dev, const emi_conv_geom *g, em_tensor *y,
                              const em_tensor *x, const em_tensor *w, const em_tensor *b);
em_status emi_cpu_conv2d_nhwc_backward(emi_device *dev, const emi_conv_geom *g,
                                       em_tensor *gx, em_tensor *gw, em_tensor *gb,
                                       const em_tensor *gy, const em_tensor *x,
                                       const em_tensor *w);
/* conv_fast.c -- float32 stride-1 conv2d without im2col (where emi_nn_sgemm_own()). */
bool emi_conv_fast_ok(const emi_conv_geom *g);
em_status emi_conv_fast_fwd(em_state *S, const emi_conv_geom *g, const float *x,
                            const float *w, const float *b, float *y, int64_t shares);
em_status emi_conv_fast_bwd(em_state *S, const emi_conv_geom *g, const float *gy,
                            const float *x, const float *w, float *gx, float *gw, float *gb,
                            int64_t shares);
#endif

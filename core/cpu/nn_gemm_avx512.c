/*
** nn_gemm_avx512.c -- the AVX-512 kernels of the single-threaded float32 GEMM
** under conv2d (nn_gemm.c says what it computes and why it is not BLAS).
**
** Every function here carries target("avx512f") (EMI_AVX512 below), so the file
** builds into any x86-64 library, the portable x86-64-v3 one included, without
** -mavx512f on the command line; nothing here may run before nn_gemm.c's
** emi_cpu_avx512() has said yes. Only AVX512F instructions are used (masked
** loads and stores, FMA, broadcasts), so that one CPUID bit is the whole check.
** The arithmetic is explicit intrinsics only: no C expression a*b+c is left for
** the compiler to contract or not, and a native build (-march=native on an
** AVX-512 machine) and the portable build give the same bits.
*/
#include "nn.h"
#if EMI_HAVE_AVX512_KERNELS
#include <immintrin.h>

#define EMI_AVX512 __attribute__((target("avx512f")))

/* The end of both 8x32 kernels: one row's accumulators v0, v1 (two vectors,
** masked by m0/m1 at the right edge) added to the row c where acc, then stored. */
EMI_AVX512 static inline __attribute__((always_inline)) void
store_row(float *c, int acc, __mmask16 m0, __mmask16 m1, __m512 v0, __m512 v1) {
  if (acc) {
    v0 = _mm512_add_ps(v0, _mm512_maskz_loadu_ps(m0, c));
    v1 = _mm512_add_ps(v1, _mm512_maskz_loadu_ps(m1, c + 16));
  }
  _mm512_mask_storeu_ps(c, m0, v0);
  _mm512_mask_storeu_ps(c + 16, m1, v1);
}
/* Rows 0..7, from the accumulators c<r>0, c<r>1 of the kernel. */
#define STORE_ROW(C, ldc, acc, m0, m1, r) \
  store_row((C) + (r) * (ldc), acc, m0, m1, c##r##0, c##r##1);
#define STORE_8x32(C, ldc, acc, m0, m1)                                                  \
  STORE_ROW(C, ldc, acc, m0, m1, 0) STORE_ROW(C, ldc, acc, m0, m1, 1)                    \
  STORE_ROW(C, ldc, acc, m0, m1, 2) STORE_ROW(C, ldc, acc, m0, m1, 3)                    \
  STORE_ROW(C, ldc, acc, m0, m1, 4) STORE_ROW(C, ldc, acc, m0, m1, 5)                    \
  STORE_ROW(C, ldc, acc, m0, m1, 6) STORE_ROW(C, ldc, acc, m0, m1, 7)

/* 8 rows x 32 columns (two vectors, masked at the right edge). */
EMI_AVX512 static inline void kern8(int64_t K, const float *A, int64_t ars, int64_t acs,
                                    const float *B, int64_t ldb, float *C, int64_t ldc,
                                    int acc, __mmask16 m0, __mmask16 m1) {
  __m512 c00 = _mm512_setzero_ps(), c01 = c00, c10 = c00, c11 = c00, c20 = c00, c21 = c00,
         c30 = c00, c31 = c00, c40 = c00, c41 = c00, c50 = c00, c51 = c00, c60 = c00,
         c61 = c00, c70 = c00, c71 = c00;
  for (int64_t k = 0; k < K; k++) {
    const float *b = B + k * ldb, *a = A + k * acs;
    __m512 b0 = _mm512_maskz_loadu_ps(m0, b), b1 = _mm512_maskz_loadu_ps(m1, b + 16), av;
#define ROW(r)                                                                           \
    av = _mm512_set1_ps(a[r * ars]);                                                     \
    c##r##0 = _mm512_fmadd_ps(av, b0, c##r##0);                                           \
    c##r##1 = _mm512_fmadd_ps(av, b1, c##r##1);
    ROW(0) ROW(1) ROW(2) ROW(3) ROW(4) ROW(5) ROW(6) ROW(7)
#undef ROW
  }
  STORE_8x32(C, ldc, acc, m0, m1)
}

/* Fewer than 8 rows: one row at a time, 32 columns. */
EMI_AVX512 static inline void kern1(int64_t K, const float *A, int64_t acs, const float *B,
                                    int64_t ldb, float *C, int acc, __mmask16 m0,
                                    __mmask16 m1) {
  __m512 s0 = _mm512_setzero_ps(), s1 = s0, t0 = s0, t1 = s0;
  int64_t k = 0;
  for (; k + 1 < K; k += 2) {   /* two k at a time: independent chains */
    const float *b = B + k * ldb;
    s0 = _mm512_fmadd_ps(_mm512_set1_ps(A[k * acs]), _mm512_maskz_loadu_ps(m0, b), s0);
    s1 = _mm512_fmadd_ps(_mm512_set1_ps(A[k * acs]), _mm512_maskz_loadu_ps(m1, b + 16), s1);
    t0 = _mm512_fmadd_ps(_mm512_set1_ps(A[(k + 1) * acs]), _mm512_maskz_loadu_ps(m0, b + ldb), t0);
    t1 = _mm512_fmadd_ps(_mm512_set1_ps(A[(k + 1) * acs]),
                         _mm512_maskz_loadu_ps(m1, b + ldb + 16), t1);
  }
  if (k < K) {
    const float *b = B + k * ldb;
    s0 = _mm512_fmadd_ps(_mm512_set1_ps(A[k * acs]), _mm512_maskz_loadu_ps(m0, b), s0);
    s1 = _mm512_fmadd_ps(_mm512_set1_ps(A[k * acs]), _mm512_maskz_loadu_ps(m1, b + 16), s1);
  }
  s0 = _mm512_add_ps(s0, t0);
  s1 = _mm512_add_ps(s1, t1);
  if (acc) {
    s0 = _mm512_add_ps(s0, _mm512_maskz_loadu_ps(m0, C));
    s1 = _mm512_add_ps(s1, _mm512_maskz_loadu_ps(m1, C + 16));
  }
  _mm512_mask_storeu_ps(C, m0, s0);
  _mm512_mask_storeu_ps(C + 16, m1, s1);
}

/* The lanes of a 16-wide vector that hold one of the n columns left. */
static __mmask16 mask_of(int64_t n) {
  return n >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (n > 0 ? n : 0)) - 1);
}

EMI_AVX512 void emi_nn_sgemm_avx512(int64_t M, int64_t N, int64_t K, const float *A,
                                    int64_t ars, int64_t acs, const float *B, int64_t ldb,
                                    float *C, int64_t ldc, int acc) {
  /* K in slices so that a 32-column panel of B stays in L1 across the row blocks */
  const int64_t KB = 256;
  for (int64_t k0 = 0; k0 < K; k0 += KB) {
    int64_t kb = K - k0 < KB ? K - k0 : KB;
    int a2 = acc || k0 > 0;
    for (int64_t j = 0; j < N; j += 32) {
      __mmask16 m0 = mask_of(N - j), m1 = mask_of(N - j - 16);
      int64_t i = 0;
      for (; i + 8 <= M; i += 8)
        kern8(kb, A + i * ars + k0 * acs, ars, acs, B + k0 * ldb + j, ldb, C + i * ldc + j, ldc,
              a2, m0, m1);
      for (; i < M; i++)
        kern1(kb, A + i * ars + k0 * acs, acs, B + k0 * ldb + j, ldb, C + i * ldc + j, a2, m0,
              m1);
    }
  }
}

/* The same 8x32 kernel with rows given by pointers: A row r element k at
** A[r][k*acs], B row k at B[k]. This lets conv read shifted windows of a padded
** image in place of an im2col copy. */
EMI_AVX512 static inline void kern8p(int64_t K, const float *const *A, int64_t acs,
                                     const float *const *B, int64_t j, float *C, int64_t ldc,
                                     int acc, __mmask16 m0, __mmask16 m1) {
  __m512 c00 = _mm512_setzero_ps(), c01 = c00, c10 = c00, c11 = c00, c20 = c00, c21 = c00,
         c30 = c00, c31 = c00, c40 = c00, c41 = c00, c50 = c00, c51 = c00, c60 = c00,
         c61 = c00, c70 = c00, c71 = c00;
  const float *a0 = A[0], *a1 = A[1], *a2 = A[2], *a3 = A[3], *a4 = A[4], *a5 = A[5],
              *a6 = A[6], *a7 = A[7];
  for (int64_t k = 0; k < K; k++) {
    const float *b = B[k] + j;
    __m512 b0 = _mm512_maskz_loadu_ps(m0, b), b1 = _mm512_maskz_loadu_ps(m1, b + 16), av;
#define ROW(r)                                                                           \
    av = _mm512_set1_ps(a##r[k * acs]);                                                  \
    c##r##0 = _mm512_fmadd_ps(av, b0, c##r##0);                                           \
    c##r##1 = _mm512_fmadd_ps(av, b1, c##r##1);
    ROW(0) ROW(1) ROW(2) ROW(3) ROW(4) ROW(5) ROW(6) ROW(7)
#undef ROW
  }
  STORE_8x32(C, ldc, acc, m0, m1)
}

EMI_AVX512 void emi_nn_sgemm_rows_avx512(int64_t M, int64_t N, int64_t K,
                                         const float *const *A, int64_t acs,
                                         const float *const *B, float *C, int64_t ldc,
                                         int acc) {
  const int64_t KB = 256;
  for (int64_t k0 = 0; k0 < K; k0 += KB) {
    int64_t kb = K - k0 < KB ? K - k0 : KB;
    int a2 = acc || k0 > 0;
    for (int64_t j = 0; j < N; j += 32) {
      __mmask16 m0 = mask_of(N - j), m1 = mask_of(N - j - 16);
      int64_t i = 0;
      for (; i + 8 <= M; i += 8) {
        const float *ar[8];
        for (int r = 0; r < 8; r++) ar[r] = A[i + r] + k0 * acs;
        kern8p(kb, ar, acs, B + k0, j, C + i * ldc + j, ldc, a2, m0, m1);
      }
      for (; i < M; i++) {   /* row tail: one row, 16 columns at a time */
        for (int64_t jj = j; jj < j + 32 && jj < N; jj += 16) {
          __mmask16 m = mask_of(N - jj);
          __m512 s = _mm512_setzero_ps();
          for (int64_t k = k0; k < k0 + kb; k++)
            s = _mm512_fmadd_ps(_mm512_set1_ps(A[i][k * acs]), _mm512_maskz_loadu_ps(m, B[k] + jj), s);
          float *c = C + i * ldc + jj;
          if (a2) s = _mm512_add_ps(s, _mm512_maskz_loadu_ps(m, c));
          _mm512_mask_storeu_ps(c, m, s);
        }
      }
    }
  }
}

#else
/* ISO C wants a translation unit to declare something. */
typedef int emi_nn_gemm_avx512_unused;
#endif

/*
** nn_gemm.c -- the single-threaded float32 GEMM under conv2d:
** C (M x N) = [C +] A (M x K) * B (K x N), row-major, B and C with unit column
** stride, A with any strides (its elements are only ever broadcast, so the
** transposed weight of the backward needs no copy).
**
** Why not BLAS: the conv GEMMs are small (tens to hundreds of rows and columns,
** one per sample and thread) and the OpenBLAS build here picks AVX2 kernels
** even on CPUs with full-width AVX-512. With AVX-512 a register-blocked 8x32
** kernel (16 accumulators; B columns stay in L1 while the row blocks pass over
** them) does better; elsewhere this falls back to cblas_sgemm.
**
** Which one runs is decided at run time, once per process, as OpenBLAS decides
** its own kernels: what is installed or packed is built for x86-64-v3 (AVX2 and
** FMA), must run on CPUs without AVX-512, and should still be as fast as a native
** build where the CPU has it. The AVX-512 kernels live in nn_gemm_avx512.c,
** compiled for AVX-512 by a function attribute whatever the build's -march;
** emi_cpu_avx512() below says whether they may run. The answer is a fact about
** the process (the CPU and the OS's saving of the vector state), not about an
** em_state, so it is kept in one atomic, not in the state: threads that ask at
** once compute the same answer and store the same value, so no lock is needed.
**
** The results differ between the two paths (FMA chains of 8x32 blocks against
** OpenBLAS's own blocking), as they differ between OpenBLAS's kernels on
** different CPUs: tests compare conv2d against references with tolerances.
** EMBER_CPU_AVX512=0 turns the AVX-512 path off, so that one machine can test
** both.
*/
#include "nn.h"
#include <cblas.h>
#include <stdatomic.h>
#include <stdlib.h>

bool emi_cpu_avx512(void) {
#if EMI_HAVE_AVX512_KERNELS
  static atomic_int known;   /* 0: not asked yet, 1: no, 2: yes */
  int v = atomic_load_explicit(&known, memory_order_relaxed);
  if (v == 0) {
    const char *off = getenv("EMBER_CPU_AVX512");
    /* libgcc's check includes the OS's XCR0 bits for the ZMM and mask state */
    __builtin_cpu_init();
    v = __builtin_cpu_supports("avx512f") && !(off && off[0] == '0') ? 2 : 1;
    atomic_store_explicit(&known, v, memory_order_relaxed);
  }
  return v == 2;
#else
  return false;
#endif
}

void emi_nn_sgemm(int64_t M, int64_t N, int64_t K, const float *A, int64_t ars, int64_t acs,
                  const float *B, int64_t ldb, float *C, int64_t ldc, int acc) {
#if EMI_HAVE_AVX512_KERNELS
  if (emi_cpu_avx512()) {
    if (K == 0) {
      if (!acc)
        for (int64_t i = 0; i < M; i++) memset(C + i * ldc, 0, sizeof(float) * (size_t)N);
      return;
    }
    emi_nn_sgemm_avx512(M, N, K, A, ars, acs, B, ldb, C, ldc, acc);
    return;
  }
#endif
  enum CBLAS_TRANSPOSE ta = acs == 1 ? CblasNoTrans : CblasTrans;
  cblas_sgemm(CblasRowMajor, ta, CblasNoTrans, (int)M, (int)N, (int)K, 1.0f, A,
              emi_blas_lda(M, K, ars, acs), B,
              (int)ldb, acc ? 1.0f : 0.0f, C, (int)ldc);
}

/* The fallback is plain C: conv_fast.c calls this only where the AVX-512 kernel
** runs (emi_conv_fast_ok), so it serves as the readable reference. */
void emi_nn_sgemm_rows(int64_t M, int64_t N, int64_t K, const float *const *A, int64_t acs,
                       const float *const *B, float *C, int64_t ldc, int acc) {
  if (K == 0) {
    if (!acc)
      for (int64_t i = 0; i < M; i++) memset(C + i * ldc, 0, sizeof(float) * (size_t)N);
    return;
  }
#if EMI_HAVE_AVX512_KERNELS
  if (emi_cpu_avx512()) {
    emi_nn_sgemm_rows_avx512(M, N, K, A, acs, B, C, ldc, acc);
    return;
  }
#endif
  for (int64_t i = 0; i < M; i++) {
    float *c = C + i * ldc;
    if (!acc) memset(c, 0, sizeof(float) * (size_t)N);
    for (int64_t k = 0; k < K; k++) {
      float a = A[i][k * acs];
      const float *b = B[k];
      for (int64_t j = 0; j < N; j++) c[j] += a * b[j];
    }
  }
}

/*
** nn_gemm.c -- the single-threaded float32 GEMM under conv2d:
** C (M x N) = [C +] A (M x K) * B (K x N), row-major, B and C with unit column
** stride, A with any strides (its elements are only ever broadcast, so the
** transposed weight of the backward needs no copy).
**
** Why not BLAS: the conv GEMMs are small (tens to hundreds of rows and columns,
** one per sample and thread), where OpenBLAS's packing and blocking cost more
** than they save (about half the machine's peak on the Fashion-MNIST convs),
** and the OpenBLAS build here picks AVX2 kernels even on CPUs with full-width
** AVX-512. Register-blocked kernels that read A and B in place do better: 8x32
** with AVX-512 (nn_gemm_avx512.c), 4x24 with AVX2 and FMA (nn_gemm_avx2.c);
** B columns stay in L1 while the row blocks pass over them. A CPU with neither
** falls back to cblas_sgemm.
**
** Which one runs is decided at run time, once per process, as OpenBLAS decides
** its own kernels: what is installed or packed is built for x86-64-v3 (AVX2 and
** FMA), must run on CPUs without AVX-512, and should still be as fast as a native
** build where the CPU has it. The AVX-512 kernels live in nn_gemm_avx512.c,
** compiled for AVX-512 by a function attribute whatever the build's -march;
** emi_cpu_avx512() below says whether they may run (emi_cpu_avx2() for the AVX2
** ones). The answer is a fact about the process (the CPU and the OS's saving of
** the vector state), not about an em_state, so it is kept in one atomic, not in
** the state: threads that ask at once compute the same answer and store the same
** value, so no lock is needed.
**
** The results differ between the paths (each kernel's K slices against
** OpenBLAS's own blocking), as they differ between OpenBLAS's kernels on
** different CPUs: tests compare conv2d against references with tolerances.
** EMBER_CPU_AVX512=0 turns the AVX-512 path off and EMBER_CPU_AVX2=0 the AVX2
** one, so that one machine can test all three.
*/
#include "nn.h"
#include <cblas.h>
#include <stdatomic.h>
#include <stdlib.h>

/* Whether the CPU (and the OS's saving of its vector state: libgcc's check
** includes XCR0) has the instructions of `isa`, and the environment variable
** `off` is not 0; asked once, then read from `known` (0: not asked, 1: no, 2: yes). */
#if EMI_HAVE_AVX512_KERNELS || EMI_HAVE_AVX2_KERNELS
enum { ISA_AVX512, ISA_AVX2 };
static bool isa_usable(atomic_int *known, int isa, const char *off) {
  int v = atomic_load_explicit(known, memory_order_relaxed);
  if (v == 0) {
    __builtin_cpu_init();
    bool has = isa == ISA_AVX512 ? __builtin_cpu_supports("avx512f")
                                 : __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    const char *e = getenv(off);
    v = has && !(e && e[0] == '0') ? 2 : 1;
    atomic_store_explicit(known, v, memory_order_relaxed);
  }
  return v == 2;
}
#endif

bool emi_cpu_avx512(void) {
#if EMI_HAVE_AVX512_KERNELS
  static atomic_int known;
  return isa_usable(&known, ISA_AVX512, "EMBER_CPU_AVX512");
#else
  return false;
#endif
}

bool emi_cpu_avx2(void) {
#if EMI_HAVE_AVX2_KERNELS
  static atomic_int known;
  return isa_usable(&known, ISA_AVX2, "EMBER_CPU_AVX2");
#else
  return false;
#endif
}

const char *emi_nn_sgemm_name(void) {
  return emi_cpu_avx512() ? "its AVX-512 kernel; stride 1 without im2col"
         : emi_cpu_avx2() ? "its AVX2 kernel; stride 1 without im2col"
                          : "OpenBLAS after im2col";
}

void emi_nn_sgemm(int64_t M, int64_t N, int64_t K, const float *A, int64_t ars, int64_t acs,
                  const float *B, int64_t ldb, float *C, int64_t ldc, int acc) {
  if (emi_nn_sgemm_own()) {
    if (K == 0) {
      if (!acc)
        for (int64_t i = 0; i < M; i++) memset(C + i * ldc, 0, sizeof(float) * (size_t)N);
      return;
    }
#if EMI_HAVE_AVX512_KERNELS
    if (emi_cpu_avx512()) {
      emi_nn_sgemm_avx512(M, N, K, A, ars, acs, B, ldb, C, ldc, acc);
      return;
    }
#endif
#if EMI_HAVE_AVX2_KERNELS
    emi_nn_sgemm_avx2(M, N, K, A, ars, acs, B, ldb, C, ldc, acc, NULL, 0);
    return;
#endif
  }
  enum CBLAS_TRANSPOSE ta = acs == 1 ? CblasNoTrans : CblasTrans;
  cblas_sgemm(CblasRowMajor, ta, CblasNoTrans, (int)M, (int)N, (int)K, 1.0f, A,
              emi_blas_lda(M, K, ars, acs), B,
              (int)ldb, acc ? 1.0f : 0.0f, C, (int)ldc);
}

/* Whether the AVX2 kernel serves the calls that only it can do as asked (the
** epilogue as it stores, the column map): on CPUs with AVX-512 that kernel wins,
** and these calls take their other way. */
static bool avx2_serves(void) { return emi_cpu_avx2() && !emi_cpu_avx512(); }

void emi_nn_sgemm_ep(int64_t M, int64_t N, int64_t K, const float *A, int64_t ars,
                     int64_t acs, const float *B, int64_t ldb, float *C, int64_t ldc,
                     const float *bias, int relu) {
#if EMI_HAVE_AVX2_KERNELS
  if (K > 0 && avx2_serves()) {
    emi_nn_sgemm_avx2(M, N, K, A, ars, acs, B, ldb, C, ldc, 0, bias, relu);
    return;
  }
#endif
  emi_nn_sgemm(M, N, K, A, ars, acs, B, ldb, C, ldc, 0);
  if (!bias && !relu) return;
  for (int64_t i = 0; i < M; i++) {   /* while the rows are in cache */
    float *c = C + i * ldc, bv = bias ? bias[i] : 0.0f;
    for (int64_t j = 0; j < N; j++) {
      float v = bias ? c[j] + bv : c[j];
      c[j] = relu && v < 0 ? 0.0f : v;
    }
  }
}

bool emi_nn_sgemm_rows_mapped(int64_t M, int64_t N, int64_t K, const float *const *A,
                              int64_t acs, const float *const *B, const emi_nn_colmap *map,
                              float *C, int64_t ldc, const float *bias, int relu) {
#if EMI_HAVE_AVX2_KERNELS
  if (K > 0 && avx2_serves()) {
    emi_nn_sgemm_rows_mapped_avx2(M, N, K, A, acs, B, map, C, ldc, bias, relu);
    return true;
  }
#endif
  return false;
}

/* The fallback is plain C: conv_fast.c calls this only where one of our kernels
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
#if EMI_HAVE_AVX2_KERNELS
  if (emi_cpu_avx2()) {
    emi_nn_sgemm_rows_avx2(M, N, K, A, acs, B, C, ldc, acc);
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

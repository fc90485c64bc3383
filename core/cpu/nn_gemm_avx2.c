/*
** nn_gemm_avx2.c -- the AVX2 + FMA kernels of the single-threaded float32 GEMM
** under conv2d (nn_gemm.c says what it computes and why it is not BLAS), for
** CPUs without AVX-512.
**
** The register block is 4 rows x 24 columns: twelve 8-wide accumulators, three B
** vectors and one broadcast A value fill 16 of the 16 YMM registers. Four rows,
** not the six usual elsewhere, because conv GEMMs have channel counts for rows
** (multiples of 4 or 8), so the row tail is rare; and twelve independent FMA
** chains cover the FMA latency of the two FMA pipes. Per k the block loads 3
** vectors and broadcasts 4 values for 12 FMAs, so the loads keep up.
**
** Column edges: a panel narrower than 24 runs the same code with 1, 2 or 3
** vectors (the compiler specializes the always-inline kernel per width), the
** last one masked (vmaskmov) where the columns end inside it; the row tail runs
** the same kernel with fewer rows. Every instance is the same FMA order per
** output element, so a value does not depend on where in C it lies.
**
** Every function carries target("avx2,fma") so that the file builds whatever the
** build's -march; nothing here may run before nn_gemm.c's emi_cpu_avx2() has
** said yes. The arithmetic is explicit intrinsics, as in nn_gemm_avx512.c.
*/
#include "nn.h"
#if EMI_HAVE_AVX2_KERNELS
#include <immintrin.h>

#define EMI_AVX2 __attribute__((target("avx2,fma")))
#define INLINE static inline __attribute__((always_inline))

/* The lanes of an 8-wide vector that hold one of the n columns left. */
EMI_AVX2 INLINE __m256i lanes_of(int64_t n) {
  static const int32_t ramp[16] = {-1, -1, -1, -1, -1, -1, -1, -1, 0, 0, 0, 0, 0, 0, 0, 0};
  int64_t k = n >= 8 ? 8 : (n > 0 ? n : 0);
  return _mm256_loadu_si256((const __m256i *)(const void *)(ramp + 8 - k));
}

/* The epilogue a caller may ask for, applied as the last K slice stores C:
** C = relu(AB [+ C] + bias[row]). max(0, v) is ReLU with NaN kept (maxps gives
** its second operand when either is NaN) and -0 kept (and when they compare
** equal), as the scalar v < 0 ? 0 : v. */
typedef struct { const float *bias; int relu; } epilogue;

EMI_AVX2 INLINE void store_c(float *p, __m256 v, int acc, int last, int masked, __m256i m,
                             const float *bias, int relu) {
  bool part = masked && last;
  if (acc) v = _mm256_add_ps(v, part ? _mm256_maskload_ps(p, m) : _mm256_loadu_ps(p));
  if (bias) v = _mm256_add_ps(v, _mm256_broadcast_ss(bias));
  if (relu) v = _mm256_max_ps(_mm256_setzero_ps(), v);
  if (part) _mm256_maskstore_ps(p, m, v);
  else _mm256_storeu_ps(p, v);
}

/* R rows (1..4) x NV vectors (1..3) of C from a packed panel of B (row k at
** bp + 24*k, zero past the columns). Row r of A is ar[r], element k at
** ar[r][k*acs]. `masked`: the last vector of C stops at mask m. R, NV and masked
** are constants where this is inlined, so the tests on them fold away and the
** twelve accumulators are named variables, which the compiler keeps in
** registers (an array of them it may leave in memory). */
#define ACC(r, v) (R > r && NV > v)
#define FMA_RV(r, v) if (ACC(r, v)) c##r##v = _mm256_fmadd_ps(a, b##v, c##r##v);
#define ROW_FMAS(r)                                                                        \
  if (R > r) {                                                                             \
    __m256 a = _mm256_broadcast_ss(ar[r] + k * acs);                                      \
    FMA_RV(r, 0) FMA_RV(r, 1) FMA_RV(r, 2)                                                 \
  }
#define STORE_RV(r, v)                                                                     \
  if (ACC(r, v))                                                                           \
    store_c(C + r * ldc + 8 * v, c##r##v, acc, v == NV - 1, masked, m,                      \
            ep.bias ? ep.bias + r : NULL, ep.relu);

EMI_AVX2 INLINE void kern(int R, int NV, int masked, int64_t K, const float *const *ar,
                          int64_t acs, const float *bp, float *C, int64_t ldc, int acc,
                          __m256i m, epilogue ep) {
  __m256 z = _mm256_setzero_ps(), c00 = z, c01 = z, c02 = z, c10 = z, c11 = z, c12 = z,
         c20 = z, c21 = z, c22 = z, c30 = z, c31 = z, c32 = z;
  for (int64_t k = 0; k < K; k++) {
    const float *b = bp + 24 * k;
    __m256 b0 = _mm256_load_ps(b), b1 = z, b2 = z;
    if (NV > 1) b1 = _mm256_load_ps(b + 8);
    if (NV > 2) b2 = _mm256_load_ps(b + 16);
    /* into registers once: folded into each FMA as a memory operand instead, the
    ** B vectors cost 12 loads per k, which on CPUs with two load ports is the
    ** bottleneck (8 cycles of loads for 6 of FMAs) */
    __asm__("" : "+x"(b0), "+x"(b1), "+x"(b2));
    ROW_FMAS(0) ROW_FMAS(1) ROW_FMAS(2) ROW_FMAS(3)
  }
  STORE_RV(0, 0) STORE_RV(0, 1) STORE_RV(0, 2) STORE_RV(1, 0) STORE_RV(1, 1) STORE_RV(1, 2)
  STORE_RV(2, 0) STORE_RV(2, 1) STORE_RV(2, 2) STORE_RV(3, 0) STORE_RV(3, 1) STORE_RV(3, 2)
}

/* One call per (rows, vectors, masked) instance keeps each specialized; the
** switch picks the instance for the block at hand. */
#define INSTANCES(X)                                                                       \
  X(4, 3, 0) X(4, 3, 1) X(4, 2, 0) X(4, 2, 1) X(4, 1, 0) X(4, 1, 1)                        \
  X(3, 3, 0) X(3, 3, 1) X(3, 2, 0) X(3, 2, 1) X(3, 1, 0) X(3, 1, 1)                        \
  X(2, 3, 0) X(2, 3, 1) X(2, 2, 0) X(2, 2, 1) X(2, 1, 0) X(2, 1, 1)                        \
  X(1, 3, 0) X(1, 3, 1) X(1, 2, 0) X(1, 2, 1) X(1, 1, 0) X(1, 1, 1)
#define CASE(R, NV, MK)                                                                    \
  case R * 100 + NV * 10 + MK:                                                             \
    kern(R, NV, MK, K, ar, acs, bp, C, ldc, acc, m, ep);                                   \
    break;

EMI_AVX2 static void block(int sel, int64_t K, const float *const *ar, int64_t acs,
                           const float *bp, float *C, int64_t ldc, int acc, __m256i m,
                           epilogue ep) {
  switch (sel) { INSTANCES(CASE) default: break; }
}

/* K in slices of at most KB, of equal size (no short last slice, which would
** cost a pass over C for little work), so that a packed 24-column panel of B
** (KB x 24 floats, 12 KiB) and the slices of a few dozen rows of A stay in L1
** while the row blocks pass over them. The panel is copied because B's rows lie
** a row stride apart, and a few hundred of them map onto few L1 sets: read in
** place, the panel falls out of L1 between row blocks. */
enum { KB = 128, NB = 24 };

static int64_t slice_of(int64_t K) {
  int64_t n = (K + KB - 1) / KB;
  return n > 0 ? (K + n - 1) / n : KB;
}

/* Packs B's rows k (row k at brow[k] + j), columns [j, j + w), into bp with
** zeros up to 24 columns. */
EMI_AVX2 static void pack_panel(float *bp, const float *const *brow, int64_t kb, int64_t j,
                                int64_t w) {
  for (int64_t k = 0; k < kb; k++) {
    const float *s = brow[k] + j;
    float *d = bp + NB * k;
    if (w == NB) {
      _mm256_store_ps(d, _mm256_loadu_ps(s));
      _mm256_store_ps(d + 8, _mm256_loadu_ps(s + 8));
      _mm256_store_ps(d + 16, _mm256_loadu_ps(s + 16));
    } else {
      int64_t c = 0;
      for (; c < w; c++) d[c] = s[c];
      for (; c < NB; c++) d[c] = 0;
    }
  }
}

/* The same through a column map: column l of a row lies at (l / run) * stride +
** l % run, so a panel is a few runs (at most 24), each copied eight floats at a
** time. A copy may run up to 7 floats past its run's end on both sides: the
** source rows are readable there (emi_nn_sgemm_rows_mapped's contract), and in
** bp it lands on columns a later run or row overwrites, or on lanes past w,
** whose sums are never stored (bp has 8 floats of slack after its last row). */
EMI_AVX2 static void pack_panel_mapped(float *bp, const float *const *brow, int64_t kb,
                                       int64_t j, int64_t w, const emi_nn_colmap *map) {
  int64_t src[NB], dst[NB], len[NB], nseg = 0;
  for (int64_t l = j; l < j + w; nseg++) {
    int64_t r = l % map->run, n = map->run - r < j + w - l ? map->run - r : j + w - l;
    src[nseg] = l / map->run * map->stride + r;
    dst[nseg] = l - j;
    len[nseg] = n;
    l += n;
  }
  for (int64_t k = 0; k < kb; k++)
    for (int64_t q = 0; q < nseg; q++) {
      const float *s = brow[k] + src[q];
      float *d = bp + NB * k + dst[q];
      for (int64_t c = 0; c < len[q]; c += 8) _mm256_storeu_ps(d + c, _mm256_loadu_ps(s + c));
    }
}

/* The shared driver: A rows by pointer (ar0[i] + k*acs is A[i][k]), B rows by
** pointer (brow[k] + j is B[k][j], or through map where not NULL); ep applies as
** the last K slice stores (ep holds the bias of row 0). */
EMI_AVX2 static void gemm_rows(int64_t M, int64_t N, int64_t K, const float *const *arow,
                               int64_t acs, const float *const *brow, float *C, int64_t ldc,
                               int acc, epilogue ep, const emi_nn_colmap *map) {
  float bp[KB * NB + 8] __attribute__((aligned(32)));
  int64_t ks = slice_of(K);
  for (int64_t k0 = 0; k0 < K; k0 += ks) {
    int64_t kb = K - k0 < ks ? K - k0 : ks;
    int a2 = acc || k0 > 0;
    for (int64_t j = 0; j < N; j += NB) {
      int64_t w = N - j < NB ? N - j : NB;
      int nv = (int)((w + 7) / 8), masked = w % 8 != 0;
      __m256i m = lanes_of(w - 8 * (nv - 1));
      if (map) pack_panel_mapped(bp, brow + k0, kb, j, w, map);
      else pack_panel(bp, brow + k0, kb, j, w);
      for (int64_t i = 0; i < M; i += 4) {
        int R = M - i < 4 ? (int)(M - i) : 4;
        const float *ar[4];
        for (int r = 0; r < 4; r++) ar[r] = arow[i + (r < R ? r : 0)] + k0 * acs;
        epilogue e = {NULL, 0};
        if (k0 + kb == K) e = (epilogue){ep.bias ? ep.bias + i : NULL, ep.relu};
        block(R * 100 + nv * 10 + masked, kb, ar, acs, bp, C + i * ldc + j, ldc, a2, m, e);
      }
    }
  }
}

EMI_AVX2 void emi_nn_sgemm_rows_avx2(int64_t M, int64_t N, int64_t K, const float *const *A,
                                     int64_t acs, const float *const *B, float *C,
                                     int64_t ldc, int acc) {
  gemm_rows(M, N, K, A, acs, B, C, ldc, acc, (epilogue){NULL, 0}, NULL);
}

EMI_AVX2 void emi_nn_sgemm_rows_mapped_avx2(int64_t M, int64_t N, int64_t K,
                                            const float *const *A, int64_t acs,
                                            const float *const *B, const emi_nn_colmap *map,
                                            float *C, int64_t ldc, const float *bias,
                                            int relu) {
  gemm_rows(M, N, K, A, acs, B, C, ldc, 0, (epilogue){bias, relu}, map);
}

/* The plain form builds the row tables in slices (KB rows of B, 4 of A at a
** time would do, but tables of every row keep one driver). */
EMI_AVX2 void emi_nn_sgemm_avx2(int64_t M, int64_t N, int64_t K, const float *A, int64_t ars,
                                int64_t acs, const float *B, int64_t ldb, float *C,
                                int64_t ldc, int acc, const float *bias, int relu) {
  enum { ROWS = 512 };
  const float *arow[ROWS], *brow[KB];
  for (int64_t i0 = 0; i0 < M; i0 += ROWS) {
    int64_t mb = M - i0 < ROWS ? M - i0 : ROWS;
    for (int64_t i = 0; i < mb; i++) arow[i] = A + (i0 + i) * ars;
    int64_t ks = slice_of(K);
    for (int64_t k0 = 0; k0 < K; k0 += ks) {
      int64_t kb = K - k0 < ks ? K - k0 : ks;
      for (int64_t k = 0; k < kb; k++) brow[k] = B + (k0 + k) * ldb;
      const float *ak[ROWS];
      for (int64_t i = 0; i < mb; i++) ak[i] = arow[i] + k0 * acs;
      epilogue ep = {NULL, 0};
      if (k0 + kb == K) ep = (epilogue){bias ? bias + i0 : NULL, relu};
      gemm_rows(mb, N, kb, ak, acs, brow, C + i0 * ldc, ldc, acc || k0 > 0, ep, NULL);
    }
  }
}

/* -- C += A B^T with both read along their rows --------------------------------------- */

/* R rows of A (1..4) against P rows of B (1..3): twelve 8-wide partial sums over
** l, summed across their lanes at the end and added into C. Constants R, P fold
** as in kern(). */
#define NT_ACC(r, q) (R > r && P > q)
#define NT_FMA(r, q) if (NT_ACC(r, q)) s##r##q = _mm256_fmadd_ps(a##r, b##q, s##r##q);
#define NT_ROW(r)                                                                          \
  if (R > r) a##r = LOAD(A + r * lda + l);
#define NT_COL(q)                                                                          \
  if (P > q) b##q = LOAD(B + q * ldb + l);
#define NT_STEP                                                                            \
  NT_ROW(0) NT_ROW(1) NT_ROW(2) NT_ROW(3) NT_COL(0) NT_COL(1) NT_COL(2)                    \
  NT_FMA(0, 0) NT_FMA(0, 1) NT_FMA(0, 2) NT_FMA(1, 0) NT_FMA(1, 1) NT_FMA(1, 2)             \
  NT_FMA(2, 0) NT_FMA(2, 1) NT_FMA(2, 2) NT_FMA(3, 0) NT_FMA(3, 1) NT_FMA(3, 2)

EMI_AVX2 INLINE float lane_sum(__m256 v) {
  __m128 h = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  h = _mm_add_ps(h, _mm_movehl_ps(h, h));
  h = _mm_add_ss(h, _mm_movehdup_ps(h));
  return _mm_cvtss_f32(h);
}

EMI_AVX2 INLINE void nt_block(int R, int P, int64_t L, const float *A, int64_t lda,
                              const float *B, int64_t ldb, float *C, int64_t cm, int64_t cn) {
  __m256 z = _mm256_setzero_ps(), s00 = z, s01 = z, s02 = z, s10 = z, s11 = z, s12 = z,
         s20 = z, s21 = z, s22 = z, s30 = z, s31 = z, s32 = z;
  __m256 a0 = z, a1 = z, a2 = z, a3 = z, b0 = z, b1 = z, b2 = z;
  int64_t l = 0;
#define LOAD(p) _mm256_loadu_ps(p)
  for (; l + 8 <= L; l += 8) { NT_STEP }
#undef LOAD
  if (l < L) {   /* the row ends inside a vector: masked loads read zeros past it */
    __m256i m = lanes_of(L - l);
#define LOAD(p) _mm256_maskload_ps(p, m)
    NT_STEP
#undef LOAD
  }
#define NT_OUT(r, q) if (NT_ACC(r, q)) C[r * cm + q * cn] += lane_sum(s##r##q);
  NT_OUT(0, 0) NT_OUT(0, 1) NT_OUT(0, 2) NT_OUT(1, 0) NT_OUT(1, 1) NT_OUT(1, 2)
  NT_OUT(2, 0) NT_OUT(2, 1) NT_OUT(2, 2) NT_OUT(3, 0) NT_OUT(3, 1) NT_OUT(3, 2)
#undef NT_OUT
}

#define NT_INSTANCES(X)                                                                    \
  X(4, 3) X(4, 2) X(4, 1) X(3, 3) X(3, 2) X(3, 1) X(2, 3) X(2, 2) X(2, 1) X(1, 3) X(1, 2)   \
  X(1, 1)
#define NT_CASE(R, P)                                                                      \
  case R * 10 + P:                                                                         \
    nt_block(R, P, L, A, lda, B, ldb, C, cm, cn);                                          \
    break;

EMI_AVX2 static void nt_pick(int sel, int64_t L, const float *A, int64_t lda, const float *B,
                             int64_t ldb, float *C, int64_t cm, int64_t cn) {
  switch (sel) { NT_INSTANCES(NT_CASE) default: break; }
}

EMI_AVX2 void emi_nn_sgemm_nt_avx2(int64_t M, int64_t N, int64_t L, const float *A,
                                   int64_t lda, const float *B, int64_t ldb, float *C,
                                   int64_t cm, int64_t cn) {
  for (int64_t i = 0; i < M; i += 4)
    for (int64_t j = 0; j < N; j += 3) {
      int R = M - i < 4 ? (int)(M - i) : 4, P = N - j < 3 ? (int)(N - j) : 3;
      nt_pick(R * 10 + P, L, A + i * lda, lda, B + j * ldb, ldb, C + i * cm + j * cn, cm, cn);
    }
}

/* -- Transpose ----------------------------------------------------------------------- */

/* dst[c*ldd + r] = src[r*lds + c] for r < R, c < C, in 8x8 tiles: eight rows loaded
** (masked past C), transposed in registers by unpacks and lane swaps, eight
** columns stored (masked past R: a tile at the edge writes only its own part). */
EMI_AVX2 void emi_transpose_avx2(int64_t R, int64_t C, const float *src, int64_t lds,
                                 float *dst, int64_t ldd) {
  for (int64_t r0 = 0; r0 < R; r0 += 8)
    for (int64_t c0 = 0; c0 < C; c0 += 8) {
      int64_t nr = R - r0 < 8 ? R - r0 : 8, nc = C - c0 < 8 ? C - c0 : 8;
      __m256i cm = lanes_of(nc), rm = lanes_of(nr);
      __m256 v[8];
      for (int i = 0; i < 8; i++)
        v[i] = i < nr ? _mm256_maskload_ps(src + (r0 + i) * lds + c0, cm) : _mm256_setzero_ps();
      __m256 t0 = _mm256_unpacklo_ps(v[0], v[1]), t1 = _mm256_unpackhi_ps(v[0], v[1]),
             t2 = _mm256_unpacklo_ps(v[2], v[3]), t3 = _mm256_unpackhi_ps(v[2], v[3]),
             t4 = _mm256_unpacklo_ps(v[4], v[5]), t5 = _mm256_unpackhi_ps(v[4], v[5]),
             t6 = _mm256_unpacklo_ps(v[6], v[7]), t7 = _mm256_unpackhi_ps(v[6], v[7]);
      __m256 u0 = _mm256_shuffle_ps(t0, t2, 0x44), u1 = _mm256_shuffle_ps(t0, t2, 0xEE),
             u2 = _mm256_shuffle_ps(t1, t3, 0x44), u3 = _mm256_shuffle_ps(t1, t3, 0xEE),
             u4 = _mm256_shuffle_ps(t4, t6, 0x44), u5 = _mm256_shuffle_ps(t4, t6, 0xEE),
             u6 = _mm256_shuffle_ps(t5, t7, 0x44), u7 = _mm256_shuffle_ps(t5, t7, 0xEE);
      __m256 w[8] = {_mm256_permute2f128_ps(u0, u4, 0x20), _mm256_permute2f128_ps(u1, u5, 0x20),
                     _mm256_permute2f128_ps(u2, u6, 0x20), _mm256_permute2f128_ps(u3, u7, 0x20),
                     _mm256_permute2f128_ps(u0, u4, 0x31), _mm256_permute2f128_ps(u1, u5, 0x31),
                     _mm256_permute2f128_ps(u2, u6, 0x31), _mm256_permute2f128_ps(u3, u7, 0x31)};
      for (int i = 0; i < nc; i++) {
        float *d = dst + (c0 + i) * ldd + r0;
        if (nr == 8) _mm256_storeu_ps(d, w[i]);
        else _mm256_maskstore_ps(d, rm, w[i]);
      }
    }
}

#else
/* ISO C wants a translation unit to declare something. */
typedef int emi_nn_gemm_avx2_unused;
#endif

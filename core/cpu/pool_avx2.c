/*
** pool_avx2.c -- float32 max pooling's forward with the 2x2 window and stride 2
** (every CNN's MaxPool2d(2)), eight outputs at a time with AVX2.
**
** It works on one output row: the two input rows r0, r1 under it. Eight
** outputs read sixteen floats of each row; the even and odd columns are split
** apart with one shuffle per row (its lanes come out in the order 0 1 4 5 2 3 6 7,
** which a single cross-lane permute puts right at the end). The choice among the
** four is the scalar loop's, select by select: the first maximum wins, a NaN is
** taken and then only a later NaN replaces it; so values and indices are the
** scalar path's bit for bit.
**
** A row's last OW % 8 outputs run the same code with masked loads and stores.
**
** (The backward stays the scalar scatter into a zeroed plane: it is bound by
** memory, and writing each 2x2 tile whole with vectors measured slower.)
**
** Every function carries target("avx2,fma"); pool.c calls them only where
** emi_cpu_avx2() has said yes.
*/
#include "nn.h"
#if EMI_HAVE_AVX2_KERNELS
#include <immintrin.h>

#define EMI_AVX2 __attribute__((target("avx2,fma")))

/* The lanes' order after a shuffle of two 8-wide vectors, put back: 0 1 4 5 2 3 6 7
** -> 0..7 is swapping the middle 64-bit quarters. */
#define UNMIX(v) _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(v), 0xD8))

/* The first n of eight 32-bit lanes (n may be below 0 or above 8). */
EMI_AVX2 static inline __m256i first(int64_t n) {
  return _mm256_cmpgt_epi32(_mm256_set1_epi32((int)(n < 0 ? 0 : n > 8 ? 8 : n)),
                            _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}
/* Eight floats at p, only the first n lanes read (the rest 0) unless n >= 8. */
EMI_AVX2 static inline __m256 load_n(const float *p, int64_t n) {
  return n >= 8 ? _mm256_loadu_ps(p) : _mm256_maskload_ps(p, first(n));
}

/* Outputs [ow, ow + n) of the row, n <= 8. */
EMI_AVX2 static inline void fwd8(const float *r0, const float *r1, int64_t W, int64_t i0,
                                 float *y, int64_t *ind, int64_t ow, int64_t n) {
  const __m256i lane2 = _mm256_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14);
  const __m256 one = _mm256_castsi256_ps(_mm256_set1_epi32(1));
  const __m256 offW = _mm256_castsi256_ps(_mm256_set1_epi32((int)W));
  const __m256 offW1 = _mm256_castsi256_ps(_mm256_set1_epi32((int)W + 1));
  __m256 x0 = load_n(r0 + 2 * ow, 2 * n), x1 = load_n(r0 + 2 * ow + 8, 2 * n - 8);
  __m256 z0 = load_n(r1 + 2 * ow, 2 * n), z1 = load_n(r1 + 2 * ow + 8, 2 * n - 8);
  __m256 a = _mm256_shuffle_ps(x0, x1, 0x88), b = _mm256_shuffle_ps(x0, x1, 0xDD);
  __m256 c = _mm256_shuffle_ps(z0, z1, 0x88), d = _mm256_shuffle_ps(z0, z1, 0xDD);
  __m256 best = a, off = _mm256_setzero_ps(), take;
#define TAKE(v, o)                                                                         \
  take = _mm256_or_ps(_mm256_cmp_ps(v, best, _CMP_GT_OQ), _mm256_cmp_ps(v, v, _CMP_UNORD_Q)); \
  best = _mm256_blendv_ps(best, v, take);                                                  \
  off = _mm256_blendv_ps(off, o, take);
  TAKE(b, one) TAKE(c, offW) TAKE(d, offW1)
#undef TAKE
  /* index = i0 + 2*ow + 2*lane + off, made in int32 (below 2W + 16) then widened */
  __m256i rel = _mm256_add_epi32(_mm256_castps_si256(UNMIX(off)), lane2);
  __m256i base = _mm256_set1_epi64x(i0 + 2 * ow);
  __m256i lo = _mm256_add_epi64(base, _mm256_cvtepi32_epi64(_mm256_castsi256_si128(rel)));
  __m256i hi = _mm256_add_epi64(base, _mm256_cvtepi32_epi64(_mm256_extracti128_si256(rel, 1)));
  __m256i *il = (__m256i *)(void *)(ind + ow), *ih = (__m256i *)(void *)(ind + ow + 4);
  if (n >= 8) {
    _mm256_storeu_ps(y + ow, UNMIX(best));
    _mm256_storeu_si256(il, lo);
    _mm256_storeu_si256(ih, hi);
  } else {
    __m256i m = first(n);
    _mm256_maskstore_ps(y + ow, m, UNMIX(best));
    /* the 64-bit masks: lanes 0-3 and 4-7 of m, each widened */
    _mm256_maskstore_epi64((long long *)(void *)il,
                           _mm256_cvtepi32_epi64(_mm256_castsi256_si128(m)), lo);
    _mm256_maskstore_epi64((long long *)(void *)ih,
                           _mm256_cvtepi32_epi64(_mm256_extracti128_si256(m, 1)), hi);
  }
}

EMI_AVX2 int64_t emi_maxpool2x2_row_avx2(const float *r0, const float *r1, int64_t OW,
                                         int64_t W, int64_t i0, float *y, int64_t *ind) {
  int64_t ow = 0;
  for (; ow + 8 <= OW; ow += 8) fwd8(r0, r1, W, i0, y, ind, ow, 8);
  if (ow < OW) fwd8(r0, r1, W, i0, y, ind, ow, OW - ow);
  return OW;
}

#else
/* ISO C wants a translation unit to declare something. */
typedef int emi_pool_avx2_unused;
#endif

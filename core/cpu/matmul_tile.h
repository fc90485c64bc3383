/*
** matmul_tile.h -- one register tile of the plain matmul kernel, TW columns
** wide, for matmul_impl.h's type T: matmul_impl.h includes this file once per
** width (NR, NR / 2, NR / 4) with TILE naming the function. Part of matmul.c;
** nothing else includes it.
**
** c (MR x TW, ldc) = a (MR x K) @ b (K x TW, dense rows). The TW columns are one
** GCC/Clang vector value (lowered to whatever registers the target has), so the
** MR sums stay in registers over k; left to itself the compiler may vectorise
** along k instead, which needs a transpose per step.
*/
static void TILE(const T *a, int64_t ars, int64_t acs, const T *b, int64_t brs,
                 int64_t K, T *c, int64_t ldc) {
  typedef T V __attribute__((vector_size(TW * sizeof(T))));
  V c0 = {0}, c1 = {0}, c2 = {0}, c3 = {0}, bv;
  for (int64_t k = 0; k < K; k++) {
    memcpy(&bv, b + k * brs, sizeof bv);
    c0 += a[k * acs] * bv;
    c1 += a[ars + k * acs] * bv;
    c2 += a[2 * ars + k * acs] * bv;
    c3 += a[3 * ars + k * acs] * bv;
  }
  memcpy(c, &c0, sizeof c0);
  memcpy(c + ldc, &c1, sizeof c1);
  memcpy(c + 2 * ldc, &c2, sizeof c2);
  memcpy(c + 3 * ldc, &c3, sizeof c3);
}

#undef TW
#undef TILE

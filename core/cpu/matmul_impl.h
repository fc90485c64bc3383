/*
** matmul_impl.h -- the plain matmul kernel of matmul.c for one compute type T:
** matmul.c includes this file three times, with T float (NR 16), double (NR 8)
** and uint64_t (NR 8; int64 wraps on overflow like PyTorch's, and unsigned
** arithmetic keeps that defined), FN(name) giving each copy its suffix
** (units_f32, units_f64, units_i64) and HSUM the sum of an NR-lane vector. NR is
** the widest tile, in elements: one 512-bit register. C has no templates; a file
** included per type keeps these loops ordinary code, which compiler messages and
** debuggers see line by line, where a macro would be one line. The file is part
** of matmul.c (MR, mm_problem, batch_offsets come from there) and nothing else
** includes it.
**
** a is (M, K), b (K, N), c (M, N), each with its own row and column strides in
** elements (ars/acs, brs/bcs; c's rows are ldc apart, its columns dense).
*/

/* The sum of an 8-lane vector's lanes by halving, in a fixed order (see
** hsum_f32 in matmul.c). */
typedef T FN(v8) __attribute__((vector_size(8 * sizeof(T))));
static inline T FN(hsum8)(FN(v8) s) {
  typedef T H4 __attribute__((vector_size(4 * sizeof(T))));
  H4 a, b;
  memcpy(&a, &s, sizeof a); memcpy(&b, (const char *)&s + sizeof a, sizeof b);
  a += b;
  return (a[0] + a[2]) + (a[1] + a[3]);
}

/* The reference loop: c[i, n0:n1] = sum_k a[i,k] * b[k, n0:n1] for mr rows,
** the k loop outside the j loop so that a row of b streams through an axpy. */
static void FN(ref)(const T *a, int64_t ars, int64_t acs, const T *b, int64_t brs,
                    int64_t bcs, int64_t K, T *c, int64_t ldc, int64_t mr, int64_t n0,
                    int64_t n1) {
  for (int64_t i = 0; i < mr; i++) {
    T *ci = c + i * ldc;
    for (int64_t j = n0; j < n1; j++) ci[j] = 0;
    for (int64_t k = 0; k < K; k++) {
      T av = a[i * ars + k * acs];
      const T *bk = b + k * brs;
      if (bcs == 1)
        for (int64_t j = n0; j < n1; j++) ci[j] += av * bk[j];
      else
        for (int64_t j = n0; j < n1; j++) ci[j] += av * bk[j * bcs];
    }
  }
}

/* c (MR x TW, ldc) = a (MR x K) @ b (K x TW, dense rows), in three widths: NR,
** NR / 2 and NR / 4 (matmul_tile.h, one function per width). */
#define TW NR
#define TILE FN(tile_wide)
#include "matmul_tile.h"
#define TW (NR / 2)
#define TILE FN(tile_half)
#include "matmul_tile.h"
#define TW (NR / 4)
#define TILE FN(tile_quarter)
#include "matmul_tile.h"

/* c (MR rows, columns n0..n1) as dot products: MR sums in registers per column.
** For the few columns the tiles leave over, and for a b whose rows are not dense
** (then its columns usually are). */
static void FN(cols)(const T *a, int64_t ars, int64_t acs, const T *b, int64_t brs,
                     int64_t bcs, int64_t K, T *c, int64_t ldc, int64_t n0, int64_t n1) {
  for (int64_t j = n0; j < n1; j++) {
    T s0 = 0, s1 = 0, s2 = 0, s3 = 0;
    for (int64_t k = 0; k < K; k++) {
      T bv = b[k * brs + j * bcs];
      s0 += a[k * acs] * bv;
      s1 += a[ars + k * acs] * bv;
      s2 += a[2 * ars + k * acs] * bv;
      s3 += a[3 * ars + k * acs] * bv;
    }
    c[j] = s0; c[ldc + j] = s1; c[2 * ldc + j] = s2; c[3 * ldc + j] = s3;
  }
}

/* c (mr < MR rows, all N columns): the short block of rows, which is the whole
** product for a batch-1 layer (M = 1), where per-call cost is everything. The
** reference loop would reload and restore c's row for every k (and, with a
** transposed weight, walk b across its rows), so:
**  - b's rows dense: a row of c is kept in vector registers over the k loop,
**    four vectors at a time so that four FMA chains overlap (k order kept);
**  - b's columns dense and a's row dense (x @ w:t(), the Linear layout): each c
**    element is a dot product vectorised along k (partial sums per lane, then
**    added in a fixed order: deterministic, whatever the thread count);
**  - otherwise the reference loop. */
static void FN(rows)(const T *a, int64_t ars, int64_t acs, const T *b, int64_t brs,
                     int64_t bcs, int64_t K, T *c, int64_t ldc, int64_t mr, int64_t N) {
  typedef T V __attribute__((vector_size(NR * sizeof(T))));
  if (bcs == 1) {
    for (int64_t i = 0; i < mr; i++) {
      const T *ai = a + i * ars;
      T *ci = c + i * ldc;
      int64_t j = 0;
      for (; j + 4 * NR <= N; j += 4 * NR) {
        V s0 = {0}, s1 = {0}, s2 = {0}, s3 = {0}, b0, b1, b2, b3;
        for (int64_t k = 0; k < K; k++) {
          const T *bk = b + k * brs + j;
          T av = ai[k * acs];
          memcpy(&b0, bk, sizeof b0); memcpy(&b1, bk + NR, sizeof b1);
          memcpy(&b2, bk + 2 * NR, sizeof b2); memcpy(&b3, bk + 3 * NR, sizeof b3);
          s0 += av * b0; s1 += av * b1; s2 += av * b2; s3 += av * b3;
        }
        memcpy(ci + j, &s0, sizeof s0); memcpy(ci + j + NR, &s1, sizeof s1);
        memcpy(ci + j + 2 * NR, &s2, sizeof s2); memcpy(ci + j + 3 * NR, &s3, sizeof s3);
      }
      for (; j + NR <= N; j += NR) {
        V s = {0}, bv;
        for (int64_t k = 0; k < K; k++) {
          memcpy(&bv, b + k * brs + j, sizeof bv);
          s += ai[k * acs] * bv;
        }
        memcpy(ci + j, &s, sizeof s);
      }
      for (; j < N; j++) {      /* the last columns: the sum stays in a register */
        T t = 0;
        for (int64_t k = 0; k < K; k++) t += ai[k * acs] * b[k * brs + j];
        ci[j] = t;
      }
    }
  } else if (brs == 1 && acs == 1) {
    for (int64_t i = 0; i < mr; i++) {
      const T *ai = a + i * ars;
      int64_t j = 0;
      for (; j + 4 <= N; j += 4) {  /* four columns share each load of a */
        const T *b0 = b + j * bcs, *b1 = b0 + bcs, *b2 = b1 + bcs, *b3 = b2 + bcs;
        V s0 = {0}, s1 = {0}, s2 = {0}, s3 = {0}, av, bv;
        int64_t k = 0;
        for (; k + NR <= K; k += NR) {
          memcpy(&av, ai + k, sizeof av);
          memcpy(&bv, b0 + k, sizeof bv); s0 += av * bv;
          memcpy(&bv, b1 + k, sizeof bv); s1 += av * bv;
          memcpy(&bv, b2 + k, sizeof bv); s2 += av * bv;
          memcpy(&bv, b3 + k, sizeof bv); s3 += av * bv;
        }
        T t0 = HSUM(s0), t1 = HSUM(s1), t2 = HSUM(s2), t3 = HSUM(s3);
        for (; k < K; k++) {
          T x = ai[k];
          t0 += x * b0[k]; t1 += x * b1[k]; t2 += x * b2[k]; t3 += x * b3[k];
        }
        T *ci = c + i * ldc + j;
        ci[0] = t0; ci[1] = t1; ci[2] = t2; ci[3] = t3;
      }
      for (; j < N; j++) {
        const T *bj = b + j * bcs;
        V s = {0}, av, bv;
        int64_t k = 0;
        for (; k + NR <= K; k += NR) {
          memcpy(&av, ai + k, sizeof av);
          memcpy(&bv, bj + k, sizeof bv);
          s += av * bv;
        }
        T t = HSUM(s);
        for (; k < K; k++) t += ai[k] * bj[k];
        c[i * ldc + j] = t;
      }
    }
  } else {
    FN(ref)(a, ars, acs, b, brs, bcs, K, c, ldc, mr, 0, N);
  }
}

/* One unit: MR rows of a batch matrix; wide tiles, then narrower ones, then dot
** products for the last columns. A short block of rows (M % MR) takes the
** row kernel above. */
static void FN(units)(void *ctx, int64_t u0, int64_t u1) {
  const mm_problem *p = ctx;
  int64_t M = p->M, N = p->N, nblk = (M + MR - 1) / MR, cur = -1, ao = 0, bo = 0;
  for (int64_t u = u0; u < u1; u++) {
    int64_t bi = u / nblk, i0 = u % nblk * MR, mr = M - i0 < MR ? M - i0 : MR;
    if (bi != cur) { batch_offsets(p, bi, &ao, &bo); cur = bi; }
    const T *a = (const T *)p->A + ao + i0 * p->a_rs, *b = (const T *)p->B + bo;
    T *c = (T *)p->C + (bi * M + i0) * N;
    int64_t j = 0;
    if (mr < MR) {
      FN(rows)(a, p->a_rs, p->a_cs, b, p->b_rs, p->b_cs, p->K, c, N, mr, N);
      continue;
    }
    if (p->b_cs == 1) {
      for (; j + NR <= N; j += NR)
        FN(tile_wide)(a, p->a_rs, p->a_cs, b + j, p->b_rs, p->K, c + j, N);
      for (; j + NR / 2 <= N; j += NR / 2)
        FN(tile_half)(a, p->a_rs, p->a_cs, b + j, p->b_rs, p->K, c + j, N);
      for (; j + NR / 4 <= N; j += NR / 4)
        FN(tile_quarter)(a, p->a_rs, p->a_cs, b + j, p->b_rs, p->K, c + j, N);
    }
    FN(cols)(a, p->a_rs, p->a_cs, b, p->b_rs, p->b_cs, p->K, c, N, j, N);
  }
}

#undef T
#undef NR
#undef HSUM
#undef FN

/*
** philox.h -- the counter-based generator behind every random draw, and the
** rule that says which counters a draw consumes. Shared by ops/random.c (which
** advances the state's offset) and every backend's random kernels (which must
** produce the same numbers from the same counters), so it is plain inline C.
**
** Philox4x32-10 (Salmon, Moraes, Dror, Shaw: "Parallel random numbers: as easy
** as 1, 2, 3", SC'11): a 128-bit counter and a 64-bit key go through ten rounds
** of two 32x32->64 multiplications whose halves are xored with the other words
** and the key; the key is bumped by the Weyl constants between rounds. Output
** is four 32-bit words per counter, and any counter can be computed without the
** others -- which is what makes results independent of the thread count.
**
** Stream layout (the contract every backend follows):
**   key     = the state's seed (low word, high word);
**   counter = (c, c >> 32, 0, 0) for c = offset, offset + 1, ...;
**   word j of a draw is lane j % 4 of counter offset + j / 4;
**   element i of a draw uses words [i*w, i*w + w), where w (1 or 2) comes from
**   emi_rng_words; normal_ transforms the words of elements 2m and 2m+1
**   together (Box-Muller) into element 2m (cosine) and 2m+1 (sine);
**   a draw of n elements advances the offset by emi_rng_counters(n, w).
*/
#ifndef EMBER_PHILOX_H
#define EMBER_PHILOX_H
#include <stdint.h>
#include "include/ember.h"

#define EMI_PHILOX_M0 0xD2511F53u
#define EMI_PHILOX_M1 0xCD9E8D57u
#define EMI_PHILOX_W0 0x9E3779B9u   /* golden ratio */
#define EMI_PHILOX_W1 0xBB67AE85u   /* sqrt(3) - 1 */

/* One counter: out[0..3] = Philox4x32-10(ctr, key). The readable reference; the
** kernels use emi_philox_run, which computes many counters at once. */
static inline void emi_philox(const uint32_t ctr[4], const uint32_t key[2],
                              uint32_t out[4]) {
  uint32_t c0 = ctr[0], c1 = ctr[1], c2 = ctr[2], c3 = ctr[3];
  uint32_t k0 = key[0], k1 = key[1];
  for (int r = 0; r < 10; r++) {
    uint64_t p0 = (uint64_t)EMI_PHILOX_M0 * c0, p1 = (uint64_t)EMI_PHILOX_M1 * c2;
    uint32_t n0 = (uint32_t)(p1 >> 32) ^ c1 ^ k0, n2 = (uint32_t)(p0 >> 32) ^ c3 ^ k1;
    c0 = n0; c1 = (uint32_t)p1; c2 = n2; c3 = (uint32_t)p0;
    k0 += EMI_PHILOX_W0; k1 += EMI_PHILOX_W1;
  }
  out[0] = c0; out[1] = c1; out[2] = c2; out[3] = c3;
}

/* Words out[0 .. 4*n) for counters ctr, ctr+1, ..., ctr+n-1 (n <= EMI_PHILOX_RUN).
** Written as loops over the counters (structure of arrays) so that the compiler
** turns each round into vector multiplies. */
enum { EMI_PHILOX_RUN = 64 };
static inline void emi_philox_run(uint64_t seed, uint64_t ctr, int n, uint32_t *out) {
  if (n < 8) {   /* too few for the vector loop, whose scalar tail keeps state in memory */
    uint32_t key[2] = {(uint32_t)seed, (uint32_t)(seed >> 32)};
    for (int j = 0; j < n; j++) {
      uint64_t c = ctr + (uint64_t)j;
      uint32_t cw[4] = {(uint32_t)c, (uint32_t)(c >> 32), 0, 0};
      emi_philox(cw, key, out + 4 * j);
    }
    return;
  }
  uint32_t c0[EMI_PHILOX_RUN], c1[EMI_PHILOX_RUN], c2[EMI_PHILOX_RUN],
      c3[EMI_PHILOX_RUN];
  for (int j = 0; j < n; j++) {
    uint64_t c = ctr + (uint64_t)j;
    c0[j] = (uint32_t)c; c1[j] = (uint32_t)(c >> 32); c2[j] = 0; c3[j] = 0;
  }
  uint32_t k0 = (uint32_t)seed, k1 = (uint32_t)(seed >> 32);
  for (int r = 0; r < 10; r++) {
    for (int j = 0; j < n; j++) {
      uint64_t p0 = (uint64_t)EMI_PHILOX_M0 * c0[j], p1 = (uint64_t)EMI_PHILOX_M1 * c2[j];
      uint32_t n0 = (uint32_t)(p1 >> 32) ^ c1[j] ^ k0, n2 = (uint32_t)(p0 >> 32) ^ c3[j] ^ k1;
      c0[j] = n0; c1[j] = (uint32_t)p1; c2[j] = n2; c3[j] = (uint32_t)p0;
    }
    k0 += EMI_PHILOX_W0; k1 += EMI_PHILOX_W1;
  }
  for (int j = 0; j < n; j++) {
    out[4 * j] = c0[j]; out[4 * j + 1] = c1[j]; out[4 * j + 2] = c2[j]; out[4 * j + 3] = c3[j];
  }
}

/* 32-bit words per element: float64 takes 53 random bits, the other float types
** 24 (their value is formed in float32). */
static inline int emi_rng_words(em_dtype dt) { return dt == EM_FLOAT64 ? 2 : 1; }
/* randint over a range of `range` values: one word up to 2^32, else two. */
static inline int emi_rng_randint_words(uint64_t range) {
  return range <= ((uint64_t)1 << 32) ? 1 : 2;
}
/* Counters consumed by a draw of n elements of w words (rounded up to whole
** counters, and to whole Box-Muller pairs, which needs n*w even -- a counter
** holds 4 words, so rounding to counters already covers it). */
static inline uint64_t emi_rng_counters(int64_t n, int w) {
  return ((uint64_t)n * (uint64_t)w + 3) / 4;
}

#endif

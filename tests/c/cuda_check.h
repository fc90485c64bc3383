/*
** cuda_check.h -- what the tests of the CUDA backend share: a state with a cuda
** device (an emulated one, unless EMBER_TEST_REAL_CUDA says a real GPU is there),
** and a small deterministic random source for their inputs.
*/
#ifndef EMBER_TEST_CUDA_CHECK_H
#define EMBER_TEST_CUDA_CHECK_H
#include "check.h"
#include <stdlib.h>

/* Opens *S with at least one cuda device (spec: EMBER_CUDA_EMULATE's value).
** 0 on success; otherwise prints why and returns 1 (main's exit status). */
static inline int cuda_check_open(em_state **S, const char *spec) {
  if (!getenv("EMBER_TEST_REAL_CUDA")) setenv("EMBER_CUDA_EMULATE", spec, 1);
  if (em_open(S, NULL) != EM_OK) return 1;
  if (em_cuda_device_count(*S) < 1) {
    printf("no cuda device: %s\n", em_errmsg(*S));
    em_close(*S);
    return 1;
  }
  return 0;
}

/* xorshift64: the same inputs every run. */
static uint64_t cuda_check_rng = 88172645463325252ull;
static inline uint64_t cuda_check_rand(void) {
  cuda_check_rng ^= cuda_check_rng << 13;
  cuda_check_rng ^= cuda_check_rng >> 7;
  cuda_check_rng ^= cuda_check_rng << 17;
  return cuda_check_rng;
}

#endif

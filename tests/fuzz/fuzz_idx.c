/*
** fuzz_idx.c -- libFuzzer harness for the IDX reader (MNIST's format, raw or
** gzip: the seeds hold both, so the fuzzer also mutates compressed streams).
*/
#include "fuzz.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t n) {
  em_state *S = fuzz_state();
  em_tensor *t = NULL;
  if (em_idx_load(S, fuzz_file(0, data, n), &t) == EM_OK) {
    fuzz_touch(t);
    em_tensor_release(t);
  }
  fuzz_end();
  return 0;
}

/* random.c -- STUB: to be replaced by the real kernels. */
#include "cpu.h"

em_status emi_cpu_uniform(em_state *S, em_tensor *out, uint64_t seed, uint64_t offset, double lo, double hi) {
  return emi_error(S, EM_ERR_UNSUPPORTED, "emi_cpu_uniform: not implemented yet");
}

em_status emi_cpu_normal(em_state *S, em_tensor *out, uint64_t seed, uint64_t offset, double mean, double std) {
  return emi_error(S, EM_ERR_UNSUPPORTED, "emi_cpu_normal: not implemented yet");
}

em_status emi_cpu_randint(em_state *S, em_tensor *out, uint64_t seed, uint64_t offset, int64_t lo, int64_t hi) {
  return emi_error(S, EM_ERR_UNSUPPORTED, "emi_cpu_randint: not implemented yet");
}

em_status emi_cpu_arange(em_state *S, em_tensor *out, double start, double step) {
  return emi_error(S, EM_ERR_UNSUPPORTED, "emi_cpu_arange: not implemented yet");
}

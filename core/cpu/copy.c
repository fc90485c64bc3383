/* copy.c -- STUB: to be replaced by the real kernels. */
#include "cpu.h"

em_status emi_cpu_copy(em_state *S, em_tensor *out, const em_tensor *src) {
  return emi_error(S, EM_ERR_UNSUPPORTED, "emi_cpu_copy: not implemented yet");
}

em_status emi_cpu_fill(em_state *S, em_tensor *out, double value) {
  return emi_error(S, EM_ERR_UNSUPPORTED, "emi_cpu_fill: not implemented yet");
}

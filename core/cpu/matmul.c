/* matmul.c -- STUB: to be replaced by the real kernels. */
#include "cpu.h"

em_status emi_cpu_matmul(em_state *S, em_tensor *out, const em_tensor *a, const em_tensor *b) {
  return emi_error(S, EM_ERR_UNSUPPORTED, "emi_cpu_matmul: not implemented yet");
}

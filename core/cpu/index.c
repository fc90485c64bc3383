/* index.c -- STUB: to be replaced by the real kernels. */
#include "cpu.h"

em_status emi_cpu_index_select(em_state *S, em_tensor *out, const em_tensor *a, int dim, const em_tensor *idx, int index_base) {
  return emi_error(S, EM_ERR_UNSUPPORTED, "emi_cpu_index_select: not implemented yet");
}

em_status emi_cpu_gather(em_state *S, em_tensor *out, const em_tensor *a, int dim, const em_tensor *idx, int index_base) {
  return emi_error(S, EM_ERR_UNSUPPORTED, "emi_cpu_gather: not implemented yet");
}

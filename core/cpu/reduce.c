/* reduce.c -- STUB: to be replaced by the real kernels. */
#include "cpu.h"

em_status emi_cpu_reduce(em_state *S, em_redop op, em_tensor *out, const em_tensor *a, unsigned mask) {
  return emi_error(S, EM_ERR_UNSUPPORTED, "emi_cpu_reduce: not implemented yet");
}

em_status emi_cpu_var(em_state *S, em_tensor *out, const em_tensor *a, unsigned mask, double correction, int take_sqrt) {
  return emi_error(S, EM_ERR_UNSUPPORTED, "emi_cpu_var: not implemented yet");
}

em_status emi_cpu_norm(em_state *S, em_tensor *out, const em_tensor *a, unsigned mask, double p) {
  return emi_error(S, EM_ERR_UNSUPPORTED, "emi_cpu_norm: not implemented yet");
}

em_status emi_cpu_arg_reduce(em_state *S, em_tensor *values, em_tensor *indices, const em_tensor *a, int dim, int want_max, int index_base) {
  return emi_error(S, EM_ERR_UNSUPPORTED, "emi_cpu_arg_reduce: not implemented yet");
}

em_status emi_cpu_softmax(em_state *S, em_tensor *out, const em_tensor *a, int dim, int log) {
  return emi_error(S, EM_ERR_UNSUPPORTED, "emi_cpu_softmax: not implemented yet");
}

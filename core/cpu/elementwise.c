/* elementwise.c -- STUB: to be replaced by the real kernels. */
#include "cpu.h"

em_status emi_cpu_unary(em_state *S, em_unop op, em_tensor *out, const em_tensor *a) {
  return emi_error(S, EM_ERR_UNSUPPORTED, "emi_cpu_unary: not implemented yet");
}

em_status emi_cpu_binary(em_state *S, em_binop op, em_tensor *out, const em_tensor *a, const em_tensor *b) {
  return emi_error(S, EM_ERR_UNSUPPORTED, "emi_cpu_binary: not implemented yet");
}

em_status emi_cpu_binary_scalar(em_state *S, em_binop op, em_tensor *out, const em_tensor *a, double s, int reverse) {
  return emi_error(S, EM_ERR_UNSUPPORTED, "emi_cpu_binary_scalar: not implemented yet");
}

em_status emi_cpu_add_scaled(em_state *S, em_tensor *out, const em_tensor *a, const em_tensor *b, double alpha) {
  return emi_error(S, EM_ERR_UNSUPPORTED, "emi_cpu_add_scaled: not implemented yet");
}

em_status emi_cpu_clamp(em_state *S, em_tensor *out, const em_tensor *a, double lo, double hi) {
  return emi_error(S, EM_ERR_UNSUPPORTED, "emi_cpu_clamp: not implemented yet");
}

em_status emi_cpu_where(em_state *S, em_tensor *out, const em_tensor *cond, const em_tensor *a, const em_tensor *b) {
  return emi_error(S, EM_ERR_UNSUPPORTED, "emi_cpu_where: not implemented yet");
}

/* elementwise.c -- STUB: to be replaced. */
#include "../internal.h"

const char *em_unop_name(em_unop op) {
  return 0;
}

const char *em_binop_name(em_binop op) {
  return 0;
}

em_status em_unary(em_state *S, em_unop op, const em_tensor *a, em_tensor **out) {
  return emi_error(S, EM_ERR_UNSUPPORTED, "em_unary: not implemented yet");
}

em_status em_unary_(em_state *S, em_unop op, em_tensor *a) {
  return emi_error(S, EM_ERR_UNSUPPORTED, "em_unary_: not implemented yet");
}

em_status em_binary(em_state *S, em_binop op, const em_tensor *a, const em_tensor *b, em_tensor **out) {
  return emi_error(S, EM_ERR_UNSUPPORTED, "em_binary: not implemented yet");
}

em_status em_binary_(em_state *S, em_binop op, em_tensor *a, const em_tensor *b) {
  return emi_error(S, EM_ERR_UNSUPPORTED, "em_binary_: not implemented yet");
}

em_status em_binary_scalar(em_state *S, em_binop op, const em_tensor *a, double s, int reverse, em_tensor **out) {
  return emi_error(S, EM_ERR_UNSUPPORTED, "em_binary_scalar: not implemented yet");
}

em_status em_binary_scalar_(em_state *S, em_binop op, em_tensor *a, double s) {
  return emi_error(S, EM_ERR_UNSUPPORTED, "em_binary_scalar_: not implemented yet");
}

em_status em_add_scaled(em_state *S, const em_tensor *a, const em_tensor *b, double alpha, em_tensor **out) {
  return emi_error(S, EM_ERR_UNSUPPORTED, "em_add_scaled: not implemented yet");
}

em_status em_add_scaled_(em_state *S, em_tensor *a, const em_tensor *b, double alpha) {
  return emi_error(S, EM_ERR_UNSUPPORTED, "em_add_scaled_: not implemented yet");
}

em_status em_clamp(em_state *S, const em_tensor *a, double lo, double hi, em_tensor **out) {
  return emi_error(S, EM_ERR_UNSUPPORTED, "em_clamp: not implemented yet");
}

em_status em_clamp_(em_state *S, em_tensor *a, double lo, double hi) {
  return emi_error(S, EM_ERR_UNSUPPORTED, "em_clamp_: not implemented yet");
}

em_status em_where(em_state *S, const em_tensor *cond, const em_tensor *a, const em_tensor *b, em_tensor **out) {
  return emi_error(S, EM_ERR_UNSUPPORTED, "em_where: not implemented yet");
}

em_status em_fill_(em_state *S, em_tensor *t, double value) {
  return emi_error(S, EM_ERR_UNSUPPORTED, "em_fill_: not implemented yet");
}

/* join.c -- STUB: to be replaced. */
#include "../internal.h"

em_status em_cat(em_state *S, em_tensor *const *list, int n, int dim, em_tensor **out) {
  return emi_error(S, EM_ERR_UNSUPPORTED, "em_cat: not implemented yet");
}

em_status em_stack(em_state *S, em_tensor *const *list, int n, int dim, em_tensor **out) {
  return emi_error(S, EM_ERR_UNSUPPORTED, "em_stack: not implemented yet");
}

em_status em_index_select(em_state *S, const em_tensor *a, int dim, const em_tensor *idx, int index_base, em_tensor **out) {
  return emi_error(S, EM_ERR_UNSUPPORTED, "em_index_select: not implemented yet");
}

em_status em_gather(em_state *S, const em_tensor *a, int dim, const em_tensor *idx, int index_base, em_tensor **out) {
  return emi_error(S, EM_ERR_UNSUPPORTED, "em_gather: not implemented yet");
}

em_status em_one_hot(em_state *S, const em_tensor *labels, int64_t n, int index_base, em_tensor **out) {
  return emi_error(S, EM_ERR_UNSUPPORTED, "em_one_hot: not implemented yet");
}

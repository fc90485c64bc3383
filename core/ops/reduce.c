/* reduce.c -- STUB: to be replaced. */
#include "../internal.h"

em_status em_reduce(em_state *S, em_redop op, const em_tensor *a, const int *dims, int ndims, int keepdim, em_tensor **out) {
  return emi_error(S, EM_ERR_UNSUPPORTED, "em_reduce: not implemented yet");
}

em_status em_var(em_state *S, const em_tensor *a, const int *dims, int ndims, double correction, int keepdim, int take_sqrt, em_tensor **out) {
  return emi_error(S, EM_ERR_UNSUPPORTED, "em_var: not implemented yet");
}

em_status em_norm(em_state *S, const em_tensor *a, double p, const int *dims, int ndims, int keepdim, em_tensor **out) {
  return emi_error(S, EM_ERR_UNSUPPORTED, "em_norm: not implemented yet");
}

em_status em_max_dim(em_state *S, const em_tensor *a, int dim, int keepdim, int index_base, em_tensor **values, em_tensor **indices) {
  return emi_error(S, EM_ERR_UNSUPPORTED, "em_max_dim: not implemented yet");
}

em_status em_min_dim(em_state *S, const em_tensor *a, int dim, int keepdim, int index_base, em_tensor **values, em_tensor **indices) {
  return emi_error(S, EM_ERR_UNSUPPORTED, "em_min_dim: not implemented yet");
}

em_status em_argmax(em_state *S, const em_tensor *a, int dim, int all, int keepdim, int index_base, em_tensor **out) {
  return emi_error(S, EM_ERR_UNSUPPORTED, "em_argmax: not implemented yet");
}

em_status em_argmin(em_state *S, const em_tensor *a, int dim, int all, int keepdim, int index_base, em_tensor **out) {
  return emi_error(S, EM_ERR_UNSUPPORTED, "em_argmin: not implemented yet");
}

em_status em_softmax(em_state *S, const em_tensor *a, int dim, int log, em_tensor **out) {
  return emi_error(S, EM_ERR_UNSUPPORTED, "em_softmax: not implemented yet");
}

/* copy.c -- STUB: to be replaced. */
#include "../internal.h"

em_status em_full(em_state *S, const int64_t *shape, int ndim, double value, em_dtype dt, int device, em_tensor **out) {
  return emi_error(S, EM_ERR_UNSUPPORTED, "em_full: not implemented yet");
}

em_status em_from_data(em_state *S, const int64_t *shape, int ndim, em_dtype dt, const void *data, em_dtype src_dt, em_tensor **out) {
  return emi_error(S, EM_ERR_UNSUPPORTED, "em_from_data: not implemented yet");
}

em_status em_contiguous(em_state *S, const em_tensor *a, em_tensor **out) {
  return emi_error(S, EM_ERR_UNSUPPORTED, "em_contiguous: not implemented yet");
}

em_status em_clone(em_state *S, const em_tensor *a, em_tensor **out) {
  return emi_error(S, EM_ERR_UNSUPPORTED, "em_clone: not implemented yet");
}

em_status em_copy_(em_state *S, em_tensor *dst, const em_tensor *src) {
  return emi_error(S, EM_ERR_UNSUPPORTED, "em_copy_: not implemented yet");
}

em_status em_to(em_state *S, const em_tensor *a, em_dtype dt, int device, em_tensor **out) {
  return emi_error(S, EM_ERR_UNSUPPORTED, "em_to: not implemented yet");
}

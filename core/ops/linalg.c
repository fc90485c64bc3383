/* linalg.c -- STUB: to be replaced. */
#include "../internal.h"

em_status em_matmul(em_state *S, const em_tensor *a, const em_tensor *b, em_tensor **out) {
  return emi_error(S, EM_ERR_UNSUPPORTED, "em_matmul: not implemented yet");
}

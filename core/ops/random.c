/* random.c -- STUB: to be replaced. */
#include "../internal.h"

em_status em_arange(em_state *S, double start, double stop, double step, em_dtype dt, int device, em_tensor **out) {
  return emi_error(S, EM_ERR_UNSUPPORTED, "em_arange: not implemented yet");
}

em_status em_eye(em_state *S, int64_t n, int64_t m, em_dtype dt, int device, em_tensor **out) {
  return emi_error(S, EM_ERR_UNSUPPORTED, "em_eye: not implemented yet");
}

void em_manual_seed(em_state *S, uint64_t seed) {
  (void)S;
}

void em_rng_get_state(em_state *S, uint64_t *seed, uint64_t *offset) {
  (void)S;
}

void em_rng_set_state(em_state *S, uint64_t seed, uint64_t offset) {
  (void)S;
}

em_status em_uniform_(em_state *S, em_tensor *t, double lo, double hi) {
  return emi_error(S, EM_ERR_UNSUPPORTED, "em_uniform_: not implemented yet");
}

em_status em_normal_(em_state *S, em_tensor *t, double mean, double std) {
  return emi_error(S, EM_ERR_UNSUPPORTED, "em_normal_: not implemented yet");
}

em_status em_randint_(em_state *S, em_tensor *t, int64_t lo, int64_t hi) {
  return emi_error(S, EM_ERR_UNSUPPORTED, "em_randint_: not implemented yet");
}

/*
** nn_util.h -- argument checks shared by the nn ops (core/ops/nn_*.c): the
** dtype rule (float32/float64, one dtype per call), device, and making inputs
** contiguous. Header-only, static inline.
*/
#ifndef EMBER_OPS_NN_UTIL_H
#define EMBER_OPS_NN_UTIL_H
#include "../internal.h"
#include "../cpu/cpu.h"
#include "../cpu/nn.h"

/* t is a CPU float32/float64 tensor; with want >= 0 its dtype must be want. */
static inline em_status nn_check_float(em_state *S, const char *op, const char *what,
                                       const em_tensor *t, int want) {
  em_status st = emi_check_tensor(S, op, t);
  if (st) return st;
  if (t->device != EM_CPU)
    return emi_error(S, EM_ERR_UNSUPPORTED, "%s: %s is on a CUDA device; only CPU is "
                     "supported", op, what);
  if (t->dtype != EM_FLOAT32 && t->dtype != EM_FLOAT64)
    return emi_error(S, EM_ERR_DTYPE, "%s: %s has dtype %s; float32 or float64 expected",
                     op, what, em_dtype_name(t->dtype));
  if (want >= 0 && (int)t->dtype != want)
    return emi_error(S, EM_ERR_DTYPE, "%s: %s has dtype %s but input is %s", op, what,
                     em_dtype_name(t->dtype), em_dtype_name((em_dtype)want));
  return EM_OK;
}

static inline em_status nn_check_index(em_state *S, const char *op, const char *what,
                                       const em_tensor *t) {
  em_status st = emi_check_tensor(S, op, t);
  if (st) return st;
  if (t->device != EM_CPU)
    return emi_error(S, EM_ERR_UNSUPPORTED, "%s: %s is on a CUDA device; only CPU is "
                     "supported", op, what);
  if (t->dtype != EM_INT32 && t->dtype != EM_INT64)
    return emi_error(S, EM_ERR_DTYPE, "%s: %s has dtype %s; int32 or int64 expected", op,
                     what, em_dtype_name(t->dtype));
  return EM_OK;
}

/* A contiguous version of t (a new reference; t itself when already so). */
static inline em_status nn_contig(em_state *S, const em_tensor *t, em_tensor **out) {
  return em_contiguous(S, t, out);
}

static inline int nn_same_shape(const em_tensor *a, const em_tensor *b) {
  if (a->ndim != b->ndim) return 0;
  for (int d = 0; d < a->ndim; d++)
    if (a->sizes[d] != b->sizes[d]) return 0;
  return 1;
}

static inline void nn_release(em_tensor **ts, int n) {
  for (int i = 0; i < n; i++) em_tensor_release(ts[i]);
}
#endif

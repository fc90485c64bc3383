/*
** nn_util.h -- argument checks shared by the nn ops (core/ops/nn_*.c): the
** dtype rule (float32/float64, one dtype per call), one device per call,
** making inputs contiguous, and releasing the op's tensors by name. Header-only,
** static inline. The kernels are reached through the device's backend table
** (EMI_DISPATCH), never directly.
*/
#ifndef EMBER_OPS_NN_UTIL_H
#define EMBER_OPS_NN_UTIL_H
#include "../internal.h"

/* t is on ref's device (always true without ref). */
static inline em_status nn_check_device(em_state *S, const char *op, const char *what,
                                        const em_tensor *t, const em_tensor *ref) {
  if (!ref || t->device == ref->device) return EM_OK;
  char a[32], b[32];
  return emi_error(S, EM_ERR_DEVICE, "%s: %s is on %s but input is on %s", op, what,
                   emi_device_name(a, t->device), emi_device_name(b, ref->device));
}

/* t is a float32/float64 tensor; with ref, of ref's dtype and on ref's device. */
static inline em_status nn_check_float(em_state *S, const char *op, const char *what,
                                       const em_tensor *t, const em_tensor *ref) {
  em_status st = emi_check_tensor(S, op, t);
  if (st) return st;
  if (t->dtype != EM_FLOAT32 && t->dtype != EM_FLOAT64)
    return emi_error(S, EM_ERR_DTYPE, "%s: %s has dtype %s; float32 or float64 expected",
                     op, what, em_dtype_name(t->dtype));
  if (ref && t->dtype != ref->dtype)
    return emi_error(S, EM_ERR_DTYPE, "%s: %s has dtype %s but input is %s", op, what,
                     em_dtype_name(t->dtype), em_dtype_name(ref->dtype));
  return nn_check_device(S, op, what, t, ref);
}

/* As nn_check_float, also accepting float16 and bfloat16: conv and pooling take
** them (the CPU widens to float32 inside; GPUs compute in float32 too). */
static inline em_status nn_check_floating(em_state *S, const char *op, const char *what,
                                          const em_tensor *t, const em_tensor *ref) {
  em_status st = emi_check_tensor(S, op, t);
  if (st) return st;
  if (t->dtype != EM_FLOAT16 && t->dtype != EM_BFLOAT16)
    return nn_check_float(S, op, what, t, ref);
  if (ref && t->dtype != ref->dtype)
    return emi_error(S, EM_ERR_DTYPE, "%s: %s has dtype %s but input is %s", op, what,
                     em_dtype_name(t->dtype), em_dtype_name(ref->dtype));
  return nn_check_device(S, op, what, t, ref);
}

/* t is an int32/int64 tensor on ref's device. */
static inline em_status nn_check_index(em_state *S, const char *op, const char *what,
                                       const em_tensor *t, const em_tensor *ref) {
  em_status st = emi_check_tensor(S, op, t);
  if (st) return st;
  if (t->dtype != EM_INT32 && t->dtype != EM_INT64)
    return emi_error(S, EM_ERR_DTYPE, "%s: %s has dtype %s; int32 or int64 expected", op,
                     what, em_dtype_name(t->dtype));
  return nn_check_device(S, op, what, t, ref);
}

/* A contiguous version of t (a new reference; t itself when already so). */
static inline em_status nn_contig(em_state *S, const em_tensor *t, em_tensor **out) {
  return em_contiguous(S, t, out);
}

/* Channels last in the nn ops: the device's backend serves NHWC for the entries
** of bit (EMI_NHWC_*); t as the kernel takes it: NHWC when nhwc, else NCHW
** contiguous (a reorder either way is a counted conversion, ops/layout.c). */
static inline bool nn_serves_nhwc(em_state *S, int device, unsigned bit) {
  emi_device *d = emi_device_of(S, device);
  return d && (d->backend->nhwc & bit);
}
static inline em_status nn_layout(em_state *S, const em_tensor *t, bool nhwc,
                                  em_tensor **out) {
  return nhwc ? emi_layout_as(S, "convert_layout", t, true, out) : nn_contig(S, t, out);
}
/* *t (a result the op made, or NULL) put in NHWC or NCHW order, replacing it. */
static inline em_status nn_relayout(em_state *S, em_tensor **t, bool nhwc) {
  if (!*t || (*t)->ndim != 4) return EM_OK;
  em_tensor *r;
  em_status st = emi_layout_as(S, "convert_layout", *t, nhwc, &r);
  if (st) return st;
  em_tensor_release(*t);
  *t = r;
  return EM_OK;
}

static inline int nn_same_shape(const em_tensor *a, const em_tensor *b) {
  if (a->ndim != b->ndim) return 0;
  for (int d = 0; d < a->ndim; d++)
    if (a->sizes[d] != b->sizes[d]) return 0;
  return 1;
}

static inline void nn_release(em_tensor *const *ts, int n) {
  for (int i = 0; i < n; i++) em_tensor_release(ts[i]);
}

/* Releases each tensor named, NULL ones included: NN_RELEASE(x, w, b). */
#define NN_RELEASE(...)                                                                  \
  nn_release((em_tensor *[]){__VA_ARGS__},                                              \
             (int)(sizeof((em_tensor *[]){__VA_ARGS__}) / sizeof(em_tensor *)))
#endif

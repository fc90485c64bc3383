/*
** promote.c -- the rules the element-wise ops share: op names, result dtypes
** (PyTorch 1.13's type promotion with 0-dim tensors and Python scalars, and the
** per-op exceptions: true division, bool results, bool arithmetic), canCast for
** in-place ops, memory-overlap tests, and small helpers for temporaries.
*/
#include "ewise.h"
#include <math.h>

/* -- Names ------------------------------------------------------------------------------ */

static const char *const UNOP_NAMES[EM_NUM_UNOPS] = {
  "neg", "abs", "exp", "log", "sqrt", "rsqrt", "sin", "cos", "tanh",
  "sigmoid", "relu", "gelu", "silu",
  "floor", "ceil", "round", "trunc", "sign", "reciprocal", "square",
  "log1p", "expm1", "log2", "log10", "tan", "asin", "acos", "atan",
  "sinh", "cosh", "erf", "logical_not", "gelu_tanh",
};

static const char *const BINOP_NAMES[EM_NUM_BINOPS] = {
  "add", "sub", "mul", "div", "pow", "maximum", "minimum",
  "eq", "ne", "lt", "le", "gt", "ge",
  "remainder", "atan2", "logical_and", "logical_or",
};

/* The in-place forms' names, for their messages ("add_: ..."). */
static const char *const UNOP_NAMES_[EM_NUM_UNOPS] = {
  "neg_", "abs_", "exp_", "log_", "sqrt_", "rsqrt_", "sin_", "cos_", "tanh_",
  "sigmoid_", "relu_", "gelu_", "silu_",
  "floor_", "ceil_", "round_", "trunc_", "sign_", "reciprocal_", "square_",
  "log1p_", "expm1_", "log2_", "log10_", "tan_", "asin_", "acos_", "atan_",
  "sinh_", "cosh_", "erf_", "logical_not_", "gelu_tanh_",
};

static const char *const BINOP_NAMES_[EM_NUM_BINOPS] = {
  "add_", "sub_", "mul_", "div_", "pow_", "maximum_", "minimum_",
  "eq_", "ne_", "lt_", "le_", "gt_", "ge_",
  "remainder_", "atan2_", "logical_and_", "logical_or_",
};

const char *emi_unop_name_(em_unop op) {
  return (unsigned)op < EM_NUM_UNOPS ? UNOP_NAMES_[op] : "?";
}

const char *emi_binop_name_(em_binop op) {
  return (unsigned)op < EM_NUM_BINOPS ? BINOP_NAMES_[op] : "?";
}

const char *em_unop_name(em_unop op) {
  return (unsigned)op < EM_NUM_UNOPS ? UNOP_NAMES[op] : "?";
}

const char *em_binop_name(em_binop op) {
  return (unsigned)op < EM_NUM_BINOPS ? BINOP_NAMES[op] : "?";
}

/* -- Promotion ---------------------------------------------------------------------------- */

/* 0 bool, 1 integer, 2 floating: the only order a 0-dim operand is compared by. */
static int kind(em_dtype dt) {
  return dt == EM_BOOL ? 0 : em_dtype_is_floating(dt) ? 2 : 1;
}

/* PyTorch's combine_categories: the dimensioned operand's dtype wins unless the
** 0-dim / scalar one is of a higher kind (int tensor + 0-dim float64 -> float64,
** float32 tensor + 0-dim float64 -> float32, uint8 tensor + 5 -> uint8). */
static em_dtype combine(em_dtype dim, em_dtype zero) {
  if (kind(dim) == 2) return dim;
  if (dim == EM_BOOL || kind(zero) == 2) return em_dtype_promote(dim, zero);
  return dim;
}

em_dtype emi_promote_tensors(const em_tensor *a, const em_tensor *b) {
  if (a->dtype == b->dtype) return a->dtype;
  int za = a->ndim == 0, zb = b->ndim == 0;
  if (za == zb) return em_dtype_promote(a->dtype, b->dtype);
  return za ? combine(b->dtype, a->dtype) : combine(a->dtype, b->dtype);
}

em_dtype emi_scalar_dtype(double s) {
  return isfinite(s) && s == floor(s) ? EM_INT64 : EM_FLOAT32;
}

em_dtype emi_promote_scalar(em_dtype dt, double s) {
  return combine(dt, emi_scalar_dtype(s));
}

em_status emi_binop_dtypes(em_state *S, const char *op, em_binop b, em_dtype da,
                           em_dtype db, em_dtype pt, em_dtype *ct, em_dtype *rt) {
  *ct = *rt = pt;
  switch (b) {
  case EM_SUB:
    if (da == EM_BOOL && db == EM_BOOL)
      return emi_error(S, EM_ERR_DTYPE, "%s: subtraction of two bool tensors is not "
                       "supported (ne gives their exclusive or)", op);
    if (da == EM_BOOL || db == EM_BOOL)
      return emi_error(S, EM_ERR_DTYPE, "%s: subtraction with a bool tensor is not "
                       "supported (to invert a mask, use logical_not)", op);
    return EM_OK;
  case EM_DIV: case EM_ATAN2:          /* true division: integers give float32 */
    if (!em_dtype_is_floating(pt)) *ct = *rt = EM_FLOAT32;
    return EM_OK;
  case EM_POW: case EM_REMAINDER:
    if (pt == EM_BOOL)
      return emi_error(S, EM_ERR_DTYPE, "%s: not supported for bool tensors (dtypes "
                       "%s and %s)", op, em_dtype_name(da), em_dtype_name(db));
    return EM_OK;
  case EM_EQ: case EM_NE: case EM_LT: case EM_LE: case EM_GT: case EM_GE:
  case EM_LOGICAL_AND: case EM_LOGICAL_OR:
    *rt = EM_BOOL;
    return EM_OK;
  case EM_ADD: case EM_MUL: case EM_MAXIMUM: case EM_MINIMUM:
    return EM_OK;
  default:
    return emi_error(S, EM_ERR_ARG, "%s: invalid binary op %d", op, (int)b);
  }
}

em_status emi_unop_dtypes(em_state *S, const char *op, em_unop u, em_dtype dt,
                          em_dtype *ct, em_dtype *rt) {
  if ((unsigned)u >= EM_NUM_UNOPS)
    return emi_error(S, EM_ERR_ARG, "%s: invalid unary op %d", op, (int)u);
  if (u == EM_LOGICAL_NOT) { *ct = *rt = EM_BOOL; return EM_OK; }
  *ct = *rt = dt;
  if (em_dtype_is_floating(dt)) return EM_OK;
  switch (u) {
  case EM_NEG:
    if (dt == EM_BOOL)
      return emi_error(S, EM_ERR_DTYPE, "%s: negation of a bool tensor is not "
                       "supported (to invert a mask, use logical_not)", op);
    return EM_OK;
  case EM_SQUARE:                      /* bool * bool as a number: int64 (PyTorch) */
    if (dt == EM_BOOL) *ct = *rt = EM_INT64;
    return EM_OK;
  case EM_ABS: case EM_RELU: case EM_SIGN: case EM_FLOOR: case EM_CEIL:
  case EM_ROUND: case EM_TRUNC:
    return EM_OK;                      /* integer (and bool) in, same dtype out */
  default:
    *ct = *rt = EM_FLOAT32;            /* exp(int) etc.: the default float dtype */
    return EM_OK;
  }
}

int emi_can_cast(em_dtype from, em_dtype to) {
  if (em_dtype_is_floating(from) && !em_dtype_is_floating(to)) return 0;
  if (from != EM_BOOL && to == EM_BOOL) return 0;
  return 1;
}

em_status emi_cast_error(em_state *S, const char *op, em_dtype from, em_dtype to) {
  return emi_error(S, EM_ERR_DTYPE,
                   "%s: result type %s can't be cast to the desired output type %s", op,
                   em_dtype_name(from), em_dtype_name(to));
}

/* -- Overlap -------------------------------------------------------------------------------- */

/* Bytes [lo, hi) that t's elements span inside its storage. */
static void byte_range(const em_tensor *t, int64_t *lo, int64_t *hi) {
  int64_t es = (int64_t)em_dtype_size(t->dtype), l = t->offset, h = t->offset;
  for (int d = 0; d < t->ndim; d++) {
    int64_t ext = t->strides[d] * (t->sizes[d] - 1);
    if (ext > 0) h += ext; else l += ext;
  }
  *lo = l * es;
  *hi = (h + 1) * es;
}

int emi_may_overlap(const em_tensor *a, const em_tensor *b) {
  if (a->storage != b->storage || a->numel == 0 || b->numel == 0) return 0;
  int64_t alo, ahi, blo, bhi;
  byte_range(a, &alo, &ahi);
  byte_range(b, &blo, &bhi);
  return alo < bhi && blo < ahi;
}

int emi_same_geometry(const em_tensor *a, const em_tensor *b) {
  if (a->storage != b->storage || a->ndim != b->ndim ||
      em_dtype_size(a->dtype) != em_dtype_size(b->dtype) || a->offset != b->offset)
    return 0;
  for (int d = 0; d < a->ndim; d++)
    if (a->sizes[d] != b->sizes[d] || (a->sizes[d] > 1 && a->strides[d] != b->strides[d]))
      return 0;
  return 1;
}

int emi_internal_overlap(const em_tensor *t) {
  for (int d = 0; d < t->ndim; d++)
    if (t->sizes[d] > 1 && t->strides[d] == 0) return 1;
  return 0;
}

/* -- Temporaries ------------------------------------------------------------------------------ */

em_status emi_convert(em_state *S, const char *op, const em_tensor *t, em_dtype dt,
                      emi_temps *tp, em_tensor **out) {
  em_tensor *r;
  em_status st = emi_tensor_new_fmt(S, op, t->sizes, t->ndim, dt, t->device, emi_nhwc(t), &r);
  if (st) return st;
  st = EMI_DISPATCH(S, op, t, copy, r, t);
  if (st) { em_tensor_release(r); return st; }
  *out = emi_temps_add(tp, r);
  return EM_OK;
}

em_status emi_as_dtype(em_state *S, const char *op, const em_tensor *t, em_dtype dt,
                       emi_temps *tp, const em_tensor **out) {
  em_tensor *conv;
  if (t->dtype == dt) { *out = t; return EM_OK; }
  em_status st = emi_convert(S, op, t, dt, tp, &conv);
  if (!st) *out = conv;
  return st;
}

em_status emi_expand_tmp(em_state *S, const char *op, const em_tensor *t,
                         const int64_t *shape, int ndim, emi_temps *tp,
                         const em_tensor **out) {
  if (t->ndim == ndim && memcmp(t->sizes, shape, sizeof *shape * (size_t)ndim) == 0) {
    *out = t;
    return EM_OK;
  }
  em_tensor *r;
  em_status st = emi_expand_to(S, op, t, shape, ndim, &r);
  if (st) return st;
  *out = emi_temps_add(tp, r);
  return EM_OK;
}

em_status emi_check_devices(em_state *S, const char *op, const em_tensor *a,
                            const em_tensor *b) {
  if (a->device == b->device) return EM_OK;
  char da[16], db[16];
  return emi_error(S, EM_ERR_DEVICE, "%s: tensors are on different devices (%s and %s)",
                   op, emi_device_name(da, a->device), emi_device_name(db, b->device));
}

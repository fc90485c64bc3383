/*
** reduce.c -- reductions and softmax: argument checks, result shapes and dtypes,
** then the backend's reduce / var / norm / arg_reduce / softmax entries.
**
** Shapes: the backend always gets `out` with a's ndim and the reduced dims of
** size 1; unless keepdim, those dims are then dropped by rewriting the fresh
** handle in place (it is contiguous and nobody else holds it), which saves the
** extra view allocation that tiny reductions would otherwise pay.
**
** Dtypes follow PyTorch: sum/prod of bool or integers give int64, floats keep
** their dtype; mean, var, std, norm and softmax need a floating input (an error
** otherwise, as in PyTorch); logsumexp of an integer input gives float32;
** amax/amin keep the dtype; any/all give bool; indices are int64 counted from
** index_base.
*/
#include "../internal.h"
#include "../autograd/autograd.h"
#include <math.h>

static const char *const REDOP_NAMES[EM_NUM_REDOPS] = {
  "sum", "mean", "prod", "amax", "amin", "logsumexp", "any", "all",
};

/* The dims list as a bit mask; ndims == 0 means every dim. */
static em_status dims_mask(em_state *S, const char *op, const em_tensor *a,
                           const int *dims, int ndims, unsigned *mask) {
  if (ndims < 0)
    return emi_error(S, EM_ERR_ARG, "%s: ndims is %d (0 = every dim)", op, ndims);
  if (ndims > 0 && !dims)
    return emi_error(S, EM_ERR_ARG, "%s: dims is NULL but ndims is %d", op, ndims);
  if (ndims == 0) { *mask = (1u << a->ndim) - 1; return EM_OK; }
  unsigned seen = 0;
  for (int i = 0; i < ndims; i++) {
    int d = dims[i];
    em_status st = emi_wrap_dim(S, op, &d, a->ndim);
    if (st) return st;
    if (seen >> d & 1)
      return emi_error(S, EM_ERR_ARG, "%s: dim %lld appears multiple times in the list of "
                       "dims", op, emi_ix(S, d));
    seen |= 1u << d;
  }
  *mask = a->ndim ? seen : 0;    /* a 0-dim tensor accepts dim 0 / -1 */
  return EM_OK;
}

static em_status need_float(em_state *S, const char *op, const em_tensor *a) {
  if (em_dtype_is_floating(a->dtype)) return EM_OK;
  return emi_error(S, EM_ERR_DTYPE, "%s: input dtype %s is not floating point; use "
                   ":float() first", op, em_dtype_name(a->dtype));
}

/* A fresh tensor of a's shape with the masked dims set to 1. */
static em_status alloc_reduced(em_state *S, const char *op, const em_tensor *a,
                               unsigned mask, em_dtype dt, em_tensor **out) {
  int64_t sizes[EM_MAX_DIMS];
  for (int d = 0; d < a->ndim; d++) sizes[d] = (mask >> d & 1) ? 1 : a->sizes[d];
  return emi_tensor_new(S, op, sizes, a->ndim, dt, a->device, out);
}

static void squeeze_in_place(em_tensor *t, unsigned mask) {
  int n = 0;
  for (int d = 0; d < t->ndim; d++)
    if (!(mask >> d & 1)) t->sizes[n++] = t->sizes[d];
  t->ndim = n;
  emi_contiguous_strides(t->sizes, n, t->strides);
}

/* amax, amin, max, argmax... have no identity: reducing nothing is an error. */
static em_status check_nonempty(em_state *S, const char *op, const em_tensor *a,
                                unsigned mask) {
  for (int d = 0; d < a->ndim; d++)
    if ((mask >> d & 1) && a->sizes[d] == 0)
      return emi_error(S, EM_ERR_SHAPE, "%s: cannot reduce over dimension %lld of size 0 "
                       "(shape %s): the result would have no value", op, emi_ix(S, d),
                       emi_tshape(S, a));
  return EM_OK;
}

/* -- sum mean prod amax amin logsumexp any all --------------------------------- */

em_status em_reduce(em_state *S, em_redop op, const em_tensor *a, const int *dims,
                    int ndims, int keepdim, em_tensor **out) {
  if (!out) return emi_error(S, EM_ERR_ARG, "reduce: out is NULL");
  *out = NULL;
  if ((unsigned)op >= EM_NUM_REDOPS)
    return emi_error(S, EM_ERR_ARG, "reduce: unknown reduction %d", (int)op);
  const char *name = REDOP_NAMES[op];
  em_status st = emi_check_tensor(S, name, a);
  if (st) return st;
  unsigned mask;
  if ((st = dims_mask(S, name, a, dims, ndims, &mask)))
    return st;
  em_dtype dt = a->dtype;
  int fl = em_dtype_is_floating(dt);
  switch (op) {
  case EM_SUM: case EM_PROD: if (!fl) dt = EM_INT64; break;
  case EM_MEAN: if ((st = need_float(S, name, a))) return st; break;
  case EM_LOGSUMEXP: if (!fl) dt = EM_FLOAT32; break;
  case EM_AMAX: case EM_AMIN:
    if ((st = check_nonempty(S, name, a, mask))) return st;
    break;
  case EM_ANY: case EM_ALL: dt = EM_BOOL; break;
  default: break;
  }
  em_tensor *r;
  if ((st = alloc_reduced(S, name, a, mask, dt, &r))) return st;
  if ((st = EMI_DISPATCH(S, name, a, reduce, op, r, a, mask))) { em_tensor_release(r); return st; }
  if (!keepdim) squeeze_in_place(r, mask);
  *out = r;
  if (emi_ag_wanted1(S, a)) return emi_ag_record_reduce(S, op, a, mask, keepdim, out);
  return EM_OK;
}

/* -- var / std / norm ----------------------------------------------------------- */

em_status em_var(em_state *S, const em_tensor *a, const int *dims, int ndims,
                 double correction, int keepdim, int take_sqrt, em_tensor **out) {
  const char *name = take_sqrt ? "std" : "var";
  if (!out) return emi_error(S, EM_ERR_ARG, "%s: out is NULL", name);
  *out = NULL;
  em_status st = emi_check_tensor(S, name, a);
  if (st) return st;
  unsigned mask;
  if ((st = dims_mask(S, name, a, dims, ndims, &mask)) ||
      (st = need_float(S, name, a)))
    return st;
  if (correction != correction)
    return emi_error(S, EM_ERR_ARG, "%s: correction is NaN", name);
  em_tensor *r;
  if ((st = alloc_reduced(S, name, a, mask, a->dtype, &r))) return st;
  if ((st = EMI_DISPATCH(S, name, a, var, r, a, mask, correction, take_sqrt))) { em_tensor_release(r); return st; }
  if (!keepdim) squeeze_in_place(r, mask);
  *out = r;
  if (emi_ag_wanted1(S, a))
    return emi_ag_record_var(S, a, mask, correction, keepdim, take_sqrt, out);
  return EM_OK;
}

em_status em_norm(em_state *S, const em_tensor *a, double p, const int *dims, int ndims,
                  int keepdim, em_tensor **out) {
  if (!out) return emi_error(S, EM_ERR_ARG, "norm: out is NULL");
  *out = NULL;
  em_status st = emi_check_tensor(S, "norm", a);
  if (st) return st;
  unsigned mask;
  if ((st = dims_mask(S, "norm", a, dims, ndims, &mask)) || (st = need_float(S, "norm", a)))
    return st;
  if (p != p) return emi_error(S, EM_ERR_ARG, "norm: p is NaN");
  em_tensor *r;
  if ((st = alloc_reduced(S, "norm", a, mask, a->dtype, &r))) return st;
  if ((st = EMI_DISPATCH(S, "norm", a, norm, r, a, mask, p))) { em_tensor_release(r); return st; }
  if (!keepdim) squeeze_in_place(r, mask);
  *out = r;
  if (emi_ag_wanted1(S, a)) return emi_ag_record_norm(S, a, p, mask, keepdim, out);
  return EM_OK;
}

/* -- max/min along a dim, argmax/argmin --------------------------------------------- */

static em_status arg_common(em_state *S, const char *name, const em_tensor *a, int dim,
                            int keepdim, int index_base, int want_max, em_tensor **values,
                            em_tensor **indices) {
  em_status st = emi_check_tensor(S, name, a);
  if (st) return st;
  if ((st = emi_wrap_dim(S, name, &dim, a->ndim)))
    return st;
  unsigned mask = a->ndim ? 1u << dim : 0;
  if ((st = check_nonempty(S, name, a, mask))) return st;
  em_tensor *v = NULL, *ix;
  if ((st = alloc_reduced(S, name, a, mask, EM_INT64, &ix))) return st;
  if (values && (st = alloc_reduced(S, name, a, mask, a->dtype, &v))) {
    em_tensor_release(ix);
    return st;
  }
  if ((st = EMI_DISPATCH(S, name, a, arg_reduce, v, ix, a, dim, want_max, index_base))) {
    em_tensor_release(ix);
    em_tensor_release(v);
    return st;
  }
  if (!keepdim) {
    squeeze_in_place(ix, mask);
    if (v) squeeze_in_place(v, mask);
  }
  *indices = ix;
  if (!values) return EM_OK;
  *values = v;
  if (emi_ag_wanted1(S, a)) {
    /* on failure the recorder drops *values; the indices go with them */
    if ((st = emi_ag_record_arg(S, a, dim, keepdim, index_base, values, ix))) {
      em_tensor_release(ix);
      *indices = NULL;
      return st;
    }
  }
  return EM_OK;
}

em_status em_max_dim(em_state *S, const em_tensor *a, int dim, int keepdim, int index_base,
                     em_tensor **values, em_tensor **indices) {
  if (!values || !indices) return emi_error(S, EM_ERR_ARG, "max: values or indices is NULL");
  *values = *indices = NULL;
  return arg_common(S, "max", a, dim, keepdim, index_base, 1, values, indices);
}

em_status em_min_dim(em_state *S, const em_tensor *a, int dim, int keepdim, int index_base,
                     em_tensor **values, em_tensor **indices) {
  if (!values || !indices) return emi_error(S, EM_ERR_ARG, "min: values or indices is NULL");
  *values = *indices = NULL;
  return arg_common(S, "min", a, dim, keepdim, index_base, 0, values, indices);
}

/* Over the flattened tensor: a contiguous tensor is viewed as 1-D (a copy is
** made otherwise), and the single index is shaped as PyTorch does: 0-dim, or
** all dims of size 1 with keepdim. */
static em_status arg_all(em_state *S, const char *name, const em_tensor *a, int keepdim,
                         int index_base, int want_max, em_tensor **out) {
  em_status st = emi_check_tensor(S, name, a);
  if (st) return st;
  if (a->numel == 0)
    return emi_error(S, EM_ERR_SHAPE, "%s: cannot reduce an empty tensor (shape %s): the "
                     "result would have no value", name, emi_tshape(S, a));
  em_tensor *c, *flat, *ix;
  if (em_tensor_is_contiguous(a)) { c = (em_tensor *)a; em_tensor_retain(c); }
  else if ((st = em_contiguous(S, a, &c))) return st;
  int64_t n = c->numel, one = 1;
  st = emi_tensor_view(S, c, &n, &one, 1, c->offset, &flat);
  em_tensor_release(c);
  if (st) return st;
  st = arg_common(S, name, flat, 0, 1, index_base, want_max, NULL, &ix);
  em_tensor_release(flat);
  if (st) return st;
  ix->ndim = keepdim ? a->ndim : 0;
  for (int d = 0; d < ix->ndim; d++) { ix->sizes[d] = 1; ix->strides[d] = 1; }
  *out = ix;
  return EM_OK;
}

em_status em_argmax(em_state *S, const em_tensor *a, int dim, int all, int keepdim,
                    int index_base, em_tensor **out) {
  if (!out) return emi_error(S, EM_ERR_ARG, "argmax: out is NULL");
  *out = NULL;
  if (all) return arg_all(S, "argmax", a, keepdim, index_base, 1, out);
  return arg_common(S, "argmax", a, dim, keepdim, index_base, 1, NULL, out);
}

em_status em_argmin(em_state *S, const em_tensor *a, int dim, int all, int keepdim,
                    int index_base, em_tensor **out) {
  if (!out) return emi_error(S, EM_ERR_ARG, "argmin: out is NULL");
  *out = NULL;
  if (all) return arg_all(S, "argmin", a, keepdim, index_base, 0, out);
  return arg_common(S, "argmin", a, dim, keepdim, index_base, 0, NULL, out);
}

/* -- softmax ---------------------------------------------------------------------- */

em_status em_softmax(em_state *S, const em_tensor *a, int dim, int log, em_tensor **out) {
  const char *name = log ? "log_softmax" : "softmax";
  if (!out) return emi_error(S, EM_ERR_ARG, "%s: out is NULL", name);
  *out = NULL;
  em_status st = emi_check_tensor(S, name, a);
  if (st) return st;
  if ((st = emi_wrap_dim(S, name, &dim, a->ndim)) ||
      (st = need_float(S, name, a)))
    return st;
  em_tensor *r;
  if ((st = emi_tensor_new(S, name, a->sizes, a->ndim, a->dtype, a->device, &r))) return st;
  if ((st = EMI_DISPATCH(S, name, a, softmax, r, a, a->ndim ? dim : 0, log))) {
    em_tensor_release(r);
    return st;
  }
  *out = r;
  if (emi_ag_wanted1(S, a)) return emi_ag_record_softmax(S, a, dim, log, out);
  return EM_OK;
}

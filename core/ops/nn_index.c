/*
** nn_index.c -- in-place scatter-adds: index_add_ (the backward of
** index_select / embedding) and scatter_add_ (the backward of gather), any
** dtype and strides: argument and shape checks, then the device's kernel (the
** CPU backend's scatter.c), which range-checks every index before out is
** touched, so an error leaves out intact. A write bumps out's storage version.
*/
#include "nn_util.h"

static em_status common(em_state *S, const char *op, em_tensor *out, int *dim,
                        const em_tensor *idx, const em_tensor *src) {
  em_status st;
  if ((st = emi_check_tensor(S, op, out)) || (st = emi_check_tensor(S, op, src)) ||
      (st = nn_check_index(S, op, "index", idx, out)) ||
      (st = nn_check_device(S, op, "src", src, out)))
    return st;
  if (src->dtype != out->dtype)
    return emi_error(S, EM_ERR_DTYPE, "%s: src has dtype %s but self is %s", op,
                     em_dtype_name(src->dtype), em_dtype_name(out->dtype));
  int nd = out->ndim ? out->ndim : 1;
  return emi_wrap_dim(S, op, dim, nd);
}

em_status em_index_add_(em_state *S, em_tensor *out, int dim, const em_tensor *idx,
                        const em_tensor *src, int index_base) {
  const char *op = "index_add_";
  em_status st = common(S, op, out, &dim, idx, src);
  if (st) return st;
  if (idx->ndim > 1)
    return emi_error(S, EM_ERR_SHAPE, "%s: index %s must be 0-D or 1-D", op, emi_tshape(S, idx));
  int64_t n = idx->numel;
  /* 0-d tensors act as 1-element vectors */
  int nd = out->ndim ? out->ndim : 1;
  int64_t osz[EM_MAX_DIMS], ssz[EM_MAX_DIMS];
  for (int d = 0; d < nd; d++) osz[d] = out->ndim ? out->sizes[d] : 1;
  int snd = src->ndim ? src->ndim : 1;
  for (int d = 0; d < snd; d++) ssz[d] = src->ndim ? src->sizes[d] : 1;
  int ok = snd == nd && ssz[dim] == n;
  for (int d = 0; ok && d < nd; d++) ok = d == dim || ssz[d] == osz[d];
  if (!ok)
    return emi_error(S, EM_ERR_SHAPE, "%s: src %s does not fit self %s with index %s along "
                     "dim %lld", op, emi_tshape(S, src), emi_tshape(S, out), emi_tshape(S, idx),
                     emi_ix(S, dim));
  if ((st = EMI_DISPATCH(S, op, out, index_add, out, dim, idx, src, index_base))) return st;
  emi_bump_version(out);
  return EM_OK;
}

em_status em_scatter_add_(em_state *S, em_tensor *out, int dim, const em_tensor *idx,
                          const em_tensor *src, int index_base) {
  const char *op = "scatter_add_";
  em_status st = common(S, op, out, &dim, idx, src);
  if (st) return st;
  int nd = out->ndim;
  int ok = idx->ndim == nd && src->ndim == nd;
  for (int d = 0; ok && d < nd; d++)
    ok = idx->sizes[d] <= src->sizes[d] && (d == dim || idx->sizes[d] <= out->sizes[d]);
  if (!ok)
    return emi_error(S, EM_ERR_SHAPE, "%s: index %s must have self %s's and src %s's ndim and "
                     "be no larger than src (nor self outside dim %lld)", op,
                     emi_tshape(S, idx), emi_tshape(S, out), emi_tshape(S, src), emi_ix(S, dim));
  if (idx->numel == 0) return EM_OK;
  if ((st = EMI_DISPATCH(S, op, out, scatter_add, out, dim, idx, src, index_base))) return st;
  emi_bump_version(out);
  return EM_OK;
}

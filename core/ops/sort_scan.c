/*
** sort_scan.c -- sorting and scans along one dim: argsort, sort, topk (the
** backends' sort entry, which gives the stable order of each line, or its first
** k: topk's need not sort the rest) and cumsum, cumprod (the scan entry).
**
** sort and topk take their values with em_gather at the sorted positions, so the
** values' gradient is gather's (a scatter-add back to the input) with nothing
** more to record. A 0-D input acts as one element along dim 0 and gives 0-D
** results, as in PyTorch.
*/
#include "../internal.h"
#include "../autograd/autograd.h"

/* a seen with at least one dim (a 0-D tensor as [1]); *view is what to release. */
static em_status at_least_1d(em_state *S, const em_tensor *a, const em_tensor **as,
                             em_tensor **view) {
  *view = NULL;
  *as = a;
  if (a->ndim) return EM_OK;
  int64_t one = 1, stride = 1;
  em_status st = emi_tensor_view(S, a, &one, &stride, 1, a->offset, view);
  if (!st) *as = *view;
  return st;
}

/* t (one element) as a 0-D tensor, replacing *t. */
static em_status to_0d(em_state *S, em_tensor **t) {
  em_tensor *r;
  em_status st = em_reshape(S, *t, NULL, 0, &r);
  em_tensor_release(*t);
  *t = st ? NULL : r;
  return st;
}

static em_status check_sortable(em_state *S, const char *op, const em_tensor *a, int *dim) {
  em_status st = emi_check_tensor(S, op, a);
  if (st || (st = emi_wrap_dim(S, op, dim, a->ndim))) return st;
  if (em_dtype_is_floating(a->dtype) || a->dtype == EM_INT64 || a->dtype == EM_INT32 ||
      a->dtype == EM_UINT8 || a->dtype == EM_BOOL)
    return EM_OK;
  return emi_error(S, EM_ERR_DTYPE, "%s: can't sort a %s tensor", op,
                   em_dtype_name(a->dtype));
}

/* The positions of the first k of each line of a along dim (the whole order when k
** is the line's length), a checked, k in range: int64, a's shape with k along dim,
** 0-D for a 0-D a. */
static em_status first_k(em_state *S, const char *op, const em_tensor *a, int dim,
                         int64_t k, int descending, int index_base, em_tensor **indices) {
  const em_tensor *av;
  em_tensor *view, *ix;
  em_status st = at_least_1d(S, a, &av, &view);
  if (st) return st;
  int64_t sizes[EM_MAX_DIMS];
  memcpy(sizes, av->sizes, sizeof(int64_t) * (size_t)av->ndim);
  sizes[dim] = k;
  st = emi_tensor_new(S, op, sizes, av->ndim, EM_INT64, a->device, &ix);
  if (!st && av->numel > 0 && k > 0)
    st = EMI_DISPATCH(S, op, av, sort, ix, av, dim, descending != 0, index_base, k);
  em_tensor_release(view);
  if (st) { em_tensor_release(ix); return st; }
  if (a->ndim == 0 && k == 1 && (st = to_0d(S, &ix))) return st;
  *indices = ix;
  return EM_OK;
}

/* values = a's elements at the positions ix along dim; ix is kept or released. */
static em_status with_values(em_state *S, const em_tensor *a, int dim, em_tensor *ix,
                             int index_base, em_tensor **values, em_tensor **indices) {
  em_tensor *v;
  em_status st = em_gather(S, a, dim, ix, index_base, &v);
  if (st) { em_tensor_release(ix); return st; }
  *values = v;
  *indices = ix;
  return EM_OK;
}

em_status em_argsort(em_state *S, const em_tensor *a, int dim, int descending,
                     int index_base, em_tensor **indices) {
  em_status st = check_sortable(S, "argsort", a, &dim);
  if (st) return st;
  return first_k(S, "argsort", a, dim, a->ndim ? a->sizes[dim] : 1, descending, index_base,
                 indices);
}

em_status em_sort(em_state *S, const em_tensor *a, int dim, int descending, int index_base,
                  em_tensor **values, em_tensor **indices) {
  em_tensor *ix;
  em_status st = check_sortable(S, "sort", a, &dim);
  if (st || (st = first_k(S, "sort", a, dim, a->ndim ? a->sizes[dim] : 1, descending,
                          index_base, &ix)))
    return st;
  return with_values(S, a, dim, ix, index_base, values, indices);
}

em_status em_topk(em_state *S, const em_tensor *a, int64_t k, int dim, int largest,
                  int index_base, em_tensor **values, em_tensor **indices) {
  em_status st = check_sortable(S, "topk", a, &dim);
  if (st) return st;
  int64_t size = a->ndim ? a->sizes[dim] : 1;
  if (k < 0 || k > size)
    return emi_error(S, EM_ERR_ARG, "topk: k = %lld is out of range for dimension %lld of "
                     "size %lld in shape %s (0 <= k <= %lld)", (long long)k, emi_ix(S, dim),
                     (long long)size, emi_tshape(S, a), (long long)size);
  em_tensor *ix;
  if ((st = first_k(S, "topk", a, dim, k, largest, index_base, &ix))) return st;
  return with_values(S, a, dim, ix, index_base, values, indices);
}

/* -- Scans ------------------------------------------------------------------------- */

/* op: EMI_SCAN_SUM or EMI_SCAN_PROD. Integers and bool scan in int64, as in PyTorch. */
static em_status scan(em_state *S, int op, const em_tensor *a, int dim, em_tensor **out) {
  const char *name = op == EMI_SCAN_SUM ? "cumsum" : "cumprod";
  em_status st = emi_check_tensor(S, name, a);
  if (st || (st = emi_wrap_dim(S, name, &dim, a->ndim))) return st;
  em_dtype dt = em_dtype_is_floating(a->dtype) ? a->dtype : EM_INT64;
  em_tensor *conv = NULL, *view = NULL, *o = NULL;
  const em_tensor *src = a, *av;
  if (dt != a->dtype) {
    if ((st = em_to(S, a, dt, a->device, &conv))) return st;
    src = conv;
  }
  if (!(st = at_least_1d(S, src, &av, &view)) &&
      !(st = emi_tensor_new(S, name, av->sizes, av->ndim, dt, a->device, &o)) && av->numel)
    st = EMI_DISPATCH(S, name, av, scan, op, o, av, dim);
  em_tensor_release(view);
  em_tensor_release(conv);
  if (st) { em_tensor_release(o); return st; }
  if (a->ndim == 0 && (st = to_0d(S, &o))) return st;
  *out = o;
  if (em_dtype_is_floating(dt) && emi_ag_wanted1(S, a))
    return emi_ag_record_scan(S, op, a, dim, out);
  return EM_OK;
}

em_status em_cumsum(em_state *S, const em_tensor *a, int dim, em_tensor **out) {
  return scan(S, EMI_SCAN_SUM, a, dim, out);
}

em_status em_cumprod(em_state *S, const em_tensor *a, int dim, em_tensor **out) {
  return scan(S, EMI_SCAN_PROD, a, dim, out);
}

/*
** join.c -- joining and indexing: cat, stack, index_select, gather, one_hot.
**
** cat and stack allocate the result and copy each input into its slice of it
** (a strided view) with em_copy_, which also converts dtypes: the result has
** the promoted dtype of all inputs, as in PyTorch. index_select and gather check
** shapes here and leave the index values to the backend, which checks them as
** it reads them. one_hot is built from other ops (a comparison against arange),
** so that it works on every backend without a kernel of its own.
*/
#include "../autograd/autograd.h"

static em_status check_list(em_state *S, const char *op, em_tensor *const *list, int n,
                            em_dtype *dt) {
  if (!list || n <= 0)
    return emi_error(S, EM_ERR_ARG, "%s: expected a non-empty list of tensors, got %d",
                     op, list ? n : 0);
  for (int i = 0; i < n; i++) {
    if (!list[i])
      return emi_error(S, EM_ERR_ARG, "%s: tensor at position %lld is NULL", op, emi_ix(S, i));
    if (list[i]->device != list[0]->device) {
      char d0[16], d1[16];
      return emi_error(S, EM_ERR_DEVICE, "%s: tensors on different devices (%s at "
                       "position %lld, %s at position %lld)", op,
                       emi_device_name(d0, list[0]->device), emi_ix(S, 0),
                       emi_device_name(d1, list[i]->device), emi_ix(S, i));
    }
    *dt = i ? em_dtype_promote(*dt, list[i]->dtype) : list[i]->dtype;
  }
  return EM_OK;
}

/* A view of o as a handle on the stack, for copying into: em_copy_ only uses it
** during the call, so it needs no reference (and no allocation). */
static void slice_of(em_tensor *v, const em_tensor *o, const int64_t *sizes,
                     const int64_t *strides, int ndim, int64_t offset) {
  *v = *o;
  v->ndim = ndim;
  memcpy(v->sizes, sizes, sizeof(int64_t) * (size_t)ndim);
  memcpy(v->strides, strides, sizeof(int64_t) * (size_t)ndim);
  v->offset = offset;
  v->numel = emi_shape_numel(sizes, ndim);
}

/* -- cat ---------------------------------------------------------------------------- */

/* PyTorch skips 1-D tensors of size 0 (the legacy "empty tensor") in cat: they
** take part in type promotion only. */
static bool legacy_empty(const em_tensor *t) { return t->ndim == 1 && t->sizes[0] == 0; }

em_status em_cat(em_state *S, em_tensor *const *list, int n, int dim, em_tensor **out) {
  em_dtype dt;
  em_status st = check_list(S, "cat", list, n, &dt);
  if (st) return st;
  int ref = -1;
  for (int i = 0; i < n && ref < 0; i++)
    if (!legacy_empty(list[i])) ref = i;
  if (ref < 0) {                       /* only empty tensors: an empty result */
    int64_t zero = 0;
    return emi_tensor_new(S, "cat", &zero, 1, dt, list[0]->device, out);
  }
  const em_tensor *r = list[ref];
  if (r->ndim == 0)
    return emi_error(S, EM_ERR_SHAPE, "cat: zero-dimensional tensor (at position %lld) "
                     "can't be concatenated", emi_ix(S, ref));
  if ((st = emi_wrap_dim(S, "cat", &dim, r->ndim))) return st;
  int64_t sizes[EM_MAX_DIMS];
  memcpy(sizes, r->sizes, sizeof sizes);
  sizes[dim] = 0;
  for (int i = 0; i < n; i++) {
    const em_tensor *t = list[i];
    if (legacy_empty(t)) continue;
    if (t->ndim != r->ndim)
      return emi_error(S, EM_ERR_SHAPE, "cat: tensors must have the same number of "
                       "dimensions: shape %s at position %lld vs %s at position %lld",
                       emi_tshape(S, r), emi_ix(S, ref), emi_tshape(S, t), emi_ix(S, i));
    for (int d = 0; d < r->ndim; d++)
      if (d != dim && t->sizes[d] != r->sizes[d])
        return emi_error(S, EM_ERR_SHAPE, "cat: sizes must match except in dimension %lld: "
                         "shape %s at position %lld vs %s at position %lld", emi_ix(S, dim),
                         emi_tshape(S, r), emi_ix(S, ref), emi_tshape(S, t), emi_ix(S, i));
    sizes[dim] += t->sizes[dim];
  }
  em_tensor *o, slice;
  if ((st = emi_tensor_new(S, "cat", sizes, r->ndim, dt, r->device, &o))) return st;
  int64_t at = 0;
  int grad_off = S->grad_disabled;   /* the copies into slices are not recorded */
  emi_set_grad_disabled(S, 1);
  for (int i = 0; i < n && o->numel > 0; i++) {
    const em_tensor *t = list[i];
    if (legacy_empty(t) || t->sizes[dim] == 0) continue;
    slice_of(&slice, o, o->sizes, o->strides, o->ndim, at * o->strides[dim]);
    slice.sizes[dim] = t->sizes[dim];
    slice.numel = t->numel;
    if ((st = em_copy_(S, &slice, t))) break;
    at += t->sizes[dim];
  }
  emi_set_grad_disabled(S, grad_off);
  if (st) { em_tensor_release(o); return st; }
  *out = o;
  if (emi_ag_wanted_list(S, (const em_tensor *const *)list, n))
    return emi_ag_record_join(S, 0, list, n, dim, out);
  return EM_OK;
}

/* -- stack: a new dim of size n at position dim (0 ... ndim) -------------------------- */

em_status em_stack(em_state *S, em_tensor *const *list, int n, int dim, em_tensor **out) {
  em_dtype dt;
  em_status st = check_list(S, "stack", list, n, &dt);
  if (st) return st;
  const em_tensor *r = list[0];
  if (r->ndim >= EM_MAX_DIMS)
    return emi_error(S, EM_ERR_SHAPE, "stack: inputs of shape %s already have %d dimensions "
                     "(at most %d supported)", emi_tshape(S, r), r->ndim, EM_MAX_DIMS);
  if ((st = emi_wrap_dim(S, "stack", &dim, r->ndim + 1))) return st;
  for (int i = 1; i < n; i++) {
    const em_tensor *t = list[i];
    bool same = t->ndim == r->ndim;
    for (int d = 0; same && d < r->ndim; d++) same = t->sizes[d] == r->sizes[d];
    if (!same)
      return emi_error(S, EM_ERR_SHAPE, "stack: expected tensors of equal shape, got %s at "
                       "position %lld and %s at position %lld", emi_tshape(S, r), emi_ix(S, 0),
                       emi_tshape(S, t), emi_ix(S, i));
  }
  int64_t sizes[EM_MAX_DIMS], vstrides[EM_MAX_DIMS];
  for (int d = 0, k = 0; d <= r->ndim; d++) sizes[d] = d == dim ? n : r->sizes[k++];
  em_tensor *o, slice;
  if ((st = emi_tensor_new(S, "stack", sizes, r->ndim + 1, dt, r->device, &o))) return st;
  /* slice i: out's geometry without the new dim, shifted by i along it */
  for (int d = 0, k = 0; d <= r->ndim; d++)
    if (d != dim) vstrides[k++] = o->strides[d];
  int grad_off = S->grad_disabled;
  emi_set_grad_disabled(S, 1);
  for (int i = 0; i < n && o->numel > 0; i++) {
    slice_of(&slice, o, r->sizes, vstrides, r->ndim, i * o->strides[dim]);
    if ((st = em_copy_(S, &slice, list[i]))) break;
  }
  emi_set_grad_disabled(S, grad_off);
  if (st) { em_tensor_release(o); return st; }
  *out = o;
  if (emi_ag_wanted_list(S, (const em_tensor *const *)list, n))
    return emi_ag_record_join(S, 1, list, n, dim, out);
  return EM_OK;
}

/* -- index_select / gather ----------------------------------------------------------- */

static em_status check_index(em_state *S, const char *op, const em_tensor *a,
                             const em_tensor *idx) {
  em_status st = emi_check_tensor(S, op, a);
  if (st || (st = emi_check_tensor(S, op, idx))) return st;
  if (idx->dtype != EM_INT64 && idx->dtype != EM_INT32)
    return emi_error(S, EM_ERR_DTYPE, "%s: expected an int64 or int32 index tensor, got %s",
                     op, em_dtype_name(idx->dtype));
  if (idx->device != a->device) {
    char da[16], di[16];
    return emi_error(S, EM_ERR_DEVICE, "%s: input on %s but index on %s", op,
                     emi_device_name(da, a->device), emi_device_name(di, idx->device));
  }
  return EM_OK;
}

/* A 0-D tensor seen as shape [1] (PyTorch treats it so for indexing). */
static em_status as_1d(em_state *S, const em_tensor *t, em_tensor **out) {
  int64_t one = 1, stride = 1;
  return emi_tensor_view(S, t, &one, &stride, 1, t->offset, out);
}

em_status em_index_select(em_state *S, const em_tensor *a, int dim, const em_tensor *idx,
                          int index_base, em_tensor **out) {
  em_status st = check_index(S, "index_select", a, idx);
  if (st) return st;
  const em_tensor *a_in = a;     /* a may be replaced by a 1-D view below */
  if (idx->ndim > 1)
    return emi_error(S, EM_ERR_SHAPE, "index_select: expected a 1-D index, got shape %s",
                     emi_tshape(S, idx));
  if ((st = emi_wrap_dim(S, "index_select", &dim, a->ndim))) return st;
  em_tensor *a1 = NULL, *o, *o0;
  if (a->ndim == 0) {
    if ((st = as_1d(S, a, &a1))) return st;
    a = a1;
  }
  int64_t sizes[EM_MAX_DIMS];
  memcpy(sizes, a->sizes, sizeof sizes);
  sizes[dim] = idx->numel;
  if ((st = emi_tensor_new(S, "index_select", sizes, a->ndim, a->dtype, a->device, &o))) {
    em_tensor_release(a1);
    return st;
  }
  st = EMI_DISPATCH(S, "index_select", a, index_select, o, a, dim, idx, index_base);
  em_tensor_release(a1);
  if (st) { em_tensor_release(o); return st; }
  /* a 0-D input with one index gives a 0-D result, as in PyTorch */
  if (a1 && o->numel == 1) {
    st = emi_tensor_view(S, o, NULL, NULL, 0, 0, &o0);
    em_tensor_release(o);
    if (st) return st;
    o = o0;
  }
  *out = o;
  if (emi_ag_wanted1(S, a_in)) return emi_ag_record_index(S, 0, a_in, dim, idx, index_base, out);
  return EM_OK;
}

em_status em_gather(em_state *S, const em_tensor *a, int dim, const em_tensor *idx,
                    int index_base, em_tensor **out) {
  em_status st = check_index(S, "gather", a, idx);
  if (st) return st;
  if (idx->ndim != a->ndim)
    return emi_error(S, EM_ERR_SHAPE, "gather: index %s must have as many dimensions as "
                     "the input %s", emi_tshape(S, idx), emi_tshape(S, a));
  if ((st = emi_wrap_dim(S, "gather", &dim, a->ndim))) return st;
  for (int d = 0; d < a->ndim; d++)
    if (d != dim && idx->sizes[d] > a->sizes[d])
      return emi_error(S, EM_ERR_SHAPE, "gather: index shape %s is larger than input shape "
                       "%s in dimension %lld", emi_tshape(S, idx), emi_tshape(S, a), emi_ix(S, d));
  em_tensor *a1 = NULL, *i1 = NULL, *o;
  if (a->ndim == 0 && ((st = as_1d(S, a, &a1)) || (st = as_1d(S, idx, &i1)))) {
    em_tensor_release(a1);
    return st;
  }
  const em_tensor *av = a1 ? a1 : a, *iv = i1 ? i1 : idx;
  if (!(st = emi_tensor_new(S, "gather", idx->sizes, idx->ndim, a->dtype, a->device, &o))) {
    /* out's data seen with iv's (1-D) shape for a 0-D gather */
    em_tensor *ov = o;
    if (i1) st = emi_tensor_view(S, o, i1->sizes, i1->strides, 1, 0, &ov);
    if (!st) st = EMI_DISPATCH(S, "gather", a, gather, ov, av, dim, iv, index_base);
    if (ov != o) em_tensor_release(ov);
    if (st) em_tensor_release(o);
  }
  em_tensor_release(a1);
  em_tensor_release(i1);
  if (st) return st;
  *out = o;
  if (emi_ag_wanted1(S, a)) return emi_ag_record_index(S, 1, a, dim, idx, index_base, out);
  return EM_OK;
}

/* -- one_hot ---------------------------------------------------------------------------
** out[..., j] = (labels[...] - base == j), as int64: labels compared (broadcast)
** against arange(base, base + n). The labels' min and max are checked first, and
** give n when it is to be inferred. */
em_status em_one_hot(em_state *S, const em_tensor *labels, int64_t n, int index_base,
                     em_tensor **out) {
  em_status st = emi_check_tensor(S, "one_hot", labels);
  if (st) return st;
  if (em_dtype_is_floating(labels->dtype) || labels->dtype == EM_BOOL)
    return emi_error(S, EM_ERR_DTYPE, "one_hot: expected integer class labels, got %s",
                     em_dtype_name(labels->dtype));
  if (labels->ndim >= EM_MAX_DIMS)
    return emi_error(S, EM_ERR_SHAPE, "one_hot: labels of shape %s already have %d "
                     "dimensions (at most %d supported)", emi_tshape(S, labels),
                     labels->ndim, EM_MAX_DIMS);
  if (labels->numel == 0) {
    if (n <= 0)
      return emi_error(S, EM_ERR_ARG, "one_hot: can't infer the number of classes from "
                       "empty labels of shape %s", emi_tshape(S, labels));
    int64_t sizes[EM_MAX_DIMS];
    memcpy(sizes, labels->sizes, sizeof(int64_t) * (size_t)labels->ndim);
    sizes[labels->ndim] = n;
    return emi_tensor_new(S, "one_hot", sizes, labels->ndim + 1, EM_INT64, labels->device,
                          out);
  }
  em_tensor *mn = NULL, *mx = NULL, *classes = NULL, *lv = NULL, *eq = NULL;
  int64_t lo, hi;
  if ((st = em_reduce(S, EM_AMIN, labels, NULL, 0, 0, &mn)) ||
      (st = em_reduce(S, EM_AMAX, labels, NULL, 0, 0, &mx)) ||
      (st = em_tensor_item_int(S, mn, &lo)) || (st = em_tensor_item_int(S, mx, &hi)))
    goto done;
  if (n <= 0) n = hi + 1 - index_base;
  if (lo - index_base < 0 || hi - index_base >= n) {
    int64_t bad = lo - index_base < 0 ? lo : hi;
    st = emi_error(S, EM_ERR_INDEX, "one_hot: class label %lld is out of range for %lld "
                   "classes (labels count from %d)", (long long)bad, (long long)n, index_base);
    goto done;
  }
  if ((st = em_arange(S, index_base, (double)index_base + (double)n, 1, EM_INT64,
                      labels->device, &classes)) ||
      (st = em_unsqueeze(S, labels, labels->ndim, &lv)) ||
      (st = em_binary(S, EM_EQ, lv, classes, &eq)))
    goto done;
  st = em_to(S, eq, EM_INT64, labels->device, out);
done:
  em_tensor_release(mn); em_tensor_release(mx); em_tensor_release(classes);
  em_tensor_release(lv); em_tensor_release(eq);
  return st;
}

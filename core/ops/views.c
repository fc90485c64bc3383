/*
** views.c -- operations that return a new handle on the same storage with
** other sizes/strides/offset: view, reshape (a view when it can be), transpose,
** permute, narrow, select, squeeze, unsqueeze, expand, as_strided.
*/
#include "../autograd/autograd.h"

/* Every view ends here: records the view for autograd when the input needs it. */
static em_status ag_view(em_state *S, const char *name, int kind, const em_tensor *a,
                         em_status st, em_tensor **out) {
  if (st || !emi_ag_wanted1(S, a)) return st;
  return kind == 0 ? emi_ag_record_reshape(S, name, a, out)
       : kind == 1 ? emi_ag_record_expand(S, a, out)
                   : emi_ag_record_strided(S, name, a, out);
}

/* Resolve a requested shape with at most one -1 against numel. */
static em_status infer_shape(em_state *S, const char *op, const em_tensor *a,
                             const int64_t *shape, int ndim, int64_t *out) {
  if (ndim < 0 || ndim > EM_MAX_DIMS)
    return emi_error(S, EM_ERR_SHAPE, "%s: %d dimensions (at most %d supported)", op,
                     ndim, EM_MAX_DIMS);
  int infer = -1;
  int64_t n = 1;
  for (int d = 0; d < ndim; d++) {
    if (shape[d] == -1) {
      if (infer >= 0)
        return emi_error(S, EM_ERR_SHAPE, "%s: only one dimension can be -1", op);
      infer = d;
    } else if (shape[d] < 0) {
      return emi_error(S, EM_ERR_SHAPE, "%s: invalid size %lld", op, (long long)shape[d]);
    } else if (__builtin_mul_overflow(n, shape[d], &n)) {
      goto bad;   /* [2^62, 2^62, 0] must not wrap to a plausible count */
    }
    out[d] = shape[d];
  }
  if (infer >= 0) {
    if (n == 0 || a->numel % n != 0) goto bad;
    out[infer] = a->numel / n;
    n *= out[infer];
  }
  if (n != a->numel) goto bad;
  return EM_OK;
bad:;
  char b[EMI_SHAPE_STR];
  return emi_error(S, EM_ERR_SHAPE, "%s: shape %s is invalid for input of shape %s (%lld elements)",
                   op, emi_shape_str(b, shape, ndim), emi_tshape(S, a), (long long)a->numel);
}

/* Strides for viewing a's memory with shape `shape` without copying, or false.
** Walks a's dims in chunks whose elements are laid out as one contiguous run of
** strides, and splits each chunk over the new dims whose product matches. */
static bool view_strides(const em_tensor *a, const int64_t *shape, int ndim,
                         int64_t *strides) {
  if (a->numel == 0 || a->ndim == 0) {
    emi_contiguous_strides(shape, ndim, strides);
    return true;
  }
  int view_d = ndim - 1;
  int64_t chunk = 1, tensor_numel = 1;
  int64_t base_stride = a->strides[a->ndim - 1];
  for (int d = a->ndim - 1; d >= 0; d--) {
    tensor_numel *= a->sizes[d];
    /* a chunk ends where the next outer dim is not laid out right after this one */
    if (d == 0 || (a->sizes[d - 1] != 1 &&
                   a->strides[d - 1] != tensor_numel * base_stride)) {
      while (view_d >= 0 && (chunk < tensor_numel || shape[view_d] == 1)) {
        strides[view_d] = chunk * base_stride;
        chunk *= shape[view_d];
        view_d--;
      }
      if (chunk != tensor_numel) return false;
      if (d > 0) { base_stride = a->strides[d - 1]; tensor_numel = 1; chunk = 1; }
    }
  }
  return view_d == -1;
}

em_status em_view(em_state *S, const em_tensor *a, const int64_t *shape, int ndim,
                  em_tensor **out) {
  int64_t sizes[EM_MAX_DIMS], strides[EM_MAX_DIMS];
  em_status st = emi_check_tensor(S, "view", a);
  if (st || (st = infer_shape(S, "view", a, shape, ndim, sizes))) return st;
  if (!view_strides(a, sizes, ndim, strides))
    return emi_error(S, EM_ERR_SHAPE,
                     "view: shape %s is not compatible with the strides of input %s "
                     "(use reshape, or contiguous first)",
                     emi_shape_str((char[EMI_SHAPE_STR]){0}, sizes, ndim), emi_tshape(S, a));
  return ag_view(S, "view", 0, a, emi_tensor_view(S, a, sizes, strides, ndim, a->offset, out), out);
}

em_status em_reshape(em_state *S, const em_tensor *a, const int64_t *shape, int ndim,
                     em_tensor **out) {
  int64_t sizes[EM_MAX_DIMS], strides[EM_MAX_DIMS];
  em_status st = emi_check_tensor(S, "reshape", a);
  if (st || (st = infer_shape(S, "reshape", a, shape, ndim, sizes))) return st;
  if (view_strides(a, sizes, ndim, strides))
    return ag_view(S, "reshape", 0, a, emi_tensor_view(S, a, sizes, strides, ndim, a->offset, out), out);
  em_tensor *c;
  if ((st = em_contiguous(S, a, &c))) return st;
  emi_contiguous_strides(sizes, ndim, strides);
  st = emi_tensor_view(S, c, sizes, strides, ndim, c->offset, out);
  em_tensor_release(c);
  return ag_view(S, "reshape", 0, a, st, out);
}

em_status em_transpose(em_state *S, const em_tensor *a, int d1, int d2, em_tensor **out) {
  em_status st = emi_check_tensor(S, "transpose", a);
  if (st || (st = emi_wrap_dim(S, "transpose", &d1, a->ndim)) ||
      (st = emi_wrap_dim(S, "transpose", &d2, a->ndim)))
    return st;
  int64_t sizes[EM_MAX_DIMS], strides[EM_MAX_DIMS];
  memcpy(sizes, a->sizes, sizeof sizes);
  memcpy(strides, a->strides, sizeof strides);
  if (a->ndim > 0) {
    sizes[d1] = a->sizes[d2]; sizes[d2] = a->sizes[d1];
    strides[d1] = a->strides[d2]; strides[d2] = a->strides[d1];
  }
  st = emi_tensor_view(S, a, sizes, strides, a->ndim, a->offset, out);
  if (st || !emi_ag_wanted1(S, a)) return st;
  int perm[EM_MAX_DIMS];
  for (int d = 0; d < a->ndim; d++) perm[d] = d;
  if (a->ndim > 0) { perm[d1] = d2; perm[d2] = d1; }
  return emi_ag_record_permute(S, a, perm, out);
}

em_status em_permute(em_state *S, const em_tensor *a, const int *perm, int ndim,
                     em_tensor **out) {
  em_status st = emi_check_tensor(S, "permute", a);
  if (st) return st;
  if (ndim != a->ndim)
    return emi_error(S, EM_ERR_SHAPE, "permute: got %d dims for a %d-D tensor of shape %s",
                     ndim, a->ndim, emi_tshape(S, a));
  int64_t sizes[EM_MAX_DIMS], strides[EM_MAX_DIMS];
  bool seen[EM_MAX_DIMS] = {0};
  for (int i = 0; i < ndim; i++) {
    int d = perm[i];
    if ((st = emi_wrap_dim(S, "permute", &d, ndim))) return st;
    if (seen[d]) return emi_error(S, EM_ERR_ARG, "permute: dimension %lld repeated", emi_ix(S, d));
    seen[d] = true;
    sizes[i] = a->sizes[d];
    strides[i] = a->strides[d];
  }
  st = emi_tensor_view(S, a, sizes, strides, ndim, a->offset, out);
  if (st || !emi_ag_wanted1(S, a)) return st;
  return emi_ag_record_permute(S, a, perm, out);
}

em_status em_narrow(em_state *S, const em_tensor *a, int dim, int64_t start, int64_t len,
                    em_tensor **out) {
  em_status st = emi_check_tensor(S, "narrow", a);
  if (st) return st;
  if (a->ndim == 0) return emi_error(S, EM_ERR_SHAPE, "narrow: can't narrow a 0-D tensor");
  if ((st = emi_wrap_dim(S, "narrow", &dim, a->ndim))) return st;
  int64_t n = a->sizes[dim];
  if (start < 0) start += n;
  if (start < 0 || len < 0 || start + len > n)
    return emi_error(S, EM_ERR_INDEX,
                     "narrow: start %lld, length %lld out of range for dimension %lld of size %lld",
                     emi_ix(S, start), (long long)len, emi_ix(S, dim), (long long)n);
  int64_t sizes[EM_MAX_DIMS];
  memcpy(sizes, a->sizes, sizeof sizes);
  sizes[dim] = len;
  return ag_view(S, "narrow", 2, a, emi_tensor_view(S, a, sizes, a->strides, a->ndim,
                                                   a->offset + start * a->strides[dim], out), out);
}

em_status em_select(em_state *S, const em_tensor *a, int dim, int64_t index,
                    em_tensor **out) {
  em_status st = emi_check_tensor(S, "select", a);
  if (st) return st;
  if (a->ndim == 0) return emi_error(S, EM_ERR_SHAPE, "select: can't index a 0-D tensor");
  if ((st = emi_wrap_dim(S, "select", &dim, a->ndim))) return st;
  int64_t n = a->sizes[dim];
  if (index < -n || index >= n)
    return emi_error(S, EM_ERR_INDEX,
                     "select: index %lld out of range for dimension %lld of size %lld",
                     emi_ix(S, index), emi_ix(S, dim), (long long)n);
  if (index < 0) index += n;
  int64_t sizes[EM_MAX_DIMS], strides[EM_MAX_DIMS];
  int k = 0;
  for (int d = 0; d < a->ndim; d++) {
    if (d == dim) continue;
    sizes[k] = a->sizes[d];
    strides[k++] = a->strides[d];
  }
  return ag_view(S, "select", 2, a,
                 emi_tensor_view(S, a, sizes, strides, k, a->offset + index * a->strides[dim], out), out);
}

em_status em_squeeze(em_state *S, const em_tensor *a, int dim, int all, em_tensor **out) {
  em_status st = emi_check_tensor(S, "squeeze", a);
  if (st) return st;
  if (!all && a->ndim > 0 && (st = emi_wrap_dim(S, "squeeze", &dim, a->ndim))) return st;
  int64_t sizes[EM_MAX_DIMS], strides[EM_MAX_DIMS];
  int k = 0;
  for (int d = 0; d < a->ndim; d++) {
    if (a->sizes[d] == 1 && (all || d == dim)) continue;
    sizes[k] = a->sizes[d];
    strides[k++] = a->strides[d];
  }
  return ag_view(S, "squeeze", 0, a, emi_tensor_view(S, a, sizes, strides, k, a->offset, out), out);
}

em_status em_unsqueeze(em_state *S, const em_tensor *a, int dim, em_tensor **out) {
  em_status st = emi_check_tensor(S, "unsqueeze", a);
  if (st) return st;
  if (a->ndim >= EM_MAX_DIMS)
    return emi_error(S, EM_ERR_SHAPE, "unsqueeze: tensor already has %d dimensions", a->ndim);
  int n = a->ndim + 1;
  if (dim < -n || dim >= n)
    return emi_error(S, EM_ERR_INDEX, "unsqueeze: dimension %lld out of range for a %d-D result",
                     emi_ix(S, dim), n);
  if (dim < 0) dim += n;
  int64_t sizes[EM_MAX_DIMS], strides[EM_MAX_DIMS];
  for (int d = 0, k = 0; d < n; d++) {
    if (d == dim) {
      sizes[d] = 1;
      strides[d] = k < a->ndim ? a->strides[k] * a->sizes[k] : 1;
    } else {
      sizes[d] = a->sizes[k];
      strides[d] = a->strides[k++];
    }
  }
  return ag_view(S, "unsqueeze", 0, a, emi_tensor_view(S, a, sizes, strides, n, a->offset, out), out);
}

em_status em_expand(em_state *S, const em_tensor *a, const int64_t *shape, int ndim,
                    em_tensor **out) {
  em_status st = emi_check_tensor(S, "expand", a);
  if (st) return st;
  if (ndim < a->ndim || ndim > EM_MAX_DIMS)
    return emi_error(S, EM_ERR_SHAPE, "expand: can't expand %s to %d dimensions",
                     emi_tshape(S, a), ndim);
  int64_t sizes[EM_MAX_DIMS];
  for (int i = 0; i < ndim; i++) {
    int j = i - (ndim - a->ndim);
    sizes[i] = shape[i] == -1 && j >= 0 ? a->sizes[j] : shape[i];
    if (sizes[i] < 0)
      return emi_error(S, EM_ERR_SHAPE, "expand: -1 is not allowed for a new leading dimension");
  }
  return ag_view(S, "expand", 1, a, emi_expand_to(S, "expand", a, sizes, ndim, out), out);
}

em_status em_as_strided(em_state *S, const em_tensor *a, const int64_t *shape,
                        const int64_t *strides, int ndim, int64_t offset,
                        em_tensor **out) {
  em_status st = emi_check_tensor(S, "as_strided", a);
  if (st) return st;
  if (ndim < 0 || ndim > EM_MAX_DIMS)
    return emi_error(S, EM_ERR_SHAPE, "as_strided: %d dimensions", ndim);
  /* The furthest element reached must lie inside the storage. */
  int64_t hi = offset, esz = (int64_t)em_dtype_size(a->dtype);
  for (int d = 0; d < ndim; d++) {
    if (shape[d] < 0 || strides[d] < 0)
      return emi_error(S, EM_ERR_ARG, "as_strided: negative size or stride");
    if (shape[d] == 0) { hi = offset - 1; break; }
    hi += (shape[d] - 1) * strides[d];
  }
  if (offset < 0 || (hi + 1) * esz > (int64_t)a->storage->nbytes)
    return emi_error(S, EM_ERR_INDEX, "as_strided: geometry reaches past the storage (%zu bytes)",
                     a->storage->nbytes);
  return ag_view(S, "as_strided", 2, a, emi_tensor_view(S, a, shape, strides, ndim, offset, out), out);
}

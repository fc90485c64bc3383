/*
** copy.c -- copies and conversions: copy_ (broadcasting, any dtype pair,
** overlapping memory), contiguous, clone, to, and the creation functions that
** are a fill or a conversion (full, from_data).
*/
#include "ewise.h"
#include "../autograd/autograd.h"

/* A copy with a meta tensor is meta's to make (it refuses to read one: src
** first); NULL when neither is meta. */
static const em_tensor *meta_side(const em_tensor *out, const em_tensor *src) {
  return src->device == EM_META ? src : out->device == EM_META ? out : NULL;
}

/* For hosts that write a tensor's memory themselves (the Lua layer's t[i] = v on
** a CPU vector): the same check and version bump as every in-place op. */
em_status em_tensor_bump_version(em_state *S, em_tensor *t, const char *op) {
  if (!op) op = "write";
  em_status st = emi_check_tensor(S, op, t);
  return st ? st : emi_ag_inplace(S, op, t);
}

/* From the dispatch counters: every copy reaches a backend's copy entry there. */
int64_t em_copy_count(em_state *S) {
  uint64_t n = 0;
  for (int b = 0; b < EMI_MAX_BACKENDS; b++) n += S->dispatch_counts[b][EMI_ENTRY_copy];
  return (int64_t)n;
}

em_status em_copy_(em_state *S, em_tensor *dst, const em_tensor *src) {
  const char *op = "copy_";
  em_status st;
  /* copies may cross between the host and a device (the device's backend does
  ** them); between two devices, the destination's backend decides */
  if ((st = emi_check_tensor(S, op, dst)) || (st = emi_check_tensor(S, op, src)) ||
      (st = emi_ag_inplace(S, op, dst)))
    return st;
  if (emi_ag_wanted1(S, src))
    return emi_error(S, EM_ERR_UNSUPPORTED, "copy_: autograd can't follow an in-place copy "
                     "from a tensor that requires grad; use clone() or to()");
  if (emi_internal_overlap(dst))
    return emi_error(S, EM_ERR_ARG, "%s: can't write in place into a tensor of shape %s "
                     "whose elements share memory (an expanded view); clone it first",
                     op, emi_tshape(S, dst));
  if (dst->dtype == src->dtype && emi_same_geometry(dst, src)) return EM_OK;  /* a:copy_(a) */
  emi_temps tp;
  emi_temps_init(&tp);
  const em_tensor *sx = src;
  em_tensor *conv;
  if ((st = emi_expand_tmp(S, op, src, dst->sizes, dst->ndim, &tp, &sx))) goto done;
  if (emi_needs_copy(dst, sx)) {          /* e.g. a:copy_(a:t()): read before writing */
    if ((st = emi_convert(S, op, src, src->dtype, &tp, &conv)) ||
        (st = emi_expand_tmp(S, op, conv, dst->sizes, dst->ndim, &tp, &sx)))
      goto done;
  }
  const em_tensor *side = meta_side(dst, sx);
  st = EMI_DISPATCH(S, op, side ? side : dst->device == EM_CPU ? sx : dst, copy, dst, sx);
done:
  emi_temps_release(&tp);
  return st;
}

em_status em_clone(em_state *S, const em_tensor *a, em_tensor **out) {
  em_status st = emi_check_tensor(S, "clone", a);
  if (st) return st;
  em_tensor *r;
  if ((st = emi_tensor_new_fmt(S, "clone", a->sizes, a->ndim, a->dtype, a->device,
                               emi_nhwc(a), &r)))
    return st;
  if ((st = EMI_DISPATCH(S, "clone", a, copy, r, a))) { em_tensor_release(r); return st; }
  *out = r;
  if (emi_ag_wanted1(S, a)) return emi_ag_record_copy(S, "copy", a, out);
  return EM_OK;
}

em_status em_contiguous(em_state *S, const em_tensor *a, em_tensor **out) {
  em_status st = emi_check_tensor(S, "contiguous", a);
  if (st) return st;
  if (!em_tensor_is_contiguous(a))
    return emi_nhwc(a) ? emi_contiguous_from_nhwc(S, a, out) : em_clone(S, a, out);
  em_tensor_retain((em_tensor *)a);
  *out = (em_tensor *)a;
  return EM_OK;
}

em_status em_to(em_state *S, const em_tensor *a, em_dtype dt, int device, em_tensor **out) {
  em_status st = emi_check_tensor(S, "to", a);
  if (st) return st;
  if ((unsigned)dt >= EM_NUM_DTYPES)
    return emi_error(S, EM_ERR_DTYPE, "to: invalid dtype %d", (int)dt);
  if (!emi_device_of(S, device)) {
    char b[16];
    if (device >= 0 && device < emi_accel_count(S))     /* there, but it would not open */
      return emi_error(S, EM_ERR_DEVICE, "to: %s", emi_accel_why(S));
    return emi_error(S, EM_ERR_DEVICE, "to: can't move a tensor to %s: no backend serves "
                     "it (CUDA is not available in this build or on this machine)",
                     device < EM_CPU ? "an invalid device" : emi_device_name(b, device));
  }
  if (a->dtype == dt && a->device == device) {
    em_tensor_retain((em_tensor *)a);
    *out = (em_tensor *)a;
    return EM_OK;
  }
  em_tensor *r;
  if ((st = emi_tensor_new_fmt(S, "to", a->sizes, a->ndim, dt, device, emi_nhwc(a), &r))) return st;
  /* between the host and a device, the device's backend copies (it knows both) */
  const em_tensor *side = meta_side(r, a);
  if (!side) side = a->device != r->device && a->device == EM_CPU ? r : a;
  if ((st = EMI_DISPATCH(S, "to", side, copy, r, a))) {
    em_tensor_release(r);
    return st;
  }
  *out = r;
  if (emi_ag_wanted1(S, a)) return emi_ag_record_copy(S, "copy", a, out);
  return EM_OK;
}

em_status em_full(em_state *S, const int64_t *shape, int ndim, double value, em_dtype dt,
                  int device, em_tensor **out) {
  if (!shape && ndim > 0) return emi_error(S, EM_ERR_ARG, "full: shape is NULL");
  em_tensor *r;
  em_status st = emi_tensor_new(S, "full", shape, ndim, dt, device, &r);
  if (st) return st;
  if ((st = EMI_DISPATCH(S, "full", r, fill, r, value))) { em_tensor_release(r); return st; }
  *out = r;
  return EM_OK;
}

/* The caller's buffer is wrapped, on the stack, as a contiguous CPU tensor of
** src_dt over a borrowed storage, so that the backend's copy does the
** conversion: no allocation besides the result. */
em_status em_from_data(em_state *S, const int64_t *shape, int ndim, em_dtype dt,
                       const void *data, em_dtype src_dt, em_tensor **out) {
  if (!shape && ndim > 0) return emi_error(S, EM_ERR_ARG, "from_data: shape is NULL");
  if ((unsigned)src_dt >= EM_NUM_DTYPES)
    return emi_error(S, EM_ERR_DTYPE, "from_data: invalid source dtype %d", (int)src_dt);
  em_tensor *r;
  /* the caller's buffer is host memory, so the tensor is a CPU one by contract */
  em_status st = emi_tensor_new(S, "from_data", shape, ndim, dt, EM_CPU, &r);
  if (st) return st;
  if (r->numel == 0) { *out = r; return EM_OK; }
  if (!data) {
    st = emi_error(S, EM_ERR_ARG, "from_data: data is NULL for a tensor of shape %s",
                   emi_tshape(S, r));
    em_tensor_release(r);
    return st;
  }
  emi_storage st_src = {1, EM_CPU, S, (void *)data, (size_t)r->numel * em_dtype_size(src_dt)};
  em_tensor src = *r;
  src.dtype = src_dt;
  src.storage = &st_src;
  src.offset = 0;
  /* a compiled step records no copy from the caller's buffer (it lives on no
  ** storage the program could hold): the tensor is a constant of the step */
  int capturing = em_compile_capturing(S);
  if (capturing) em_compile_pause(S, 1);
  st = EMI_DISPATCH(S, "from_data", r, copy, r, &src);
  if (capturing) em_compile_pause(S, 0);
  if (st) { em_tensor_release(r); return st; }
  *out = r;
  return EM_OK;
}

/*
** layout.c -- memory formats of 4-D tensors: NCHW (the default, contiguous) and
** NHWC ("channels last": same shape (N, C, H, W), strides (H*W*C, 1, W*C, C)).
**
** Two questions are asked of a tensor. em_tensor_is_channels_last is PyTorch's
** is_contiguous(memory_format=channels_last): size-1 dims are free, so an
** (N, 1, H, W) or (N, C, 1, 1) tensor can be both contiguous and channels last.
** emi_nhwc decides which layout an op's output takes: channels last, and not
** exactly the default strides, so that the ambiguous shapes follow how the tensor
** was made (to_channels_last of an (N, 1, H, W) image gives strides (HW, 1, W, 1),
** which differ from the default (HW, HW, W, 1) in the size-1 dim, as PyTorch's).
**
** Every copy that reorders a 4-D tensor between the two layouts goes through
** emi_layout_as: it runs as the op "convert_layout" (which the profiler records)
** and adds one to S->layout_conversions (em_layout_conversions), whether a user
** asked for it (to_channels_last, contiguous) or an op made it internally.
*/
#include "ewise.h"
#include "../autograd/autograd.h"

void emi_nhwc_strides(const int64_t *sizes, int64_t *strides) {
  int64_t C = sizes[1], H = sizes[2], W = sizes[3];
  strides[1] = 1;
  strides[3] = C;
  strides[2] = W * C;
  strides[0] = H * W * C;
}

int em_tensor_is_channels_last(const em_tensor *t) {
  if (t->ndim != 4) return 0;
  if (t->numel == 0) return 1;
  static const int order[4] = {1, 3, 2, 0};   /* innermost first */
  int64_t expect = 1;
  for (int i = 0; i < 4; i++) {
    int d = order[i];
    if (t->sizes[d] == 1) continue;
    if (t->strides[d] != expect) return 0;
    expect *= t->sizes[d];
  }
  return 1;
}

bool emi_nhwc(const em_tensor *t) {
  if (t->ndim != 4 || !em_tensor_is_channels_last(t)) return false;
  int64_t def[4];
  emi_contiguous_strides(t->sizes, 4, def);
  return memcmp(def, t->strides, sizeof def) != 0;
}

/* Exactly the strides to_channels_last gives (size-1 dims included). */
static bool exact_nhwc(const em_tensor *t) {
  int64_t s[4];
  emi_nhwc_strides(t->sizes, s);
  return t->ndim == 4 && memcmp(s, t->strides, sizeof s) == 0;
}

em_status emi_tensor_new_fmt(em_state *S, const char *op, const int64_t *sizes, int ndim,
                             em_dtype dt, int device, bool nhwc, em_tensor **out) {
  em_status st = emi_tensor_new(S, op, sizes, ndim, dt, device, out);
  if (st || !nhwc || ndim != 4) return st;
  emi_nhwc_strides(sizes, (*out)->strides);
  return EM_OK;
}

bool emi_result_nhwc(const int64_t *shape, int nd, const em_tensor *a, const em_tensor *b) {
  if (nd != 4) return false;
  const em_tensor *ops[2] = {a, b};
  for (int i = 0; i < 2; i++)
    if (ops[i] && ops[i]->ndim == 4 && !memcmp(ops[i]->sizes, shape, sizeof(int64_t) * 4))
      return emi_nhwc(ops[i]);
  return false;
}

/* t is in memory order nhwc already, densely (a kernel may take its data as is). */
static bool in_order(const em_tensor *t, bool nhwc) {
  if (nhwc) return t->ndim == 4 && em_tensor_is_channels_last(t);
  return em_tensor_is_contiguous(t);
}

em_status emi_layout_as(em_state *S, const char *op, const em_tensor *t, bool nhwc,
                        em_tensor **out) {
  if (in_order(t, nhwc)) {
    em_tensor_retain((em_tensor *)t);
    *out = (em_tensor *)t;
    return EM_OK;
  }
  /* a reorder between the two layouts is counted; any other copy is a plain one */
  bool reorder = t->ndim == 4 && (nhwc ? em_tensor_is_contiguous(t) : emi_nhwc(t));
  em_tensor *r;
  em_status st = emi_tensor_new_fmt(S, op, t->sizes, t->ndim, t->dtype, t->device, nhwc, &r);
  if (st) return st;
  if ((st = EMI_DISPATCH(S, reorder ? "convert_layout" : op, t, copy, r, t))) {
    em_tensor_release(r);
    return st;
  }
  if (reorder) __atomic_add_fetch(&S->layout_conversions, 1, __ATOMIC_RELAXED);
  *out = r;
  return EM_OK;
}

int64_t em_layout_conversions(em_state *S) {
  return __atomic_load_n(&S->layout_conversions, __ATOMIC_RELAXED);
}

em_status em_to_channels_last(em_state *S, const em_tensor *t, em_tensor **out) {
  const char *op = "to_channels_last";
  em_status st = emi_check_tensor(S, op, t);
  if (st) return st;
  if (t->ndim != 4)
    return emi_error(S, EM_ERR_SHAPE, "%s: tensor %s must have 4 dims (N,C,H,W)", op,
                     emi_tshape(S, t));
  if (!out) return emi_error(S, EM_ERR_ARG, "%s: out is NULL", op);
  if (exact_nhwc(t)) {
    em_tensor_retain((em_tensor *)t);
    *out = (em_tensor *)t;
    return EM_OK;
  }
  em_tensor *r;
  if ((st = emi_tensor_new_fmt(S, op, t->sizes, 4, t->dtype, t->device, true, &r)))
    return st;
  bool reorder = !em_tensor_is_channels_last(t);
  if ((st = EMI_DISPATCH(S, reorder ? "convert_layout" : op, t, copy, r, t))) {
    em_tensor_release(r);
    return st;
  }
  if (reorder) __atomic_add_fetch(&S->layout_conversions, 1, __ATOMIC_RELAXED);
  *out = r;
  if (emi_ag_wanted1(S, t)) return emi_ag_record_copy(S, "copy", t, out);
  return EM_OK;
}

/* contiguous() of a channels-last tensor: NCHW order, counted as a conversion. */
em_status emi_contiguous_from_nhwc(em_state *S, const em_tensor *t, em_tensor **out) {
  em_status st = emi_layout_as(S, "contiguous", t, false, out);
  if (st || !emi_ag_wanted1(S, t)) return st;
  return emi_ag_record_copy(S, "copy", t, out);
}

em_status em_tensor_set_memory_format_(em_state *S, em_tensor *t, int channels_last) {
  const char *op = "set_memory_format_";
  em_status st = emi_check_tensor(S, op, t);
  if (st) return st;
  if (t->ndim != 4) return EM_OK;   /* only 4-D tensors have the two orders */
  if (channels_last ? exact_nhwc(t) : em_tensor_is_contiguous(t)) return EM_OK;
  em_tensor *r;
  if (channels_last) {
    if ((st = emi_tensor_new_fmt(S, op, t->sizes, 4, t->dtype, t->device, true, &r)))
      return st;
    bool reorder = !em_tensor_is_channels_last(t);
    if ((st = EMI_DISPATCH(S, reorder ? "convert_layout" : op, t, copy, r, t))) {
      em_tensor_release(r);
      return st;
    }
    if (reorder) __atomic_add_fetch(&S->layout_conversions, 1, __ATOMIC_RELAXED);
  } else if ((st = emi_layout_as(S, op, t, false, &r))) {
    return st;
  }
  /* the handle keeps its identity (autograd flags, the host's references); only
  ** its storage and geometry change, as PyTorch's param.data = ... */
  emi_storage *old = t->storage;
  t->storage = r->storage;
  emi_atomic_inc(&t->storage->refcount);
  memcpy(t->strides, r->strides, sizeof(int64_t) * 4);
  t->offset = r->offset;
  emi_storage_release(old);
  em_tensor_release(r);
  return EM_OK;
}

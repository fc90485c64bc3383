/*
** elementwise.c -- the element-wise ops: unary, binary (tensor op tensor and
** tensor op Python number), a + alpha*b, clamp, where, fill_; out-of-place and
** in-place forms.
**
** Every op has two paths. The fast one covers what scripts do all the time --
** operands of one dtype and one shape -- and goes straight to the backend with
** no temporaries. The general one promotes dtypes (promote.c), converts operands
** whose dtype differs from the compute dtype into temporaries, expands them to
** the broadcast shape as stride-0 views, and releases every temporary on every
** exit. In-place forms write into their first operand: the result must be
** castable to its dtype (PyTorch's canCast), other operands must broadcast to its
** shape, and an operand overlapping it in memory is copied first unless it is
** exactly the same elements (a:add_(a) needs no copy, a:add_(a:t()) does).
*/
#include "ewise.h"
#include "../autograd/autograd.h"
#include <math.h>

/* -- Backend calls -----------------------------------------------------------------------
** One description per op family, so that the out-of-place and in-place drivers
** below are written once for all of them. */

typedef enum { K_UNARY, K_SCALAR, K_CLAMP } ukind;
typedef struct ucall {
  ukind kind;
  em_unop uop;
  em_binop bop;
  double s, s2;       /* scalar / clamp bounds */
  int reverse;
} ucall;

static em_status ucall_run(em_state *S, const char *op, const ucall *c, em_tensor *out,
                           const em_tensor *a) {
  switch (c->kind) {
  case K_UNARY: return EMI_DISPATCH(S, op, out, unary, c->uop, out, a);
  case K_SCALAR: return EMI_DISPATCH(S, op, out, binary_scalar, c->bop, out, a, c->s, c->reverse);
  default: return EMI_DISPATCH(S, op, out, clamp, out, a, c->s, c->s2);
  }
}

typedef struct bcall {
  int add_scaled;     /* a + alpha*b instead of op */
  em_binop op;
  double alpha;
} bcall;

static em_status bcall_run(em_state *S, const char *op, const bcall *c, em_tensor *out,
                           const em_tensor *a, const em_tensor *b) {
  return c->add_scaled ? EMI_DISPATCH(S, op, out, add_scaled, out, a, b, c->alpha)
                       : EMI_DISPATCH(S, op, out, binary, c->op, out, a, b);
}

static int same_shape(const em_tensor *a, const em_tensor *b) {
  return a->ndim == b->ndim &&
         memcmp(a->sizes, b->sizes, sizeof *a->sizes * (size_t)a->ndim) == 0;
}

static em_status check_inplace_target(em_state *S, const char *op, const em_tensor *a) {
  if (!emi_internal_overlap(a)) return EM_OK;
  return emi_error(S, EM_ERR_ARG, "%s: can't write in place into a tensor of shape %s "
                   "whose elements share memory (an expanded view); clone it first",
                   op, emi_tshape(S, a));
}

/* -- One-input drivers ------------------------------------------------------------------------ */

/* out = f(a) with a converted to ct and the result of dtype rt. */
static em_status unary_like(em_state *S, const char *op, const ucall *c,
                            const em_tensor *a, em_dtype ct, em_dtype rt,
                            em_tensor **out) {
  emi_temps tp;
  emi_temps_init(&tp);
  em_tensor *r = NULL;
  const em_tensor *ac = a;
  em_status st = EM_OK;
  if ((st = emi_as_dtype(S, op, a, ct, &tp, &ac))) goto done;
  if ((st = emi_tensor_new_fmt(S, op, a->sizes, a->ndim, rt, a->device, emi_nhwc(a), &r))) goto done;
  if ((st = ucall_run(S, op, c, r, ac))) { em_tensor_release(r); goto done; }
  *out = r;
done:
  emi_temps_release(&tp);
  return st;
}

/* a = f(a), cast to a's dtype. */
static em_status unary_like_(em_state *S, const char *op, const ucall *c, em_tensor *a,
                             em_dtype ct, em_dtype rt) {
  if (!emi_can_cast(rt, a->dtype)) return emi_cast_error(S, op, rt, a->dtype);
  em_status st = check_inplace_target(S, op, a);
  if (st || (st = emi_ag_inplace(S, op, a))) return st;
  if (ct == a->dtype && rt == a->dtype) return ucall_run(S, op, c, a, a);
  emi_temps tp;
  emi_temps_init(&tp);
  em_tensor *r;
  const em_tensor *ac = a;
  if ((st = emi_as_dtype(S, op, a, ct, &tp, &ac))) goto done;
  if (rt == a->dtype) {
    st = ucall_run(S, op, c, a, ac);
  } else {
    if ((st = emi_tensor_new_fmt(S, op, a->sizes, a->ndim, rt, a->device, emi_nhwc(a), &r))) goto done;
    emi_temps_add(&tp, r);
    if (!(st = ucall_run(S, op, c, r, ac)))
      st = EMI_DISPATCH(S, op, a, copy, a, r);
  }
done:
  emi_temps_release(&tp);
  return st;
}

/* -- Two-input drivers ------------------------------------------------------------------------- */

/* The dtypes of a binary-like op; add_scaled also checks alpha (PyTorch refuses a
** fractional alpha for integer and bool results). */
static em_status bcall_dtypes(em_state *S, const char *op, const bcall *c,
                              em_dtype da, em_dtype db, em_dtype pt, em_dtype *ct,
                              em_dtype *rt) {
  em_status st = emi_binop_dtypes(S, op, c->add_scaled ? EM_ADD : c->op, da, db, pt, ct, rt);
  if (st || !c->add_scaled || em_dtype_is_floating(*ct)) return st;
  if (!isfinite(c->alpha) || c->alpha != floor(c->alpha))
    return emi_error(S, EM_ERR_ARG, "%s: alpha must be an integer for %s tensors (got %g)",
                     op, em_dtype_name(*ct), c->alpha);
  return EM_OK;
}

static em_status binary_like(em_state *S, const char *op, const bcall *c,
                             const em_tensor *a, const em_tensor *b, em_tensor **out) {
  em_status st;
  if ((st = emi_check_tensor(S, op, a)) || (st = emi_check_tensor(S, op, b)) ||
      (st = emi_check_devices(S, op, a, b)))
    return st;
  em_dtype ct, rt, pt = emi_promote_tensors(a, b);
  if ((st = bcall_dtypes(S, op, c, a->dtype, b->dtype, pt, &ct, &rt))) return st;
  em_tensor *r;
  /* fast path: one dtype, one shape -- no temporaries */
  if (a->dtype == ct && b->dtype == ct && same_shape(a, b)) {
    if ((st = emi_tensor_new_fmt(S, op, a->sizes, a->ndim, rt, a->device, emi_nhwc(a), &r))) return st;
    if ((st = bcall_run(S, op, c, r, a, b))) { em_tensor_release(r); return st; }
    *out = r;
    return EM_OK;
  }
  int64_t shape[EM_MAX_DIMS];
  int nd;
  if ((st = emi_broadcast_shape(S, op, a->sizes, a->ndim, b->sizes, b->ndim, shape, &nd)))
    return st;
  emi_temps tp;
  emi_temps_init(&tp);
  const em_tensor *ax = a, *bx = b;
  r = NULL;
  if ((st = emi_as_dtype(S, op, a, ct, &tp, &ax))) goto done;
  if ((st = emi_as_dtype(S, op, b, ct, &tp, &bx))) goto done;
  if ((st = emi_expand_tmp(S, op, ax, shape, nd, &tp, &ax)) ||
      (st = emi_expand_tmp(S, op, bx, shape, nd, &tp, &bx)) ||
      (st = emi_tensor_new_fmt(S, op, shape, nd, rt, a->device,
                                 emi_result_nhwc(shape, nd, a, b), &r)))
    goto done;
  if ((st = bcall_run(S, op, c, r, ax, bx))) { em_tensor_release(r); goto done; }
  *out = r;
done:
  emi_temps_release(&tp);
  return st;
}

/* b broadcasts to a's shape (not the other way round: a can't grow in place). */
static em_status check_broadcast_to(em_state *S, const char *op, const em_tensor *b,
                                    const em_tensor *a) {
  int ok = b->ndim <= a->ndim;
  for (int i = 0; ok && i < b->ndim; i++) {
    int64_t x = b->sizes[b->ndim - 1 - i], y = a->sizes[a->ndim - 1 - i];
    ok = x == y || x == 1;
  }
  if (ok) return EM_OK;
  return emi_error(S, EM_ERR_SHAPE, "%s: shape %s can't be broadcast to the shape %s of "
                   "the tensor written in place", op, emi_tshape(S, b), emi_tshape(S, a));
}

static em_status binary_like_(em_state *S, const char *op, const bcall *c, em_tensor *a,
                              const em_tensor *b) {
  em_status st;
  if ((st = emi_check_tensor(S, op, a)) || (st = emi_check_tensor(S, op, b)) ||
      (st = emi_check_devices(S, op, a, b)))
    return st;
  em_dtype ct, rt, pt = emi_promote_tensors(a, b);
  if ((st = bcall_dtypes(S, op, c, a->dtype, b->dtype, pt, &ct, &rt))) return st;
  if (!emi_can_cast(rt, a->dtype)) return emi_cast_error(S, op, rt, a->dtype);
  if ((st = check_broadcast_to(S, op, b, a)) || (st = check_inplace_target(S, op, a)) ||
      (st = emi_ag_inplace(S, op, a)))
    return st;
  /* fast path: same dtype and shape, b not overlapping a (or exactly a) */
  if (a->dtype == ct && b->dtype == ct && rt == ct && same_shape(a, b) &&
      !emi_needs_copy(a, b))
    return bcall_run(S, op, c, a, a, b);
  emi_temps tp;
  emi_temps_init(&tp);
  const em_tensor *ax = a, *bx = b;
  em_tensor *conv, *r;
  /* a converted copy of b is fresh memory, which also settles any overlap */
  if (b->dtype != ct || emi_needs_copy(a, b)) {
    if ((st = emi_convert(S, op, b, ct, &tp, &conv))) goto done;
    bx = conv;
  }
  if ((st = emi_as_dtype(S, op, a, ct, &tp, &ax))) goto done;
  if ((st = emi_expand_tmp(S, op, bx, a->sizes, a->ndim, &tp, &bx))) goto done;
  if (rt == a->dtype) {
    st = bcall_run(S, op, c, a, ax, bx);
  } else {
    if ((st = emi_tensor_new_fmt(S, op, a->sizes, a->ndim, rt, a->device, emi_nhwc(a), &r))) goto done;
    emi_temps_add(&tp, r);
    if (!(st = bcall_run(S, op, c, r, ax, bx)))
      st = EMI_DISPATCH(S, op, a, copy, a, r);
  }
done:
  emi_temps_release(&tp);
  return st;
}

/* -- Unary ------------------------------------------------------------------------------------ */

static em_status check_unop(em_state *S, em_unop op) {
  if ((unsigned)op < EM_NUM_UNOPS) return EM_OK;
  return emi_error(S, EM_ERR_ARG, "unary: invalid op %d", (int)op);
}

em_status em_unary(em_state *S, em_unop op, const em_tensor *a, em_tensor **out) {
  if (check_unop(S, op)) return EM_ERR_ARG;
  const char *name = em_unop_name(op);
  em_dtype ct, rt;
  em_status st = emi_check_tensor(S, name, a);
  if (st || (st = emi_unop_dtypes(S, name, op, a->dtype, &ct, &rt))) return st;
  ucall c = {K_UNARY, op, EM_ADD, 0, 0, 0};
  st = unary_like(S, name, &c, a, ct, rt, out);
  if (emi_ag_wanted1(S, a) && !st) st = emi_ag_record_unary(S, op, a, out);
  return st;
}

em_status em_unary_(em_state *S, em_unop op, em_tensor *a) {
  if (check_unop(S, op)) return EM_ERR_ARG;
  const char *name = emi_unop_name_(op);
  em_dtype ct, rt;
  em_status st = emi_check_tensor(S, name, a);
  if (st || (st = emi_unop_dtypes(S, name, op, a->dtype, &ct, &rt))) return st;
  ucall c = {K_UNARY, op, EM_ADD, 0, 0, 0};
  return unary_like_(S, name, &c, a, ct, rt);
}

/* -- Binary ------------------------------------------------------------------------------------ */

static em_status check_binop(em_state *S, em_binop op) {
  if ((unsigned)op < EM_NUM_BINOPS) return EM_OK;
  return emi_error(S, EM_ERR_ARG, "binary: invalid op %d", (int)op);
}

em_status em_binary(em_state *S, em_binop op, const em_tensor *a, const em_tensor *b,
                    em_tensor **out) {
  em_status st = check_binop(S, op);
  if (st) return st;
  bcall c = {0, op, 0};
  st = binary_like(S, em_binop_name(op), &c, a, b, out);
  if (!st && emi_ag_wanted2(S, a, b)) st = emi_ag_record_binary(S, op, a, b, out);
  return st;
}

em_status em_binary_(em_state *S, em_binop op, em_tensor *a, const em_tensor *b) {
  em_status st = check_binop(S, op);
  if (st) return st;
  bcall c = {0, op, 0};
  return binary_like_(S, emi_binop_name_(op), &c, a, b);
}

em_status em_add_scaled(em_state *S, const em_tensor *a, const em_tensor *b,
                        double alpha, em_tensor **out) {
  bcall c = {1, EM_ADD, alpha};
  em_status st = binary_like(S, "add", &c, a, b, out);
  if (!st && emi_ag_wanted2(S, a, b)) st = emi_ag_record_add_scaled(S, a, b, alpha, out);
  return st;
}

em_status em_add_scaled_(em_state *S, em_tensor *a, const em_tensor *b, double alpha) {
  bcall c = {1, EM_ADD, alpha};
  return binary_like_(S, "add_", &c, a, b);
}

/* -- Tensor op Python number --------------------------------------------------------------------- */

static em_status scalar_dtypes(em_state *S, const char *op, em_binop bop,
                               const em_tensor *a, double s, int reverse, em_dtype *ct,
                               em_dtype *rt) {
  em_status st = emi_check_tensor(S, op, a);
  if (st) return st;
  em_dtype sd = emi_scalar_dtype(s), pt = emi_promote_scalar(a->dtype, s);
  if ((st = emi_binop_dtypes(S, op, bop, reverse ? sd : a->dtype, reverse ? a->dtype : sd,
                             pt, ct, rt)))
    return st;
  if (em_dtype_is_floating(*ct) || reverse) return EM_OK;
  if (bop == EM_POW && s < 0)
    return emi_error(S, EM_ERR_ARG, "%s: integers to negative integer powers are not "
                     "allowed (%s tensor, exponent %g)", op, em_dtype_name(*ct), s);
  if (bop == EM_REMAINDER && s == 0)
    return emi_error(S, EM_ERR_ARG, "%s: integer division by zero", op);
  return EM_OK;
}

em_status em_binary_scalar(em_state *S, em_binop op, const em_tensor *a, double s,
                           int reverse, em_tensor **out) {
  em_status st = check_binop(S, op);
  if (st) return st;
  const char *name = em_binop_name(op);
  em_dtype ct, rt;
  if ((st = scalar_dtypes(S, name, op, a, s, reverse, &ct, &rt))) return st;
  ucall c = {K_SCALAR, EM_NEG, op, s, 0, reverse};
  st = unary_like(S, name, &c, a, ct, rt, out);
  if (emi_ag_wanted1(S, a) && !st) st = emi_ag_record_scalar(S, op, a, s, reverse, out);
  return st;
}

em_status em_binary_scalar_(em_state *S, em_binop op, em_tensor *a, double s) {
  em_status st = check_binop(S, op);
  if (st) return st;
  const char *name = emi_binop_name_(op);
  em_dtype ct, rt;
  if ((st = scalar_dtypes(S, name, op, a, s, 0, &ct, &rt))) return st;
  ucall c = {K_SCALAR, EM_NEG, op, s, 0, 0};
  return unary_like_(S, name, &c, a, ct, rt);
}

/* -- clamp, where, fill_ ---------------------------------------------------------------------------- */

/* The result keeps a's dtype (bounds are converted to it by the kernel). */
em_status em_clamp(em_state *S, const em_tensor *a, double lo, double hi,
                   em_tensor **out) {
  em_status st = emi_check_tensor(S, "clamp", a);
  if (st) return st;
  ucall c = {K_CLAMP, EM_NEG, EM_ADD, lo, hi, 0};
  st = unary_like(S, "clamp", &c, a, a->dtype, a->dtype, out);
  if (emi_ag_wanted1(S, a) && !st) st = emi_ag_record_clamp(S, a, lo, hi, out);
  return st;
}

em_status em_clamp_(em_state *S, em_tensor *a, double lo, double hi) {
  em_status st = emi_check_tensor(S, "clamp_", a);
  if (st) return st;
  ucall c = {K_CLAMP, EM_NEG, EM_ADD, lo, hi, 0};
  return unary_like_(S, "clamp_", &c, a, a->dtype, a->dtype);
}

em_status em_where(em_state *S, const em_tensor *cond, const em_tensor *a,
                   const em_tensor *b, em_tensor **out) {
  const char *op = "where";
  em_status st;
  if ((st = emi_check_tensor(S, op, cond)) || (st = emi_check_tensor(S, op, a)) ||
      (st = emi_check_tensor(S, op, b)) || (st = emi_check_devices(S, op, cond, a)) ||
      (st = emi_check_devices(S, op, a, b)))
    return st;
  if (cond->dtype != EM_BOOL && cond->dtype != EM_UINT8)
    return emi_error(S, EM_ERR_DTYPE, "where: the condition must be a bool tensor, got %s",
                     em_dtype_name(cond->dtype));
  int64_t s1[EM_MAX_DIMS], shape[EM_MAX_DIMS];
  int n1, nd;
  if ((st = emi_broadcast_shape(S, op, a->sizes, a->ndim, b->sizes, b->ndim, s1, &n1)) ||
      (st = emi_broadcast_shape(S, op, cond->sizes, cond->ndim, s1, n1, shape, &nd)))
    return st;
  em_dtype ct = emi_promote_tensors(a, b);
  emi_temps tp;
  emi_temps_init(&tp);
  const em_tensor *cx = cond, *ax = a, *bx = b;
  em_tensor *r = NULL;
  if ((st = emi_as_dtype(S, op, cond, EM_BOOL, &tp, &cx))) goto done;
  if ((st = emi_as_dtype(S, op, a, ct, &tp, &ax))) goto done;
  if ((st = emi_as_dtype(S, op, b, ct, &tp, &bx))) goto done;
  if ((st = emi_expand_tmp(S, op, cx, shape, nd, &tp, &cx)) ||
      (st = emi_expand_tmp(S, op, ax, shape, nd, &tp, &ax)) ||
      (st = emi_expand_tmp(S, op, bx, shape, nd, &tp, &bx)) ||
      (st = emi_tensor_new_fmt(S, op, shape, nd, ct, a->device,
                                 emi_result_nhwc(shape, nd, a, b), &r)))
    goto done;
  if ((st = EMI_DISPATCH(S, op, r, where, r, cx, ax, bx))) {
    em_tensor_release(r);
    goto done;
  }
  *out = r;
  if (emi_ag_wanted2(S, a, b)) st = emi_ag_record_where(S, cond, a, b, out);
done:
  emi_temps_release(&tp);
  return st;
}

/* Filling an expanded view writes one value to shared locations: harmless, so
** allowed (unlike arithmetic in place). */
em_status em_fill_(em_state *S, em_tensor *t, double value) {
  em_status st = emi_check_tensor(S, "fill_", t);
  if (st || (st = emi_ag_inplace(S, "fill_", t))) return st;
  return EMI_DISPATCH(S, "fill_", t, fill, t, value);
}

/*
** formula.c -- the emi_f helpers backward formulas are written with: public ops
** chained through one context that keeps every intermediate and the first
** error, so a formula reads like math and still leaks nothing on failure.
*/
#include "autograd.h"

void emi_f_init(emi_f *f, em_state *S) {
  f->S = S;
  f->st = EM_OK;
  f->n = 0;
}

em_tensor *emi_f_keep(emi_f *f, em_status st, em_tensor **tp) {
  em_tensor *t = *tp;
  if (st) { if (!f->st) f->st = st; return NULL; }
  if (f->n == EMI_F_MAX) {
    em_tensor_release(t);
    f->st = emi_error(f->S, EM_ERR_INTERNAL, "backward: formula too long");
    return NULL;
  }
  f->t[f->n++] = t;
  return t;
}

#define F_GUARD(...) do { if (f->st || __VA_ARGS__) return NULL; } while (0)

em_tensor *emi_f_un(emi_f *f, em_unop op, const em_tensor *a) {
  F_GUARD(!a);
  em_tensor *r = NULL;
  em_status st = em_unary(f->S, op, a, &r);
  return emi_f_keep(f, st, &r);
}

em_tensor *emi_f_bin(emi_f *f, em_binop op, const em_tensor *a, const em_tensor *b) {
  F_GUARD(!a || !b);
  em_tensor *r = NULL;
  em_status st = em_binary(f->S, op, a, b, &r);
  return emi_f_keep(f, st, &r);
}

em_tensor *emi_f_sc(emi_f *f, em_binop op, const em_tensor *a, double s) {
  F_GUARD(!a);
  em_tensor *r = NULL;
  em_status st = em_binary_scalar(f->S, op, a, s, 0, &r);
  return emi_f_keep(f, st, &r);
}

em_tensor *emi_f_rsc(emi_f *f, em_binop op, double s, const em_tensor *a) {
  F_GUARD(!a);
  em_tensor *r = NULL;
  em_status st = em_binary_scalar(f->S, op, a, s, 1, &r);
  return emi_f_keep(f, st, &r);
}

em_tensor *emi_f_zeros(emi_f *f, const int64_t *sizes, int ndim, em_dtype dt, int device) {
  F_GUARD(0);
  em_tensor *r = NULL;
  em_status st = em_full(f->S, sizes, ndim, 0.0, dt, device, &r);
  return emi_f_keep(f, st, &r);
}

em_tensor *emi_f_reshape(emi_f *f, const em_tensor *a, const int64_t *sizes, int ndim) {
  F_GUARD(!a);
  em_tensor *r = NULL;
  em_status st = em_reshape(f->S, a, sizes, ndim, &r);
  return emi_f_keep(f, st, &r);
}

em_tensor *emi_f_unreduce(emi_f *f, const em_tensor *g, unsigned mask, int keepdim,
                          const int64_t *sizes, int ndim) {
  F_GUARD(!g);
  int64_t kept[EM_MAX_DIMS];
  for (int d = 0; d < ndim; d++) kept[d] = mask & (1u << d) ? 1 : sizes[d];
  const em_tensor *k = keepdim ? g : emi_f_reshape(f, g, kept, ndim);
  F_GUARD(!k);
  em_tensor *r = NULL;
  em_status st = em_expand(f->S, k, sizes, ndim, &r);
  return emi_f_keep(f, st, &r);
}

em_status emi_f_end(emi_f *f, em_tensor *r, em_tensor **out) {
  em_status st = f->st;
  if (!st && r) {
    em_tensor_retain(r);
    *out = r;
  } else if (!st) {
    st = emi_error(f->S, EM_ERR_INTERNAL, "backward: formula produced no tensor");
  }
  while (f->n > 0) em_tensor_release(f->t[--f->n]);
  return st;
}

void emi_f_out(emi_f *f, em_tensor *t, em_tensor **slot) {
  if (f->st) return;
  if (!t) { f->st = emi_error(f->S, EM_ERR_INTERNAL, "backward: formula produced no tensor"); return; }
  em_tensor_retain(t);
  *slot = t;
}

em_status emi_f_done(emi_f *f) {
  while (f->n > 0) em_tensor_release(f->t[--f->n]);
  return f->st;
}

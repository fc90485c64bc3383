/*
** grad_linalg.c -- recording and backward of matmul: dA = dC B^T, dB = A^T dC on
** the operands promoted to matrices (1-D operands gain the dim numpy adds, and
** lose it again); batch broadcasting is summed back by the engine.
*/
#include "autograd.h"

static em_tensor *f_unsq(emi_f *f, const em_tensor *a, int dim) {
  if (f->st || !a) return NULL;
  em_tensor *r = NULL;
  em_status st = em_unsqueeze(f->S, a, dim, &r);
  return emi_f_keep(f, st, &r);
}
static em_tensor *f_sq(emi_f *f, const em_tensor *a, int dim) {
  if (f->st || !a) return NULL;
  em_tensor *r = NULL;
  em_status st = em_squeeze(f->S, a, dim, 0, &r);
  return emi_f_keep(f, st, &r);
}
static em_tensor *f_mT(emi_f *f, const em_tensor *a) {
  if (f->st || !a) return NULL;
  em_tensor *r = NULL;
  em_status st = em_transpose(f->S, a, -1, -2, &r);
  return emi_f_keep(f, st, &r);
}
static em_tensor *f_mm(emi_f *f, const em_tensor *a, const em_tensor *b) {
  if (f->st || !a || !b) return NULL;
  em_tensor *r = NULL;
  em_status st = em_matmul(f->S, a, b, &r);
  return emi_f_keep(f, st, &r);
}

static em_status matmul_backward(em_state *S, emi_ag_node *n, const em_tensor *g,
                                 em_tensor **gin) {
  em_tensor *a, *b;
  em_status st;
  if ((st = emi_ag_saved(S, n, 0, &a)) || (st = emi_ag_saved(S, n, 1, &b))) return st;
  emi_f F, *f = &F;
  emi_f_init(f, S);
  int a1 = a->ndim == 1, b1 = b->ndim == 1;
  em_tensor *a2 = a1 ? f_unsq(f, a, 0) : a, *b2 = b1 ? f_unsq(f, b, 1) : b;
  em_tensor *g2 = (em_tensor *)g;
  if (a1) g2 = f_unsq(f, g2, g2 ? g2->ndim - (b1 ? 0 : 1) : 0);
  if (b1) g2 = f_unsq(f, g2, g2 ? g2->ndim : 0);
  if (emi_ag_needs(n, 0)) {
    em_tensor *ga = f_mm(f, g2, f_mT(f, b2));
    if (a1) ga = f_sq(f, ga, ga ? ga->ndim - 2 : 0);
    emi_f_out(f, ga, &gin[0]);
  }
  if (emi_ag_needs(n, 1)) {
    em_tensor *gb = f_mm(f, f_mT(f, a2), g2);
    if (b1) gb = f_sq(f, gb, gb ? gb->ndim - 1 : 0);
    emi_f_out(f, gb, &gin[1]);
  }
  return emi_f_done(f);
}

em_status emi_ag_record_matmul(em_state *S, const em_tensor *a, const em_tensor *b,
                               em_tensor **out) {
  if (!em_dtype_is_floating((*out)->dtype)) return EM_OK;
  const em_tensor *in[2] = {a, b};
  emi_ag_node *n;
  em_status st = emi_ag_node_new(S, "matmul", matmul_backward, *out, in, 2, &n);
  if (st || (st = emi_ag_save(S, n, a)) || (st = emi_ag_save(S, n, b)))
    return emi_ag_fail(out, st);
  return EM_OK;
}

/*
** grad_scan.c -- recording and backward of the scans cumsum and cumprod.
**
** cumsum's gradient is g summed from the end of the line: g - cumsum(g) + sum(g).
** cumprod's, dx_i = sum over j >= i of g_j * prod_{k <= j, k != i} x_k, is split
** at each line's first zero z (none: z past the end):
**   i < z:  the reversed sum of g * y, divided by x_i (y the saved output);
**   i = z:  the reversed sum of g * y', y' the cumprod of x with x_z set to 1;
**   i > z:  0 (every product that holds x_i also holds x_z = 0).
** All of it is element-wise ops, where and scans, so it runs on every backend.
*/
#include "autograd.h"

/* g summed from the end of each line along dim: g - cumsum(g) + sum(g). */
static em_tensor *f_reverse_cumsum(emi_f *f, const em_tensor *g, int dim) {
  if (f->st || !g) return NULL;
  em_tensor *c = NULL, *s = NULL;
  c = emi_f_keep(f, em_cumsum(f->S, g, dim, &c), &c);
  if (!c) return NULL;
  s = emi_f_keep(f, em_reduce(f->S, EM_SUM, g, &dim, 1, 1, &s), &s);
  return emi_f_bin(f, EM_ADD, emi_f_bin(f, EM_SUB, g, c), s);
}

static em_tensor *f_cumsum(emi_f *f, const em_tensor *a, int dim) {
  if (f->st || !a) return NULL;
  em_tensor *r = NULL;
  return emi_f_keep(f, em_cumsum(f->S, a, dim, &r), &r);
}

static em_tensor *f_where(emi_f *f, const em_tensor *cond, const em_tensor *a,
                          const em_tensor *b) {
  if (f->st || !cond || !a || !b) return NULL;
  em_tensor *r = NULL;
  return emi_f_keep(f, em_where(f->S, cond, a, b, &r), &r);
}

static em_tensor *f_scalar(emi_f *f, double v, const em_tensor *like) {
  if (f->st) return NULL;
  em_tensor *r = NULL;
  return emi_f_keep(f, em_full(f->S, NULL, 0, v, like->dtype, like->device, &r), &r);
}

static em_tensor *cumprod_grad(emi_f *f, const em_tensor *g, const em_tensor *x,
                               const em_tensor *y, int dim) {
  em_tensor *zero = emi_f_sc(f, EM_EQ, x, 0);
  em_tensor *seen = f_cumsum(f, zero, dim);              /* zeros up to here (int64) */
  em_tensor *before = emi_f_sc(f, EM_EQ, seen, 0);
  em_tensor *first = emi_f_bin(f, EM_LOGICAL_AND, zero, emi_f_sc(f, EM_EQ, seen, 1));
  em_tensor *one = f_scalar(f, 1, x), *nil = f_scalar(f, 0, x);
  /* i < z: x is non-zero there, and 1 stands in elsewhere so nothing divides by 0 */
  em_tensor *x_safe = f_where(f, before, x, one);
  em_tensor *head = emi_f_bin(f, EM_DIV, f_reverse_cumsum(f, emi_f_bin(f, EM_MUL, g, y), dim),
                              x_safe);
  /* i = z */
  em_tensor *y1 = NULL, *x1 = f_where(f, first, one, x);
  if (!f->st) y1 = emi_f_keep(f, em_cumprod(f->S, x1, dim, &y1), &y1);
  em_tensor *at_zero = f_reverse_cumsum(f, emi_f_bin(f, EM_MUL, g, y1), dim);
  return f_where(f, before, head, f_where(f, first, at_zero, nil));
}

static em_status scan_backward(em_state *S, emi_ag_node *n, const em_tensor *g,
                               em_tensor **gin) {
  int dim = (int)n->iarg[0];
  if (n->in[0].ndim == 0) return em_clone(S, g, &gin[0]);   /* one element: dy/dx = 1 */
  emi_f F, *f = &F;
  emi_f_init(f, S);
  em_tensor *r;
  if (n->op == EMI_SCAN_SUM) {
    r = f_reverse_cumsum(f, g, dim);
  } else {
    em_tensor *x, *y;
    em_status st = emi_ag_saved(S, n, 0, &x);
    if (st || (st = emi_ag_saved(S, n, 1, &y))) return st;
    r = cumprod_grad(f, g, x, y, dim);
  }
  return emi_f_end(f, r, &gin[0]);
}

em_status emi_ag_record_scan(em_state *S, int op, const em_tensor *a, int dim,
                             em_tensor **out) {
  const em_tensor *in[1] = {a};
  emi_ag_node *n;
  em_status st = emi_ag_node_new(S, op == EMI_SCAN_SUM ? "cumsum" : "cumprod", scan_backward,
                                 *out, in, 1, &n);
  if (st) return emi_ag_fail(out, st);
  n->op = op;
  n->iarg[0] = dim;
  if (op == EMI_SCAN_PROD && ((st = emi_ag_save(S, n, a)) || (st = emi_ag_save(S, n, *out))))
    return emi_ag_fail(out, st);
  return EM_OK;
}

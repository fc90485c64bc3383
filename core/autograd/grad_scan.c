/*
** grad_scan.c -- recording and backward of the scans cumsum and cumprod.
**
** cumsum's gradient is g summed from the end: g - cumsum(g) + sum(g), on the
** same line. cumprod's, for an input with no zero on the line, is that reversed
** sum of g * y divided by x (y the saved output). A zero input makes the
** division undefined there: its gradient is left as the formula gives it
** (inf or NaN), where PyTorch works the products around the zero.
*/
#include "autograd.h"

/* g summed from the end of each line along dim: g - cumsum(g) + sum(g). */
static em_tensor *f_reverse_cumsum(emi_f *f, const em_tensor *g, int dim) {
  em_tensor *c = NULL, *s = NULL;
  c = emi_f_keep(f, f->st ? f->st : em_cumsum(f->S, g, dim, &c), &c);
  s = emi_f_keep(f, f->st ? f->st : em_reduce(f->S, EM_SUM, g, &dim, 1, 1, &s), &s);
  return emi_f_bin(f, EM_ADD, emi_f_bin(f, EM_SUB, g, c), s);
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
    r = emi_f_bin(f, EM_DIV, f_reverse_cumsum(f, emi_f_bin(f, EM_MUL, g, y), dim), x);
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

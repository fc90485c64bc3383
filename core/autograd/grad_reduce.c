/*
** grad_reduce.c -- recording and backward of the reductions (sum mean prod amax
** amin logsumexp, var/std, norm, max/min along a dim) and of softmax and
** log_softmax. Reduced gradients are broadcast back with emi_f_unreduce.
*/
#include "autograd.h"
#include <math.h>

/* iarg[0] = mask of reduced dims, iarg[1] = keepdim; darg as each op needs. */
static em_status record(em_state *S, const char *name, emi_ag_fn fn, int op,
                        const em_tensor *a, unsigned mask, int keepdim, int save,
                        em_tensor **out, emi_ag_node **node) {
  if (!em_dtype_is_floating((*out)->dtype)) return EM_OK;
  const em_tensor *in[1] = {a};
  emi_ag_node *n;
  em_status st = emi_ag_node_new(S, name, fn, *out, in, 1, &n);
  if (st || (save && ((st = emi_ag_save(S, n, a)) || (st = emi_ag_save(S, n, *out)))))
    return emi_ag_fail(out, st);
  n->op = op;
  n->iarg[0] = mask;
  n->iarg[1] = keepdim;
  if (node) *node = n;
  return EM_OK;
}

static double count_of(const emi_ag_edge *e, unsigned mask) {
  double c = 1;
  for (int d = 0; d < e->ndim; d++) if (mask >> d & 1) c *= (double)e->sizes[d];
  return c;
}

static int mask_dims(unsigned mask, int ndim, int *dims) {
  int n = 0;
  for (int d = 0; d < ndim; d++) if (mask >> d & 1) dims[n++] = d;
  return n;
}

/* sum over mask, keepdim, expanded back to the edge's shape */
static em_tensor *f_sum_back(emi_f *f, const em_tensor *t, unsigned mask, const emi_ag_edge *e) {
  if (f->st || !t) return NULL;
  int dims[EM_MAX_DIMS], nd = mask_dims(mask, e->ndim, dims);
  em_tensor *r = NULL;
  if (nd == 0) return (em_tensor *)t;
  emi_f_keep(f, em_reduce(f->S, EM_SUM, t, dims, nd, 1, &r), &r);
  return emi_f_unreduce(f, r, mask, 1, e->sizes, e->ndim);
}

static em_status reduce_backward(em_state *S, emi_ag_node *n, const em_tensor *g,
                                 em_tensor **gin) {
  em_tensor *x = NULL, *y = NULL;
  em_status st;
  if (n->nsaved && ((st = emi_ag_saved(S, n, 0, &x)) || (st = emi_ag_saved(S, n, 1, &y))))
    return st;
  const emi_ag_edge *e = &n->in[0];
  unsigned mask = (unsigned)n->iarg[0];
  int keep = (int)n->iarg[1];
  emi_f F, *f = &F;
  emi_f_init(f, S);
  em_tensor *gE = emi_f_unreduce(f, g, mask, keep, e->sizes, e->ndim), *r = NULL;
  em_tensor *yE = y ? emi_f_unreduce(f, y, mask, keep, e->sizes, e->ndim) : NULL;
  switch ((em_redop)n->op) {
  case EM_SUM: r = gE; break;
  case EM_MEAN: r = emi_f_sc(f, EM_DIV, gE, count_of(e, mask)); break;
  case EM_PROD: r = emi_f_bin(f, EM_MUL, gE, emi_f_bin(f, EM_DIV, yE, x)); break;
  case EM_AMAX: case EM_AMIN: {   /* ties share the gradient evenly */
    em_tensor *hit = emi_f_bin(f, EM_EQ, x, yE);
    em_tensor *hf = emi_f_sc(f, EM_MUL, hit, 1.0);
    if (hf && hf->dtype != g->dtype) {
      em_tensor *c = NULL;
      emi_f_keep(f, em_to(S, hf, g->dtype, g->device, &c), &c);
      hf = c;
    }
    r = emi_f_bin(f, EM_DIV, emi_f_bin(f, EM_MUL, gE, hf), f_sum_back(f, hf, mask, e));
    break;
  }
  case EM_LOGSUMEXP: r = emi_f_bin(f, EM_MUL, gE, emi_f_un(f, EM_EXP, emi_f_bin(f, EM_SUB, x, yE))); break;
  default:
    f->st = emi_error(S, EM_ERR_UNSUPPORTED, "backward: reduction %d is not differentiable", n->op);
  }
  return emi_f_end(f, r, &gin[0]);
}

em_status emi_ag_record_reduce(em_state *S, em_redop op, const em_tensor *a, unsigned mask,
                               int keepdim, em_tensor **out) {
  static const char *names[] = {"sum", "mean", "prod", "amax", "amin", "logsumexp"};
  if ((int)op > EM_LOGSUMEXP) return EM_OK;
  return record(S, names[op], reduce_backward, op, a, mask, keepdim,
                op != EM_SUM && op != EM_MEAN, out, NULL);
}

/* var: 2 (x - mean) / (N - correction); std: that / (2 std) */
static em_status var_backward(em_state *S, emi_ag_node *n, const em_tensor *g,
                              em_tensor **gin) {
  em_tensor *x, *y;
  em_status st;
  if ((st = emi_ag_saved(S, n, 0, &x)) || (st = emi_ag_saved(S, n, 1, &y))) return st;
  const emi_ag_edge *e = &n->in[0];
  unsigned mask = (unsigned)n->iarg[0];
  int keep = (int)n->iarg[1], take_sqrt = (int)n->iarg[2];
  double N = count_of(e, mask), c = n->darg[0];
  emi_f F, *f = &F;
  emi_f_init(f, S);
  int dims[EM_MAX_DIMS], nd = mask_dims(mask, e->ndim, dims);
  em_tensor *mean = NULL;
  if (nd == 0) mean = x;
  else emi_f_keep(f, em_reduce(S, EM_MEAN, x, dims, nd, 1, &mean), &mean);
  em_tensor *gE = emi_f_unreduce(f, g, mask, keep, e->sizes, e->ndim);
  em_tensor *d = emi_f_bin(f, EM_SUB, x, mean), *r;
  if (!take_sqrt) {
    r = emi_f_bin(f, EM_MUL, gE, emi_f_sc(f, EM_MUL, d, 2.0 / (N - c)));
  } else {
    em_tensor *yE = emi_f_unreduce(f, y, mask, keep, e->sizes, e->ndim);
    r = emi_f_bin(f, EM_MUL, gE, emi_f_bin(f, EM_DIV, emi_f_sc(f, EM_MUL, d, 1.0 / (N - c)), yE));
  }
  return emi_f_end(f, r, &gin[0]);
}

em_status emi_ag_record_var(em_state *S, const em_tensor *a, unsigned mask, double correction,
                            int keepdim, int take_sqrt, em_tensor **out) {
  emi_ag_node *n = NULL;
  em_status st = record(S, take_sqrt ? "std" : "var", var_backward, 0, a, mask, keepdim, 1,
                        out, &n);
  if (n) { n->iarg[2] = take_sqrt; n->darg[0] = correction; }
  return st;
}

static em_status norm_backward(em_state *S, emi_ag_node *n, const em_tensor *g,
                               em_tensor **gin) {
  em_tensor *x, *y;
  em_status st;
  if ((st = emi_ag_saved(S, n, 0, &x)) || (st = emi_ag_saved(S, n, 1, &y))) return st;
  const emi_ag_edge *e = &n->in[0];
  unsigned mask = (unsigned)n->iarg[0];
  int keep = (int)n->iarg[1];
  double p = n->darg[0];
  emi_f F, *f = &F;
  emi_f_init(f, S);
  em_tensor *gE = emi_f_unreduce(f, g, mask, keep, e->sizes, e->ndim);
  em_tensor *yE = emi_f_unreduce(f, y, mask, keep, e->sizes, e->ndim), *r;
  em_tensor *sg = emi_f_un(f, EM_SIGN, x);
  if (p == 0) {
    r = emi_f_sc(f, EM_MUL, gE, 0);
  } else if (p == 1) {
    r = emi_f_bin(f, EM_MUL, gE, sg);
  } else if (isinf(p)) {   /* the extreme |x| elements share the gradient */
    em_tensor *hit = emi_f_sc(f, EM_MUL, emi_f_bin(f, EM_EQ, emi_f_un(f, EM_ABS, x), yE), 1.0);
    em_tensor *hf = NULL;
    if (hit) emi_f_keep(f, em_to(S, hit, x->dtype, x->device, &hf), &hf);
    r = emi_f_bin(f, EM_DIV, emi_f_bin(f, EM_MUL, emi_f_bin(f, EM_MUL, gE, sg), hf),
                  f_sum_back(f, hf, mask, e));
  } else if (p == 2) {
    r = emi_f_bin(f, EM_MUL, gE, emi_f_bin(f, EM_DIV, x, yE));
  } else {   /* sign(x) |x|^(p-1) / y^(p-1) */
    em_tensor *num = emi_f_bin(f, EM_MUL, sg, emi_f_sc(f, EM_POW, emi_f_un(f, EM_ABS, x), p - 1));
    r = emi_f_bin(f, EM_MUL, gE, emi_f_bin(f, EM_DIV, num, emi_f_sc(f, EM_POW, yE, p - 1)));
  }
  return emi_f_end(f, r, &gin[0]);
}

em_status emi_ag_record_norm(em_state *S, const em_tensor *a, double p, unsigned mask,
                             int keepdim, em_tensor **out) {
  emi_ag_node *n = NULL;
  em_status st = record(S, "norm", norm_backward, 0, a, mask, keepdim, 1, out, &n);
  if (n) n->darg[0] = p;
  return st;
}

/* max/min along dim: the gradient goes to the chosen index (one_hot of it). */
static em_status arg_backward(em_state *S, emi_ag_node *n, const em_tensor *g,
                              em_tensor **gin) {
  em_tensor *ix;
  em_status st;
  if ((st = emi_ag_saved(S, n, 0, &ix))) return st;
  const emi_ag_edge *e = &n->in[0];
  int dim = (int)n->iarg[2], keep = (int)n->iarg[1], nd = e->ndim;
  if (nd == 0) return em_reshape(S, g, NULL, 0, &gin[0]);
  emi_f F, *f = &F;
  emi_f_init(f, S);
  int64_t rs[EM_MAX_DIMS];
  int k = 0;
  for (int d = 0; d < nd; d++) if (d != dim) rs[k++] = e->sizes[d];
  em_tensor *i2 = keep ? emi_f_reshape(f, ix, rs, k) : ix;
  em_tensor *g2 = keep ? emi_f_reshape(f, g, rs, k) : (em_tensor *)g;
  em_tensor *oh = NULL, *ohf = NULL, *gu = NULL, *r = NULL;
  if (!f->st) emi_f_keep(f, em_one_hot(S, i2, e->sizes[dim], (int)n->iarg[3], &oh), &oh);
  if (!f->st) emi_f_keep(f, em_to(S, oh, g->dtype, g->device, &ohf), &ohf);
  if (!f->st) emi_f_keep(f, em_unsqueeze(S, g2, -1, &gu), &gu);
  em_tensor *p = emi_f_bin(f, EM_MUL, gu, ohf);
  int perm[EM_MAX_DIMS];
  for (int d = 0; d < nd; d++) perm[d] = d < dim ? d : d == dim ? nd - 1 : d - 1;
  if (!f->st) emi_f_keep(f, em_permute(S, p, perm, nd, &r), &r);
  return emi_f_end(f, r, &gin[0]);
}

em_status emi_ag_record_arg(em_state *S, const em_tensor *a, int dim, int keepdim,
                            int index_base, em_tensor **values, const em_tensor *indices) {
  if (!em_dtype_is_floating((*values)->dtype)) return EM_OK;
  const em_tensor *in[1] = {a};
  emi_ag_node *n;
  em_status st = emi_ag_node_new(S, "max/min", arg_backward, *values, in, 1, &n);
  if (st || (st = emi_ag_save(S, n, indices))) return emi_ag_fail(values, st);
  if (dim < 0) dim += a->ndim;
  n->iarg[1] = keepdim;
  n->iarg[2] = dim;
  n->iarg[3] = index_base;
  return EM_OK;
}

/* softmax: y (g - sum(g y)); log_softmax: g - exp(y) sum(g) */
static em_status softmax_backward(em_state *S, emi_ag_node *n, const em_tensor *g,
                                  em_tensor **gin) {
  em_tensor *y;
  em_status st = emi_ag_saved(S, n, 0, &y);
  if (st) return st;
  const emi_ag_edge *e = &n->in[0];
  int dim = (int)n->iarg[0], log = (int)n->iarg[1];
  unsigned mask = e->ndim ? 1u << dim : 0;
  emi_f F, *f = &F;
  emi_f_init(f, S);
  em_tensor *r;
  if (!log) {
    em_tensor *s = f_sum_back(f, emi_f_bin(f, EM_MUL, g, y), mask, e);
    r = emi_f_bin(f, EM_MUL, y, emi_f_bin(f, EM_SUB, g, s));
  } else {
    em_tensor *s = f_sum_back(f, g, mask, e);
    r = emi_f_bin(f, EM_SUB, g, emi_f_bin(f, EM_MUL, emi_f_un(f, EM_EXP, y), s));
  }
  return emi_f_end(f, r, &gin[0]);
}

em_status emi_ag_record_softmax(em_state *S, const em_tensor *a, int dim, int log,
                                em_tensor **out) {
  const em_tensor *in[1] = {a};
  emi_ag_node *n;
  em_status st = emi_ag_node_new(S, log ? "log_softmax" : "softmax", softmax_backward, *out,
                                 in, 1, &n);
  if (st || (st = emi_ag_save(S, n, *out))) return emi_ag_fail(out, st);
  n->iarg[0] = a->ndim ? dim : 0;
  n->iarg[1] = log;
  return EM_OK;
}

/*
** grad_elementwise.c -- recording and backward formulas of the element-wise ops:
** unary, binary, tensor op number, a + alpha*b, clamp, where, and the copies
** (clone, contiguous, to) whose gradient passes straight through.
*/
#include "autograd.h"
#include <math.h>

/* Records a node on out with the given inputs, saving the listed tensors. */
static em_status record(em_state *S, const char *name, emi_ag_fn fn, em_tensor **out,
                        const em_tensor *const *in, int nin, const em_tensor *const *save,
                        int nsave, emi_ag_node **node) {
  if (!em_dtype_is_floating((*out)->dtype)) return EM_OK;  /* not differentiable */
  emi_ag_node *n;
  em_status st = emi_ag_node_new(S, name, fn, *out, in, nin, &n);
  for (int k = 0; !st && k < nsave; k++) st = emi_ag_save(S, n, save[k]);
  if (st) return emi_ag_fail(out, st);
  if (node) *node = n;
  return EM_OK;
}

/* -- Unary --------------------------------------------------------------------------- */

static em_status unary_backward(em_state *S, emi_ag_node *n, const em_tensor *g,
                                em_tensor **gin) {
  em_tensor *x = NULL, *y = NULL;
  em_status st;
  if (n->nsaved && ((st = emi_ag_saved(S, n, 0, &x)) || (st = emi_ag_saved(S, n, 1, &y))))
    return st;
  emi_f F, *f = &F;
  emi_f_init(f, S);
  em_tensor *r = NULL, *t;
  switch ((em_unop)n->op) {
  case EM_NEG: r = emi_f_sc(f, EM_MUL, g, -1); break;
  case EM_ABS: r = emi_f_bin(f, EM_MUL, g, emi_f_un(f, EM_SIGN, x)); break;
  case EM_EXP: r = emi_f_bin(f, EM_MUL, g, y); break;
  case EM_LOG: r = emi_f_bin(f, EM_DIV, g, x); break;
  case EM_SQRT: r = emi_f_bin(f, EM_DIV, g, emi_f_sc(f, EM_MUL, y, 2)); break;
  case EM_RSQRT:  /* -0.5 y^3 */
    t = emi_f_bin(f, EM_MUL, y, emi_f_bin(f, EM_MUL, y, y));
    r = emi_f_bin(f, EM_MUL, g, emi_f_sc(f, EM_MUL, t, -0.5));
    break;
  case EM_SIN: r = emi_f_bin(f, EM_MUL, g, emi_f_un(f, EM_COS, x)); break;
  case EM_COS: r = emi_f_bin(f, EM_MUL, g, emi_f_sc(f, EM_MUL, emi_f_un(f, EM_SIN, x), -1)); break;
  case EM_TANH:   /* 1 - y^2 */
    r = emi_f_bin(f, EM_MUL, g, emi_f_rsc(f, EM_SUB, 1, emi_f_bin(f, EM_MUL, y, y)));
    break;
  case EM_SIGMOID:  /* y (1 - y) */
    r = emi_f_bin(f, EM_MUL, g, emi_f_bin(f, EM_MUL, y, emi_f_rsc(f, EM_SUB, 1, y)));
    break;
  case EM_RELU: r = emi_f_bin(f, EM_MUL, g, emi_f_sc(f, EM_GT, x, 0)); break;
  case EM_GELU: {  /* Phi(x) + x phi(x) */
    em_tensor *cdf = emi_f_sc(f, EM_MUL,
                              emi_f_rsc(f, EM_ADD, 1, emi_f_un(f, EM_ERF, emi_f_sc(f, EM_MUL, x, M_SQRT1_2))), 0.5);
    em_tensor *pdf = emi_f_sc(f, EM_MUL,
                              emi_f_un(f, EM_EXP, emi_f_sc(f, EM_MUL, emi_f_bin(f, EM_MUL, x, x), -0.5)),
                              0.5 * M_2_SQRTPI * M_SQRT1_2);
    r = emi_f_bin(f, EM_MUL, g, emi_f_bin(f, EM_ADD, cdf, emi_f_bin(f, EM_MUL, x, pdf)));
    break;
  }
  case EM_GELU_TANH: {
    const double k = sqrt(2.0 / M_PI), c = 0.044715;
    em_tensor *x2 = emi_f_bin(f, EM_MUL, x, x);
    em_tensor *inner = emi_f_sc(f, EM_MUL, emi_f_bin(f, EM_MUL, x, emi_f_rsc(f, EM_ADD, 1, emi_f_sc(f, EM_MUL, x2, c))), k);
    em_tensor *th = emi_f_un(f, EM_TANH, inner);
    em_tensor *left = emi_f_sc(f, EM_MUL, emi_f_sc(f, EM_ADD, th, 1), 0.5);
    em_tensor *sech2 = emi_f_rsc(f, EM_SUB, 1, emi_f_bin(f, EM_MUL, th, th));
    em_tensor *dinner = emi_f_sc(f, EM_MUL, emi_f_rsc(f, EM_ADD, 1, emi_f_sc(f, EM_MUL, x2, 3 * c)), k);
    em_tensor *right = emi_f_bin(f, EM_MUL, emi_f_sc(f, EM_MUL, x, 0.5), emi_f_bin(f, EM_MUL, sech2, dinner));
    r = emi_f_bin(f, EM_MUL, g, emi_f_bin(f, EM_ADD, left, right));
    break;
  }
  case EM_SILU: {  /* s (1 + x (1 - s)) */
    em_tensor *s = emi_f_un(f, EM_SIGMOID, x);
    t = emi_f_rsc(f, EM_ADD, 1, emi_f_bin(f, EM_MUL, x, emi_f_rsc(f, EM_SUB, 1, s)));
    r = emi_f_bin(f, EM_MUL, g, emi_f_bin(f, EM_MUL, s, t));
    break;
  }
  case EM_FLOOR: case EM_CEIL: case EM_ROUND: case EM_TRUNC: case EM_SIGN:
    r = emi_f_sc(f, EM_MUL, g, 0);
    break;
  case EM_RECIPROCAL: r = emi_f_bin(f, EM_MUL, g, emi_f_sc(f, EM_MUL, emi_f_bin(f, EM_MUL, y, y), -1)); break;
  case EM_SQUARE: r = emi_f_bin(f, EM_MUL, g, emi_f_sc(f, EM_MUL, x, 2)); break;
  case EM_LOG1P: r = emi_f_bin(f, EM_DIV, g, emi_f_sc(f, EM_ADD, x, 1)); break;
  case EM_EXPM1: r = emi_f_bin(f, EM_MUL, g, emi_f_sc(f, EM_ADD, y, 1)); break;
  case EM_LOG2: r = emi_f_bin(f, EM_DIV, g, emi_f_sc(f, EM_MUL, x, M_LN2)); break;
  case EM_LOG10: r = emi_f_bin(f, EM_DIV, g, emi_f_sc(f, EM_MUL, x, M_LN10)); break;
  case EM_TAN: r = emi_f_bin(f, EM_MUL, g, emi_f_rsc(f, EM_ADD, 1, emi_f_bin(f, EM_MUL, y, y))); break;
  case EM_ASIN: case EM_ACOS:
    t = emi_f_un(f, EM_RSQRT, emi_f_rsc(f, EM_SUB, 1, emi_f_bin(f, EM_MUL, x, x)));
    if (n->op == EM_ACOS) t = emi_f_sc(f, EM_MUL, t, -1);
    r = emi_f_bin(f, EM_MUL, g, t);
    break;
  case EM_ATAN: r = emi_f_bin(f, EM_DIV, g, emi_f_rsc(f, EM_ADD, 1, emi_f_bin(f, EM_MUL, x, x))); break;
  case EM_SINH: r = emi_f_bin(f, EM_MUL, g, emi_f_un(f, EM_COSH, x)); break;
  case EM_COSH: r = emi_f_bin(f, EM_MUL, g, emi_f_un(f, EM_SINH, x)); break;
  case EM_ERF:
    t = emi_f_un(f, EM_EXP, emi_f_sc(f, EM_MUL, emi_f_bin(f, EM_MUL, x, x), -1));
    r = emi_f_bin(f, EM_MUL, g, emi_f_sc(f, EM_MUL, t, M_2_SQRTPI));
    break;
  default:
    f->st = emi_error(S, EM_ERR_UNSUPPORTED, "backward: %s is not differentiable",
                      em_unop_name((em_unop)n->op));
  }
  return emi_f_end(f, r, &gin[0]);
}

em_status emi_ag_record_unary(em_state *S, em_unop op, const em_tensor *a, em_tensor **out) {
  if (op == EM_LOGICAL_NOT) return EM_OK;
  const em_tensor *in[1] = {a}, *sv[2] = {a, *out};
  /* saved values keep memory alive: only formulas that read them save them */
  int nsave = op == EM_NEG || (op >= EM_FLOOR && op <= EM_SIGN) ? 0 : 2;
  emi_ag_node *n = NULL;
  em_status st = record(S, em_unop_name(op), unary_backward, out, in, 1, sv, nsave, &n);
  if (n) n->op = op;
  return st;
}

/* -- Binary ---------------------------------------------------------------------------- */

static em_status binary_backward(em_state *S, emi_ag_node *n, const em_tensor *g,
                                 em_tensor **gin) {
  em_tensor *a = NULL, *b = NULL, *y = NULL;
  em_status st;
  if (n->nsaved && ((st = emi_ag_saved(S, n, 0, &a)) || (st = emi_ag_saved(S, n, 1, &b)) ||
                    (st = emi_ag_saved(S, n, 2, &y))))
    return st;
  emi_f F, *f = &F;
  emi_f_init(f, S);
  em_tensor *ga = NULL, *gb = NULL, *t;
  switch ((em_binop)n->op) {
  case EM_ADD: ga = (em_tensor *)g; gb = (em_tensor *)g; break;
  case EM_SUB: ga = (em_tensor *)g; gb = emi_f_sc(f, EM_MUL, g, -1); break;
  case EM_MUL: ga = emi_f_bin(f, EM_MUL, g, b); gb = emi_f_bin(f, EM_MUL, g, a); break;
  case EM_DIV:
    ga = emi_f_bin(f, EM_DIV, g, b);
    gb = emi_f_sc(f, EM_MUL, emi_f_bin(f, EM_DIV, emi_f_bin(f, EM_MUL, g, y), b), -1);
    break;
  case EM_POW:  /* b a^(b-1), y log a (0 where a == 0 and b >= 0, as torch) */
    ga = emi_f_bin(f, EM_MUL, g, emi_f_bin(f, EM_MUL, b, emi_f_bin(f, EM_POW, a, emi_f_sc(f, EM_SUB, b, 1))));
    if (emi_ag_needs(n, 1)) {
      t = emi_f_bin(f, EM_MUL, y, emi_f_un(f, EM_LOG, a));
      em_tensor *z = emi_f_bin(f, EM_LOGICAL_AND, emi_f_sc(f, EM_EQ, a, 0), emi_f_sc(f, EM_GE, b, 0));
      em_tensor *zero = emi_f_zeros(f, NULL, 0, g->dtype, g->device);
      em_tensor *w = NULL;
      if (!f->st && z && zero && t) emi_f_keep(f, em_where(S, z, zero, t, &w), &w);
      gb = emi_f_bin(f, EM_MUL, g, w);
    }
    break;
  case EM_MAXIMUM: case EM_MINIMUM: {  /* ties split the gradient evenly */
    em_tensor *win = emi_f_bin(f, n->op == EM_MAXIMUM ? EM_GT : EM_LT, a, b);
    em_tensor *tie = emi_f_sc(f, EM_MUL, emi_f_bin(f, EM_EQ, a, b), 0.5);
    em_tensor *wa = emi_f_bin(f, EM_ADD, win, tie);
    ga = emi_f_bin(f, EM_MUL, g, wa);
    gb = emi_f_bin(f, EM_MUL, g, emi_f_rsc(f, EM_SUB, 1, wa));
    break;
  }
  case EM_REMAINDER:
    ga = (em_tensor *)g;
    gb = emi_f_bin(f, EM_MUL, g, emi_f_sc(f, EM_MUL, emi_f_un(f, EM_FLOOR, emi_f_bin(f, EM_DIV, a, b)), -1));
    break;
  case EM_ATAN2: {
    em_tensor *den = emi_f_bin(f, EM_ADD, emi_f_bin(f, EM_MUL, a, a), emi_f_bin(f, EM_MUL, b, b));
    ga = emi_f_bin(f, EM_MUL, g, emi_f_bin(f, EM_DIV, b, den));
    gb = emi_f_bin(f, EM_MUL, g, emi_f_sc(f, EM_MUL, emi_f_bin(f, EM_DIV, a, den), -1));
    break;
  }
  default:
    f->st = emi_error(S, EM_ERR_UNSUPPORTED, "backward: %s is not differentiable",
                      em_binop_name((em_binop)n->op));
  }
  if (emi_ag_needs(n, 0)) emi_f_out(f, ga, &gin[0]);
  if (emi_ag_needs(n, 1)) emi_f_out(f, gb, &gin[1]);
  return emi_f_done(f);
}

em_status emi_ag_record_binary(em_state *S, em_binop op, const em_tensor *a,
                               const em_tensor *b, em_tensor **out) {
  if (op >= EM_EQ && op <= EM_GE) return EM_OK;
  if (op == EM_LOGICAL_AND || op == EM_LOGICAL_OR) return EM_OK;
  const em_tensor *in[2] = {a, b}, *sv[3] = {a, b, *out};
  int nsave = op == EM_ADD || op == EM_SUB ? 0 : 3;
  emi_ag_node *n = NULL;
  em_status st = record(S, em_binop_name(op), binary_backward, out, in, 2, sv, nsave, &n);
  if (n) n->op = op;
  return st;
}

/* -- Tensor op number ---------------------------------------------------------------------- */

static em_status scalar_backward(em_state *S, emi_ag_node *n, const em_tensor *g,
                                 em_tensor **gin) {
  em_tensor *a = NULL, *y = NULL;
  em_status st;
  if (n->nsaved && ((st = emi_ag_saved(S, n, 0, &a)) || (st = emi_ag_saved(S, n, 1, &y))))
    return st;
  double s = n->darg[0];
  int rev = (int)n->iarg[0];
  emi_f F, *f = &F;
  emi_f_init(f, S);
  em_tensor *r = NULL, *t;
  switch ((em_binop)n->op) {
  case EM_ADD: r = emi_f_sc(f, EM_MUL, g, 1); break;
  case EM_SUB: r = emi_f_sc(f, EM_MUL, g, rev ? -1 : 1); break;
  case EM_MUL: r = emi_f_sc(f, EM_MUL, g, s); break;
  case EM_DIV:
    if (!rev) r = emi_f_sc(f, EM_DIV, g, s);
    else r = emi_f_sc(f, EM_MUL, emi_f_bin(f, EM_DIV, emi_f_bin(f, EM_MUL, g, y), a), -1);
    break;
  case EM_POW:
    if (!rev) {
      t = s == 0 ? emi_f_sc(f, EM_MUL, a, 0)
                 : emi_f_sc(f, EM_MUL, emi_f_sc(f, EM_POW, a, s - 1), s);
      r = emi_f_bin(f, EM_MUL, g, t);
    } else {
      r = emi_f_bin(f, EM_MUL, g, emi_f_sc(f, EM_MUL, y, log(s)));
    }
    break;
  case EM_MAXIMUM: case EM_MINIMUM: {
    em_tensor *win = emi_f_sc(f, n->op == EM_MAXIMUM ? EM_GT : EM_LT, a, s);
    em_tensor *tie = emi_f_sc(f, EM_MUL, emi_f_sc(f, EM_EQ, a, s), 0.5);
    r = emi_f_bin(f, EM_MUL, g, emi_f_bin(f, EM_ADD, win, tie));
    break;
  }
  case EM_REMAINDER:
    if (!rev) r = emi_f_sc(f, EM_MUL, g, 1);
    else r = emi_f_bin(f, EM_MUL, g, emi_f_sc(f, EM_MUL, emi_f_un(f, EM_FLOOR, emi_f_rsc(f, EM_DIV, s, a)), -1));
    break;
  case EM_ATAN2: {  /* atan2(a, s) or atan2(s, a) */
    em_tensor *den = emi_f_sc(f, EM_ADD, emi_f_bin(f, EM_MUL, a, a), s * s);
    r = emi_f_bin(f, EM_MUL, g, emi_f_rsc(f, EM_DIV, rev ? -s : s, den));
    break;
  }
  default:
    f->st = emi_error(S, EM_ERR_UNSUPPORTED, "backward: %s is not differentiable",
                      em_binop_name((em_binop)n->op));
  }
  return emi_f_end(f, r, &gin[0]);
}

em_status emi_ag_record_scalar(em_state *S, em_binop op, const em_tensor *a, double s,
                               int reverse, em_tensor **out) {
  if ((op >= EM_EQ && op <= EM_GE) || op == EM_LOGICAL_AND || op == EM_LOGICAL_OR)
    return EM_OK;
  const em_tensor *in[1] = {a}, *sv[2] = {a, *out};
  int nsave = op == EM_ADD || op == EM_SUB || op == EM_MUL ||
              (!reverse && (op == EM_DIV || op == EM_REMAINDER)) ? 0 : 2;
  emi_ag_node *n = NULL;
  em_status st = record(S, em_binop_name(op), scalar_backward, out, in, 1, sv, nsave, &n);
  if (n) { n->op = op; n->darg[0] = s; n->iarg[0] = reverse; }
  return st;
}

/* -- a + alpha*b, clamp, where ------------------------------------------------------------- */

static em_status add_scaled_backward(em_state *S, emi_ag_node *n, const em_tensor *g,
                                     em_tensor **gin) {
  em_status st;
  em_tensor_retain((em_tensor *)g);
  gin[0] = (em_tensor *)g;
  if (emi_ag_needs(n, 1) && (st = em_binary_scalar(S, EM_MUL, g, n->darg[0], 0, &gin[1])))
    return st;
  return EM_OK;
}

em_status emi_ag_record_add_scaled(em_state *S, const em_tensor *a, const em_tensor *b,
                                   double alpha, em_tensor **out) {
  const em_tensor *in[2] = {a, b};
  emi_ag_node *n = NULL;
  em_status st = record(S, "add", add_scaled_backward, out, in, 2, NULL, 0, &n);
  if (n) n->darg[0] = alpha;
  return st;
}

static em_status clamp_backward(em_state *S, emi_ag_node *n, const em_tensor *g,
                                em_tensor **gin) {
  em_tensor *a;
  em_status st = emi_ag_saved(S, n, 0, &a);
  if (st) return st;
  emi_f F, *f = &F;
  emi_f_init(f, S);
  em_tensor *in = emi_f_bin(f, EM_LOGICAL_AND, emi_f_sc(f, EM_GE, a, n->darg[0]),
                            emi_f_sc(f, EM_LE, a, n->darg[1]));
  return emi_f_end(f, emi_f_bin(f, EM_MUL, g, in), &gin[0]);
}

em_status emi_ag_record_clamp(em_state *S, const em_tensor *a, double lo, double hi,
                              em_tensor **out) {
  const em_tensor *in[1] = {a}, *sv[1] = {a};
  emi_ag_node *n = NULL;
  em_status st = record(S, "clamp", clamp_backward, out, in, 1, sv, 1, &n);
  if (n) { n->darg[0] = lo; n->darg[1] = hi; }
  return st;
}

static em_status where_backward(em_state *S, emi_ag_node *n, const em_tensor *g,
                                em_tensor **gin) {
  em_tensor *c;
  em_status st = emi_ag_saved(S, n, 0, &c);
  if (st) return st;
  emi_f F, *f = &F;
  emi_f_init(f, S);
  em_tensor *zero = emi_f_zeros(f, NULL, 0, g->dtype, g->device), *ga = NULL, *gb = NULL;
  if (!f->st && emi_ag_needs(n, 1)) emi_f_keep(f, em_where(S, c, g, zero, &ga), &ga);
  if (!f->st && emi_ag_needs(n, 2)) emi_f_keep(f, em_where(S, c, zero, g, &gb), &gb);
  if (ga) emi_f_out(f, ga, &gin[1]);
  if (gb) emi_f_out(f, gb, &gin[2]);
  return emi_f_done(f);
}

em_status emi_ag_record_where(em_state *S, const em_tensor *cond, const em_tensor *a,
                              const em_tensor *b, em_tensor **out) {
  const em_tensor *in[3] = {cond, a, b}, *sv[1] = {cond};
  return record(S, "where", where_backward, out, in, 3, sv, 1, NULL);
}

/* -- Copies --------------------------------------------------------------------------------- */

static em_status copy_backward(em_state *S, emi_ag_node *n, const em_tensor *g,
                               em_tensor **gin) {
  em_tensor_retain((em_tensor *)g);
  gin[0] = (em_tensor *)g;
  return EM_OK;
}

em_status emi_ag_record_copy(em_state *S, const char *name, const em_tensor *a,
                             em_tensor **out) {
  if (*out == a) return EM_OK;     /* contiguous/to returned a itself */
  const em_tensor *in[1] = {a};
  return record(S, name, copy_backward, out, in, 1, NULL, 0, NULL);
}

/*
** grad_linalg.c -- recording and backward of matmul: dA = dC B^T, dB = A^T dC on
** the operands promoted to matrices (1-D operands gain the dim numpy adds, and
** lose it again); batch broadcasting is summed back by the engine.
**
** A matrix B shared by every batch (a Linear layer's weight) gets its gradient
** from one product over all rows, A and dC flattened to matrices, rather than a
** product per batch and a sum. And dB comes in B's own layout: B is most often
** a transposed view of a weight (linear: x @ w^T), and a gradient laid out as
** B -- computed as (dC^T A)^T -- reaches the weight through the transpose's
** backward as a contiguous matrix. Laid out otherwise it would reach it
** transposed, and every accumulation into .grad (micro-batches, several
** uses) would read it across the rows at a fraction of memory speed.
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

/* a as a matrix of its rows: [..., m, k] -> [(...) m, k] */
static em_tensor *f_rows(emi_f *f, const em_tensor *a) {
  if (f->st || !a) return NULL;
  int64_t shape[2] = {a->numel / a->sizes[a->ndim - 1], a->sizes[a->ndim - 1]};
  em_tensor *r = NULL;
  em_status st = em_reshape(f->S, a, shape, 2, &r);
  return emi_f_keep(f, st, &r);
}

/* A 2-D tensor whose memory is that of its transpose, contiguous. */
static int transposed_layout(const em_tensor *b) {
  return b->ndim == 2 && b->sizes[0] > 1 && b->sizes[1] > 1 && b->strides[0] == 1 &&
         b->strides[1] == b->sizes[0];
}

/* The memory B's gradient may be written into (a gradient destination, engine.c),
** laid out as B (tl: transposed), or NULL. */
static em_tensor *dest_of(emi_f *f, emi_ag_node *n, int tl, const em_tensor *b2) {
  int64_t want[2] = {tl ? 1 : b2->sizes[1], tl ? b2->sizes[0] : 1};
  em_tensor *d = emi_ag_grad_dest(f->S, n, 1, want);
  return d ? emi_f_keep(f, EM_OK, &d) : NULL;
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
    em_tensor *gb;
    if (b2->ndim == 2 && g2 && g2->ndim == a2->ndim) {
      em_tensor *ar = a2->ndim > 2 ? f_rows(f, a2) : a2, *gr = a2->ndim > 2 ? f_rows(f, g2) : g2;
      int tl = transposed_layout(b2);
      em_tensor *d = b1 || f->st || em_dtype_promote(ar->dtype, gr->dtype) != b2->dtype
                     ? NULL : dest_of(f, n, tl, b2);
      if (d) {                   /* written where the weight's gradient lives */
        em_tensor *l = f_mT(f, tl ? gr : ar), *r = tl ? ar : gr, *o = tl ? f_mT(f, d) : d;
        if (!f->st) f->st = emi_matmul_into(S, l, r, o);
        gb = d;
      } else {
        gb = tl ? f_mT(f, f_mm(f, f_mT(f, gr), ar)) : f_mm(f, f_mT(f, ar), gr);
      }
    } else {
      gb = f_mm(f, f_mT(f, a2), g2);
    }
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

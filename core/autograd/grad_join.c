/*
** grad_join.c -- recording and backward of cat, stack, index_select and gather.
** The scatter-adds that index_select and gather need are done with one_hot and
** a matmul / a sum, so they run wherever those ops run.
*/
#include "autograd.h"

static int legacy_empty(const emi_ag_edge *e) { return e->ndim == 1 && e->sizes[0] == 0; }

static em_status cat_backward(em_state *S, emi_ag_node *n, const em_tensor *g,
                              em_tensor **gin) {
  int dim = (int)n->iarg[0];
  int64_t at = 0;
  for (int i = 0; i < n->ninputs; i++) {
    const emi_ag_edge *e = &n->in[i];
    if (legacy_empty(e)) continue;
    int64_t len = e->sizes[dim];
    em_status st;
    if (emi_ag_needs(n, i) && (st = em_narrow(S, g, dim, at, len, &gin[i]))) return st;
    at += len;
  }
  return EM_OK;
}

static em_status stack_backward(em_state *S, emi_ag_node *n, const em_tensor *g,
                                em_tensor **gin) {
  for (int i = 0; i < n->ninputs; i++) {
    em_status st;
    if (emi_ag_needs(n, i) && (st = em_select(S, g, (int)n->iarg[0], i, &gin[i]))) return st;
  }
  return EM_OK;
}

em_status emi_ag_record_join(em_state *S, int stack, em_tensor *const *list, int n, int dim,
                             em_tensor **out) {
  if (!em_dtype_is_floating((*out)->dtype)) return EM_OK;
  emi_ag_node *node;
  em_status st = emi_ag_node_new(S, stack ? "stack" : "cat", stack ? stack_backward : cat_backward,
                                 *out, (const em_tensor *const *)list, n, &node);
  if (st) return emi_ag_fail(out, st);
  node->iarg[0] = dim;
  return EM_OK;
}

static em_status index_select_backward(em_state *S, emi_ag_node *n, const em_tensor *g,
                                       em_tensor **gin) {
  em_tensor *idx;
  em_status st = emi_ag_saved(S, n, 0, &idx);
  if (st) return st;
  const emi_ag_edge *e = &n->in[0];
  int dim = (int)n->iarg[0];
  if (e->ndim == 0) return em_reshape(S, g, NULL, 0, &gin[0]);
  emi_f F, *f = &F;
  emi_f_init(f, S);
  em_tensor *oh = NULL, *ohf = NULL, *gt = NULL, *r = NULL, *rt = NULL, *i1 = NULL;
  int64_t m = idx->numel;
  /* idx as 1-D, then one_hot -> (m, size) */
  emi_f_keep(f, em_reshape(S, idx, &m, 1, &i1), i1);
  if (!f->st) emi_f_keep(f, em_one_hot(S, i1, e->sizes[dim], (int)n->iarg[1], &oh), oh);
  if (!f->st) emi_f_keep(f, em_to(S, oh, g->dtype, g->device, &ohf), ohf);
  if (!f->st) emi_f_keep(f, em_transpose(S, g, dim, -1, &gt), gt);
  if (!f->st) emi_f_keep(f, em_matmul(S, gt, ohf, &r), r);
  if (!f->st) emi_f_keep(f, em_transpose(S, r, dim, -1, &rt), rt);
  return emi_f_end(f, rt, &gin[0]);
}

static em_status gather_backward(em_state *S, emi_ag_node *n, const em_tensor *g,
                                 em_tensor **gin) {
  em_tensor *idx;
  em_status st = emi_ag_saved(S, n, 0, &idx);
  if (st) return st;
  const emi_ag_edge *e = &n->in[0];
  int dim = (int)n->iarg[0];
  if (e->ndim == 0) return em_reshape(S, g, NULL, 0, &gin[0]);
  emi_f F, *f = &F;
  emi_f_init(f, S);
  em_tensor *oh = NULL, *ohf = NULL, *gu = NULL, *p, *s = NULL, *st2 = NULL, *r = NULL;
  emi_f_keep(f, em_one_hot(S, idx, e->sizes[dim], (int)n->iarg[1], &oh), oh);
  if (!f->st) emi_f_keep(f, em_to(S, oh, g->dtype, g->device, &ohf), ohf);
  if (!f->st) emi_f_keep(f, em_unsqueeze(S, g, -1, &gu), gu);
  p = emi_f_bin(f, EM_MUL, gu, ohf);                   /* idx.shape + [size] */
  if (!f->st) emi_f_keep(f, em_reduce(S, EM_SUM, p, &dim, 1, 1, &s), s);
  if (!f->st) emi_f_keep(f, em_transpose(S, s, dim, -1, &st2), st2);
  if (!f->st) emi_f_keep(f, em_squeeze(S, st2, -1, 0, &r), r);
  if (f->st) return emi_f_done(f);
  /* the index may be smaller than the input outside dim: pad with zeros */
  int same = 1;
  for (int d = 0; d < e->ndim; d++) same &= r->sizes[d] == e->sizes[d];
  if (same) return emi_f_end(f, r, &gin[0]);
  em_tensor *z = emi_f_zeros(f, e->sizes, e->ndim, g->dtype), *zv = NULL;
  if (!f->st) emi_f_keep(f, em_as_strided(S, z, r->sizes, z->strides, z->ndim, 0, &zv), zv);
  if (!f->st) f->st = em_copy_(S, zv, r);
  return emi_f_end(f, z, &gin[0]);
}

em_status emi_ag_record_index(em_state *S, int gather, const em_tensor *a, int dim,
                              const em_tensor *idx, int index_base, em_tensor **out) {
  if (!em_dtype_is_floating((*out)->dtype)) return EM_OK;
  const em_tensor *in[1] = {a};
  emi_ag_node *n;
  em_status st = emi_ag_node_new(S, gather ? "gather" : "index_select",
                                 gather ? gather_backward : index_select_backward, *out, in, 1, &n);
  if (st || (st = emi_ag_save(S, n, idx))) return emi_ag_fail(out, st);
  if (dim < 0) dim += a->ndim;
  n->iarg[0] = dim;
  n->iarg[1] = index_base;
  return EM_OK;
}

/*
** grad_join.c -- recording and backward of cat, stack, index_select and gather.
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

/* The scatter-adds: a zero gradient of the input's shape, then index_add_ /
** scatter_add_ of g at the recorded indices (repeated indices accumulate). */
static em_status index_select_backward(em_state *S, emi_ag_node *n, const em_tensor *g,
                                       em_tensor **gin) {
  em_tensor *idx;
  em_status st = emi_ag_saved(S, n, 0, &idx);
  if (st) return st;
  const emi_ag_edge *e = &n->in[0];
  if (e->ndim == 0) return em_reshape(S, g, NULL, 0, &gin[0]);
  emi_f F, *f = &F;
  emi_f_init(f, S);
  int64_t m = idx->numel;
  em_tensor *i1 = emi_f_reshape(f, idx, &m, 1);
  em_tensor *z = emi_f_zeros(f, e->sizes, e->ndim, g->dtype, g->device);
  if (!f->st) f->st = em_index_add_(S, z, (int)n->iarg[0], i1, g, (int)n->iarg[1]);
  return emi_f_end(f, z, &gin[0]);
}

static em_status gather_backward(em_state *S, emi_ag_node *n, const em_tensor *g,
                                 em_tensor **gin) {
  em_tensor *idx;
  em_status st = emi_ag_saved(S, n, 0, &idx);
  if (st) return st;
  const emi_ag_edge *e = &n->in[0];
  if (e->ndim == 0) return em_reshape(S, g, NULL, 0, &gin[0]);
  emi_f F, *f = &F;
  emi_f_init(f, S);
  em_tensor *z = emi_f_zeros(f, e->sizes, e->ndim, g->dtype, g->device);
  if (!f->st) f->st = em_scatter_add_(S, z, (int)n->iarg[0], idx, g, (int)n->iarg[1]);
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

/*
** grad_shape.c -- recording and backward of the views (view, reshape, squeeze,
** unsqueeze, transpose, permute, expand, narrow, select, as_strided).
*/
#include "autograd.h"

static em_status view_record(em_state *S, const char *name, emi_ag_fn fn,
                             const em_tensor *a, em_tensor **out, emi_ag_node **node) {
  const em_tensor *in[1] = {a};
  em_status st = emi_ag_node_new(S, name, fn, *out, in, 1, node);
  return st ? emi_ag_fail(out, st) : EM_OK;
}

/* view, reshape, squeeze, unsqueeze: the same elements in another shape */
static em_status reshape_backward(em_state *S, emi_ag_node *n, const em_tensor *g,
                                  em_tensor **gin) {
  return em_reshape(S, g, n->in[0].sizes, n->in[0].ndim, &gin[0]);
}

em_status emi_ag_record_reshape(em_state *S, const char *name, const em_tensor *a,
                                em_tensor **out) {
  emi_ag_node *n;
  return view_record(S, name, reshape_backward, a, out, &n);
}

static em_status permute_backward(em_state *S, emi_ag_node *n, const em_tensor *g,
                                  em_tensor **gin) {
  int inv[EM_MAX_DIMS];
  for (int i = 0; i < n->in[0].ndim; i++) inv[n->iarg[i]] = i;
  return em_permute(S, g, inv, n->in[0].ndim, &gin[0]);
}

/* The engine looks through a Linear weight's transpose to its gradient destination. */
int emi_ag_is_transpose2(const emi_ag_node *n) {
  return n->backward == permute_backward && n->ninputs == 1 && n->in[0].ndim == 2 &&
         n->iarg[0] == 1 && n->iarg[1] == 0;
}

em_status emi_ag_record_permute(em_state *S, const em_tensor *a, const int *perm,
                                em_tensor **out) {
  emi_ag_node *n;
  em_status st = view_record(S, "permute", permute_backward, a, out, &n);
  if (st) return st;
  for (int i = 0; i < a->ndim; i++) n->iarg[i] = perm[i] < 0 ? perm[i] + a->ndim : perm[i];
  return EM_OK;
}

/* expand: the engine sums the gradient back over the broadcast dims */
static em_status pass_backward(em_state *S, emi_ag_node *n, const em_tensor *g,
                               em_tensor **gin) {
  em_tensor_retain((em_tensor *)g);
  gin[0] = (em_tensor *)g;
  return EM_OK;
}

em_status emi_ag_record_expand(em_state *S, const em_tensor *a, em_tensor **out) {
  emi_ag_node *n;
  return view_record(S, "expand", pass_backward, a, out, &n);
}

/* narrow, select, as_strided: a buffer spanning both geometries in storage
** offsets; the gradient is written through the output's geometry and read back
** through the input's. iarg: input strides [0,8), output sizes [8,16), output
** strides [16,24), input offset 24, output offset 25, output ndim 26. */
static void extent(const int64_t *sizes, const int64_t *strides, int ndim, int64_t off,
                   int64_t *lo, int64_t *hi) {
  int64_t a = off, b = off;
  for (int d = 0; d < ndim; d++) {
    if (sizes[d] == 0) return;
    int64_t span = (sizes[d] - 1) * strides[d];
    if (span < 0) a += span; else b += span;
  }
  if (a < *lo) *lo = a;
  if (b > *hi) *hi = b;
}

static em_status strided_backward(em_state *S, emi_ag_node *n, const em_tensor *g,
                                  em_tensor **gin) {
  const emi_ag_edge *e = &n->in[0];
  const int64_t *is = n->iarg, *os = n->iarg + 8, *ost = n->iarg + 16;
  int64_t ioff = n->iarg[24], ooff = n->iarg[25];
  int ond = (int)n->iarg[26];
  int64_t lo = INT64_MAX, hi = INT64_MIN;
  extent(e->sizes, is, e->ndim, ioff, &lo, &hi);
  extent(os, ost, ond, ooff, &lo, &hi);
  if (lo > hi) { lo = 0; hi = 0; }
  int64_t len = hi - lo + 1;
  em_tensor *buf, *ov = NULL;
  em_status st = em_full(S, &len, 1, 0.0, g->dtype, g->device, &buf);
  if (st) return st;
  if (!(st = em_as_strided(S, buf, os, ost, ond, ooff - lo, &ov)) &&
      !(st = em_copy_(S, ov, g)))
    st = em_as_strided(S, buf, e->sizes, is, e->ndim, ioff - lo, &gin[0]);
  em_tensor_release(ov);
  em_tensor_release(buf);
  return st;
}

em_status emi_ag_record_strided(em_state *S, const char *name, const em_tensor *a,
                                em_tensor **out) {
  emi_ag_node *n;
  em_status st = view_record(S, name, strided_backward, a, out, &n);
  if (st) return st;
  const em_tensor *o = *out;
  for (int d = 0; d < a->ndim; d++) n->iarg[d] = a->strides[d];
  for (int d = 0; d < o->ndim; d++) { n->iarg[8 + d] = o->sizes[d]; n->iarg[16 + d] = o->strides[d]; }
  n->iarg[24] = a->offset;
  n->iarg[25] = o->offset;
  n->iarg[26] = o->ndim;
  return EM_OK;
}

/*
** leaf_grad.c -- how a leaf's gradient arrives: the first contribution becomes
** .grad (adopted as it is when nothing else can see it and its layout is .grad's,
** else copied), later ones are added in place; and gradient destinations, the
** memory a leaf names for its gradient (em.distribute's buckets), which a
** producer may write into directly.
*/
#include "autograd.h"

/* Whether t's elements fill its memory exactly, with no gaps or overlaps, in some
** order of its dims: its strides, sorted, are those of a contiguous tensor of the
** sizes taken in that order (a transposed or channels-last tensor is dense). */
static int dense_layout(const em_tensor *t) {
  int used[EM_MAX_DIMS] = {0};
  int64_t expect = 1;
  for (int k = 0; k < t->ndim; k++) {         /* the innermost dim left, each time */
    int best = -1;
    for (int d = 0; d < t->ndim; d++)
      if (!used[d] && t->sizes[d] != 1 &&
          (best < 0 || t->strides[d] < t->strides[best])) best = d;
    if (best < 0) break;                      /* only size-1 dims left: any stride */
    if (t->strides[best] != expect) return 0;
    used[best] = 1;
    expect *= t->sizes[best];
  }
  return 1;
}

/* Whether g may become leaf's .grad as it is: nothing else can see it (one handle,
** one storage reference -- besides a capture's own views, em.compile's record of
** the step that made it -- from the storage's start) and it is laid out as .grad
** would be -- contiguous, or dense with the leaf's own strides (a weight kept
** transposed or channels-last gets its gradient in that layout). */
static int grad_adoptable(em_state *S, const em_tensor *leaf, const em_tensor *g) {
  if (g->refcount != 1 || g->offset != 0 ||
      g->storage->refcount != 1 + emi_compile_views_of(S, g->storage))
    return 0;
  if (em_tensor_is_contiguous(g)) return 1;
  if (g->ndim != leaf->ndim || !dense_layout(g)) return 0;
  for (int d = 0; d < g->ndim; d++)
    if (g->sizes[d] != 1 && g->strides[d] != leaf->strides[d]) return 0;
  return 1;
}

/* Whether g is dest itself, or a view of exactly its elements in its layout (a
** producer that wrote into a transposed view of dest hands on the view's view). */
int emi_ag_is_dest(const em_tensor *dest, const em_tensor *g) {
  if (!dest) return 0;
  if (g == dest) return 1;
  return g->storage == dest->storage && g->offset == dest->offset && g->ndim == dest->ndim &&
         g->dtype == dest->dtype &&
         !memcmp(g->sizes, dest->sizes, sizeof *g->sizes * (size_t)g->ndim) &&
         !memcmp(g->strides, dest->strides, sizeof *g->strides * (size_t)g->ndim);
}

/* Leaf gradients are accumulated in place into .grad: the grad tensor belongs to the
** leaf (optimizers read it), so a new sum replaces it only the first time. Takes g.
** A leaf with a destination takes its first gradient there: as it is when the
** producer wrote it there (no pass at all), else copied in, which is the one copy
** the destination's owner would have made anyway. */
em_status emi_ag_leaf_add(em_state *S, em_tensor *leaf, em_tensor *g) {
  em_status st = EM_OK;
  em_tensor *dest = leaf->ag->grad_dest;
  int mine = emi_ag_is_dest(dest, g);
  if (mine) leaf->ag->dest_busy = 0;
  if (!leaf->ag->grad) {
    if (mine) {
      em_tensor_retain(dest);
      em_tensor_release(g);
      leaf->ag->grad = dest;
    } else if (dest && !leaf->ag->dest_busy && g->dtype == dest->dtype &&
               g->device == dest->device) {
      st = em_copy_(S, dest, g);
      em_tensor_release(g);
      if (!st) { em_tensor_retain(dest); leaf->ag->grad = dest; }
    } else if (grad_adoptable(S, leaf, g)) {
      /* .grad must own its memory: g is copied only when someone else may hold it,
      ** or its layout is not the one .grad keeps */
      leaf->ag->grad = g;
    } else {
      em_tensor *c;
      st = em_clone(S, g, &c);
      em_tensor_release(g);
      if (!st) leaf->ag->grad = c;
    }
    if (S->recorder && leaf->ag->grad) emi_compile_note_grad(S, leaf, leaf->ag->grad, 1);
  } else {
    if (S->recorder) emi_compile_note_accumulate(S, leaf);
    st = em_binary_(S, EM_ADD, leaf->ag->grad, g);
    em_tensor_release(g);
  }
  return st;
}

/* -- Gradient destinations --------------------------------------------------------
** A leaf may name where its gradient is to live (em.distribute's reducer names each
** parameter's view into its bucket). A producer asks, for its input i, whether it
** may write that input's whole gradient into such memory instead of a fresh
** tensor: yes when the edge leads to a leaf with a destination and no .grad yet --
** directly, or through a 2-D transpose that only this node feeds (a Linear
** layer's x @ w^T), the destination then seen transposed -- with the edge's
** shape, dtype and device, and laid out with the strides the producer wants. The
** destination is then claimed until the gradient reaches the leaf, so that no
** second producer writes into it first; the producer must hand on what it got
** (or a view of it in the leaf's geometry) as input i's gradient. */
em_status emi_ag_set_grad_dest(em_state *S, em_tensor *leaf, em_tensor *dest) {
  if (dest && (emi_ag_grad_fn(leaf) || dest->ndim != leaf->ndim ||
               dest->dtype != leaf->dtype || dest->device != leaf->device ||
               memcmp(dest->sizes, leaf->sizes, sizeof *dest->sizes * (size_t)dest->ndim)))
    return emi_error(S, EM_ERR_INTERNAL, "grad destination of shape %s does not fit a "
                     "leaf of shape %s", emi_tshape(S, dest), emi_tshape(S, leaf));
  emi_ag_meta *m = emi_ag_meta_of(leaf);
  if (!m) return emi_error(S, EM_ERR_NOMEM, "grad destination: out of memory");
  if (dest) em_tensor_retain(dest);
  em_tensor_release(m->grad_dest);
  m->grad_dest = dest;
  m->dest_busy = 0;
  return EM_OK;
}

em_tensor *emi_ag_grad_dest(em_state *S, const emi_ag_node *n, int i, const int64_t *strides) {
  const emi_ag_edge *e = &n->in[i];
  em_tensor *leaf = e->leaf;
  int transposed = 0;
  if (!leaf && e->fn && e->fn->walk == n->walk && e->fn->deps == 1 && !e->fn->gbuf &&
      emi_ag_is_transpose2(e->fn) && e->fn->in[0].leaf) {
    leaf = e->fn->in[0].leaf;
    transposed = 1;
  }
  if (!leaf || !leaf->ag->grad_dest || leaf->ag->grad || leaf->ag->dest_busy ||
      leaf->ag->capture == n->walk)
    return NULL;
  em_tensor *d = leaf->ag->grad_dest, *v = NULL;
  if (e->dtype != d->dtype || e->device != d->device || e->ndim != d->ndim) return NULL;
  int64_t sz[EM_MAX_DIMS], stv[EM_MAX_DIMS];
  for (int k = 0; k < d->ndim; k++) {
    int s = transposed ? d->ndim - 1 - k : k;
    sz[k] = d->sizes[s];
    stv[k] = d->strides[s];
    if (sz[k] != e->sizes[k] || (sz[k] != 1 && stv[k] != strides[k])) return NULL;
  }
  if (emi_tensor_view(S, d, sz, stv, d->ndim, d->offset, &v)) return NULL;
  leaf->ag->dest_busy = 1;
  return v;
}

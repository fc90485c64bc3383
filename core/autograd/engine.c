/*
** engine.c -- the autograd engine: grad mode, requires_grad/grad accessors,
** graph nodes (creation, saved tensors, release) and em_backward, which counts
** dependencies from the root, runs the nodes in reverse topological order,
** frees each node's saved tensors as it runs and hands each leaf its gradient
** (leaf_grad.c: accumulation into .grad, and gradient destinations).
*/
#include "autograd.h"
#include "../profile/profile.h"

struct emi_ag_hook {
  em_grad_hook_fn fn;
  void *ud;
  struct emi_ag_hook *next;
};

/* -- Grad mode and tensor fields ---------------------------------------------------- */

em_status em_set_grad_enabled(em_state *S, int enabled) {
  emi_set_grad_disabled(S, !enabled);
  return EM_OK;
}
int em_is_grad_enabled(em_state *S) { return !S->grad_disabled; }

em_status em_tensor_set_requires_grad(em_state *S, em_tensor *t, int flag) {
  em_status st = emi_check_tensor(S, "requires_grad_", t);
  if (st) return st;
  if (flag && !em_dtype_is_floating(t->dtype))
    return emi_error(S, EM_ERR_DTYPE, "requires_grad_: only tensors of floating point "
                     "dtype can require gradients (got %s)", em_dtype_name(t->dtype));
  if (!flag && emi_ag_grad_fn(t))
    return emi_error(S, EM_ERR_ARG, "requires_grad_: you can only change requires_grad "
                     "flags of leaf variables (use detach() for a tensor without history)");
  if (flag && !emi_ag_meta_of(t))
    return emi_error(S, EM_ERR_NOMEM, "requires_grad_: out of memory");
  t->requires_grad = flag ? 1 : 0;
  return EM_OK;
}

int em_tensor_requires_grad(const em_tensor *t) { return t && t->requires_grad; }
int em_tensor_is_leaf(const em_tensor *t) { return t && !emi_ag_grad_fn(t); }

em_tensor *em_tensor_grad(const em_tensor *t) {
  em_tensor *g = t ? emi_ag_grad(t) : NULL;
  if (g) em_tensor_retain(g);
  return g;
}

em_status em_tensor_set_grad(em_state *S, em_tensor *t, em_tensor *g) {
  em_status st = emi_check_tensor(S, "grad", t);
  if (st) return st;
  if (g) {
    if (g->ndim != t->ndim || memcmp(g->sizes, t->sizes, sizeof *g->sizes * (size_t)g->ndim))
      return emi_error(S, EM_ERR_SHAPE, "grad: assigned grad has shape %s but the tensor "
                       "has shape %s", emi_tshape(S, g), emi_tshape(S, t));
    if (g->dtype != t->dtype)
      return emi_error(S, EM_ERR_DTYPE, "grad: assigned grad has dtype %s but the tensor "
                       "has dtype %s", em_dtype_name(g->dtype), em_dtype_name(t->dtype));
    if (g->device != t->device)
      return emi_error(S, EM_ERR_DEVICE, "grad: assigned grad is on another device");
    em_tensor_retain(g);
  }
  emi_ag_meta *m = g ? emi_ag_meta_of(t) : t->ag;
  if (g && !m) {
    em_tensor_release(g);
    return emi_error(S, EM_ERR_NOMEM, "grad: out of memory");
  }
  if (m) {                /* (else there is no gradient to drop) */
    em_tensor_release(m->grad);
    m->grad = g;
  }
  if (S->recorder) emi_compile_note_grad(S, t, g, 0);
  return EM_OK;
}

em_status em_detach(em_state *S, const em_tensor *a, em_tensor **out) {
  em_status st = emi_check_tensor(S, "detach", a);
  if (st) return st;
  return emi_tensor_view(S, a, a->sizes, a->strides, a->ndim, a->offset, out);
}

em_status em_tensor_add_grad_hook(em_state *S, em_tensor *t, em_grad_hook_fn fn, void *ud) {
  em_status st = emi_check_tensor(S, "add_grad_hook", t);
  if (st) return st;
  if (!fn) return emi_error(S, EM_ERR_ARG, "add_grad_hook: NULL function");
  if (emi_ag_grad_fn(t))
    return emi_error(S, EM_ERR_ARG, "add_grad_hook: only leaf tensors take gradient hooks");
  emi_ag_meta *m = emi_ag_meta_of(t);
  struct emi_ag_hook *h = m ? emi_malloc(S, sizeof *h) : NULL, **p = m ? &m->hooks : NULL;
  if (!h) return emi_error(S, EM_ERR_NOMEM, "add_grad_hook: out of memory");
  h->fn = fn;
  h->ud = ud;
  h->next = NULL;
  while (*p) p = &(*p)->next;     /* hooks run in the order they were added */
  *p = h;
  return EM_OK;
}

void em_tensor_remove_grad_hook(em_tensor *t, em_grad_hook_fn fn, void *ud) {
  if (!t || !t->ag) return;
  for (struct emi_ag_hook **p = &t->ag->hooks; *p; p = &(*p)->next) {
    if ((*p)->fn == fn && (*p)->ud == ud) {
      struct emi_ag_hook *h = *p;
      *p = h->next;
      emi_free(t->S, h, sizeof *h);
      return;
    }
  }
}

/* -- End-of-backward callbacks ----------------------------------------------------
** em.distribute's reducer waits for its bucket allreduces here, so that every
** replica holds the averaged gradients when em_backward returns. */
struct emi_bw_callback {
  em_backward_callback_fn fn;
  void *ud;
  struct emi_bw_callback *next;
};

em_status em_backward_add_callback(em_state *S, em_backward_callback_fn fn, void *ud) {
  if (!fn) return emi_error(S, EM_ERR_ARG, "backward_add_callback: NULL function");
  struct emi_bw_callback *cb = emi_malloc(S, sizeof *cb), **p = &S->backward_callbacks;
  if (!cb) return emi_error(S, EM_ERR_NOMEM, "backward_add_callback: out of memory");
  cb->fn = fn;
  cb->ud = ud;
  cb->next = NULL;
  while (*p) p = &(*p)->next;
  *p = cb;
  return EM_OK;
}

void em_backward_remove_callback(em_state *S, em_backward_callback_fn fn, void *ud) {
  for (struct emi_bw_callback **p = &S->backward_callbacks; *p; p = &(*p)->next) {
    if ((*p)->fn == fn && (*p)->ud == ud) {
      struct emi_bw_callback *cb = *p;
      *p = cb->next;
      emi_free(S, cb, sizeof *cb);
      return;
    }
  }
}

void emi_backward_callbacks_free(em_state *S) {
  for (struct emi_bw_callback *cb = S->backward_callbacks, *nx; cb; cb = nx) {
    nx = cb->next;
    emi_free(S, cb, sizeof *cb);
  }
  S->backward_callbacks = NULL;
}

/* Every callback runs, even after one failed (each may hold work to finish);
** the first error is the one reported. */
static em_status run_backward_callbacks(em_state *S, em_status st) {
  char first[EMI_ERRMSG_SIZE];
  if (st) memcpy(first, S->errmsg, sizeof first);
  for (struct emi_bw_callback *cb = S->backward_callbacks; cb; cb = cb->next) {
    S->ag_foreign++;
    em_status cst = cb->fn(S, st != EM_OK, cb->ud);
    S->ag_foreign--;
    if (cst && !st) { st = cst; memcpy(first, S->errmsg, sizeof first); }
  }
  if (st) memcpy(S->errmsg, first, sizeof first);
  return st;
}

emi_ag_meta *emi_ag_meta_of(em_tensor *t) {
  if (!t->ag) {
    emi_ag_meta *m = emi_malloc(t->S, sizeof *m);
    if (!m) return NULL;
    memset(m, 0, sizeof *m);
    t->ag = m;
  }
  return t->ag;
}

void emi_ag_release_fields(em_tensor *t) {
  em_state *S = t->S;
  emi_ag_meta *m = t->ag;
  if (!m) return;
  t->ag = NULL;
  emi_ag_node_release(m->grad_fn);
  em_tensor_release(m->grad);
  em_tensor_release(m->grad_dest);
  for (struct emi_ag_hook *h = m->hooks, *nx; h; h = nx) {
    nx = h->next;
    emi_free(S, h, sizeof *h);
  }
  emi_free(S, m, sizeof *m);
}

em_status emi_ag_inplace_error(em_state *S, const char *op, const em_tensor *t) {
  if (!emi_ag_grad_fn(t))
    return emi_error(S, EM_ERR_ARG, "%s: a leaf tensor that requires grad is being used "
                     "in an in-place operation (wrap it in no_grad, or use the "
                     "out-of-place form)", op);
  return emi_error(S, EM_ERR_UNSUPPORTED, "%s: in-place operations on tensors that are "
                   "part of an autograd graph are not supported; use the out-of-place "
                   "form", op);
}

/* -- Nodes ------------------------------------------------------------------------- */

static size_t node_size(int n) { return sizeof(emi_ag_node) + (size_t)n * sizeof(emi_ag_edge); }

static void drop_saved(emi_ag_node *n) {
  for (int k = 0; k < n->nsaved; k++) em_tensor_release(n->saved[k]);
  n->nsaved = 0;
}

/* Frees node n, whose count reached 0, and returns the next node to free: the
** first of its inputs whose count this drops to 0 (any others go on the stack). */
static emi_ag_node *free_node(emi_ag_node *n, emi_ag_node **stack) {
  drop_saved(n);
  em_tensor_release(n->gbuf);
  n->gbuf = NULL;
  emi_ag_node *follow = NULL;
  for (int i = 0; i < n->ninputs; i++) {
    em_tensor_release(n->in[i].leaf);
    emi_ag_node *f = n->in[i].fn;
    if (f && emi_atomic_dec(&f->refcount) == 0) {
      if (!follow) follow = f;
      else { f->next = *stack; *stack = f; }
    }
  }
  em_state *S = n->S;
  if (n->ext_free) n->ext_free(n->ext);
  emi_free(S, n, node_size(n->ninputs));
  return follow;
}

/* Iterative, so that releasing the last tensor of a long chain (an unrolled RNN)
** does not recurse once per node. */
void emi_ag_node_release(emi_ag_node *n) {
  if (!n || emi_atomic_dec(&n->refcount) != 0) return;
  emi_ag_node *stack = NULL;
  while (n) {
    n = free_node(n, &stack);
    if (!n && stack) { n = stack; stack = n->next; }
  }
}

em_status emi_ag_node_new(em_state *S, const char *name, emi_ag_fn fn, em_tensor *out,
                          const em_tensor *const *inputs, int ninputs, emi_ag_node **node) {
  emi_ag_meta *m = emi_ag_meta_of(out);
  emi_ag_node *n = m ? emi_malloc(S, node_size(ninputs)) : NULL;
  if (!n) return emi_error(S, EM_ERR_NOMEM, "%s: out of memory recording for autograd", name);
  memset(n, 0, node_size(ninputs));
  n->refcount = 1;
  n->name = name;
  n->backward = fn;
  n->ninputs = ninputs;
  n->S = S;
  for (int i = 0; i < ninputs; i++) {
    const em_tensor *t = inputs[i];
    emi_ag_edge *e = &n->in[i];
    e->dtype = t->dtype;
    e->device = t->storage->device;   /* a resident tensor's, while its data is away */
    e->ndim = t->ndim;
    memcpy(e->sizes, t->sizes, sizeof *t->sizes * (size_t)t->ndim);
    if (!t->requires_grad) continue;
    if (t->ag->grad_fn) {        /* (requires_grad: the tensor has its block) */
      e->fn = t->ag->grad_fn;
      emi_atomic_inc(&e->fn->refcount);
    } else {
      e->leaf = (em_tensor *)t;
      em_tensor_retain(e->leaf);
    }
  }
  emi_ag_node_release(m->grad_fn);   /* views of a recorded op: replace */
  m->grad_fn = n;
  out->requires_grad = 1;
  *node = n;
  return EM_OK;
}

/* Saved tensors are detached views: a node never holds a handle whose grad_fn
** could lead back to itself. NULL (an absent optional tensor) takes a slot that
** stays empty, so the slots after it keep their places. */
em_status emi_ag_save(em_state *S, emi_ag_node *n, const em_tensor *t) {
  if (n->nsaved >= EMI_AG_SAVED)
    return emi_error(S, EM_ERR_INTERNAL, "%s: too many saved tensors", n->name);
  em_tensor *v = NULL;
  em_status st = t ? em_detach(S, t, &v) : EM_OK;
  if (st) return st;
  n->saved_version[n->nsaved] = t ? emi_version(t) : 0;
  n->saved[n->nsaved++] = v;
  return EM_OK;
}

em_status emi_ag_saved(em_state *S, emi_ag_node *n, int k, em_tensor **t) {
  if (k >= n->nsaved)
    return emi_error(S, EM_ERR_INTERNAL, "%s: saved tensor %d missing", n->name, k);
  em_tensor *v = n->saved[k];
  if (!v) { *t = NULL; return EM_OK; }   /* an empty slot */
  uint32_t now = emi_version(v);
  if (now != n->saved_version[k])
    return emi_error(S, EM_ERR_ARG, "backward: one of the variables needed for gradient "
                     "computation has been modified by an inplace operation: a tensor of "
                     "shape %s saved by %s is at version %u; expected version %u instead",
                     emi_tshape(S, v), n->name, now, n->saved_version[k]);
  *t = v;
  return EM_OK;
}

em_status emi_ag_save_view(em_state *S, emi_ag_node *n, const em_tensor *const *slot,
                           int k) {
  em_status st = EM_OK;
  for (int i = 0; i < k && !st; i++) st = emi_ag_save(S, n, slot[i]);
  return st;
}

em_status emi_ag_load_view(em_state *S, emi_ag_node *n, const em_tensor **slot, int k) {
  for (int i = 0; i < k; i++) {
    em_tensor *t;
    em_status st = emi_ag_saved(S, n, i, &t);
    if (st) return st;
    slot[i] = t;
  }
  return EM_OK;
}

/* -- Backward ------------------------------------------------------------------------- */

/* g summed over the dims where it was broadcast, to the edge's shape, and cast to
** the edge's dtype and device. Returns a new reference (g itself, retained, when
** it fits). */
static em_status fit_grad(em_state *S, const emi_ag_node *n, const emi_ag_edge *e,
                          em_tensor *g, em_tensor *into, em_tensor **out) {
  em_status st;
  em_tensor *r = g, *tmp;
  em_tensor_retain(r);
  int same = r->ndim == e->ndim &&
             !memcmp(r->sizes, e->sizes, sizeof *e->sizes * (size_t)e->ndim);
  if (!same) {
    int lead = r->ndim - e->ndim, dims[EM_MAX_DIMS], nd = 0;
    if (lead < 0) goto bad;
    for (int d = 0; d < r->ndim; d++) {
      if (d < lead) { dims[nd++] = d; continue; }
      int64_t want = e->sizes[d - lead];
      if (r->sizes[d] == want) continue;
      if (want != 1) goto bad;
      dims[nd++] = d;
    }
    if (nd > 0 && into && r->dtype == e->dtype && r->device == e->device) {
      /* the sum straight into the leaf's destination, seen with the kept dims */
      int64_t ks[EM_MAX_DIMS], kst[EM_MAX_DIMS];
      unsigned mask = 0;
      for (int k = 0; k < nd; k++) mask |= 1u << dims[k];
      for (int d = 0; d < r->ndim; d++) ks[d] = (mask >> d & 1) ? 1 : r->sizes[d];
      emi_contiguous_strides(ks, r->ndim, kst);
      if ((st = emi_tensor_view(S, into, ks, kst, r->ndim, into->offset, &tmp))) goto fail;
      st = EMI_DISPATCH(S, "sum", r, reduce, EM_SUM, tmp, r, mask);
      em_tensor_release(r);
      r = tmp;
      if (st) goto fail;
    } else if (nd > 0) {
      if ((st = em_reduce(S, EM_SUM, r, dims, nd, 1, &tmp))) goto fail;
      em_tensor_release(r);
      r = tmp;
    }
    if ((st = em_reshape(S, r, e->sizes, e->ndim, &tmp))) goto fail;
    em_tensor_release(r);
    r = tmp;
  }
  if (r->dtype != e->dtype || r->device != e->device) {   /* to()'s backward, say */
    if ((st = em_to(S, r, e->dtype, e->device, &tmp))) goto fail;
    em_tensor_release(r);
    r = tmp;
  }
  *out = r;
  return EM_OK;
bad:;
  char b[EMI_SHAPE_STR];
  st = emi_error(S, EM_ERR_INTERNAL, "backward: %s produced a gradient of shape %s for an "
                 "input of shape %s", n->name, emi_tshape(S, r),
                 emi_shape_str(b, e->sizes, e->ndim));
fail:
  em_tensor_release(r);
  return st;
}

/* *acc += g (taking g's reference), or *acc = g. A fresh accumulator is never
** written in place while someone else may hold it. */
static em_status accumulate(em_state *S, em_tensor **acc, em_tensor *g) {
  if (!*acc) { *acc = g; return EM_OK; }
  em_tensor *sum;
  em_status st = em_binary(S, EM_ADD, *acc, g, &sum);
  em_tensor_release(g);
  if (st) return st;
  em_tensor_release(*acc);
  *acc = sum;
  return EM_OK;
}

static em_status run_hooks(em_state *S, em_tensor *leaf) {
  for (struct emi_ag_hook *h = leaf->ag->hooks; h; h = h->next) {
    S->ag_foreign++;
    em_status st = h->fn(S, leaf, h->ud);
    S->ag_foreign--;
    if (st) return st;
  }
  return EM_OK;
}

/* One edge into leaf is done (with or without a contribution): when it was the
** last one, the gradient is final and the leaf's hooks run. */
static em_status leaf_edge_done(em_state *S, em_tensor *leaf) {
  if (--leaf->ag->pending != 0 || !leaf->ag->grad) return EM_OK;
  if (__builtin_expect(S->profiler != NULL, 0)) {  /* gradient bytes per step */
    double t = emi_now();
    emi_profile_span(S, EM_PROF_GRAD, "grad", t, t,
                     leaf->ag->grad->numel * (int64_t)em_dtype_size(leaf->ag->grad->dtype));
  }
  return run_hooks(S, leaf);
}

/* -- Walks ----------------------------------------------------------------------------
** One backward is one walk: the nodes it discovered (each marked with the walk, so
** that a backward run inside another -- from a custom function's backward --
** keeps its own dependency counts and buffers, and refuses to share nodes with
** the walk outside it) and, for em_backward_capture, the leaves whose gradients
** it returns instead of accumulating (each leaf's ag_capture names the walk).
**
** Leaf counts stay balanced across nesting: discover adds one to ag_pending per
** edge into a leaf, and every such edge takes exactly one away -- when its node
** runs, or, for nodes an error left unrun, at the walk's end. So a leaf shared
** with an outer walk is back at the outer walk's count when an inner one ends,
** and its gradient is final (hooks run) only when the last of all edges is done.
** End-of-backward callbacks run when the outermost walk ends (S->ag_depth). */
struct emi_ag_walk {
  emi_ag_node **nodes;
  int nn, cn;
  int counted;                 /* leaf edges were added to ag_pending */
  em_tensor *const *wrt;       /* capture: the leaves, their gradients */
  int nwrt;
  em_tensor **grads;
};

static em_status push(em_state *S, emi_ag_walk *w, emi_ag_node *n) {
  if (n->walk && n->walk != w)
    return emi_error(S, EM_ERR_UNSUPPORTED, "backward: a backward run inside another (from "
                     "a custom function's backward) reaches %s, a node of the backward "
                     "outside it; the inner backward must use a graph of its own", n->name);
  if (w->nn == w->cn) {
    int nc = w->cn ? w->cn * 2 : 32;
    emi_ag_node **na = emi_malloc(S, sizeof *na * (size_t)nc);
    if (!na) return emi_error(S, EM_ERR_NOMEM, "backward: out of memory");
    if (w->nn) memcpy(na, w->nodes, sizeof *na * (size_t)w->nn);
    emi_free(S, w->nodes, sizeof *w->nodes * (size_t)w->cn);
    w->nodes = na;
    w->cn = nc;
  }
  n->walk = w;
  n->deps = 0;
  n->ran = 0;
  w->nodes[w->nn++] = n;
  return EM_OK;
}

/* Every node reachable from root gets deps = number of edges into it; then every
** leaf not captured by this walk gets one ag_pending per edge into it. */
static em_status discover(em_state *S, emi_ag_node *root, emi_ag_walk *w) {
  em_status st = push(S, w, root);
  for (int k = 0; k < w->nn && !st; k++) {
    emi_ag_node *n = w->nodes[k];
    for (int i = 0; i < n->ninputs && !st; i++) {
      emi_ag_node *f = n->in[i].fn;
      if (!f) continue;
      if (f->walk != w && (st = push(S, w, f))) break;
      f->deps++;
    }
  }
  if (st) return st;
  for (int k = 0; k < w->nn; k++) {
    emi_ag_node *n = w->nodes[k];
    for (int i = 0; i < n->ninputs; i++) {
      em_tensor *leaf = n->in[i].leaf;
      if (leaf && leaf->ag->capture != w) leaf->ag->pending++;
    }
  }
  w->counted = 1;
  return EM_OK;
}

/* Where a captured leaf's gradient goes: the first slot naming it. */
static em_tensor **capture_slot(emi_ag_walk *w, const em_tensor *leaf) {
  for (int k = 0; k < w->nwrt; k++)
    if (w->wrt[k] == leaf) return &w->grads[k];
  return NULL;
}

/* A node's backward. When it runs out of memory in scratch of its own (a kernel's
** emi_malloc: tensor storage already retries in tensor.c), the host's reclaim runs
** and the node runs once more: a built-in node leaves nothing behind before it
** returns its gradients, which are let go first. A custom node (ext_free set) is
** the host's code, whose ops retry themselves. */
static em_status call_backward(em_state *S, emi_ag_node *n, em_tensor *g, em_tensor **gin) {
  em_status st = n->backward(S, n, g, gin);
  if (st == EM_ERR_NOMEM && !n->ext_free && emi_backward_reclaim(S)) {
    for (int i = 0; i < n->ninputs; i++) {
      em_tensor_release(gin[i]);
      gin[i] = NULL;
    }
    st = n->backward(S, n, g, gin);
  }
  return st;
}

static em_status run_node(em_state *S, emi_ag_walk *w, emi_ag_node *n, emi_ag_node **ready) {
  em_status st = EM_OK;
  n->ran = 1;
  em_tensor *gin_small[4] = {0}, **gin = gin_small;
  if (n->freed) {
    st = emi_error(S, EM_ERR_ARG, "backward: trying to backward through the graph a "
                   "second time (through %s); its saved values were freed by the first "
                   "backward", n->name);
  } else if (n->ninputs > 4) {
    gin = emi_malloc(S, sizeof *gin * (size_t)n->ninputs);
    if (!gin) {
      gin = gin_small;
      st = emi_error(S, EM_ERR_NOMEM, "backward: out of memory");
    } else {
      memset(gin, 0, sizeof *gin * (size_t)n->ninputs);
    }
  }
  em_tensor *g = n->gbuf;
  n->gbuf = NULL;
  if (g && !st) {
    if (__builtin_expect(S->profiler != NULL, 0)) {   /* the node, around its ops */
      double t0 = emi_now();
      st = call_backward(S, n, g, gin);
      emi_profile_span(S, EM_PROF_BACKWARD, n->name, t0, emi_now(), 0);
    } else {
      st = call_backward(S, n, g, gin);
    }
  }
  em_tensor_release(g);
  /* as in PyTorch, only a node that needed saved values can't run again */
  if (n->nsaved && !n->freed) n->freed = 1;
  drop_saved(n);
  /* every edge is settled, even after an error: leaf counts must stay exact */
  for (int i = 0; i < n->ninputs; i++) {
    emi_ag_edge *e = &n->in[i];
    em_tensor *gi = gin == gin_small && i >= 4 ? NULL : gin[i];
    if (gin != gin_small || i < 4) gin[i] = NULL;
    em_tensor *fit = NULL;
    em_tensor *into = NULL;
    if (!st && gi && e->leaf && e->leaf->ag->capture != w && gi->numel != e->leaf->numel) {
      int64_t cst[EM_MAX_DIMS];        /* a broadcast gradient summed straight in */
      emi_contiguous_strides(e->sizes, e->ndim, cst);
      into = emi_ag_grad_dest(S, n, i, cst);
    }
    if (!st && gi && (e->fn || e->leaf)) st = fit_grad(S, n, e, gi, into, &fit);
    if (into && !(fit && emi_ag_is_dest(e->leaf->ag->grad_dest, fit))) e->leaf->ag->dest_busy = 0;
    em_tensor_release(into);
    em_tensor_release(gi);
    if (e->fn) {
      if (fit) st = accumulate(S, &e->fn->gbuf, fit);
      if (--e->fn->deps == 0) { e->fn->next = *ready; *ready = e->fn; }
    } else if (e->leaf && e->leaf->ag->capture == w) {
      if (fit) st = accumulate(S, capture_slot(w, e->leaf), fit);
    } else if (e->leaf) {
      if (fit) st = emi_ag_leaf_add(S, e->leaf, fit);
      if (st) e->leaf->ag->pending--;
      else st = leaf_edge_done(S, e->leaf);
    }
  }
  if (gin != gin_small) emi_free(S, gin, sizeof *gin * (size_t)n->ninputs);
  return st;
}

/* Leaves no scratch state behind, whatever happened: edges of nodes an error left
** unrun give back their leaf counts. */
static void walk_end(em_state *S, emi_ag_walk *w) {
  for (int k = 0; k < w->nn; k++) {
    emi_ag_node *n = w->nodes[k];
    if (w->counted && !n->ran)
      for (int i = 0; i < n->ninputs; i++) {
        em_tensor *leaf = n->in[i].leaf;
        if (leaf && leaf->ag->capture != w) leaf->ag->pending--;
      }
    for (int i = 0; i < n->ninputs; i++)   /* a claim an error left unfulfilled */
      if (n->in[i].leaf) n->in[i].leaf->ag->dest_busy = 0;
    n->deps = 0;
    n->ran = 0;
    n->walk = NULL;
    em_tensor_release(n->gbuf);
    n->gbuf = NULL;
  }
  emi_free(S, w->nodes, sizeof *w->nodes * (size_t)w->cn);
}

/* The gradient of root to start from: grad moved to root's dtype and device, or
** ones for a one-element root. */
static em_status seed_grad(em_state *S, const char *op, em_tensor *root, const em_tensor *grad,
                           em_tensor **g) {
  if (!root->requires_grad)
    return emi_error(S, EM_ERR_ARG, "%s: element 0 of tensors does not require grad "
                     "and does not have a grad_fn", op);
  if (!grad) {
    if (root->numel != 1)
      return emi_error(S, EM_ERR_SHAPE, "%s: grad can be implicitly created only for "
                       "scalar outputs (the root has shape %s); pass a gradient", op,
                       emi_tshape(S, root));
    return em_full(S, root->sizes, root->ndim, 1.0, root->dtype, root->device, g);
  }
  if (grad->ndim != root->ndim ||
      memcmp(grad->sizes, root->sizes, sizeof *root->sizes * (size_t)root->ndim))
    return emi_error(S, EM_ERR_SHAPE, "%s: mismatch in shape: grad_output has shape "
                     "%s and output has shape %s", op, emi_tshape(S, grad),
                     emi_tshape(S, root));
  return em_to(S, grad, root->dtype, root->device, g);
}

/* The walk from root with gradient g (taken). */
static em_status walk_run(em_state *S, emi_ag_walk *w, em_tensor *root, em_tensor *g) {
  em_status st;
  if (!emi_ag_grad_fn(root)) {       /* backward on a leaf: its grad is g */
    em_tensor **slot = root->ag->capture == w ? capture_slot(w, root) : NULL;
    if (slot) return accumulate(S, slot, g);
    root->ag->pending++;
    if ((st = emi_ag_leaf_add(S, root, g))) { root->ag->pending--; return st; }
    return leaf_edge_done(S, root);
  }
  emi_ag_node *root_node = emi_ag_grad_fn(root), *ready;
  if ((st = discover(S, root_node, w))) { em_tensor_release(g); return st; }
  root_node->gbuf = g;
  root_node->next = NULL;
  ready = root_node;
  while (ready && !st) {
    emi_ag_node *n = ready;
    ready = n->next;
    st = run_node(S, w, n, &ready);
  }
  return st;
}

/* -- Memory inside a backward -----------------------------------------------------
** The ops a host calls retry themselves after an out-of-memory error (the Lua
** layer collects its garbage first); the engine's own kernels allocate from C,
** where such an error was final -- though the garbage a step leaves (tensors
** the host let go of, freed at its next collection) may be what fills the
** device. So when one of them fails, the host's reclaim runs and the allocation
** is tried once more (tensor.c), or, for a kernel's own scratch, the node runs
** once more (call_backward). Only from the engine's own work: inside a
** custom node, a hook or a callback the ops are the host's (ag_foreign), and a
** host such as LuaJIT may not be entered from a C call its JIT compiled -- each
** em_backward resets the mark, as its callers are kept out of the JIT -- and
** only on the backward's own thread (a loader's workers allocate too). */
/* The state whose backward runs on this thread (innermost): a thread-local, so
** that a loader worker allocating meanwhile reads nothing the backward writes. */
static __thread em_state *backward_state;

void em_backward_set_reclaim(em_state *S, em_backward_reclaim_fn fn, void *ud) {
  S->ag_reclaim = fn;
  S->ag_reclaim_ud = ud;
}

int emi_backward_reclaim(em_state *S) {
  if (backward_state != S || !S->ag_reclaim || S->ag_foreign || S->ag_reclaiming) return 0;
  S->ag_reclaiming = 1;
  S->ag_reclaim(S, S->ag_reclaim_ud);
  S->ag_reclaiming = 0;
  return 1;
}

/* Grad mode off, the probe hidden, depth counted, the walk run and cleaned up;
** the callbacks run when the outermost backward ends. */
static em_status backward(em_state *S, emi_ag_walk *w, em_tensor *root, em_tensor *g) {
  int was_disabled = S->grad_disabled, foreign = S->ag_foreign;
  em_state *outer = backward_state;
  struct emi_ag_probe *probe = S->ag_probe;
  S->ag_probe = NULL;
  emi_set_grad_disabled(S, 1);
  S->ag_depth++;
  S->ag_foreign = 0;
  backward_state = S;
  em_status st = walk_run(S, w, root, g);
  walk_end(S, w);
  S->ag_foreign = foreign;
  backward_state = outer;
  if (--S->ag_depth == 0) st = run_backward_callbacks(S, st);
  S->ag_probe = probe;
  emi_set_grad_disabled(S, was_disabled);
  return st;
}

em_status em_backward(em_state *S, em_tensor *root, const em_tensor *grad) {
  em_status st = emi_check_tensor(S, "backward", root);
  if (st) return st;
  em_tensor *g;
  if ((st = seed_grad(S, "backward", root, grad, &g))) return st;
  emi_ag_walk w = {0};
  return backward(S, &w, root, g);
}

em_status em_backward_capture(em_state *S, em_tensor *root, const em_tensor *grad,
                              em_tensor *const *wrt, int n, em_tensor **grads) {
  em_status st = emi_check_tensor(S, "backward_capture", root);
  if (st) return st;
  if (n < 0 || (n > 0 && (!wrt || !grads)))
    return emi_error(S, EM_ERR_ARG, "backward_capture: bad list of %d tensors", n);
  for (int k = 0; k < n; k++) {
    const em_tensor *t = wrt[k];
    if (!t)
      return emi_error(S, EM_ERR_ARG, "backward_capture: tensor %lld of wrt is NULL",
                       (long long)emi_ix(S, k));
    if (!t->requires_grad || emi_ag_grad_fn(t))
      return emi_error(S, EM_ERR_ARG, "backward_capture: tensor %lld of wrt (shape %s) is "
                       "%s; only leaves that require grad can be captured",
                       (long long)emi_ix(S, k), emi_tshape(S, t),
                       emi_ag_grad_fn(t) ? "not a leaf" : "a tensor that does not require grad");
  }
  em_tensor *g;
  if ((st = seed_grad(S, "backward_capture", root, grad, &g))) return st;
  struct emi_ag_walk *old_small[8], **old = old_small;
  if (n > 8 && !(old = emi_malloc(S, sizeof *old * (size_t)n))) {
    em_tensor_release(g);
    return emi_error(S, EM_ERR_NOMEM, "backward_capture: out of memory");
  }
  emi_ag_walk w = {.wrt = wrt, .nwrt = n, .grads = grads};
  for (int k = 0; k < n; k++) grads[k] = NULL;
  for (int k = 0; k < n; k++) {     /* nested captures of one leaf: the innermost wins */
    old[k] = wrt[k]->ag->capture;
    wrt[k]->ag->capture = &w;
  }
  st = backward(S, &w, root, g);
  for (int k = n - 1; k >= 0; k--) wrt[k]->ag->capture = old[k];
  if (old != old_small) emi_free(S, old, sizeof *old * (size_t)n);
  for (int k = 0; k < n; k++) {
    if (st) { em_tensor_release(grads[k]); grads[k] = NULL; continue; }
    for (int j = 0; j < k && !grads[k]; j++)   /* a leaf named twice: both slots */
      if (wrt[j] == wrt[k] && grads[j]) { em_tensor_retain(grads[j]); grads[k] = grads[j]; }
  }
  return st;
}

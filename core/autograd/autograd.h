/*
** autograd.h -- internal interface of the autograd engine (core/autograd/):
** graph nodes, how ops record them, and small helpers for backward formulas.
**
** How to make a new op differentiable (e.g. conv2d in ops/nn_conv.c):
**
**  1. At the end of the public op, once *out is computed and nothing after it
**     can fail, add ONE branch (the no-grad path must stay a single test):
**
**         if (emi_ag_wanted2(S, x, w))
**           return emi_ag_record_conv2d(S, x, w, args..., out);
**
**     emi_ag_wanted1/2/3 look at requires_grad of the inputs and the grad mode.
**  2. Write emi_ag_record_conv2d in core/autograd/grad_<family>.c:
**
**         const em_tensor *in[2] = {x, w};
**         emi_ag_node *n;
**         em_status st = emi_ag_node_new(S, "conv2d", conv2d_backward, *out, in, 2, &n);
**         if (st) return emi_ag_fail(out, st);     (releases *out, sets it NULL)
**         n->iarg[CONV_GROUPS] = groups; ...       (op parameters, at positions
**                                                   named by an enum in the file)
**         conv2d_saved v = {.x = x, .weight = w};   (a named view, see below)
**         if ((st = EMI_AG_SAVE_VIEW(S, n, v))) return emi_ag_fail(out, st);
**         return EM_OK;
**
**     Declare it below beside the others. emi_ag_node_new links the node to the
**     inputs that require grad (integer inputs never do) and makes it *out's
**     grad_fn; n->in[i] keeps each input's shape and dtype. emi_ag_save keeps a
**     detached view of a tensor and its storage version (a later in-place write
**     to it is reported at backward). Save only what the formula reads: saved
**     tensors keep activations alive until backward, and a node that saved
**     nothing may run again in a second backward. An op with several outputs
**     (batch_norm's mean/rstd) records on the differentiable one and saves the
**     others for its backward.
**  3. The backward function gets the gradient g of the output (same shape and
**     dtype as the output) and writes a NEW reference into gin[i] for every
**     input i with emi_ag_needs(n, i) (others may stay NULL). Compute it with
**     the public em_* ops (grad mode is off during backward, so nothing is
**     recorded and every backend works); EMI_AG_LOAD_VIEW(S, n, v) fetches the
**     saved tensors into v's fields (borrowed) after checking their versions,
**     and emi_ag_saved(S, n, k, &t) fetches slot k alone. A gradient may be
**     broadcast-shaped or of another floating dtype: the engine sums it back to
**     the input's shape and casts it to the input's dtype. An op that has a
**     public backward kernel (em_conv2d_backward, em_max_pool2d_backward, ...)
**     just calls it. The emi_f helpers below chain ops with one error check at
**     the end (see grad_elementwise.c for examples). On error, return it: the
**     engine releases whatever gin already holds.
**
** In-place ops call emi_ag_inplace(S, name, t) before writing t: it bumps t's
** storage version and refuses writes into tensors autograd is tracking.
*/
#ifndef EMBER_AUTOGRAD_H
#define EMBER_AUTOGRAD_H
#include "../internal.h"
#include <stddef.h>

typedef struct emi_ag_node emi_ag_node;
typedef struct emi_ag_walk emi_ag_walk;   /* one running backward (engine.c) */
typedef em_status (*emi_ag_fn)(em_state *S, emi_ag_node *n, const em_tensor *g,
                               em_tensor **gin);

/* Where the gradient of input i goes: a leaf's .grad or another node. */
typedef struct emi_ag_edge {
  em_tensor *leaf;         /* owned reference, or NULL */
  emi_ag_node *fn;         /* owned reference, or NULL */
  em_dtype dtype;
  int device;              /* a gradient arriving on another device is moved here */
  int ndim;
  int64_t sizes[EM_MAX_DIMS];
} emi_ag_edge;

enum { EMI_AG_SAVED = 4, EMI_AG_IARGS = 3 * EM_MAX_DIMS + 4 };

struct emi_ag_node {
  int refcount;
  em_state *S;
  const char *name;
  emi_ag_fn backward;
  int freed;                             /* backward ran and dropped saved tensors */
  int nsaved;
  em_tensor *saved[EMI_AG_SAVED];
  uint32_t saved_version[EMI_AG_SAVED];
  int op;                                /* op code (unop, binop, redop, ...) */
  int64_t iarg[EMI_AG_IARGS];
  double darg[2];
  /* custom functions (function.c): their data, freed with the node */
  void *ext;
  void (*ext_free)(void *ext);
  /* engine scratch */
  struct emi_ag_walk *walk;              /* the backward that discovered it */
  int ran;                               /* its backward ran in that walk */
  int deps;
  em_tensor *gbuf;
  emi_ag_node *next;
  int ninputs;
  emi_ag_edge in[];
};

/* Whether an op records. The no-grad path is one test: requires_grad against
** ag_watch (grad mode on, or a probe listening). A probe (probe.c) listens with
** grad mode off: it notes the operands that require grad and the op records
** nothing. */
int emi_ag_probe_note(em_state *S, const em_tensor *a, const em_tensor *b,
                      const em_tensor *c);   /* returns 0 */
static inline int emi_ag_recording(em_state *S, const em_tensor *a, const em_tensor *b,
                                   const em_tensor *c) {
  return !S->grad_disabled || emi_ag_probe_note(S, a, b, c);
}
static inline int emi_ag_wanted1(em_state *S, const em_tensor *a) {
  return (a->requires_grad & S->ag_watch) && emi_ag_recording(S, a, NULL, NULL);
}
static inline int emi_ag_wanted2(em_state *S, const em_tensor *a, const em_tensor *b) {
  return ((a->requires_grad | b->requires_grad) & S->ag_watch) &&
         emi_ag_recording(S, a, b, NULL);
}
static inline int emi_ag_wanted3(em_state *S, const em_tensor *a, const em_tensor *b,
                                 const em_tensor *c) {
  return ((a->requires_grad | b->requires_grad | c->requires_grad) & S->ag_watch) &&
         emi_ag_recording(S, a, b, c);
}
/* Lists (cat, stack, custom functions). */
int emi_ag_probe_note_list(em_state *S, const em_tensor *const *list, int n);
static inline int emi_ag_wanted_list(em_state *S, const em_tensor *const *list, int n) {
  if (!S->ag_watch) return 0;
  for (int i = 0; i < n; i++)
    if (list[i]->requires_grad)
      return !S->grad_disabled || emi_ag_probe_note_list(S, list, n);
  return 0;
}
static inline int emi_ag_needs(const emi_ag_node *n, int i) {
  return n->in[i].leaf || n->in[i].fn;
}
static inline em_status emi_ag_fail(em_tensor **out, em_status st) {
  em_tensor_release(*out);
  *out = NULL;
  return st;
}

/* leaf_grad.c: g (taken) into leaf's .grad -- the first contribution becomes it,
** later ones are added in place. Gradient destinations (leaf_grad.c explains): a
** leaf's dest (retained; NULL clears it), and, for a producer, a new reference to
** memory it may write input i's whole gradient into, laid out with the given
** strides, or NULL (then it allocates as usual). What it gets must be what it
** hands on as gin[i]. */
em_status emi_ag_leaf_add(em_state *S, em_tensor *leaf, em_tensor *g);
/* Whether g is dest itself, or a view of exactly its elements in its layout. */
int emi_ag_is_dest(const em_tensor *dest, const em_tensor *g);
em_status emi_ag_set_grad_dest(em_state *S, em_tensor *leaf, em_tensor *dest);
em_tensor *emi_ag_grad_dest(em_state *S, const emi_ag_node *n, int i, const int64_t *strides);
int emi_ag_is_transpose2(const emi_ag_node *n);   /* grad_shape.c: a 2-D transpose */
/* ops/linalg.c: a 2-D product into a row-contiguous out of its dtype */
em_status emi_matmul_into(em_state *S, const em_tensor *a, const em_tensor *b, em_tensor *out);
/* ops/nn_conv.c: em_conv2d_backward writing the weight and bias gradients into
** the given tensors (either may be NULL) */
em_status emi_conv2d_backward_into(em_state *S, const em_tensor *grad_out,
                                   const em_tensor *input, const em_tensor *weight,
                                   const int64_t *stride, const int64_t *padding,
                                   const int64_t *dilation, int64_t groups,
                                   em_tensor **grad_input, em_tensor **grad_weight,
                                   em_tensor **grad_bias, em_tensor *gw_into,
                                   em_tensor *gb_into);
em_status emi_ag_node_new(em_state *S, const char *name, emi_ag_fn fn, em_tensor *out,
                          const em_tensor *const *inputs, int n, emi_ag_node **node);
em_status emi_ag_save(em_state *S, emi_ag_node *n, const em_tensor *t);
em_status emi_ag_saved(em_state *S, emi_ag_node *n, int k, em_tensor **t);
em_status emi_ag_save_view(em_state *S, emi_ag_node *n, const em_tensor *const *slot,
                           int k);
em_status emi_ag_load_view(em_state *S, emi_ag_node *n, const em_tensor **slot, int k);
void emi_ag_node_release(emi_ag_node *n);

/* -- Named views of saved tensors -----------------------------------------------------
** The node keeps its saved tensors in numbered slots; an op reads and writes
** them through a view that names them: a union of a struct of const em_tensor *
** fields and slot[], one slot per field, field k being the node's slot k.
**
**     typedef union conv2d_saved {
**       struct { const em_tensor *x, *weight; };
**       const em_tensor *slot[2];
**     } conv2d_saved;
**     EMI_AG_VIEW_CHECK(conv2d_saved, weight);      (its last field)
**
** The recorder fills the fields by name and calls EMI_AG_SAVE_VIEW; the backward
** calls EMI_AG_LOAD_VIEW and reads v.x, v.weight. A field left NULL (an absent
** optional tensor) keeps its slot and loads as NULL. */
#define EMI_AG_VIEW_LEN(v) ((int)(sizeof(v).slot / sizeof *(v).slot))
#define EMI_AG_SAVE_VIEW(S, n, v) emi_ag_save_view(S, n, (v).slot, EMI_AG_VIEW_LEN(v))
#define EMI_AG_LOAD_VIEW(S, n, v) emi_ag_load_view(S, n, (v).slot, EMI_AG_VIEW_LEN(v))
/* The fields of view type T fill its slots exactly, last being the last field. */
#define EMI_AG_VIEW_CHECK(T, last)                                                        \
  _Static_assert(sizeof(T) == sizeof(((T *)0)->slot) &&                                  \
                     offsetof(T, last) == sizeof(T) - sizeof(const em_tensor *),         \
                 #T ": its fields and slots differ")

/* -- Formula helpers (formula.c) -----------------------------------------------------
** An emi_f collects every intermediate; after the first error each helper returns
** NULL and does nothing. emi_f_end hands out a new reference to r and releases
** the rest. */
enum { EMI_F_MAX = 48 };
typedef struct emi_f {
  em_state *S;
  em_status st;
  int n;
  em_tensor *t[EMI_F_MAX];
} emi_f;
void emi_f_init(emi_f *f, em_state *S);
/* Call as emi_f_keep(f, em_op(..., &r), &r): r is read after the call. */
em_tensor *emi_f_keep(emi_f *f, em_status st, em_tensor **t);
em_tensor *emi_f_un(emi_f *f, em_unop op, const em_tensor *a);
em_tensor *emi_f_bin(emi_f *f, em_binop op, const em_tensor *a, const em_tensor *b);
em_tensor *emi_f_sc(emi_f *f, em_binop op, const em_tensor *a, double s);   /* a op s */
em_tensor *emi_f_rsc(emi_f *f, em_binop op, double s, const em_tensor *a);  /* s op a */
em_tensor *emi_f_zeros(emi_f *f, const int64_t *sizes, int ndim, em_dtype dt, int device);
em_tensor *emi_f_reshape(emi_f *f, const em_tensor *a, const int64_t *sizes, int ndim);
/* g (reduced over mask, keepdim or not) expanded back to sizes. */
em_tensor *emi_f_unreduce(emi_f *f, const em_tensor *g, unsigned mask, int keepdim,
                          const int64_t *sizes, int ndim);
em_status emi_f_end(emi_f *f, em_tensor *r, em_tensor **out);
/* For several outputs: *slot = new reference to t (unless an error happened), then
** emi_f_done releases the intermediates and returns the first error. */
void emi_f_out(emi_f *f, em_tensor *t, em_tensor **slot);
em_status emi_f_done(emi_f *f);

/* Recording entry points, one per op family (grad_*.c). Each takes ownership of
** *out on failure (released, set to NULL). */
em_status emi_ag_record_unary(em_state *S, em_unop op, const em_tensor *a, em_tensor **out);
em_status emi_ag_record_binary(em_state *S, em_binop op, const em_tensor *a,
                               const em_tensor *b, em_tensor **out);
em_status emi_ag_record_scalar(em_state *S, em_binop op, const em_tensor *a, double s,
                               int reverse, em_tensor **out);
em_status emi_ag_record_add_scaled(em_state *S, const em_tensor *a, const em_tensor *b,
                                   double alpha, em_tensor **out);
em_status emi_ag_record_clamp(em_state *S, const em_tensor *a, double lo, double hi,
                              em_tensor **out);
em_status emi_ag_record_where(em_state *S, const em_tensor *cond, const em_tensor *a,
                              const em_tensor *b, em_tensor **out);
/* clone / contiguous / to: gradient passes through (cast back by the engine). */
em_status emi_ag_record_copy(em_state *S, const char *name, const em_tensor *a,
                             em_tensor **out);
/* Views: reshape-like (view, reshape, squeeze, unsqueeze), permutations,
** expand, and views by geometry (narrow, select, as_strided). */
em_status emi_ag_record_reshape(em_state *S, const char *name, const em_tensor *a,
                                em_tensor **out);
em_status emi_ag_record_permute(em_state *S, const em_tensor *a, const int *perm,
                                em_tensor **out);
em_status emi_ag_record_expand(em_state *S, const em_tensor *a, em_tensor **out);
em_status emi_ag_record_strided(em_state *S, const char *name, const em_tensor *a,
                                em_tensor **out);
em_status emi_ag_record_matmul(em_state *S, const em_tensor *a, const em_tensor *b,
                               em_tensor **out);

/* cat / stack (stack != 0) of n tensors along dim. */
em_status emi_ag_record_join(em_state *S, int stack, em_tensor *const *list, int n, int dim,
                             em_tensor **out);
/* index_select (gather == 0) / gather with a saved index. */
em_status emi_ag_record_index(em_state *S, int gather, const em_tensor *a, int dim,
                              const em_tensor *idx, int index_base, em_tensor **out);

/* Reductions (grad_reduce.c): mask has bit d set for each reduced dim of a. */
em_status emi_ag_record_reduce(em_state *S, em_redop op, const em_tensor *a, unsigned mask,
                               int keepdim, em_tensor **out);
em_status emi_ag_record_var(em_state *S, const em_tensor *a, unsigned mask, double correction,
                            int keepdim, int take_sqrt, em_tensor **out);
em_status emi_ag_record_norm(em_state *S, const em_tensor *a, double p, unsigned mask,
                             int keepdim, em_tensor **out);
/* max/min along dim: records on *values, saving indices. */
em_status emi_ag_record_arg(em_state *S, const em_tensor *a, int dim, int keepdim,
                            int index_base, em_tensor **values, const em_tensor *indices);
em_status emi_ag_record_softmax(em_state *S, const em_tensor *a, int dim, int log,
                                em_tensor **out);
/* cumsum / cumprod (op: EMI_SCAN_*) along dim (grad_scan.c). */
em_status emi_ag_record_scan(em_state *S, int op, const em_tensor *a, int dim,
                             em_tensor **out);

/* In-place ops call this first: it refuses in-place writes autograd can't follow
** and bumps the storage version so saved tensors notice the write. */
em_status emi_ag_inplace_error(em_state *S, const char *op, const em_tensor *t);
static inline em_status emi_ag_inplace(em_state *S, const char *op, const em_tensor *t) {
  emi_bump_version(t);
  if (t->requires_grad & !S->grad_disabled) return emi_ag_inplace_error(S, op, t);
  return EM_OK;
}

#endif

/*
** fuse.c -- passes over a finished record that replace a chain of calls by one
** fused call doing the same work in one pass over memory (em.compile's "fuse").
** The passes, in order: ReLU's backward; a convolution or batch norm and the ReLU
** after it; max pooling's backward and the ReLU backward after it (each explained
** at its code); then element-wise chains (chain.c). Each fused call names the ops
** it does (emi_rec.inside), for explain() and the profiler.
**
** ReLU's backward. Autograd computes it as g * (x > 0): three calls, each a
** pass over an activation-sized tensor -- a comparison writing a bool mask, the
** mask widened to g's dtype, the product -- and two temporaries. The fused call
** reads x and g once and writes the gradient: out = x > 0 ? g : 0, which is the
** product's value exactly (g * 1 or g * 0; a NaN or infinite g times 0 is NaN,
** kept as such; bfloat16 computed in float and rounded once, as the product is).
**
** Rules for any pass. A chain is fused only when the temporaries it removes are
** used by nothing else: no other call reads them and nothing outside the program
** holds them (their storages' reference counts are the program's views). The
** fused call takes the first call's place; the others become no-ops; the views
** of the removed temporaries are released (their memory goes at once), and the
** views the fused call reads and writes are moved to its place, so the memory
** plan sees the lifetimes the replay has.
*/
#include "entries.h"
#include "cpu/cpu.h"
#include <stdlib.h>

/* -- Held views ----------------------------------------------------------------------- */
static size_t slot_of(const em_program *p, const em_tensor *v) {
  for (size_t j = 0; j < p->nheld; j++)
    if (p->held[j] == v) return j;
  return (size_t)-1;
}

/* The program's views of storage st, and whether that is all that holds it. */
static int only_views(const em_program *p, const emi_storage *st, int want) {
  int n = 0;
  for (size_t j = 0; j < p->nheld; j++)
    if (p->held[j] && p->held[j]->storage == st) n++;
  return n == want && __atomic_load_n(&st->refcount, __ATOMIC_ACQUIRE) == want;
}

static void drop(em_program *p, const em_tensor *v) {
  size_t j = slot_of(p, v);
  if (j == (size_t)-1) return;
  em_tensor_release(p->held[j]);
  p->held[j] = NULL;
}

static void move_to(em_program *p, const em_tensor *v, int rec) {
  size_t j = slot_of(p, v);
  if (j != (size_t)-1) p->uses[j].rec = rec;
}

/* a and b: dense, of one dtype, shape and strides: element i of each is at the
** same flat place. */
static int dense_like(const em_tensor *a, const em_tensor *b) {
  return a->dtype == b->dtype && a->ndim == b->ndim && emi_compile_dense(a) &&
         emi_compile_dense(b) &&
         !memcmp(a->sizes, b->sizes, (size_t)a->ndim * sizeof *a->sizes) &&
         !memcmp(a->strides, b->strides, (size_t)a->ndim * sizeof *a->strides);
}

/* -- ReLU's backward -------------------------------------------------------------------- */
typedef struct { em_tensor *out; const em_tensor *g, *x; } relu_bw_args;

typedef struct { void *out; const void *g, *x; } relu_bw_ctx;
static void relu_bw_f32(void *c, int64_t b, int64_t e) {
  relu_bw_ctx *k = c;
  float *o = k->out;
  const float *g = k->g, *x = k->x;
  for (int64_t i = b; i < e; i++) o[i] = x[i] > 0 ? g[i] : g[i] * 0.0f;
}
static void relu_bw_f64(void *c, int64_t b, int64_t e) {
  relu_bw_ctx *k = c;
  double *o = k->out;
  const double *g = k->g, *x = k->x;
  for (int64_t i = b; i < e; i++) o[i] = x[i] > 0 ? g[i] : g[i] * 0.0;
}

/* bfloat16: as the unfused product computes it, in float and rounded once */
static void relu_bw_bf16(void *c, int64_t b, int64_t e) {
  relu_bw_ctx *k = c;
  uint16_t *o = k->out;
  const uint16_t *g = k->g, *x = k->x;
  for (int64_t i = b; i < e; i++)
    o[i] = emi_float_to_bf16(emi_bf16_to_float(g[i]) * (emi_bf16_to_float(x[i]) > 0 ? 1.0f : 0.0f));
}

static em_status play_relu_bw(emi_device *d, void *q, const emi_replay *r) {
  (void)r;
  relu_bw_args *a = q;
  relu_bw_ctx k = {em_tensor_data(a->out), em_tensor_data(a->g), em_tensor_data(a->x)};
  em_dtype dt = a->out->dtype;
  emi_parallel_for(d->S, a->out->numel, 1 << 14,
                   dt == EM_FLOAT32 ? relu_bw_f32 : dt == EM_FLOAT64 ? relu_bw_f64 : relu_bw_bf16,
                   &k);
  return EM_OK;
}

/* Calls r, r+1, r+2 are mask = x > 0; wide = mask as g's dtype; out = g * wide
** (either order), with mask and wide used nowhere else: fused. */
static int fuse_relu_bw(em_program *p, int r) {
  emi_rec *c0 = &p->recs[r], *c1 = &p->recs[r + 1], *c2 = &p->recs[r + 2];
  if (c0->entry != EMI_ENTRY_binary_scalar || c1->entry != EMI_ENTRY_copy ||
      c2->entry != EMI_ENTRY_binary)
    return 0;
  args_binary_scalar *gt = c0->args;
  args_copy *widen = c1->args;
  args_binary *mul = c2->args;
  if (gt->op != EM_GT || gt->s != 0 || gt->reverse || !gt->out || !gt->a || !widen->out ||
      !widen->src || !mul->out || !mul->a || !mul->b || mul->op != EM_MUL)
    return 0;
  const em_tensor *mask = gt->out, *wide = widen->out, *x = gt->a;
  if (widen->src->storage != mask->storage || mask->dtype != EM_BOOL) return 0;
  const em_tensor *g = mul->a->storage == wide->storage ? mul->b
                     : mul->b->storage == wide->storage ? mul->a : NULL;
  const em_tensor *out = mul->out;
  if (!g || (g->dtype != EM_FLOAT32 && g->dtype != EM_FLOAT64 && g->dtype != EM_BFLOAT16))
    return 0;
  if (!dense_like(out, g) || !dense_like(out, x) || out->storage == x->storage ||
      out->storage == g->storage)
    return 0;
  if (!only_views(p, mask->storage, 2) || !only_views(p, wide->storage, 2)) return 0;
  relu_bw_args *a = malloc(sizeof *a);
  if (!a) return 0;
  *a = (relu_bw_args){mul->out, g, x};
  move_to(p, g, r);
  move_to(p, out, r);
  drop(p, gt->out);
  drop(p, widen->out);
  drop(p, widen->src);
  drop(p, mul->a == g ? mul->b : mul->a);
  free(c0->args);
  *c0 = (emi_rec){EMI_REC_FUSED, play_relu_bw, a, "relu_backward", slot_of(p, out), c0->fp,
                  NULL, "gt, copy, mul"};
  c1->entry = EMI_REC_NOP;
  c2->entry = EMI_REC_NOP;
  return 1;
}

/* -- A convolution or batch norm, and the ReLU after it ----------------------------------
** conv2d (or batch_norm) writes X, ReLU reads X and writes Y, and X is kept only for
** ReLU's backward, which asks where X > 0 (batch norm's backward reads its input, not
** X). The fused call is the producer writing relu(X) to Y directly -- the conv kernels
** apply emi_conv_geom.act while a sample's output is in cache (where oneDNN serves, a
** pass of ours follows: its ReLU turns NaN into 0), batch norm's apply loops take a
** flag (emi_cpu_batch_norm_relu) -- and the backward asks where Y > 0: the same
** places, as Y = X < 0 ? 0 : X keeps positives and NaNs and zeroes the rest. X is
** never written, so one activation-sized buffer and one pass over it go. */

/* The slots of the held views of storage st (at most max; -1 when more). */
static int views_of(const em_program *p, const emi_storage *st, size_t *out, int max) {
  int n = 0;
  for (size_t j = 0; j < p->nheld; j++)
    if (p->held[j] && p->held[j]->storage == st) {
      if (n == max) return -1;
      out[n++] = j;
    }
  return n;
}

/* v becomes a view of to's elements (same geometry). */
static void rebind(em_tensor *v, const em_tensor *to) {
  emi_storage *old = v->storage;
  __atomic_add_fetch(&to->storage->refcount, 1, __ATOMIC_ACQ_REL);
  v->storage = to->storage;
  v->offset = to->offset;
  emi_storage_release(old);
}

static int same_geometry(const em_tensor *a, const em_tensor *b) {
  return a->dtype == b->dtype && a->ndim == b->ndim && a->offset == b->offset &&
         !memcmp(a->sizes, b->sizes, (size_t)a->ndim * sizeof *a->sizes) &&
         !memcmp(a->strides, b->strides, (size_t)a->ndim * sizeof *a->strides);
}

/* Whether call c only asks where view v is > 0: ReLU's backward, fused or not. */
static int asks_positive(const emi_rec *c, const em_tensor *v) {
  if (c->entry == EMI_REC_FUSED && c->play == play_relu_bw)
    return ((relu_bw_args *)c->args)->x == v;
  if (c->entry != EMI_ENTRY_binary_scalar) return 0;
  const args_binary_scalar *a = c->args;
  return a->a == v && a->op == EM_GT && a->s == 0 && !a->reverse;
}

enum { MAX_VIEWS = 8 };

static em_status play_bn_relu(emi_device *d, void *q, const emi_replay *r) {
  (void)r;
  args_batch_norm *a = q;
  return emi_cpu_batch_norm_relu(d, a->y, a->mean, a->invstd, a->rm, a->rv, a->x, a->w, a->b,
                                 a->training, a->momentum, a->eps);
}

/* The output ReLU may be folded into: a plain conv2d's or batch_norm's y. */
static const em_tensor *producer_out(const emi_rec *c) {
  if (c->entry == EMI_ENTRY_conv2d) {
    const args_conv2d *a = c->args;
    return a->g->act == EMI_ACT_NONE ? a->y : NULL;
  }
  return c->entry == EMI_ENTRY_batch_norm ? ((const args_batch_norm *)c->args)->y : NULL;
}

static int fuse_producer_relu(em_program *p, int r) {
  emi_rec *c = &p->recs[r];
  const em_tensor *X = producer_out(c);
  if (!X) return 0;
  /* every view of X: the producer's output, one ReLU after it, backward questions */
  size_t xs[MAX_VIEWS];
  int nx = views_of(p, X->storage, xs, MAX_VIEWS), relu = -1;
  if (nx < 2 || !only_views(p, X->storage, nx)) return 0;
  for (int k = 0; k < nx; k++) {
    const em_tensor *v = p->held[xs[k]];
    int at = p->uses[xs[k]].rec;
    const emi_rec *u = &p->recs[at];
    if (at == r) {
      if (v != X) return 0;           /* the producer reads X too */
    } else if (u->entry == EMI_ENTRY_unary && ((args_unary *)u->args)->a == v &&
               ((args_unary *)u->args)->op == EM_RELU && relu < 0 && at > r &&
               same_geometry(v, X)) {
      relu = at;
    } else if (!asks_positive(u, v) || !same_geometry(v, X)) {
      return 0;
    }
  }
  if (relu < 0) return 0;
  const em_tensor *Y = ((args_unary *)p->recs[relu].args)->out;
  if (!Y || Y->storage == X->storage || !same_geometry(Y, X)) return 0;
  /* Y is first touched by the ReLU and written by nothing else, so writing it
  ** earlier, at the producer, changes nothing any other call sees; the questions
  ** come after the ReLU */
  for (size_t j = 0; j < p->nheld; j++) {
    if (!p->held[j] || p->held[j]->storage != Y->storage) continue;
    if (p->uses[j].rec < relu || (p->uses[j].writes && p->uses[j].rec != relu)) return 0;
  }
  for (int k = 0; k < nx; k++)
    if (p->uses[xs[k]].rec != r && p->uses[xs[k]].rec != relu && p->uses[xs[k]].rec < relu)
      return 0;
  /* the ReLU goes; the producer writes Y; the questions read Y */
  args_unary *u = p->recs[relu].args;
  const em_tensor *relu_in = u->a, *relu_out = u->out;
  for (int k = 0; k < nx; k++) {
    em_tensor *v = p->held[xs[k]];
    if (v != relu_in) rebind(v, Y);
  }
  drop(p, relu_in);
  drop(p, relu_out);   /* the last reference to X went with the rebinds */
  free(u);
  p->recs[relu].args = NULL;
  p->recs[relu].entry = EMI_REC_NOP;
  if (c->entry == EMI_ENTRY_conv2d) {
    ((emi_conv_geom *)((args_conv2d *)c->args)->g)->act = EMI_ACT_RELU;   /* its own copy */
    c->op = "conv2d_relu";
    c->inside = "conv2d, relu";
  } else {
    c->play = play_bn_relu;
    c->op = "batch_norm_relu";
    c->inside = "batch_norm, relu";
  }
  c->entry = EMI_REC_FUSED;
  return 1;
}

/* -- Max pooling's backward and the ReLU backward after it ------------------------------
** In a conv, ReLU, max pool block the backward scatters the pooled gradient into P
** (zeros elsewhere), then ReLU's backward reads P and the mask and writes the
** gradient. Fused, each plane of P gets ReLU's backward while it is in cache
** (emi_cpu_max_pool2d_backward_relu), written straight to the gradient: P, and two
** passes over it, go. */
typedef struct {
  const emi_pool_geom *g;
  em_tensor *gx;
  const em_tensor *gy, *ind, *mask;
  int index_base;
} pool_relu_args;

static em_status play_pool_relu(emi_device *d, void *q, const emi_replay *r) {
  (void)r;
  pool_relu_args *a = q;
  return emi_cpu_max_pool2d_backward_relu(d, a->g, a->gx, a->gy, a->ind, a->index_base,
                                          a->mask);
}

/* Whether a view of storage st is used by a call in [from, to) (writes: written). */
static int touched(const em_program *p, const emi_storage *st, int from, int to, int writes) {
  for (size_t j = 0; j < p->nheld; j++)
    if (p->held[j] && p->held[j]->storage == st && p->uses[j].rec >= from &&
        p->uses[j].rec < to && (!writes || p->uses[j].writes))
      return 1;
  return 0;
}

static int fuse_pool_relu_bw(em_program *p, int r) {
  emi_rec *c = &p->recs[r];
  if (c->entry != EMI_ENTRY_max_pool2d_backward) return 0;
  args_max_pool2d_backward *pb = c->args;
  const em_tensor *P = pb->gx;
  if (!P || pb->g->nhwc || (P->dtype != EM_FLOAT32 && P->dtype != EM_FLOAT64)) return 0;
  /* P: written here, read once after, as a fused ReLU backward's gradient */
  size_t ps[2];
  if (views_of(p, P->storage, ps, 2) != 2 || !only_views(p, P->storage, 2)) return 0;
  size_t other = p->uses[ps[0]].rec == r ? ps[1] : ps[0];
  int at = p->uses[other].rec;
  emi_rec *rb = &p->recs[at];
  if (at <= r || rb->entry != EMI_REC_FUSED || rb->play != play_relu_bw) return 0;
  relu_bw_args *a = rb->args;
  if (a->g != p->held[other] || !dense_like(P, a->g) || !dense_like(P, a->out) ||
      !dense_like(P, a->x))
    return 0;
  /* the gradient and the mask are now used at r: nothing between may touch the
  ** gradient, nor write the mask */
  if (touched(p, a->out->storage, r, at, 0) || touched(p, a->x->storage, r + 1, at, 1))
    return 0;
  pool_relu_args *f = malloc(sizeof *f);
  if (!f) return 0;
  *f = (pool_relu_args){pb->g, a->out, pb->gy, pb->ind, a->x, pb->index_base};
  move_to(p, a->out, r);
  move_to(p, a->x, r);
  drop(p, pb->gx);
  drop(p, a->g);
  free(c->args);
  *c = (emi_rec){EMI_REC_FUSED, play_pool_relu, f, "max_pool2d_backward_relu",
                 slot_of(p, f->gx), c->fp, NULL, "max_pool2d_backward, relu_backward"};
  free(rb->args);
  rb->args = NULL;
  rb->entry = EMI_REC_NOP;
  return 1;
}

void emi_program_fuse(em_state *S, em_program *p) {
  (void)S;
  for (int r = 0; r + 2 < p->nrecs; r++)
    if (fuse_relu_bw(p, r)) r += 2;
  for (int r = 0; r < p->nrecs; r++) fuse_producer_relu(p, r);
  for (int r = 0; r < p->nrecs; r++) fuse_pool_relu_bw(p, r);
  emi_program_chain(S, p);
}

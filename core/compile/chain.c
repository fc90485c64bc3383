/*
** chain.c -- em.compile's element-wise chains: consecutive element-wise calls
** over tensors of one shape run tile by tile, so that the chain reads and writes
** memory once, and the temporaries that live only inside it shrink to a tile.
**
** Why tiles and the kernels themselves. Eager, `y = (x * 2 + b):tanh() * c` is
** four passes over memory and three temporaries; a fusing compiler would emit
** one loop. ember has no run-time code generator (it embeds in hosts that can't
** JIT), so the fused call runs the recorded calls themselves, each on a tile of
** a few thousand elements (a slice of each operand along the outermost dimension),
** one tile after the other: a tile's values stay in the core's cache from one call
** to the next, so memory is touched once per tensor that lives outside the chain.
** Running the very kernels of the unfused calls, on slices, keeps the results
** bit for bit (an element-wise kernel computes each element alone), in every
** dtype, casts included, with no second implementation of any op.
**
** Which calls. A chain is a run of consecutive recorded element-wise calls (copy,
** unary, binary, binary with a scalar, add_scaled, clamp, where) whose tensor
** operands all have one shape, the first output's (the recorded operands are
** already broadcast: a bias is a view with stride 0, which slices like any
** other). Every storage a chain writes must be seen through one geometry inside
** it, so that a tile's writes never reach another tile's elements.
**
** Temporaries. A storage first written inside the chain, used nowhere outside it
** and held by nothing but the program, becomes a tile-sized scratch buffer (per
** thread, per replay); its memory goes at once. Other outputs are written
** through slices of the real tensors.
**
** Threads. The tiles are shared among the state's threads; a kernel called
** from inside a share runs inline (workers.c). The chain's call takes the first
** call's place in the record; the others become no-ops.
*/
#include "entries.h"
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>

enum { TILE = 8192, MAX_INNER = 65536, MIN_NUMEL = 4096, MAX_OPS = 4, MAX_TEMPS = 32,
       MAX_LINKS = 32, MAX_ARGS = 128 };

/* -- The tensor operands of the element-wise entries ----------------------------------- */
typedef struct { size_t off; int out; } field;
typedef struct { size_t size; int n; field f[MAX_OPS]; } operands;

#define TK_MT 2
#define TK_CT 1
#define TK_double 0
#define TK_int 0
#define TK_em_unop 0
#define TK_em_binop 0
#define FIELD_(T, nm)                                                                   \
  if (TK_##T) o->f[o->n++] = (field){offsetof(A_, nm), TK_##T == 2};
#define DESCRIBE_(name)                                                                 \
  static void describe_##name(operands *o) {                                            \
    typedef args_##name A_;                                                             \
    o->size = sizeof(A_);                                                               \
    o->n = 0;                                                                           \
    ARGS_##name(FIELD_)                                                                 \
  }
#define ELEMENTWISE(X) X(copy) X(unary) X(binary) X(binary_scalar) X(add_scaled) X(clamp) X(where)
ELEMENTWISE(DESCRIBE_)

/* Whether call c is element-wise; then its operands. */
static int elementwise(const emi_rec *c, operands *o) {
  switch (c->entry) {
#define CASE_(name) case EMI_ENTRY_##name: describe_##name(o); return 1;
    ELEMENTWISE(CASE_)
#undef CASE_
  default: return 0;
  }
}

static const em_tensor *operand(const emi_rec *c, const field *f) {
  return *(const em_tensor *const *)(const void *)((const char *)c->args + f->off);
}

/* -- The fused call ---------------------------------------------------------------------- */
typedef struct {
  size_t off;               /* the field in the call's arguments */
  int temp;                 /* >= 0: this temporary's scratch */
  const em_tensor *view;    /* else: the held view to slice */
} link_op;

typedef struct {
  emi_play_fn play;
  const void *args;         /* the call's arguments (its no-op record keeps them) */
  size_t size;
  int nops;
  link_op op[MAX_OPS];
} link;

typedef struct {
  em_tensor geom;           /* shape, strides, dtype (storage unused) */
  emi_storage st;           /* a copy of its storage's header, data moved to scratch */
  int first, last;          /* the links that write it first and use it last */
  size_t at;                /* its place in a thread's scratch: temporaries whose
                            ** links do not overlap share one */
} temp;

typedef struct chain {
  void *first_args;         /* the first call's arguments, owned here */
  char ops[160];            /* what the calls do, "mul, add, tanh" (for explain and
                            ** the profiler; "..." past its length) */
  int dim;                  /* the dimension tiles slice */
  int64_t per_tile, extent, ntiles;
  int ntemps;
  temp temps[MAX_TEMPS];
  size_t scratch_bytes;
  int nlinks;
  link links[];
} chain;

static void drop_chain(void *q) {
  chain *c = q;
  if (!c) return;
  free(c->first_args);
  free(c);
}

typedef struct {
  chain *c;
  emi_device *d;
  const emi_replay *r;
  em_status status;
} run_ctx;

/* v as its slice [t0, t0 + n) along dim. */
static void slice(em_tensor *v, int dim, int64_t t0, int64_t n) {
  v->offset += t0 * v->strides[dim];
  v->numel = v->numel / v->sizes[dim] * n;
  v->sizes[dim] = n;
}

static void run_tiles(void *q, int64_t b, int64_t e) {
  run_ctx *x = q;
  chain *c = x->c;
  em_state *S = x->d->S;
  char *scratch = c->scratch_bytes ? emi_malloc(S, c->scratch_bytes) : NULL;
  if (c->scratch_bytes && !scratch) {
    em_status want = EM_OK;
    __atomic_compare_exchange_n(&x->status, &want,
                                emi_error(S, EM_ERR_NOMEM, "elementwise_chain: out of memory "
                                          "for %zu bytes of tile scratch", c->scratch_bytes),
                                0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE);
    return;
  }
  emi_storage st[MAX_TEMPS];
  for (int k = 0; k < c->ntemps; k++) {
    st[k] = c->temps[k].st;
    st[k].data = scratch + c->temps[k].at;
  }
  _Alignas(16) char args[MAX_ARGS];
  em_tensor views[MAX_OPS];
  for (int64_t t = b; t < e && !__atomic_load_n(&x->status, __ATOMIC_ACQUIRE); t++) {
    int64_t t0 = t * c->per_tile;
    int64_t n = c->extent - t0 < c->per_tile ? c->extent - t0 : c->per_tile;
    for (int i = 0; i < c->nlinks; i++) {
      const link *l = &c->links[i];
      memcpy(args, l->args, l->size);
      for (int k = 0; k < l->nops; k++) {
        const link_op *o = &l->op[k];
        if (o->temp >= 0) {   /* the tile's part of the temporary sits at its start */
          views[k] = c->temps[o->temp].geom;
          views[k].storage = &st[o->temp];
          views[k].offset = 0;
          slice(&views[k], c->dim, 0, n);
        } else {
          views[k] = *o->view;
          slice(&views[k], c->dim, t0, n);
        }
        em_tensor *p = &views[k];
        memcpy(args + o->off, &p, sizeof p);
      }
      em_status s = l->play(x->d, args, x->r);
      if (s) {
        em_status want = EM_OK;
        __atomic_compare_exchange_n(&x->status, &want, s, 0, __ATOMIC_ACQ_REL,
                                    __ATOMIC_ACQUIRE);
        break;
      }
    }
  }
  if (scratch) emi_free(S, scratch, c->scratch_bytes);
}

static em_status play_chain(emi_device *d, void *q, const emi_replay *r) {
  run_ctx x = {q, d, r, EM_OK};
  emi_parallel_for(d->S, x.c->ntiles, 1, run_tiles, &x);
  return x.status;
}

/* -- Finding chains ---------------------------------------------------------------------- */
static int same_shape(const em_tensor *a, const em_tensor *b) {
  return a->ndim == b->ndim && !memcmp(a->sizes, b->sizes, (size_t)a->ndim * sizeof *a->sizes);
}
static int same_geometry(const em_tensor *a, const em_tensor *b) {
  return same_shape(a, b) && a->offset == b->offset &&
         !memcmp(a->strides, b->strides, (size_t)a->ndim * sizeof *a->strides);
}

static size_t slot_of(const em_program *p, const em_tensor *v) {
  for (size_t j = 0; j < p->nheld; j++)
    if (p->held[j] == v) return j;
  return (size_t)-1;
}

/* The storage's views in the program: how many, and whether all are used in [r, e). */
static int views_in(const em_program *p, const emi_storage *st, int r, int e, int *all_inside) {
  int n = 0;
  *all_inside = 1;
  for (size_t j = 0; j < p->nheld; j++)
    if (p->held[j] && p->held[j]->storage == st) {
      n++;
      if (p->uses[j].rec < r || p->uses[j].rec >= e) *all_inside = 0;
    }
  return n;
}

/* Each temporary's place in a thread's scratch, elems elements of its dtype: in
** the order they are first written, each takes a place whose last holder's last
** link came before its first (never the same link: a place two dtypes share must
** not be read and written by one call), else a new one. */
static void place_temps(chain *c, size_t elems) {
  size_t at[MAX_TEMPS], bytes[MAX_TEMPS];
  int holder[MAX_TEMPS], nplaces = 0;
  for (int k = 0; k < c->ntemps; k++) {
    temp *t = &c->temps[k];
    size_t need = (elems * em_dtype_size(t->geom.dtype) + 63) & ~(size_t)63;
    int pick = -1;
    for (int s = 0; s < nplaces && pick < 0; s++)
      if (c->temps[holder[s]].last < t->first) pick = s;
    if (pick < 0) {
      pick = nplaces++;
      bytes[pick] = 0;
    }
    holder[pick] = k;
    if (need > bytes[pick]) bytes[pick] = need;
    t->at = (size_t)pick;   /* a place for now; its offset below */
  }
  c->scratch_bytes = 0;
  for (int s = 0; s < nplaces; s++) {
    at[s] = c->scratch_bytes;
    c->scratch_bytes += bytes[s];
  }
  for (int k = 0; k < c->ntemps; k++) c->temps[k].at = at[c->temps[k].at];
}

/* What call c does, by its op's name: "mul", "tanh", "copy", ... */
static const char *op_name(const emi_rec *c) {
  switch (c->entry) {
  case EMI_ENTRY_unary: return em_unop_name(((const args_unary *)c->args)->op);
  case EMI_ENTRY_binary: return em_binop_name(((const args_binary *)c->args)->op);
  case EMI_ENTRY_binary_scalar: return em_binop_name(((const args_binary_scalar *)c->args)->op);
  default: return c->op;   /* the entry's name: copy, add_scaled, clamp, where */
  }
}

static void append_op(char *buf, size_t cap, const char *name) {
  size_t n = strlen(buf);
  if (n + 6 >= cap) return;
  if (n && !strcmp(buf + n - 3, "...")) return;
  int w = snprintf(buf + n, cap - n, "%s%s", n ? ", " : "", name);
  if (w < 0 || (size_t)w >= cap - n) snprintf(buf + n, cap - n, "%s...", n ? ", " : "");
}

/* Calls [r, e) (element-wise or no-ops) as one fused call at r; 1 if made. */
static int make_chain(em_program *p, int r, int e, const em_tensor *ref, int dim) {
  int nlinks = 0;
  operands o;
  for (int i = r; i < e; i++) {
    if (p->recs[i].entry == EMI_REC_NOP) continue;
    if (!elementwise(&p->recs[i], &o) || o.size > MAX_ARGS) return 0;
    nlinks++;
  }
  if (nlinks < 2) return 0;
  /* the storages written: one geometry each inside the chain; the first
  ** writer's view stands for all of them */
  enum { MAX_W = 32 };
  const em_tensor *writer[MAX_W];
  int nw = 0;
  for (int i = r; i < e; i++) {
    if (!elementwise(&p->recs[i], &o)) continue;
    for (int k = 0; k < o.n; k++) {
      const em_tensor *t = operand(&p->recs[i], &o.f[k]);
      if (!t || !o.f[k].out) continue;
      int seen = 0;
      for (int w = 0; w < nw; w++) seen |= writer[w]->storage == t->storage;
      if (!seen) {
        if (nw == MAX_W) return 0;
        writer[nw++] = t;
      }
    }
  }
  for (int i = r; i < e; i++) {
    if (!elementwise(&p->recs[i], &o)) continue;
    for (int k = 0; k < o.n; k++) {
      const em_tensor *t = operand(&p->recs[i], &o.f[k]);
      for (int w = 0; t && w < nw; w++)
        if (writer[w]->storage == t->storage && !same_geometry(writer[w], t)) return 0;
    }
  }
  /* whether each written storage's first touch inside is a write (else its value
  ** from before the chain is read); temporaries: first touched by a write inside,
  ** used only inside, held only here, dense with dim outermost */
  int first_write[MAX_W], is_temp[MAX_W] = {0}, ntemps = 0;
  for (int w = 0; w < nw; w++) {
    const em_tensor *t = writer[w];
    first_write[w] = 0;
    for (int i = r; i < e; i++) {
      if (!elementwise(&p->recs[i], &o)) continue;
      int reads = 0, writes = 0;
      for (int k = 0; k < o.n; k++) {
        const em_tensor *u = operand(&p->recs[i], &o.f[k]);
        if (u && u->storage == t->storage) { if (o.f[k].out) writes = 1; else reads = 1; }
      }
      if (reads || writes) { first_write[w] = writes && !reads; break; }
    }
    int inside;
    int nv = views_in(p, t->storage, r, e, &inside);
    if (inside && first_write[w] && ntemps < MAX_TEMPS &&
        __atomic_load_n(&t->storage->refcount, __ATOMIC_ACQUIRE) == nv &&
        emi_compile_dense(t) && t->strides[dim] * t->sizes[dim] == t->numel) {
      is_temp[w] = 1;
      ntemps++;
    }
  }
  chain *c = calloc(1, sizeof *c + (size_t)nlinks * sizeof(link));
  if (!c) return 0;
  c->dim = dim;
  c->extent = ref->sizes[dim];
  int64_t inner = ref->numel / ref->sizes[dim];
  c->per_tile = inner >= TILE ? 1 : TILE / inner;
  c->ntiles = (c->extent + c->per_tile - 1) / c->per_tile;
  int temp_of[MAX_W];
  for (int w = 0; w < nw; w++) {
    temp_of[w] = -1;
    if (!is_temp[w]) continue;
    temp *tp = &c->temps[c->ntemps];
    tp->geom = *writer[w];
    tp->st = *writer[w]->storage;
    tp->first = tp->last = -1;
    temp_of[w] = c->ntemps++;
  }
  /* the links; for each operand, its view's slot and its storage's writer, found
  ** before any view is released */
  struct { size_t slot; int w; } seen[MAX_LINKS * MAX_OPS];
  int nseen = 0;
  for (int i = r; i < e; i++) {
    emi_rec *rc = &p->recs[i];
    if (!elementwise(rc, &o)) continue;
    link *l = &c->links[c->nlinks++];
    *l = (link){rc->play, rc->args, o.size, o.n, {{0}}};
    append_op(c->ops, sizeof c->ops, op_name(rc));
    for (int k = 0; k < o.n; k++) {
      const em_tensor *t = operand(rc, &o.f[k]);
      link_op *lo = &l->op[k];
      int w = 0;
      while (t && w < nw && writer[w]->storage != t->storage) w++;
      if (!t || w == nw) w = -1;
      *lo = (link_op){o.f[k].off, w >= 0 ? temp_of[w] : -1, w >= 0 ? writer[w] : t};
      if (lo->temp >= 0) {
        temp *tp = &c->temps[lo->temp];
        if (tp->first < 0) tp->first = c->nlinks - 1;
        tp->last = c->nlinks - 1;
      }
      if (t) {
        seen[nseen].slot = slot_of(p, t);
        seen[nseen++].w = w;
      }
    }
  }
  place_temps(c, (size_t)(c->per_tile * inner));
  /* the views: a temporary's go (its memory with them); a written storage's other
  ** views inside give way to its first writer's; the rest are used at r, and a
  ** storage read before it is written there counts as read */
  for (int k = 0; k < nseen; k++) {
    size_t j = seen[k].slot;
    int w = seen[k].w;
    if (j == (size_t)-1 || !p->held[j]) continue;
    if (w >= 0 && (is_temp[w] || p->held[j] != writer[w])) {
      em_tensor_release(p->held[j]);
      p->held[j] = NULL;
    } else {
      p->uses[j].rec = r;
      if (w >= 0 && !first_write[w]) p->uses[j].writes = 0;
    }
  }
  emi_rec *first = &p->recs[r];
  c->first_args = first->args;
  for (int i = r + 1; i < e; i++)
    if (p->recs[i].entry != EMI_REC_NOP) p->recs[i].entry = EMI_REC_NOP;
  size_t shown = (size_t)-1;
  for (int w = 0; w < nw && shown == (size_t)-1; w++)
    if (!is_temp[w]) shown = slot_of(p, writer[w]);
  *first = (emi_rec){EMI_REC_FUSED, play_chain, c, "elementwise_chain",
                     shown == (size_t)-1 ? first->first_held : shown, first->fp, drop_chain,
                     c->ops};
  return 1;
}

/* The dimension tiles slice: the one with the largest stride in ref (an outer
** dimension of its layout), or -1 when its slices are too large for a cache. */
static int tile_dim(const em_tensor *ref) {
  int d = -1;
  for (int k = 0; k < ref->ndim; k++)
    if (ref->sizes[k] > 1 && (d < 0 || ref->strides[k] > ref->strides[d])) d = k;
  if (d < 0 || ref->numel < MIN_NUMEL || ref->numel / ref->sizes[d] > MAX_INNER) return -1;
  return d;
}

void emi_program_chain(em_state *S, em_program *p) {
  (void)S;
  operands o;
  for (int r = 0; r < p->nrecs; r++) {
    if (!elementwise(&p->recs[r], &o)) continue;
    const em_tensor *ref = NULL;
    for (int k = 0; k < o.n && !ref; k++)
      if (o.f[k].out) ref = operand(&p->recs[r], &o.f[k]);
    int dim = ref ? tile_dim(ref) : -1;
    if (dim < 0) continue;
    /* extend over element-wise calls whose operands all have ref's shape */
    int e = r, nlinks = 0;
    while (e < p->nrecs && nlinks < MAX_LINKS) {
      emi_rec *c = &p->recs[e];
      if (c->entry == EMI_REC_NOP) { e++; continue; }
      if (!elementwise(c, &o)) break;
      int fits = 1;
      for (int k = 0; k < o.n && fits; k++) {
        const em_tensor *t = operand(c, &o.f[k]);
        fits = t && same_shape(t, ref) && t->device == EM_CPU;
      }
      if (!fits) break;
      e++;
      nlinks++;
    }
    while (e > r && p->recs[e - 1].entry == EMI_REC_NOP) e--;
    if (make_chain(p, r, e, ref, dim)) r = e - 1;
  }
}

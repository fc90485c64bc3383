/*
** recorder.c -- em.compile's capture: while a step runs once, every call the
** CPU backend receives is recorded with its arguments (em_compile_begin ..
** em_compile_end, ember.h).
**
** How calls are caught. Every op reaches a kernel through EMI_DISPATCH, which
** calls an entry of the device's table. For the capture the CPU device serves
** through a copy of its table whose entries are recording wrappers: each one
** copies its arguments into a struct of its own, holds every tensor argument by
** reference (the program keeps them alive, so replays write where the capture
** wrote) and calls the real entry. The forward, the autograd engine's backward
** nodes and the optimizers' fused updates all come through here alike.
**
** The wrappers are written once per entry by macros from its argument list
** (the ARGS_* lists of entries.h); the entries whose arguments point to arrays
** (the optimizers' lists) and the random draws (whose counters move on at every
** replay) are written by hand. Each call also gets a fingerprint of its scalars,
** shapes, dtypes and strides (em_program_compare), and each held tensor a note
** of whether the call only writes it; allocations are noted too (the memory
** plan, plan.c, may move what the step itself made).
**
** What a replay can't do is noted, and the program then refuses to replay
** (em_compile_end says why; em.compile runs such a step eagerly):
**   - a call on another device (only the CPU is recorded);
**   - a gradient accumulated into a .grad made before the capture (the replay
**     would add to the gradient of the capture's time, not the current one);
**   - a collective other than an in-place allreduce or broadcast (collective.c
**     records those).
** What the engine or the host does to .grad outside the kernels is recorded as
** events: a leaf's first gradient, and em_tensor_set_grad (zero_grad).
*/
#include "entries.h"
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

int emi_compile_push(void ***v, size_t *n, size_t *cap, void *p) {
  if (*n == *cap) {
    size_t c = *cap ? 2 * *cap : 64;
    void **q = realloc(*v, c * sizeof *q);
    if (!q) return 0;
    *v = q;
    *cap = c;
  }
  (*v)[(*n)++] = p;
  return 1;
}

void emi_compile_unfit(em_state *S, const char *fmt, ...) {
  emi_recorder *R = S->recorder;
  if (!R || R->why[0]) return;   /* the first reason is the one to tell */
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(R->why, sizeof R->why, fmt, ap);
  va_end(ap);
}

static emi_recorder *rec_of(emi_device *d) { return d->S->recorder; }

/* A new record of entry e with an argument struct of size bytes (zeroed), or
** NULL (the recorder failed: the call still runs, the program is refused). */
void *emi_compile_new_rec(emi_recorder *R, int e, const char *op, emi_play_fn play,
                          size_t size) {
  em_program *p = R->prog;
  void *args = calloc(1, size ? size : 1);
  if (!args) { R->failed = EM_ERR_NOMEM; return NULL; }
  if (p->nrecs == p->caprecs) {
    int c = p->caprecs ? 2 * p->caprecs : 256;
    emi_rec *q = realloc(p->recs, (size_t)c * sizeof *q);
    if (!q) { free(args); R->failed = EM_ERR_NOMEM; return NULL; }
    p->recs = q;
    p->caprecs = c;
  }
  p->recs[p->nrecs++] = (emi_rec){e, play, args, op, p->nheld, 1469598103934665603ull};
  return args;
}
static void *push_rec(emi_device *d, int e, const char *op, emi_play_fn play, size_t size) {
  return emi_compile_new_rec(rec_of(d), e, op, play, size);
}

/* The program's own view of t (NULL for NULL): the same storage, sizes, strides
** and offset, held until the program is freed. A view, not t itself: ops pass
** tensors that live on their stack (a matmul's batched views), and a header may
** change after the call (resize_, set_data) where the replay needs it as it was.
** writes: the call only writes t (an output), which the memory plan needs to know
** (a buffer first written by the step needs no value from the step before). */
em_tensor *emi_compile_hold(emi_recorder *R, em_state *S, const em_tensor *t, int writes) {
  if (!t) return NULL;
  em_program *p = R->prog;
  em_tensor *v = emi_tensor_try_view(S, t, t->sizes, t->strides, t->ndim, t->offset);
  if (v && p->nheld == p->capuses) {
    size_t c = p->capuses ? 2 * p->capuses : 64;
    emi_use *u = realloc(p->uses, c * sizeof *u);
    if (u) { p->uses = u; p->capuses = c; }
  }
  if (!v || p->nheld == p->capuses ||
      !emi_compile_push((void ***)&p->held, &p->nheld, &p->capheld, v)) {
    em_tensor_release(v);
    R->failed = EM_ERR_NOMEM;
    return NULL;
  }
  p->uses[p->nheld - 1] = (emi_use){p->nrecs - 1, writes};
  return v;
}
static em_tensor *hold(emi_device *d, const em_tensor *t, int writes) {
  return emi_compile_hold(rec_of(d), d->S, t, writes);
}

/* A copy of n bytes at src that the program owns. */
static void *own_copy(emi_device *d, const void *src, size_t n) {
  em_program *p = rec_of(d)->prog;
  void *c = malloc(n ? n : 1);
  if (!c || !emi_compile_push(&p->owned, &p->nowned, &p->capowned, c)) {
    free(c);
    rec_of(d)->failed = EM_ERR_NOMEM;
    return NULL;
  }
  if (n) memcpy(c, src, n);
  return c;
}

/* The fingerprint of the last record takes n more bytes (FNV-1a). */
static void mix(emi_device *d, const void *bytes, size_t n) {
  em_program *p = rec_of(d)->prog;
  uint64_t h = p->recs[p->nrecs - 1].fp;
  for (size_t i = 0; i < n; i++) h = (h ^ ((const unsigned char *)bytes)[i]) * 1099511628211ull;
  p->recs[p->nrecs - 1].fp = h;
}
static void mix_tensor(emi_device *d, const em_tensor *t) {
  if (!t) { mix(d, "-", 1); return; }
  mix(d, &t->dtype, sizeof t->dtype);
  mix(d, &t->ndim, sizeof t->ndim);
  mix(d, t->sizes, (size_t)t->ndim * sizeof *t->sizes);
  mix(d, t->strides, (size_t)t->ndim * sizeof *t->strides);
}

/* Per argument slot, by its type: tensors are held, geometries copied; each
** enters the fingerprint. */
static void keep_in(emi_device *d, void *slot) {
  mix_tensor(d, *(const em_tensor **)slot);
  *(em_tensor **)slot = hold(d, *(const em_tensor **)slot, 0);
}
/* An em_tensor * argument is the call's output (the table's convention), except
** for the entries that update it in place (inout_entry). */
static int inout_entry(int e) {
  return e == EMI_ENTRY_index_add || e == EMI_ENTRY_scatter_add || e == EMI_ENTRY_batch_norm;
}
static void keep_out(emi_device *d, void *slot) {
  em_program *p = rec_of(d)->prog;
  mix_tensor(d, *(const em_tensor **)slot);
  *(em_tensor **)slot = hold(d, *(const em_tensor **)slot,
                             !inout_entry(p->recs[p->nrecs - 1].entry));
}
static void keep_conv(emi_device *d, void *slot) {
  const emi_conv_geom **g = slot;
  mix(d, *g, sizeof **g);
  *g = own_copy(d, *g, sizeof **g);
}
static void keep_pool(emi_device *d, void *slot) {
  const emi_pool_geom **g = slot;
  mix(d, *g, sizeof **g);
  *g = own_copy(d, *g, sizeof **g);
}
static void keep_value(emi_device *d, void *slot) { (void)d; (void)slot; }
#define KEEP(d, field)                                                                  \
  _Generic((field), em_tensor *: keep_out, const em_tensor *: keep_in,                   \
           const emi_conv_geom *: keep_conv, const emi_pool_geom *: keep_pool,           \
           default: keep_value)((d), (void *)&(field));                                  \
  _Generic((field), em_tensor *: (void)0, const em_tensor *: (void)0,                    \
           const emi_conv_geom *: (void)0, const emi_pool_geom *: (void)0,               \
           default: mix((d), &(field), sizeof(field)))

/* -- The generated wrappers ------------------------------------------------------- */
#define PARAM_(T, n) , T n
#define NAME_(T, n) , n
#define STORE_(T, n) a_->n = n; KEEP(d, a_->n);
#define LOAD_(T, n) , a_->n

#define DEFINE_ENTRY(name)                                                              \
  static em_status play_##name(emi_device *d, void *q_, const emi_replay *r) {            \
    (void)r;                                                                            \
    args_##name *a_ = q_;                                                                 \
    return d->backend->name(d ARGS_##name(LOAD_));                             \
  }                                                                                     \
  static em_status rec_##name(emi_device *d ARGS_##name(PARAM_)) {                      \
    args_##name *a_ = push_rec(d, EMI_ENTRY_##name, #name, play_##name, sizeof *a_);      \
    if (a_) { ARGS_##name(STORE_) }                                                      \
    return rec_of(d)->real->name(d ARGS_##name(NAME_));                                 \
  }

GENERATED_ENTRIES(DEFINE_ENTRY)

/* -- Random draws: each replay draws fresh counters --------------------------------
** A recorded offset is replayed shifted by the counters every replay before it
** used (emi_replay.rng_delta), so a dropout mask is new at every step, drawn from
** the state's stream as the eager step would draw it. */
#define DEFINE_RANDOM(name, T)                                                          \
  typedef struct { em_tensor *out; uint64_t seed, offset; T a, b; } args_##name;         \
  static em_status play_##name(emi_device *d, void *p, const emi_replay *r) {            \
    args_##name *x = p;                                                                 \
    return d->backend->name(d, x->out, x->seed, x->offset + r->rng_delta, x->a, \
                                     x->b);                                             \
  }                                                                                     \
  static em_status rec_##name(emi_device *d, em_tensor *out, uint64_t seed,              \
                              uint64_t offset, T a, T b) {                              \
    args_##name *x = push_rec(d, EMI_ENTRY_##name, #name, play_##name, sizeof *x);      \
    if (x) {                                                                            \
      mix_tensor(d, out);                                                               \
      mix(d, &a, sizeof a);                                                             \
      mix(d, &b, sizeof b);                                                             \
      *x = (args_##name){hold(d, out, 1), seed, offset, a, b};                          \
    }                \
    return rec_of(d)->real->name(d, out, seed, offset, a, b);                           \
  }
DEFINE_RANDOM(uniform, double)
DEFINE_RANDOM(normal, double)
DEFINE_RANDOM(randint, int64_t)

/* -- Lists of tensors (the optimizers, clip_grad_norm) ---------------------------- */
/* A held copy of a list of n tensors (read, or updated in place). */
static em_tensor **own_list(emi_device *d, em_tensor *const *t, int n) {
  if (!t) return NULL;
  em_tensor **c = own_copy(d, t, (size_t)n * sizeof *c);
  if (c)
    for (int i = 0; i < n; i++) c[i] = hold(d, c[i], 0);
  return c;
}

typedef struct {
  int n, nesterov;
  em_tensor **p, **g, **buf;
  int *first;
  double lr, momentum, dampening, wd;
} args_sgd;
static em_status play_sgd(emi_device *d, void *q, const emi_replay *r) {
  (void)r;
  args_sgd *x = q;
  return d->backend->sgd_step_multi(d, x->n, x->p, (const em_tensor *const *)x->g,
                                             x->buf, x->first, x->lr, x->momentum,
                                             x->dampening, x->wd, x->nesterov);
}
static em_status rec_sgd(emi_device *d, int n, em_tensor *const *p, const em_tensor *const *g,
                         em_tensor *const *buf, const int *first, double lr, double momentum,
                         double dampening, double wd, int nesterov) {
  args_sgd *x = push_rec(d, EMI_ENTRY_sgd_step_multi, "sgd_step_multi", play_sgd, sizeof *x);
  if (x) {
    *x = (args_sgd){n, nesterov, own_list(d, p, n), own_list(d, (em_tensor *const *)g, n),
                    own_list(d, buf, n), own_copy(d, first, (size_t)n * sizeof *first), lr,
                    momentum, dampening, wd};
  }
  return rec_of(d)->real->sgd_step_multi(d, n, p, g, buf, first, lr, momentum, dampening, wd,
                                         nesterov);
}

typedef struct {
  int n;
  em_tensor **p, **g, **m, **v;
  double *step_size, *bc2_sqrt;
  double beta1, beta2, eps, wd, decay;
} args_adam;
static em_status play_adam(emi_device *d, void *q, const emi_replay *r) {
  (void)r;
  args_adam *x = q;
  return d->backend->adam_step_multi(d, x->n, x->p, (const em_tensor *const *)x->g,
                                              x->m, x->v, x->step_size, x->bc2_sqrt, x->beta1,
                                              x->beta2, x->eps, x->wd, x->decay);
}
static em_status rec_adam(emi_device *d, int n, em_tensor *const *p, const em_tensor *const *g,
                          em_tensor *const *m, em_tensor *const *v, const double *step_size,
                          const double *bc2_sqrt, double beta1, double beta2, double eps,
                          double wd, double decay) {
  args_adam *x = push_rec(d, EMI_ENTRY_adam_step_multi, "adam_step_multi", play_adam,
                          sizeof *x);
  if (x) {
    *x = (args_adam){n, own_list(d, p, n), own_list(d, (em_tensor *const *)g, n),
                     own_list(d, m, n), own_list(d, v, n),
                     own_copy(d, step_size, (size_t)n * sizeof(double)),
                     own_copy(d, bc2_sqrt, (size_t)n * sizeof(double)), beta1, beta2, eps, wd,
                     decay};
  }
  return rec_of(d)->real->adam_step_multi(d, n, p, g, m, v, step_size, bc2_sqrt, beta1, beta2,
                                          eps, wd, decay);
}

typedef struct { em_tensor *out; int n; em_tensor **t; double p; } args_norm_multi;
static em_status play_norm_multi(emi_device *d, void *q, const emi_replay *r) {
  (void)r;
  args_norm_multi *x = q;
  return d->backend->norm_multi(d, x->out, x->n, (const em_tensor *const *)x->t,
                                         x->p);
}
static em_status rec_norm_multi(emi_device *d, em_tensor *out, int n,
                                const em_tensor *const *t, double p) {
  args_norm_multi *x = push_rec(d, EMI_ENTRY_norm_multi, "norm_multi", play_norm_multi,
                                sizeof *x);
  if (x) {
    *x = (args_norm_multi){hold(d, out, 1), n, own_list(d, (em_tensor *const *)t, n), p};
  }
  return rec_of(d)->real->norm_multi(d, out, n, t, p);
}

typedef struct { int n; em_tensor **t; double scale; } args_scale_multi;
static em_status play_scale_multi(emi_device *d, void *q, const emi_replay *r) {
  (void)r;
  args_scale_multi *x = q;
  return d->backend->scale_multi(d, x->n, x->t, x->scale);
}
static em_status rec_scale_multi(emi_device *d, int n, em_tensor *const *t, double scale) {
  args_scale_multi *x = push_rec(d, EMI_ENTRY_scale_multi, "scale_multi", play_scale_multi,
                                 sizeof *x);
  if (x) *x = (args_scale_multi){n, own_list(d, t, n), scale};
  return rec_of(d)->real->scale_multi(d, n, t, scale);
}

/* Storages made during the capture are noted: the memory plan may move those. */
static emi_storage *rec_alloc(emi_device *d, size_t nbytes) {
  emi_recorder *R = rec_of(d);
  emi_storage *st = R->real->alloc(d, nbytes);
  if (st && !emi_compile_push(&R->born, &R->nborn, &R->capborn, st)) R->failed = EM_ERR_NOMEM;
  return st;
}

/* The recording table: the CPU's own, with every op entry recording and alloc
** noting (a replay allocates nothing). */
void emi_recording_table(emi_backend *t, const emi_backend *real) {
  *t = *real;
  t->alloc = rec_alloc;
#define SET_(name) t->name = real->name ? rec_##name : NULL;
  GENERATED_ENTRIES(SET_)
  SET_(uniform) SET_(normal) SET_(randint)
#undef SET_
  t->sgd_step_multi = real->sgd_step_multi ? rec_sgd : NULL;
  t->adam_step_multi = real->adam_step_multi ? rec_adam : NULL;
  t->norm_multi = real->norm_multi ? rec_norm_multi : NULL;
  t->scale_multi = real->scale_multi ? rec_scale_multi : NULL;
}

/*
** program.c -- em.compile's C half after the capture: beginning and ending a
** capture, replaying a program, the optimizers' per-step arguments, and the
** gradient events (ember.h, "Compiled steps").
**
** Replay. A program is run by calling each recorded entry of the CPU's table
** again with its recorded arguments: the same kernels on the same memory, so the
** results are those of the eager step bit for bit, minus everything between the
** kernels (Lua, argument checks, autograd's graph, allocation). What must differ
** from one replay to the next is patched in: random draws take fresh counters
** (emi_replay.rng_delta), and the optimizers' learning rate and bias correction
** come from em_program_patch_sgd / _adam, which the Lua optimizers call before
** each replay (a schedule's new rate is seen; Adam's step count moves on).
**
** Gradients. The engine gives a leaf its first gradient by pointing .grad at a
** tensor, and zero_grad drops it: both are recorded as events and replayed, so
** after a replay p.grad is the step's gradient as after an eager step. A leaf
** the capture found without a gradient must be without one when a replay starts
** (em_program_ready), else the eager step would have accumulated into it.
*/
#include "compile.h"
#include "profile/profile.h"
#include <stdio.h>
#include <stdlib.h>

/* -- Capture ------------------------------------------------------------------------ */
em_status em_compile_begin(em_state *S) {
  if (!S) return EM_ERR_ARG;
  if (S->recorder) return emi_error(S, EM_ERR_ARG, "compile: a capture is already running");
  emi_recorder *R = calloc(1, sizeof *R);
  em_program *p = calloc(1, sizeof *p);
  if (!R || !p) {
    free(R);
    free(p);
    return emi_error(S, EM_ERR_NOMEM, "compile: out of memory starting a capture");
  }
  R->prog = p;
  R->real = S->cpu.backend;
  emi_recording_table(&R->table, R->real);
  p->rng_start = S->rng_offset;
  S->recorder = R;
  S->cpu.backend = &R->table;
  return EM_OK;
}

int em_compile_capturing(const em_state *S) { return S && S->recorder ? 1 : 0; }

/* Work done once, not per step (an optimizer's state made at its first step),
** runs paused: eagerly, and not recorded. */
void em_compile_pause(em_state *S, int paused) {
  if (!S || !S->recorder) return;
  S->cpu.backend = paused ? S->recorder->real : &S->recorder->table;
}

int em_compile_recorded(const em_state *S) {
  return S && S->recorder ? S->recorder->prog->nrecs : -1;
}

int emi_compile_cmp_ptr(const void *a, const void *b) {
  uintptr_t x = (uintptr_t) * (void *const *)a, y = (uintptr_t) * (void *const *)b;
  return x < y ? -1 : x > y;
}

/* Storage bytes the program keeps alive: each storage once (the arena once). */
static int64_t held_bytes(em_program *p) {
  if (!p->nheld) return 0;
  void **st = malloc(p->nheld * sizeof *st);
  if (!st) return -1;
  size_t n = 0;
  for (size_t i = 0; i < p->nheld; i++)
    if (p->held[i]) st[n++] = p->held[i]->storage;
  qsort(st, n, sizeof *st, emi_compile_cmp_ptr);
  int64_t sum = p->arena ? (int64_t)p->arena->nbytes : 0;
  for (size_t i = 0; i < n; i++)
    if ((i == 0 || st[i] != st[i - 1]) && !emi_storage_is_slice(st[i]))
      sum += (int64_t)((emi_storage *)st[i])->nbytes;
  free(st);
  return sum;
}

em_status em_compile_end(em_state *S, em_program **out, char *why, size_t whylen) {
  if (out) *out = NULL;
  if (why && whylen) why[0] = 0;
  if (!S || !S->recorder) return S ? emi_error(S, EM_ERR_ARG, "compile: no capture running")
                                   : EM_ERR_ARG;
  emi_recorder *R = S->recorder;
  S->cpu.backend = R->real;
  S->recorder = NULL;
  em_program *p = R->prog;
  p->rng_used = S->rng_offset - p->rng_start;
  if (emi_guard_open(p) && !R->why[0])
    snprintf(R->why, sizeof R->why, "a guarded stretch was not closed");
  em_status failed = R->failed;
  if (!failed && out && !R->why[0]) {
    emi_program_fuse(S, p);
    emi_program_plan(S, p, R);
  }
  p->held_bytes = held_bytes(p);
  if (why && whylen) snprintf(why, whylen, "%s", R->why);
  free(R->given);
  free(R->born);
  free(R);
  if (failed || !out) {
    em_program_free(S, p);
    return failed ? emi_error(S, failed, "compile: out of memory recording the step") : EM_OK;
  }
  *out = p;
  return EM_OK;
}

/* -- Gradient events (engine.c, em_tensor_set_grad) ----------------------------------- */
static int given(emi_recorder *R, const em_tensor *leaf) {
  for (size_t i = 0; i < R->ngiven; i++)
    if (R->given[i] == leaf) return 1;
  return 0;
}

/* leaf->grad is now grad (NULL: dropped), by the host (zero_grad) or by the
** engine's first gradient (first = 1). */
void emi_compile_note_grad(em_state *S, em_tensor *leaf, em_tensor *grad, int first) {
  emi_recorder *R = S->recorder;
  if (!R || leaf->device != EM_CPU) return;
  em_program *p = R->prog;
  if (first && !given(R, leaf) &&
      !emi_compile_push((void ***)&p->fresh_leaves, &p->nfresh, &p->capfresh, leaf))
    R->failed = EM_ERR_NOMEM;
  if (!given(R, leaf) && !emi_compile_push((void ***)&R->given, &R->ngiven, &R->capgiven, leaf))
    R->failed = EM_ERR_NOMEM;
  emi_set_grad_args *x = emi_compile_new_rec(R, EMI_REC_SET_GRAD, "set_grad", NULL, sizeof *x);
  if (!x) return;
  em_tensor_retain(leaf);
  if (grad) em_tensor_retain(grad);
  *x = (emi_set_grad_args){leaf, grad};
}

int emi_compile_views_of(const em_state *S, const emi_storage *st) {
  const emi_recorder *R = S->recorder;
  if (!R) return 0;
  int n = 0;
  for (size_t j = 0; j < R->prog->nheld; j++)
    if (R->prog->held[j] && R->prog->held[j]->storage == st) n++;
  return n;
}

/* The engine accumulates into leaf->grad: fine when the capture made it. */
void emi_compile_note_accumulate(em_state *S, const em_tensor *leaf) {
  emi_recorder *R = S->recorder;
  if (!R || leaf->device != EM_CPU || given(R, leaf)) return;
  emi_compile_unfit(S, "backward accumulates into a .grad that existed before the step "
                       "(zero the gradients inside the compiled function, or set them to nil)");
}

/* -- Replay ----------------------------------------------------------------------- */
int em_program_ready(const em_program *p) {
  for (size_t i = 0; i < p->nfresh; i++)
    if (emi_ag_grad(p->fresh_leaves[i])) return 0;
  return 1;
}

/* (the leaf has its autograd block: the capture gave it a gradient, or dropped one) */
static void set_grad(const emi_set_grad_args *x) {
  emi_ag_meta *m = x->leaf->ag;
  if (!m) return;
  if (x->grad) em_tensor_retain(x->grad);
  em_tensor_release(m->grad);
  m->grad = x->grad;
}

/* A call's name in a profile: a fused call's with the ops it does,
** "elementwise_chain(mul, add, tanh)", interned (the profile may outlive the
** program). */
static const char *profile_name(em_state *S, const emi_rec *c) {
  struct emi_profiler *pr = emi_profiler_of(S);
  if (!c->inside || !pr) return c->op;
  char name[256];
  snprintf(name, sizeof name, "%s(%s)", c->op, c->inside);
  return emi_profile_intern(pr, name);
}

em_status em_program_run(em_state *S, em_program *p) {
  if (!S || !p) return S ? emi_error(S, EM_ERR_ARG, "compile: no program") : EM_ERR_ARG;
  if (!em_program_ready(p))
    return emi_error(S, EM_ERR_ARG, "compile: a parameter has a .grad the captured step "
                     "did not have (zero the gradients before the call)");
  emi_device *d = &S->cpu;
  emi_replay r = {S->rng_offset - p->rng_start};
  int profiling = __atomic_load_n(&S->profiler, __ATOMIC_RELAXED) != NULL;
  for (int i = 0; i < p->nrecs; i++) {
    const emi_rec *c = &p->recs[i];
    if (c->entry == EMI_REC_GUARD) { i = emi_guard_next(c, i) - 1; continue; }
    if (c->entry == EMI_REC_SET_GRAD) { set_grad(c->args); continue; }
    if (c->entry == EMI_REC_NOP) continue;
    em_status st;
    if (profiling && c->first_held < p->nheld && p->held[c->first_held]) {
      double t0 = emi_profile_op_begin(S);
      st = c->play(d, c->args, &r);
      emi_profile_op_end(S, profile_name(S, c), p->held[c->first_held], t0);
    } else {
      st = c->play(d, c->args, &r);
    }
    if (c->entry >= 0) S->dispatch_counts[d->backend->id][c->entry]++;
    if (st) {
      char msg[EMI_ERRMSG_SIZE];
      snprintf(msg, sizeof msg, "%s", S->errmsg);
      return emi_error(S, st, "compile: replaying call %d (%s): %s", i + 1, c->op, msg);
    }
  }
  S->rng_offset += p->rng_used;
  p->replays++;
  return EM_OK;
}

/* -- The optimizers' per-step arguments --------------------------------------------- */
static emi_rec *rec_at(em_state *S, em_program *p, int i, int entry, const char *what) {
  if (!p || i < 0 || i >= p->nrecs || p->recs[i].entry != entry) {
    emi_error(S, EM_ERR_ARG, "compile: call %d of the program is no %s", i + 1, what);
    return NULL;
  }
  return &p->recs[i];
}

/* The args structs of recorder.c's optimizer entries begin with these fields. */
typedef struct { int n, nesterov; em_tensor **p, **g, **buf; int *first; double lr; } sgd_head;
typedef struct {
  int n;
  em_tensor **p, **g, **m, **v;
  double *step_size, *bc2_sqrt;
  double beta1, beta2, eps, wd, decay;
} adam_head;

em_status em_program_patch_sgd(em_state *S, em_program *p, int i, double lr) {
  emi_rec *c = rec_at(S, p, i, EMI_ENTRY_sgd_step_multi, "SGD step");
  if (!c) return EM_ERR_ARG;
  sgd_head *x = c->args;
  x->lr = lr;
  /* the momentum buffers exist once the capture's step made them */
  if (x->first) memset(x->first, 0, (size_t)x->n * sizeof *x->first);
  return EM_OK;
}

em_status em_program_patch_adam(em_state *S, em_program *p, int i, int n, const int64_t *steps,
                                double lr, double weight_decay, int decoupled) {
  emi_rec *c = rec_at(S, p, i, EMI_ENTRY_adam_step_multi, "Adam step");
  if (!c) return EM_ERR_ARG;
  adam_head *x = c->args;
  if (n != x->n)
    return emi_error(S, EM_ERR_ARG, "compile: the Adam step was recorded with %d parameters, "
                     "patched with %d", x->n, n);
  for (int k = 0; k < n; k++)
    emi_adam_factors(lr, x->beta1, x->beta2, steps[k], &x->step_size[k], &x->bc2_sqrt[k]);
  x->decay = decoupled ? 1 - lr * weight_decay : 1;
  return EM_OK;
}

/* -- Reading and comparing ----------------------------------------------------------- */
void em_program_stats(const em_program *p, em_program_info *out) {
  memset(out, 0, sizeof *out);
  if (!p) return;
  for (int i = 0; i < p->nrecs; i++) {
    int e = p->recs[i].entry;
    if (e >= 0 || e == EMI_REC_FUSED) out->kernels++;
    if (e == EMI_REC_FUSED) out->fused++;
    if (e != EMI_REC_NOP) out->calls++;
  }
  out->held_bytes = p->held_bytes;
  out->replays = (int64_t)p->replays;
}

const char *em_program_op(const em_program *p, int i) {
  return p && i >= 0 && i < p->nrecs ? p->recs[i].op : NULL;
}

static const emi_rec *fused_call(const em_program *p, int k) {
  for (int i = 0; p && i < p->nrecs; i++)
    if (p->recs[i].entry == EMI_REC_FUSED && k-- == 0) return &p->recs[i];
  return NULL;
}

const char *em_program_fused(const em_program *p, int k) {
  const emi_rec *c = fused_call(p, k);
  return c ? c->op : NULL;
}

const char *em_program_fused_ops(const em_program *p, int k) {
  const emi_rec *c = fused_call(p, k);
  return c ? (c->inside ? c->inside : "") : NULL;
}

/* The first call where a and b differ (entry, or its arguments' fingerprint), or -1. */
int em_program_compare(const em_program *a, const em_program *b) {
  int n = a->nrecs < b->nrecs ? a->nrecs : b->nrecs;
  for (int i = 0; i < n; i++) {
    const emi_rec *x = &a->recs[i], *y = &b->recs[i];
    if (x->entry != y->entry || x->fp != y->fp) return i;
  }
  return a->nrecs == b->nrecs ? -1 : n;
}

void emi_program_free_contents(em_program *p) {
  for (int i = 0; i < p->nrecs; i++) {
    emi_compile_free_collective(&p->recs[i]);
    if (p->recs[i].entry == EMI_REC_SET_GRAD) {
      emi_set_grad_args *x = p->recs[i].args;
      em_tensor_release(x->leaf);
      em_tensor_release(x->grad);
    }
    if (p->recs[i].drop) p->recs[i].drop(p->recs[i].args);
    else free(p->recs[i].args);
  }
  for (size_t i = 0; i < p->nheld; i++) em_tensor_release(p->held[i]);
  if (p->arena) emi_storage_release(p->arena);   /* after its slices' views */
  p->arena = NULL;
  for (size_t i = 0; i < p->nowned; i++) free(p->owned[i]);
  free(p->recs);
  free(p->held);
  free(p->owned);
  free(p->fresh_leaves);
  free(p->uses);
}

void em_program_free(em_state *S, em_program *p) {
  (void)S;   /* (the program's tensors know their state) */
  if (!p) return;
  emi_program_free_contents(p);
  free(p);
}

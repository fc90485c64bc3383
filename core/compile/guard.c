/*
** guard.c -- a stretch of a compiled step that a replay skips when a flag is set
** (em_compile_guard_begin / _end, em_program_ran; ember.h, "Compiled steps").
**
** Why. Some steps decide on the host whether to run part of their work: a
** GradScaler skips the optimizer's update when a gradient is inf or NaN. Eagerly
** that is a read of one value and a Lua branch; a replay runs no Lua, so the
** decision has to live in the program. The capture brackets the optional calls
** with a guard that holds the flag tensor; a replay reads the flag when it gets
** there (a CPU scalar the replay itself has just written, so the read costs
** nothing) and jumps past the stretch when it is nonzero. The guard remembers
** whether it skipped, so what the host keeps per step (Adam's step counts, the
** scaler's schedule) can follow the replay after it (em_program_ran).
**
** The capture itself records the stretch by running it, so it must be captured
** on a step that runs it; em.compile captures again when it was skipped. The
** fusion passes see the guard as a call that is no element-wise op, so no chain
** crosses its ends.
*/
#include "compile.h"
#include <stdlib.h>

typedef struct {
  em_tensor *flag;         /* the program's view; one element, CPU */
  int end;                 /* the first call after the stretch, -1 while open */
  int skipped;             /* whether the last replay skipped the stretch */
} guard_args;

em_status em_compile_guard_begin(em_state *S, const em_tensor *flag) {
  if (!S) return EM_ERR_ARG;
  emi_recorder *R = S->recorder;
  if (!R) return emi_error(S, EM_ERR_ARG, "compile: guard: no capture running");
  if (!flag || flag->device != EM_CPU || flag->numel != 1)
    return emi_error(S, EM_ERR_ARG, "compile: guard: the flag must be a CPU tensor of one "
                     "element");
  em_program *p = R->prog;
  for (int i = 0; i < p->nrecs; i++)
    if (p->recs[i].entry == EMI_REC_GUARD && ((guard_args *)p->recs[i].args)->end < 0)
      return emi_error(S, EM_ERR_ARG, "compile: guard: a guard is already open (guards "
                       "do not nest)");
  guard_args *g = emi_compile_new_rec(R, EMI_REC_GUARD, "guard", NULL, sizeof *g);
  if (!g) return emi_error(S, EM_ERR_NOMEM, "compile: out of memory recording a guard");
  g->end = -1;
  g->flag = emi_compile_hold(R, S, flag, 0);
  return g->flag ? EM_OK : emi_error(S, EM_ERR_NOMEM, "compile: out of memory recording a guard");
}

em_status em_compile_guard_end(em_state *S) {
  if (!S) return EM_ERR_ARG;
  emi_recorder *R = S->recorder;
  em_program *p = R ? R->prog : NULL;
  for (int i = p ? p->nrecs - 1 : -1; i >= 0; i--) {
    if (p->recs[i].entry != EMI_REC_GUARD) continue;
    guard_args *g = p->recs[i].args;
    if (g->end >= 0) break;
    g->end = p->nrecs;
    return EM_OK;
  }
  return emi_error(S, EM_ERR_ARG, "compile: guard: no guard is open");
}

/* The call a replay goes on with after guard c (its own index i): i + 1, or the
** end of its stretch when the flag is set. */
int emi_guard_next(const emi_rec *c, int i) {
  guard_args *g = c->args;
  const emi_storage *st = g->flag->storage;
  const char *at = (const char *)st->data + g->flag->offset * em_dtype_size(g->flag->dtype);
  g->skipped = g->end > i && emi_load_f64(at, g->flag->dtype) != 0;
  return g->skipped ? g->end : i + 1;
}

int emi_guard_open(const em_program *p) {
  for (int i = 0; i < p->nrecs; i++)
    if (p->recs[i].entry == EMI_REC_GUARD && ((guard_args *)p->recs[i].args)->end < 0) return 1;
  return 0;
}

int em_program_ran(const em_program *p, int i) {
  if (!p || i < 0 || i >= p->nrecs) return -1;
  for (int k = 0; k < i; k++) {
    const emi_rec *c = &p->recs[k];
    if (c->entry != EMI_REC_GUARD) continue;
    const guard_args *g = c->args;
    if (i < g->end && g->skipped) return 0;
  }
  return 1;
}

/*
** collective.c -- collectives inside a compiled step: a wrapped model's gradient
** averaging (the reducer's bucket allreduces, started during backward and waited
** for at its end), buffers broadcast at a forward, a loss averaged in the step.
**
** At the capture, each allreduce or broadcast a communicator starts (em_comm_*,
** core/dist/comm.c) is recorded with its communicator, tensor and operation, and
** each wait with the collective it waits for. A replay starts them again, in the
** recorded order, and waits where the capture waited: every replica replays its
** own record of the same step, so the replicas issue the same collectives in the
** same order, as the eager steps do. Work the communicator does between the
** start and the wait (the transfer, on its own thread) overlaps the kernels
** recorded in between, as eagerly.
**
** Only in-place collectives on a contiguous CPU tensor are recorded; others
** (allgather, reduce-scatter, barriers, sends and receives, device
** communicators) make the step run eagerly (core/dist/comm.c says which).
*/
#include "compile.h"
#include <stdlib.h>

typedef struct {
  em_comm *c;
  em_tensor *t;            /* the program's view */
  int broadcast;           /* else allreduce */
  em_comm_op op;
  int root;
  em_comm_work *captured;  /* the capture's work (matching its wait); not owned */
  em_comm_work *work;      /* the replay's, until its wait */
} coll_args;

typedef struct { coll_args *coll; } wait_args;

static em_status play_coll(emi_device *d, void *q, const emi_replay *r) {
  (void)r;
  coll_args *a = q;
  return a->broadcast ? em_comm_broadcast(d->S, a->c, a->t, a->root, &a->work)
                      : em_comm_allreduce(d->S, a->c, a->t, a->op, &a->work);
}

static em_status play_wait(emi_device *d, void *q, const emi_replay *r) {
  (void)r;
  coll_args *a = ((wait_args *)q)->coll;
  em_comm_work *w = a->work;
  a->work = NULL;
  em_status st = em_comm_work_wait(d->S, w);
  em_comm_work_free(w);
  return st;
}

void emi_compile_note_collective(em_state *S, em_comm *c, em_tensor *t, int broadcast,
                                 em_comm_op op, int root, em_comm_work *work) {
  emi_recorder *R = S->recorder;
  if (!R) return;
  coll_args *a = emi_compile_new_rec(R, EMI_REC_COLL, broadcast ? "broadcast" : "allreduce",
                                     play_coll, sizeof *a);
  if (!a) return;
  *a = (coll_args){c, emi_compile_hold(R, S, t, 0), broadcast, op, root, work, NULL};
}

void emi_compile_note_wait(em_state *S, em_comm_work *w) {
  emi_recorder *R = S->recorder;
  if (!R) return;
  em_program *p = R->prog;
  coll_args *a = NULL;
  for (int i = p->nrecs - 1; i >= 0 && !a; i--)
    if (p->recs[i].entry == EMI_REC_COLL && ((coll_args *)p->recs[i].args)->captured == w)
      a = p->recs[i].args;
  if (!a) {
    emi_compile_unfit(S, "it waits for a collective started before the step");
    return;
  }
  a->captured = NULL;   /* the work is freed after its wait; its address may come back */
  wait_args *x = emi_compile_new_rec(R, EMI_REC_WAIT, "wait", play_wait, sizeof *x);
  if (x) x->coll = a;
}

/* A replay that failed between a start and its wait leaves the work: freeing it
** waits for the communicator to finish or abort it. */
void emi_compile_free_collective(emi_rec *c) {
  if (c->entry != EMI_REC_COLL) return;
  coll_args *a = c->args;
  if (a->work) em_comm_work_free(a->work);
  a->work = NULL;
}

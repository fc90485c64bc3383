/*
** compile.h -- what the files of em.compile's C half share: a recorded call,
** the program those calls make, and the recorder that builds one while a step
** runs.
**
** A program is the list of kernel calls one run of a step made on the CPU, with
** every tensor they touched held by reference, so that running the list again
** ("replay") does the step's work again without Lua, without autograd and
** without allocating: each call writes where it wrote when it was recorded.
** recorder.c explains how calls are caught, collective.c how collectives are,
** fuse.c how chains of calls become one, plan.c where the step's own buffers
** go, and program.c how a program is made and replayed.
*/
#ifndef EMBER_COMPILE_H
#define EMBER_COMPILE_H
#include "internal.h"

/* What a replay changes in recorded arguments: random draws move on. */
typedef struct emi_replay {
  uint64_t rng_delta;      /* added to every recorded Philox offset */
} emi_replay;

typedef em_status (*emi_play_fn)(emi_device *d, void *args, const emi_replay *r);

/* A call: a backend entry (EMI_ENTRY_*) with its arguments, or one of the
** kinds below: a leaf's gradient set by the engine or by the host; a fused call
** (fuse.c), which does the work of calls it replaced, now no-ops; a collective
** started, and waited for (collective.c); a guard, whose stretch of calls a replay
** skips when its flag is set (guard.c); a core call that reads a value and acts on
** it, replayed whole (host_call.c). */
enum { EMI_REC_SET_GRAD = -1, EMI_REC_FUSED = -2, EMI_REC_NOP = -3, EMI_REC_COLL = -4,
       EMI_REC_WAIT = -5, EMI_REC_GUARD = -6, EMI_REC_HOST = -7 };
typedef struct emi_rec {
  int entry;
  emi_play_fn play;
  void *args;              /* the entry's argument struct (recorder.c), owned */
  const char *op;          /* the entry's name, for messages and comparisons */
  size_t first_held;       /* its first tensor in held (the profiler's shape), if any */
  uint64_t fp;             /* its arguments' fingerprint: scalars, shapes, dtypes,
                           ** strides (em_program_compare) */
  void (*drop)(void *args);   /* frees args, where free() alone would not */
  const char *inside;      /* a fused call: the ops it does ("mul, add, tanh"), kept
                           ** as long as its args; else NULL */
} emi_rec;

typedef struct emi_set_grad_args { em_tensor *leaf, *grad; } emi_set_grad_args;

/* How a call uses a held tensor (the memory plan's lifetimes). A fused call
** takes over the tensors of the calls it replaces; a tensor no call uses any
** more is released and its held slot set to NULL. */
typedef struct emi_use {
  int rec;                 /* the call that uses it */
  int writes;              /* 1: the call only writes it (an output) */
} emi_use;

struct em_program {
  emi_rec *recs;
  int nrecs, caprecs;
  em_tensor **held;        /* one reference each, released with the program */
  size_t nheld, capheld;
  emi_use *uses;           /* per held tensor: its call, and whether it only writes it */
  size_t capuses;
  void **owned;            /* argument copies (geometries, lists), freed with it */
  size_t nowned, capowned;
  /* leaves the engine gives a first gradient with no recorded set before it:
  ** a replay needs their .grad empty, as at the capture */
  em_tensor **fresh_leaves;
  size_t nfresh, capfresh;
  uint64_t rng_start;      /* S->rng_offset when the capture began */
  uint64_t rng_used;       /* Philox counters the step draws */
  uint64_t replays;
  int64_t held_bytes;      /* storage bytes the program keeps alive */
  emi_storage *arena;      /* plan.c: where the short-lived buffers live, or NULL */
  int64_t planned_bytes;   /* the buffers placed there, before packing */
};

/* The recorder of a state that is capturing (S->recorder). */
typedef struct emi_recorder {
  em_program *prog;
  const emi_backend *real;     /* the CPU's table, put back at the end */
  emi_backend table;           /* the recording table the CPU serves through meanwhile */
  em_status failed;            /* the first failure to record (out of memory) */
  char why[256];               /* why the program can't replay, "" if it can */
  /* leaves given a gradient during the capture (engine or host) */
  em_tensor **given;
  size_t ngiven, capgiven;
  /* storages allocated during the capture (the memory plan's candidates) */
  void **born;
  size_t nborn, capborn;
} emi_recorder;

/* recorder.c */
void emi_recording_table(emi_backend *t, const emi_backend *real);
int emi_compile_push(void ***v, size_t *n, size_t *cap, void *p);
void *emi_compile_new_rec(emi_recorder *R, int e, const char *op, emi_play_fn play,
                          size_t size);
/* The program's own view of t, used by the call being recorded (writes: only
** written by it); NULL for NULL or out of memory (then the recorder failed). */
em_tensor *emi_compile_hold(emi_recorder *R, em_state *S, const em_tensor *t, int writes);

/* collective.c: a collective's start and its wait, as calls of the record. */
void emi_compile_free_collective(emi_rec *c);

/* guard.c: the call a replay goes on with after guard c at index i (past its
** stretch when its flag is set); whether p has a guard still open. */
int emi_guard_next(const emi_rec *c, int i);
int emi_guard_open(const em_program *p);

/* program.c */
void emi_program_free_contents(em_program *p);
int emi_compile_cmp_ptr(const void *a, const void *b);   /* qsort/bsearch of pointers */

/* fuse.c: passes over a finished record that replace chains of calls by one
** fused call (before the memory plan, which then sees the fused lifetimes);
** chain.c's pass, element-wise chains run tile by tile, comes last. */
void emi_program_fuse(em_state *S, em_program *p);
void emi_program_chain(em_state *S, em_program *p);

/* Whether t's elements fill numel consecutive places from its data pointer
** (any order of dims: NCHW, channels-last), so a pass may run over them flat. */
static inline int emi_compile_dense(const em_tensor *t) {
  int64_t expect = 1;
  int used[EM_MAX_DIMS] = {0};
  for (int k = 0; k < t->ndim; k++) {       /* dims by increasing stride */
    int best = -1;
    for (int d = 0; d < t->ndim; d++)
      if (!used[d] && t->sizes[d] != 1 && (best < 0 || t->strides[d] < t->strides[best]))
        best = d;
    if (best < 0) break;
    used[best] = 1;
    if (t->strides[best] != expect) return 0;
    expect *= t->sizes[best];
  }
  return 1;
}

/* plan.c: the record's short-lived buffers packed into one arena (at capture
** end); the arena goes with the program, after its slices' views. */
void emi_program_plan(em_state *S, em_program *p, emi_recorder *R);

#endif

/*
** host_call.c -- core calls that read a value and act on it, recorded whole
** (emi_compile_host_call, internal.h).
**
** Why. clip_grad_norm computes the gradients' norm, reads it on the host and
** scales the gradients by max_norm / norm -- or not at all when the norm is
** small. Recorded kernel by kernel, a replay would scale by the capture's
** factor, or never, whatever its own gradients: silently wrong. Recorded as one
** call, a replay runs the same code again on the same tensors (the norm read
** anew, the scaling decided anew), so it equals the eager step. The value read
** is the core's own; the Lua number the caller gets back is the capture's.
*/
#include "compile.h"
#include <stdlib.h>

enum { MAX_ARGS = 4 };
typedef struct {
  emi_host_body body;
  int n;
  em_tensor **ts;          /* the program's views */
  double args[MAX_ARGS];
} host_args;

static em_status play_host(emi_device *d, void *q, const emi_replay *r) {
  (void)r;
  host_args *a = q;
  double out = 0;
  return a->body(d->S, a->n, a->ts, a->args, &out);
}

static void drop_host(void *q) {
  host_args *a = q;
  free(a->ts);
  free(a);
}

static int all_cpu(int n, em_tensor *const *ts) {
  for (int i = 0; i < n; i++)
    if (ts[i]->device != EM_CPU) return 0;
  return 1;
}

em_status emi_compile_host_call(em_state *S, const char *op, emi_host_body body, int n,
                                em_tensor *const *ts, const double *args, int nargs, double *out) {
  emi_recorder *R = S->recorder;
  if (!R || nargs > MAX_ARGS || !all_cpu(n, ts)) return body(S, n, ts, args, out);
  host_args *a = emi_compile_new_rec(R, EMI_REC_HOST, op, play_host, sizeof *a);
  if (a) {
    R->prog->recs[R->prog->nrecs - 1].drop = drop_host;
    a->body = body;
    for (int k = 0; k < nargs; k++) a->args[k] = args[k];
    a->ts = calloc((size_t)(n ? n : 1), sizeof *a->ts);
    if (!a->ts) R->failed = EM_ERR_NOMEM;
    for (int i = 0; i < n && a->ts; i++) {
      a->ts[i] = emi_compile_hold(R, S, ts[i], 0);
      a->n = a->ts[i] ? i + 1 : a->n;
    }
  }
  /* the body's own kernels are the recorded call's, not calls of their own */
  S->cpu.backend = R->real;
  em_status st = body(S, n, ts, args, out);
  S->cpu.backend = &R->table;
  return st;
}

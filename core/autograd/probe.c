/*
** probe.c -- the grad probe: which tensors requiring grad did a no-grad forward
** use? Activation checkpointing runs a function under no_grad and must then find
** the parameters that function read (they become inputs of its node), even when
** none of its arguments requires grad.
**
** While a probe is active, ag_watch is on although grad mode is off, so every op
** that would have recorded reaches emi_ag_probe_note (autograd.h's wanted tests)
** instead of recording: the note keeps a reference to each operand requiring
** grad, once (a pointer set beside the ordered list). A note never fails the op:
** when memory runs out the probe remembers it and its end reports it. Probes
** nest: an inner probe's tensors are noted by the outer one too when it ends.
** A backward hides the probe while it runs (engine.c): its formulas are not part
** of the forward being watched.
*/
#include "autograd.h"

typedef struct emi_ag_probe {
  struct emi_ag_probe *parent;
  em_tensor **items;       /* owned references, in the order first seen */
  int n, cap;
  const em_tensor **set;   /* open addressing, nslots a power of two, half full at most */
  int nslots;
  int failed;              /* a note ran out of memory */
} emi_ag_probe;

static size_t hash_ptr(const void *p) {
  uint64_t x = (uint64_t)(uintptr_t)p;
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdULL;
  x ^= x >> 33;
  return (size_t)x;
}

static int set_insert(const em_tensor **set, int nslots, const em_tensor *t) {
  size_t m = (size_t)nslots - 1;
  for (size_t i = hash_ptr(t) & m;; i = (i + 1) & m) {
    if (set[i] == t) return 0;
    if (!set[i]) { set[i] = t; return 1; }
  }
}

static int grow(em_state *S, emi_ag_probe *p) {
  int cap = p->cap ? p->cap * 2 : 16, nslots = cap * 2;
  em_tensor **items = emi_malloc(S, sizeof *items * (size_t)cap);
  const em_tensor **set = emi_malloc(S, sizeof *set * (size_t)nslots);
  if (!items || !set) {
    emi_free(S, items, sizeof *items * (size_t)cap);
    emi_free(S, (void *)set, sizeof *set * (size_t)nslots);
    return 0;
  }
  memset(set, 0, sizeof *set * (size_t)nslots);
  if (p->n) memcpy(items, p->items, sizeof *items * (size_t)p->n);
  for (int k = 0; k < p->n; k++) set_insert(set, nslots, items[k]);
  emi_free(S, p->items, sizeof *p->items * (size_t)p->cap);
  emi_free(S, (void *)p->set, sizeof *p->set * (size_t)p->nslots);
  p->items = items;
  p->set = set;
  p->cap = cap;
  p->nslots = nslots;
  return 1;
}

static void note(em_state *S, emi_ag_probe *p, const em_tensor *t) {
  if (!t || !t->requires_grad || p->failed) return;
  if (p->nslots) {   /* already noted? */
    size_t m = (size_t)p->nslots - 1;
    for (size_t i = hash_ptr(t) & m; p->set[i]; i = (i + 1) & m)
      if (p->set[i] == t) return;
  }
  if (p->n == p->cap && !grow(S, p)) { p->failed = 1; return; }
  set_insert(p->set, p->nslots, t);
  em_tensor_retain((em_tensor *)t);
  p->items[p->n++] = (em_tensor *)t;
}

int emi_ag_probe_note(em_state *S, const em_tensor *a, const em_tensor *b,
                      const em_tensor *c) {
  emi_ag_probe *p = S->ag_probe;
  if (p) { note(S, p, a); note(S, p, b); note(S, p, c); }
  return 0;
}

int emi_ag_probe_note_list(em_state *S, const em_tensor *const *list, int n) {
  emi_ag_probe *p = S->ag_probe;
  for (int i = 0; p && i < n; i++) note(S, p, list[i]);
  return 0;
}

em_status em_grad_probe_begin(em_state *S) {
  if (!S) return EM_ERR_ARG;
  emi_ag_probe *p = emi_malloc(S, sizeof *p);
  if (!p) return emi_error(S, EM_ERR_NOMEM, "grad_probe_begin: out of memory");
  memset(p, 0, sizeof *p);
  p->parent = S->ag_probe;
  S->ag_probe = p;
  emi_set_grad_disabled(S, S->grad_disabled);
  return EM_OK;
}

int em_grad_probe_count(em_state *S) {
  return S && S->ag_probe ? S->ag_probe->n : -1;
}

static void probe_drop(em_state *S, emi_ag_probe *p) {
  for (int k = 0; k < p->n; k++) em_tensor_release(p->items[k]);
  emi_free(S, p->items, sizeof *p->items * (size_t)p->cap);
  emi_free(S, (void *)p->set, sizeof *p->set * (size_t)p->nslots);
  emi_free(S, p, sizeof *p);
}

em_status em_grad_probe_end(em_state *S, em_tensor **list, int cap) {
  if (!S) return EM_ERR_ARG;
  emi_ag_probe *p = S->ag_probe;
  if (!p) return emi_error(S, EM_ERR_ARG, "grad_probe_end: no probe is active");
  S->ag_probe = p->parent;
  emi_set_grad_disabled(S, S->grad_disabled);
  int failed = p->failed;
  for (int k = 0; k < p->n; k++) {
    if (p->parent) note(S, p->parent, p->items[k]);
    if (list && k < cap && !failed) {
      em_tensor_retain(p->items[k]);
      list[k] = p->items[k];
    }
  }
  if (p->parent && failed) p->parent->failed = 1;
  probe_drop(S, p);
  if (failed)
    return emi_error(S, EM_ERR_NOMEM, "grad_probe_end: out of memory noting the tensors "
                     "the forward used");
  return EM_OK;
}

void emi_ag_probe_free(em_state *S) {
  while (S->ag_probe) {
    emi_ag_probe *p = S->ag_probe;
    S->ag_probe = p->parent;
    probe_drop(S, p);
  }
}

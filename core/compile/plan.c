/*
** plan.c -- a compiled step's memory plan: the buffers that live only inside
** the step are packed into one arena, so that a program holds about what the
** eager step holds at its peak, not every buffer the step ever made.
**
** Which buffers. A storage qualifies when
**   - it was allocated during the capture (the recorder noted it),
**   - nothing but the program references it now (its reference count is the
**     program's own views of it): no Lua tensor, no .grad, no module holds it,
**   - the first call that touches it only writes it, whole (an output that
**     covers the storage): so no value has to survive from one replay to the
**     next, nor from the host (a constant made from Lua data is read first).
** Its lifetime is the calls from the first to the last that touch it.
**
** Packing. Buffers go in by decreasing size, each at the lowest offset where it
** overlaps no placed buffer whose lifetime overlaps its own (the greedy rule of
** arena planners; sizes rounded to 64 bytes, the CPU's alignment). The arena is
** one CPU storage, counted by the memory statistics and the memory cap like any
** other. Each qualifying storage's views are then pointed at a header of the
** arena's (a slice: data inside the arena, freed with nothing, counted nowhere),
** and the storage itself goes back to the allocator.
**
** When the arena can't be had (the cap), the program keeps its buffers as they
** are: it still replays, holding more.
*/
#include "compile.h"
#include <stdlib.h>

typedef struct {
  emi_storage *st;
  int first, last;          /* calls */
  int views;                /* the program's views of it */
  int ok;                   /* qualifies so far */
  size_t size;              /* rounded; 0 when it does not qualify */
  size_t offset;
  emi_storage *slice;       /* its header in the arena, once made */
} buffer;

static int by_storage(const void *a, const void *b) {
  uintptr_t x = (uintptr_t)((const buffer *)a)->st, y = (uintptr_t)((const buffer *)b)->st;
  return x < y ? -1 : x > y;
}
static int by_size_desc(const void *a, const void *b) {
  size_t x = (*(buffer *const *)a)->size, y = (*(buffer *const *)b)->size;
  return x > y ? -1 : x < y;
}

static buffer *find(buffer *v, size_t n, const emi_storage *st) {
  size_t lo = 0, hi = n;
  while (lo < hi) {
    size_t mid = (lo + hi) / 2;
    if ((uintptr_t)v[mid].st < (uintptr_t)st) lo = mid + 1; else hi = mid;
  }
  return lo < n && v[lo].st == st ? &v[lo] : NULL;
}

/* Whether view t covers its whole storage, densely from its start. */
static int covers(const em_tensor *t) {
  if (t->offset != 0 || !em_tensor_is_contiguous(t)) return 0;
  return (size_t)t->numel * em_dtype_size(t->dtype) == t->storage->nbytes;
}

/* The arena's slices: the data is the arena's, so freeing one frees nothing. */
static void slice_free(void *ud, void *p, size_t n) { (void)ud; (void)p; (void)n; }

static int overlaps(const buffer *a, const buffer *b) {
  return a->first <= b->last && b->first <= a->last && a->offset < b->offset + b->size &&
         b->offset < a->offset + a->size;
}

void emi_program_plan(em_state *S, em_program *p, emi_recorder *R) {
  if (!p->nheld || !R->nborn) return;
  buffer *v = calloc(p->nheld, sizeof *v);
  buffer **order = calloc(p->nheld, sizeof *order);
  if (!v || !order) goto done;
  qsort(R->born, R->nborn, sizeof *R->born, emi_compile_cmp_ptr);
  /* the distinct storages of the program's views */
  size_t n = 0;
  for (size_t j = 0; j < p->nheld; j++)
    if (p->held[j]) v[n++] = (buffer){p->held[j]->storage, -1, -1, 0, 1, 0, 0, NULL};
  qsort(v, n, sizeof *v, by_storage);
  size_t m = 0;
  for (size_t j = 0; j < n; j++)
    if (m == 0 || v[m - 1].st != v[j].st) v[m++] = v[j];
  n = m;
  /* lifetimes and view counts; then the first call's kind of access */
  for (size_t j = 0; j < p->nheld; j++) {
    if (!p->held[j]) continue;
    buffer *b = find(v, n, p->held[j]->storage);
    int r = p->uses[j].rec;
    b->views++;
    if (b->first < 0 || r < b->first) b->first = r;
    if (r > b->last) b->last = r;
  }
  for (size_t j = 0; j < p->nheld; j++) {
    const em_tensor *t = p->held[j];
    if (!t) continue;
    buffer *b = find(v, n, t->storage);
    if (p->uses[j].rec == b->first && (!p->uses[j].writes || !covers(t))) b->ok = 0;
  }
  /* SET_GRAD events hold tensors outside the views: their storages' counts
  ** exceed the views, which rules them out below */
  size_t nq = 0;
  for (size_t k = 0; k < n; k++) {
    buffer *b = &v[k];
    emi_storage *st = b->st;
    void *key = st;
    if (!b->ok || st->device != EM_CPU || st->ext_free ||
        __atomic_load_n(&st->refcount, __ATOMIC_ACQUIRE) != b->views ||
        !bsearch(&key, R->born, R->nborn, sizeof *R->born, emi_compile_cmp_ptr))
      continue;
    b->size = (st->nbytes + 63) & ~(size_t)63;
    order[nq++] = b;
  }
  if (!nq) goto done;
  qsort(order, nq, sizeof *order, by_size_desc);
  size_t total = 0;
  int64_t planned = 0;
  for (size_t k = 0; k < nq; k++) {
    buffer *b = order[k];
    planned += (int64_t)b->st->nbytes;
    /* the lowest offset clear of every placed buffer alive at the same time:
    ** try 0 and the end of each such buffer */
    size_t best = (size_t)-1;
    for (size_t c = 0; c <= k; c++) {
      size_t at = c == k ? 0 : order[c]->offset + order[c]->size;
      if (c < k && !(order[c]->first <= b->last && b->first <= order[c]->last)) continue;
      if (at >= best) continue;
      b->offset = at;
      int clash = 0;
      for (size_t o = 0; o < k && !clash; o++) clash = overlaps(b, order[o]);
      if (!clash) best = at;
    }
    b->offset = best;
    if (best + b->size > total) total = best + b->size;
  }
  emi_storage *arena = emi_storage_new(&S->cpu, total);
  if (!arena) goto done;       /* the cap: keep the buffers as they are */
  /* the slices, then every view moved onto its slice; the last move frees the
  ** storage it leaves */
  for (size_t k = 0; k < nq; k++) {
    buffer *b = order[k];
    emi_storage *h = emi_malloc(S, sizeof *h);
    if (!h) continue;            /* that one stays where it is */
    *h = *b->st;
    h->refcount = b->views;
    h->data = (char *)arena->data + b->offset;
    h->block_size = sizeof *h;
    h->ext_free = slice_free;
    h->ext_ud = NULL;
    b->slice = h;
  }
  for (size_t j = 0; j < p->nheld; j++) {
    em_tensor *t = p->held[j];
    buffer *b = t ? find(v, n, t->storage) : NULL;
    if (!b || !b->slice) continue;
    emi_storage *old = t->storage;
    t->storage = b->slice;
    emi_storage_release(old);
  }
  p->arena = arena;
  p->planned_bytes = planned;
done:
  free(v);
  free(order);
}

int emi_storage_is_slice(const emi_storage *st) { return st->ext_free == slice_free; }

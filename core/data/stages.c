/*
** stages.c -- the pipeline stages over a parent dataset: shuffle, shard and take
** (which only renumber samples), map (runs a transform) and batch (stacks).
**
** Renumbering stages share one node type: an index map i -> parent index, so a
** batch over shuffle(shard(tensors)) still reaches the in-memory source's gather
** fast path with the final list of rows.
*/
#include "data.h"

/* -- Index maps: shuffle, shard, take ------------------------------------------------- */

typedef struct perm {            /* one epoch's permutation, shared by readers */
  int refcount;
  int64_t epoch, n;
  int64_t p[];
} perm;

typedef struct imap {
  int kind;                      /* IMAP_SHUFFLE, IMAP_SHARD, IMAP_TAKE */
  uint64_t seed;                 /* shuffle */
  int64_t rank, world;           /* shard */
  pthread_mutex_t mu;            /* shuffle: guards cached */
  perm *cached;
} imap;
enum { IMAP_SHUFFLE, IMAP_SHARD, IMAP_TAKE };

static void perm_release(em_state *S, perm *p) {
  if (p && emi_atomic_dec(&p->refcount) == 0)
    emi_free(S, p, sizeof *p + (size_t)p->n * sizeof(int64_t));
}

/* The permutation of `epoch` (a Fisher-Yates shuffle on the stream (seed,
** epoch)), computed once per epoch and shared. NULL when out of memory. */
static perm *epoch_perm(em_dataset *d, int64_t epoch) {
  imap *m = d->impl;
  pthread_mutex_lock(&m->mu);
  perm *p = m->cached;
  if (!p || p->epoch != epoch) {
    int64_t n = d->len;
    p = emi_malloc(d->S, sizeof *p + (size_t)n * sizeof(int64_t));
    if (p) {
      p->refcount = 1;
      p->epoch = epoch;
      p->n = n;
      for (int64_t i = 0; i < n; i++) p->p[i] = i;
      emi_drng r;
      emi_drng_init(&r, m->seed, epoch, 0);
      for (int64_t i = n - 1; i > 0; i--) {
        int64_t j = emi_drng_below(&r, i + 1), t = p->p[i];
        p->p[i] = p->p[j];
        p->p[j] = t;
      }
      perm_release(d->S, m->cached);
      m->cached = p;
    }
  }
  if (p) emi_atomic_inc(&p->refcount);
  pthread_mutex_unlock(&m->mu);
  return p;
}

/* Maps idx[0..n) of d to parent indices into out. */
static em_status imap_indices(em_dataset *d, emi_dctx *c, const int64_t *idx, int64_t n,
                              int64_t *out) {
  imap *m = d->impl;
  int64_t plen = d->parent->len;
  switch (m->kind) {
  case IMAP_SHUFFLE: {
    perm *p = epoch_perm(d, c->epoch);
    if (!p) return emi_dfail(c, EM_ERR_NOMEM, "shuffle: out of memory for the permutation");
    for (int64_t j = 0; j < n; j++) out[j] = p->p[idx[j]];
    perm_release(d->S, p);
    break;
  }
  case IMAP_SHARD:     /* rank, rank + world, ...; wrapping around pads the last ones */
    for (int64_t j = 0; j < n; j++) out[j] = (m->rank + idx[j] * m->world) % plen;
    break;
  default:
    for (int64_t j = 0; j < n; j++) out[j] = idx[j];
  }
  return EM_OK;
}

static em_status imap_get(em_dataset *d, emi_dctx *c, int64_t i, em_tensor **out) {
  int64_t j = 0;
  em_status st = imap_indices(d, c, &i, 1, &j);
  return st ? st : emi_dataset_get(d->parent, c, j, out);
}

static em_status imap_get_many(em_dataset *d, emi_dctx *c, const int64_t *idx, int64_t n,
                               em_tensor **out) {
  int64_t *j = emi_malloc(d->S, (size_t)(n ? n : 1) * sizeof *j);
  if (!j) return emi_dfail(c, EM_ERR_NOMEM, "%s: out of memory", d->vt->kind);
  em_status st = imap_indices(d, c, idx, n, j);
  if (!st) st = emi_dataset_get_many(d->parent, c, j, n, out);
  emi_free(d->S, j, (size_t)(n ? n : 1) * sizeof *j);
  return st;
}

static void imap_destroy(em_dataset *d) {
  imap *m = d->impl;
  if (!m) return;
  if (m->kind == IMAP_SHUFFLE) {
    perm_release(d->S, m->cached);
    pthread_mutex_destroy(&m->mu);
  }
  emi_free(d->S, m, sizeof *m);
}

static const emi_dataset_vt shuffle_vt = {"shuffle", imap_get, imap_get_many, imap_destroy};
static const emi_dataset_vt shard_vt = {"shard", imap_get, imap_get_many, imap_destroy};
static const emi_dataset_vt take_vt = {"take", imap_get, imap_get_many, imap_destroy};

static em_status check_parent(em_state *S, const char *op, em_dataset *d, em_dataset **out) {
  if (!out) return emi_error(S, EM_ERR_ARG, "%s: out is required", op);
  *out = NULL;
  if (!d) return emi_error(S, EM_ERR_ARG, "%s: no dataset given", op);
  return EM_OK;
}

static em_status imap_new(em_state *S, const emi_dataset_vt *vt, em_dataset *d, int kind,
                          int64_t len, imap proto, em_dataset **out) {
  imap *m = emi_malloc(S, sizeof *m);
  if (!m) return emi_error(S, EM_ERR_NOMEM, "%s: out of memory", vt->kind);
  *m = proto;
  m->kind = kind;
  m->cached = NULL;
  if (kind == IMAP_SHUFFLE) pthread_mutex_init(&m->mu, NULL);
  return emi_dataset_new(S, vt, d, len, d->nfields, m, out);
}

em_status em_data_shuffle(em_state *S, em_dataset *d, uint64_t seed, em_dataset **out) {
  em_status st = check_parent(S, "shuffle", d, out);
  if (st) return st;
  return imap_new(S, &shuffle_vt, d, IMAP_SHUFFLE, d->len, (imap){.seed = seed}, out);
}

em_status em_data_shard(em_state *S, em_dataset *d, int64_t rank, int64_t world_size,
                        int drop_remainder, em_dataset **out) {
  em_status st = check_parent(S, "shard", d, out);
  if (st) return st;
  if (world_size < 1 || rank < 0 || rank >= world_size)
    return emi_error(S, EM_ERR_ARG, "shard: rank %lld is not in 0 .. world_size-1 "
                     "(world_size %lld); ranks are 0-based", (long long)rank,
                     (long long)world_size);
  int64_t len = drop_remainder ? d->len / world_size
                               : (d->len + world_size - 1) / world_size;
  return imap_new(S, &shard_vt, d, IMAP_SHARD, len,
                  (imap){.rank = rank, .world = world_size}, out);
}

em_status em_data_take(em_state *S, em_dataset *d, int64_t n, em_dataset **out) {
  em_status st = check_parent(S, "take", d, out);
  if (st) return st;
  if (n < 0) return emi_error(S, EM_ERR_ARG, "take: n must be >= 0, got %lld", (long long)n);
  return imap_new(S, &take_vt, d, IMAP_TAKE, n < d->len ? n : d->len, (imap){0}, out);
}

/* -- Map ----------------------------------------------------------------------------------- */

typedef struct map_stage {
  em_transform *t;
  uint64_t seed;
} map_stage;

static em_status map_get(em_dataset *d, emi_dctx *c, int64_t i, em_tensor **out) {
  map_stage *m = d->impl;
  em_status st = emi_dataset_get(d->parent, c, i, out);
  if (st) return st;
  emi_drng r;
  emi_drng_init(&r, m->seed, c->epoch, i);
  return emi_transform_run(m->t, c, &r, out, d->nfields);
}

static void map_destroy(em_dataset *d) {
  map_stage *m = d->impl;
  if (!m) return;
  em_transform_release(m->t);
  emi_free(d->S, m, sizeof *m);
}

static const emi_dataset_vt map_vt = {"map", map_get, NULL, map_destroy};

em_status em_data_map(em_state *S, em_dataset *d, em_transform *t, uint64_t seed,
                      em_dataset **out) {
  em_status st = check_parent(S, "map", d, out);
  if (st) return st;
  if (!t) return emi_error(S, EM_ERR_ARG, "map: no transform given");
  map_stage *m = emi_malloc(S, sizeof *m);
  if (!m) return emi_error(S, EM_ERR_NOMEM, "map: out of memory");
  m->t = t;
  em_transform_retain(t);
  m->seed = seed;
  return emi_dataset_new(S, &map_vt, d, d->len, d->nfields, m, out);
}

/* -- Batch ----------------------------------------------------------------------------------- */

typedef struct batch_stage { int64_t n; } batch_stage;

static em_status batch_get(em_dataset *d, emi_dctx *c, int64_t b, em_tensor **out) {
  int64_t n = ((batch_stage *)d->impl)->n, start = b * n;
  int64_t count = d->parent->len - start < n ? d->parent->len - start : n;
  int64_t *idx = emi_malloc(d->S, (size_t)count * sizeof *idx);
  if (!idx) return emi_dfail(c, EM_ERR_NOMEM, "batch: out of memory");
  for (int64_t j = 0; j < count; j++) idx[j] = start + j;
  em_status st = emi_dataset_get_many(d->parent, c, idx, count, out);
  emi_free(d->S, idx, (size_t)count * sizeof *idx);
  return st;
}

static void batch_destroy(em_dataset *d) { emi_free(d->S, d->impl, sizeof(batch_stage)); }

static const emi_dataset_vt batch_vt = {"batch", batch_get, NULL, batch_destroy};

em_status em_data_batch(em_state *S, em_dataset *d, int64_t n, int drop_last,
                        em_dataset **out) {
  em_status st = check_parent(S, "batch", d, out);
  if (st) return st;
  if (n < 1) return emi_error(S, EM_ERR_ARG, "batch: size must be >= 1, got %lld",
                              (long long)n);
  batch_stage *b = emi_malloc(S, sizeof *b);
  if (!b) return emi_error(S, EM_ERR_NOMEM, "batch: out of memory");
  b->n = n;
  int64_t len = drop_last ? d->len / n : (d->len + n - 1) / n;
  st = emi_dataset_new(S, &batch_vt, d, len, d->nfields, b, out);
  if (!st) (*out)->batched = 1;
  return st;
}

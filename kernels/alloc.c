/*
** alloc.c -- the caching device allocator (the design is in alloc.h).
**
** Records. A segment from the runtime is a doubly linked list of blocks in
** address order (blk.prev/next); the first block's ptr is what the runtime gave.
** A block is FREE (in its stream's bins), ALLOC (handed out; in the pointer
** table) or PENDING (released, waiting for events; on the device's pending
** list). Invariant: no two neighbours are both FREE -- freeing merges at once --
** so a FREE block without neighbours is a whole unused segment.
**
** All blocks of a segment belong to the stream pool that allocated the segment
** (a split inherits the pool), so merging never mixes streams.
**
** Locks: each device's mutex guards its pools, lists and stats; mapmu guards the
** pointer table. The only nesting is mapmu -> device (record_stream); malloc
** inserts into the table after it let go of the device. Hooks run with no lock.
*/
#include "alloc.h"
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* -- Records --------------------------------------------------------------------- */
enum { ST_FREE, ST_ALLOC, ST_PENDING };
/* Bins: 2^BIN_SUB classes per power of two from 512 bytes (2^9) up. */
enum { BIN_SUB = 3, NBINS = (64 - 9) << BIN_SUB, NWORDS = (NBINS + 63) / 64 };

/* A stream a block was used on besides its own, and the event recorded there at
** release. Spare records keep their event for the next use. */
typedef struct use {
  emk_stream *s;
  emk_event *ev;
  struct use *next;
} use;

typedef struct spool spool;
typedef struct blk {
  char *ptr;
  size_t size;              /* rounded; the whole block */
  size_t requested;         /* what the caller asked (ALLOC only) */
  struct blk *prev, *next;  /* address neighbours in the segment */
  struct blk *lprev, *lnext;/* bin list, pending list or spare list */
  struct blk *hnext;        /* pointer table chain (ALLOC only) */
  spool *pool;
  use *uses;
  int dev;
  unsigned char small, state;
} blk;

typedef struct binset {
  blk *head[NBINS];         /* each list sorted by size, smallest first */
  uint64_t map[NWORDS];     /* bit i: head[i] != NULL */
} binset;

struct spool {
  emk_stream *stream;
  binset bins[2];           /* [0] large pool, [1] small pool */
};

typedef struct devc {
  pthread_mutex_t mu;
  int id;
  spool **pools;
  int npools, cappools;
  blk *pending;             /* PENDING blocks, through lprev/lnext */
  blk *spare_blks;          /* recycled records, through lnext */
  use *spare_uses;          /* recycled use records without an event */
  use *spare_events;        /* ... and with one (a cache of events) */
  size_t threshold, rearm;  /* pressure: 0 = off */
  int armed;
  emk_alloc_stats st;
} devc;

struct emk_alloc {
  emk_runtime *rt;
  em_alloc_fn halloc;
  void *hud;
  void (*oom_hook)(void *ud, int dev, size_t nbytes);
  void (*pressure_hook)(void *ud, int dev, size_t allocated, size_t capacity);
  void *hook_ud;
  pthread_mutex_t mapmu;
  int mapmu_ok;
  blk **buckets;            /* pointer table: 2^bits chains of ALLOC blocks */
  unsigned bits;
  size_t count;
  int ndev;
  devc *devs[EMK_MAX_DEVICES];
};

/* -- Helpers --------------------------------------------------------------------- */
static void *default_alloc(void *ud, void *ptr, size_t osize, size_t nsize) {
  (void)ud; (void)osize;
  if (nsize == 0) { free(ptr); return NULL; }
  return realloc(ptr, nsize);
}

static void *hmalloc(emk_alloc *a, size_t n) { return a->halloc(a->hud, NULL, 0, n); }
static void hfree(emk_alloc *a, void *p, size_t n) { if (p) a->halloc(a->hud, p, n, 0); }

/* "512 B", "1.50 KiB", "512.00 MiB", "1.25 GiB" */
static const char *fmt_bytes(char *buf, size_t len, size_t n) {
  static const char *unit[] = {"KiB", "MiB", "GiB", "TiB"};
  if (n < 1024) { snprintf(buf, len, "%zu B", n); return buf; }
  double v = (double)n / 1024;
  int u = 0;
  while (v >= 1024 && u < 3) { v /= 1024; u++; }
  snprintf(buf, len, "%.2f %s", v, unit[u]);
  return buf;
}

size_t emk_alloc_round(size_t n) {
  if (n == 0 || n > SIZE_MAX - (EMK_ALLOC_ROUND - 1)) return 0;
  return (n + EMK_ALLOC_ROUND - 1) & ~(size_t)(EMK_ALLOC_ROUND - 1);
}

static size_t round_large(size_t r) {   /* up to a multiple of 2 MiB; 0 on overflow */
  if (r > SIZE_MAX - (EMK_ALLOC_LARGE_ROUND - 1)) return 0;
  return (r + EMK_ALLOC_LARGE_ROUND - 1) & ~(size_t)(EMK_ALLOC_LARGE_ROUND - 1);
}

size_t emk_alloc_segment_size(size_t n) {
  size_t r = emk_alloc_round(n);
  if (!r) return 0;
  if (r <= EMK_ALLOC_SMALL) return EMK_ALLOC_SMALL_SEGMENT;
  if (r < EMK_ALLOC_LARGE_MIN) return EMK_ALLOC_MID_SEGMENT;
  return round_large(r);
}

/* -- Bins ------------------------------------------------------------------------ */
static int bin_of(size_t s) {                      /* s >= 512 */
  int fl = 63 - __builtin_clzll((unsigned long long)s);
  int sl = (int)(s >> (fl - BIN_SUB)) & ((1 << BIN_SUB) - 1);
  return ((fl - 9) << BIN_SUB) + sl;
}

static void bin_insert(devc *d, blk *b) {
  binset *bs = &b->pool->bins[b->small];
  int i = bin_of(b->size);
  blk *p = bs->head[i], *before = NULL;
  while (p && p->size < b->size) { before = p; p = p->lnext; }
  b->lprev = before;
  b->lnext = p;
  if (p) p->lprev = b;
  if (before) before->lnext = b; else bs->head[i] = b;
  bs->map[i >> 6] |= 1ull << (i & 63);
  d->st.free_blocks++;
}

static void bin_remove(devc *d, blk *b) {
  binset *bs = &b->pool->bins[b->small];
  int i = bin_of(b->size);
  if (b->lnext) b->lnext->lprev = b->lprev;
  if (b->lprev) b->lprev->lnext = b->lnext; else bs->head[i] = b->lnext;
  if (!bs->head[i]) bs->map[i >> 6] &= ~(1ull << (i & 63));
  b->lprev = b->lnext = NULL;
  d->st.free_blocks--;
}

/* The smallest free block of at least size bytes, or NULL. */
static blk *bin_find(binset *bs, size_t size) {
  int i = bin_of(size);
  for (blk *p = bs->head[i]; p; p = p->lnext)
    if (p->size >= size) return p;
  /* every block of a later non-empty bin fits; its head is the smallest */
  for (int w = (i + 1) >> 6, j = i + 1; w < NWORDS; w++, j = w << 6) {
    uint64_t m = j < NBINS ? bs->map[w] & (~0ull << (j & 63)) : 0;
    if (m) return bs->head[(w << 6) + __builtin_ctzll(m)];
  }
  return NULL;
}

/* -- Records: spares --------------------------------------------------------------- */
static blk *blk_get(emk_alloc *a, devc *d) {
  blk *b = d->spare_blks;
  if (b) d->spare_blks = b->lnext;
  else if (!(b = hmalloc(a, sizeof *b))) return NULL;
  memset(b, 0, sizeof *b);
  b->dev = d->id;
  return b;
}

static void blk_put(devc *d, blk *b) {
  b->lnext = d->spare_blks;
  d->spare_blks = b;
}

static use *use_get(emk_alloc *a, devc *d) {
  use *u;                   /* plain records first: cached events wait for releases */
  if ((u = d->spare_uses)) d->spare_uses = u->next;
  else if ((u = d->spare_events)) d->spare_events = u->next;
  else if ((u = hmalloc(a, sizeof *u))) u->ev = NULL;
  return u;
}

static void use_put(devc *d, use *u) {
  u->s = NULL;
  if (u->ev) { u->next = d->spare_events; d->spare_events = u; }
  else { u->next = d->spare_uses; d->spare_uses = u; }
}

/* Frees the spare records (and destroys the cached events). */
static void drop_spares(emk_alloc *a, devc *d) {
  for (blk *b = d->spare_blks, *n; b; b = n) { n = b->lnext; hfree(a, b, sizeof *b); }
  d->spare_blks = NULL;
  for (int k = 0; k < 2; k++) {
    use **list = k ? &d->spare_events : &d->spare_uses;
    for (use *u = *list, *n; u; u = n) {
      n = u->next;
      if (u->ev) a->rt->ops->event_destroy(a->rt, u->ev);
      hfree(a, u, sizeof *u);
    }
    *list = NULL;
  }
}

/* The pool of stream s on d, made on first use; NULL when out of host memory. */
static spool *get_pool(emk_alloc *a, devc *d, emk_stream *s) {
  for (int i = 0; i < d->npools; i++)
    if (d->pools[i]->stream == s) return d->pools[i];
  spool *p = hmalloc(a, sizeof *p);
  if (!p) return NULL;
  if (d->npools == d->cappools) {
    int cap = d->cappools ? 2 * d->cappools : 4;
    spool **arr = hmalloc(a, (size_t)cap * sizeof *arr);
    if (!arr) { hfree(a, p, sizeof *p); return NULL; }
    if (d->npools) memcpy(arr, d->pools, (size_t)d->npools * sizeof *arr);
    hfree(a, d->pools, (size_t)d->cappools * sizeof *arr);
    d->pools = arr;
    d->cappools = cap;
  }
  memset(p, 0, sizeof *p);
  p->stream = s;
  d->pools[d->npools++] = p;
  return p;
}

/* -- Pointer table ------------------------------------------------------------------
** Chains through the blocks themselves, so inserting never allocates; the table
** doubles when it gets full, and stays as it is if that memory can't be had. */
static size_t hidx(const void *p, unsigned bits) {
  uint64_t h = (uint64_t)((uintptr_t)p >> 9) * 0x9E3779B97F4A7C15ull;
  return (size_t)(h >> (64 - bits));
}

static void map_insert(emk_alloc *a, blk *b) {
  pthread_mutex_lock(&a->mapmu);
  size_t n = (size_t)1 << a->bits;
  if (a->count >= n && a->bits < 40) {
    blk **t = hmalloc(a, 2 * n * sizeof *t);
    if (t) {
      memset(t, 0, 2 * n * sizeof *t);
      for (size_t i = 0; i < n; i++)
        for (blk *c = a->buckets[i], *nx; c; c = nx) {
          nx = c->hnext;
          size_t j = hidx(c->ptr, a->bits + 1);
          c->hnext = t[j];
          t[j] = c;
        }
      hfree(a, a->buckets, n * sizeof *t);
      a->buckets = t;
      a->bits++;
    }
  }
  size_t i = hidx(b->ptr, a->bits);
  b->hnext = a->buckets[i];
  a->buckets[i] = b;
  a->count++;
  pthread_mutex_unlock(&a->mapmu);
}

/* The ALLOC block at p (mapmu held), unlinked from the table when remove. */
static blk *map_find(emk_alloc *a, const void *p, int remove) {
  blk **pp = &a->buckets[hidx(p, a->bits)];
  for (; *pp; pp = &(*pp)->hnext)
    if ((*pp)->ptr == p) {
      blk *b = *pp;
      if (remove) { *pp = b->hnext; b->hnext = NULL; a->count--; }
      return b;
    }
  return NULL;
}

/* -- Free blocks: merging, pending events, giving segments back -------------------- */
static void free_block(devc *d, blk *b) {
  blk *p = b->prev, *n = b->next;
  b->state = ST_FREE;
  b->requested = 0;
  if (p && p->state == ST_FREE) {          /* b joins its free left neighbour */
    bin_remove(d, p);
    p->size += b->size;
    p->next = n;
    if (n) n->prev = p;
    blk_put(d, b);
    b = p;
  }
  if (n && n->state == ST_FREE) {          /* and swallows its free right one */
    bin_remove(d, n);
    b->size += n->size;
    b->next = n->next;
    if (n->next) n->next->prev = b;
    blk_put(d, n);
  }
  bin_insert(d, b);
}

static void pending_remove(devc *d, blk *b) {
  if (b->lnext) b->lnext->lprev = b->lprev;
  if (b->lprev) b->lprev->lnext = b->lnext; else d->pending = b->lnext;
  b->lprev = b->lnext = NULL;
}

/* Returns the pending blocks whose events are done to their bins; with wait,
** waits for every event first. A query that fails (an error of the stream's
** earlier work) is settled by waiting for the event: the work is over either way. */
static void poll_pending(emk_alloc *a, devc *d, int wait) {
  emk_runtime *rt = a->rt;
  for (blk *b = d->pending, *nb; b; b = nb) {
    nb = b->lnext;                 /* PENDING: never merged away below */
    for (use **pp = &b->uses, *u; (u = *pp);) {
      int done = 0;
      if (wait || rt->ops->event_query(rt, u->ev, &done) != EM_OK) {
        rt->ops->event_sync(rt, u->ev);
        done = 1;
      }
      if (done) { *pp = u->next; use_put(d, u); }
      else pp = &u->next;
    }
    if (!b->uses) {
      pending_remove(d, b);
      d->st.pending -= b->size;
      d->st.pending_blocks--;
      free_block(d, b);
    }
  }
}

/* At release: an event on every other stream b was used on, so that it returns to
** the bins only after that work. Without an event, waits for the stream. Returns
** the first error the runtime reported (b is safe either way). */
static em_status guard_uses(emk_alloc *a, devc *d, blk *b, char *err, size_t errlen) {
  emk_runtime *rt = a->rt;
  em_status first = EM_OK;
  for (use **pp = &b->uses, *u; (u = *pp);) {
    em_status st = EM_OK;
    if (!u->ev && d->spare_events) {       /* take a cached event */
      use *x = d->spare_events;
      d->spare_events = x->next;
      u->ev = x->ev;
      x->ev = NULL;
      use_put(d, x);
    }
    if (!u->ev && rt->ops->event_create(rt, d->id, &u->ev) != EM_OK) u->ev = NULL;
    if (u->ev) {
      st = rt->ops->event_record(rt, u->ev, u->s);
      if (st == EM_OK) { pp = &u->next; continue; }
      if (first == EM_OK)
        first = emk_errf(err, errlen, st, "cuda:%d: releasing a block used on another "
                     "stream: %s", d->id, rt->errmsg);
    }
    st = rt->ops->stream_sync(rt, u->s);   /* no event: wait for the stream */
    d->st.stream_syncs++;
    if (st != EM_OK && first == EM_OK)
      first = emk_errf(err, errlen, st, "cuda:%d: releasing a block used on another "
                   "stream: %s", d->id, rt->errmsg);
    *pp = u->next;
    use_put(d, u);
  }
  return first;
}

static em_status seg_free(emk_alloc *a, devc *d, blk *b) {
  em_status st = a->rt->ops->free(a->rt, d->id, b->ptr);
  if (st != EM_OK) return st;
  d->st.reserved -= b->size;
  d->st.segments--;
  d->st.segment_frees++;
  blk_put(d, b);
  return EM_OK;
}

/* Gives every whole free segment of d back to the runtime. A segment the runtime
** would not take back stays cached; the first such error is returned. */
static em_status release_cached(emk_alloc *a, devc *d, char *err, size_t errlen) {
  em_status first = EM_OK;
  blk *keep = NULL;
  for (int i = 0; i < d->npools; i++)
    for (int k = 0; k < 2; k++) {
      binset *bs = &d->pools[i]->bins[k];
      for (int j = 0; j < NBINS; j++) {
        if (!(bs->map[j >> 6] >> (j & 63) & 1)) continue;
        for (blk *b = bs->head[j], *n; b; b = n) {
          n = b->lnext;
          if (b->prev || b->next) continue;
          bin_remove(d, b);
          em_status st = seg_free(a, d, b);
          if (st != EM_OK) {
            if (first == EM_OK)
              first = emk_errf(err, errlen, st, "cuda:%d: freeing a segment: %s", d->id,
                           a->rt->errmsg);
            b->lnext = keep;
            keep = b;
          }
        }
      }
    }
  for (blk *b = keep, *n; b; b = n) { n = b->lnext; bin_insert(d, b); }
  return first;
}

/* -- Allocation -------------------------------------------------------------------- */
/* A free block of at least size bytes from pool's bins, taken out of them. */
static blk *take_free(devc *d, spool *pool, int small, size_t size) {
  blk *b = bin_find(&pool->bins[small], size);
  if (b) bin_remove(d, b);
  return b;
}

/* A new segment for a request of size (rounded) bytes, as one block. *host is set
** when the bookkeeping record could not be had. */
static em_status new_segment(emk_alloc *a, devc *d, spool *pool, int small, size_t size,
                             blk **out, int *host) {
  emk_runtime *rt = a->rt;
  blk *b = blk_get(a, d);
  if (!b) { *host = 1; return EM_ERR_NOMEM; }
  size_t seg = emk_alloc_segment_size(size);
  size_t min = small ? (size_t)EMK_ALLOC_SMALL_SEGMENT : round_large(size);
  void *p = NULL;
  em_status st = rt->ops->malloc(rt, d->id, seg, &p);
  if (st == EM_ERR_NOMEM && min != seg) {  /* no 20 MiB: try the request's own size */
    seg = min;
    st = rt->ops->malloc(rt, d->id, seg, &p);
  }
  if (st == EM_OK && !p) st = emk_fail(rt, EM_ERR_INTERNAL, "the runtime returned NULL");
  if (st != EM_OK) { blk_put(d, b); return st; }
  b->ptr = p;
  b->size = seg;
  b->pool = pool;
  b->small = (unsigned char)small;
  b->state = ST_FREE;
  d->st.reserved += seg;
  if (d->st.reserved > d->st.peak_reserved) d->st.peak_reserved = d->st.reserved;
  d->st.segments++;
  d->st.segment_allocs++;
  *out = b;
  return EM_OK;
}

/* The cache, then the runtime: the whole search (d->mu held; the OOM hook is
** called with it let go). */
static em_status obtain(emk_alloc *a, devc *d, spool *pool, int small, size_t size,
                        blk **out, int *host) {
  blk *b = take_free(d, pool, small, size);
  if (b) { d->st.cache_hits++; *out = b; return EM_OK; }
  em_status st = new_segment(a, d, pool, small, size, out, host);
  if (st != EM_ERR_NOMEM || *host) return st;
  for (int round = 0; round < 2; round++) {
    if (round == 1) {                       /* ask the owner to free memory */
      if (!a->oom_hook) break;
      d->st.oom_hook_calls++;
      pthread_mutex_unlock(&d->mu);
      a->oom_hook(a->hook_ud, d->id, size);
      pthread_mutex_lock(&d->mu);
    }
    poll_pending(a, d, 1);                  /* blocks waiting for events */
    if ((b = take_free(d, pool, small, size))) {
      d->st.cache_hits++;
      *out = b;
      return EM_OK;
    }
    release_cached(a, d, NULL, 0);          /* every unused segment */
    d->st.oom_retries++;
    st = new_segment(a, d, pool, small, size, out, host);
    if (st != EM_ERR_NOMEM || *host) return st;
  }
  return st;
}

/* Cuts b down to size when the rest is worth keeping (see alloc.h); the rest
** goes to the bins. Without a record for the rest, b stays whole. */
static void maybe_split(emk_alloc *a, devc *d, blk *b, size_t size) {
  size_t rest = b->size - size;
  if (b->small ? rest < EMK_ALLOC_ROUND : rest <= EMK_ALLOC_SMALL) return;
  blk *r = blk_get(a, d);
  if (!r) return;
  r->ptr = b->ptr + size;
  r->size = rest;
  r->pool = b->pool;
  r->small = b->small;
  r->state = ST_FREE;
  r->prev = b;
  r->next = b->next;
  if (b->next) b->next->prev = r;
  b->next = r;
  b->size = size;
  bin_insert(d, r);       /* its right neighbour is not FREE: b was a free block */
}

em_status emk_alloc_malloc(emk_alloc *a, int dev, size_t n, emk_stream *s, void **out,
                           char *err, size_t errlen) {
  char b1[32], b2[32], b3[32], b4[32], b5[32];
  if (!out) return emk_errf(err, errlen, EM_ERR_ARG, "emk_alloc_malloc: out is NULL");
  *out = NULL;
  if (!a) return emk_errf(err, errlen, EM_ERR_ARG, "emk_alloc_malloc: no allocator");
  if (dev < 0 || dev >= a->ndev)
    return emk_errf(err, errlen, EM_ERR_DEVICE, "cuda:%d: no such device (%d device%s)",
                dev, a->ndev, a->ndev == 1 ? "" : "s");
  if (n == 0) return EM_OK;
  size_t size = emk_alloc_round(n);
  if (!size || !emk_alloc_segment_size(n))
    return emk_errf(err, errlen, EM_ERR_NOMEM, "cuda:%d: out of memory allocating %s "
                "(more than any device has)", dev, fmt_bytes(b1, sizeof b1, n));
  devc *d = a->devs[dev];
  int small = size <= EMK_ALLOC_SMALL, host = 0, pressure = 0;
  blk *b = NULL;
  em_status st = EM_ERR_NOMEM;

  pthread_mutex_lock(&d->mu);
  poll_pending(a, d, 0);
  spool *pool = get_pool(a, d, s);
  if (pool) st = obtain(a, d, pool, small, size, &b, &host);
  else host = 1;
  if (st != EM_OK) {
    if (host)
      st = emk_errf(err, errlen, EM_ERR_NOMEM, "cuda:%d: out of host memory for the "
                "allocator's records (allocating %s)", dev, fmt_bytes(b1, sizeof b1, size));
    else if (st == EM_ERR_NOMEM) {
      d->st.ooms++;
      emk_alloc_stats *t = &d->st;
      emk_errf(err, errlen, st, "cuda:%d: out of memory allocating %s (%s allocated by "
           "tensors, %s cached, %s reserved, %s%s)", dev, fmt_bytes(b1, sizeof b1, size),
           fmt_bytes(b2, sizeof b2, t->allocated),
           fmt_bytes(b3, sizeof b3, t->reserved - t->allocated),
           fmt_bytes(b4, sizeof b4, t->reserved),
           t->capacity ? fmt_bytes(b5, sizeof b5, t->capacity) : "capacity unknown",
           t->capacity ? " capacity" : "");
    } else
      emk_errf(err, errlen, st, "cuda:%d: allocating %s: %s", dev,
           fmt_bytes(b1, sizeof b1, size), a->rt->errmsg);
    pthread_mutex_unlock(&d->mu);
    return st;
  }
  maybe_split(a, d, b, size);
  b->state = ST_ALLOC;
  b->requested = n;
  d->st.allocated += b->size;
  d->st.requested += n;
  if (d->st.allocated > d->st.peak_allocated) d->st.peak_allocated = d->st.allocated;
  d->st.num_allocs++;
  d->st.active_blocks++;
  if (d->threshold && d->armed && d->st.allocated >= d->threshold) {
    d->armed = 0;
    if (a->pressure_hook) { pressure = 1; d->st.pressure_hook_calls++; }
  }
  size_t allocated = d->st.allocated, capacity = d->st.capacity;
  pthread_mutex_unlock(&d->mu);

  map_insert(a, b);
  if (pressure) a->pressure_hook(a->hook_ud, dev, allocated, capacity);
  *out = b->ptr;
  return EM_OK;
}

/* -- Release and streams ------------------------------------------------------------ */
em_status emk_alloc_release(emk_alloc *a, void *p, char *err, size_t errlen) {
  if (!p) return EM_OK;
  if (!a) return emk_errf(err, errlen, EM_ERR_ARG, "emk_alloc_release: no allocator");
  pthread_mutex_lock(&a->mapmu);
  blk *b = map_find(a, p, 1);
  pthread_mutex_unlock(&a->mapmu);
  if (!b)
    return emk_errf(err, errlen, EM_ERR_ARG, "releasing device pointer %p: not allocated by "
                "this allocator, or released twice", p);
  devc *d = a->devs[b->dev];
  em_status st = EM_OK;
  pthread_mutex_lock(&d->mu);
  d->st.allocated -= b->size;
  d->st.requested -= b->requested;
  d->st.num_frees++;
  d->st.active_blocks--;
  if (!d->armed && d->st.allocated < d->rearm) d->armed = 1;
  if (b->uses) st = guard_uses(a, d, b, err, errlen);
  if (b->uses) {                           /* waits for its events */
    b->state = ST_PENDING;
    b->requested = 0;
    b->lprev = NULL;
    b->lnext = d->pending;
    if (d->pending) d->pending->lprev = b;
    d->pending = b;
    d->st.pending += b->size;
    d->st.pending_blocks++;
  } else
    free_block(d, b);
  pthread_mutex_unlock(&d->mu);
  return st;
}

em_status emk_alloc_record_stream(emk_alloc *a, void *p, emk_stream *s, char *err,
                                  size_t errlen) {
  if (!a || !p) return emk_errf(err, errlen, EM_ERR_ARG, "emk_alloc_record_stream: NULL");
  em_status st = EM_OK;
  pthread_mutex_lock(&a->mapmu);
  blk *b = map_find(a, p, 0);
  if (!b) {
    pthread_mutex_unlock(&a->mapmu);
    return emk_errf(err, errlen, EM_ERR_ARG, "recording a stream for device pointer %p: not "
                "allocated by this allocator, or released", p);
  }
  devc *d = a->devs[b->dev];
  pthread_mutex_lock(&d->mu);
  int known = s == b->pool->stream;
  for (use *u = b->uses; u && !known; u = u->next) known = u->s == s;
  if (!known) {
    use *u = use_get(a, d);
    if (u) { u->s = s; u->next = b->uses; b->uses = u; }
    else st = emk_errf(err, errlen, EM_ERR_NOMEM, "cuda:%d: out of host memory recording "
                   "a stream for a block", d->id);
  }
  pthread_mutex_unlock(&d->mu);
  pthread_mutex_unlock(&a->mapmu);
  return st;
}

size_t emk_alloc_block_size(emk_alloc *a, const void *p) {
  if (!a || !p) return 0;
  pthread_mutex_lock(&a->mapmu);
  blk *b = map_find(a, p, 0);
  size_t n = b ? b->size : 0;
  pthread_mutex_unlock(&a->mapmu);
  return n;
}

/* -- Cache, stats, hooks ---------------------------------------------------------------- */
em_status emk_alloc_empty_cache(emk_alloc *a, int dev, char *err, size_t errlen) {
  if (!a) return emk_errf(err, errlen, EM_ERR_ARG, "emk_alloc_empty_cache: no allocator");
  if (dev < -1 || dev >= a->ndev)
    return emk_errf(err, errlen, EM_ERR_DEVICE, "cuda:%d: no such device (%d device%s)",
                dev, a->ndev, a->ndev == 1 ? "" : "s");
  em_status first = EM_OK;
  for (int i = dev < 0 ? 0 : dev; i < (dev < 0 ? a->ndev : dev + 1); i++) {
    devc *d = a->devs[i];
    pthread_mutex_lock(&d->mu);
    poll_pending(a, d, 0);
    em_status st = release_cached(a, d, first == EM_OK ? err : NULL, errlen);
    if (first == EM_OK) first = st;
    drop_spares(a, d);
    pthread_mutex_unlock(&d->mu);
  }
  return first;
}

em_status emk_alloc_stats_get(emk_alloc *a, int dev, emk_alloc_stats *out) {
  if (!a || !out) return EM_ERR_ARG;
  if (dev < 0 || dev >= a->ndev) return EM_ERR_DEVICE;
  devc *d = a->devs[dev];
  pthread_mutex_lock(&d->mu);
  *out = d->st;
  pthread_mutex_unlock(&d->mu);
  return EM_OK;
}

void emk_alloc_reset_peak(emk_alloc *a, int dev) {
  if (!a || dev < 0 || dev >= a->ndev) return;
  devc *d = a->devs[dev];
  pthread_mutex_lock(&d->mu);
  d->st.peak_allocated = d->st.allocated;
  d->st.peak_reserved = d->st.reserved;
  pthread_mutex_unlock(&d->mu);
}

void emk_alloc_set_hooks(emk_alloc *a, void (*oom_hook)(void *, int, size_t),
                         void (*pressure_hook)(void *, int, size_t, size_t), void *ud) {
  if (!a) return;
  a->oom_hook = oom_hook;
  a->pressure_hook = pressure_hook;
  a->hook_ud = ud;
}

/* -- Open and close ------------------------------------------------------------------- */
em_status emk_alloc_new(emk_runtime *rt, const emk_alloc_config *cfg, emk_alloc **out,
                        char *err, size_t errlen) {
  if (!out) return emk_errf(err, errlen, EM_ERR_ARG, "emk_alloc_new: out is NULL");
  *out = NULL;
  const emk_runtime_ops *o = rt ? rt->ops : NULL;
  if (!o || !o->device_count || !o->malloc || !o->free || !o->stream_sync ||
      !o->event_create || !o->event_destroy || !o->event_record || !o->event_query ||
      !o->event_sync)
    return emk_errf(err, errlen, EM_ERR_ARG, "emk_alloc_new: no runtime, or one without "
                "memory, stream_sync and event entries");
  em_alloc_fn f = cfg && cfg->host_alloc ? cfg->host_alloc : default_alloc;
  void *ud = cfg && cfg->host_alloc ? cfg->host_ud : NULL;
  emk_alloc *a = f(ud, NULL, 0, sizeof *a);
  if (!a) goto nomem;
  memset(a, 0, sizeof *a);
  a->rt = rt;
  a->halloc = f;
  a->hud = ud;
  if (cfg) emk_alloc_set_hooks(a, cfg->oom_hook, cfg->pressure_hook, cfg->hook_ud);
  double frac = cfg && cfg->pressure_fraction != 0 ? cfg->pressure_fraction : 0.8;
  if (pthread_mutex_init(&a->mapmu, NULL) != 0) goto nomem;
  a->mapmu_ok = 1;
  a->bits = 8;
  if (!(a->buckets = hmalloc(a, ((size_t)1 << a->bits) * sizeof *a->buckets))) goto nomem;
  memset(a->buckets, 0, ((size_t)1 << a->bits) * sizeof *a->buckets);
  int ndev = rt->ops->device_count(rt);
  if (ndev < 0) ndev = 0;
  if (ndev > EMK_MAX_DEVICES) ndev = EMK_MAX_DEVICES;
  for (int i = 0; i < ndev; i++) {
    devc *d = hmalloc(a, sizeof *d);
    if (!d) goto nomem;
    memset(d, 0, sizeof *d);
    if (pthread_mutex_init(&d->mu, NULL) != 0) { hfree(a, d, sizeof *d); goto nomem; }
    d->id = i;
    /* The capacity from the properties, which need no CUDA context (mem_info
    ** would make one on every device: runtime.h, Contexts); mem_info only for a
    ** runtime without them. */
    size_t freeb = 0, total = 0;
    emk_device_props props;
    if (rt->ops->device_props && rt->ops->device_props(rt, i, &props) == EM_OK)
      d->st.capacity = props.total_memory;
    else if (rt->ops->mem_info && rt->ops->mem_info(rt, i, &freeb, &total) == EM_OK)
      d->st.capacity = total;
    if (frac > 0 && frac < 1 && d->st.capacity) {
      d->threshold = (size_t)((double)d->st.capacity * frac);
      d->rearm = d->threshold / 10 * 9;
    }
    d->armed = 1;
    a->devs[i] = d;
    a->ndev = i + 1;
  }
  *out = a;
  return EM_OK;
nomem:
  if (a) emk_alloc_close(a);
  return emk_errf(err, errlen, EM_ERR_NOMEM, "out of host memory opening the device allocator");
}

int64_t emk_alloc_close(emk_alloc *a) {
  if (!a) return 0;
  int64_t live = 0;
  /* blocks still handed out go back as if released (their streams are drained) */
  for (size_t i = 0; a->buckets && i < ((size_t)1 << a->bits); i++)
    for (blk *b = a->buckets[i], *n; b; b = n) {
      n = b->hnext;
      devc *d = a->devs[b->dev];
      for (use *u = b->uses, *un; u; u = un) { un = u->next; use_put(d, u); }
      b->uses = NULL;
      d->st.allocated -= b->size;
      d->st.requested -= b->requested;
      d->st.active_blocks--;
      free_block(d, b);
      live++;
    }
  for (int i = 0; i < a->ndev; i++) {
    devc *d = a->devs[i];
    poll_pending(a, d, 1);
    release_cached(a, d, NULL, 0);
    /* what the runtime would not take back: only the records can be freed */
    for (int k = 0; k < d->npools; k++) {
      for (int j = 0; j < 2; j++)
        for (int m = 0; m < NBINS; m++)
          for (blk *b = d->pools[k]->bins[j].head[m], *n; b; b = n) {
            n = b->lnext;
            hfree(a, b, sizeof *b);
          }
      hfree(a, d->pools[k], sizeof *d->pools[k]);
    }
    hfree(a, d->pools, (size_t)d->cappools * sizeof *d->pools);
    drop_spares(a, d);
    pthread_mutex_destroy(&d->mu);
    hfree(a, d, sizeof *d);
  }
  hfree(a, a->buckets, ((size_t)1 << a->bits) * sizeof *a->buckets);
  if (a->mapmu_ok) pthread_mutex_destroy(&a->mapmu);
  hfree(a, a, sizeof *a);
  return live;
}

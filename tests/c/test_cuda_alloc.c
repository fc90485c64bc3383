/*
** test_cuda_alloc.c -- the caching device allocator (kernels/alloc.c).
**
** The allocator only sees the device runtime table, so most groups run it on a
** fake runtime written here, whose behaviour the test controls:
**   - device memory is an address range that is never touched (so a "2 GiB"
**     device costs nothing), with a capacity per device, a table of live blocks
**     (frees of unknown blocks are counted) and no address ever reused;
**   - a stream is a pair of counters, work queued and work completed; the test
**     queues work (fk_work) and completes it (fk_complete); an event recorded on
**     a stream is done once the work queued before it has completed;
**   - every failure point -- the allocator's host allocations (through a
**     counting em_alloc_fn), the runtime's malloc, event_create and
**     event_record -- shares one counter, so "fail the k-th call" walks through
**     all of them in turn.
** The last group runs on the emulated runtime (kernels/emu/) as well.
*/
#include "check.h"
#include "../../kernels/alloc.h"
#include <pthread.h>
#include <stdint.h>

#define MiB ((size_t)1 << 20)
#define KiB ((size_t)1 << 10)
#define GiB ((size_t)1 << 30)

/* -- The fake runtime ---------------------------------------------------------------- */
struct emk_stream { uint64_t queued, completed; };
struct emk_event { struct emk_stream *s; uint64_t point; };

typedef struct fk_block { uintptr_t addr; size_t size; int dev; } fk_block;

typedef struct fake {
  emk_runtime rt;
  pthread_mutex_t mu;
  int ndev;
  size_t capacity, used[4];
  uintptr_t next_addr;
  fk_block *blocks;
  int nblocks, capblocks;
  /* failure injection over every counted call */
  long calls, fail_at;
  int injected;            /* the kind of the call that failed */
  int fail_event_create, fail_event_record;   /* every such call, while set */
  /* host allocations of the allocator (a header keeps the size) */
  long host_live_blocks, host_bad_sizes;
  int64_t host_live_bytes;
  /* counters */
  long live_events, bad_frees, rt_mallocs, rt_frees, event_syncs, stream_syncs;
} fake;

static fake *FK(emk_runtime *rt) { return (fake *)rt; }

/* Counts one failure point of a kind; non-zero when this one is to fail. mu held. */
enum { FK_HOST = 1, FK_MALLOC, FK_EVENT_CREATE, FK_EVENT_RECORD, FK_KINDS };
static int fk_inject(fake *f, int kind) {
  if (++f->calls == f->fail_at) { f->injected = kind; return 1; }
  return 0;
}

static void *fk_host_alloc(void *ud, void *ptr, size_t osize, size_t nsize) {
  fake *f = ud;
  void *res = NULL;
  pthread_mutex_lock(&f->mu);
  if (nsize == 0) {
    if (ptr) {
      char *h = (char *)ptr - 16;
      if (*(size_t *)h != osize) f->host_bad_sizes++;
      f->host_live_bytes -= (int64_t)*(size_t *)h;
      f->host_live_blocks--;
      free(h);
    }
  } else if (ptr) {
    f->host_bad_sizes++;                   /* the allocator never resizes */
  } else if (!fk_inject(f, FK_HOST)) {
    char *h = malloc(nsize + 16);
    if (h) {
      *(size_t *)h = nsize;
      f->host_live_bytes += (int64_t)nsize;
      f->host_live_blocks++;
      res = h + 16;
    }
  }
  pthread_mutex_unlock(&f->mu);
  return res;
}

static int fk_count(emk_runtime *rt) { return FK(rt)->ndev; }

static em_status fk_props(emk_runtime *rt, int dev, emk_device_props *out) {
  memset(out, 0, sizeof *out);
  snprintf(out->name, sizeof out->name, "fake");
  out->total_memory = FK(rt)->capacity;
  return EM_OK;
}

static em_status fk_mem_info(emk_runtime *rt, int dev, size_t *freeb, size_t *total) {
  fake *f = FK(rt);
  pthread_mutex_lock(&f->mu);
  *total = f->capacity;
  *freeb = f->capacity - f->used[dev];
  pthread_mutex_unlock(&f->mu);
  return EM_OK;
}

static em_status fk_malloc(emk_runtime *rt, int dev, size_t n, void **out) {
  fake *f = FK(rt);
  em_status st = EM_OK;
  pthread_mutex_lock(&f->mu);
  if (fk_inject(f, FK_MALLOC) || n > f->capacity - f->used[dev]) {
    st = emk_fail(rt, EM_ERR_NOMEM, "fake: out of memory");
  } else {
    if (f->nblocks == f->capblocks) {
      f->capblocks = f->capblocks ? 2 * f->capblocks : 64;
      f->blocks = realloc(f->blocks, (size_t)f->capblocks * sizeof *f->blocks);
    }
    f->blocks[f->nblocks++] = (fk_block){f->next_addr, n, dev};
    *out = (void *)f->next_addr;
    f->next_addr += (n + 4095) / 4096 * 4096 + 4096;    /* a gap: never adjacent */
    f->used[dev] += n;
    f->rt_mallocs++;
  }
  pthread_mutex_unlock(&f->mu);
  return st;
}

static em_status fk_free(emk_runtime *rt, int dev, void *p) {
  fake *f = FK(rt);
  em_status st = EM_OK;
  pthread_mutex_lock(&f->mu);
  int i = 0;
  while (i < f->nblocks && (f->blocks[i].addr != (uintptr_t)p || f->blocks[i].dev != dev)) i++;
  if (i == f->nblocks) {
    f->bad_frees++;
    st = emk_fail(rt, EM_ERR_ARG, "fake: free of an unknown block");
  } else {
    f->used[dev] -= f->blocks[i].size;
    f->blocks[i] = f->blocks[--f->nblocks];
    f->rt_frees++;
  }
  pthread_mutex_unlock(&f->mu);
  return st;
}

static em_status fk_stream_create(emk_runtime *rt, int dev, emk_stream **out) {
  *out = calloc(1, sizeof **out);
  return *out ? EM_OK : EM_ERR_NOMEM;
}
static em_status fk_stream_destroy(emk_runtime *rt, emk_stream *s) { free(s); return EM_OK; }
static em_status fk_stream_sync(emk_runtime *rt, emk_stream *s) {
  fake *f = FK(rt);
  pthread_mutex_lock(&f->mu);
  if (s) s->completed = s->queued;
  f->stream_syncs++;
  pthread_mutex_unlock(&f->mu);
  return EM_OK;
}

static em_status fk_event_create(emk_runtime *rt, int dev, emk_event **out) {
  fake *f = FK(rt);
  em_status st = EM_OK;
  pthread_mutex_lock(&f->mu);
  if (fk_inject(f, FK_EVENT_CREATE) || f->fail_event_create)
    st = emk_fail(rt, EM_ERR_NOMEM, "fake: no event");
  else if (!(*out = calloc(1, sizeof **out))) st = EM_ERR_NOMEM;
  else f->live_events++;
  pthread_mutex_unlock(&f->mu);
  return st;
}
static em_status fk_event_destroy(emk_runtime *rt, emk_event *e) {
  fake *f = FK(rt);
  pthread_mutex_lock(&f->mu);
  f->live_events--;
  free(e);
  pthread_mutex_unlock(&f->mu);
  return EM_OK;
}
static em_status fk_event_record(emk_runtime *rt, emk_event *e, emk_stream *s) {
  fake *f = FK(rt);
  em_status st = EM_OK;
  pthread_mutex_lock(&f->mu);
  if (fk_inject(f, FK_EVENT_RECORD) || f->fail_event_record)
    st = emk_fail(rt, EM_ERR_INTERNAL, "fake: an earlier kernel on this stream failed");
  else { e->s = s; e->point = s ? s->queued : 0; }
  pthread_mutex_unlock(&f->mu);
  return st;
}
static em_status fk_event_query(emk_runtime *rt, emk_event *e, int *done) {
  fake *f = FK(rt);
  pthread_mutex_lock(&f->mu);
  *done = !e->s || e->s->completed >= e->point;
  pthread_mutex_unlock(&f->mu);
  return EM_OK;
}
static em_status fk_event_sync(emk_runtime *rt, emk_event *e) {
  fake *f = FK(rt);
  pthread_mutex_lock(&f->mu);
  if (e->s && e->s->completed < e->point) e->s->completed = e->point;
  f->event_syncs++;
  pthread_mutex_unlock(&f->mu);
  return EM_OK;
}

static const emk_runtime_ops fk_ops = {
  .name = "fake", .device_count = fk_count, .device_props = fk_props,
  .mem_info = fk_mem_info, .malloc = fk_malloc, .free = fk_free,
  .stream_create = fk_stream_create, .stream_destroy = fk_stream_destroy,
  .stream_sync = fk_stream_sync, .event_create = fk_event_create,
  .event_destroy = fk_event_destroy, .event_record = fk_event_record,
  .event_query = fk_event_query, .event_sync = fk_event_sync,
};

static void fk_init(fake *f, int ndev, size_t capacity) {
  memset(f, 0, sizeof *f);
  f->rt.ops = &fk_ops;
  pthread_mutex_init(&f->mu, NULL);
  f->ndev = ndev;
  f->capacity = capacity;
  f->next_addr = (uintptr_t)1 << 32;
}
static void fk_done(fake *f) {
  free(f->blocks);
  pthread_mutex_destroy(&f->mu);
}
/* Work queued on s (a kernel that uses memory), and all of it completed. */
static void fk_work(fake *f, emk_stream *s) {
  pthread_mutex_lock(&f->mu); s->queued++; pthread_mutex_unlock(&f->mu);
}
static void fk_complete(fake *f, emk_stream *s) {
  pthread_mutex_lock(&f->mu); s->completed = s->queued; pthread_mutex_unlock(&f->mu);
}
static emk_stream *fk_stream(void) { return calloc(1, sizeof(emk_stream)); }

/* -- Helpers ---------------------------------------------------------------------------- */
static char ERR[512];

#define A_OK(call) do { ERR[0] = 0; em_status st_ = (call); \
    if (!CHECK(st_ == EM_OK, "status %d: %s", (int)st_, ERR)) return; } while (0)

static emk_alloc *open_alloc(fake *f, const emk_alloc_config *extra) {
  emk_alloc_config cfg;
  memset(&cfg, 0, sizeof cfg);
  if (extra) cfg = *extra;
  cfg.host_alloc = fk_host_alloc;
  cfg.host_ud = f;
  emk_alloc *a = NULL;
  em_status st = emk_alloc_new(&f->rt, &cfg, &a, ERR, sizeof ERR);
  CHECK(st == EM_OK && a, "emk_alloc_new: %d %s", (int)st, ERR);
  return a;
}

static emk_alloc_stats stats(emk_alloc *a, int dev) {
  emk_alloc_stats s;
  memset(&s, 0, sizeof s);
  emk_alloc_stats_get(a, dev, &s);
  return s;
}

static void *get(emk_alloc *a, int dev, size_t n, emk_stream *s) {
  void *p = NULL;
  em_status st = emk_alloc_malloc(a, dev, n, s, &p, ERR, sizeof ERR);
  CHECK(st == EM_OK && p, "malloc %zu: status %d: %s", n, (int)st, ERR);
  return p;
}

static void put(emk_alloc *a, void *p) {
  em_status st = emk_alloc_release(a, p, ERR, sizeof ERR);
  CHECK(st == EM_OK, "release: status %d: %s", (int)st, ERR);
}

/* Closing leaves nothing behind: no live runtime block, event or host record. */
static void close_clean(fake *f, emk_alloc *a, int64_t want_live) {
  int64_t live = emk_alloc_close(a);
  CHECK(live == want_live, "close found %lld live blocks, want %lld", (long long)live,
        (long long)want_live);
  CHECK(f->nblocks == 0, "%d runtime blocks leaked", f->nblocks);
  CHECK(f->live_events == 0, "%ld events leaked", f->live_events);
  CHECK(f->host_live_blocks == 0 && f->host_live_bytes == 0,
        "%ld host blocks (%lld bytes) leaked", f->host_live_blocks,
        (long long)f->host_live_bytes);
  CHECK(f->bad_frees == 0 && f->host_bad_sizes == 0, "bad frees %ld, bad sizes %ld",
        f->bad_frees, f->host_bad_sizes);
}

/* -- Rounding, bins, best fit ------------------------------------------------------------ */
static void test_rounding(void) {
  CHECK(emk_alloc_round(1) == 512);
  CHECK(emk_alloc_round(512) == 512);
  CHECK(emk_alloc_round(513) == 1024);
  CHECK(emk_alloc_round(SIZE_MAX) == 0);
  CHECK(emk_alloc_segment_size(1) == 2 * MiB);
  CHECK(emk_alloc_segment_size(MiB) == 2 * MiB);
  CHECK(emk_alloc_segment_size(MiB + 1) == 20 * MiB);
  CHECK(emk_alloc_segment_size(10 * MiB - 512) == 20 * MiB);
  CHECK(emk_alloc_segment_size(10 * MiB) == 10 * MiB);
  CHECK(emk_alloc_segment_size(10 * MiB + 1) == 12 * MiB);
  CHECK(emk_alloc_segment_size(SIZE_MAX - 4096) == 0);

  emk_alloc *a = NULL;
  emk_runtime bare = {0};
  CHECK(emk_alloc_new(&bare, NULL, &a, ERR, sizeof ERR) == EM_ERR_ARG && !a);
  CHECK(emk_alloc_new(NULL, NULL, &a, ERR, sizeof ERR) == EM_ERR_ARG && !a);

  fake f;
  fk_init(&f, 1, 4 * GiB);
  a = open_alloc(&f, NULL);
  if (!a) return;
  emk_stream *s = fk_stream();
  void *p = get(a, 0, 1, s);
  CHECK(emk_alloc_block_size(a, p) == 512);
  CHECK((uintptr_t)p % 512 == 0);
  emk_alloc_stats t = stats(a, 0);
  CHECK(t.allocated == 512 && t.requested == 1 && t.reserved == 2 * MiB, "%zu %zu %zu",
        t.allocated, t.requested, t.reserved);
  /* a mid-size request takes a 20 MiB segment and splits it; the next one of the
  ** large pool is served from the rest */
  void *q = get(a, 0, 3 * MiB, s);
  CHECK(emk_alloc_block_size(a, q) == 3 * MiB);
  void *r = get(a, 0, 1536 * KiB, s);
  CHECK((char *)r == (char *)q + 3 * MiB, "the rest of q's segment");
  t = stats(a, 0);
  CHECK(t.reserved == 22 * MiB && t.segments == 2 && t.cache_hits == 1,
        "reserved %zu segments %lld hits %lld", t.reserved, (long long)t.segments,
        (long long)t.cache_hits);
  /* a large block keeps a rest of <= 1 MiB: 20 - 3 - 1.5 = 15.5 MiB left; asking
  ** 15 MiB leaves 0.5 MiB, not worth a block */
  void *u = get(a, 0, 15 * MiB, s);
  CHECK(emk_alloc_block_size(a, u) == 15 * MiB + 512 * KiB, "%zu",
        emk_alloc_block_size(a, u));
  /* zero bytes: NULL, nothing counted; bad device; sizes beyond reason */
  void *z = (void *)1;
  CHECK(emk_alloc_malloc(a, 0, 0, s, &z, ERR, sizeof ERR) == EM_OK && z == NULL);
  CHECK(emk_alloc_malloc(a, 1, 16, s, &z, ERR, sizeof ERR) == EM_ERR_DEVICE &&
        chk_msg_has(ERR, "cuda:1", "no such device", (char *)NULL), "%s", ERR);
  CHECK(emk_alloc_malloc(a, 0, SIZE_MAX - 100, s, &z, ERR, sizeof ERR) == EM_ERR_NOMEM &&
        chk_msg_has(ERR, "cuda:0", "out of memory", (char *)NULL), "%s", ERR);
  CHECK(stats(a, 0).num_allocs == 4);
  put(a, p); put(a, q); put(a, r); put(a, u);
  /* unknown and twice-released pointers */
  CHECK(emk_alloc_release(a, p, ERR, sizeof ERR) == EM_ERR_ARG &&
        chk_msg_has(ERR, "released twice", (char *)NULL), "%s", ERR);
  CHECK(emk_alloc_release(a, (char *)p + 512, ERR, sizeof ERR) == EM_ERR_ARG);
  CHECK(emk_alloc_release(a, NULL, ERR, sizeof ERR) == EM_OK);
  CHECK(emk_alloc_block_size(a, p) == 0);
  close_clean(&f, a, 0);
  free(s);
  fk_done(&f);
}

static void test_best_fit(void) {
  fake f;
  fk_init(&f, 1, 4 * GiB);
  emk_alloc *a = open_alloc(&f, NULL);
  if (!a) return;
  emk_stream *s = fk_stream();
  /* holes of 4K, 16K, 8K, 33K and 34.5K (the last two share a bin) separated by
  ** live 512-byte blocks, all in one small segment */
  size_t sz[] = {4 * KiB, 16 * KiB, 8 * KiB, 33 * KiB, 34 * KiB + 512};
  void *hole[5], *sep[5];
  for (int i = 0; i < 5; i++) {
    hole[i] = get(a, 0, sz[i], s);
    sep[i] = get(a, 0, 512, s);
  }
  for (int i = 0; i < 5; i++) put(a, hole[i]);
  emk_alloc_stats t = stats(a, 0);
  CHECK(t.segments == 1 && t.free_blocks == 6, "segments %lld free blocks %lld",
        (long long)t.segments, (long long)t.free_blocks);
  CHECK(get(a, 0, 6 * KiB, s) == hole[2], "6K takes the 8K hole");
  CHECK(get(a, 0, 3 * KiB, s) == hole[0], "3K takes the 4K hole");
  CHECK(get(a, 0, 33 * KiB + 512, s) == hole[4], "33.5K takes 34.5K, same bin");
  CHECK(get(a, 0, 33 * KiB, s) == hole[3], "33K takes 33K exactly");
  CHECK(get(a, 0, 10 * KiB, s) == hole[1], "10K takes the 16K hole");
  t = stats(a, 0);
  CHECK(t.segments == 1 && t.segment_allocs == 1);
  /* the splits left holes of 2K, 1K, 0.5K (none of 33K) and 6K */
  CHECK(t.free_blocks == 5, "free blocks %lld", (long long)t.free_blocks);
  CHECK(get(a, 0, 2 * KiB, s) == (char *)hole[2] + 6 * KiB);
  emk_alloc_close(a);
  CHECK(f.nblocks == 0 && f.host_live_blocks == 0);
  (void)sep;
  free(s);
  fk_done(&f);
}

/* -- Splitting and merging: fragmentation ------------------------------------------------- */
static void test_fragmentation(void) {
  fake f;
  fk_init(&f, 1, 4 * GiB);
  emk_alloc *a = open_alloc(&f, NULL);
  if (!a) return;
  emk_stream *s = fk_stream();
  enum { N = 64 };
  void *p[N], *q[N / 2];
  for (int i = 0; i < N; i++) p[i] = get(a, 0, 16 * KiB, s);
  emk_alloc_stats t = stats(a, 0);
  CHECK(t.reserved == 2 * MiB && t.segments == 1);
  for (int i = 0; i < N; i++) CHECK(p[i] == (char *)p[0] + i * 16 * KiB);
  for (int i = 1; i < N; i += 2) put(a, p[i]);
  /* 12K requests fit the 16K holes: the reserve doesn't grow */
  int in_hole = 0;
  for (int i = 0; i < N / 2; i++) {
    q[i] = get(a, 0, 12 * KiB, s);
    for (int j = 1; j < N; j += 2) in_hole += q[i] == p[j];
  }
  t = stats(a, 0);
  CHECK(in_hole == N / 2, "%d of %d requests went into holes", in_hole, N / 2);
  CHECK(t.reserved == 2 * MiB && t.segment_allocs == 1, "reserved %zu", t.reserved);
  CHECK(t.allocated == N / 2 * 16 * KiB + N / 2 * 12 * KiB);
  /* free everything: the segment is one block again */
  for (int i = 0; i < N; i += 2) put(a, p[i]);
  for (int i = 0; i < N / 2; i++) put(a, q[i]);
  t = stats(a, 0);
  CHECK(t.segments == 1 && t.free_blocks == 1 && t.active_blocks == 0 && t.allocated == 0,
        "segments %lld free blocks %lld", (long long)t.segments, (long long)t.free_blocks);
  /* so a 2 MiB-sized small request... no: 1 MiB, the largest small one, fits */
  void *big = get(a, 0, MiB, s);
  CHECK(big == p[0] && stats(a, 0).segment_allocs == 1);
  put(a, big);

  /* the large pool: a 3 MiB hole between live blocks takes 2.5 MiB whole (the
  ** rest of 0.5 MiB is not worth a block), not the 8 MiB tail */
  void *L[4];
  for (int i = 0; i < 4; i++) L[i] = get(a, 0, 3 * MiB, s);
  CHECK(stats(a, 0).segments == 2);
  put(a, L[1]);
  void *m = get(a, 0, 2 * MiB + 512 * KiB, s);
  CHECK(m == L[1] && emk_alloc_block_size(a, m) == 3 * MiB);
  put(a, m);
  for (int i = 0; i < 4; i++) if (i != 1) put(a, L[i]);
  t = stats(a, 0);
  CHECK(t.segments == 2 && t.free_blocks == 2, "%lld %lld", (long long)t.segments,
        (long long)t.free_blocks);
  A_OK(emk_alloc_empty_cache(a, 0, ERR, sizeof ERR));
  t = stats(a, 0);
  CHECK(t.reserved == 0 && t.segments == 0 && t.segment_frees == 2 && f.nblocks == 0);
  close_clean(&f, a, 0);
  free(s);
  fk_done(&f);
}

/* -- Streams and events ------------------------------------------------------------------- */
static void test_stream_reuse(void) {
  fake f;
  fk_init(&f, 1, 4 * GiB);
  emk_alloc *a = open_alloc(&f, NULL);
  if (!a) return;
  emk_stream *s1 = fk_stream(), *s2 = fk_stream();
  void *p = get(a, 0, 4 * KiB, s1);
  put(a, p);
  void *q = get(a, 0, 4 * KiB, s2);
  CHECK(q != p, "a block freed on s1 is not reused on s2");
  CHECK(stats(a, 0).segments == 2);
  void *r = get(a, 0, 4 * KiB, s1);
  CHECK(r == p, "... but is on s1");
  CHECK(stats(a, 0).cache_hits == 1);
  /* the NULL (default) stream is a stream of its own */
  void *n = get(a, 0, 4 * KiB, NULL);
  CHECK(n != p && n != q);
  put(a, n);
  CHECK(get(a, 0, 4 * KiB, NULL) == n);
  close_clean(&f, a, 3);
  free(s1); free(s2);
  fk_done(&f);
}

static void test_cross_stream_events(void) {
  fake f;
  fk_init(&f, 1, 4 * GiB);
  emk_alloc *a = open_alloc(&f, NULL);
  if (!a) return;
  emk_stream *s1 = fk_stream(), *s2 = fk_stream(), *s3 = fk_stream();
  void *p = get(a, 0, 4 * KiB, s1);
  A_OK(emk_alloc_record_stream(a, p, s1, ERR, sizeof ERR));   /* its own: nothing */
  A_OK(emk_alloc_record_stream(a, p, s2, ERR, sizeof ERR));
  A_OK(emk_alloc_record_stream(a, p, s2, ERR, sizeof ERR));   /* twice: one event */
  fk_work(&f, s2);                     /* a kernel on s2 reads p */
  put(a, p);
  emk_alloc_stats t = stats(a, 0);
  CHECK(t.pending_blocks == 1 && t.pending == 4 * KiB && t.allocated == 0);
  CHECK(f.live_events == 1, "%ld events", f.live_events);
  void *q = get(a, 0, 4 * KiB, s1);
  CHECK(q != p, "not reused while s2's work is queued");
  put(a, q);
  fk_complete(&f, s2);
  void *r = get(a, 0, 4 * KiB, s1);
  CHECK(r == p, "reused once the event is done");
  t = stats(a, 0);
  CHECK(t.pending_blocks == 0 && t.pending == 0);

  /* two streams: reused only when both are done; the event is recycled */
  A_OK(emk_alloc_record_stream(a, r, s2, ERR, sizeof ERR));
  A_OK(emk_alloc_record_stream(a, r, s3, ERR, sizeof ERR));
  fk_work(&f, s2); fk_work(&f, s3);
  put(a, r);
  CHECK(f.live_events == 2, "one new event, one recycled: %ld", f.live_events);
  fk_complete(&f, s2);
  void *x = get(a, 0, 4 * KiB, s1);
  CHECK(x != p, "s3 still uses it");
  put(a, x);
  fk_complete(&f, s3);
  x = get(a, 0, 4 * KiB, s1);
  CHECK(x == p);

  /* no event to be had: release waits for the stream instead */
  A_OK(emk_alloc_empty_cache(a, 0, ERR, sizeof ERR));    /* drops the cached events */
  CHECK(f.live_events == 0, "%ld events", f.live_events);
  A_OK(emk_alloc_record_stream(a, x, s2, ERR, sizeof ERR));
  fk_work(&f, s2);
  f.fail_event_create = 1;
  put(a, x);
  f.fail_event_create = 0;
  t = stats(a, 0);
  CHECK(t.stream_syncs == 1 && t.pending_blocks == 0 && s2->completed == s2->queued);
  CHECK(get(a, 0, 4 * KiB, s1) == p);

  /* an error of s2's earlier work surfaces at the record: reported, yet released */
  A_OK(emk_alloc_record_stream(a, p, s2, ERR, sizeof ERR));
  fk_work(&f, s2);
  f.fail_event_record = 1;
  ERR[0] = 0;
  CHECK(emk_alloc_release(a, p, ERR, sizeof ERR) == EM_ERR_INTERNAL &&
        chk_msg_has(ERR, "cuda:0", "an earlier kernel", (char *)NULL), "%s", ERR);
  f.fail_event_record = 0;
  t = stats(a, 0);
  CHECK(t.active_blocks == 0 && t.pending_blocks == 0 && t.num_frees == t.num_allocs);
  CHECK(get(a, 0, 4 * KiB, s1) == p);
  put(a, p);
  /* record_stream on what isn't handed out */
  CHECK(emk_alloc_record_stream(a, p, s2, ERR, sizeof ERR) == EM_ERR_ARG);
  close_clean(&f, a, 0);
  free(s1); free(s2); free(s3);
  fk_done(&f);
}

/* -- Empty cache, stats, pressure ------------------------------------------------------------ */
static void test_empty_cache(void) {
  fake f;
  fk_init(&f, 2, 4 * GiB);
  emk_alloc *a = open_alloc(&f, NULL);
  if (!a) return;
  emk_stream *s1 = fk_stream(), *s2 = fk_stream();
  void *p = get(a, 0, 100, s1), *q = get(a, 0, 12 * MiB, s1), *r = get(a, 1, 100, s1);
  A_OK(emk_alloc_record_stream(a, p, s2, ERR, sizeof ERR));
  fk_work(&f, s2);
  put(a, p); put(a, q); put(a, r);
  A_OK(emk_alloc_empty_cache(a, 0, ERR, sizeof ERR));
  emk_alloc_stats t = stats(a, 0);
  CHECK(t.reserved == 2 * MiB && t.pending_blocks == 1, "the pending block's segment stays");
  CHECK(stats(a, 1).reserved == 2 * MiB, "device 1 untouched");
  fk_complete(&f, s2);
  A_OK(emk_alloc_empty_cache(a, -1, ERR, sizeof ERR));
  CHECK(stats(a, 0).reserved == 0 && stats(a, 1).reserved == 0 && f.nblocks == 0);
  CHECK(emk_alloc_empty_cache(a, 2, ERR, sizeof ERR) == EM_ERR_DEVICE);
  close_clean(&f, a, 0);
  free(s1); free(s2);
  fk_done(&f);
}

static void test_stats(void) {
  fake f;
  fk_init(&f, 1, 4 * GiB);
  emk_alloc *a = open_alloc(&f, NULL);
  if (!a) return;
  emk_stream *s = fk_stream();
  void *p = get(a, 0, 1000, s);          /* 1024 of a new 2 MiB segment */
  void *q = get(a, 0, 3000, s);          /* 3072, a hit */
  /* 11 MiB of a new 12 MiB segment: the 1 MiB rest is not worth a block, so r's
  ** block is the whole 12 MiB */
  void *r = get(a, 0, 11 * MiB, s);
  put(a, q);                             /* q's 3072 merge with the segment's tail */
  void *u = get(a, 0, 2048, s);          /* 2048, a hit in q's place */
  CHECK(u == q);
  emk_alloc_stats t = stats(a, 0);
  CHECK(t.capacity == 4 * GiB);
  CHECK(t.allocated == 1024 + 12 * MiB + 2048, "allocated %zu", t.allocated);
  CHECK(t.requested == 1000 + 11 * MiB + 2048, "requested %zu", t.requested);
  CHECK(t.reserved == 14 * MiB && t.peak_reserved == 14 * MiB);
  CHECK(t.peak_allocated == 1024 + 3072 + 12 * MiB, "peak %zu", t.peak_allocated);
  CHECK(t.num_allocs == 4 && t.num_frees == 1 && t.cache_hits == 2);
  CHECK(t.segment_allocs == 2 && t.segment_frees == 0 && t.segments == 2);
  CHECK(t.active_blocks == 3 && t.oom_retries == 0 && t.ooms == 0);
  /* one free block: the small segment's tail after u */
  CHECK(t.free_blocks == 1, "free blocks %lld", (long long)t.free_blocks);
  CHECK(emk_alloc_block_size(a, r) == 12 * MiB);
  put(a, r);
  emk_alloc_reset_peak(a, 0);
  t = stats(a, 0);
  CHECK(t.peak_allocated == 1024 + 2048 && t.allocated == 1024 + 2048);
  put(a, p); put(a, u);
  t = stats(a, 0);
  CHECK(t.allocated == 0 && t.requested == 0 && t.num_frees == 4 && t.free_blocks == 2);
  CHECK(emk_alloc_stats_get(a, 3, &t) == EM_ERR_DEVICE);
  close_clean(&f, a, 0);
  free(s);
  fk_done(&f);
}

typedef struct hooks {
  emk_alloc *a;
  void *victim;          /* released by the OOM hook */
  int oom_calls, pressure_calls, dev;
  size_t nbytes, allocated, capacity;
} hooks;

static void on_pressure(void *ud, int dev, size_t allocated, size_t capacity) {
  hooks *h = ud;
  h->pressure_calls++;
  h->dev = dev;
  h->allocated = allocated;
  h->capacity = capacity;
}

static void on_oom(void *ud, int dev, size_t nbytes) {
  hooks *h = ud;
  h->oom_calls++;
  h->dev = dev;
  h->nbytes = nbytes;
  if (h->victim) {       /* "collecting garbage" releases a tensor */
    emk_alloc_release(h->a, h->victim, NULL, 0);
    h->victim = NULL;
  }
}

static void test_pressure(void) {
  fake f;
  fk_init(&f, 1, 10 * MiB);
  hooks h = {0};
  emk_alloc_config cfg = {.pressure_hook = on_pressure, .hook_ud = &h,
                          .pressure_fraction = 0.5};
  emk_alloc *a = open_alloc(&f, &cfg);
  if (!a) return;
  emk_stream *s = fk_stream();
  void *p = get(a, 0, 4 * MiB, s);   /* a 4 MiB segment: 20 MiB don't fit */
  CHECK(h.pressure_calls == 0 && stats(a, 0).reserved == 4 * MiB);
  void *q = get(a, 0, MiB, s);       /* 5 MiB allocated: crosses 50 % */
  CHECK(h.pressure_calls == 1 && h.dev == 0 && h.allocated == 5 * MiB &&
        h.capacity == 10 * MiB, "calls %d allocated %zu", h.pressure_calls, h.allocated);
  void *r = get(a, 0, 512 * KiB, s);
  CHECK(h.pressure_calls == 1, "called once per crossing");
  put(a, r);
  put(a, q);                         /* 4 MiB: below 90 % of the threshold: armed */
  q = get(a, 0, MiB, s);
  CHECK(h.pressure_calls == 2 && stats(a, 0).pressure_hook_calls == 2);
  put(a, p); put(a, q);
  close_clean(&f, a, 0);
  free(s);
  fk_done(&f);
}

/* -- Out of memory ---------------------------------------------------------------------------- */
static void test_oom_frees_cache(void) {
  fake f;
  fk_init(&f, 1, 6 * MiB);
  emk_alloc *a = open_alloc(&f, NULL);
  if (!a) return;
  emk_stream *s1 = fk_stream(), *s2 = fk_stream();
  /* 4 MiB cached in two small segments of two streams */
  put(a, get(a, 0, 4 * KiB, s1));
  put(a, get(a, 0, 4 * KiB, s2));
  CHECK(stats(a, 0).reserved == 4 * MiB);
  void *p = get(a, 0, 4 * MiB, s1);
  emk_alloc_stats t = stats(a, 0);
  CHECK(p && t.oom_retries == 1 && t.ooms == 0 && t.reserved == 4 * MiB && t.segments == 1,
        "retries %lld reserved %zu", (long long)t.oom_retries, t.reserved);
  CHECK(t.segment_frees == 2);
  put(a, p);
  close_clean(&f, a, 0);
  free(s1); free(s2);
  fk_done(&f);
}

static void test_oom_hook(void) {
  fake f;
  fk_init(&f, 1, 6 * MiB);
  hooks h = {0};
  emk_alloc_config cfg = {.oom_hook = on_oom, .hook_ud = &h};
  emk_alloc *a = open_alloc(&f, &cfg);
  if (!a) return;
  h.a = a;
  emk_stream *s1 = fk_stream(), *s2 = fk_stream();
  /* a garbage tensor holds 4 MiB on s2; the hook releases it */
  h.victim = get(a, 0, 4 * MiB, s2);
  void *p = get(a, 0, 4 * MiB, s1);
  emk_alloc_stats t = stats(a, 0);
  CHECK(p && h.oom_calls == 1 && h.dev == 0 && h.nbytes == 4 * MiB, "hook calls %d",
        h.oom_calls);
  CHECK(t.oom_hook_calls == 1 && t.oom_retries == 2 && t.ooms == 0 && t.segments == 1);
  /* same stream: the hook's release is reused straight from the bins */
  h.victim = p;
  void *q = get(a, 0, 4 * MiB, s1);
  CHECK(q == p && h.oom_calls == 2 && stats(a, 0).cache_hits == 1);
  /* the hook can't help: EM_ERR_NOMEM, and the allocator still works */
  void *x = NULL;
  CHECK(emk_alloc_malloc(a, 0, 4 * MiB, s1, &x, ERR, sizeof ERR) == EM_ERR_NOMEM && !x);
  CHECK(h.oom_calls == 3 && stats(a, 0).ooms == 1);
  put(a, q);
  x = get(a, 0, 4 * MiB, s1);
  CHECK(x == q);
  put(a, x);
  close_clean(&f, a, 0);
  free(s1); free(s2);
  fk_done(&f);
}

static void test_oom_message(void) {
  fake f;
  fk_init(&f, 2, 2 * GiB);
  emk_alloc *a = open_alloc(&f, NULL);
  if (!a) return;
  emk_stream *s = fk_stream();
  void *big = get(a, 1, 1280 * MiB, s);   /* 1.25 GiB */
  void *mid = get(a, 1, 2 * MiB, s);      /* of a 20 MiB segment: 18 MiB cached */
  put(a, get(a, 1, 100, s));              /* a whole free small segment: given back */
  void *x = NULL;
  em_status st = emk_alloc_malloc(a, 1, GiB, s, &x, ERR, sizeof ERR);
  CHECK(st == EM_ERR_NOMEM && x == NULL);
  CHECK(strcmp(ERR, "cuda:1: out of memory allocating 1.00 GiB (1.25 GiB allocated by "
               "tensors, 18.00 MiB cached, 1.27 GiB reserved, 2.00 GiB capacity)") == 0,
        "message: %s", ERR);
  emk_alloc_stats t = stats(a, 1);
  CHECK(t.ooms == 1 && t.oom_retries == 1 && t.segments == 2);
  /* usable afterwards: freeing the big block makes room (1 GiB of its 1.25
  ** GiB, split) */
  put(a, big);
  void *y = get(a, 1, GiB, s);
  t = stats(a, 1);
  CHECK(y == big && t.oom_retries == 1 && t.cache_hits == 1 && t.free_blocks == 2);
  put(a, y); put(a, mid);
  close_clean(&f, a, 0);
  free(s);
  fk_done(&f);
}

/* -- Failure injection at every point ------------------------------------------------------------ */
/* One fixed sequence that crosses every failure point: opening, records for
** new streams, segments, splits, the pointer table growing, stream records,
** events, the OOM path, empty_cache. Errors are allowed (EM_ERR_NOMEM, or the
** stream error an injected event_record stands for) but must leave everything
** consistent; whatever succeeded is released at the end. */
enum { SCRIPT_PTRS = 600 };
static int bad_line;
#define BAD() ((*bad)++, bad_line = bad_line ? bad_line : __LINE__)
static int run_script(fake *f, long k, int *bad) {
  fk_init(f, 2, 64 * MiB);
  f->fail_at = k;
  emk_alloc *a = NULL;
  emk_alloc_config cfg = {.host_alloc = fk_host_alloc, .host_ud = f};
  em_status st = emk_alloc_new(&f->rt, &cfg, &a, ERR, sizeof ERR);
  if (st != EM_OK) {
    if (st != EM_ERR_NOMEM || a || !chk_msg_has(ERR, "out of host memory", (char *)NULL))
      BAD();
    if (f->host_live_blocks || f->nblocks) BAD();
    return f->injected;
  }
  emk_stream *s1 = fk_stream(), *s2 = fk_stream(), *s3 = fk_stream();
  void *p[SCRIPT_PTRS] = {0};
  int n = 0;
  static const size_t sizes[] = {100, 4096, 40000, 200 * KiB, 700 * KiB, 20000, 1,
                                 1500 * KiB};
  emk_stream *streams[] = {s1, s2, NULL};
  /* many blocks: the pointer table grows (256 chains at first) */
  for (int i = 0; i < 300; i++) {
    void *q = NULL;
    st = emk_alloc_malloc(a, i % 2, sizes[i % 8], streams[i % 3], &q, ERR, sizeof ERR);
    if (st == EM_OK) p[n++] = q;
    else if (st != EM_ERR_NOMEM) BAD();
  }
  /* cross-stream use, with work outstanding */
  for (int i = 0; i < n; i += 7) {
    st = emk_alloc_record_stream(a, p[i], i % 2 ? s3 : s2, ERR, sizeof ERR);
    if (st != EM_OK && st != EM_ERR_NOMEM) BAD();
  }
  fk_work(f, s2); fk_work(f, s3);
  for (int i = 0; i < n; i += 2) {
    st = emk_alloc_release(a, p[i], ERR, sizeof ERR);
    if (st != EM_OK && st != EM_ERR_INTERNAL) BAD();     /* a failed record */
    p[i] = NULL;
  }
  fk_complete(f, s2);
  /* large blocks: splits of the 20 MiB segments, then the OOM path */
  for (int i = 0; i < 6; i++) {
    void *q = NULL;
    st = emk_alloc_malloc(a, 0, (size_t)(i + 2) * MiB, streams[i % 3], &q, ERR, sizeof ERR);
    if (st == EM_OK) p[n++] = q;
    else if (st != EM_ERR_NOMEM) BAD();
  }
  void *huge = NULL;
  st = emk_alloc_malloc(a, 0, 40 * MiB, s1, &huge, ERR, sizeof ERR);
  if (st == EM_OK) p[n++] = huge;
  else if (st != EM_ERR_NOMEM) BAD();
  st = emk_alloc_empty_cache(a, -1, ERR, sizeof ERR);
  if (st != EM_OK) BAD();
  fk_complete(f, s3);
  int injected = f->injected;
  /* still working: release everything, then one more of each kind */
  f->fail_at = 0;
  for (int i = 0; i < n; i++)
    if (p[i] && emk_alloc_release(a, p[i], ERR, sizeof ERR) != EM_OK) BAD();
  void *q = NULL, *r = NULL;
  if (emk_alloc_malloc(a, 0, 5000, s1, &q, ERR, sizeof ERR) != EM_OK) BAD();
  if (emk_alloc_malloc(a, 1, 40 * MiB, s2, &r, ERR, sizeof ERR) != EM_OK) BAD();
  if (emk_alloc_record_stream(a, q, s2, ERR, sizeof ERR) != EM_OK) BAD();
  if (emk_alloc_release(a, q, ERR, sizeof ERR) != EM_OK) BAD();
  if (emk_alloc_release(a, r, ERR, sizeof ERR) != EM_OK) BAD();
  emk_alloc_stats t0 = stats(a, 0), t1 = stats(a, 1);
  if (t0.reserved != f->used[0] || t1.reserved != f->used[1]) BAD();
  if (t0.allocated || t1.allocated || t0.active_blocks || t1.active_blocks ||
      t0.num_allocs != t0.num_frees || t1.num_allocs != t1.num_frees)
    BAD();
  if (emk_alloc_close(a) != 0) BAD();
  if (f->nblocks || f->live_events || f->host_live_blocks || f->host_live_bytes ||
      f->bad_frees || f->host_bad_sizes)
    BAD();
  free(s1); free(s2); free(s3);
  return injected;
}

static void test_failure_injection(void) {
  long k;
  int bad_runs = 0, kinds[FK_KINDS] = {0};
  for (k = 1; k < 20000; k++) {
    fake f;
    int bad = 0;
    bad_line = 0;
    int injected = run_script(&f, k, &bad);
    if (bad) {
      if (bad_runs++ < 5)
        CHECK(0, "failure at call %ld: %d problems, the first at line %d (leaks %d "
              "runtime blocks, %ld events, %ld host blocks)", k, bad, bad_line, f.nblocks,
              f.live_events, f.host_live_blocks);
    }
    fk_done(&f);
    if (!injected) break;
    kinds[injected]++;
  }
  CHECK(kinds[FK_HOST] && kinds[FK_MALLOC] && kinds[FK_EVENT_CREATE] && kinds[FK_EVENT_RECORD],
        "failures injected: %d host, %d malloc, %d event_create, %d event_record",
        kinds[FK_HOST], kinds[FK_MALLOC], kinds[FK_EVENT_CREATE], kinds[FK_EVENT_RECORD]);
  CHECK(bad_runs == 0, "%d runs with problems", bad_runs);
  CHECK(k > 50 && k < 20000, "the script ran clean at k = %ld", k);
  printf("  (%ld failure points walked: %d host allocations, %d runtime mallocs, "
         "%d event_create, %d event_record)\n", k - 1, kinds[FK_HOST], kinds[FK_MALLOC],
         kinds[FK_EVENT_CREATE], kinds[FK_EVENT_RECORD]);
}

/* -- Threads ----------------------------------------------------------------------------------- */
typedef struct hammer {
  fake *f;
  emk_alloc *a;
  emk_stream *own, *shared;
  unsigned seed;
  int tight;             /* a small device: EM_ERR_NOMEM is allowed */
  int errors, ooms;
} hammer;

static void *hammer_run(void *arg) {
  hammer *h = arg;
  enum { SLOTS = 32 };
  void *p[SLOTS] = {0};
  unsigned x = h->seed;
  for (int it = 0; it < 20000; it++) {
    x = x * 1103515245u + 12345u;
    int i = (int)(x >> 8) % SLOTS;
    if (p[i]) {
      if ((x >> 20) % 4 == 0 &&
          emk_alloc_record_stream(h->a, p[i], h->shared, NULL, 0) != EM_OK)
        h->errors++;
      if (emk_alloc_release(h->a, p[i], NULL, 0) != EM_OK) h->errors++;
      p[i] = NULL;
    } else {
      size_t n = (x >> 16) % 3 == 0 ? ((x >> 4) % 24 + 1) * 256 * KiB : (x >> 4) % 65536 + 1;
      em_status st = emk_alloc_malloc(h->a, 0, n, (x >> 24) % 5 ? h->own : h->shared, &p[i],
                                      NULL, 0);
      if (st == EM_ERR_NOMEM && h->tight) h->ooms++;
      else if (st != EM_OK) h->errors++;
    }
    if (it % 97 == 0) { fk_work(h->f, h->shared); fk_complete(h->f, h->shared); }
    if (it % 1009 == 0) emk_alloc_empty_cache(h->a, 0, NULL, 0);
    if (it % 101 == 0) { emk_alloc_stats t; emk_alloc_stats_get(h->a, 0, &t); }
  }
  for (int i = 0; i < SLOTS; i++)
    if (p[i] && emk_alloc_release(h->a, p[i], NULL, 0) != EM_OK) h->errors++;
  return NULL;
}

static void oom_count(void *ud, int dev, size_t n) {
  __atomic_add_fetch((int *)ud, 1, __ATOMIC_RELAXED);
}

/* Two threads allocating, recording streams and releasing on one device; then
** the same on a device too small for both (the OOM path, its hook and the cache
** release race with the other thread's allocations). */
static void hammer_pair(size_t capacity, int tight) {
  fake f;
  fk_init(&f, 1, capacity);
  int oom_calls = 0;
  emk_alloc_config cfg = {.oom_hook = oom_count, .hook_ud = &oom_calls};
  emk_alloc *a = open_alloc(&f, &cfg);
  if (!a) return;
  emk_stream *shared = fk_stream();
  hammer h[2];
  pthread_t th[2];
  for (int i = 0; i < 2; i++) {
    h[i] = (hammer){&f, a, fk_stream(), shared, 12345u + 777u * (unsigned)i, tight, 0, 0};
    pthread_create(&th[i], NULL, hammer_run, &h[i]);
  }
  for (int i = 0; i < 2; i++) pthread_join(th[i], NULL);
  CHECK(h[0].errors == 0 && h[1].errors == 0, "%d %d errors", h[0].errors, h[1].errors);
  if (tight) {
    emk_alloc_stats t = stats(a, 0);
    CHECK(h[0].ooms + h[1].ooms > 0 && t.ooms == h[0].ooms + h[1].ooms &&
          t.oom_hook_calls >= t.ooms && oom_calls == t.oom_hook_calls,
          "ooms %d+%d, counted %lld, hook %d", h[0].ooms, h[1].ooms, (long long)t.ooms,
          oom_calls);
  }
  fk_complete(&f, shared);
  A_OK(emk_alloc_empty_cache(a, 0, ERR, sizeof ERR));
  emk_alloc_stats t = stats(a, 0);
  CHECK(t.allocated == 0 && t.active_blocks == 0 && t.num_allocs == t.num_frees &&
        t.num_allocs > 10000, "allocs %lld frees %lld", (long long)t.num_allocs,
        (long long)t.num_frees);
  CHECK(t.reserved == 0 && t.pending_blocks == 0 && t.free_blocks == 0);
  close_clean(&f, a, 0);
  for (int i = 0; i < 2; i++) free(h[i].own);
  free(shared);
  fk_done(&f);
}

static void test_threads(void) {
  hammer_pair(16 * GiB, 0);
  hammer_pair(48 * MiB, 1);
}


/* -- On the emulated runtime -------------------------------------------------------------
** The same allocator over kernels/emu/: real (host) memory behind guard bytes,
** streams as worker threads. Data written through one block reads back intact
** (blocks inside segments are valid device ranges), work on another stream holds
** a block back until it ran, the OOM path frees the cache on a small device, and
** injected runtime failures leak nothing. */
typedef struct gate { pthread_mutex_t mu; pthread_cond_t cv; int open; } gate;

static void gate_wait(void *ud) {            /* a "kernel" on a stream that waits */
  gate *g = ud;
  pthread_mutex_lock(&g->mu);
  while (!g->open) pthread_cond_wait(&g->cv, &g->mu);
  pthread_mutex_unlock(&g->mu);
}
static void gate_open(gate *g) {
  pthread_mutex_lock(&g->mu);
  g->open = 1;
  pthread_cond_broadcast(&g->cv);
  pthread_mutex_unlock(&g->mu);
}

static void test_emulated(void) {
  emk_emu_config cfg = {.devices = 2, .capacity = 64 * MiB};
  emk_runtime *rt = NULL;
  A_OK(emk_emu_open(&cfg, &rt, ERR, sizeof ERR));
  const emk_runtime_ops *o = rt->ops;
  emk_alloc *a = NULL;
  emk_stream *s1 = NULL, *s2 = NULL;
  A_OK(emk_alloc_new(rt, NULL, &a, ERR, sizeof ERR));
  A_OK(o->stream_create(rt, 0, &s1));
  A_OK(o->stream_create(rt, 0, &s2));
  CHECK(stats(a, 0).capacity == 64 * MiB && stats(a, 1).capacity == 64 * MiB);

  /* blocks of one segment hold their own data */
  enum { NB = 6 };
  void *p[NB];
  int host[NB][300], back[NB][300];
  for (int i = 0; i < NB; i++) {
    p[i] = get(a, 0, sizeof host[i], s1);
    for (int j = 0; j < 300; j++) host[i][j] = i * 1000 + j;
    A_OK(o->memcpy_async(rt, p[i], host[i], sizeof host[i], EMK_HOST_TO_DEVICE, s1));
  }
  CHECK(stats(a, 0).segments == 1 && (uintptr_t)p[0] % 256 == 0);
  for (int i = 0; i < NB; i++)
    A_OK(o->memcpy_async(rt, back[i], p[i], sizeof back[i], EMK_DEVICE_TO_HOST, s1));
  A_OK(o->stream_sync(rt, s1));
  CHECK(memcmp(host, back, sizeof host) == 0, "data through split blocks");

  /* s2 uses p[0] and is held up: p[0] isn't reused until s2 ran its work */
  gate g = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0};
  A_OK(emk_alloc_record_stream(a, p[0], s2, ERR, sizeof ERR));
  A_OK(o->host_callback(rt, s2, gate_wait, &g));
  put(a, p[0]);
  void *q = get(a, 0, sizeof host[0], s1);
  CHECK(q != p[0] && stats(a, 0).pending_blocks == 1, "p[0] waits for s2");
  gate_open(&g);
  A_OK(o->stream_sync(rt, s2));
  void *r = get(a, 0, sizeof host[0], s1);
  CHECK(r == p[0] && stats(a, 0).pending_blocks == 0, "p[0] reused after s2's work");
  put(a, q); put(a, r);
  for (int i = 1; i < NB; i++) put(a, p[i]);

  /* out of memory on a 64 MiB device: 40 MiB cached on s1, 30 MiB asked on s2 */
  put(a, get(a, 0, 40 * MiB, s1));
  void *big = get(a, 0, 30 * MiB, s2);
  emk_alloc_stats t = stats(a, 0);
  CHECK(big && t.oom_retries == 1 && t.ooms == 0, "retries %lld", (long long)t.oom_retries);
  void *x = NULL;
  CHECK(emk_alloc_malloc(a, 0, 70 * MiB, s2, &x, ERR, sizeof ERR) == EM_ERR_NOMEM &&
        chk_msg_has(ERR, "cuda:0: out of memory allocating 70.00 MiB", "30.00 MiB allocated",
                    "64.00 MiB capacity", (char *)NULL), "%s", ERR);
  put(a, big);

  /* the runtime refuses the k-th segment: retried from the cache, nothing leaks */
  for (int k = 1; k <= 4; k++) {
    A_OK(emk_alloc_empty_cache(a, -1, ERR, sizeof ERR));
    emk_emu_fail_nth_malloc(rt, k);
    void *v[4] = {0};
    for (int i = 0; i < 4; i++) {
      em_status st = emk_alloc_malloc(a, 1, (size_t)(i + 1) * 3 * MiB, s1, &v[i], ERR,
                                      sizeof ERR);
      CHECK(st == EM_OK, "k=%d, i=%d: %s", k, i, ERR);
    }
    for (int i = 0; i < 4; i++) put(a, v[i]);
    emk_emu_fail_nth_malloc(rt, 0);
  }
  A_OK(emk_alloc_empty_cache(a, -1, ERR, sizeof ERR));
  CHECK(emk_emu_live_blocks(rt, 0) == 0 && emk_emu_live_blocks(rt, 1) == 0);
  char why[512];
  CHECK(emk_emu_check_guards(rt, why, sizeof why) == 0, "%s", why);
  put(a, get(a, 1, 5000, s1));
  CHECK(emk_alloc_close(a) == 0);
  CHECK(emk_emu_live_blocks(rt, 0) == 0 && emk_emu_live_blocks(rt, 1) == 0,
        "close gave every segment back");
  o->stream_destroy(rt, s1);
  o->stream_destroy(rt, s2);
  o->close(rt);
}

int main(void) {
  RUN(test_rounding);
  RUN(test_best_fit);
  RUN(test_fragmentation);
  RUN(test_stream_reuse);
  RUN(test_cross_stream_events);
  RUN(test_empty_cache);
  RUN(test_stats);
  RUN(test_pressure);
  RUN(test_oom_frees_cache);
  RUN(test_oom_hook);
  RUN(test_oom_message);
  RUN(test_failure_injection);
  RUN(test_threads);
  RUN(test_emulated);
  return check_done();
}

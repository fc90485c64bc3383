/*
** test_loader.c -- the loader from C (core/data/loader.c) where Lua can't look:
**  - a pluggable buffer allocator provides every assembled batch, and gets each
**    block back with its size once the batches are released;
**  - a failing state allocator (refusing the Nth request, N = 1, 2, ...) under a
**    pipeline with two worker threads: every run either completes with the
**    unhindered run's values or stops with EM_ERR_NOMEM and a message, and gives
**    every byte back (run under ASan by `make test SANITIZE=1`);
**  - a custom transform that fails on one sample: the consumer gets every item
**    before it, then the error naming the sample, then the epoch is over;
**  - items in order under workers that finish out of order (custom transforms
**    that sleep longer for earlier samples);
**  - starting an epoch part-way (resuming from a checkpoint).
*/
#include "check.h"
#include <pthread.h>
#include <time.h>

/* -- The counting, failing allocator (as test_failalloc.c) ---------------------------- */
typedef struct fa_state {
  pthread_mutex_t mu;
  long count, fail_at;
  int injected;
  int64_t live_bytes;
  long live_blocks, bad_sizes;
} fa_state;

static void *fa_alloc(void *ud, void *ptr, size_t osize, size_t nsize) {
  fa_state *f = ud;
  void *res = NULL;
  pthread_mutex_lock(&f->mu);
  char *h = ptr ? (char *)ptr - 16 : NULL;
  size_t old = h ? *(size_t *)h : 0;
  if (h && old != osize) f->bad_sizes++;
  if (nsize == 0) {
    if (h) { f->live_bytes -= (int64_t)old; f->live_blocks--; free(h); }
  } else if (++f->count == f->fail_at) {
    f->injected = 1;
  } else {
    char *n = realloc(h, nsize + 16);
    if (n) {
      *(size_t *)n = nsize;
      f->live_bytes += (int64_t)nsize - (int64_t)old;
      if (!h) f->live_blocks++;
      res = n + 16;
    }
  }
  pthread_mutex_unlock(&f->mu);
  return res;
}

/* -- A buffer allocator that records what it hands out ---------------------------------- */
typedef struct buf_state {
  pthread_mutex_t mu;
  long allocs, frees, bad;
  int64_t live;
  void *last;
} buf_state;

static void *buf_alloc(void *ud, size_t n) {
  buf_state *b = ud;
  void *p = malloc(n);
  pthread_mutex_lock(&b->mu);
  b->allocs++;
  b->live += (int64_t)n;
  b->last = p;
  pthread_mutex_unlock(&b->mu);
  return p;
}

static void buf_free(void *ud, void *p, size_t n) {
  buf_state *b = ud;
  pthread_mutex_lock(&b->mu);
  b->frees++;
  b->live -= (int64_t)n;
  pthread_mutex_unlock(&b->mu);
  free(p);
}

/* x (20, 2, 3) float32 = arange, y (20) int64 = 1..20: the in-memory source. */
static em_status make_source(em_state *S, em_dataset **ds) {
  em_tensor *a = NULL, *x = NULL, *y = NULL;
  em_status st = em_arange(S, 0, 120, 1, EM_FLOAT32, EM_CPU, &a);
  if (!st) st = em_view(S, a, SHP(20, 2, 3), &x);
  if (!st) st = em_arange(S, 1, 21, 1, EM_INT64, EM_CPU, &y);
  em_tensor *f[2] = {x, y};
  if (!st) st = em_data_tensors(S, f, 2, ds);
  em_tensor_release(a); em_tensor_release(x); em_tensor_release(y);
  return st;
}

static void test_buffer_allocator(em_state *S) {
  buf_state b = {0};
  pthread_mutex_init(&b.mu, NULL);
  em_dataset *src = NULL, *sh = NULL, *bt = NULL;
  em_loader *l = NULL;
  REQUIRE_OK(S, make_source(S, &src));
  REQUIRE_OK(S, em_data_shuffle(S, src, 4, &sh));
  REQUIRE_OK(S, em_data_batch(S, sh, 6, 0, &bt));
  em_loader_config cfg;
  em_loader_config_init(&cfg);
  cfg.workers = 2;
  cfg.buffer_alloc = buf_alloc;
  cfg.buffer_free = buf_free;
  cfg.buffer_ud = &b;
  REQUIRE_OK(S, em_loader_new(S, bt, &cfg, &l));
  REQUIRE_OK(S, em_loader_start(S, l, 1));
  em_tensor *out[EM_DATA_MAX_FIELDS];
  int nf, items = 0;
  em_tensor *keep = NULL;
  double sum = 0;
  while (em_loader_next(S, l, out, &nf) == EM_OK && nf > 0) {
    items++;
    CHECK(nf == 2, "two fields, got %d", nf);
    for (int64_t i = 0; i < em_tensor_numel(out[1]); i++) sum += t_get(out[1], i);
    if (items == 1) { keep = out[0]; em_tensor_retain(keep); }
    em_tensor_release(out[0]); em_tensor_release(out[1]);
  }
  CHECK(items == 4, "4 batches of up to 6 from 20, got %d", items);
  CHECK(sum == 210, "every label once: sum %g, want 210", sum);
  CHECK(b.allocs == 8, "2 fields x 4 batches from the buffer allocator, got %ld", b.allocs);
  CHECK(b.frees == 7, "all but the kept batch given back, got %ld frees", b.frees);
  em_tensor_release(keep);
  CHECK(b.frees == 8 && b.live == 0, "every block back with its size: %ld frees, %lld live",
        b.frees, (long long)b.live);
  em_loader_free(l);
  em_dataset_release(bt); em_dataset_release(sh); em_dataset_release(src);
  /* half-configured allocators are refused */
  em_loader_config bad;
  em_loader_config_init(&bad);
  bad.buffer_alloc = buf_alloc;
  REQUIRE_OK(S, make_source(S, &src));
  CHECK_ERR(S, em_loader_new(S, src, &bad, &l), EM_ERR_ARG, "loader", "buffer_free");
  em_dataset_release(src);
  pthread_mutex_destroy(&b.mu);
}

/* -- Failing allocations ---------------------------------------------------------------- */
typedef struct run_result { em_status st; char msg[512]; double sum; } run_result;

static void run_pipeline(fa_state *f, run_result *r) {
  memset(r, 0, sizeof *r);
  em_config cfg;
  em_config_init(&cfg);
  cfg.alloc = fa_alloc;
  cfg.alloc_ud = f;
  cfg.num_threads = 1;
  em_state *S = NULL;
  em_dataset *src = NULL, *sh = NULL, *mp = NULL, *bt = NULL;
  em_transform *ts[3] = {0}, *comp = NULL;
  em_loader *l = NULL;
  em_status st = em_open(&S, &cfg);
  if (st) { r->st = st; snprintf(r->msg, sizeof r->msg, "em_open: out of memory"); return; }
  static const double mean[1] = {1}, sd[1] = {2};
  if (!st) st = make_source(S, &src);
  if (!st) st = em_data_shuffle(S, src, 7, &sh);
  if (!st) st = em_transform_hflip(S, 0.5, &ts[0]);
  if (!st) st = em_transform_normalize(S, mean, sd, 1, &ts[1]);
  if (!st) st = em_transform_random_crop(S, 2, 2, 1, &ts[2]);
  if (!st) st = em_transform_compose(S, ts, 3, &comp);
  if (!st) st = em_data_map(S, sh, comp, 3, &mp);
  if (!st) st = em_data_batch(S, mp, 3, 0, &bt);
  em_loader_config lc;
  em_loader_config_init(&lc);
  lc.workers = 2;
  if (!st) st = em_loader_new(S, bt, &lc, &l);
  for (int e = 1; e <= 2 && !st; e++) {
    st = em_loader_start(S, l, e);
    em_tensor *out[EM_DATA_MAX_FIELDS];
    int nf = 1;
    while (!st && nf > 0) {
      st = em_loader_next(S, l, out, &nf);
      for (int k = 0; k < nf && !st; k++) {
        for (int64_t i = 0; i < em_tensor_numel(out[k]); i++)
          r->sum += t_get(out[k], i) * (double)(i % 7 + 1) * e;
      }
      for (int k = 0; k < nf; k++) em_tensor_release(out[k]);
    }
  }
  r->st = st;
  if (st) snprintf(r->msg, sizeof r->msg, "%s", em_errmsg(S));
  em_loader_free(l);
  em_dataset_release(bt); em_dataset_release(mp); em_dataset_release(sh);
  em_dataset_release(src);
  for (int k = 0; k < 3; k++) em_transform_release(ts[k]);
  em_transform_release(comp);
  em_close(S);
}

static void test_failing_allocations(void) {
  fa_state f;
  memset(&f, 0, sizeof f);
  pthread_mutex_init(&f.mu, NULL);
  run_result r;
  run_pipeline(&f, &r);
  REQUIRE(r.st == EM_OK, "unhindered run failed: %s", r.msg);
  CHECK(f.live_bytes == 0 && f.live_blocks == 0, "unhindered run leaks %lld bytes",
        (long long)f.live_bytes);
  double want = r.sum;
  long total = f.count, n, bad = 0;
  for (n = 1; n < 4 * total + 100; n++) {
    f.count = 0; f.fail_at = n; f.injected = 0;
    run_pipeline(&f, &r);
    if (!f.injected) {
      CHECK(r.st == EM_OK && r.sum == want, "N=%ld: no refusal, but status %d sum %.17g "
            "(want %.17g)", n, (int)r.st, r.sum, want);
      break;
    }
    int good = (r.st == EM_OK || r.st == EM_ERR_NOMEM) && (r.st == EM_OK ? r.sum == want
                                                              : strstr(r.msg, "memory") != NULL);
    if (!good && bad++ < 5)
      CHECK(0, "N=%ld: status %d, message \"%s\"", n, (int)r.st, r.msg);
    if (f.live_bytes != 0 || f.live_blocks != 0 || f.bad_sizes != 0) {
      if (bad++ < 5)
        CHECK(0, "N=%ld: %lld bytes in %ld blocks left, %ld bad sizes", n,
              (long long)f.live_bytes, f.live_blocks, f.bad_sizes);
    }
  }
  CHECK(bad == 0, "%ld runs went wrong", bad);
  printf("     (%ld allocations in an unhindered run, %ld runs)\n", total, n);
  pthread_mutex_destroy(&f.mu);
}

/* -- Custom transforms: a failing sample, and out-of-order completion ------------------------ */
static int fail_on_7(void *ud, int worker, uint64_t seed, em_tensor **fields, int nfields, char *err,
                     size_t errlen) {
  int64_t label = (int64_t)t_get(fields[1], 0);
  if (label == 7) { snprintf(err, errlen, "sample with label 7 is bad"); return 1; }
  return 0;
}

static int slow_early(void *ud, int worker, uint64_t seed, em_tensor **fields, int nfields, char *err,
                      size_t errlen) {
  int64_t label = (int64_t)t_get(fields[1], 0);
  struct timespec ts = {0, (long)(20 - label) * 300000L};   /* earlier = slower */
  nanosleep(&ts, NULL);
  return 0;
}

static void test_worker_errors_and_order(em_state *S) {
  em_dataset *src = NULL, *mp = NULL, *mp2 = NULL;
  em_transform *bad = NULL, *slow = NULL;
  REQUIRE_OK(S, make_source(S, &src));
  REQUIRE_OK(S, em_transform_custom(S, "fail_on_7", fail_on_7, NULL, NULL, &bad));
  REQUIRE_OK(S, em_data_map(S, src, bad, 1, &mp));
  for (int w = 0; w <= 3; w += 3) {
    em_loader_config cfg;
    em_loader_config_init(&cfg);
    cfg.workers = w;
    em_loader *l = NULL;
    REQUIRE_OK(S, em_loader_new(S, mp, &cfg, &l));
    for (int e = 1; e <= 2; e++) {
      REQUIRE_OK(S, em_loader_start(S, l, e));
      em_tensor *out[EM_DATA_MAX_FIELDS];
      int nf, got = 0;
      em_status st;
      while ((st = em_loader_next(S, l, out, &nf)) == EM_OK && nf > 0) {
        CHECK(t_get(out[1], 0) == got + 1, "item %d in order", got + 1);
        got++;
        for (int k = 0; k < nf; k++) em_tensor_release(out[k]);
      }
      CHECK(got == 6, "workers=%d: the 6 items before the bad one, got %d", w, got);
      CHECK(st != EM_OK && strstr(em_errmsg(S), "label 7"), "the error: %s", em_errmsg(S));
      CHECK(em_loader_next(S, l, out, &nf) == EM_OK && nf == 0, "the epoch is over after it");
    }
    em_loader_free(l);
  }
  REQUIRE_OK(S, em_transform_custom(S, "slow_early", slow_early, NULL, NULL, &slow));
  REQUIRE_OK(S, em_data_map(S, src, slow, 1, &mp2));
  em_loader_config cfg;
  em_loader_config_init(&cfg);
  cfg.workers = 4;
  cfg.prefetch = 8;
  em_loader *l = NULL;
  REQUIRE_OK(S, em_loader_new(S, mp2, &cfg, &l));
  REQUIRE_OK(S, em_loader_start(S, l, 1));
  em_tensor *out[EM_DATA_MAX_FIELDS];
  int nf, got = 0, in_order = 1;
  while (em_loader_next(S, l, out, &nf) == EM_OK && nf > 0) {
    if (t_get(out[1], 0) != ++got) in_order = 0;
    for (int k = 0; k < nf; k++) em_tensor_release(out[k]);
  }
  CHECK(got == 20 && in_order, "20 items in index order (%d)", got);
  em_loader_stats stats;
  em_loader_stats_get(l, &stats);
  CHECK(stats.items == 20 && stats.samples == 20 && stats.total_items == 20,
        "stats: %lld items", (long long)stats.items);
  em_loader_free(l);
  em_dataset_release(mp2); em_dataset_release(mp); em_dataset_release(src);
  em_transform_release(bad); em_transform_release(slow);
}

/* em_loader_start_at: items from `first` on, the count of done items includes the
** skipped ones, and a start past the end is refused. */
static void test_start_at(em_state *S) {
  em_dataset *src = NULL;
  em_loader *l = NULL;
  REQUIRE_OK(S, make_source(S, &src));
  em_loader_config cfg;
  em_loader_config_init(&cfg);
  cfg.workers = 2;
  REQUIRE_OK(S, em_loader_new(S, src, &cfg, &l));
  REQUIRE_OK(S, em_loader_start_at(S, l, 1, 15));
  em_tensor *out[EM_DATA_MAX_FIELDS];
  int nf, got = 0;
  double first = 0;
  while (em_loader_next(S, l, out, &nf) == EM_OK && nf > 0) {
    if (got++ == 0) first = t_get(out[1], 0);
    for (int k = 0; k < nf; k++) em_tensor_release(out[k]);
  }
  CHECK(got == 5 && first == 16, "items 16..20: %d items from label %g", got, first);
  em_loader_stats stats;
  em_loader_stats_get(l, &stats);
  CHECK(stats.items == 20 && stats.samples == 5, "stats %lld items, %lld samples",
        (long long)stats.items, (long long)stats.samples);
  CHECK_ERR(S, em_loader_start_at(S, l, 1, 21), EM_ERR_INDEX, "loader", "21");
  em_loader_free(l);
  em_dataset_release(src);
}

int main(void) {
  em_state *S;
  if (em_open(&S, NULL) != EM_OK) return 1;
  RUN(test_buffer_allocator, S);
  RUN(test_worker_errors_and_order, S);
  RUN(test_start_at, S);
  RUN(test_failing_allocations);
  em_close(S);
  return check_done();
}

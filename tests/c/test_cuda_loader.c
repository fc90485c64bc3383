/*
** test_cuda_loader.c -- the loader feeding a CUDA device (em_loader_to_device,
** kernels/feed.c, the pinned pool in kernels/pinned.c), on the emulated
** runtime (two devices of 64 MB), whose copy stream is a thread of its own:
**   - batches arrive on cuda:0 with the CPU loader's values, in order, for
**     three epochs: pinned (workers or none, copies ahead), pinned with a
**     transform after `batch` (fields the workers copy into pinned buffers),
**     and pageable (staged); pinned batches make no pageable copy at all;
**   - reuse: with the copy stream slowed down (a sleeping host callback queued
**     before every batch) and the consumer running ahead, no batch is
**     corrupted, the pool stops growing at what the pipeline needs and the
**     workers wait for buffers instead;
**   - overlap: once batch i is handed out, batch i+1's copy is queued and runs
**     with no further call, so no batch after the first is handed out before
**     its copy ran; with nothing copied ahead that does not happen;
**   - no pinned block is left after the loader is stopped or freed;
**   - pinned CPU batches (device EM_CPU), errors of to_device, and a worker's
**     error reaching the consumer in order through the feed.
*/
#include "cuda_check.h"
#include "internal.h"
#include "../../kernels/cuda.h"
#include <time.h>
#include <unistd.h>

enum { N = 200, C = 3, W = 8, B = 16, NB = (N + B - 1) / B, EPOCHS = 3 };

static em_dataset *make_ds(em_state *S, int shuffle, em_transform *after_batch) {
  double *xv = malloc(sizeof(double) * N * C * W), yv[N];
  for (int i = 0; i < N; i++) {
    yv[i] = i + 1;
    for (int j = 0; j < C * W; j++) xv[i * C * W + j] = i * 100 + j;
  }
  em_tensor *f[2] = {0};
  em_dataset *d = NULL, *e = NULL;
  em_status st = t_make(S, &f[0], EM_FLOAT32, (int64_t[]){N, C, W}, 3, xv, N * C * W);
  if (!st) st = t_make(S, &f[1], EM_INT64, (int64_t[]){N}, 1, yv, N);
  free(xv);
  if (!st) st = em_data_tensors(S, f, 2, &d);
  em_tensor_release(f[0]);
  em_tensor_release(f[1]);
  if (!st && shuffle) { st = em_data_shuffle(S, d, 7, &e); em_dataset_release(d); d = st ? NULL : e; }
  if (!st) { st = em_data_batch(S, d, B, 0, &e); em_dataset_release(d); d = st ? NULL : e; }
  if (!st && after_batch) {
    st = em_data_map(S, d, after_batch, 1, &e);
    em_dataset_release(d);
    d = st ? NULL : e;
  }
  return st ? NULL : d;
}

static em_loader *make_loader(em_state *S, em_dataset *d, int workers, int prefetch,
                              int device, int pin, int ahead) {
  em_loader_config cfg;
  em_loader_config_init(&cfg);
  cfg.workers = workers;
  cfg.prefetch = prefetch;
  em_loader *l = NULL;
  if (em_loader_new(S, d, &cfg, &l)) return NULL;
  if ((device >= 0 || pin) && em_loader_to_device(S, l, device, pin, ahead)) {
    em_loader_free(l);
    return NULL;
  }
  return l;
}

/* Batch b's values as the CPU computes them: the reference. */
typedef struct ref { double x[NB][B * C * W]; double y[NB][B]; int64_t rows[NB]; } ref;

static int fill_ref(em_state *S, em_dataset *d, int64_t epoch, ref *r) {
  em_loader *l = make_loader(S, d, 0, 0, EM_CPU, 0, 0);
  if (!l || em_loader_start(S, l, epoch)) return 0;
  em_tensor *out[EM_DATA_MAX_FIELDS];
  int nf, b = 0;
  while (!em_loader_next(S, l, out, &nf) && nf) {
    r->rows[b] = em_tensor_sizes(out[0])[0];
    for (int64_t i = 0; i < em_tensor_numel(out[0]); i++) r->x[b][i] = t_get(out[0], i);
    for (int64_t i = 0; i < em_tensor_numel(out[1]); i++) r->y[b][i] = t_get(out[1], i);
    em_tensor_release(out[0]);
    em_tensor_release(out[1]);
    b++;
  }
  em_loader_free(l);
  return b == NB;
}

/* Device batch (x, y) equals reference batch b: read back through em_to. */
static int same_as_ref(em_state *S, em_tensor *x, em_tensor *y, const ref *r, int b) {
  em_tensor *hx = NULL, *hy = NULL;
  int ok = em_tensor_device(x) == 0 && em_tensor_device(y) == 0 &&
           !em_to(S, x, em_tensor_dtype(x), EM_CPU, &hx) &&
           !em_to(S, y, em_tensor_dtype(y), EM_CPU, &hy) &&
           em_tensor_sizes(hx)[0] == r->rows[b] && em_tensor_numel(hy) == r->rows[b];
  for (int64_t i = 0; ok && i < em_tensor_numel(hx); i++) ok = t_get(hx, i) == r->x[b][i];
  for (int64_t i = 0; ok && i < em_tensor_numel(hy); i++) ok = t_get(hy, i) == r->y[b][i];
  em_tensor_release(hx);
  em_tensor_release(hy);
  return ok;
}

static emk_runtime *rt_of(em_state *S) { return emk_ctx(S)->rt; }

static void stats(em_loader *l, em_loader_stats *s) { em_loader_stats_get(l, s); }

/* -- Values, in order, every epoch --------------------------------------------------- */
static void run_values(em_state *S, em_dataset *d, ref *r, int workers, int pin, int ahead,
                       const char *what) {
  em_loader *l = make_loader(S, d, workers, 0, 0, pin, ahead);
  REQUIRE(l, "%s: loader: %s", what, em_errmsg(S));
  size_t pageable0 = emk_emu_pageable_copies(rt_of(S));
  int bad = 0, count = 0;
  for (int e = 1; e <= EPOCHS; e++) {
    REQUIRE(fill_ref(S, d, e, r), "%s: reference epoch %d", what, e);
    REQUIRE_OK(S, em_loader_start(S, l, e));
    em_tensor *out[EM_DATA_MAX_FIELDS];
    int nf, b = 0;
    while (!em_loader_next(S, l, out, &nf) && nf) {
      if (b >= NB || !same_as_ref(S, out[0], out[1], r, b)) bad++;
      em_tensor_release(out[0]);
      em_tensor_release(out[1]);
      b++;
    }
    count += b;
  }
  CHECK(bad == 0 && count == EPOCHS * NB, "%s: %d of %d batches differ (%d arrived)", what,
        bad, EPOCHS * NB, count);
  size_t pageable = emk_emu_pageable_copies(rt_of(S)) - pageable0;
  em_loader_stats s;
  stats(l, &s);
  CHECK(s.copies == EPOCHS * NB && s.copies_done == s.copies, "%s: %lld copies, %lld done",
        what, (long long)s.copies, (long long)s.copies_done);
  CHECK(s.copy_bytes == (int64_t)EPOCHS * N * (C * W * 4 + 8), "%s: %lld bytes", what,
        (long long)s.copy_bytes);
  CHECK(s.copy_s > 0, "%s: copy time %g", what, s.copy_s);
  if (pin) {
    /* the workers assembled every batch in pinned memory: nothing was staged
    ** (the reads back to the host are device-to-host copies into fresh
    ** pageable tensors: one per field and batch) */
    CHECK(pageable == (size_t)2 * EPOCHS * NB, "%s: %zu pageable copies", what, pageable);
    CHECK(s.pinned_buffers > 0 && s.pinned_bytes > 0, "%s: a pool", what);
  } else {
    CHECK(pageable == (size_t)4 * EPOCHS * NB, "%s: %zu pageable copies", what, pageable);
    CHECK(s.pinned_buffers == 0, "%s: no pool", what);
  }
  em_loader_free(l);
}

static void test_values(em_state *S) {
  static ref r;
  em_transform *norm = NULL;
  double m = 0.5, sd = 2;
  REQUIRE_OK(S, em_transform_normalize(S, &m, &sd, 1, &norm));
  em_dataset *d = make_ds(S, 1, NULL), *dn = make_ds(S, 1, norm);
  em_transform_release(norm);
  REQUIRE(d && dn, "datasets");
  run_values(S, d, &r, 2, 1, -1, "pinned, 2 workers");
  run_values(S, d, &r, 0, 1, 2, "pinned, no workers, 2 ahead");
  run_values(S, dn, &r, 2, 1, -1, "pinned, normalize after batch");
  run_values(S, d, &r, 2, 0, -1, "pageable");
  em_dataset *plain = make_ds(S, 0, NULL);    /* batches are views of the source */
  run_values(S, plain, &r, 1, 1, -1, "pinned, views of the source");
  em_dataset_release(plain);
  em_dataset_release(d);
  em_dataset_release(dn);
}

/* -- Reuse under a slow copy stream ------------------------------------------------ */
static void nap(void *ud) { (void)ud; usleep(8000); }

static void test_reuse(em_state *S) {
  static ref r;
  em_dataset *d = make_ds(S, 1, NULL);
  REQUIRE(d, "dataset");
  em_loader *l = make_loader(S, d, 2, 4, 0, 1, 1);
  REQUIRE(l, "loader: %s", em_errmsg(S));
  emk_runtime *rt = rt_of(S);
  emk_stream *copy = emk_ctx(S)->dev[0]->copy;
  int bad = 0;
  for (int e = 1; e <= 2; e++) {
    REQUIRE(fill_ref(S, d, e, &r), "reference");
    REQUIRE_OK(S, em_loader_start(S, l, e));
    /* Hold the whole epoch on the device before reading any of it, so the
    ** consumer runs ahead of copies that each wait behind a nap. */
    em_tensor *held[NB][2] = {{0}};
    em_tensor *out[EM_DATA_MAX_FIELDS];
    int nf, b = 0;
    REQUIRE_OK(S, rt->ops->host_callback(rt, copy, nap, NULL));
    while (!em_loader_next(S, l, out, &nf) && nf) {
      REQUIRE_OK(S, rt->ops->host_callback(rt, copy, nap, NULL));
      if (b < NB) { held[b][0] = out[0]; held[b][1] = out[1]; } else bad++;
      b++;
    }
    for (int k = 0; k < NB; k++) {
      if (!held[k][0] || !same_as_ref(S, held[k][0], held[k][1], &r, k)) bad++;
      em_tensor_release(held[k][0]);
      em_tensor_release(held[k][1]);
    }
  }
  CHECK(bad == 0, "%d batches corrupted or missing", bad);
  em_loader_stats s;
  stats(l, &s);
  int target = (4 + 2 + 2) * 2;       /* loader.c: (prefetch + workers + ahead + 1) x fields */
  CHECK(s.pinned_buffers <= target, "the pool stopped at %d buffers: %lld", target,
        (long long)s.pinned_buffers);
  CHECK(s.buffer_waits > 0 && s.buffer_wait_s > 0, "workers waited for buffers: %lld, %g s",
        (long long)s.buffer_waits, s.buffer_wait_s);
  CHECK(s.copies_late > 0, "late copies were seen: %lld", (long long)s.copies_late);
  em_loader_free(l);
  em_dataset_release(d);
}

/* -- Overlap ------------------------------------------------------------------------- */
/* Waits up to ms milliseconds for the loader's stats to satisfy cond. */
#define POLL(l, s, ms, cond) do { \
    for (int t_ = 0; t_ < (ms); t_++) { stats((l), &(s)); if (cond) break; usleep(1000); } \
  } while (0)

static void run_overlap(em_state *S, em_dataset *d, int workers, int ahead, int ms,
                        int *queued_ahead, int *ran_ahead, int64_t *late) {
  /* prefetch 2 holds only items pos and pos + 1, so "2 ready" names them both */
  em_loader *l = make_loader(S, d, workers, workers ? 2 : 0, 0, 1, ahead);
  REQUIRE(l, "loader: %s", em_errmsg(S));
  REQUIRE_OK(S, em_loader_start(S, l, 1));
  em_tensor *out[EM_DATA_MAX_FIELDS];
  em_loader_stats s;
  int nf;
  *queued_ahead = *ran_ahead = 0;
  for (int i = 1; i <= NB; i++) {
    /* the workers have this batch and the next ready before this one is asked
    ** for, so the top-up after it finds the next one to copy whatever the load */
    int want = i < NB ? 2 : 1;
    if (workers) POLL(l, s, 3000, s.ready >= want);
    REQUIRE_OK(S, em_loader_next(S, l, out, &nf));
    REQUIRE(nf == 2, "batch %d", i);
    /* the step of batch i: by now the copy of batch i+1 is queued, and it runs
    ** while the step does (no call into the loader or the runtime here) */
    stats(l, &s);
    if (i < NB) {
      *queued_ahead += s.copies >= i + 1;
      POLL(l, s, ms, s.copies_done >= i + 1);
      *ran_ahead += s.copies_done >= i + 1;
    }
    em_tensor_release(out[0]);
    em_tensor_release(out[1]);
  }
  stats(l, &s);
  *late = s.copies_late;
  em_loader_free(l);
}

static void test_overlap(em_state *S) {
  em_dataset *d = make_ds(S, 1, NULL);
  REQUIRE(d, "dataset");
  int q, ran;
  int64_t late;
  run_overlap(S, d, 0, 1, 3000, &q, &ran, &late);
  CHECK(q == NB - 1 && ran == NB - 1, "no workers: %d of %d copies queued ahead, %d ran", q,
        NB - 1, ran);
  CHECK(late <= 1, "no workers: only the first batch may be late: %lld", (long long)late);
  run_overlap(S, d, 2, 1, 3000, &q, &ran, &late);
  CHECK(q == NB - 1 && ran == NB - 1, "2 workers: %d of %d copies queued ahead, %d ran", q,
        NB - 1, ran);
  CHECK(late <= 1, "2 workers: only the first batch may be late: %lld", (long long)late);
  /* the check tells: with nothing copied ahead, no copy runs before its batch is asked for */
  run_overlap(S, d, 0, 0, 20, &q, &ran, &late);
  CHECK(q == 0 && ran == 0, "nothing ahead: %d queued, %d ran", q, ran);
  em_dataset_release(d);
}

/* -- Leaks, CPU pinned batches, errors ------------------------------------------------ */
static void test_no_leak(em_state *S) {
  emk_runtime *rt = rt_of(S);
  REQUIRE_OK(S, em_cuda_synchronize(S, -1));
  size_t base = emk_emu_live_blocks(rt, -1);
  em_dataset *d = make_ds(S, 1, NULL);
  REQUIRE(d, "dataset");
  em_loader *l = make_loader(S, d, 2, 0, 0, 1, 2);
  REQUIRE(l, "loader");
  em_tensor *out[EM_DATA_MAX_FIELDS];
  int nf;
  REQUIRE_OK(S, em_loader_start(S, l, 1));
  for (int i = 0; i < 5; i++) {      /* break out mid-epoch, copies queued ahead */
    REQUIRE_OK(S, em_loader_next(S, l, out, &nf));
    em_tensor_release(out[0]);
    em_tensor_release(out[1]);
  }
  CHECK(emk_emu_live_blocks(rt, -1) > base, "the pool holds pinned blocks");
  em_loader_stop(l);                 /* as loader:close() */
  REQUIRE_OK(S, em_cuda_synchronize(S, -1));
  CHECK(emk_emu_live_blocks(rt, -1) == base, "stopped: %zu pinned blocks left (%zu before)",
        emk_emu_live_blocks(rt, -1), base);
  REQUIRE_OK(S, em_loader_start(S, l, 2));   /* usable again: the pool regrows */
  int n = 0;
  while (!em_loader_next(S, l, out, &nf) && nf) {
    em_tensor_release(out[0]);
    em_tensor_release(out[1]);
    n++;
  }
  CHECK(n == NB, "a whole epoch after stop: %d", n);
  REQUIRE_OK(S, em_loader_start(S, l, 3));
  REQUIRE_OK(S, em_loader_next(S, l, out, &nf));
  em_loader_free(l);                 /* with a batch out and copies queued */
  em_tensor_release(out[0]);
  em_tensor_release(out[1]);
  REQUIRE_OK(S, em_cuda_synchronize(S, -1));
  CHECK(emk_emu_live_blocks(rt, -1) == base, "freed: %zu pinned blocks left (%zu before)",
        emk_emu_live_blocks(rt, -1), base);

  /* pinned CPU batches: for the caller's own asynchronous copies */
  l = make_loader(S, d, 1, 0, EM_CPU, 1, 0);
  REQUIRE(l, "cpu pinned loader: %s", em_errmsg(S));
  REQUIRE_OK(S, em_loader_start(S, l, 1));
  REQUIRE_OK(S, em_loader_next(S, l, out, &nf));
  CHECK(em_tensor_device(out[0]) == EM_CPU && em_tensor_is_pinned(out[0]) &&
        em_tensor_is_pinned(out[1]), "pinned CPU batches");
  em_tensor *dx = NULL;
  REQUIRE_OK(S, em_to(S, out[0], EM_FLOAT32, 0, &dx));     /* asynchronous, no staging */
  em_loader_free(l);                 /* the batch outlives the loader */
  em_tensor_release(out[0]);
  em_tensor_release(out[1]);
  em_tensor_release(dx);
  REQUIRE_OK(S, em_cuda_synchronize(S, -1));
  CHECK(emk_emu_live_blocks(rt, -1) == base, "cpu pinned: %zu pinned blocks left (%zu before)",
        emk_emu_live_blocks(rt, -1), base);
  em_dataset_release(d);
}

/* fails on the sample whose first value is 100 * 100 (sample 100) */
static int fail_at_100(void *ud, int worker, uint64_t seed, em_tensor **fields, int nfields,
                       char *err, size_t errlen) {
  if (t_get(fields[0], 0) == 100 * 100) { snprintf(err, errlen, "sample one hundred"); return 1; }
  return 0;
}

static void test_errors(em_state *S) {
  em_dataset *d = make_ds(S, 0, NULL);
  REQUIRE(d, "dataset");
  em_loader_config cfg;
  em_loader_config_init(&cfg);
  em_loader *l = NULL;
  REQUIRE_OK(S, em_loader_new(S, d, &cfg, &l));
  CHECK_ERR(S, em_loader_to_device(S, l, 5, 1, -1), EM_ERR_DEVICE, "loader", "cuda:5");
  CHECK_ERR(S, em_loader_to_device(S, l, EM_CPU, 0, 0), EM_ERR_ARG, "loader");
  CHECK_OK(S, em_loader_to_device(S, l, 1, 1, -1));
  CHECK_ERR(S, em_loader_to_device(S, l, 1, 1, -1), EM_ERR_ARG, "already");
  REQUIRE_OK(S, em_loader_start(S, l, 1));
  em_tensor *out[EM_DATA_MAX_FIELDS];
  int nf;
  REQUIRE_OK(S, em_loader_next(S, l, out, &nf));
  CHECK(em_tensor_device(out[0]) == 1, "on cuda:1");
  em_tensor_release(out[0]);
  em_tensor_release(out[1]);
  em_loader_free(l);
  REQUIRE_OK(S, em_loader_new(S, d, &cfg, &l));
  REQUIRE_OK(S, em_loader_start(S, l, 1));
  CHECK_ERR(S, em_loader_to_device(S, l, 0, 1, -1), EM_ERR_ARG, "before the first epoch");
  em_loader_free(l);
  em_dataset_release(d);

  /* a worker's error comes after every batch before it, copied ahead or not */
  em_transform *t = NULL;
  REQUIRE_OK(S, em_transform_custom(S, "fail_at_100", fail_at_100, NULL, NULL, &t));
  em_dataset *src = NULL, *m = NULL, *bd = NULL;
  double *xv = malloc(sizeof(double) * N * C * W), yv[N];
  for (int i = 0; i < N; i++) {
    yv[i] = i;
    for (int j = 0; j < C * W; j++) xv[i * C * W + j] = i * 100 + j;
  }
  em_tensor *f[2];
  REQUIRE_OK(S, t_make(S, &f[0], EM_FLOAT32, (int64_t[]){N, C, W}, 3, xv, N * C * W));
  REQUIRE_OK(S, t_make(S, &f[1], EM_INT64, (int64_t[]){N}, 1, yv, N));
  free(xv);
  REQUIRE_OK(S, em_data_tensors(S, f, 2, &src));
  REQUIRE_OK(S, em_data_map(S, src, t, 1, &m));
  REQUIRE_OK(S, em_data_batch(S, m, B, 0, &bd));
  for (int workers = 0; workers <= 2; workers += 2) {
    em_loader *el = make_loader(S, bd, workers, 0, 0, 1, 2);
    REQUIRE(el, "loader");
    REQUIRE_OK(S, em_loader_start(S, el, 1));
    int got = 0;
    em_status st;
    while (!(st = em_loader_next(S, el, out, &nf)) && nf) {
      em_tensor_release(out[0]);
      em_tensor_release(out[1]);
      got++;
    }
    CHECK(got == 100 / B && st != EM_OK && strstr(em_errmsg(S), "sample one hundred"),
          "workers %d: %d batches, then \"%s\"", workers, got, em_errmsg(S));
    em_loader_free(el);
  }
  em_dataset_release(bd);
  em_dataset_release(m);
  em_dataset_release(src);
  em_tensor_release(f[0]);
  em_tensor_release(f[1]);
  em_transform_release(t);
}

int main(void) {
  em_state *S;
  if (cuda_check_open(&S, "2:64")) return 1;
  if (!em_cuda_emulated(S) || em_cuda_device_count(S) < 2) {
    em_close(S);
    return check_skip_all("reads the emulator's counters and needs two devices");
  }
  RUN(test_values, S);
  RUN(test_reuse, S);
  RUN(test_overlap, S);
  RUN(test_no_leak, S);
  RUN(test_errors, S);
  em_close(S);
  return check_done();
}

/*
** test_profile.c -- the profiler's recording side from a C host (core/profile/):
** ops recorded at the dispatch point with their shape, dtype and device, in
** start order, across many buffer chunks; ranges, steps, backward nodes and
** gradients; the loader's waits on the main track and its workers' batches on
** tracks of their own; the errors of misuse; and a state closed while recording
** (ASan and the leak checker watch this file's pass).
*/
#include "check.h"
#include <pthread.h>

static int64_t count_kind(const em_profile_event *ev, int64_t n, int kind, const char *name) {
  int64_t c = 0;
  for (int64_t i = 0; i < n; i++)
    if (ev[i].kind == kind && (!name || strcmp(ev[i].name, name) == 0)) c++;
  return c;
}

static void test_ops_and_ranges(em_state *S) {
  em_tensor *a, *b, *c;
  REQUIRE_OK(S, em_full(S, (int64_t[]){2, 3}, 2, 1.0, EM_FLOAT32, EM_CPU, &a));
  REQUIRE_OK(S, em_full(S, (int64_t[]){2, 3}, 2, 1.0, EM_FLOAT32, EM_CPU, &b));
  CHECK(!em_profile_active(S), "not recording before start");
  REQUIRE_OK(S, em_profile_start(S, NULL));
  CHECK(em_profile_active(S), "recording after start");
  enum { N = 10000 };                  /* several chunks of 4096 events */
  REQUIRE_OK(S, em_profile_range_push(S, "loop", EM_PROF_RANGE));
  /* a pipeline's wait on a neighbour stage: a range of the bubble kind */
  REQUIRE_OK(S, em_profile_range_push(S, "recv activation", EM_PROF_BUBBLE));
  REQUIRE_OK(S, em_profile_range_pop(S));
  em_status st = EM_OK;
  for (int i = 0; i < N && !st; i++) {
    if (!(st = em_binary(S, EM_ADD, a, b, &c))) em_tensor_release(c);
    if (!st && i % 1000 == 999) st = em_profile_step(S);
  }
  REQUIRE_OK(S, st);
  REQUIRE_OK(S, em_profile_range_pop(S));
  REQUIRE_OK(S, em_profile_stop(S));
  CHECK(!em_profile_active(S), "not recording after stop");
  const em_profile_event *ev;
  int64_t n;
  REQUIRE_OK(S, em_profile_events(S, &ev, &n));
  CHECK(count_kind(ev, n, EM_PROF_OP, "add") == N, "%lld adds recorded, want %d",
        (long long)count_kind(ev, n, EM_PROF_OP, "add"), N);
  CHECK(count_kind(ev, n, EM_PROF_STEP, NULL) == 10, "10 step marks");
  CHECK(count_kind(ev, n, EM_PROF_RANGE, "loop") == 1, "the range");
  CHECK(count_kind(ev, n, EM_PROF_BUBBLE, "recv activation") == 1, "the bubble");
  CHECK(em_profile_dropped(S) == 0, "nothing dropped");
  int sorted = 1, shapes = 1, inside = 1;
  double t_range0 = 0, t_range1 = 0;
  for (int64_t i = 0; i < n; i++)
    if (ev[i].kind == EM_PROF_RANGE) { t_range0 = ev[i].t0; t_range1 = ev[i].t1; }
  for (int64_t i = 0; i < n; i++) {
    if (i && ev[i].t0 < ev[i - 1].t0) sorted = 0;
    if (ev[i].kind != EM_PROF_OP) continue;
    if (ev[i].ndim != 2 || ev[i].sizes[0] != 2 || ev[i].sizes[1] != 3 ||
        ev[i].dtype != EM_FLOAT32 || ev[i].device != EM_CPU || ev[i].t1 < ev[i].t0)
      shapes = 0;
    if (ev[i].t0 < t_range0 || ev[i].t1 > t_range1) inside = 0;
  }
  CHECK(sorted, "events sorted by start");
  CHECK(shapes, "every op names its shape [2,3], float32, cpu, with t1 >= t0");
  CHECK(inside, "every op inside the range that enclosed the loop");
  CHECK(em_profile_num_tracks(S) == 1, "one track, got %d", em_profile_num_tracks(S));
  CHECK(strcmp(em_profile_track_name(S, 0), "main") == 0, "the step thread is 'main'");
  CHECK(em_profile_peak_bytes(S, EM_CPU) > 0, "peak bytes while recording");
  /* a new start discards the old profile */
  REQUIRE_OK(S, em_profile_start(S, NULL));
  REQUIRE_OK(S, em_profile_stop(S));
  REQUIRE_OK(S, em_profile_events(S, &ev, &n));
  CHECK(n == 0, "a fresh profile is empty, got %lld events", (long long)n);
  em_tensor_release(a);
  em_tensor_release(b);
}

static void test_backward_and_grads(em_state *S) {
  em_tensor *w, *y, *s;
  REQUIRE_OK(S, em_full(S, (int64_t[]){4, 5}, 2, 1.0, EM_FLOAT64, EM_CPU, &w));
  REQUIRE_OK(S, em_tensor_set_requires_grad(S, w, 1));
  REQUIRE_OK(S, em_profile_start(S, NULL));
  REQUIRE_OK(S, em_unary(S, EM_EXP, w, &y));
  REQUIRE_OK(S, em_reduce(S, EM_SUM, y, NULL, 0, 0, &s));
  REQUIRE_OK(S, em_backward(S, s, NULL));
  REQUIRE_OK(S, em_profile_stop(S));
  const em_profile_event *ev;
  int64_t n;
  REQUIRE_OK(S, em_profile_events(S, &ev, &n));
  CHECK(count_kind(ev, n, EM_PROF_BACKWARD, NULL) >= 2, "a backward node per op");
  int64_t grad_bytes = 0;
  for (int64_t i = 0; i < n; i++) if (ev[i].kind == EM_PROF_GRAD) grad_bytes += ev[i].bytes;
  CHECK(grad_bytes == 4 * 5 * 8, "the leaf's gradient bytes: %lld", (long long)grad_bytes);
  /* ops run by backward lie inside their node */
  int nested = 0;
  for (int64_t i = 0; i < n; i++) {
    if (ev[i].kind != EM_PROF_BACKWARD) continue;
    for (int64_t j = 0; j < n; j++)
      if (ev[j].kind == EM_PROF_OP && ev[j].t0 >= ev[i].t0 && ev[j].t1 <= ev[i].t1) nested++;
  }
  CHECK(nested >= 1, "backward's ops inside backward nodes");
  em_tensor_release(s); em_tensor_release(y); em_tensor_release(w);
}

static void test_loader_tracks(em_state *S) {
  em_tensor *x, *yv;
  em_dataset *src = NULL, *bt = NULL;
  em_loader *l = NULL;
  REQUIRE_OK(S, em_arange(S, 0, 64, 1, EM_FLOAT32, EM_CPU, &x));
  REQUIRE_OK(S, em_arange(S, 0, 64, 1, EM_INT64, EM_CPU, &yv));
  em_tensor *f[2] = {x, yv};
  REQUIRE_OK(S, em_data_tensors(S, f, 2, &src));
  REQUIRE_OK(S, em_data_batch(S, src, 8, 0, &bt));
  em_loader_config cfg;
  em_loader_config_init(&cfg);
  cfg.workers = 2;
  REQUIRE_OK(S, em_loader_new(S, bt, &cfg, &l));
  em_profile_config pc = {.auto_step = 1};
  REQUIRE_OK(S, em_profile_start(S, &pc));
  REQUIRE_OK(S, em_loader_start(S, l, 1));
  em_tensor *out[EM_DATA_MAX_FIELDS];
  int nf, items = 0;
  while (em_loader_next(S, l, out, &nf) == EM_OK && nf > 0) {
    items++;
    for (int k = 0; k < nf; k++) em_tensor_release(out[k]);
  }
  REQUIRE_OK(S, em_profile_stop(S));
  const em_profile_event *ev;
  int64_t n;
  REQUIRE_OK(S, em_profile_events(S, &ev, &n));
  CHECK(items == 8, "8 batches");
  CHECK(count_kind(ev, n, EM_PROF_DATA_WAIT, NULL) == 8, "a data wait per batch");
  CHECK(count_kind(ev, n, EM_PROF_STEP, NULL) == 8, "auto steps: one per batch handed out");
  CHECK(count_kind(ev, n, EM_PROF_LOADER_WORK, NULL) == 8, "a worker span per batch");
  int workers_named = 0, waits_on_main = 1;
  for (int t = 0; t < em_profile_num_tracks(S); t++)
    if (strncmp(em_profile_track_name(S, t), "loader worker ", 14) == 0) workers_named++;
  for (int64_t i = 0; i < n; i++) {
    if (ev[i].kind == EM_PROF_DATA_WAIT &&
        (strcmp(em_profile_track_name(S, ev[i].track), "main") != 0 || ev[i].arg0 != 2))
      waits_on_main = 0;
    if (ev[i].kind == EM_PROF_LOADER_WORK &&
        strncmp(em_profile_track_name(S, ev[i].track), "loader worker ", 14) != 0)
      waits_on_main = 0;
  }
  CHECK(workers_named >= 1 && workers_named <= 2, "worker tracks: %d", workers_named);
  CHECK(waits_on_main, "waits on main (with the worker count), batches on worker tracks");
  em_loader_free(l);
  em_dataset_release(bt); em_dataset_release(src);
  em_tensor_release(x); em_tensor_release(yv);
}

static void test_misuse(em_state *S) {
  CHECK_ERR(S, em_profile_stop(S), EM_ERR_ARG, "profile.stop", "not recording");
  REQUIRE_OK(S, em_profile_start(S, NULL));
  CHECK_ERR(S, em_profile_start(S, NULL), EM_ERR_ARG, "profile.start", "already recording");
  CHECK_ERR(S, em_profile_range_push(S, "x", EM_PROF_OP), EM_ERR_ARG, "profile.range", "kind");
  em_status st = EM_OK;
  for (int i = 0; i < 32 && !st; i++) st = em_profile_range_push(S, "deep", EM_PROF_RANGE);
  REQUIRE_OK(S, st);
  CHECK_ERR(S, em_profile_range_push(S, "deeper", EM_PROF_RANGE), EM_ERR_ARG, "32 deep", "deeper");
  REQUIRE_OK(S, em_profile_stop(S));
  CHECK(em_profile_range_pop(S) == EM_OK, "a pop after stop is harmless");
  /* ranges left open at stop are not events */
  const em_profile_event *ev;
  int64_t n;
  REQUIRE_OK(S, em_profile_events(S, &ev, &n));
  CHECK(count_kind(ev, n, EM_PROF_RANGE, NULL) == 0, "open ranges not recorded");
}

/* A state closed while recording frees its buffers (the leak checker tells). */
static void test_close_while_recording(void) {
  em_state *S;
  if (em_open(&S, NULL) != EM_OK) { CHECK(0, "em_open"); return; }
  CHECK(em_profile_start(S, NULL) == EM_OK, "start");
  em_tensor *a;
  CHECK(em_full(S, (int64_t[]){8}, 1, 1.0, EM_FLOAT32, EM_CPU, &a) == EM_OK, "an op");
  em_tensor_release(a);
  /* still recording, with the op's events in its buffers, when the state closes */
  CHECK(em_profile_active(S), "recording");
  em_close(S);
}

int main(void) {
  em_state *S;
  if (em_open(&S, NULL) != EM_OK) return 1;
  RUN(test_ops_and_ranges, S);
  RUN(test_backward_and_grads, S);
  RUN(test_loader_tracks, S);
  RUN(test_misuse, S);
  RUN(test_close_while_recording);
  em_close(S);
  return check_done();
}

/*
** test_cuda_contexts.c -- a state opens only the CUDA devices it uses, on their
** first use (kernels/cuda.c, emk_device_open), on two emulated devices
** (EMBER_CUDA_EMULATE=2:64). On a real machine every device opened is a CUDA
** context (memory on that GPU, and in EXCLUSIVE_PROCESS mode the GPU itself), so
** eight mpirun ranks that each opened all eight GPUs made 64 contexts, and a GPU
** in that mode refused the second rank. The emulated runtime records the devices
** it would have made a context on (emk_emu_contexts) and can refuse a device as
** another process's (emk_emu_set_unavailable); with them:
**   - the runtime counts a context where CUDA makes one (memory, streams, events,
**     mem_info; pinned memory through the first such device), not for counting
**     or properties;
**   - counting the devices, their properties and memory counts, and
**     synchronize / empty_cache over all of them touch none;
**   - a tensor on cuda:0 touches cuda:0 alone, and cuda:1 follows at its first use;
**   - pinned memory goes through the current device, not CUDA's default cuda:0;
**   - replicas in threads (a state each, as `ember --replicas 2 --devices
**     cuda:0,cuda:1`), with their collectives, touch their own device only;
**   - a device that can't be opened is an error naming it, never an abort, the
**     devices already open work on, and a later use opens it once it can;
**   - threads opening one device at once make its streams once.
*/
#include "cuda_check.h"
#include "internal.h"
#include "../../kernels/cuda.h"
#include <pthread.h>

static unsigned contexts(em_state *S) { return emk_cuda_contexts(S); }

/* The emulated runtime alone: which of its calls count as making a context. */
static void test_runtime_record(void) {
  emk_emu_config cfg = {3, 1 << 20};
  emk_runtime *rt = NULL;
  char err[256];
  REQUIRE(emk_emu_open(&cfg, &rt, err, sizeof err) == EM_OK, "%s", err);
  emk_device_props p;
  CHECK(rt->ops->device_count(rt) == 3, "three devices");
  for (int d = 0; d < 3; d++) CHECK(rt->ops->device_props(rt, d, &p) == EM_OK, "props %d", d);
  CHECK(emk_emu_contexts(rt) == 0, "counting and properties make none: %#x",
        emk_emu_contexts(rt));
  size_t fr, to;
  CHECK(rt->ops->mem_info(rt, 2, &fr, &to) == EM_OK && emk_emu_contexts(rt) == 4u,
        "mem_info makes cuda:2's (cudaMemGetInfo needs one): %#x", emk_emu_contexts(rt));
  void *h = NULL;
  CHECK(rt->ops->host_alloc(rt, 64, &h) == EM_OK && emk_emu_contexts(rt) == 4u,
        "pinned memory goes through the first device with a context: %#x",
        emk_emu_contexts(rt));
  rt->ops->host_free(rt, h);
  emk_stream *s = NULL;
  emk_event *e = NULL;
  CHECK(rt->ops->stream_create(rt, 1, &s) == EM_OK && emk_emu_contexts(rt) == 6u,
        "a stream makes cuda:1's: %#x", emk_emu_contexts(rt));
  emk_emu_set_unavailable(rt, 1u);
  CHECK(rt->ops->event_create(rt, 0, &e) == EM_ERR_DEVICE && strstr(rt->errmsg, "cuda:0") &&
        strstr(rt->errmsg, "EXCLUSIVE_PROCESS"), "an unavailable device refuses: %s",
        rt->errmsg);
  emk_emu_set_unavailable(rt, 2u);
  CHECK(rt->ops->event_create(rt, 1, &e) == EM_OK, "a device keeps the context it has");
  rt->ops->event_destroy(rt, e);
  rt->ops->stream_destroy(rt, s);
  rt->ops->close(rt);
  /* no device had a context: pinned memory takes cuda:0's, as CUDA does */
  REQUIRE(emk_emu_open(&cfg, &rt, err, sizeof err) == EM_OK, "%s", err);
  CHECK(rt->ops->host_alloc(rt, 64, &h) == EM_OK && emk_emu_contexts(rt) == 1u,
        "cuda:0's by default: %#x", emk_emu_contexts(rt));
  rt->ops->host_free(rt, h);
  rt->ops->close(rt);
}

static em_state *open_emulated(void) {
  em_state *S = NULL;
  setenv("EMBER_CUDA_EMULATE", "2:64", 1);
  if (em_open(&S, NULL) != EM_OK) return NULL;
  return S;
}

static void test_facts_touch_nothing(void) {
  em_state *S = open_emulated();
  REQUIRE(S != NULL, "em_open");
  CHECK(em_cuda_device_count(S) == 2, "two emulated devices");
  REQUIRE(emk_ctx(S) != NULL, "the kind is open");
  CHECK(contexts(S) == 0, "counting opens no device: %#x", contexts(S));
  em_cuda_props p;
  em_cuda_memory m;
  em_device_memory_stats dm;
  for (int d = 0; d < 2; d++) {
    CHECK_OK(S, em_cuda_device_props(S, d, &p));
    CHECK_OK(S, em_cuda_memory_stats(S, d, &m));
    CHECK(m.capacity == 64 << 20, "cuda:%d's capacity without a context: %lld", d,
          (long long)m.capacity);
    CHECK_OK(S, em_device_memory(S, d, &dm));
    CHECK_OK(S, em_device_reset_peak(S, d));
  }
  CHECK_OK(S, em_cuda_synchronize(S, -1));
  CHECK_OK(S, em_cuda_synchronize(S, 1));
  CHECK_OK(S, em_cuda_empty_cache(S, -1));
  CHECK(contexts(S) == 0, "properties, memory counts, sync and empty_cache open none: %#x",
        contexts(S));
  CHECK(em_cuda_capturing(S) == -1, "nothing captures");
  em_close(S);
}

static void test_first_use(void) {
  em_state *S = open_emulated();
  REQUIRE(S != NULL, "em_open");
  em_tensor *a = NULL, *b = NULL, *back = NULL, *h = NULL;
  REQUIRE_OK(S, em_full(S, SHP(64), 2.0, EM_FLOAT32, 0, &a));
  REQUIRE_OK(S, em_binary(S, EM_MUL, a, a, &b));
  REQUIRE_OK(S, em_to(S, b, EM_FLOAT32, EM_CPU, &back));
  CHECK(t_get(back, 63) == 4, "cuda:0 computes: %g", t_get(back, 63));
  CHECK_OK(S, em_cuda_synchronize(S, -1));
  CHECK_OK(S, em_cuda_empty_cache(S, -1));
  CHECK(contexts(S) == 1u, "a state on cuda:0 touches cuda:0 alone: %#x", contexts(S));
  CHECK(emk_device_is_open(emk_ctx(S)->dev[0]) && !emk_device_is_open(emk_ctx(S)->dev[1]),
        "cuda:0 open, cuda:1 not");
  em_tensor_release(back);
  back = NULL;
  /* cuda:1 at its first use: a copy between the devices */
  REQUIRE_OK(S, em_to(S, b, EM_FLOAT32, 1, &h));
  CHECK(contexts(S) == 3u, "the copy to cuda:1 opened it: %#x", contexts(S));
  REQUIRE_OK(S, em_to(S, h, EM_FLOAT32, EM_CPU, &back));
  CHECK(t_get(back, 0) == 4, "on cuda:1: %g", t_get(back, 0));
  em_tensor_release(a); em_tensor_release(b); em_tensor_release(h); em_tensor_release(back);
  em_close(S);
}

/* Pinned memory needs a context: the current device's, as the state works there. */
static void test_pinned_through_current_device(void) {
  em_state *S = open_emulated();
  REQUIRE(S != NULL, "em_open");
  REQUIRE_OK(S, em_cuda_set_device(S, 1));
  CHECK(contexts(S) == 0, "choosing the device opens nothing: %#x", contexts(S));
  em_tensor *h = NULL, *pinned = NULL, *d = NULL, *back = NULL;
  REQUIRE_OK(S, em_full(S, SHP(1000), 7.0, EM_FLOAT32, EM_CPU, &h));
  REQUIRE_OK(S, em_tensor_pin_memory(S, h, &pinned));
  CHECK(em_tensor_is_pinned(pinned), "pinned");
  CHECK(contexts(S) == 2u, "pinning opened cuda:1, the current device, not cuda:0: %#x",
        contexts(S));
  REQUIRE_OK(S, em_to(S, pinned, EM_FLOAT32, 1, &d));
  REQUIRE_OK(S, em_to(S, d, EM_FLOAT32, EM_CPU, &back));
  CHECK(t_get(back, 999) == 7, "the pinned copy on cuda:1: %g", t_get(back, 999));
  em_tensor_release(h); em_tensor_release(pinned); em_tensor_release(d);
  em_tensor_release(back);
  CHECK(contexts(S) == 2u, "and cuda:0 stays untouched: %#x", contexts(S));
  em_close(S);
}

/* -- Replicas: threads of one process, a state each ------------------------------- */

typedef struct replica {
  em_local_group *g;
  int rank;
  unsigned contexts;
  double value;
  char msg[512];
} replica;

static void *run_replica(void *arg) {
  replica *r = arg;
  em_state *S;
  if (em_open(&S, NULL)) {
    snprintf(r->msg, sizeof r->msg, "em_open failed");
    return NULL;
  }
  em_comm *c = NULL;
  em_tensor *t = NULL, *back = NULL;
  /* as the mirrored strategy: the replica's device becomes 'cuda', then a
  ** communicator there, a tensor, a collective */
  if (em_cuda_set_device(S, r->rank) ||
      em_comm_nccl(S, r->rank, r->g, r->rank, 30, &c) ||
      em_full(S, SHP(256), r->rank + 1.0, EM_FLOAT32, em_cuda_current_device(S), &t) ||
      em_comm_allreduce(S, c, t, EM_COMM_SUM, NULL) ||
      em_to(S, t, EM_FLOAT32, EM_CPU, &back) || em_cuda_synchronize(S, -1)) {
    snprintf(r->msg, sizeof r->msg, "replica %d: %s", r->rank, em_errmsg(S));
  } else {
    r->value = t_get(back, 255);
    r->contexts = emk_cuda_contexts(S);
  }
  em_tensor_release(t);
  em_tensor_release(back);
  em_comm_free(c);
  em_close(S);
  return NULL;
}

static void test_replicas_open_their_own_device(void) {
  setenv("EMBER_CUDA_EMULATE", "2:64", 1);
  em_local_group *g = em_local_group_new(2);
  REQUIRE(g != NULL, "a local group");
  replica rs[2];
  pthread_t th[2];
  for (int i = 0; i < 2; i++) {
    memset(&rs[i], 0, sizeof rs[i]);
    rs[i].g = g;
    rs[i].rank = i;
    pthread_create(&th[i], NULL, run_replica, &rs[i]);
  }
  for (int i = 0; i < 2; i++) pthread_join(th[i], NULL);
  for (int i = 0; i < 2; i++) {
    CHECK(!rs[i].msg[0], "%s", rs[i].msg);
    CHECK(rs[i].value == 3, "replica %d: the allreduce: %g", i, rs[i].value);
    CHECK(rs[i].contexts == 1u << i, "replica %d touched cuda:%d alone: %#x", i, i,
          rs[i].contexts);
  }
  em_local_group_release(g);
}

/* -- A device that can't be opened ------------------------------------------------ */

static void test_device_refused(void) {
  em_state *S = open_emulated();
  REQUIRE(S != NULL, "em_open");
  REQUIRE(em_cuda_device_count(S) == 2, "two devices");
  emk_runtime *rt = emk_ctx(S)->rt;
  emk_emu_set_unavailable(rt, 2u);       /* cuda:1 held by "another process" */
  em_tensor *a = NULL, *b = NULL, *back = NULL;
  REQUIRE_OK(S, em_full(S, SHP(8), 1.5, EM_FLOAT32, 0, &a));
  CHECK_OK(S, em_cuda_synchronize(S, -1));
  em_cuda_memory m;
  CHECK_OK(S, em_cuda_memory_stats(S, 1, &m));
  CHECK_ERR(S, em_full(S, SHP(8), 1, EM_FLOAT32, 1, &b), EM_ERR_DEVICE, "cuda:1",
            "could not be opened", "unavailable");
  CHECK_ERR(S, em_to(S, a, EM_FLOAT32, 1, &b), EM_ERR_DEVICE, "cuda:1", "unavailable");
  CHECK_ERR(S, em_cuda_graph_begin(S, 1), EM_ERR_DEVICE, "cuda:1", "unavailable");
  CHECK(contexts(S) == 1u, "cuda:1 has no context: %#x", contexts(S));
  /* cuda:0 goes on */
  REQUIRE_OK(S, em_to(S, a, EM_FLOAT32, EM_CPU, &back));
  CHECK(t_get(back, 7) == 1.5, "cuda:0 still works: %g", t_get(back, 7));
  em_tensor_release(back);
  /* the other process is gone: the next use opens it */
  emk_emu_set_unavailable(rt, 0);
  REQUIRE_OK(S, em_to(S, a, EM_FLOAT32, 1, &b));
  REQUIRE_OK(S, em_to(S, b, EM_FLOAT32, EM_CPU, &back));
  CHECK(t_get(back, 0) == 1.5, "cuda:1 once free: %g", t_get(back, 0));
  CHECK(contexts(S) == 3u, "both now: %#x", contexts(S));
  /* a device with a context keeps it, as on CUDA */
  emk_emu_set_unavailable(rt, 3u);
  em_tensor *c = NULL;
  CHECK_OK(S, em_full(S, SHP(8), 2, EM_FLOAT32, 1, &c));
  em_tensor_release(a); em_tensor_release(b); em_tensor_release(c);
  em_tensor_release(back);
  em_close(S);
}

/* The kind's guard: threads opening one device at once make its streams once. */
typedef struct opener { emk_cuda *c; em_status st; char why[256]; } opener;

static void *open_one(void *arg) {
  opener *o = arg;
  o->st = emk_device_open(o->c, 1, o->why, sizeof o->why);
  return NULL;
}

static void test_open_from_threads(void) {
  em_state *S = open_emulated();
  REQUIRE(S != NULL, "em_open");
  REQUIRE(em_cuda_device_count(S) == 2, "two devices");
  enum { N = 8 };
  opener o[N];
  pthread_t th[N];
  for (int i = 0; i < N; i++) {
    o[i] = (opener){emk_ctx(S), EM_OK, ""};
    pthread_create(&th[i], NULL, open_one, &o[i]);
  }
  for (int i = 0; i < N; i++) pthread_join(th[i], NULL);
  int ok = 1;
  for (int i = 0; i < N; i++) ok &= o[i].st == EM_OK;
  CHECK(ok, "every thread saw cuda:1 open");
  emk_cuda_device *cd = emk_ctx(S)->dev[1];
  CHECK(emk_device_is_open(cd) && cd->compute && cd->copy, "its streams");
  CHECK(contexts(S) == 2u, "cuda:1 alone: %#x", contexts(S));
  char why[256];
  CHECK(emk_device_open(emk_ctx(S), 5, why, sizeof why) == EM_ERR_DEVICE &&
        strstr(why, "cuda:5"), "no cuda:5: %s", why);
  em_close(S);
}

int main(void) {
  if (getenv("EMBER_TEST_REAL_CUDA")) return check_skip_all("the emulator's record only");
  RUN(test_runtime_record);
  RUN(test_facts_touch_nothing);
  RUN(test_first_use);
  RUN(test_pinned_through_current_device);
  RUN(test_replicas_open_their_own_device);
  RUN(test_device_refused);
  RUN(test_open_from_threads);
  return check_done();
}

/*
** test_comm_nccl.c -- the nccl communicator (core/dist/nccl.c) as far as it runs
** without a GPU: ncclGetVersion and ncclGetUniqueId from the real libnccl (when
** it is installed), the id exchange through a local group of threads and -- the
** program runs itself under mpirun -- through MPI, and the device side on the
** emulated runtime (EMBER_CUDA_EMULATE=2:64): collectives on device tensors
** ordered after the compute stream's work, CPU tensors beside them, and the
** errors. NCCL's collectives themselves need a GPU and are not run here; the
** real runtime's communicator setup and teardown (kernels/real/nccl_real.c) run
** against a scripted stand-in for NCCL through every failure, and must leave no
** communicator alive.
*/
#include "check.h"
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* internal (core/dist/comm.h), for the test */
em_status emi_nccl_unique_id(unsigned char id[128], char *err, size_t errlen);
em_status emi_nccl_version(int *code, char *err, size_t errlen);
int emi_comm_nccl_id(const em_comm *c, unsigned char id[128]);

static int have_nccl;

/* kernels/real/nccl_real.c (built with the CUDA headers, as on every machine here):
** the number of scripted scenarios that went wrong, the first one in report. */
int emk_nccl_script_check(char *report, size_t n);

/* internal (core/dist/comm.h, nccl.c, local.c, commdev.c), for the polling tests */
double emi_now(void);
double emi_poll_nap_s(double waited_s);
int emi_local_group_left(em_local_group *g, int peer, double *at);
int emi_nccl_peer_left(em_local_group *g, int self, int peer, double now, char *msg,
                       size_t n);
#define LEFT_GRACE_S 0.5      /* EMI_NCCL_LEFT_GRACE_S */

/* A replica that exits fails NCCL's waits for it, "replica K exited" as the
** host communicators say -- after a grace from the moment it left (a collective
** it took part in ends here moments later), a send or recv only with it. */
static void test_nccl_peer_left(void) {
  em_local_group *g = em_local_group_new(3);
  char msg[64] = "";
  double at = -1, t = emi_now();
  CHECK(emi_local_group_left(g, -1, &at) == -1, "nobody left yet");
  CHECK(!emi_nccl_peer_left(g, 0, -1, t + 10, msg, sizeof msg), "nobody left: %s", msg);
  em_local_group_leave(g, 2);
  CHECK(emi_local_group_left(g, -1, &at) == 2 && at >= t && at <= emi_now(),
        "the first to leave: replica 2 at %g (now %g)", at, emi_now());
  CHECK(emi_local_group_left(g, 1, &at) == -1, "replica 1 is here");
  CHECK(emi_local_group_left(g, 2, NULL) == 2, "replica 2 left");
  /* within the grace a wait goes on; past it, it fails, naming the replica */
  CHECK(!emi_nccl_peer_left(g, 0, -1, at + LEFT_GRACE_S / 2, msg, sizeof msg),
        "failed within the grace: %s", msg);
  CHECK(emi_nccl_peer_left(g, 0, -1, at + LEFT_GRACE_S + 0.01, msg, sizeof msg) &&
        strcmp(msg, "replica 2 exited") == 0, "a collective: '%s'", msg);
  msg[0] = 0;
  CHECK(!emi_nccl_peer_left(g, 0, 1, at + 10, msg, sizeof msg), "a recv from replica 1: %s",
        msg);
  CHECK(emi_nccl_peer_left(g, 0, 2, at + 10, msg, sizeof msg) &&
        strcmp(msg, "replica 2 exited") == 0, "a send to replica 2: '%s'", msg);
  /* a second leave keeps the first moment */
  em_local_group_leave(g, 2);
  double at2 = 0;
  emi_local_group_left(g, 2, &at2);
  CHECK(at2 == at, "leaving twice moved the moment: %g -> %g", at, at2);
  em_local_group_release(g);
}

/* Waiting on an event: a spin first (no nap), then naps of a quarter of the wait,
** growing, never above 200 us. */
static void test_poll_nap(void) {
  CHECK(emi_poll_nap_s(0) == 0 && emi_poll_nap_s(20e-6) == 0, "no nap while spinning");
  double last = 0;
  int ok = 1;
  for (double w = 0; w < 1.0; w = w * 1.5 + 1e-6) {
    double s = emi_poll_nap_s(w);
    if (s < last || s > 200e-6 || (s > 0 && s > w)) ok = 0;
    last = s;
  }
  CHECK(ok, "naps must grow, stay at most 200 us and under the time waited");
  CHECK(emi_poll_nap_s(100e-6) > 0 && emi_poll_nap_s(100e-6) <= 50e-6, "after 100 us: %g",
        emi_poll_nap_s(100e-6));
  CHECK(emi_poll_nap_s(5.0) == 200e-6, "a long wait: %g", emi_poll_nap_s(5.0));
}

/* A failed init (an error with the communicator set, an asynchronous error, the
** time limit, a failing poll) aborts the communicator; a failed finalize too. */
static void test_nccl_no_leak(void) {
  char report[512] = "";
  int failed = emk_nccl_script_check(report, sizeof report);
  CHECK(failed == 0, "%d scripted NCCL scenarios went wrong; first: %s", failed, report);
}

static void test_nccl_without_gpu(void) {
  char err[512];
  int code = 0;
  if (emi_nccl_version(&code, err, sizeof err)) {
    char msg[300];
    snprintf(msg, sizeof msg, "NCCL ids: libnccl not loadable here: %.200s", err);
    check_skip(msg);
    return;
  }
  have_nccl = 1;
  CHECK(code >= 20000, "ncclGetVersion gave %d", code);
  unsigned char a[128], b[128], zero[128] = {0};
  CHECK(emi_nccl_unique_id(a, err, sizeof err) == EM_OK, "ncclGetUniqueId: %s", err);
  CHECK(emi_nccl_unique_id(b, err, sizeof err) == EM_OK, "ncclGetUniqueId: %s", err);
  CHECK(memcmp(a, zero, 128) != 0, "the id is all zeros");
  CHECK(memcmp(a, b, 128) != 0, "two ids are the same");
}

/* -- Threads: one local group, GPU replicas on 2 emulated devices --------------- */

enum { NT = 3, N = 1 << 16 };
typedef struct job {
  em_local_group *g;
  int rank, fails;
  unsigned char id[128];
  int id_ok;
  char backend[16];
  double sum0, sumN, gathered, scattered, cpu;
  char wrong_dev[512];
} job;

static double at(em_state *S, const em_tensor *t, int64_t i) {
  em_tensor *c = NULL;
  if (em_to(S, t, em_tensor_dtype(t), EM_CPU, &c)) return -1e300;
  double v = t_get(c, i);
  em_tensor_release(c);
  return v;
}

static void *replica(void *arg) {
  job *j = arg;
  em_state *S;
  if (em_open(&S, NULL)) { j->fails++; return NULL; }
  em_comm *c = NULL;
  int dev = j->rank % 2;
  if (em_comm_nccl(S, dev, j->g, j->rank, 30, &c)) {
    fprintf(stderr, "rank %d: %s\n", j->rank, em_errmsg(S));
    j->fails++;
    em_close(S);
    return NULL;
  }
  snprintf(j->backend, sizeof j->backend, "%s", em_comm_backend(c));
  j->id_ok = emi_comm_nccl_id(c, j->id);
  /* Ordering: the value is written by a chain of kernels still queued on the
  ** compute stream when the allreduce is submitted; only the "ready" event keeps
  ** the comm stream from copying stale memory. */
  em_tensor *t = NULL, *g = NULL, *rs = NULL, *h = NULL, *w = NULL;
  int64_t n = N;
  if (em_full(S, &n, 1, 0.0, EM_FLOAT32, dev, &t)) j->fails++;
  for (int k = 0; t && k < 20; k++) em_binary_scalar_(S, EM_ADD, t, (j->rank + 1) / 20.0);
  if (t && em_comm_allreduce(S, c, t, EM_COMM_SUM, NULL)) j->fails++;
  /* ... and the "done" event orders this kernel after the copy back */
  if (t) em_binary_scalar_(S, EM_MUL, t, 2.0);
  if (t) { j->sum0 = at(S, t, 0); j->sumN = at(S, t, N - 1); }
  int64_t one[2] = {1, 2};
  if (!em_full(S, one, 2, j->rank, EM_FLOAT64, dev, &g)) {
    em_tensor *all = NULL;
    if (em_comm_allgather(S, c, g, &all, NULL)) j->fails++;
    else { j->gathered = at(S, all, 2 * (NT - 1)); em_tensor_release(all); }
  }
  int64_t six = 2 * NT;
  if (!em_full(S, &six, 1, 1.0, EM_INT32, dev, &h)) {
    if (em_comm_reduce_scatter(S, c, h, EM_COMM_SUM, &rs, NULL)) j->fails++;
    else j->scattered = at(S, rs, 1) + 10 * em_tensor_numel(rs);
  }
  /* a CPU tensor goes through the host side of the same communicator */
  em_tensor *cpu = NULL;
  if (!em_full(S, &n, 1, 1.0, EM_FLOAT32, EM_CPU, &cpu)) {
    if (em_comm_allreduce(S, c, cpu, EM_COMM_SUM, NULL)) j->fails++;
    else j->cpu = t_get(cpu, 7);
  }
  /* a tensor on the other device is refused, naming both */
  if (!em_full(S, &n, 1, 1.0, EM_FLOAT32, 1 - dev, &w)) {
    if (em_comm_allreduce(S, c, w, EM_COMM_SUM, NULL))
      snprintf(j->wrong_dev, sizeof j->wrong_dev, "%s", em_errmsg(S));
  }
  if (em_comm_barrier(S, c, NULL)) j->fails++;
  em_tensor_release(t);
  em_tensor_release(g);
  em_tensor_release(rs);
  em_tensor_release(h);
  em_tensor_release(w);
  em_tensor_release(cpu);
  em_comm_free(c);
  em_close(S);
  return NULL;
}

static void test_threads(void) {
  job jobs[NT];
  pthread_t th[NT];
  em_local_group *g = em_local_group_new(NT);
  REQUIRE(g != NULL, "group");
  for (int r = 0; r < NT; r++) {
    memset(&jobs[r], 0, sizeof jobs[r]);
    jobs[r].g = g;
    jobs[r].rank = r;
    pthread_create(&th[r], NULL, replica, &jobs[r]);
  }
  for (int r = 0; r < NT; r++) pthread_join(th[r], NULL);
  em_local_group_release(g);
  double want = 0;
  for (int r = 0; r < NT; r++) want += r + 1;
  for (int r = 0; r < NT; r++) {
    job *j = &jobs[r];
    CHECK(j->fails == 0, "rank %d: %d calls failed", r, j->fails);
    CHECK(strcmp(j->backend, "nccl") == 0, "rank %d: backend %s", r, j->backend);
    CHECK(j->id_ok == have_nccl, "rank %d: id_ok %d, libnccl %d", r, j->id_ok, have_nccl);
    CHECK(memcmp(j->id, jobs[0].id, 128) == 0, "rank %d holds another NCCL id than rank 0", r);
    CHECK_CLOSE(j->sum0, 2 * want, 1e-4);
    CHECK_CLOSE(j->sumN, 2 * want, 1e-4);
    CHECK_CLOSE(j->gathered, NT - 1, 0);
    CHECK_CLOSE(j->scattered, NT + 10 * 2, 0);
    CHECK_CLOSE(j->cpu, NT, 0);
    CHECK(chk_msg_has(j->wrong_dev, "allreduce", "nccl", j->rank % 2 ? "cuda:1" : "cuda:0",
                      j->rank % 2 ? "cuda:0" : "cuda:1", (const char *)NULL),
          "rank %d: wrong-device message \"%s\"", r, j->wrong_dev);
  }
}

static void test_errors(void) {
  em_state *S;
  REQUIRE(em_open(&S, NULL) == EM_OK, "em_open");
  em_local_group *g = em_local_group_new(1);
  em_comm *c = NULL;
  CHECK_ERR(S, em_comm_nccl(S, 5, g, 0, 5, &c), EM_ERR_DEVICE, "comm_nccl", "cuda:5");
  CHECK(c == NULL, "no communicator on failure");
  /* a world of one: collectives are copies, on the device (the last one) */
  int dev = em_cuda_device_count(S) - 1;
  REQUIRE_OK(S, em_comm_nccl(S, dev, g, 0, 5, &c));
  em_tensor *t = NULL;
  int64_t n = 4;
  REQUIRE_OK(S, em_full(S, &n, 1, 3.0, EM_FLOAT32, dev, &t));
  CHECK_OK(S, em_comm_allreduce(S, c, t, EM_COMM_MEAN, NULL));
  CHECK_CLOSE(at(S, t, 3), 3, 0);
  em_tensor_release(t);
  em_comm_free(c);
  em_local_group_release(g);
  em_close(S);
}

/* -- A stuck device ----------------------------------------------------------------
** Replica 0's compute stream is held by a host function that sleeps 3 s (as a GPU
** that stopped), so the "ready" mark of its allreduce is not reached: its comm
** thread gives up after the 1 s timeout and fails, naming the device, and replica
** 1, waiting for it in the collective, fails with "replica 0 failed: ..." --
** both well before the device would have come back. Reaches the device's stream
** through the backend's own header (the test links libember.a). */
#include "../../kernels/cuda.h"
#include <time.h>

static void sleep_3s(void *ud) {
  (void)ud;
  struct timespec ts = {3, 0};
  nanosleep(&ts, NULL);
}

typedef struct stuck_job {
  em_local_group *g;
  int rank;
  double secs;
  char msg[512];
} stuck_job;

static void *stuck_replica(void *arg) {
  stuck_job *j = arg;
  em_state *S;
  if (em_open(&S, NULL)) return NULL;
  em_comm *c = NULL;
  em_tensor *t = NULL;
  int64_t n = 256;
  /* replica 1 waits longer, so that the failure it reports is replica 0's */
  if (em_comm_nccl(S, j->rank, j->g, j->rank, j->rank == 0 ? 1.0 : 2.5, &c) ||
      em_full(S, &n, 1, 1.0, EM_FLOAT32, j->rank, &t)) {
    snprintf(j->msg, sizeof j->msg, "setup: %s", em_errmsg(S));
    em_close(S);
    return NULL;
  }
  if (j->rank == 0) {
    emk_cuda *cu = emk_ctx(S);
    cu->rt->ops->host_callback(cu->rt, cu->dev[0]->compute, sleep_3s, NULL);
  }
  double t0 = em_profile_clock();
  if (em_comm_allreduce(S, c, t, EM_COMM_SUM, NULL))
    snprintf(j->msg, sizeof j->msg, "%s", em_errmsg(S));
  j->secs = em_profile_clock() - t0;
  em_tensor_release(t);
  em_comm_free(c);
  em_close(S);
  return NULL;
}

static void test_stuck_device(void) {
  stuck_job jobs[2];
  pthread_t th[2];
  em_local_group *g = em_local_group_new(2);
  for (int r = 0; r < 2; r++) {
    memset(&jobs[r], 0, sizeof jobs[r]);
    jobs[r].g = g;
    jobs[r].rank = r;
    pthread_create(&th[r], NULL, stuck_replica, &jobs[r]);
  }
  for (int r = 0; r < 2; r++) pthread_join(th[r], NULL);
  em_local_group_release(g);
  for (int r = 0; r < 2; r++) {
    CHECK(chk_msg_has(jobs[r].msg, "replica 0 failed", "timed out after 1 s", "cuda:0 did not "
                      "finish", (const char *)NULL), "rank %d: \"%s\"", r, jobs[r].msg);
    CHECK(jobs[r].secs < 2.9, "rank %d waited %.2f s (the device came back at 3 s)", r,
          jobs[r].secs);
  }
}

/* -- MPI: the same program under mpirun -np 2 ------------------------------------- */

static int rank_main(void) {
  em_state *S;
  if (em_open(&S, NULL)) return 1;
  int rank = 0;
  em_mpi_launched(&rank, NULL);
  em_comm *c = NULL;
  if (em_comm_nccl(S, rank % 2, NULL, 0, 30, &c)) {
    printf("rank %d: em_comm_nccl: %s\n", rank, em_errmsg(S));
    return 1;
  }
  unsigned char id[128] = {0};
  int ok = emi_comm_nccl_id(c, id);
  /* every rank's id, gathered through the communicator itself (CPU tensors) */
  int64_t n[2] = {1, 32};
  em_tensor *mine = NULL, *all = NULL, *d = NULL, *back = NULL;
  int bad = em_full(S, n, 2, 0, EM_INT32, EM_CPU, &mine) != EM_OK;
  if (!bad) memcpy(em_tensor_data(mine), id, 128);
  bad = bad || em_comm_allgather(S, c, mine, &all, NULL);
  int same = !bad && memcmp(em_tensor_data(all), (char *)em_tensor_data(all) + 128, 128) == 0;
  /* and a device allreduce, staged through MPI */
  int64_t k = 1000;
  bad = bad || em_full(S, &k, 1, rank + 1, EM_FLOAT32, rank % 2, &d) ||
        em_comm_allreduce(S, c, d, EM_COMM_SUM, NULL) ||
        em_to(S, d, EM_FLOAT32, EM_CPU, &back);
  double v = bad ? -1 : t_get(back, 999);
  printf("rank %d backend %s id_ok %d ids_agree %d value %g bad %d\n", rank,
         em_comm_backend(c), ok, same, v, bad);
  em_tensor_release(mine);
  em_tensor_release(all);
  em_tensor_release(d);
  em_tensor_release(back);
  em_comm_free(c);
  em_close(S);
  return bad;
}

static void test_mpi(const char *self) {
  if (getenv("EMBER_TEST_NO_MPI") || system("command -v mpirun > /dev/null 2>&1") != 0) {
    check_skip(getenv("EMBER_TEST_NO_MPI") ? "mpirun runs: EMBER_TEST_NO_MPI is set"
                                           : "mpirun runs: no mpirun (Debian: openmpi-bin)");
    return;
  }
  /* the children's leak report would list libmpi's and libnccl's own allocations */
  setenv("ASAN_OPTIONS", "detect_leaks=0", 1);
  char cmd[2048];
  snprintf(cmd, sizeof cmd, "OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 "
           "timeout -k 5 120 mpirun --oversubscribe --bind-to none --mca btl self,vader,tcp "
           "--mca btl_tcp_if_include lo --mca oob_tcp_if_include lo -np 2 '%s' 2>&1", self);
  FILE *p = popen(cmd, "r");
  REQUIRE(p != NULL, "popen");
  char line[1024], out[8192] = "";
  while (fgets(line, sizeof line, p)) strncat(out, line, sizeof out - strlen(out) - 1);
  int rc = pclose(p);
  char want[128];
  int ok = rc == 0;
  for (int r = 0; r < 2; r++) {
    snprintf(want, sizeof want, "rank %d backend nccl id_ok %d ids_agree 1 value 3 bad 0", r,
             have_nccl);
    ok &= strstr(out, want) != NULL;
  }
  CHECK(ok, "mpirun -np 2: status %d, output:\n%s", rc, out);
}

int main(int argc, char **argv) {
  (void)argc;
  if (!getenv("EMBER_TEST_REAL_CUDA")) setenv("EMBER_CUDA_EMULATE", "2:64", 1);
  if (em_mpi_launched(NULL, NULL)) return rank_main();
  RUN(test_nccl_without_gpu);
  RUN(test_nccl_no_leak);
  RUN(test_nccl_peer_left);
  RUN(test_poll_nap);
  /* On real GPUs (EMBER_TEST_REAL_CUDA) NCCL refuses two ranks on one device, and
  ** the threads, stuck-device and MPI tests put ranks r and r + 2 on device r % 2:
  ** they need NT devices there; a world of one (test_errors) runs on any GPU. */
  int gpus = NT;
  if (getenv("EMBER_TEST_REAL_CUDA")) {
    em_state *S;
    gpus = 0;
    if (em_open(&S, NULL) == EM_OK) { gpus = em_cuda_device_count(S); em_close(S); }
  }
  if (gpus >= NT) RUN(test_threads);
  RUN(test_errors);
  if (gpus >= NT) {
    RUN(test_stuck_device);
    char self[1024];
    ssize_t len = readlink("/proc/self/exe", self, sizeof self - 1);
    self[len > 0 ? len : 0] = 0;
    RUN(test_mpi, len > 0 ? self : argv[0]);
  } else {
    char msg[160];
    snprintf(msg, sizeof msg, "threads, stuck device, MPI: %d GPU%s here; NCCL takes one per "
             "rank, these need %d", gpus, gpus == 1 ? "" : "s", NT);
    check_skip(msg);
  }
  return check_done();
}

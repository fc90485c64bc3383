/*
** replicas.h -- local replicas as threads of one test program, for the tests of
** the local communicator (test_comm*.c): each replica opens its own em_state,
** joins one em_local_group and runs the test's scenario; the main thread checks
** what they recorded after the join, because the harness's counters are not
** thread-safe.
**
** A scenario is one function; a test is a run and its checks:
**
**     static em_status scenario(em_state *S, em_comm *c, replica *rp) {
**       ... rp->rank, rp->size, rp->mode; replica_bad(rp, ...) on a wrong value,
**       rp->checks++ on each value compared ...
**     }
**     static void test_x(void) {
**       replica reps[3];
**       RUN_REPLICAS(3, 0, 60, scenario, reps);     (3 replicas, mode 0, 60 s timeout)
**       CHECK_REPLICAS(reps, 3, -1, 10);            (all ok, 10 values compared each)
**     }
**
** A test that records more per replica defines its own record with a replica
** as the first member (so a pointer to it is a pointer to its replica); the
** macros take an array of either.
*/
#ifndef EMBER_TEST_REPLICAS_H
#define EMBER_TEST_REPLICAS_H

#include "check.h"
#include <pthread.h>
#include <string.h>
#include <time.h>

enum { REPLICAS_MAX = 8 };

typedef struct replica {
  int rank, size, mode;            /* this replica, how many there are, the scenario */
  em_local_group *g;
  double timeout;                  /* the communicator's, in seconds */
  em_status st;                    /* what the scenario returned */
  char msg[512];                   /* the first error's message (a scenario may set it) */
  double secs;                     /* how long the scenario ran */
  int bad;                         /* wrong values found in the thread */
  char why[256];                   /* the first of them */
  int checks;                      /* values compared (so a test sees they were) */
} replica;

typedef em_status (*replica_fn)(em_state *S, em_comm *c, replica *rp);

/* Records a wrong value; the first one is described in rp->why. */
static inline void replica_bad(replica *rp, const char *what, int64_t i, double got,
                               double want) {
  if (rp->bad++ == 0)
    snprintf(rp->why, sizeof rp->why, "%s [%lld]: got %g, want %g", what, (long long)i, got,
             want);
}

static inline double replica_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* The records are the test's, `stride` bytes apart, each starting with a replica. */
static inline replica *replica_at(void *jobs, size_t stride, int r) {
  return (replica *)((char *)jobs + (size_t)r * stride);
}

typedef struct replica_thread {
  replica *rp;
  replica_fn fn;
} replica_thread;

static void *replica_main(void *arg) {
  replica_thread *t = arg;
  replica *rp = t->rp;
  em_config cfg;
  em_config_init(&cfg);
  cfg.num_threads = 1;             /* the replicas share the machine's cores */
  em_state *S;
  if (em_open(&S, &cfg)) {
    rp->st = EM_ERR_NOMEM;
    snprintf(rp->msg, sizeof rp->msg, "em_open failed");
    return NULL;
  }
  em_comm *c = NULL;
  rp->st = em_comm_local(S, rp->g, rp->rank, rp->timeout, &c);
  if (!rp->st) {
    double t0 = replica_now();
    rp->st = t->fn(S, c, rp);
    rp->secs = replica_now() - t0;
  }
  if (rp->st && !rp->msg[0]) snprintf(rp->msg, sizeof rp->msg, "%s", em_errmsg(S));
  em_comm_free(c);
  em_close(S);
  return NULL;
}

/* Runs scenario `mode` on n replicas of a new local group whose communicators
** time out after `timeout` seconds, and joins them. The records are zeroed first,
** so that nothing of an earlier run shows through. */
static inline void replicas_run(int n, int mode, double timeout, replica_fn fn, void *jobs,
                                size_t stride) {
  if (n < 1 || n > REPLICAS_MAX) {
    chk_report(0, __FILE__, __LINE__, "1 <= n <= REPLICAS_MAX", "%d replicas", n);
    return;
  }
  em_local_group *g = em_local_group_new(n);
  pthread_t th[REPLICAS_MAX];
  replica_thread rt[REPLICAS_MAX];
  memset(jobs, 0, (size_t)n * stride);
  for (int r = 0; r < n; r++) {
    replica *rp = replica_at(jobs, stride, r);
    *rp = (replica){.rank = r, .size = n, .mode = mode, .g = g, .timeout = timeout};
    rt[r] = (replica_thread){rp, fn};
  }
  /* a thread that cannot start fails its replica, so that the others stop
  ** waiting for it */
  int started = 0;
  for (; started < n; started++)
    if (pthread_create(&th[started], NULL, replica_main, &rt[started])) break;
  for (int r = started; r < n; r++) {
    replica *rp = replica_at(jobs, stride, r);
    rp->st = EM_ERR_IO;
    snprintf(rp->msg, sizeof rp->msg, "pthread_create failed");
    em_local_group_abort(g, r, "its thread did not start");
  }
  for (int r = 0; r < started; r++) pthread_join(th[r], NULL);
  em_local_group_release(g);
}
/* The same for an array of records (replicas, or a test's own records). */
#define RUN_REPLICAS(n, mode, timeout, fn, jobs) \
  replicas_run((n), (mode), (timeout), (fn), (jobs), sizeof *(jobs))

/* Each replica but `skip` (-1: none) ended with EM_OK and found no wrong value,
** and, where min_checks > 0, compared at least that many. */
static inline void replicas_check_at(const char *file, int line, void *jobs, size_t stride,
                                     int n, int skip, int min_checks) {
  for (int r = 0; r < n; r++) {
    if (r == skip) continue;
    const replica *rp = replica_at(jobs, stride, r);
    chk_report(rp->st == EM_OK, file, line, "st == EM_OK", "mode %d, replica %d of %d: %s",
               rp->mode, r, n, rp->msg);
    chk_report(rp->bad == 0, file, line, "bad == 0",
               "mode %d, replica %d of %d: %d wrong values, first %s", rp->mode, r, n, rp->bad,
               rp->why);
    if (min_checks > 0)
      chk_report(rp->checks >= min_checks, file, line, "checks >= min_checks",
                 "mode %d, replica %d of %d compared %d values, want %d or more", rp->mode, r,
                 n, rp->checks, min_checks);
  }
}
#define CHECK_REPLICAS(jobs, n, skip, min_checks) \
  replicas_check_at(__FILE__, __LINE__, (jobs), sizeof *(jobs), (n), (skip), (min_checks))

#endif

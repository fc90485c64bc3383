/*
** replicas.c -- `ember --replicas N script.lua [args]`: the script runs as N
** replicas of em.distribute, each a thread of this process with its own LuaJIT
** state and em_state, joined by one local group (core/dist/local.c).
**
** Threads. The machine's cores are shared out: each replica gets cores / N
** intra-op threads (at least 1; EMBER_NUM_THREADS overrides), and OpenBLAS,
** whose thread count is process-wide, is pinned once to that count so that the
** replicas do not set it back and forth under each other.
**
** Failure never hangs. A replica whose script fails marks the group failed with
** its message: every other replica's pending or next collective then fails with
** "replica K failed: <message>", so they end too. A replica that hangs is found
** by the others' collective timeout, which fails the group the same way. Once a
** replica has failed, the others get EMBER_REPLICA_GRACE seconds (default 10) to
** end; a replica still running then (stuck outside any collective) cannot be
** stopped from outside its thread, so the process exits -- no thread is left
** behind either way. The exit status is 1 after any failure, with the root
** cause -- the group's first failure -- as the last line on stderr.
**
** Exits. os.exit(code) ends its own replica only (main.c). A replica that ends
** without failing -- its script returned, or os.exit(0) -- leaves the group: the
** others go on, and one that then needs it in a collective fails with "replica K
** exited". os.exit with another code is that replica's failure. The process's
** exit status is the worst (largest) of the replicas'.
*/
#include "host.h"
#include "ember.h"
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

typedef struct replica_thread {
  ember_replica r;
  int argc;
  char **argv;
  opts *o;
  pthread_t thread;
  int status;
  int done;                 /* under mu */
  int created;
  char failure[1024];
} replica_thread;

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cv = PTHREAD_COND_INITIALIZER;
static int first_failed = -1;     /* rank of the first replica that failed */

static void *replica_main(void *arg) {
  replica_thread *t = arg;
  t->status = ember_host_run(t->argc, t->argv, t->o, &t->r, t->failure, sizeof t->failure);
  pthread_mutex_lock(&mu);
  if (t->status) {
    if (!t->failure[0]) snprintf(t->failure, sizeof t->failure, "exited with status %d", t->status);
    em_local_group_abort(t->r.group, t->r.rank, t->failure);
    if (first_failed < 0) first_failed = t->r.rank;
  } else {
    em_local_group_leave(t->r.group, t->r.rank);   /* a collective needing it now fails */
  }
  t->done = 1;
  pthread_cond_broadcast(&cv);
  pthread_mutex_unlock(&mu);
  return NULL;
}

static int cores(void) {
  long c = sysconf(_SC_NPROCESSORS_ONLN);
  return c > 0 ? (int)c : 1;
}

static double env_seconds(const char *name, double dflt) {
  const char *v = getenv(name);
  char *end;
  double x = v ? strtod(v, &end) : 0;
  return v && end != v && x >= 0 ? x : dflt;
}

int ember_replicas_main(int argc, char **argv, opts *o, const char *progname) {
  int n = o->replicas;
  if (!o->script && !o->has_e) {
    fprintf(stderr, "%s: --replicas needs a script (or -e code) to run\n", progname);
    return 1;
  }
  if (o->interactive) {
    fprintf(stderr, "%s: --replicas can't be combined with the REPL (-i)\n", progname);
    return 1;
  }
  int threads = 0;
  const char *env = getenv("EMBER_NUM_THREADS");
  if (env && atoi(env) > 0) threads = atoi(env);
  else threads = cores() / n > 0 ? cores() / n : 1;
  em_blas_pin_threads(threads);

  em_local_group *g = em_local_group_new(n);
  replica_thread *ts = calloc((size_t)n, sizeof *ts);
  if (!g || !ts) {
    fprintf(stderr, "%s: out of memory starting %d replicas\n", progname, n);
    return 1;
  }
  /* Ctrl-C ends the whole process (no per-replica interrupt). The replica
  ** threads inherit this mask, so SIGINT/SIGTERM arrive here only. */
  for (int k = 0; k < n; k++) {
    replica_thread *t = &ts[k];
    t->r = (ember_replica){ k, n, threads, g };
    t->argc = argc;
    t->argv = argv;
    t->o = o;
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setstacksize(&attr, 16u << 20);   /* LuaJIT and deep Lua stacks */
    int rc = pthread_create(&t->thread, &attr, replica_main, t);
    pthread_attr_destroy(&attr);
    if (rc) {
      fprintf(stderr, "%s: could not start replica %d: %s\n", progname, k, strerror(rc));
      em_local_group_abort(g, k, "its thread could not be started");
      pthread_mutex_lock(&mu);
      if (first_failed < 0) first_failed = k;
      t->status = 1;
      t->done = 1;
      snprintf(t->failure, sizeof t->failure, "its thread could not be started");
      pthread_mutex_unlock(&mu);
      continue;
    }
    t->created = 1;
  }

  /* Wait for every replica; after a failure, for at most the grace period. */
  double grace = env_seconds("EMBER_REPLICA_GRACE", 10);
  pthread_mutex_lock(&mu);
  struct timespec deadline = {0, 0};
  for (;;) {
    int running = 0;
    for (int k = 0; k < n; k++) running += !ts[k].done;
    if (!running) break;
    if (first_failed >= 0) {
      if (!deadline.tv_sec) {
        clock_gettime(CLOCK_REALTIME, &deadline);
        deadline.tv_sec += (time_t)grace;
      }
      if (pthread_cond_timedwait(&cv, &mu, &deadline) == ETIMEDOUT) break;
    } else {
      pthread_cond_wait(&cv, &mu);
    }
  }
  int stuck = 0;
  for (int k = 0; k < n; k++) stuck += !ts[k].done;
  int failed = first_failed;
  pthread_mutex_unlock(&mu);

  /* the worst of the replicas' statuses (os.exit(code) sets one's) */
  int status = failed >= 0 ? 1 : 0;
  for (int k = 0; k < n; k++)
    if (ts[k].done && ts[k].status > status) status = ts[k].status;
  if (failed >= 0) {
    fflush(stdout);
    /* The group knows the root cause (the first failure, or the timeout that
    ** found a replica missing); the first thread to end may only have heard of it. */
    char cause[1024];
    if (em_local_group_failure(g, cause, sizeof cause))
      fprintf(stderr, "%s: %s\n", progname, cause);
    else
      fprintf(stderr, "%s: replica %d failed: %s\n", progname, failed, ts[failed].failure);
    if (stuck) {
      fprintf(stderr, "%s: replica", progname);
      int first = 1;
      for (int k = 0; k < n; k++)
        if (!ts[k].done) { fprintf(stderr, "%s %d", first ? "" : ",", k); first = 0; }
      fprintf(stderr, " did not stop within %g s of the failure; exiting\n", grace);
      fflush(stderr);
      _exit(1);                /* those threads can't be joined: end the process */
    }
  }
  for (int k = 0; k < n; k++)
    if (ts[k].created) pthread_join(ts[k].thread, NULL);
  em_local_group_release(g);
  free(ts);
  return status;
}

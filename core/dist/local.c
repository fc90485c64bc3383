/*
** local.c -- the `local` communicator: replicas that are threads of one process
** (`ember --replicas N`, or a C host running its own), joined through shared
** memory.
**
** How a collective runs. Each replica's comm thread posts its work item (buffer
** pointers, kind, dtype, count) in the group's slot for its rank, then waits at
** the group's barrier. Once all N have arrived every replica can read every
** other replica's buffers, and each does 1/N of the work:
**   allreduce       replica r reduces slice r of all N inputs, in rank order, and
**                   writes the result into slice r of all N buffers;
**   broadcast       replica r copies slice r of the root's buffer to the others;
**   allgather       replica r copies its input into part r of every output;
**   reduce_scatter  replica r reduces part r of all inputs into its own output.
** A second barrier then says that nobody reads or writes a buffer any more, and
** each replica's work is done. So every byte is read once and written once per
** replica (bandwidth-optimal), no replica waits for a lock while it computes, and
** a sum is always buf0 + buf1 + ... in that order: results never depend on
** which thread came first. The last replica to arrive also checks that all N
** called the same collective with the same dtype and size.
**
** Failure. The group holds one failure message, set by the first of: a host
** reporting that its replica failed (em_local_group_abort, or em_comm_abort on
** a communicator of the group), a barrier that waited longer than the
** communicator's timeout (the message names the replicas that did not arrive and
** the collective they were missing), or replicas that called different
** collectives. Every replica waiting at a barrier wakes up, and every later
** collective fails at once with the same message.
**
** Leaving. A replica whose script ended without failing (it returned, or called
** os.exit(0)) leaves the group (em_local_group_leave): it will never arrive at a
** barrier again. That is no failure of the group -- the others may need it for
** nothing more -- but a barrier that waits for it, now or later, fails that
** replica's collective with "replica K exited" at once instead of at the
** timeout. A replica leaves only after its own collectives have finished, and
** a barrier that completed before is not affected.
**
** Point-to-point. The group holds one FIFO per ordered pair (src, dst) of
** posted items that wait for their match: src's sends to dst, or dst's recvs
** from src -- never both on one channel (comm.h), as a post first looks for a
** match at the first item of its channel in its pair's queue and only queues
** itself when there is none. The thread that
** posts the second of a matching pair copies the sender's buffer straight into
** the receiver's (one copy, no intermediate), and finishes both items; the
** k-th send of a pair so always meets the k-th recv. A pair whose dtypes or
** element counts differ fails both items with one message naming both sides.
** Each replica's comm thread polls its own pending items (p2p_progress): a
** timeout, the group's failure or a peer that left fails them, naming the peer.
*/
#include "comm.h"
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

struct em_local_group {
  int refcount;              /* atomic */
  int size;
  pthread_mutex_t mu;
  pthread_cond_t cv;
  uint64_t gen;              /* barrier generation */
  int count;                 /* arrived at the current barrier */
  em_comm_work **posted;     /* [size]: each rank's current work item */
  uint64_t *arrived_seq;     /* [size]: the last collective each rank reached */
  int failed;
  char failure[EMI_COMM_MSG];
  int left;                  /* the first replica that left (em_local_group_leave), or -1 */
  double *gone;              /* [size]: when each replica left (emi_now), 0 while here */
  em_comm_work **pq_head, **pq_tail;   /* [size * size]: pair (src, dst) at src * size + dst */
};

typedef struct local_comm {
  em_local_group *g;
} local_comm;

/* -- The group ------------------------------------------------------------------ */

em_local_group *em_local_group_new(int world_size) {
  if (world_size < 1) return NULL;
  em_local_group *g = calloc(1, sizeof *g);
  if (!g) return NULL;
  g->posted = calloc((size_t)world_size, sizeof *g->posted);
  g->arrived_seq = calloc((size_t)world_size, sizeof *g->arrived_seq);
  g->gone = calloc((size_t)world_size, sizeof *g->gone);
  g->pq_head = calloc((size_t)world_size * (size_t)world_size, sizeof *g->pq_head);
  g->pq_tail = calloc((size_t)world_size * (size_t)world_size, sizeof *g->pq_tail);
  if (!g->posted || !g->arrived_seq || !g->gone || !g->pq_head || !g->pq_tail) {
    free(g->posted);
    free(g->arrived_seq);
    free(g->gone);
    free(g->pq_head);
    free(g->pq_tail);
    free(g);
    return NULL;
  }
  g->refcount = 1;
  g->size = world_size;
  g->left = -1;
  pthread_mutex_init(&g->mu, NULL);
  pthread_cond_init(&g->cv, NULL);
  return g;
}

void em_local_group_retain(em_local_group *g) {
  if (g) emi_atomic_inc(&g->refcount);
}

void em_local_group_release(em_local_group *g) {
  if (!g || emi_atomic_dec(&g->refcount) != 0) return;
  pthread_cond_destroy(&g->cv);
  pthread_mutex_destroy(&g->mu);
  free(g->posted);
  free(g->arrived_seq);
  free(g->gone);
  free(g->pq_head);
  free(g->pq_tail);
  free(g);
}

/* Sets the group's failure under g->mu (first one wins) and wakes every waiter. */
static void group_fail_locked(em_local_group *g, const char *msg) {
  if (!g->failed) {
    snprintf(g->failure, sizeof g->failure, "%s", msg);
    g->failed = 1;
  }
  pthread_cond_broadcast(&g->cv);
}

void em_local_group_abort(em_local_group *g, int rank, const char *message) {
  if (!g) return;
  char msg[EMI_COMM_MSG];
  snprintf(msg, sizeof msg, "replica %d failed: %s", rank, message ? message : "aborted");
  pthread_mutex_lock(&g->mu);
  group_fail_locked(g, msg);
  pthread_mutex_unlock(&g->mu);
}

void em_local_group_leave(em_local_group *g, int rank) {
  if (!g) return;
  pthread_mutex_lock(&g->mu);
  if (g->left < 0) g->left = rank;
  if (rank >= 0 && rank < g->size && !g->gone[rank]) g->gone[rank] = emi_now();
  pthread_cond_broadcast(&g->cv);
  pthread_mutex_unlock(&g->mu);
}

int em_local_group_failure(em_local_group *g, char *buf, size_t size) {
  if (!g) return 0;
  pthread_mutex_lock(&g->mu);
  int failed = g->failed;
  if (failed && buf && size) snprintf(buf, size, "%s", g->failure);
  pthread_mutex_unlock(&g->mu);
  return failed;
}

/* Internal (comm.h): for communicators that wait outside this group's barriers
** (nccl.c on real GPUs). */
int emi_local_group_left(em_local_group *g, int peer, double *at) {
  int who = -1;
  if (!g) return -1;
  pthread_mutex_lock(&g->mu);
  if (peer >= 0 && peer < g->size && g->gone[peer]) who = peer;
  else if (peer < 0) who = g->left;
  if (who >= 0 && at) *at = who < g->size ? g->gone[who] : 0;
  pthread_mutex_unlock(&g->mu);
  return who;
}

/* -- Barriers ------------------------------------------------------------------------ */

static const char *op_name(em_comm_op op) {
  static const char *names[] = {"sum", "mean", "max", "min"};
  return names[op];
}

/* Called by the last replica to arrive: do all N work items describe the same
** collective? Returns 0 or writes the mismatch into msg. */
static int mismatch(em_local_group *g, char *msg) {
  const em_comm_work *a = g->posted[0];
  for (int r = 1; r < g->size; r++) {
    const em_comm_work *b = g->posted[r];
    if (b->kind == a->kind && b->dtype == a->dtype && b->count == a->count && b->op == a->op &&
        b->root == a->root)
      continue;
    char da[EMI_COMM_MSG], db[EMI_COMM_MSG];   /* descriptions are short; %.120s bounds them */
    emi_coll_describe(da, a);
    emi_coll_describe(db, b);
    snprintf(msg, EMI_COMM_MSG, "replicas called different collectives: replica 0 called %.120s "
             "(%s, root %d), replica %d called %.120s (%s, root %d); every replica must call the "
             "same collectives in the same order", da, op_name(a->op), a->root, r, db,
             op_name(b->op), b->root);
    return 1;
  }
  return 0;
}

static void timeout_message(em_local_group *g, em_comm *c, const em_comm_work *w, int phase,
                            char *msg) {
  char what[EMI_COMM_MSG];
  emi_coll_describe(what, w);
  int n = snprintf(msg, EMI_COMM_MSG, "%s timed out after %g s: ", what, c->timeout_s);
  if (phase == 1) {
    snprintf(msg + n, EMI_COMM_MSG - (size_t)n, "replicas did not finish copying out");
    return;
  }
  int missing = 0;
  for (int r = 0; r < g->size; r++) if (g->arrived_seq[r] < w->seq) missing++;
  n += snprintf(msg + n, EMI_COMM_MSG - (size_t)n, "replica%s ", missing > 1 ? "s" : "");
  int k = 0;
  for (int r = 0; r < g->size && n < EMI_COMM_MSG - 40; r++) {
    if (g->arrived_seq[r] >= w->seq) continue;
    n += snprintf(msg + n, EMI_COMM_MSG - (size_t)n, "%s%d (at collective #%llu)",
                  k++ ? ", " : "", r, (unsigned long long)g->arrived_seq[r]);
  }
  snprintf(msg + n, EMI_COMM_MSG - (size_t)n, " did not arrive");
}

/* Phase 0: arrival (posting w); phase 1: everyone is done with the buffers. */
static em_status group_barrier(em_comm *c, em_comm_work *w, int phase) {
  em_local_group *g = ((local_comm *)c->impl)->g;
  char msg[EMI_COMM_MSG];
  int gone = -1;             /* a replica this barrier would wait for in vain */
  pthread_mutex_lock(&g->mu);
  if (phase == 0) {
    g->posted[c->rank] = w;
    g->arrived_seq[c->rank] = w->seq;
  }
  if (!g->failed && !emi_comm_failed(c)) {
    uint64_t gen = g->gen;
    if (++g->count == g->size) {
      g->count = 0;
      g->gen++;
      if (phase == 0 && g->size > 1 && mismatch(g, msg)) group_fail_locked(g, msg);
      pthread_cond_broadcast(&g->cv);
    } else {
      double deadline = w->t_begin + c->timeout_s;
      struct timespec now_rt;
      clock_gettime(CLOCK_REALTIME, &now_rt);
      double wait_s = deadline - emi_now();
      double abs_s = (double)now_rt.tv_sec + now_rt.tv_nsec * 1e-9 + (wait_s > 0 ? wait_s : 0);
      struct timespec ts = {(time_t)abs_s, (long)((abs_s - (double)(time_t)abs_s) * 1e9)};
      while (g->gen == gen && !g->failed && g->left < 0 && !emi_comm_failed(c)) {
        if (pthread_cond_timedwait(&g->cv, &g->mu, &ts) == ETIMEDOUT && g->gen == gen &&
            !g->failed) {
          timeout_message(g, c, w, phase, msg);
          group_fail_locked(g, msg);
        }
      }
      if (g->gen == gen && !g->failed) gone = g->left;
    }
  }
  int gfailed = g->failed;
  if (gfailed) snprintf(msg, sizeof msg, "%s", g->failure);
  pthread_mutex_unlock(&g->mu);
  if (gfailed) {
    emi_comm_fail(c, 0, "%s", msg);
    return EM_ERR_IO;
  }
  if (gone >= 0) {
    emi_comm_fail(c, 0, "replica %d exited", gone);
    return EM_ERR_IO;
  }
  return emi_comm_failed(c) ? EM_ERR_IO : EM_OK;
}

/* -- The collectives ----------------------------------------------------------------- */

static em_status local_run(em_comm *c, em_comm_work *w) {
  em_local_group *g = ((local_comm *)c->impl)->g;
  em_status st = group_barrier(c, w, 0);
  w->t_ready = emi_now();
  if (st || w->kind == EMI_COLL_BARRIER) return st;
  int N = g->size, r = c->rank;
  size_t es = em_dtype_size(w->dtype);
  em_comm_work *const *p = g->posted;   /* stable until the second barrier */
  /* this replica's slice of an allreduce / broadcast */
  int64_t lo = w->count * r / N, hi = w->count * (r + 1) / N;
  enum { STACK = 16 };
  void *outs_s[STACK];
  const void *ins_s[STACK];
  void **outs = outs_s;
  const void **ins = ins_s;
  if (N > STACK) {
    outs = malloc(sizeof *outs * (size_t)N);
    ins = malloc(sizeof *ins * (size_t)N);
    if (!outs || !ins) {
      free(outs);
      free(ins);
      snprintf(w->errmsg, sizeof w->errmsg, "%s: out of memory", emi_coll_name(w->kind));
      emi_comm_fail(c, 1, "replica %d failed: out of memory in %s", r, emi_coll_name(w->kind));
      group_barrier(c, w, 1);
      return EM_ERR_NOMEM;
    }
  }
  switch (w->kind) {
  case EMI_COLL_ALLREDUCE:
    for (int k = 0; k < N; k++) {
      ins[k] = (const char *)p[k]->in + lo * (int64_t)es;
      outs[k] = (char *)p[k]->out + lo * (int64_t)es;
    }
    if (hi > lo) emi_reduce_buffers_to(w->dtype, w->op, outs, N, ins, N, hi - lo);
    break;
  case EMI_COLL_BROADCAST:
    for (int k = 0; k < N; k++)
      if (k != w->root && hi > lo)
        memcpy((char *)p[k]->out + lo * (int64_t)es,
               (const char *)p[w->root]->in + lo * (int64_t)es, (size_t)(hi - lo) * es);
    break;
  case EMI_COLL_ALLGATHER:
    for (int k = 0; k < N; k++)
      memcpy((char *)p[k]->out + (int64_t)r * w->count * (int64_t)es, w->in,
             (size_t)w->count * es);
    break;
  case EMI_COLL_REDUCE_SCATTER: {
    int64_t part = w->count / N;
    for (int k = 0; k < N; k++) ins[k] = (const char *)p[k]->in + (int64_t)r * part * (int64_t)es;
    emi_reduce_buffers(w->dtype, w->op, w->out, ins, N, part);
    break;
  }
  case EMI_COLL_BARRIER: case EMI_COLL_SEND: case EMI_COLL_RECV: break;
  }
  if (outs != outs_s) { free(outs); free(ins); }
  return group_barrier(c, w, 1);
}

/* -- Point-to-point ---------------------------------------------------------------- */

static void shape_str(char *buf, size_t n, const em_comm_work *w) {
  const em_tensor *t = w->in_t;
  if (!t) {                  /* a group's buffer (group.c): flat */
    snprintf(buf, n, "[%lld]", (long long)w->count);
    return;
  }
  int k = snprintf(buf, n, "[");
  for (int d = 0; d < t->ndim && k < (int)n - 24; d++)
    k += snprintf(buf + k, n - (size_t)k, "%s%lld", d ? ", " : "", (long long)t->sizes[d]);
  snprintf(buf + k, n - (size_t)k, "]");
}

/* Under g->mu: s (a send) meets r (its recv). Both have left their queue. */
static void p2p_match(em_comm_work *s, em_comm_work *r) {
  if (s->dtype != r->dtype || s->count != r->count) {
    char ss[96], rs[96];
    shape_str(ss, sizeof ss, s);
    shape_str(rs, sizeof rs, r);
    char body[EMI_COMM_MSG - 110];
    snprintf(body, sizeof body, "replica %d sent %s %s (%lld bytes) but replica %d receives "
             "into %s %s (%lld bytes); the shapes and dtypes must match", s->comm->rank,
             em_dtype_name(s->dtype), ss, (long long)(s->count * (int64_t)em_dtype_size(s->dtype)),
             r->comm->rank, em_dtype_name(r->dtype), rs,
             (long long)(r->count * (int64_t)em_dtype_size(r->dtype)));
    char ds[EMI_COMM_MSG], dr[EMI_COMM_MSG];
    snprintf(s->errmsg, sizeof s->errmsg, "%.100s: %s", emi_coll_describe(ds, s), body);
    snprintf(r->errmsg, sizeof r->errmsg, "%.100s: %s", emi_coll_describe(dr, r), body);
    emi_comm_p2p_done(s, EM_ERR_SHAPE);
    emi_comm_p2p_done(r, EM_ERR_SHAPE);
    return;
  }
  double t = emi_now();
  s->t_ready = r->t_ready = t;
  if (s->count) memcpy(r->out, s->in, (size_t)s->count * em_dtype_size(s->dtype));
  emi_comm_p2p_done(s, EM_OK);
  emi_comm_p2p_done(r, EM_OK);
}

static em_status local_p2p_post(em_comm *c, em_comm_work *w) {
  em_local_group *g = ((local_comm *)c->impl)->g;
  int send = w->kind == EMI_COLL_SEND;
  size_t pair = send ? (size_t)c->rank * (size_t)g->size + (size_t)w->peer
                     : (size_t)w->peer * (size_t)g->size + (size_t)c->rank;
  pthread_mutex_lock(&g->mu);
  /* the pair's queue may hold several channels: the first item of w's one */
  em_comm_work *prev = NULL, *h = g->pq_head[pair];
  while (h && h->chan != w->chan) { prev = h; h = h->p2p_next; }
  if (h && (h->kind == EMI_COLL_SEND) != send) {        /* its match waits */
    if (prev) prev->p2p_next = h->p2p_next;
    else g->pq_head[pair] = h->p2p_next;
    if (g->pq_tail[pair] == h) g->pq_tail[pair] = prev;
    h->p2p_next = NULL;
    if (send) p2p_match(w, h);
    else p2p_match(h, w);
  } else {
    w->p2p_next = NULL;
    if (g->pq_tail[pair]) g->pq_tail[pair]->p2p_next = w;
    else g->pq_head[pair] = w;
    g->pq_tail[pair] = w;
  }
  pthread_mutex_unlock(&g->mu);
  return EM_OK;
}

/* Under g->mu: why w (this replica's, pending) must fail now, or 0. */
static int p2p_why(em_local_group *g, em_comm *c, em_comm_work *w, int stopping, double now,
                   char *msg) {
  char what[EMI_COMM_MSG];
  emi_coll_describe(what, w);
  if (g->failed) {
    snprintf(msg, EMI_COMM_MSG, "%.200s: %.280s", what, g->failure);
  } else if (emi_comm_failed(c)) {
    pthread_mutex_lock(&c->mu);
    snprintf(msg, EMI_COMM_MSG, "%.200s: %.280s", what, c->failure);
    pthread_mutex_unlock(&c->mu);
  } else if (g->gone[w->peer]) {
    snprintf(msg, EMI_COMM_MSG, "%.200s: replica %d exited", what, w->peer);
  } else if (now - w->t_begin > c->timeout_s) {
    snprintf(msg, EMI_COMM_MSG, "%.200s timed out after %g s: replica %d did not %s", what,
             c->timeout_s, w->peer, w->kind == EMI_COLL_SEND ? "receive it" : "send");
  } else if (stopping) {
    snprintf(msg, EMI_COMM_MSG, "%.200s: the communicator was freed before replica %d %s",
             what, w->peer, w->kind == EMI_COLL_SEND ? "received it" : "sent");
  } else {
    return 0;
  }
  return 1;
}

static void local_p2p_progress(em_comm *c, int stopping) {
  em_local_group *g = ((local_comm *)c->impl)->g;
  int N = g->size, r = c->rank;
  double now = emi_now();
  pthread_mutex_lock(&g->mu);
  for (int peer = 0; peer < N; peer++) {
    if (peer == r) continue;
    /* this replica's sends wait in (r, peer), its recvs in (peer, r) */
    for (int dir = 0; dir < 2; dir++) {
      size_t pair = dir == 0 ? (size_t)r * (size_t)N + (size_t)peer
                             : (size_t)peer * (size_t)N + (size_t)r;
      emi_coll_kind mine = dir == 0 ? EMI_COLL_SEND : EMI_COLL_RECV;
      em_comm_work *prev = NULL, *w = g->pq_head[pair];
      while (w) {
        em_comm_work *next = w->p2p_next;
        char msg[EMI_COMM_MSG];
        if (w->kind == mine && w->comm == c && p2p_why(g, c, w, stopping, now, msg)) {
          if (prev) prev->p2p_next = next;
          else g->pq_head[pair] = next;
          if (g->pq_tail[pair] == w) g->pq_tail[pair] = prev;
          snprintf(w->errmsg, sizeof w->errmsg, "%s", msg);
          emi_comm_p2p_done(w, EM_ERR_IO);
        } else {
          prev = w;
        }
        w = next;
      }
    }
  }
  pthread_mutex_unlock(&g->mu);
}

static void local_abort_notify(em_comm *c, int own) {
  em_local_group *g = ((local_comm *)c->impl)->g;
  pthread_mutex_lock(&g->mu);
  if (own) {
    char msg[EMI_COMM_MSG];
    pthread_mutex_lock(&c->mu);
    snprintf(msg, sizeof msg, "%s", c->failure);
    pthread_mutex_unlock(&c->mu);
    group_fail_locked(g, msg);
  } else {
    pthread_cond_broadcast(&g->cv);
  }
  pthread_mutex_unlock(&g->mu);
}

static void local_destroy(em_comm *c) {
  local_comm *lc = c->impl;
  em_local_group_release(lc->g);
  free(lc);
}

static const emi_comm_backend local_backend = {
  .name = "local",
  .run = local_run,
  .abort_notify = local_abort_notify,
  .p2p_post = local_p2p_post,
  .p2p_progress = local_p2p_progress,
  .p2p_any_thread = 1,
  .destroy = local_destroy,
};

em_status em_comm_local(em_state *S, em_local_group *g, int rank, double timeout_s,
                        em_comm **out) {
  if (!out) return emi_error(S, EM_ERR_ARG, "comm_local: NULL output");
  *out = NULL;
  if (!g) return emi_error(S, EM_ERR_ARG, "comm_local: NULL group");
  if (rank < 0 || rank >= g->size)
    return emi_error(S, EM_ERR_ARG, "comm_local: rank %d is not in a group of %d replicas",
                     rank, g->size);
  local_comm *lc = calloc(1, sizeof *lc);
  if (!lc) return emi_error(S, EM_ERR_NOMEM, "comm_local: out of memory");
  lc->g = g;
  em_local_group_retain(g);
  em_status st = emi_comm_new(S, &local_backend, lc, rank, g->size, timeout_s, out);
  if (st) {
    em_local_group_release(g);
    free(lc);
  }
  return st;
}

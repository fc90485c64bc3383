/*
** nccl_emu.c -- a stand-in NCCL for emulated devices (EMBER_NCCL_EMULATE=1
** under EMBER_CUDA_EMULATE), so that the nccl communicator's real path
** (core/dist/nccl.c: one collective per NCCL group, sends and recvs grouped on
** a second communicator, the abort at the failure, the tensors held after it,
** a replica that left) runs in CI, where no GPU is. kernels/services.c sends
** its collective entries (coll_init, group, issue, async_error, free) here in
** that mode, in place of kernels/real/nccl_real.c; the seam is the same
** emk_nccl_* shape, so nccl.c and commdev.c do not know which one runs.
**
** Ranks are threads of one process (ember --replicas N --devices cuda:0,...):
** a process-wide registry of "worlds", keyed by the 128-byte unique id, holds
** each communicator's ranks. The id names the process that made it, so under
** mpirun a rank of another process refuses at once instead of waiting for
** peers it cannot meet (rank 0's own init then ends at its timeout). What it
** keeps strict, because NCCL is:
**   - init is a rendezvous of nranks ranks, bounded by the timeout; two ranks
**     on one device are refused with NCCL's words ("Duplicate GPU detected:
**     rank R and rank Q both on CUDA device D"), on both ranks;
**   - calls between group start and end are planned as a whole: at group end
**     the group becomes one work item on the stream its calls name (all of a
**     group's calls name one stream; ember's do), so it runs in stream order
**     after what was queued before it, as NCCL's kernel does;
**   - collectives match across ranks by sequence (the k-th group with
**     collectives meets every rank's k-th); the last rank to arrive compares
**     the groups' compositions -- number, kinds, dtypes, counts, ops, roots --
**     and only if all agree computes every rank's output (all inputs are
**     still: every other rank's stream is blocked in its item). A difference
**     is reported through async_error, and no data moves: NCCL would hang or
**     mix data, the stand-in says why instead;
**   - a send matches the peer's recv by per-pair order and blocks its stream
**     until that recv is issued (and a recv until the send): a ring whose
**     ranks all send first deadlocks on the device as it does with NCCL (for
**     messages past its eager buffer); within one group sends and recvs are
**     posted together, so a group {send, recv} completes. The two sides' sizes
**     are compared (NCCL does not): a difference is an error, not a copy;
**   - a work item that failed (a mismatch, the timeout) stays blocked like a
**     stuck kernel, with the error in async_error, until the communicator is
**     aborted -- so the caller sees the error before the "done" event, as with
**     NCCL. Abort unblocks every item of that rank at once. Every wait is
**     bounded: an item gives up after twice the timeout whatever happens, so
**     a test never hangs.
** One mutex and one condition variable serve the whole registry: the
** stand-in moves test-sized data, and one lock keeps its matching simple.
*/
#include "../runtime.h"
#include "backend.h"
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

enum { ID_BYTES = 128, MSG = 400, GROUP_MAX = 64 };

/* -- The registry -------------------------------------------------------------------- */

typedef struct call {
  int kind, dtype, op, peer;
  const void *in;
  void *out;
  int64_t count;
} call;

typedef struct p2p_op {        /* a posted send or recv, not yet matched */
  int send, src, dst, done, failed;
  const void *in;
  void *out;
  size_t bytes;
  struct p2p_op *next;
} p2p_op;

typedef struct cslot {         /* the k-th group with collectives, across ranks */
  unsigned long long seq;
  int arrived, left, done, broken, failed;
  call *calls[EMK_MAX_DEVICES];
  int ncalls[EMK_MAX_DEVICES];
  struct cslot *next;
} cslot;

typedef struct world {
  unsigned char id[ID_BYTES];
  int nranks, joined, refs;
  int dev[EMK_MAX_DEVICES];
  int present[EMK_MAX_DEVICES];
  char err[MSG];               /* the whole communicator's failure (init, a mismatch) */
  p2p_op **sends, **recvs;     /* unmatched, per ordered pair src * nranks + dst */
  cslot *slots;
  struct world *next;
} world;

typedef struct emk_nccl_emu {
  world *w;
  emk_runtime *rt;
  int rank, dev, depth, aborted, pending;
  double timeout_s;
  call group[GROUP_MAX];
  int ngroup;
  unsigned long long cseq;     /* groups with collectives issued so far */
  emk_stream *gstream;
  char err[MSG];               /* this rank's own failure (a timeout) */
} emk_nccl_emu;

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cv;
static pthread_once_t cv_once = PTHREAD_ONCE_INIT;
static world *worlds;

static void cv_init(void) {
  pthread_condattr_t a;
  pthread_condattr_init(&a);
  pthread_condattr_setclock(&a, CLOCK_MONOTONIC);
  pthread_cond_init(&cv, &a);
  pthread_condattr_destroy(&a);
}

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + t.tv_nsec * 1e-9;
}

/* Waits on cv (mu held) until `until` at the latest; short naps keep the
** timeouts prompt even when nobody signals. */
static void wait_until(double until) {
  double t = now() + 0.05;
  if (t > until) t = until;
  struct timespec ts = {(time_t)t, (long)((t - (double)(time_t)t) * 1e9)};
  pthread_cond_timedwait(&cv, &mu, &ts);
}

int emk_nccl_emu_on(void) {
  const char *e = getenv("EMBER_NCCL_EMULATE"), *c = getenv("EMBER_CUDA_EMULATE");
  return e && strcmp(e, "1") == 0 && c && *c;
}

/* A unique id: a prefix that says whose, the process that made it (its ranks
** must be threads of that process), a process-wide counter and the time. */
em_status emk_nccl_emu_unique_id(unsigned char id[ID_BYTES]) {
  static unsigned long long counter;
  memset(id, 0, ID_BYTES);
  memcpy(id, "ember-nccl-emu", 14);
  pthread_mutex_lock(&mu);
  unsigned long long k = ++counter;
  pthread_mutex_unlock(&mu);
  double t = now();
  long pid = (long)getpid();
  memcpy(id + 16, &k, sizeof k);
  memcpy(id + 32, &t, sizeof t);
  memcpy(id + 48, &pid, sizeof pid);
  return EM_OK;
}

static void world_unref(world *w) {
  if (--w->refs > 0) return;
  for (world **pp = &worlds; *pp; pp = &(*pp)->next)
    if (*pp == w) { *pp = w->next; break; }
  for (cslot *s = w->slots, *n; s; s = n) {
    n = s->next;
    for (int r = 0; r < w->nranks; r++) free(s->calls[r]);
    free(s);
  }
  free(w->sends);
  free(w->recvs);
  free(w);
}

/* -- Init: the rendezvous ---------------------------------------------------------------- */

em_status emk_nccl_emu_init(emk_runtime *rt, int dev, const unsigned char *id, int rank,
                            int nranks, double timeout_s, emk_nccl_emu **out, char *err,
                            size_t errlen) {
  pthread_once(&cv_once, cv_init);
  *out = NULL;
  if (nranks < 1 || nranks > EMK_MAX_DEVICES || rank < 0 || rank >= nranks)
    return emk_errf(err, errlen, EM_ERR_ARG, "NCCL stand-in (cuda:%d): rank %d of %d ranks "
                    "(at most %d)", dev, rank, nranks, EMK_MAX_DEVICES);
  long pid;
  memcpy(&pid, id + 48, sizeof pid);
  if (memcmp(id, "ember-nccl-emu", 14) || pid != (long)getpid())
    /* mpirun's processes: the registry is this process's alone, so a rank
    ** refuses at once rather than wait out the timeout for peers it cannot meet */
    return emk_errf(err, errlen, EM_ERR_UNSUPPORTED, "NCCL stand-in (cuda:%d): its ranks are "
                    "threads of one process (ember --replicas N); the id comes from %s", dev,
                    memcmp(id, "ember-nccl-emu", 14) ? "elsewhere (not the stand-in)"
                                                      : "another process");
  emk_nccl_emu *n = calloc(1, sizeof *n);
  if (!n) return emk_errf(err, errlen, EM_ERR_NOMEM, "NCCL stand-in: out of memory");
  n->rt = rt;
  n->rank = rank;
  n->dev = dev;
  n->timeout_s = timeout_s;
  pthread_mutex_lock(&mu);
  world *w = worlds;
  while (w && memcmp(w->id, id, ID_BYTES)) w = w->next;
  if (!w) {
    w = calloc(1, sizeof *w);
    if (w) {
      w->sends = calloc((size_t)nranks * nranks, sizeof *w->sends);
      w->recvs = calloc((size_t)nranks * nranks, sizeof *w->recvs);
    }
    if (!w || !w->sends || !w->recvs) {
      if (w) { free(w->sends); free(w->recvs); free(w); }
      pthread_mutex_unlock(&mu);
      free(n);
      return emk_errf(err, errlen, EM_ERR_NOMEM, "NCCL stand-in: out of memory");
    }
    memcpy(w->id, id, ID_BYTES);
    w->nranks = nranks;
    w->next = worlds;
    worlds = w;
  }
  w->refs++;
  em_status st = EM_OK;
  if (w->nranks != nranks) {
    st = emk_errf(err, errlen, EM_ERR_ARG, "NCCL stand-in (cuda:%d): rank %d says %d ranks, "
                  "the others %d", dev, rank, nranks, w->nranks);
  } else if (w->present[rank]) {
    st = emk_errf(err, errlen, EM_ERR_ARG, "NCCL stand-in (cuda:%d): rank %d joined twice",
                  dev, rank);
  } else {
    /* NCCL's check, in its words: two ranks of a communicator on one GPU */
    for (int q = 0; q < nranks && !w->err[0]; q++)
      if (w->present[q] && w->dev[q] == dev)
        snprintf(w->err, sizeof w->err, "Duplicate GPU detected: rank %d and rank %d both on "
                 "CUDA device %d", rank, q, dev);
    w->present[rank] = 1;
    w->dev[rank] = dev;
    w->joined++;
    pthread_cond_broadcast(&cv);
    double until = now() + timeout_s;
    while (!w->err[0] && w->joined < nranks && now() < until) wait_until(until);
    if (w->err[0])
      st = emk_errf(err, errlen, EM_ERR_IO, "NCCL stand-in (cuda:%d): ncclCommInitRank: %s",
                    dev, w->err);
    else if (w->joined < nranks)
      st = emk_errf(err, errlen, EM_ERR_IO, "NCCL stand-in (cuda:%d): ncclCommInitRank did not "
                    "complete within %g s (%d of %d ranks joined)", dev, timeout_s, w->joined,
                    nranks);
    if (st && !w->err[0])   /* the others do not wait for a rank that gave up */
      snprintf(w->err, sizeof w->err, "rank %d gave up its init", rank);
  }
  if (st) {
    world_unref(w);
    pthread_mutex_unlock(&mu);
    free(n);
    return st;
  }
  n->w = w;
  pthread_mutex_unlock(&mu);
  *out = n;
  return EM_OK;
}

/* -- The arithmetic ---------------------------------------------------------------------- */

static double get(int dt, const void *p, int64_t i) {
  switch (dt) {
  case EM_FLOAT32: return ((const float *)p)[i];
  case EM_FLOAT64: return ((const double *)p)[i];
  case EM_FLOAT16: return emi_half_to_float(((const uint16_t *)p)[i]);
  case EM_BFLOAT16: return emi_bf16_to_float(((const uint16_t *)p)[i]);
  case EM_INT32: return ((const int32_t *)p)[i];
  default: return (double)((const int64_t *)p)[i];
  }
}

static void put(int dt, void *p, int64_t i, double v) {
  switch (dt) {
  case EM_FLOAT32: ((float *)p)[i] = (float)v; break;
  case EM_FLOAT64: ((double *)p)[i] = v; break;
  case EM_FLOAT16: ((uint16_t *)p)[i] = emi_float_to_half((float)v); break;
  case EM_BFLOAT16: ((uint16_t *)p)[i] = emi_float_to_bf16((float)v); break;
  case EM_INT32: ((int32_t *)p)[i] = (int32_t)v; break;
  default: ((int64_t *)p)[i] = (int64_t)v; break;
  }
}

static int supported(int dt) {
  return dt == EM_FLOAT32 || dt == EM_FLOAT64 || dt == EM_FLOAT16 || dt == EM_BFLOAT16 ||
         dt == EM_INT32 || dt == EM_INT64;
}

/* Element i reduced over the ranks' snapshots (each `stride` elements in). */
static double reduce_at(const call *k, int nranks, void *const *snap, int64_t i) {
  double v = get(k->dtype, snap[0], i);
  for (int r = 1; r < nranks; r++) {
    double x = get(k->dtype, snap[r], i);
    if (k->op == EM_COMM_MAX) v = x > v ? x : v;
    else if (k->op == EM_COMM_MIN) v = x < v ? x : v;
    else v += x;
  }
  return k->op == EM_COMM_MEAN ? v / nranks : v;
}

/* Call j of every rank's group, all inputs first copied (in and out may alias). */
static int run_collective(world *w, cslot *s, int j) {
  int N = w->nranks;
  const call *k0 = &s->calls[0][j];
  size_t es = em_dtype_size((em_dtype)k0->dtype), in_b = (size_t)k0->count * es;
  void *snap[EMK_MAX_DEVICES] = {0};
  int ok = 1;
  for (int r = 0; r < N && ok; r++)
    if (!(snap[r] = malloc(in_b ? in_b : 1))) ok = 0;
    else memcpy(snap[r], s->calls[r][j].in, in_b);
  for (int r = 0; r < N && ok; r++) {
    const call *k = &s->calls[r][j];
    switch (k->kind) {
    case EMI_COLL_ALLREDUCE:
      for (int64_t i = 0; i < k->count; i++) put(k->dtype, k->out, i, reduce_at(k, N, snap, i));
      break;
    case EMI_COLL_BROADCAST: memcpy(k->out, snap[k->peer], in_b); break;
    case EMI_COLL_ALLGATHER:
      for (int q = 0; q < N; q++) memcpy((char *)k->out + q * in_b, snap[q], in_b);
      break;
    case EMI_COLL_REDUCE_SCATTER: {
      int64_t part = k->count / N;
      for (int64_t i = 0; i < part; i++)
        put(k->dtype, k->out, i, reduce_at(k, N, snap, r * part + i));
      break;
    }
    }
  }
  for (int r = 0; r < N; r++) free(snap[r]);
  return ok;
}

static const char *kind_name(int k) {
  static const char *names[] = {"allreduce", "broadcast", "allgather", "reduce_scatter",
                                "barrier", "send", "recv"};
  return k >= 0 && k <= EMI_COLL_RECV ? names[k] : "?";
}

static void describe(char *b, size_t n, const call *c, int nc) {
  size_t at = 0;
  b[0] = 0;
  for (int i = 0; i < nc && at + 1 < n; i++)
    at += (size_t)snprintf(b + at, n - at, "%s%s %s x%lld op %d root %d", i ? ", " : "",
                           kind_name(c[i].kind), em_dtype_name((em_dtype)c[i].dtype),
                           (long long)c[i].count, c[i].op, c[i].peer);
}

/* The last rank of slot s arrived: the same composition everywhere, or the error. */
static void complete_slot(world *w, cslot *s) {
  for (int r = 1; r < w->nranks && !w->err[0]; r++) {
    int same = s->ncalls[r] == s->ncalls[0];
    for (int j = 0; same && j < s->ncalls[0]; j++) {
      const call *a = &s->calls[0][j], *b = &s->calls[r][j];
      same = a->kind == b->kind && a->dtype == b->dtype && a->count == b->count &&
             (a->kind == EMI_COLL_ALLGATHER || a->kind == EMI_COLL_BROADCAST || a->op == b->op) &&
             (a->kind != EMI_COLL_BROADCAST || a->peer == b->peer);
    }
    if (!same) {
      char da[160], db[160];
      describe(da, sizeof da, s->calls[0], s->ncalls[0]);
      describe(db, sizeof db, s->calls[r], s->ncalls[r]);
      snprintf(w->err, sizeof w->err, "the ranks' groups differ (collective group #%llu): rank "
               "0 {%.150s}, rank %d {%.150s}; no data was moved", s->seq + 1, da, r, db);
    }
  }
  s->failed = w->err[0] != 0;
  for (int j = 0; j < s->ncalls[0] && !s->failed; j++)
    if (!run_collective(w, s, j)) {
      snprintf(w->err, sizeof w->err, "out of host memory");
      s->failed = 1;
    }
  s->done = 1;
}

/* -- Sends and recvs ---------------------------------------------------------------------- */

/* o matched with its peer's op p: the bytes move, or the sizes' error. */
static void match(world *w, p2p_op *o, p2p_op *p) {
  p2p_op *snd = o->send ? o : p, *rcv = o->send ? p : o;
  if (snd->bytes != rcv->bytes) {
    if (!w->err[0])
      snprintf(w->err, sizeof w->err, "rank %d's send of %zu bytes met rank %d's recv of %zu "
               "bytes; no data was moved", snd->src, snd->bytes, rcv->dst, rcv->bytes);
    o->failed = p->failed = 1;
  } else if (snd->bytes) memcpy(rcv->out, snd->in, snd->bytes);
  o->done = p->done = 1;
}

static void post(world *w, p2p_op *o) {
  int pair = o->src * w->nranks + o->dst;
  p2p_op **other = o->send ? &w->recvs[pair] : &w->sends[pair];
  if (*other) {
    p2p_op *p = *other;
    *other = p->next;
    p->next = NULL;
    match(w, o, p);
    return;
  }
  p2p_op **q = o->send ? &w->sends[pair] : &w->recvs[pair];
  while (*q) q = &(*q)->next;
  *q = o;
}

static void unpost(world *w, p2p_op *o) {
  if (o->done) return;
  int pair = o->src * w->nranks + o->dst;
  for (p2p_op **q = o->send ? &w->sends[pair] : &w->recvs[pair]; *q; q = &(*q)->next)
    if (*q == o) { *q = o->next; break; }
}

/* -- A group: one work item on its stream ------------------------------------------------- */

typedef struct gjob {
  emk_nccl_emu *n;
  int ncalls, ncoll;
  unsigned long long cseq;
  call calls[GROUP_MAX];
  p2p_op ops[GROUP_MAX];
} gjob;

static cslot *slot_for(world *w, unsigned long long seq) {
  cslot *s = w->slots;
  while (s && s->seq != seq) s = s->next;
  if (s) return s;
  if (!(s = calloc(1, sizeof *s))) return NULL;
  s->seq = seq;
  s->next = w->slots;
  w->slots = s;
  return s;
}

static void slot_leave(world *w, cslot *s) {
  if (!s->done) s->broken = 1;        /* a late rank must not read my buffers */
  if (++s->left < w->nranks) return;
  for (cslot **pp = &w->slots; *pp; pp = &(*pp)->next)
    if (*pp == s) { *pp = s->next; break; }
  for (int r = 0; r < w->nranks; r++) free(s->calls[r]);
  free(s);
}

/* Runs on the stream's worker: posts the group, then blocks the stream until
** every part of it completed, the communicator failed (then until the abort),
** or twice the timeout. */
static void run_group(void *ud) {
  gjob *j = ud;
  emk_nccl_emu *n = j->n;
  world *w = n->w;
  pthread_mutex_lock(&mu);
  cslot *s = NULL;
  int nops = 0;
  if (!n->aborted && !w->err[0]) {
    if (j->ncoll) {
      call *mine = malloc(sizeof(call) * (size_t)j->ncoll);
      if (!mine || !(s = slot_for(w, j->cseq))) {
        free(mine);
        snprintf(w->err, sizeof w->err, "out of host memory");
      } else {
        int c = 0;
        for (int i = 0; i < j->ncalls; i++)
          if (j->calls[i].kind != EMI_COLL_SEND && j->calls[i].kind != EMI_COLL_RECV)
            mine[c++] = j->calls[i];
        s->calls[n->rank] = mine;
        s->ncalls[n->rank] = c;
        if (++s->arrived == w->nranks && !s->broken) complete_slot(w, s);
      }
    }
    for (int i = 0; i < j->ncalls; i++) {
      const call *k = &j->calls[i];
      if (k->kind != EMI_COLL_SEND && k->kind != EMI_COLL_RECV) continue;
      p2p_op *o = &j->ops[nops++];
      o->send = k->kind == EMI_COLL_SEND;
      o->src = o->send ? n->rank : k->peer;
      o->dst = o->send ? k->peer : n->rank;
      o->in = k->in;
      o->out = k->out;
      o->bytes = (size_t)k->count * em_dtype_size((em_dtype)k->dtype);
      post(w, o);
    }
    pthread_cond_broadcast(&cv);
  }
  double t0 = now(), hard = t0 + 2 * n->timeout_s;
  for (;;) {
    /* done and not failed: this group's data moved, whatever failed since */
    int done = (!s || (s->done && !s->failed)) && (j->ncoll == 0 || s);
    for (int i = 0; i < nops && done; i++) done = j->ops[i].done && !j->ops[i].failed;
    if (n->aborted || now() >= hard) break;
    if (done && (nops || s || !w->err[0])) break;
    if (!w->err[0] && !n->err[0] && now() - t0 > n->timeout_s)
      snprintf(n->err, sizeof n->err, "a group of %d call(s) on cuda:%d did not complete "
               "within %g s (a peer did not issue its part)", j->ncalls, n->dev, n->timeout_s);
    wait_until(n->err[0] || w->err[0] ? hard : t0 + n->timeout_s + 1e-3);
  }
  for (int i = 0; i < nops; i++) unpost(w, &j->ops[i]);
  if (s) slot_leave(w, s);
  n->pending--;
  pthread_cond_broadcast(&cv);
  pthread_mutex_unlock(&mu);
  free(j);
}

em_status emk_nccl_emu_group(emk_nccl_emu *n, int start, char *err, size_t errlen) {
  if (start) {
    if (n->depth++ == 0) n->ngroup = 0;
    return EM_OK;
  }
  if (n->depth <= 0)
    return emk_errf(err, errlen, EM_ERR_ARG, "NCCL stand-in (cuda:%d): ncclGroupEnd without "
                    "ncclGroupStart", n->dev);
  if (--n->depth > 0 || n->ngroup == 0) return EM_OK;
  gjob *j = calloc(1, sizeof *j);
  if (!j) return emk_errf(err, errlen, EM_ERR_NOMEM, "NCCL stand-in: out of memory");
  j->n = n;
  j->ncalls = n->ngroup;
  memcpy(j->calls, n->group, sizeof(call) * (size_t)n->ngroup);
  for (int i = 0; i < j->ncalls; i++)
    j->ncoll += j->calls[i].kind != EMI_COLL_SEND && j->calls[i].kind != EMI_COLL_RECV;
  pthread_mutex_lock(&mu);
  if (j->ncoll) j->cseq = n->cseq++;
  n->pending++;
  pthread_mutex_unlock(&mu);
  n->ngroup = 0;
  em_status st = n->rt->ops->host_callback(n->rt, n->gstream, run_group, j);
  if (st) {
    pthread_mutex_lock(&mu);
    n->pending--;
    pthread_mutex_unlock(&mu);
    free(j);
    return emk_errf(err, errlen, st, "NCCL stand-in (cuda:%d): ncclGroupEnd: %s", n->dev,
                    n->rt->errmsg);
  }
  return EM_OK;
}

em_status emk_nccl_emu_issue(emk_nccl_emu *n, int kind, int op, em_dtype dt, const void *in,
                             void *out, int64_t count, int peer, emk_stream *s, char *err,
                             size_t errlen) {
  int p2p = kind == EMI_COLL_SEND || kind == EMI_COLL_RECV;
  if (kind < EMI_COLL_ALLREDUCE || kind > EMI_COLL_RECV || kind == EMI_COLL_BARRIER)
    return emk_errf(err, errlen, EM_ERR_ARG, "NCCL stand-in: collective %d is not run by NCCL",
                    kind);
  if (!p2p && !supported(dt))
    return emk_errf(err, errlen, EM_ERR_DTYPE, "NCCL: dtype %s is not supported",
                    em_dtype_name(dt));
  if (count < 0 || (peer < 0 && (p2p || kind == EMI_COLL_BROADCAST)) ||
      peer >= n->w->nranks || (p2p && peer == n->rank))
    return emk_errf(err, errlen, EM_ERR_ARG, "NCCL stand-in (cuda:%d): %s: peer %d of %d ranks, "
                    "%lld elements", n->dev, kind_name(kind), peer, n->w->nranks,
                    (long long)count);
  /* outside a group, a call is a group of its own (as NCCL) */
  int alone = n->depth == 0;
  if (alone) emk_nccl_emu_group(n, 1, err, errlen);
  if (n->ngroup == GROUP_MAX || (n->ngroup && s != n->gstream)) {
    if (alone) n->depth = 0;
    return emk_errf(err, errlen, EM_ERR_ARG, "NCCL stand-in (cuda:%d): a group %s", n->dev,
                    n->ngroup == GROUP_MAX ? "of more than 64 calls" : "on two streams");
  }
  n->gstream = s;
  n->group[n->ngroup++] = (call){kind, (int)dt, op, peer, in, out, count};
  return alone ? emk_nccl_emu_group(n, 0, err, errlen) : EM_OK;
}

em_status emk_nccl_emu_async_error(emk_nccl_emu *n, char *err, size_t errlen) {
  char msg[MSG] = "";
  pthread_mutex_lock(&mu);
  snprintf(msg, sizeof msg, "%s", n->w->err[0] ? n->w->err : n->err);
  pthread_mutex_unlock(&mu);
  if (!msg[0]) return EM_OK;
  return emk_errf(err, errlen, EM_ERR_IO, "NCCL stand-in (cuda:%d): asynchronous error: %s",
                  n->dev, msg);
}

/* Destroy waits for the queued groups (bounded: then it aborts, as nccl_real's
** failed finalize does); abort lets them go at once. Either way the rank's
** items have left its stream's wait before the handle goes. */
void emk_nccl_emu_free(emk_nccl_emu *n, int abort) {
  if (!n) return;
  pthread_mutex_lock(&mu);
  double until = now() + 2 * n->timeout_s + 1;
  if (abort) n->aborted = 1;
  pthread_cond_broadcast(&cv);
  while (n->pending > 0 && now() < until + 5) {
    if (now() >= until) n->aborted = 1;
    wait_until(now() >= until ? until + 5 : until);
  }
  if (n->pending > 0) {         /* an item never ran (its stream is stuck): it keeps n */
    pthread_mutex_unlock(&mu);
    return;
  }
  if (abort && !n->w->err[0])   /* the peers' waits on this rank fail, as NCCL's do */
    snprintf(n->w->err, sizeof n->w->err, "rank %d aborted its communicator", n->rank);
  world_unref(n->w);
  pthread_cond_broadcast(&cv);
  pthread_mutex_unlock(&mu);
  free(n);
}

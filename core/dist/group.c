/*
** group.c -- sub-communicators: em_comm_group makes a communicator of some of a
** communicator's replicas (a pipeline stage's data-parallel replicas, ranks
** {p, p + P, p + 2P, ...} of a world of P x D), a full em_comm with its own
** numbering, collectives, sends and recvs, work handles and failure rules.
**
** Design. A group moves no byte itself. Its collectives are ring and direct
** algorithms over the point-to-point of the communicator that carries the
** parent's sends and recvs (the "carrier": the local group's shared memory,
** MPI's Isend/Irecv, or NCCL's host communicator), so one implementation serves
** every backend, on CPU and GPU replicas alike (a group of a device
** communicator takes that device's tensors; comm.c stages them through host
** memory around run, as it does for the host backends standing in for NCCL).
** A group of a group is a group of the same carrier, its ranks translated.
**
** Channels. Point-to-point matches the k-th send of a pair with the k-th recv
** *of the same channel* (comm.h). The script's own sends are on channel 0; when
** a group is made its members agree, over the setup channel, on two channels
** that no other live group of any two of them holds: the group's collectives run
** on the first, its own sends and recvs on the second. So the group's traffic
** and the script's sends between the same two replicas never meet, in any
** interleaving. The agreement: every member sends the leader (its first rank)
** the size and a hash of its rank list and the carrier's lowest free channel; the
** leader answers every member with the largest (or which member asked for a
** different group), and each member's carrier then counts from above it.
**
** A collective. The group's comm thread runs it as run (comm.c's queue keeps
** call order), posting sends and recvs on its carrier (emi_comm_p2p_queue) and
** waiting for them; the carrier's comm thread moves them while the group's
** waits. Every collective first passes a descriptor (kind, op, root, dtype,
** count, sequence number) around the ring, each member comparing its
** predecessor's with its own, so replicas that call different collectives fail
** with a message naming both, never by mixing up bytes. Then:
**   allreduce       ring reduce-scatter then ring allgather (2 (n - 1) steps of
**                   1/n of the data each: bandwidth-optimal); chunk k is summed
**                   in the fixed order k+1, k+2, ..., k, so results do not
**                   depend on timing, and every member gets the owner's bits;
**   reduce_scatter  the first half of that, member r ending with part r;
**   allgather       the ring's second half;
**   broadcast       the root sends to every member (groups are small);
**   barrier         an allreduce of n int32.
** float16 and bfloat16 travel and add in float32 (rounded once at the end, as
** on the other backends); mean is a sum divided by n.
**
** Failure. A send or recv of the carrier that fails (a member that died,
** exited, or stayed silent past the timeout; the carrier failing) fails the
** collective and the group, naming the member in both numberings: "replica 2
** (world 5)". em_comm_abort on a group, and a descriptor mismatch, fail the
** carrier too, so every replica of the job hears it (a replica's failure ends
** the job). After a failure a transfer that MPI still holds keeps its buffers
** (they are leaked rather than freed under MPI's feet), as mpi.c does.
**
** Order. On the local carrier (threads, and emulated GPU replicas) a group's
** transfers are posted at once from the group's thread (p2p_any_thread), so a
** group collective in flight never waits for the parent's. MPI is called from
** its comm thread only, so there a group's transfers wait behind the parent's
** collectives queued before them: under MPI, a member that has a group
** collective in flight while it calls a parent collective needs the others to
** call that parent collective without first waiting for the group one. A group
** must be freed before its parent.
*/
#include "comm.h"
#include <stdio.h>
#include <stdlib.h>

typedef struct gp2p {        /* one of the group's own sends / recvs, forwarded */
  em_comm_work *w, k;        /* the group's item; the carrier's */
  struct gp2p *next;
} gp2p;

typedef struct group_comm {
  em_comm *carrier;
  int *world;                /* [size]: the members, in the carrier's numbering */
  int chan;                  /* collectives; chan + 1: the group's sends / recvs */
  int keep_failed;           /* the carrier may still touch a failed transfer's buffers */
  gp2p *pending;             /* comm thread only */
  char label[48];
} group_comm;

/* -- Messages ------------------------------------------------------------------- */

/* Copies src into dst (n bytes), writing "replica W" (W a member's carrier rank,
** followed by no digit) as "replica g (world W)". */
static void to_group_names(const em_comm *c, char *dst, size_t n, const char *src) {
  const group_comm *g = c->impl;
  size_t o = 0;
  while (*src && o + 1 < n) {
    if (!strncmp(src, "replica ", 8) && src[8] >= '0' && src[8] <= '9') {
      char *end;
      long wr = strtol(src + 8, &end, 10);
      int m = -1;
      for (int i = 0; i < c->size; i++) if (g->world[i] == wr) m = i;
      if (m >= 0 && strncmp(end, " (world", 7) != 0) {   /* not named so already */
        int k = snprintf(dst + o, n - o, "replica %d (world %ld)", m, wr);
        o = k < 0 ? o : o + (size_t)k < n ? o + (size_t)k : n - 1;
        src = end;
        continue;
      }
    }
    dst[o++] = *src++;
  }
  dst[o] = 0;
}

/* The text of a failed carrier item k, without its own description in front. */
static const char *reason_of(em_comm_work *k) {
  char d[EMI_COMM_MSG];
  emi_coll_describe(d, k);
  size_t n = strlen(d);
  const char *r = k->errmsg;
  if (!strncmp(r, d, n)) {
    r += n;
    if (r[0] == ':' && r[1] == ' ') r += 2;
    else if (r[0] == ' ') r += 1;
  }
  return r;
}

/* w (a collective) failed in k: the message, and the group's failure. */
static em_status fail_with(em_comm *c, em_comm_work *w, em_comm_work *k) {
  char d[EMI_COMM_MSG], why[EMI_COMM_MSG], who[64];
  emi_coll_describe(d, w);
  to_group_names(c, why, sizeof why, reason_of(k));
  int m = 0;
  for (int i = 0; i < c->size; i++) if (((group_comm *)c->impl)->world[i] == k->peer) m = i;
  snprintf(w->errmsg, sizeof w->errmsg, "%.150s: %s %.40s: %.280s", d,
           k->kind == EMI_COLL_SEND ? "send to" : "recv from", emi_comm_who(who, c, m), why);
  emi_comm_fail(c, 0, "%s", w->errmsg);
  return k->status ? k->status : EM_ERR_IO;
}

/* -- Transfers on the carrier ------------------------------------------------------ */

static void xfer_init(em_comm_work *k, emi_coll_kind kind, int world_peer, int chan,
                      em_dtype dt, void *buf, int64_t count) {
  memset(k, 0, sizeof *k);
  k->kind = kind;
  k->peer = world_peer;
  k->chan = chan;
  k->dtype = dt;
  k->count = count;
  k->in = k->out = buf;
}

/* Queues n transfers on the carrier and waits for all of them (each finishes, at
** the latest at the carrier's timeout). Returns the index of the first that
** failed, or -1. */
static int xfer_run(em_comm *carrier, em_comm_work *ks, int n) {
  for (int i = 0; i < n; i++) {
    if (emi_comm_p2p_queue(carrier, &ks[i])) {
      snprintf(ks[i].errmsg, sizeof ks[i].errmsg, "out of memory");
      ks[i].status = EM_ERR_NOMEM;
      ks[i].done = 1;
    }
  }
  pthread_mutex_lock(&carrier->mu);
  for (int i = 0; i < n; i++)
    while (!ks[i].done) pthread_cond_wait(&carrier->cv, &carrier->mu);
  pthread_mutex_unlock(&carrier->mu);
  for (int i = 0; i < n; i++) if (ks[i].status) return i;
  return -1;
}

/* One ring step: send (sbuf, scount) to the next member, receive (rbuf, rcount)
** from the previous one; both as dt. */
static em_status ring_step(em_comm *c, em_comm_work *w, em_dtype dt, void *sbuf,
                           int64_t scount, void *rbuf, int64_t rcount) {
  group_comm *g = c->impl;
  int n = c->size, r = c->rank;
  em_comm_work ks[2];
  xfer_init(&ks[0], EMI_COLL_SEND, g->world[(r + 1) % n], g->chan, dt, sbuf, scount);
  xfer_init(&ks[1], EMI_COLL_RECV, g->world[(r + n - 1) % n], g->chan, dt, rbuf, rcount);
  int bad = xfer_run(g->carrier, ks, 2);
  return bad < 0 ? EM_OK : fail_with(c, w, &ks[bad]);
}

/* -- The collectives ------------------------------------------------------------------ */

enum { DESC_N = 6 };

static void describe(int64_t *h, const em_comm_work *w) {
  h[0] = w->kind;
  h[1] = w->op;
  h[2] = w->root;
  h[3] = w->dtype;
  h[4] = w->count;
  h[5] = (int64_t)w->seq;
}

/* Every member compares its predecessor's descriptor with its own. */
static em_status check_same(em_comm *c, em_comm_work *w) {
  int64_t mine[DESC_N], prev[DESC_N];
  describe(mine, w);
  em_status st = ring_step(c, w, EM_INT64, mine, DESC_N, prev, DESC_N);
  if (st) return st;
  if (!memcmp(mine, prev, sizeof mine)) return EM_OK;
  static const char *ops[] = {"sum", "mean", "max", "min"};
  em_comm_work o = *w;
  o.kind = (emi_coll_kind)prev[0];
  o.op = (em_comm_op)prev[1];
  o.root = (int)prev[2];
  o.dtype = (em_dtype)prev[3];
  o.count = prev[4];
  o.seq = (uint64_t)prev[5];
  char a[EMI_COMM_MSG], b[EMI_COMM_MSG], wa[64], wb[64];
  emi_coll_describe(a, &o);
  emi_coll_describe(b, w);
  int p = (c->rank + c->size - 1) % c->size;
  snprintf(w->errmsg, sizeof w->errmsg, "the group's replicas called different collectives: "
           "%s called %.100s (%s, root %d), %s called %.100s (%s, root %d); every replica of a "
           "group must call the same collectives in the same order", emi_comm_who(wa, c, p), a,
           (unsigned)o.op < 4 ? ops[o.op] : "?", o.root, emi_comm_who(wb, c, c->rank), b,
           ops[w->op], w->root);
  emi_comm_fail(c, 1, "%s", w->errmsg);
  return EM_ERR_IO;
}

/* The dtype a reduction travels and adds in. */
static em_dtype acc_dtype(em_dtype dt) {
  return dt == EM_FLOAT16 || dt == EM_BFLOAT16 ? EM_FLOAT32 : dt;
}

static void load(void *dst, em_dtype adt, const void *src, em_dtype dt, int64_t n) {
  if (adt == dt) { memcpy(dst, src, (size_t)n * em_dtype_size(dt)); return; }
  const uint16_t *h = src;
  float *f = dst;
  if (dt == EM_FLOAT16) for (int64_t i = 0; i < n; i++) f[i] = emi_half_to_float(h[i]);
  else for (int64_t i = 0; i < n; i++) f[i] = emi_bf16_to_float(h[i]);
}

static void store(void *dst, em_dtype dt, const void *src, em_dtype adt, int64_t n) {
  if (adt == dt) { memcpy(dst, src, (size_t)n * em_dtype_size(dt)); return; }
  uint16_t *h = dst;
  const float *f = src;
  if (dt == EM_FLOAT16) for (int64_t i = 0; i < n; i++) h[i] = emi_float_to_half(f[i]);
  else for (int64_t i = 0; i < n; i++) h[i] = emi_float_to_bf16(f[i]);
}

static void divide(void *buf, em_dtype adt, int64_t n, int by) {
  if (adt == EM_FLOAT32) for (int64_t i = 0; i < n; i++) ((float *)buf)[i] /= (float)by;
  else if (adt == EM_FLOAT64) for (int64_t i = 0; i < n; i++) ((double *)buf)[i] /= by;
}

/* Chunk k of count elements in n parts: [lo(k), lo(k + 1)). */
static int64_t lo(int64_t count, int n, int k) { return count * k / n; }

/* Ring reduce-scatter of buf (count elements of adt) in place: member r ends
** with chunk r reduced (tmp holds one chunk). At step s it sends chunk r-s-1
** and adds the received chunk r-s-2 to its own. */
static em_status ring_reduce(em_comm *c, em_comm_work *w, void *buf, void *tmp, em_dtype adt,
                             int64_t count) {
  int n = c->size, r = c->rank;
  size_t es = em_dtype_size(adt);
  em_comm_op op = w->op == EM_COMM_MEAN ? EM_COMM_SUM : w->op;
  for (int s = 0; s < n - 1; s++) {
    int ks = ((r - s - 1) % n + n) % n, kr = ((r - s - 2) % n + n) % n;
    char *send = (char *)buf + lo(count, n, ks) * (int64_t)es;
    char *mine = (char *)buf + lo(count, n, kr) * (int64_t)es;
    int64_t ns = lo(count, n, ks + 1) - lo(count, n, ks);
    int64_t nr = lo(count, n, kr + 1) - lo(count, n, kr);
    em_status st = ring_step(c, w, adt, send, ns, tmp, nr);
    if (st) return st;
    const void *in[2] = {tmp, mine};
    if (nr) emi_reduce_buffers(adt, op, mine, in, 2, nr);
  }
  int64_t a = lo(count, n, r), b = lo(count, n, r + 1);
  if (w->op == EM_COMM_MEAN) divide((char *)buf + a * (int64_t)es, adt, b - a, n);
  return EM_OK;
}

/* Ring allgather in place: member r holds chunk r; at step s it sends chunk r-s
** and receives chunk r-s-1. */
static em_status ring_gather(em_comm *c, em_comm_work *w, void *buf, em_dtype dt,
                             int64_t count) {
  int n = c->size, r = c->rank;
  size_t es = em_dtype_size(dt);
  for (int s = 0; s < n - 1; s++) {
    int ks = ((r - s) % n + n) % n, kr = ((r - s - 1) % n + n) % n;
    em_status st = ring_step(c, w, dt, (char *)buf + lo(count, n, ks) * (int64_t)es,
                             lo(count, n, ks + 1) - lo(count, n, ks),
                             (char *)buf + lo(count, n, kr) * (int64_t)es,
                             lo(count, n, kr + 1) - lo(count, n, kr));
    if (st) return st;
  }
  return EM_OK;
}

/* Scratch that a failed transfer may still name (MPI) is kept, not freed. */
static void scratch_free(em_comm *c, void *p, em_status st) {
  if (!st || !((group_comm *)c->impl)->keep_failed) free(p);
}

static em_status oom(em_comm *c, em_comm_work *w) {
  char d[EMI_COMM_MSG], who[64];
  snprintf(w->errmsg, sizeof w->errmsg, "%.200s: out of memory", emi_coll_describe(d, w));
  emi_comm_fail(c, 1, "%s failed: out of memory in %s", emi_comm_who(who, c, c->rank),
                emi_coll_name(w->kind));
  return EM_ERR_NOMEM;
}

/* allreduce (in == out) and reduce_scatter (in: count, out: count / n). */
static em_status reduce(em_comm *c, em_comm_work *w) {
  int n = c->size;
  em_dtype adt = acc_dtype(w->dtype);
  size_t es = em_dtype_size(adt);
  int64_t count = w->count;
  int all = w->kind != EMI_COLL_REDUCE_SCATTER;      /* allreduce, barrier */
  int inplace = all && adt == w->dtype;
  char *buf = inplace ? w->out : malloc(count > 0 ? (size_t)count * es : 1);
  char *tmp = malloc((size_t)(count / n + 1) * es);
  if (!buf || !tmp) {
    if (!inplace) free(buf);
    free(tmp);
    return oom(c, w);
  }
  if (!inplace) load(buf, adt, w->in, w->dtype, count);
  em_status st = ring_reduce(c, w, buf, tmp, adt, count);
  if (!st && all) {
    st = ring_gather(c, w, buf, adt, count);
    if (!st && !inplace) store(w->out, w->dtype, buf, adt, count);
  } else if (!st) {
    int64_t a = lo(count, n, c->rank);
    store(w->out, w->dtype, buf + a * (int64_t)es, adt, count / n);
  }
  if (!inplace) scratch_free(c, buf, st);
  scratch_free(c, tmp, st);
  return st;
}

static em_status broadcast(em_comm *c, em_comm_work *w) {
  group_comm *g = c->impl;
  int n = c->size;
  if (c->rank != w->root) {
    em_comm_work k;
    xfer_init(&k, EMI_COLL_RECV, g->world[w->root], g->chan, w->dtype, w->out, w->count);
    return xfer_run(g->carrier, &k, 1) < 0 ? EM_OK : fail_with(c, w, &k);
  }
  em_comm_work *ks = calloc((size_t)n, sizeof *ks);
  if (!ks) return oom(c, w);
  int m = 0;
  for (int i = 0; i < n; i++)
    if (i != c->rank)
      xfer_init(&ks[m++], EMI_COLL_SEND, g->world[i], g->chan, w->dtype, w->in, w->count);
  int bad = xfer_run(g->carrier, ks, m);
  em_status st = bad < 0 ? EM_OK : fail_with(c, w, &ks[bad]);
  free(ks);
  return st;
}

static em_status allgather(em_comm *c, em_comm_work *w) {
  size_t es = em_dtype_size(w->dtype);
  memcpy((char *)w->out + (int64_t)c->rank * w->count * (int64_t)es, w->in,
         (size_t)w->count * es);
  return ring_gather(c, w, w->out, w->dtype, w->count * c->size);
}

static em_status group_run(em_comm *c, em_comm_work *w) {
  w->t_ready = emi_now();
  if (c->size == 1) {                          /* a group of one: copies at most */
    size_t es = em_dtype_size(w->dtype);
    if ((w->kind == EMI_COLL_ALLGATHER || w->kind == EMI_COLL_REDUCE_SCATTER) && w->count)
      memcpy(w->out, w->in, (size_t)w->count * es);
    return EM_OK;
  }
  em_status st = check_same(c, w);
  w->t_ready = emi_now();
  if (st) return st;
  switch (w->kind) {
  case EMI_COLL_ALLREDUCE: case EMI_COLL_REDUCE_SCATTER: st = reduce(c, w); break;
  case EMI_COLL_BROADCAST: st = broadcast(c, w); break;
  case EMI_COLL_ALLGATHER: st = allgather(c, w); break;
  case EMI_COLL_BARRIER: {
    int32_t z[64] = {0};
    em_comm_work b = *w;     /* still a barrier: messages say so */
    b.op = EM_COMM_SUM;
    b.dtype = EM_INT32;
    b.count = c->size < 64 ? c->size : 64;
    b.in = b.out = z;
    st = reduce(c, &b);
    if (st) snprintf(w->errmsg, sizeof w->errmsg, "%s", b.errmsg);
    return st;
  }
  case EMI_COLL_SEND: case EMI_COLL_RECV: break;
  }
  if (st && ((group_comm *)c->impl)->keep_failed) {   /* the carrier may still use them */
    em_tensor_retain(w->in_t);
    em_tensor_retain(w->out_t);
  }
  return st;
}

/* -- The group's own sends and recvs: forwarded on its second channel ---------------- */

static em_status group_p2p_post(em_comm *c, em_comm_work *w) {
  group_comm *g = c->impl;
  gp2p *p = calloc(1, sizeof *p);
  if (!p) {
    char d[EMI_COMM_MSG];
    snprintf(w->errmsg, sizeof w->errmsg, "%.200s: out of memory", emi_coll_describe(d, w));
    return EM_ERR_NOMEM;
  }
  p->w = w;
  xfer_init(&p->k, w->kind, g->world[w->peer], g->chan + 1, w->dtype,
            w->kind == EMI_COLL_SEND ? w->in : w->out, w->count);
  p->k.in_t = w->in_t;        /* for the carrier's messages and MPI's keeping */
  if (emi_comm_p2p_queue(g->carrier, &p->k)) {
    char d[EMI_COMM_MSG];
    snprintf(w->errmsg, sizeof w->errmsg, "%.200s: out of memory", emi_coll_describe(d, w));
    free(p);
    return EM_ERR_NOMEM;
  }
  p->next = g->pending;
  g->pending = p;
  return EM_OK;
}

/* Finishes the forwarded items whose carrier item is done; stopping: waits for
** all of them (the carrier fails each at its timeout at the latest). */
static void group_p2p_progress(em_comm *c, int stopping) {
  group_comm *g = c->impl;
  for (gp2p **pp = &g->pending; *pp;) {
    gp2p *p = *pp;
    pthread_mutex_lock(&g->carrier->mu);
    while (stopping && !p->k.done) pthread_cond_wait(&g->carrier->cv, &g->carrier->mu);
    int done = p->k.done;
    pthread_mutex_unlock(&g->carrier->mu);
    if (!done) { pp = &p->next; continue; }
    *pp = p->next;
    em_comm_work *w = p->w;
    if (p->k.status) {
      char d[EMI_COMM_MSG], why[EMI_COMM_MSG];
      to_group_names(c, why, sizeof why, reason_of(&p->k));
      snprintf(w->errmsg, sizeof w->errmsg, "%.200s: %.280s", emi_coll_describe(d, w), why);
    }
    w->t_ready = p->k.t_ready;
    em_status st = p->k.status;
    free(p);
    emi_comm_p2p_done(w, st);
  }
}

/* This replica failed (em_comm_abort, a mismatch): the carrier fails too, so
** every replica of the job hears it. */
static void group_abort_notify(em_comm *c, int own) {
  if (!own) return;
  group_comm *g = c->impl;
  char msg[EMI_COMM_MSG];
  pthread_mutex_lock(&c->mu);
  snprintf(msg, sizeof msg, "%s", c->failure);
  pthread_mutex_unlock(&c->mu);
  emi_comm_fail(g->carrier, 1, "%s", msg);
}

static void group_destroy(em_comm *c) {
  group_comm *g = c->impl;
  free(g->world);
  free(g);
}

static const emi_comm_backend group_backend = {
  .name = "group",
  .run = group_run,
  .abort_notify = group_abort_notify,
  .p2p_post = group_p2p_post,
  .p2p_progress = group_p2p_progress,
  .destroy = group_destroy,
};

/* -- Making one ---------------------------------------------------------------------- */

static uint64_t hash_ranks(int n, const int *ranks) {
  uint64_t h = 1469598103934665603ull;
  for (int i = 0; i < n; i++) h = (h ^ (uint64_t)(uint32_t)ranks[i]) * 1099511628211ull;
  return h & 0x7fffffffffffffffull;
}

enum { SETUP_N = 6 };

/* The leader's answer {0, _, b, n_b, world_b, n_0} as an error. */
static em_status disagreed(em_state *S, const int64_t *ans, int leader_world) {
  return emi_error(S, EM_ERR_ARG, "comm_group: the members asked for different groups: "
                   "replica %lld (world %lld) asked for a group of %lld replicas, replica 0 "
                   "(world %d) for %lld%s; every member passes the same ranks",
                   (long long)ans[2], (long long)ans[4], (long long)ans[3], leader_world,
                   (long long)ans[5], ans[3] == ans[5] ? " with other ranks" : "");
}

/* The members agree on the group's channels (see the top): *chan, or an error in S. */
static em_status agree(em_state *S, em_comm *carrier, const int *world, int n, int me,
                       const int *ranks, int *chan) {
  pthread_mutex_lock(&carrier->mu);
  int64_t mine[SETUP_N] = {n, (int64_t)hash_ranks(n, ranks), carrier->next_chan, 0, 0, 0};
  pthread_mutex_unlock(&carrier->mu);
  int64_t (*msg)[SETUP_N] = calloc((size_t)n, sizeof *msg);
  em_comm_work *ks = calloc((size_t)n, sizeof *ks);
  if (!msg || !ks) {
    free(msg);
    free(ks);
    return emi_error(S, EM_ERR_NOMEM, "comm_group: out of memory");
  }
  em_status st = EM_OK;
  int bad;
  char who[64];
  if (me != 0) {
    int64_t ans[SETUP_N];
    xfer_init(&ks[0], EMI_COLL_SEND, world[0], EMI_CHAN_SETUP, EM_INT64, mine, SETUP_N);
    xfer_init(&ks[1], EMI_COLL_RECV, world[0], EMI_CHAN_SETUP, EM_INT64, ans, SETUP_N);
    if ((bad = xfer_run(carrier, ks, 2)) >= 0) {
      st = emi_error(S, EM_ERR_IO, "comm_group: agreeing with the group's first member "
                     "(world replica %d): %.300s", world[0], ks[bad].errmsg);
    } else if (!ans[0]) {
      st = disagreed(S, ans, world[0]);
    } else {
      *chan = (int)ans[1];
    }
  } else {
    for (int i = 1; i < n; i++)
      xfer_init(&ks[i - 1], EMI_COLL_RECV, world[i], EMI_CHAN_SETUP, EM_INT64, msg[i], SETUP_N);
    if ((bad = xfer_run(carrier, ks, n - 1)) >= 0) {
      snprintf(who, sizeof who, "replica %d (world %d)", bad + 1, world[bad + 1]);
      st = emi_error(S, EM_ERR_IO, "comm_group: %s did not join the group: %.300s", who,
                     ks[bad].errmsg);
    } else {
      int64_t ans[SETUP_N] = {1, mine[2], 0, 0, 0, n};
      for (int i = 1; i < n; i++) {
        if (msg[i][2] > ans[1]) ans[1] = msg[i][2];
        if (ans[0] && (msg[i][0] != n || msg[i][1] != mine[1])) {
          ans[0] = 0, ans[2] = i, ans[3] = msg[i][0], ans[4] = world[i];
        }
      }
      for (int i = 1; i < n; i++)
        xfer_init(&ks[i - 1], EMI_COLL_SEND, world[i], EMI_CHAN_SETUP, EM_INT64, ans, SETUP_N);
      if ((bad = xfer_run(carrier, ks, n - 1)) >= 0) {
        st = emi_error(S, EM_ERR_IO, "comm_group: replica %d (world %d) did not join the "
                       "group: %.300s", bad + 1, world[bad + 1], ks[bad].errmsg);
      } else if (!ans[0]) {
        st = disagreed(S, ans, world[0]);
      } else {
        *chan = (int)ans[1];
      }
    }
  }
  free(msg);
  free(ks);
  if (!st) {
    pthread_mutex_lock(&carrier->mu);
    if (carrier->next_chan < *chan + 2) carrier->next_chan = *chan + 2;
    pthread_mutex_unlock(&carrier->mu);
  }
  return st;
}

em_status em_comm_group(em_state *S, em_comm *parent, int n, const int *ranks,
                        em_comm **out) {
  if (!out) return emi_error(S, EM_ERR_ARG, "comm_group: NULL output");
  *out = NULL;
  if (!parent) return emi_error(S, EM_ERR_ARG, "comm_group: NULL parent communicator");
  if (n < 1 || n > parent->size)
    return emi_error(S, EM_ERR_ARG, "comm_group: a group of %d replicas of a communicator of "
                     "%d (the size is 1..%d)", n, parent->size, parent->size);
  if (!ranks) return emi_error(S, EM_ERR_ARG, "comm_group: NULL ranks");
  int me = -1;
  for (int i = 0; i < n; i++) {
    if (ranks[i] < 0 || ranks[i] >= parent->size)
      return emi_error(S, EM_ERR_ARG, "comm_group: rank %d (ranks[%d]) is not a rank of the "
                       "parent communicator (0..%d)", ranks[i], i, parent->size - 1);
    if (i > 0 && ranks[i] <= ranks[i - 1])
      return emi_error(S, EM_ERR_ARG, "comm_group: the ranks must be ascending and distinct: "
                       "ranks[%d] = %d follows ranks[%d] = %d", i, ranks[i], i - 1,
                       ranks[i - 1]);
    if (ranks[i] == parent->rank) me = i;
  }
  if (me < 0)
    return emi_error(S, EM_ERR_ARG, "comm_group: this replica (rank %d of the parent) is not "
                     "one of the %d ranks; only the group's members call em_comm_group",
                     parent->rank, n);
  em_status st = em_comm_status(S, parent);
  if (st) return st;
  /* a group of a group: the same carrier, ranks translated */
  const group_comm *pg = parent->be == &group_backend ? parent->impl : NULL;
  em_comm *carrier = pg ? pg->carrier : emi_comm_p2p_carrier(parent);
  if (!carrier)
    return emi_error(S, EM_ERR_UNSUPPORTED, "comm_group: the %s communicator has no "
                     "point-to-point, which a group's collectives run on",
                     em_comm_backend(parent));
  group_comm *g = calloc(1, sizeof *g);
  if (g) g->world = malloc(sizeof *g->world * (size_t)n);
  if (!g || !g->world) {
    free(g);
    return emi_error(S, EM_ERR_NOMEM, "comm_group: out of memory");
  }
  for (int i = 0; i < n; i++) g->world[i] = pg ? pg->world[ranks[i]] : ranks[i];
  g->carrier = carrier;
  g->keep_failed = strcmp(carrier->be->name, "local") != 0;
  snprintf(g->label, sizeof g->label, "group(%s)",
           pg ? em_comm_backend(pg->carrier) : em_comm_backend(parent));
  if (n > 1 && (st = agree(S, carrier, g->world, n, me, ranks, &g->chan))) {
    group_destroy(&(em_comm){.impl = g});
    return st;
  }
  emi_commdev *dev = NULL;
  if (parent->dev && (st = emi_commdev_open(S, emi_commdev_device(parent->dev), &dev))) {
    group_destroy(&(em_comm){.impl = g});
    return st;
  }
  em_comm *c;
  if ((st = emi_comm_new_dev(S, &group_backend, g, me, n, parent->timeout_s, dev, &c))) {
    if (dev) emi_commdev_close(dev);
    group_destroy(&(em_comm){.impl = g});
    return st;
  }
  c->label = g->label;
  c->world_of = g->world;
  *out = c;
  return EM_OK;
}

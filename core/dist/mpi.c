/*
** mpi.c -- the `mpi` communicator: replicas that are processes of an MPI job
** (mpirun, srun), on one host or many, through Open MPI's libmpi.
**
** libmpi is loaded at run time. libember links nothing of MPI: em_comm_mpi
** dlopens libmpi.so.40 (Open MPI 3.x/4.x; RTLD_GLOBAL because Open MPI's own
** plugins resolve libmpi's symbols through the global scope), and looks up every
** function it calls and every predefined handle it uses. mpi.h is read for its
** types and constants only: its MPI_COMM_WORLD, MPI_FLOAT, MPI_SUM ... are macros
** over the addresses of ompi_mpi_* globals, which we take from dlsym instead, so
** no object here references an MPI symbol. Without mpi.h at build time a stub
** says so at run time.
**
** Threads. Every MPI call happens on the communicator's comm thread (comm.h):
** thread_start initialises MPI there (MPI_THREAD_FUNNELED: the thread that
** initialised is the one that calls), and thread_stop finalizes there. So the
** host's threads never enter MPI, and one MPI communicator per process is all
** there can be: MPI is initialised once per process, and a second em_comm_mpi
** is refused (the Lua layer keeps one per process).
**
** A collective is an MPI non-blocking collective on a duplicate of
** MPI_COMM_WORLD, polled with MPI_Test: without sleeping for about as long as the
** transfer should take (MPI advances a collective only inside its calls), then
** sleeping 20-200 us between polls (a replica waiting for a late peer should not
** hold a core). The polling loop is where failure is noticed, so that no replica
** ever waits in MPI for a peer that will not come:
**  - this replica failed (em_comm_abort, c->failure): return at once;
**  - another replica failed: it sent a FAIL message with its text on a second
**    duplicate of WORLD, the control channel; MPI_Iprobe there finds it;
**  - a timeout: after c->timeout_s the replica asks every other one (QUERY) which
**    collective it last started, and collects answers for a short grace. Every
**    comm thread answers, whether polling in run() or idle (comm.c calls idle
**    every few ms while the queue is empty), so a replica whose host is busy or
**    stuck elsewhere still answers, with a number lower than ours; one whose
**    process is gone or frozen does not answer. Both "did not arrive". The message
**    names them and goes to every replica as a FAIL (so the late one, too,
**    learns why the job stops). When every replica did start the collective
**    (MPI itself is slow, or replicas called different collectives) one more
**    timeout is allowed before giving up.
**  - another replica left: a replica whose script ended without failing (it
**    returned, or called os.exit(0)) sends EXIT with the number of the last
**    collective it started before it finalizes; a collective it never started
**    fails with "replica K exited" (without failing the others, which may need
**    it for nothing more).
** FAIL messages are sent with MPI_Isend by the comm thread only (abort_notify,
** called from any thread, sets a flag) and waited for a bounded time, so a dead
** peer never blocks the exit. After a failure MPI_Finalize is not called: it
** synchronises with every process and the failed ones may be gone; the host
** exits non-zero and the launcher ends the job.
**
** A collective given up while MPI still owns its buffers (failure, timeout)
** keeps those buffers alive for the rest of the process: a late peer could still
** complete it, and MPI would then write into memory the caller has freed.
**
** Point-to-point (send, recv; see comm.h). Three messages on the data
** communicator, each under a tag of its own made from the pair's sequence
** number (so that matching never depends on the order in which MPI completes
** them): a header (dtype, count, shape) and the bytes from the sender, then an
** acknowledgement from the receiver, which says whether the header matched what
** it receives into. The sender finishes when the acknowledgement arrives (a
** rendezvous, as on the other backends), and a mismatch is an error on both
** sides naming both shapes; a receiver that does not match still drains the
** bytes into scratch memory. Pending items are polled in p2p_progress (and on
** the control channel, so a FAIL or EXIT from the peer fails them at once); one
** given up keeps its buffers, as a collective's.
**
** float16 and bfloat16 are reduced in float32 (MPI has no such types): converted
** into a float32 buffer, reduced, converted back, rounded once. Broadcast and
** allgather move their bits as 16-bit integers. mean is a sum divided by the size.
*/
#include "comm.h"
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sched.h>

#if defined(__has_include)
#if __has_include(<mpi.h>)
#define EMI_HAVE_MPI_H 1
#endif
#endif

/* -- Was this process started by an MPI launcher? ------------------------------- */

static int env_int(const char *name, int *v) {
  const char *s = getenv(name);
  if (!s || !*s) return 0;
  char *end;
  long x = strtol(s, &end, 10);
  if (*end || x < 0 || x > 1 << 30) return 0;
  *v = (int)x;
  return 1;
}

int em_mpi_launched(int *rank, int *size) {
  int r = 0, n = 1, found = 0;
  if (env_int("OMPI_COMM_WORLD_RANK", &r)) {           /* Open MPI's mpirun */
    found = 1;
    if (!env_int("OMPI_COMM_WORLD_SIZE", &n)) n = 0;
  } else if (env_int("PMIX_RANK", &r)) {               /* any PMIx launcher */
    found = 1;
    if (!env_int("OMPI_COMM_WORLD_SIZE", &n) && !env_int("PMI_SIZE", &n) &&
        !env_int("SLURM_NTASKS", &n))
      n = 0;                                           /* unknown until MPI says */
  } else if (env_int("PMI_RANK", &r) && env_int("PMI_SIZE", &n)) {  /* MPICH Hydra */
    found = 1;
  } else if (getenv("SLURM_STEP_ID") && env_int("SLURM_NTASKS", &n) && n > 1 &&
             env_int("SLURM_PROCID", &r)) {
    /* srun: a batch script's own shell has SLURM_PROCID=0 too, but no job step of
    ** several tasks. */
    found = 1;
  }
  if (!found) r = 0, n = 1;
  if (rank) *rank = r;
  if (size) *size = n;
  return found;
}

#ifndef EMI_HAVE_MPI_H

em_status em_comm_mpi(em_state *S, double timeout_s, em_comm **out) {
  if (out) *out = NULL;
  return emi_error(S, EM_ERR_UNSUPPORTED, "comm_mpi: ember was built without MPI headers "
                   "(install libopenmpi-dev and rebuild)");
}

#else
#include <mpi.h>

/* -- libmpi, loaded at run time ------------------------------------------------- */

#define MPI_FUNCS(X) \
  X(Initialized) X(Finalized) X(Init_thread) X(Query_thread) X(Finalize) \
  X(Comm_dup) X(Comm_free) X(Comm_rank) X(Comm_size) X(Comm_set_errhandler) \
  X(Error_string) X(Iallreduce) X(Ibcast) X(Iallgather) X(Ireduce_scatter_block) \
  X(Ibarrier) X(Test) X(Iprobe) X(Recv) X(Isend) X(Irecv)

typedef struct mpi_lib {
  void *dl;
#define X(f) __typeof__(MPI_##f) *f;
  MPI_FUNCS(X)
#undef X
  MPI_Comm world;
  MPI_Datatype f32, f64, i32, i64, u16, u64, chr;
  MPI_Op sum, max, min;
  MPI_Errhandler errors_return;
} mpi_lib;

/* Process-wide, as MPI itself is: the library and whether a communicator has
** initialised MPI in this process (MPI can be initialised only once). */
static mpi_lib L;
static pthread_mutex_t lib_mu = PTHREAD_MUTEX_INITIALIZER;
enum { MPI_UNUSED, MPI_OPEN, MPI_SPENT };
static int mpi_phase = MPI_UNUSED;

/* Under lib_mu. */
static em_status load_lib(em_state *S) {
  if (L.dl) return EM_OK;
  void *dl = dlopen("libmpi.so.40", RTLD_NOW | RTLD_GLOBAL);
  if (!dl)
    return emi_error(S, EM_ERR_UNSUPPORTED, "comm_mpi: could not load Open MPI's library: %s "
                     "(install libopenmpi3 and openmpi-bin, and start the job with mpirun)",
                     dlerror());
  mpi_lib l = {.dl = dl};
  const char *missing = NULL;
#define SYM(field, name) \
  if (!missing && !(*(void **)&l.field = dlsym(dl, name))) missing = name;
#define X(f) SYM(f, "MPI_" #f)
  MPI_FUNCS(X)
#undef X
  SYM(world, "ompi_mpi_comm_world")
  SYM(f32, "ompi_mpi_float") SYM(f64, "ompi_mpi_double") SYM(i32, "ompi_mpi_int")
  SYM(i64, "ompi_mpi_int64_t") SYM(u16, "ompi_mpi_uint16_t") SYM(u64, "ompi_mpi_uint64_t")
  SYM(chr, "ompi_mpi_char")
  SYM(sum, "ompi_mpi_op_sum") SYM(max, "ompi_mpi_op_max") SYM(min, "ompi_mpi_op_min")
  SYM(errors_return, "ompi_mpi_errors_return")
#undef SYM
  if (missing) {
    dlclose(dl);
    return emi_error(S, EM_ERR_UNSUPPORTED, "comm_mpi: libmpi.so.40 has no symbol %s (ember "
                     "needs Open MPI 3 or 4)", missing);
  }
  L = l;      /* never unloaded: Open MPI does not survive being unloaded */
  return EM_OK;
}

/* -- The communicator ----------------------------------------------------------- */

enum { TAG_FAIL = 1, TAG_QUERY = 2, TAG_ANSWER = 3, TAG_EXIT = 4 };
#define GRACE_S 1.5          /* how long a timed-out replica collects answers */
#define SEND_WAIT_S 2.0      /* how long FAIL messages may take to leave at exit */
#define SPIN_S 0.002         /* polling without sleeping: at least this long, */
#define SPIN_S_PER_BYTE 4e-9 /* and this per byte (250 MB/s) */

/* A control message on its way out: MPI owns buf until the request completes. */
typedef struct ctl_send {
  MPI_Request req;
  int active;
  union { uint64_t q[2]; char text[EMI_COMM_MSG]; } buf;
} ctl_send;

typedef struct mpi_comm {
  MPI_Comm data, ctl;        /* duplicates of WORLD: collectives, control messages */
  int initialised;           /* we called MPI_Init_thread (and so may finalize) */
  int dups;                  /* data and ctl exist */
  uint64_t started;          /* seq of the last collective this replica started */
  int fail_pending;          /* atomic: our failure is still to be sent to the others */
  int fails_sent;
  /* a query round of a timed-out collective */
  uint64_t qid;
  int64_t *answers;          /* [size]: each replica's last started seq, -1 = none */
  int64_t *exited;           /* [size]: the last seq a replica that left started, -1 = here */
  ctl_send *sends;
  int nsends;
  struct p2p_rec *p2p;       /* pending sends and recvs, and acknowledgements leaving */
} mpi_comm;

static const char *mpi_err(int rc, char *buf) {
  int len = 0;
  if (L.Error_string(rc, buf, &len) != MPI_SUCCESS) snprintf(buf, 64, "MPI error %d", rc);
  return buf;
}

/* Sends one control message (a copy of data) without waiting; dropped when all
** slots are busy -- control messages are few, and each is advisory. */
static void ctl_post(mpi_comm *m, int dest, int tag, const void *data, int count,
                     MPI_Datatype dt, size_t bytes) {
  for (int i = 0; i < m->nsends; i++) {
    ctl_send *s = &m->sends[i];
    if (s->active) continue;
    memcpy(&s->buf, data, bytes);
    if (L.Isend(&s->buf, count, dt, dest, tag, m->ctl, &s->req) == MPI_SUCCESS) s->active = 1;
    return;
  }
}

static int ctl_progress(mpi_comm *m) {
  int busy = 0;
  for (int i = 0; i < m->nsends; i++) {
    ctl_send *s = &m->sends[i];
    if (!s->active) continue;
    int flag = 0;
    if (L.Test(&s->req, &flag, MPI_STATUS_IGNORE) != MPI_SUCCESS || flag) s->active = 0;
    else busy++;
  }
  return busy;
}

/* Our failure to every other replica, once. */
static void send_fails(em_comm *c, mpi_comm *m) {
  if (!__atomic_exchange_n(&m->fail_pending, 0, __ATOMIC_ACQ_REL) || m->fails_sent) return;
  m->fails_sent = 1;
  char text[EMI_COMM_MSG];
  pthread_mutex_lock(&c->mu);
  snprintf(text, sizeof text, "%s", c->failure);
  pthread_mutex_unlock(&c->mu);
  for (int r = 0; r < c->size; r++)
    if (r != c->rank) ctl_post(m, r, TAG_FAIL, text, (int)strlen(text) + 1, L.chr, sizeof text);
}

/* Everything that arrived on the control channel: FAILs, QUERYs (answered with
** the last collective we started), ANSWERs to our query round. */
static void ctl_poll(em_comm *c, mpi_comm *m) {
  for (int n = 0; n < 4 * c->size; n++) {
    int flag = 0;
    MPI_Status st;
    if (L.Iprobe(MPI_ANY_SOURCE, MPI_ANY_TAG, m->ctl, &flag, &st) != MPI_SUCCESS || !flag)
      break;
    int src = st.MPI_SOURCE;
    if (st.MPI_TAG == TAG_FAIL) {
      char text[EMI_COMM_MSG];
      if (L.Recv(text, EMI_COMM_MSG, L.chr, src, TAG_FAIL, m->ctl, MPI_STATUS_IGNORE))
        snprintf(text, sizeof text, "replica %d failed (its message was lost)", src);
      text[EMI_COMM_MSG - 1] = 0;
      emi_comm_fail(c, 0, "%s", text);
    } else {
      uint64_t q[2] = {0, 0};
      if (L.Recv(q, 2, L.u64, src, st.MPI_TAG, m->ctl, MPI_STATUS_IGNORE)) continue;
      if (st.MPI_TAG == TAG_QUERY) {
        uint64_t a[2] = {q[0], m->started};
        ctl_post(m, src, TAG_ANSWER, a, 2, L.u64, sizeof a);
      } else if (st.MPI_TAG == TAG_ANSWER && q[0] == m->qid && src < c->size) {
        m->answers[src] = (int64_t)q[1];
      } else if (st.MPI_TAG == TAG_EXIT && src < c->size) {
        m->exited[src] = (int64_t)q[0];
      }
    }
  }
  send_fails(c, m);
  ctl_progress(m);
}

static void nap(long ns) {
  struct timespec ts = {0, ns};
  nanosleep(&ts, NULL);
}

/* The replicas that did not start collective w (query round over), as "1, 3". */
static int missing_list(em_comm *c, mpi_comm *m, const em_comm_work *w, char *buf,
                        size_t n) {
  int k = 0, count = 0;
  buf[0] = 0;
  for (int r = 0; r < c->size; r++) {
    if (r == c->rank || (m->answers[r] >= 0 && (uint64_t)m->answers[r] >= w->seq)) continue;
    if (k < (int)n - 16) k += snprintf(buf + k, n - k, count ? ", %d" : "%d", r);
    count++;
  }
  return count;
}

static void start_query(em_comm *c, mpi_comm *m) {
  m->qid++;
  for (int r = 0; r < c->size; r++) m->answers[r] = -1;
  uint64_t q[2] = {m->qid, 0};
  for (int r = 0; r < c->size; r++)
    if (r != c->rank) ctl_post(m, r, TAG_QUERY, q, 2, L.u64, sizeof q);
}

static int all_answered(em_comm *c, mpi_comm *m) {
  for (int r = 0; r < c->size; r++)
    if (r != c->rank && m->answers[r] < 0) return 0;
  return 1;
}

static em_status mpi_failed(em_comm *c, em_comm_work *w, const char *call, int rc) {
  char d[EMI_COMM_MSG], e[MPI_MAX_ERROR_STRING + 64];
  emi_comm_fail(c, 1, "replica %d failed: %s in %s: %s", c->rank, call,
                emi_coll_describe(d, w), mpi_err(rc, e));
  return EM_ERR_IO;
}

/* Polls req until it completes, the communicator fails, or the timeout. */
static em_status wait_request(em_comm *c, mpi_comm *m, em_comm_work *w, MPI_Request *req) {
  double t0 = emi_now(), limit = c->timeout_s, qdeadline = 0;
  int polls = 0, querying = 0, extended = 0;
  long sleep_ns = 20000;
  /* Spin (yielding the core) for about as long as the transfer should take:
  ** every step of MPI's schedule waits for a call to MPI_Test, so a sleeping
  ** poller slows a large collective several times over (4 MB: 2 ms spinning, 28
  ** ms sleeping between polls). After that, sleep between polls. */
  int64_t bytes = w->count * (int64_t)em_dtype_size(w->dtype);
  if (w->kind == EMI_COLL_ALLGATHER) bytes *= c->size;
  double spin_s = SPIN_S + (double)bytes * SPIN_S_PER_BYTE;
  for (;;) {
    int flag = 0, rc = L.Test(req, &flag, MPI_STATUS_IGNORE);
    if (rc != MPI_SUCCESS) return mpi_failed(c, w, "MPI_Test", rc);
    if (flag) return EM_OK;
    if (emi_comm_failed(c)) break;
    int spinning = emi_now() - t0 < spin_s;
    if (spinning && (++polls & 15)) {   /* the control channel every 16th */
      sched_yield();
      continue;
    }
    ctl_poll(c, m);
    if (emi_comm_failed(c)) break;
    int gone = -1;            /* a replica that left before starting w never will */
    for (int r = 0; r < c->size && gone < 0; r++)
      if (m->exited[r] >= 0 && (uint64_t)m->exited[r] < w->seq) gone = r;
    if (gone >= 0) {
      emi_comm_fail(c, 0, "replica %d exited", gone);
      break;
    }
    double now = emi_now();
    if (!querying && now - t0 > limit) {
      start_query(c, m);
      querying = 1;
      qdeadline = now + GRACE_S;
    } else if (querying && (all_answered(c, m) || now > qdeadline)) {
      char who[EMI_COMM_MSG / 2], d[EMI_COMM_MSG];
      int k = missing_list(c, m, w, who, sizeof who);
      emi_coll_describe(d, w);
      if (k == 0 && !extended) {           /* all are in it: give MPI one more timeout */
        extended = 1;
        querying = 0;
        limit += c->timeout_s;
        continue;
      }
      if (k == 0)
        emi_comm_fail(c, 1, "%s timed out after %.1f s although every replica started it "
                      "(did replicas call different collectives?)", d, now - t0);
      else
        emi_comm_fail(c, 1, "%s timed out after %g s: replica%s %s did not arrive", d,
                      limit, k > 1 ? "s" : "", who);
      break;
    }
    if (spinning) continue;
    nap(sleep_ns);
    if (sleep_ns < 200000) sleep_ns = sleep_ns * 3 / 2;
  }
  send_fails(c, m);         /* our own failure leaves now, not at the next idle */
  ctl_progress(m);
  return EM_ERR_IO;
}

static MPI_Datatype mpi_type(em_dtype dt, int reduce) {
  switch (dt) {
  case EM_FLOAT32: return L.f32;
  case EM_FLOAT64: return L.f64;
  case EM_INT32: return L.i32;
  case EM_INT64: return L.i64;
  default: return reduce ? L.f32 : L.u16;    /* float16, bfloat16 */
  }
}

static MPI_Op mpi_op(em_comm_op op) {
  return op == EM_COMM_MAX ? L.max : op == EM_COMM_MIN ? L.min : L.sum;
}

static int is_half(em_dtype dt) { return dt == EM_FLOAT16 || dt == EM_BFLOAT16; }

static void half_to_f32(em_dtype dt, const uint16_t *in, float *out, int64_t n) {
  if (dt == EM_FLOAT16)
    for (int64_t i = 0; i < n; i++) out[i] = emi_half_to_float(in[i]);
  else
    for (int64_t i = 0; i < n; i++) out[i] = emi_bf16_to_float(in[i]);
}

/* out = in (float32) / div, rounded once into dt's representation. */
static void f32_store(em_dtype dt, const float *in, void *out, int64_t n, double div) {
  switch (dt) {
  case EM_FLOAT32:
    for (int64_t i = 0; i < n; i++) ((float *)out)[i] = (float)(in[i] / div);
    break;
  case EM_FLOAT16:
    for (int64_t i = 0; i < n; i++) ((uint16_t *)out)[i] = emi_float_to_half(in[i] / (float)div);
    break;
  default:
    for (int64_t i = 0; i < n; i++) ((uint16_t *)out)[i] = emi_float_to_bf16(in[i] / (float)div);
    break;
  }
}

static em_status mpi_run(em_comm *c, em_comm_work *w) {
  mpi_comm *m = c->impl;
  char d[EMI_COMM_MSG];
  int64_t n = w->count, part = w->kind == EMI_COLL_REDUCE_SCATTER ? n / c->size : n;
  if (n > 0x7fffffff) {
    snprintf(w->errmsg, sizeof w->errmsg, "%s: more than 2^31-1 elements in one MPI "
             "collective (use smaller buckets)", emi_coll_describe(d, w));
    return EM_ERR_ARG;
  }
  int reduce = w->kind == EMI_COLL_ALLREDUCE || w->kind == EMI_COLL_REDUCE_SCATTER;
  MPI_Datatype dt = mpi_type(w->dtype, reduce);
  float *tmp = NULL;          /* float16/bfloat16 reductions: [n] in, then [part] out */
  void *in = w->in, *out = w->out;
  if (reduce && is_half(w->dtype)) {
    tmp = malloc(sizeof(float) * (size_t)(n + part + 1));
    if (!tmp) {
      snprintf(w->errmsg, sizeof w->errmsg, "%s: out of memory for a float32 copy",
               emi_coll_describe(d, w));
      emi_comm_fail(c, 1, "replica %d failed: %s", c->rank, w->errmsg);
      send_fails(c, m);
      return EM_ERR_NOMEM;
    }
    half_to_f32(w->dtype, w->in, tmp, n);
    in = tmp;
    out = tmp + n;
  }
  m->started = w->seq;
  MPI_Request req;
  int rc = MPI_SUCCESS;
  const char *call = "";
  switch (w->kind) {
  case EMI_COLL_ALLREDUCE:
    call = "MPI_Iallreduce";
    rc = L.Iallreduce(MPI_IN_PLACE, in, (int)n, dt, mpi_op(w->op), m->data, &req);
    out = in;
    break;
  case EMI_COLL_BROADCAST:
    call = "MPI_Ibcast";
    rc = L.Ibcast(in, (int)n, dt, w->root, m->data, &req);
    break;
  case EMI_COLL_ALLGATHER:
    call = "MPI_Iallgather";
    rc = L.Iallgather(in, (int)n, dt, out, (int)n, dt, m->data, &req);
    break;
  case EMI_COLL_REDUCE_SCATTER:
    call = "MPI_Ireduce_scatter_block";
    rc = L.Ireduce_scatter_block(in, out, (int)part, dt, mpi_op(w->op), m->data, &req);
    break;
  case EMI_COLL_BARRIER:
    call = "MPI_Ibarrier";
    rc = L.Ibarrier(m->data, &req);
    break;
  case EMI_COLL_SEND: case EMI_COLL_RECV:     /* never queued here: no p2p_post */
    break;
  }
  if (rc != MPI_SUCCESS) {
    free(tmp);
    return mpi_failed(c, w, call, rc);
  }
  em_status st = wait_request(c, m, w, &req);
  if (st) {
    /* MPI may still write into these (see the top): they stay allocated. */
    em_tensor_retain(w->in_t);
    em_tensor_retain(w->out_t);
    return st;
  }
  if (reduce && (tmp || w->op == EM_COMM_MEAN)) {
    int64_t k = w->kind == EMI_COLL_ALLREDUCE ? n : part;
    double div = w->op == EM_COMM_MEAN ? c->size : 1;
    if (tmp)
      f32_store(w->dtype, out, w->out, k, div);
    else if (w->dtype == EM_FLOAT32)
      f32_store(EM_FLOAT32, out, out, k, div);
    else
      for (int64_t i = 0; i < k; i++) ((double *)out)[i] /= div;
  }
  free(tmp);
  return EM_OK;
}

static void mpi_idle(em_comm *c) { ctl_poll(c, c->impl); }

/* -- Point-to-point ------------------------------------------------------------------- */

/* A tag per (channel, sequence number, part): P2P_SEQS sequence numbers of
** P2P_CHANS channels (comm.h) fit below 2^31 - 1, Open MPI's MPI_TAG_UB. Both
** wrap: a collision needs 65536 messages of one pair and channel in flight, or
** two live groups made 8192 groups apart sharing a pair of replicas. */
enum { TAG_P2P = 100, P2P_SEQS = 65536, P2P_CHANS = 8192, HDR_N = 4 + EM_MAX_DIMS };

/* One send or recv in flight. w is NULL once the item has finished (the record
** then lives on while its acknowledgement leaves, or for ever when abandoned). */
typedef struct p2p_rec {
  em_comm_work *w;
  MPI_Request req[3];        /* send: header, data, ack in; recv: header, data, ack out */
  int active[3];
  int mismatch;              /* recv: the header did not match */
  int abandoned;             /* MPI may still use the buffers: never freed */
  int64_t hdr[HDR_N];        /* dtype, count, ndim, sizes */
  int64_t ack[HDR_N];        /* 1 = matched / 0, then the receiver's dtype, count, shape */
  void *scratch;             /* recv: where a mismatched payload drains */
  struct p2p_rec *next;
} p2p_rec;

static int p2p_tag(const em_comm_work *w, int part) {
  int64_t slot = (int64_t)(w->chan % P2P_CHANS) * P2P_SEQS + (int64_t)(w->seq % P2P_SEQS);
  return TAG_P2P + (int)(3 * slot) + part;
}

static void describe_tensor(int64_t *h, const em_comm_work *w) {
  const em_tensor *t = w->in_t;
  h[0] = w->dtype;
  h[1] = w->count;
  if (!t) {                  /* a group's buffer (group.c): flat */
    h[2] = 1;
    h[3] = w->count;
    return;
  }
  h[2] = t->ndim;
  for (int d = 0; d < t->ndim && d < EM_MAX_DIMS; d++) h[3 + d] = t->sizes[d];
}

static void header_str(char *buf, size_t n, const int64_t *h) {
  int k = snprintf(buf, n, "%s [", em_dtype_name((em_dtype)h[0]));
  for (int d = 0; d < h[2] && d < EM_MAX_DIMS && k < (int)n - 24; d++)
    k += snprintf(buf + k, n - (size_t)k, "%s%lld", d ? ", " : "", (long long)h[3 + d]);
  snprintf(buf + k, n - (size_t)k, "] (%lld bytes)",
           (long long)(h[1] * (int64_t)em_dtype_size((em_dtype)h[0])));
}

static void mismatch_msg(em_comm_work *w, int sender, const int64_t *sent, int receiver,
                         const int64_t *into) {
  char a[120], b[120], d[EMI_COMM_MSG];
  header_str(a, sizeof a, sent);
  header_str(b, sizeof b, into);
  snprintf(w->errmsg, sizeof w->errmsg, "%.100s: replica %d sent %.120s but replica %d receives "
           "into %.120s; the shapes and dtypes must match", emi_coll_describe(d, w), sender, a,
           receiver, b);
}

static em_status mpi_p2p_post(em_comm *c, em_comm_work *w) {
  mpi_comm *m = c->impl;
  p2p_rec *p = calloc(1, sizeof *p);
  char d[EMI_COMM_MSG], e[MPI_MAX_ERROR_STRING + 64];
  if (!p) {
    snprintf(w->errmsg, sizeof w->errmsg, "%s: out of memory", emi_coll_describe(d, w));
    return EM_ERR_NOMEM;
  }
  p->w = w;
  int64_t bytes = w->count * (int64_t)em_dtype_size(w->dtype);
  int rc = MPI_SUCCESS;
  const char *call = "MPI_Isend";
  if (bytes > 0x7fffffff) {
    snprintf(w->errmsg, sizeof w->errmsg, "%s: more than 2 GiB in one message",
             emi_coll_describe(d, w));
    free(p);
    return EM_ERR_UNSUPPORTED;
  }
  if (w->kind == EMI_COLL_SEND) {
    describe_tensor(p->hdr, w);
    if ((rc = L.Isend(p->hdr, HDR_N, L.i64, w->peer, p2p_tag(w, 0), m->data, &p->req[0])) ==
        MPI_SUCCESS) {
      p->active[0] = 1;
      rc = L.Isend(w->in, (int)bytes, L.chr, w->peer, p2p_tag(w, 1), m->data, &p->req[1]);
      p->active[1] = rc == MPI_SUCCESS;
    }
    if (rc == MPI_SUCCESS) {
      call = "MPI_Irecv";
      rc = L.Irecv(p->ack, HDR_N, L.i64, w->peer, p2p_tag(w, 2), m->data, &p->req[2]);
      p->active[2] = rc == MPI_SUCCESS;
    }
  } else {
    call = "MPI_Irecv";
    rc = L.Irecv(p->hdr, HDR_N, L.i64, w->peer, p2p_tag(w, 0), m->data, &p->req[0]);
    p->active[0] = rc == MPI_SUCCESS;
  }
  if (rc != MPI_SUCCESS) {
    snprintf(w->errmsg, sizeof w->errmsg, "%.200s: %s: %.200s", emi_coll_describe(d, w), call,
             mpi_err(rc, e));
    p->w = NULL;
    if (p->active[0]) {           /* MPI holds part of it: keep it */
      em_tensor_retain(w->in_t);
      p->abandoned = 1;
      p->next = m->p2p;
      m->p2p = p;
    } else {
      free(p);
    }
    return EM_ERR_IO;
  }
  p->next = m->p2p;
  m->p2p = p;
  return EM_OK;
}

/* Tests request k of p: 1 when it has completed (or was never active). */
static int p2p_test(p2p_rec *p, int k, int *err) {
  if (!p->active[k]) return 1;
  int flag = 0;
  int rc = L.Test(&p->req[k], &flag, MPI_STATUS_IGNORE);
  if (rc != MPI_SUCCESS) { *err = rc; return 0; }
  if (flag) p->active[k] = 0;
  return flag;
}

/* One step of a pending item; returns 1 when it finished (w done). */
static int p2p_step(em_comm *c, mpi_comm *m, p2p_rec *p) {
  em_comm_work *w = p->w;
  char e[MPI_MAX_ERROR_STRING + 64], d[EMI_COMM_MSG];
  int err = MPI_SUCCESS;
  if (w->kind == EMI_COLL_SEND) {
    int done = p2p_test(p, 0, &err) & p2p_test(p, 1, &err) & p2p_test(p, 2, &err);
    if (err != MPI_SUCCESS) goto failed;
    if (!done) return 0;
    p->w = NULL;
    if (p->ack[0] == 1) {
      emi_comm_p2p_done(w, EM_OK);
    } else {
      mismatch_msg(w, c->rank, p->hdr, w->peer, p->ack + 1);
      emi_comm_p2p_done(w, EM_ERR_SHAPE);
    }
    return 1;
  }
  /* recv: header, then the bytes, then the acknowledgement leaves */
  if (p->active[0]) {
    if (!p2p_test(p, 0, &err)) {
      if (err != MPI_SUCCESS) goto failed;
      return 0;
    }
    int64_t mine[HDR_N] = {0};
    describe_tensor(mine, w);
    p->mismatch = p->hdr[0] != mine[0] || p->hdr[1] != mine[1];
    int64_t bytes = p->hdr[1] * (int64_t)em_dtype_size((em_dtype)p->hdr[0]);
    void *into = w->out;
    if (p->mismatch) {
      into = p->scratch = malloc(bytes > 0 ? (size_t)bytes : 1);
      if (!into) { err = MPI_ERR_NO_MEM; goto failed; }
    }
    int rc = L.Irecv(into, (int)bytes, L.chr, w->peer, p2p_tag(w, 1), m->data, &p->req[1]);
    if (rc != MPI_SUCCESS) { err = rc; goto failed; }
    p->active[1] = 1;
  }
  if (!p2p_test(p, 1, &err)) {
    if (err != MPI_SUCCESS) goto failed;
    return 0;
  }
  p->ack[0] = !p->mismatch;
  describe_tensor(p->ack + 1, w);
  if (L.Isend(p->ack, HDR_N, L.i64, w->peer, p2p_tag(w, 2), m->data, &p->req[2]) ==
      MPI_SUCCESS)
    p->active[2] = 1;
  p->w = NULL;
  if (p->mismatch) {
    mismatch_msg(w, w->peer, p->hdr, c->rank, p->ack + 1);
    emi_comm_p2p_done(w, EM_ERR_SHAPE);
  } else {
    emi_comm_p2p_done(w, EM_OK);
  }
  return 1;
failed:
  snprintf(w->errmsg, sizeof w->errmsg, "%.200s: %.200s", emi_coll_describe(d, w),
           mpi_err(err, e));
  p->abandoned = 1;
  em_tensor_retain(w->in_t);
  p->w = NULL;
  emi_comm_p2p_done(w, EM_ERR_IO);
  return 1;
}

/* Why a pending item must be given up now (text into msg), or 0. */
static int p2p_why(em_comm *c, mpi_comm *m, const em_comm_work *w, int stopping, char *msg) {
  char d[EMI_COMM_MSG];
  emi_coll_describe(d, w);
  if (emi_comm_failed(c)) {
    pthread_mutex_lock(&c->mu);
    snprintf(msg, EMI_COMM_MSG, "%.200s: %.280s", d, c->failure);
    pthread_mutex_unlock(&c->mu);
  } else if (m->exited[w->peer] >= 0) {
    snprintf(msg, EMI_COMM_MSG, "%.200s: replica %d exited", d, w->peer);
  } else if (emi_now() - w->t_begin > c->timeout_s) {
    snprintf(msg, EMI_COMM_MSG, "%.200s timed out after %g s: replica %d did not %s", d,
             c->timeout_s, w->peer, w->kind == EMI_COLL_SEND ? "receive it" : "send");
  } else if (stopping) {
    snprintf(msg, EMI_COMM_MSG, "%.200s: the communicator was freed before replica %d %s", d,
             w->peer, w->kind == EMI_COLL_SEND ? "received it" : "sent");
  } else {
    return 0;
  }
  return 1;
}

static void mpi_p2p_progress(em_comm *c, int stopping) {
  mpi_comm *m = c->impl;
  ctl_poll(c, m);
  for (p2p_rec **pp = &m->p2p; *pp;) {
    p2p_rec *p = *pp;
    if (p->w && !p2p_step(c, m, p)) {
      char msg[EMI_COMM_MSG];
      if (p2p_why(c, m, p->w, stopping, msg)) {
        em_comm_work *w = p->w;
        snprintf(w->errmsg, sizeof w->errmsg, "%s", msg);
        em_tensor_retain(w->in_t);      /* MPI may still write or read it */
        p->abandoned = 1;
        p->w = NULL;
        emi_comm_p2p_done(w, EM_ERR_IO);
      }
    }
    if (!p->w && !p->abandoned) {       /* finished: the acknowledgement leaves */
      int err = MPI_SUCCESS;
      if (!p2p_test(p, 2, &err) && err == MPI_SUCCESS) { pp = &p->next; continue; }
      *pp = p->next;
      free(p->scratch);
      free(p);
      continue;
    }
    if (p->abandoned) {                 /* kept, out of the list */
      *pp = p->next;
      continue;
    }
    pp = &p->next;
  }
}

static void mpi_abort_notify(em_comm *c, int own) {
  mpi_comm *m = c->impl;
  if (own) __atomic_store_n(&m->fail_pending, 1, __ATOMIC_RELEASE);
}

static em_status mpi_thread_start(em_comm *c, char *err) {
  mpi_comm *m = c->impl;
  char e[MPI_MAX_ERROR_STRING + 64];
  int inited = 0, finalized = 0, provided = 0, rc;
  L.Initialized(&inited);
  L.Finalized(&finalized);
  if (finalized) {
    snprintf(err, EMI_COMM_MSG, "comm_mpi: the host has already finalized MPI in this "
             "process (MPI cannot be initialised again)");
    return EM_ERR_UNSUPPORTED;
  }
  if (inited) {
    /* The host initialised MPI itself: we may join only if any thread may call. */
    L.Query_thread(&provided);
    if (provided != MPI_THREAD_MULTIPLE) {
      snprintf(err, EMI_COMM_MSG, "comm_mpi: MPI was initialised by the host with thread "
               "level %d; ember calls MPI from its communicator's thread and needs "
               "MPI_THREAD_MULTIPLE (or let ember initialise MPI)", provided);
      return EM_ERR_UNSUPPORTED;
    }
  } else {
    /* Open MPI's default non-blocking allreduce (libnbc) moves about 1 GB/s on
    ** 2 ranks here, whatever the size; Rabenseifner's (reduce-scatter, then
    ** allgather: bandwidth-optimal, as the local communicator) 3-8 GB/s
    ** (tests/bench/bench_allreduce.lua). A choice the user made stays. */
    setenv("OMPI_MCA_coll_libnbc_iallreduce_algorithm", "3", 0);
    if ((rc = L.Init_thread(NULL, NULL, MPI_THREAD_FUNNELED, &provided)) != MPI_SUCCESS) {
      snprintf(err, EMI_COMM_MSG, "comm_mpi: MPI_Init_thread failed: %s", mpi_err(rc, e));
      return EM_ERR_IO;
    }
    m->initialised = 1;
    if (provided < MPI_THREAD_FUNNELED) {
      snprintf(err, EMI_COMM_MSG, "comm_mpi: this MPI offers thread level %d, ember needs "
               "MPI_THREAD_FUNNELED", provided);
      return EM_ERR_UNSUPPORTED;
    }
  }
  if ((rc = L.Comm_dup(L.world, &m->data)) != MPI_SUCCESS ||
      (rc = L.Comm_dup(L.world, &m->ctl)) != MPI_SUCCESS) {
    snprintf(err, EMI_COMM_MSG, "comm_mpi: MPI_Comm_dup failed: %s", mpi_err(rc, e));
    return EM_ERR_IO;
  }
  m->dups = 1;
  /* Errors come back as codes (the default handler would kill the process). */
  L.Comm_set_errhandler(m->data, L.errors_return);
  L.Comm_set_errhandler(m->ctl, L.errors_return);
  int rank = 0, size = 1;
  L.Comm_rank(m->data, &rank);
  L.Comm_size(m->data, &size);
  m->answers = calloc((size_t)size, sizeof *m->answers);
  m->exited = malloc((size_t)size * sizeof *m->exited);
  m->nsends = 4 * size + 4;
  m->sends = calloc((size_t)m->nsends, sizeof *m->sends);
  if (!m->answers || !m->exited || !m->sends) {
    snprintf(err, EMI_COMM_MSG, "comm_mpi: out of memory");
    return EM_ERR_NOMEM;
  }
  for (int r = 0; r < size; r++) m->exited[r] = -1;
  /* Known only now; the creator reads them after this thread reports ready. */
  c->rank = rank;
  c->size = size;
  return EM_OK;
}

static void mpi_thread_stop(em_comm *c) {
  mpi_comm *m = c->impl;
  if (!m->dups) return;
  send_fails(c, m);
  double t0 = emi_now();
  while (ctl_progress(m) && emi_now() - t0 < SEND_WAIT_S) nap(100000);
  while (m->p2p && emi_now() - t0 < SEND_WAIT_S) {     /* acknowledgements leaving */
    mpi_p2p_progress(c, 1);
    if (m->p2p) nap(100000);
  }
  if (emi_comm_failed(c)) return;      /* no MPI_Finalize: peers may be gone */
  ctl_poll(c, m);                      /* answer what is still asked */
  uint64_t last[2] = {m->started, 0};  /* and say that we leave */
  for (int r = 0; r < c->size; r++)
    if (r != c->rank) ctl_post(m, r, TAG_EXIT, last, 2, L.u64, sizeof last);
  while (ctl_progress(m) && emi_now() - t0 < SEND_WAIT_S) nap(100000);
  L.Comm_free(&m->ctl);
  L.Comm_free(&m->data);
  if (m->initialised) {
    int done = 0;
    L.Finalized(&done);
    if (!done) L.Finalize();
  }
}

static void mpi_destroy(em_comm *c) {
  mpi_comm *m = c->impl;
  free(m->answers);
  free(m->exited);
  free(m->sends);
  free(m);
  /* MPI cannot be initialised again in this process, finalized or not. */
  pthread_mutex_lock(&lib_mu);
  mpi_phase = MPI_SPENT;
  pthread_mutex_unlock(&lib_mu);
}

static const emi_comm_backend mpi_backend = {
  .name = "mpi",
  .thread_start = mpi_thread_start,
  .run = mpi_run,
  .idle = mpi_idle,
  .p2p_post = mpi_p2p_post,
  .p2p_progress = mpi_p2p_progress,
  .abort_notify = mpi_abort_notify,
  .thread_stop = mpi_thread_stop,
  .destroy = mpi_destroy,
};

em_status em_comm_mpi(em_state *S, double timeout_s, em_comm **out) {
  if (!out) return emi_error(S, EM_ERR_ARG, "comm_mpi: NULL output");
  *out = NULL;
  pthread_mutex_lock(&lib_mu);
  em_status st = EM_OK;
  if (mpi_phase == MPI_OPEN)
    st = emi_error(S, EM_ERR_UNSUPPORTED, "comm_mpi: MPI communicator already open in this "
                   "process (there can be one: keep it and share it)");
  else if (mpi_phase == MPI_SPENT)
    st = emi_error(S, EM_ERR_UNSUPPORTED, "comm_mpi: this process already had an MPI "
                   "communicator, and MPI can be initialised only once per process "
                   "(keep one communicator for the whole job)");
  else
    st = load_lib(S);
  if (!st) mpi_phase = MPI_OPEN;
  pthread_mutex_unlock(&lib_mu);
  if (st) return st;
  mpi_comm *m = calloc(1, sizeof *m);
  if (!m) st = emi_error(S, EM_ERR_NOMEM, "comm_mpi: out of memory");
  int rank = 0, size = 1;
  em_mpi_launched(&rank, &size);
  if (!st) st = emi_comm_new(S, &mpi_backend, m, rank, size > 0 ? size : 1, timeout_s, out);
  if (st) {
    pthread_mutex_lock(&lib_mu);
    mpi_phase = m && m->initialised ? MPI_SPENT : MPI_UNUSED;
    pthread_mutex_unlock(&lib_mu);
    if (m) {
      free(m->answers);
      free(m->sends);
      free(m);
    }
  }
  return st;
}

#endif /* EMI_HAVE_MPI_H */

/*
** comm.h -- the inside of a communicator (core/dist/): what comm.c (the public
** em_comm_* calls, the work queue and its thread) shares with the backends that
** move the bytes: local.c (threads of one process, shared memory) and mpi.c
** (processes, through a libmpi loaded at run time), and nccl.c (GPU replicas:
** one more emi_comm_backend on real GPUs; on emulated devices a host backend
** with the device buffers staged around it by commdev.c -- see "Device
** communicators").
**
** The model. Every communicator owns one thread, its "comm thread", and a FIFO
** of work items. A collective call checks its arguments on the caller's thread,
** stages a non-contiguous tensor into a contiguous buffer, and queues a work
** item; the comm thread runs the items one after another through
** backend->run, which returns when the collective is complete on this replica.
** So collectives leave every replica in the order they were called (the order
** MPI requires and that the local group relies on), the caller's thread is free
** to go on computing (overlap with backward), and a backend never needs to be
** thread-safe: only the comm thread calls it -- with two exceptions, `wake`
** and `abort_notify`, which any thread may call to make a waiting `run` look at
** the failure flag.
**
** Failure. c->failure (under c->mu) is set once, by the first of: this replica
** aborting (em_comm_abort), a backend learning that another replica failed, or a
** timeout. From then on every queued and new item fails with that message.
**
** Point-to-point (send, recv). These break the rule the collectives live by --
** every replica calls the same ones in the same order -- so they are kept apart
** from the collectives' bookkeeping:
**   numbering  a collective's w->seq counts collectives only (c->next_seq);
**              a send's counts the sends to that peer, a recv's the recvs from
**              that peer, on its channel (c->chans; see below). So a pipeline stage that receives twice
**              and sends once per micro-batch still meets the other replicas'
**              allreduce #7 as #7, timeout messages that compare collective
**              numbers stay right, and no mismatch check ever compares a send
**              with a collective. Send #k to replica j is matched with replica
**              j's recv #k from us: the pair's own order.
**   progress   the comm thread does not run a send or recv to its end, as two
**              replicas that each wait to receive before they send (async
**              recv, then send) would hang each other's threads. It posts the
**              item (backend->p2p_post), counts it in c->p2p_pending, and moves
**              on to the next item; the item finishes later, on whichever
**              thread completes it (the peer's comm thread when it posts the
**              matching item, or this one in p2p_progress), through
**              emi_comm_p2p_done. Collectives queued after a send therefore do
**              not wait for it, but every item is still posted in call order.
**   never hang while anything is pending, the comm thread wakes every
**              EMI_COMM_IDLE_S to call p2p_progress, which fails what waited
**              past the timeout, whose peer failed or left, or (freeing) all.
** A send is a rendezvous: it finishes once the peer has the bytes, the way
** NCCL's does, and is never copied in between.
*/
#ifndef EMBER_DIST_COMM_H
#define EMBER_DIST_COMM_H
#include "../internal.h"


enum { EMI_COMM_MSG = 512 };

struct em_comm_work {
  emi_coll_kind kind;
  em_comm_op op;           /* allreduce, reduce_scatter */
  int root;                  /* broadcast */
  em_dtype dtype;
  int64_t count;             /* elements of this replica's input */
  /* Contiguous buffers: in == out for allreduce and broadcast; allgather's out
  ** has count * size elements, reduce_scatter's count / size. */
  void *in, *out;
  uint64_t seq;              /* 1, 2, ... per communicator, in call order (send /
                             ** recv: per peer and direction, see above) */
  int peer;                  /* send / recv: the other replica */
  int chan;                  /* send / recv: the channel (EMI_CHAN_*; a group's, group.c) */
  struct em_comm_work *p2p_next;  /* the backend's matching queue */
  /* -- caller's side (comm.c) */
  em_tensor *user;           /* the caller's tensor to copy back into, or NULL */
  em_tensor *in_t, *out_t;   /* references that keep in/out alive */
  em_comm *comm;
  /* -- set by the comm thread */
  int done;                  /* under comm->mu */
  em_status status;
  char errmsg[EMI_COMM_MSG];
  /* Monotonic seconds (emi_now): begun by the comm thread, every replica there
  ** (the local backend knows; others leave t_begin), done. */
  double t_begin, t_ready, t_end;
  /* -- device communicators (c->dev): the tensors' device pointers while in/out
  ** point at host staging (emulation), and the two events that order the
  ** collective against the compute stream (commdev.c) */
  void *dev_in, *dev_out;
  void *ev_ready, *ev_done;
  /* a staged recv into a device tensor: the device communicator whose pinned
  ** buffer carries it there at the wait (comm.c, work_copy_back) */
  struct emi_commdev *stage_dev;
  struct em_comm_work *next;
};

typedef struct emi_comm_backend {
  const char *name;
  /* On the comm thread, before any work (MPI initialises here, and sets c->rank
  ** and c->size, which the creator reads only after this returned). Error: text
  ** into err (EMI_COMM_MSG bytes). */
  em_status (*thread_start)(em_comm *c, char *err);
  /* On the comm thread: the whole collective, on this replica. Returns EM_OK, or
  ** an error with the text in w->errmsg; a failure that is final for the
  ** communicator (another replica failed, a timeout) goes through
  ** emi_comm_fail as well. */
  em_status (*run)(em_comm *c, em_comm_work *w);
  /* 1 when run reads and writes device memory itself (NCCL on a real GPU);
  ** 0 when a device communicator's buffers are staged through host memory
  ** around run (comm.c does it: the host backends and emulated devices). */
  int device_native;
  /* On the comm thread, about every EMI_COMM_IDLE_S while the queue is empty (MPI
  ** answers other replicas' questions here). May be NULL. */
  void (*idle)(em_comm *c);
  /* Any thread, after c->failure was set: wake a `run` that is waiting and (for
  ** this replica's own abort) tell the others. May be NULL. */
  void (*abort_notify)(em_comm *c, int own);
  /* On the comm thread: start a send or recv (w->kind, w->peer, w->in / w->out,
  ** w->count of w->dtype). EM_OK: it is pending, and finishes later through
  ** emi_comm_p2p_done (any thread). An error: it failed at once (w->errmsg).
  ** NULL: the backend has no point-to-point (em_comm_send says so). */
  em_status (*p2p_post)(em_comm *c, em_comm_work *w);
  /* On the comm thread while items are pending (about every EMI_COMM_IDLE_S and
  ** after each collective): finish what it can; fail what timed out or whose
  ** peer failed or left; with stopping = 1 (em_comm_free) fail all of them. */
  void (*p2p_progress)(em_comm *c, int stopping);
  /* 1 when p2p_post and p2p_progress may run on any thread at once (local: under
  ** its group's lock): emi_comm_p2p_queue then posts at once, so that a group's
  ** transfers (group.c) never wait behind this communicator's collectives. */
  int p2p_any_thread;
  /* Optional, when p2p_post is NULL: the communicator that carries this one's
  ** sends and recvs (NCCL's host communicator), with tensors staged on the host. */
  em_comm *(*p2p_via)(em_comm *c);
  /* On the comm thread when the communicator is freed (MPI finalizes). */
  void (*thread_stop)(em_comm *c);
  /* Any thread, after the comm thread has ended: free impl. */
  void (*destroy)(em_comm *c);
} emi_comm_backend;

#define EMI_COMM_IDLE_S 0.005

struct em_comm {
  em_state *S;               /* the replica's state: its profiler records collectives */
  const emi_comm_backend *be;
  void *impl;                /* the backend's own */
  int rank, size;
  double timeout_s;
  pthread_t thread;
  int thread_started;
  pthread_mutex_t mu;
  pthread_cond_t cv;         /* work done, queue changed, failure */
  em_comm_work *head, *tail; /* queued, not yet run */
  uint64_t next_seq;
  int stopping;
  int failed;                /* atomic reads; written under mu */
  double test_gbps;          /* EMBER_TEST_COMM_GBPS: a bandwidth cap for tests */
  struct emi_commdev *dev;   /* tensors on a CUDA device (NULL: CPU tensors) */
  const char *label;         /* em_comm_backend's answer when not be->name */
  unsigned char nccl_id[128];  /* the NCCL unique id this communicator shared (nccl.c) */
  int nccl_id_ok;
  int p2p_pending;           /* posted sends / recvs not yet done, under mu */
  em_comm_work *p2p_fin;     /* under mu: done on other threads, for this one to
                             ** finish (while profiling: comm.c) */
  struct emi_p2p_chan *chans;  /* under mu: per channel, sends to / recvs from each peer */
  int next_chan;             /* under mu: the lowest channel no group of this one holds */
  /* A group (group.c): its members' ranks in the world communicator that carries
  ** its bytes, so that messages say "replica 2 (world 5)"; NULL otherwise. */
  const int *world_of;
  char failure[EMI_COMM_MSG];
};

/* Channels of point-to-point. Every send / recv belongs to one, and the k-th send
** to a peer meets that peer's k-th recv from us *on the same channel*: channels
** are independent streams between the same two replicas. The script's own sends
** are on EMI_CHAN_USER; groups (group.c) agree on a pair of channels of their
** own when they are made, over EMI_CHAN_SETUP. */
enum { EMI_CHAN_USER = 0, EMI_CHAN_SETUP = 1, EMI_CHAN_FIRST_GROUP = 2 };

/* Queues a send or recv on c (any thread; touches no em_state): w->kind, peer,
** chan, dtype, count, in / out are the caller's, w->in_t may be NULL. The item
** finishes like em_comm_send's (w->done under c->mu, c->cv broadcast); with
** be->p2p_any_thread it is posted at once on this thread, otherwise when c's
** comm thread reaches it (after c's collectives queued before it). EM_ERR_NOMEM
** (nothing queued) when the channel's counters cannot be made. */
em_status emi_comm_p2p_queue(em_comm *c, em_comm_work *w);
/* The communicator whose backend carries c's sends and recvs (c itself, NCCL's
** host communicator), or NULL when there is none. */
em_comm *emi_comm_p2p_carrier(em_comm *c);
/* "replica 2" or, on a group, "replica 2 (world 5)" into buf (64 bytes). */
const char *emi_comm_who(char *buf, const em_comm *c, int rank);

/* A posted send or recv has finished (any thread; w->errmsg holds the error).
** After this w belongs to its waiter (while profiling, once this communicator's
** thread has recorded it). */
void emi_comm_p2p_done(em_comm_work *w, em_status st);

/* Sets the communicator's final failure (first caller wins) and wakes everyone.
** own = 1 when this replica itself failed (the backend then tells the others). */
void emi_comm_fail(em_comm *c, int own, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static inline int emi_comm_failed(em_comm *c) {
  return __atomic_load_n(&c->failed, __ATOMIC_ACQUIRE);
}
/* "allreduce #12 (float32 x 1000)" into buf (EMI_COMM_MSG bytes). */
const char *emi_coll_describe(char *buf, const em_comm_work *w);
const char *emi_coll_name(emi_coll_kind k);
/* Queues w on c and waits for it, touching no em_state (for a backend that runs
** a collective through another communicator from its own comm thread). The
** error, if any, is in w->errmsg. */
em_status emi_comm_call(em_comm *c, em_comm_work *w);
/* Whether c shared an NCCL id (nccl.c) and which (tests). */
int emi_comm_nccl_id(const em_comm *c, unsigned char id[128]);
/* Makes a communicator around a backend and starts its thread (thread_start runs
** there first; its error is returned with the text in S). */
em_status emi_comm_new(em_state *S, const emi_comm_backend *be, void *impl, int rank,
                       int size, double timeout_s, em_comm **out);
/* The same for a device communicator: c->dev = dev before thread_start (on
** failure dev is still the caller's). */
em_status emi_comm_new_dev(em_state *S, const emi_comm_backend *be, void *impl, int rank,
                           int size, double timeout_s, struct emi_commdev *dev,
                           em_comm **out);

/* -- Device communicators (core/dist/nccl.c, commdev.c) ----------------------------
** A communicator whose tensors live on one accelerator device of its state.
** What touches the device is commdev.c, through the device's services table (its
** compute stream, the communicator's own two streams, events, staging copies and its
** collective engine), so core/ has no device code of its own. The order of a collective on a device:
**   caller's thread  mark: an event on the compute stream after the work that
**                    wrote the input (the gradients that fill a bucket);
**   comm thread      emulation: wait_mark (poll that event, bounded by failure
**                    and timeout), stage_in (D2H), the host collective,
**                    stage_out (H2D, then an event on the collective stream);
**                    NCCL: order (the communicator's stream -- collectives',
**                    or sends' and recvs' -- waits for the mark), the call on
**                    it, then that event, polled;
**   caller's thread  join (at wait): the compute stream waits for the comm
**                    stream's event, so the optimizer reads averaged values. */
typedef struct emi_commdev emi_commdev;
em_status emi_commdev_open(em_state *S, int device, emi_commdev **out);
void emi_commdev_close(emi_commdev *d);
/* Bytes of pinned staging held: the comm thread's (returned) and the callers'
** (*xfer, may be NULL) -- tests. */
size_t emi_commdev_staging(const emi_commdev *d, size_t *xfer);
/* The communicator's own stream of collectives (p2p = 0) or sends and recvs. */
int emi_commdev_stream(const emi_commdev *d, int p2p);
/* Caller's thread, emulation's staged sends and recvs: n bytes between device
** memory (after the compute stream's work) and host memory, through the pinned
** buffer; waited for. Errors into S, op names the call. */
em_status emi_commdev_to_host(em_state *S, emi_commdev *d, void *dst, const void *src, size_t n,
                              const char *op);
em_status emi_commdev_from_host(em_state *S, emi_commdev *d, void *dst, const void *src,
                                size_t n, const char *op);
int emi_commdev_device(const emi_commdev *d);
int emi_commdev_native(const emi_commdev *d);      /* 1: a real GPU (NCCL runs) */
/* Caller's thread. Errors into S. */
em_status emi_commdev_mark(em_state *S, emi_commdev *d, em_comm_work *w);
em_status emi_commdev_join(em_state *S, emi_commdev *d, em_comm_work *w);
void emi_commdev_release(emi_commdev *d, em_comm_work *w);   /* the events */
/* Comm thread. Errors into w->errmsg (and emi_comm_fail for a timeout). */
em_status emi_commdev_wait_mark(em_comm *c, em_comm_work *w);
em_status emi_commdev_order(em_comm *c, em_comm_work *w);   /* its stream waits */
em_status emi_commdev_stage_in(em_comm *c, em_comm_work *w);
em_status emi_commdev_stage_out(em_comm *c, em_comm_work *w);
/* Comm thread, real GPUs: the collective stream's event after the NCCL
** calls, polled; poll() (may be NULL) is asked in between (NCCL's async error). */
em_status emi_commdev_finish(em_comm *c, em_comm_work *w,
                             em_status (*poll)(em_comm *c, char *err));
/* Comm thread, real GPUs: a send's or recv's "done" event on the p2p stream
** (into w->ev_done), and whether it was reached (no waiting). */
em_status emi_commdev_record_done(em_comm *c, em_comm_work *w);
em_status emi_commdev_query_done(em_comm *c, em_comm_work *w, int *done);
/* Any thread, no GPU needed: ncclGetUniqueId's 128 bytes / ncclGetVersion. */
enum { EMI_NCCL_ID_BYTES = 128 };
em_status emi_nccl_unique_id(unsigned char id[EMI_NCCL_ID_BYTES], char *err, size_t errlen);
em_status emi_nccl_version(int *code, char *err, size_t errlen);
/* The id exchange of core/dist/nccl.c: rank 0's id broadcast through the host
** communicator boot (local group or MPI); id is rank 0's on return everywhere. */
em_status emi_nccl_share_id(em_state *S, em_comm *boot, unsigned char id[EMI_NCCL_ID_BYTES]);
/* The device's collective engine (NCCL on a real GPU), through its services
** table; EM_ERR_UNSUPPORTED in a build without the CUDA headers. The handle is
** opaque. init runs ncclCommInitRankConfig non-blocking, polled up to
** timeout_s; issue queues w's collective -- or its ncclSend / ncclRecv -- on the
** communicator's stream for it (between group(1) and group(0)); async_error is ncclCommGetAsyncError as an em_status. */
em_status emi_nccl_init(emi_commdev *d, const unsigned char id[EMI_NCCL_ID_BYTES], int rank,
                        int size, double timeout_s, void **out, char *err, size_t errlen);
em_status emi_nccl_group(emi_commdev *d, void *n, int start, char *err, size_t errlen);
em_status emi_nccl_issue(void *n, emi_commdev *d, em_comm_work *w, char *err, size_t errlen);
em_status emi_nccl_async_error(emi_commdev *d, void *n, char *err, size_t errlen);
/* How long the comm thread naps between looks at an event it waits for, having
** waited waited_s so far: 0 = no nap, only sched_yield (commdev.c). */
double emi_poll_nap_s(double waited_s);
/* The replica that left local group g (em_local_group_leave) -- peer itself, or
** with peer < 0 the first one -- and when (emi_now, into *at), or -1 (local.c). */
int emi_local_group_left(em_local_group *g, int peer, double *at);
/* nccl.c: whether a wait on NCCL fails at now because a replica of g other than
** self left ("replica K exited" into msg); see there for the grace. */
#define EMI_NCCL_LEFT_GRACE_S 0.5   /* why this long: nccl.c, emi_nccl_peer_left */
int emi_nccl_peer_left(em_local_group *g, int self, int peer, double now, char *msg,
                       size_t n);
/* ncclCommDestroy, or ncclCommAbort with abort = 1. */
void emi_nccl_free(emi_commdev *d, void *n, int abort);                /* ncclCommDestroy / ncclCommAbort */

/* -- Reduction kernels (reduce.c) ---------------------------------------------------
** out[i] = op over k of in[k][i], k = 0 .. n-1 in that order (so the result never
** depends on timing), for i in [0, count); float16/bfloat16 accumulate in float32
** and round once; mean divides the sum by n. out may alias any in[k]. */
void emi_reduce_buffers(em_dtype dt, em_comm_op op, void *out, const void *const *in,
                        int n, int64_t count);
/* The same, writing the result into every out[k] (k < nout). */
void emi_reduce_buffers_to(em_dtype dt, em_comm_op op, void *const *out, int nout,
                           const void *const *in, int n, int64_t count);

#endif

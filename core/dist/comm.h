/*
** comm.h -- the inside of a communicator (core/dist/): what comm.c (the public
** em_comm_* calls, the work queue and its thread) shares with the backends that
** move the bytes: local.c (threads of one process, shared memory) and mpi.c
** (processes, through a libmpi loaded at run time). The NCCL backend of the CUDA
** milestone plugs in here the same way: one more emi_comm_backend.
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
*/
#ifndef EMBER_DIST_COMM_H
#define EMBER_DIST_COMM_H
#include "../internal.h"

typedef enum emi_coll_kind {
  EMI_COLL_ALLREDUCE, EMI_COLL_BROADCAST, EMI_COLL_ALLGATHER, EMI_COLL_REDUCE_SCATTER,
  EMI_COLL_BARRIER
} emi_coll_kind;

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
  uint64_t seq;              /* 1, 2, ... per communicator, in call order */
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
  /* On the comm thread, about every EMI_COMM_IDLE_S while the queue is empty (MPI
  ** answers other replicas' questions here). May be NULL. */
  void (*idle)(em_comm *c);
  /* Any thread, after c->failure was set: wake a `run` that is waiting and (for
  ** this replica's own abort) tell the others. May be NULL. */
  void (*abort_notify)(em_comm *c, int own);
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
  char failure[EMI_COMM_MSG];
};

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
/* Makes a communicator around a backend and starts its thread (thread_start runs
** there first; its error is returned with the text in S). */
em_status emi_comm_new(em_state *S, const emi_comm_backend *be, void *impl, int rank,
                       int size, double timeout_s, em_comm **out);

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

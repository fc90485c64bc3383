/*
** nccl_real.c -- NCCL communicators for GPU replicas on real devices (the
** device half of core/dist/nccl.c, reached from core/dist/commdev.c through the
** services table's collective entries in kernels/services.c).
** libnccl is loaded with dlopen like the other CUDA libraries (libs.h), so every
** call goes through the emk_nccl_fns table.
**
** Never blocking without a limit. A communicator is made non-blocking
** (config.blocking = 0): ncclCommInitRankConfig, the collectives and
** ncclGroupEnd may return ncclInProgress, and ncclCommGetAsyncError is polled
** until the operation left that state -- bounded by the strategy's timeout, after
** which the caller aborts the communicator (ncclCommAbort), which is the only
** way to get a rank out of NCCL when a peer died. Sends and recvs (ncclSend /
** ncclRecv, device to device) are issued the same way. Completion of the queued
** collectives themselves is an event on the stream each was issued on (the
** communicator's own, commdev.c), which commdev.c polls,
** asking ncclCommGetAsyncError in between (a peer gone shows there as
** ncclRemoteError or ncclSystemError).
**
** No communicator left behind. ncclCommInitRankConfig hands a communicator back
** before it is usable -- always when it answers ncclInProgress, and it may also
** set one when it fails at once -- so every failure from that call on (an error
** returned with the communicator set, an asynchronous error while settling, the
** time limit, ncclCommGetAsyncError itself failing) aborts it (comm_init): a
** leaked communicator keeps NCCL's bootstrap threads, sockets and device memory.
** A failed finalize at destroy aborts too.
**
** Not run on a GPU by its author: it compiles against the real nccl.h, what NCCL
** does without a GPU (ncclGetVersion, ncclGetUniqueId) is tested through libs.c,
** and comm_init and destroy are driven through every failure above by a scripted
** stand-in for NCCL's table (emk_nccl_script_check, tests/c/test_comm_nccl.c).
*/
#include "real.h"
#include "backend.h"
#include <stdio.h>
#include <stdlib.h>
#include <sched.h>
#include <string.h>
#include <time.h>

#ifdef EMK_HAVE_NCCL_H

typedef struct emk_nccl {
  emr *R;
  const emk_nccl_fns *f;
  int dev, nranks;
  ncclComm_t comm;
  double timeout_s;
} emk_nccl;

static em_status nccl_err(emk_nccl *n, ncclResult_t r, const char *call, char *err,
                          size_t errlen) {
  const char *last = n->f->ncclGetLastError ? n->f->ncclGetLastError(n->comm) : NULL;
  return emk_errf(err, errlen, r == ncclUnhandledCudaError || r == ncclSystemError ||
                  r == ncclRemoteError ? EM_ERR_IO : EM_ERR_DEVICE,
                  "NCCL (cuda:%d): %s: %s%s%s", n->dev, call, n->f->ncclGetErrorString(r),
                  last && *last ? ": " : "", last && *last ? last : "");
}

/* Polling a call in progress, cheap for latency: a ncclGroupEnd that launches
** one collective is in progress for microseconds, and the collective waits on
** the host for it -- so the first SETTLE_SPIN_S only yield the core, then naps
** of a quarter of the time waited so far (the lateness stays within 25%), from
** SETTLE_NAP_MIN_S up to SETTLE_NAP_MAX_S (an init that takes seconds is seen
** within 200 us). The same policy as core/dist/commdev.c's emi_poll_nap_s. */
#define SETTLE_SPIN_S 40e-6
#define SETTLE_NAP_MIN_S 10e-6
#define SETTLE_NAP_MAX_S 200e-6

static void settle_nap(double waited_s) {
  if (waited_s < SETTLE_SPIN_S) {
    sched_yield();
    return;
  }
  double s = waited_s / 4;
  s = s < SETTLE_NAP_MIN_S ? SETTLE_NAP_MIN_S : s > SETTLE_NAP_MAX_S ? SETTLE_NAP_MAX_S : s;
  struct timespec ts = {0, (long)(s * 1e9)};
  nanosleep(&ts, NULL);
}

static double since(const struct timespec *t0) {
  struct timespec now;
  clock_gettime(CLOCK_MONOTONIC, &now);
  return (double)(now.tv_sec - t0->tv_sec) + (now.tv_nsec - t0->tv_nsec) * 1e-9;
}

/* A non-blocking call returned r: wait (polling the communicator's state) until
** it is no longer in progress, at most timeout_s. */
static em_status settle(emk_nccl *n, ncclResult_t r, const char *call, char *err,
                        size_t errlen) {
  struct timespec t0;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  while (r == ncclInProgress) {
    if (!n->comm)
      return emk_errf(err, errlen, EM_ERR_DEVICE, "NCCL (cuda:%d): %s: in progress without "
                      "a communicator", n->dev, call);
    settle_nap(since(&t0));
    ncclResult_t st = n->f->ncclCommGetAsyncError(n->comm, &r);
    if (st != ncclSuccess) r = st;
    if (r == ncclInProgress && since(&t0) > n->timeout_s)
      return emk_errf(err, errlen, EM_ERR_IO, "NCCL (cuda:%d): %s did not complete within "
                      "%g s (a peer did not join)", n->dev, call, n->timeout_s);
  }
  return r == ncclSuccess ? EM_OK : nccl_err(n, r, call, err, errlen);
}

/* n->comm for rank of n->nranks (n->f, dev, timeout_s set; the device current):
** EM_OK, or an error with no communicator left (see the top). */
static em_status comm_init(emk_nccl *n, const unsigned char *id, int rank, char *err,
                           size_t errlen) {
  ncclUniqueId uid;
  memcpy(&uid, id, sizeof uid);
  ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
  cfg.blocking = 0;
  n->comm = NULL;
  ncclResult_t r = n->f->ncclCommInitRankConfig(&n->comm, n->nranks, uid, rank, &cfg);
  em_status st = r != ncclSuccess && r != ncclInProgress
                     ? nccl_err(n, r, "ncclCommInitRankConfig", err, errlen)
                     : settle(n, r, "ncclCommInitRankConfig", err, errlen);
  if (st && n->comm) {
    n->f->ncclCommAbort(n->comm);
    n->comm = NULL;
  }
  return st;
}

em_status emk_nccl_init(emk_runtime *rt, int dev, const unsigned char *id, int rank,
                        int nranks, double timeout_s, emk_nccl **out, char *err,
                        size_t errlen) {
  *out = NULL;
  if (strcmp(rt->ops->name, "cuda") != 0)
    return emk_errf(err, errlen, EM_ERR_UNSUPPORTED, "NCCL needs the real CUDA runtime");
  emr *R = rt->impl;
  const emk_nccl_fns *f;
  em_status st = emk_libs_nccl(R->L, &f, err, errlen);
  if (st) return st;
  emk_nccl *n = calloc(1, sizeof *n);
  if (!n) return emk_errf(err, errlen, EM_ERR_NOMEM, "NCCL: out of memory");
  n->R = R;
  n->f = f;
  n->dev = dev;
  n->nranks = nranks;
  n->timeout_s = timeout_s;
  /* NCCL binds the communicator to the calling thread's current device */
  cudaError_t ce = R->f->cudaSetDevice(dev);
  if (ce != cudaSuccess) {
    free(n);
    return emk_errf(err, errlen, EM_ERR_DEVICE, "NCCL: cudaSetDevice(%d): %s", dev,
                    R->f->cudaGetErrorString(ce));
  }
  if ((st = comm_init(n, id, rank, err, errlen))) {
    free(n);
    return st;
  }
  *out = n;
  return EM_OK;
}

em_status emk_nccl_group(emk_nccl *n, int start, char *err, size_t errlen) {
  ncclResult_t r = start ? n->f->ncclGroupStart() : n->f->ncclGroupEnd();
  if (start) return r == ncclSuccess ? EM_OK : nccl_err(n, r, "ncclGroupStart", err, errlen);
  return settle(n, r, "ncclGroupEnd", err, errlen);
}

static int nccl_type(em_dtype dt, ncclDataType_t *out) {
  switch (dt) {
  case EM_FLOAT32: *out = ncclFloat32; return 1;
  case EM_FLOAT64: *out = ncclFloat64; return 1;
  case EM_FLOAT16: *out = ncclFloat16; return 1;
  case EM_BFLOAT16: *out = ncclBfloat16; return 1;
  case EM_INT32: *out = ncclInt32; return 1;
  case EM_INT64: *out = ncclInt64; return 1;
  default: return 0;
  }
}

/* A send or recv moves bytes, whatever the dtype (uint8 and bool too): count
** elements of dt as ncclUint8. peer is the other rank. ncclSend and ncclRecv are
** optional in the table (NCCL >= 2.7). NCCL does not compare the two sides'
** sizes: core/dist/nccl.c says so when one waits past its timeout. */
static em_status p2p(emk_nccl *n, int send, em_dtype dt, const void *in, void *out,
                     int64_t count, int peer, cudaStream_t cs, char *err, size_t errlen) {
  const char *call = send ? "ncclSend" : "ncclRecv";
  if (send ? !n->f->ncclSend : !n->f->ncclRecv)
    return emk_errf(err, errlen, EM_ERR_UNSUPPORTED, "NCCL (cuda:%d): this libnccl has no "
                    "%s (NCCL 2.7 or newer has)", n->dev, call);
  if (peer < 0 || peer >= n->nranks || count < 0)
    return emk_errf(err, errlen, EM_ERR_ARG, "NCCL (cuda:%d): %s: peer %d of %d ranks", n->dev,
                    call, peer, n->nranks);
  size_t bytes = (size_t)count * em_dtype_size(dt);
  ncclResult_t r = send ? n->f->ncclSend(in, bytes, ncclUint8, peer, n->comm, cs)
                        : n->f->ncclRecv(out, bytes, ncclUint8, peer, n->comm, cs);
  if (r != ncclSuccess && r != ncclInProgress) return nccl_err(n, r, call, err, errlen);
  return EM_OK;
}

em_status emk_nccl_collective(emk_nccl *n, int kind, int op, em_dtype dt, const void *in,
                              void *out, int64_t count, int root, emk_stream *s, char *err,
                              size_t errlen) {
  if (kind == EMI_COLL_SEND || kind == EMI_COLL_RECV)
    return p2p(n, kind == EMI_COLL_SEND, dt, in, out, count, root, s->s, err, errlen);
  ncclDataType_t t;
  if (!nccl_type(dt, &t))
    return emk_errf(err, errlen, EM_ERR_DTYPE, "NCCL: dtype %s is not supported",
                    em_dtype_name(dt));
  /* EM_COMM_SUM, MEAN, MAX, MIN; NCCL's average is the mean (NCCL >= 2.10) */
  static const ncclRedOp_t ops[] = {ncclSum, ncclAvg, ncclMax, ncclMin};
  ncclRedOp_t rop = ops[op >= 0 && op <= 3 ? op : 0];
  cudaStream_t cs = s->s;
  size_t c = (size_t)count;
  ncclResult_t r;
  const char *call;
  switch (kind) {
  case EMI_COLL_ALLREDUCE:
    call = "ncclAllReduce";
    r = n->f->ncclAllReduce(in, out, c, t, rop, n->comm, cs);
    break;
  case EMI_COLL_BROADCAST:
    call = "ncclBroadcast";
    r = n->f->ncclBroadcast(in, out, c, t, root, n->comm, cs);
    break;
  case EMI_COLL_ALLGATHER:
    call = "ncclAllGather";
    r = n->f->ncclAllGather(in, out, c, t, n->comm, cs);
    break;
  case EMI_COLL_REDUCE_SCATTER:
    call = "ncclReduceScatter";
    /* recvcount: this rank's part; core/dist/comm.c checked that count splits evenly */
    r = n->f->ncclReduceScatter(in, out, c / (size_t)n->nranks, t, rop, n->comm, cs);
    break;
  default:
    return emk_errf(err, errlen, EM_ERR_ARG, "NCCL: collective %d is not run by NCCL", kind);
  }
  /* inside a group a non-blocking communicator answers ncclInProgress or success;
  ** ncclGroupEnd settles them */
  if (r != ncclSuccess && r != ncclInProgress) return nccl_err(n, r, call, err, errlen);
  return EM_OK;
}

em_status emk_nccl_async_error(emk_nccl *n, char *err, size_t errlen) {
  ncclResult_t r = ncclSuccess;
  ncclResult_t st = n->f->ncclCommGetAsyncError(n->comm, &r);
  if (st != ncclSuccess) r = st;
  if (r == ncclSuccess || r == ncclInProgress) return EM_OK;
  return nccl_err(n, r, "asynchronous error", err, errlen);
}

void emk_nccl_abort(emk_nccl *n) {
  if (!n) return;
  n->f->ncclCommAbort(n->comm);
  free(n);
}

void emk_nccl_destroy(emk_nccl *n) {
  if (!n) return;
  /* Finalize flushes what is queued; bounded like every other wait here */
  if (n->f->ncclCommFinalize) {
    char err[64];
    ncclResult_t r = n->f->ncclCommFinalize(n->comm);
    if (settle(n, r, "ncclCommFinalize", err, sizeof err)) {
      n->f->ncclCommAbort(n->comm);
      free(n);
      return;
    }
  }
  n->f->ncclCommDestroy(n->comm);
  free(n);
}

/* -- A scripted NCCL, for the tests ------------------------------------------------------
** comm_init and emk_nccl_destroy against a stand-in table whose answers follow a
** script, counting the communicators it hands out and how each ends. Every
** scenario must end with no communicator alive. */

typedef struct nccl_script {
  ncclResult_t init;        /* what ncclCommInitRankConfig returns */
  int init_sets;            /* ... and whether it hands a communicator back */
  int polls;                /* ncclInProgress for this many polls, then: */
  ncclResult_t then;        /* the asynchronous state after them */
  ncclResult_t poll_call;   /* what ncclCommGetAsyncError itself returns */
  ncclResult_t finalize;    /* ncclCommFinalize's answer (its state then follows polls) */
  int made, aborted, destroyed, polled;
} nccl_script;

static nccl_script *script;
static char script_comm;    /* the communicator's address stands for it */

static ncclResult_t fake_init(ncclComm_t *comm, int nranks, ncclUniqueId id, int rank,
                              ncclConfig_t *cfg) {
  (void)nranks, (void)id, (void)rank, (void)cfg;
  if (script->init_sets) {
    *comm = (ncclComm_t)(void *)&script_comm;
    script->made++;
  }
  return script->init;
}
static ncclResult_t fake_async(ncclComm_t comm, ncclResult_t *state) {
  (void)comm;
  script->polled++;
  *state = script->polled <= script->polls ? ncclInProgress : script->then;
  return script->poll_call;
}
static ncclResult_t fake_abort(ncclComm_t comm) {
  (void)comm;
  script->aborted++;
  return ncclSuccess;
}
static ncclResult_t fake_destroy(ncclComm_t comm) {
  (void)comm;
  script->destroyed++;
  return ncclSuccess;
}
static ncclResult_t fake_finalize(ncclComm_t comm) {
  (void)comm;
  script->polled = 0;
  return script->finalize;
}
static const char *fake_string(ncclResult_t r) { return r ? "scripted error" : "no error"; }
static const char *fake_last(ncclComm_t comm) { (void)comm; return "scripted"; }

int emk_nccl_script_check(char *report, size_t n) {
  emk_nccl_fns f;
  memset(&f, 0, sizeof f);
  f.ncclCommInitRankConfig = fake_init;
  f.ncclCommGetAsyncError = fake_async;
  f.ncclCommAbort = fake_abort;
  f.ncclCommDestroy = fake_destroy;
  f.ncclCommFinalize = fake_finalize;
  f.ncclGetErrorString = fake_string;
  f.ncclGetLastError = fake_last;
  static const struct {
    const char *name;
    nccl_script s;
    int ok;                 /* init succeeds (then destroy is run) */
    double timeout_s;
  } cases[] = {
    {"an error returned with the communicator set", {ncclInternalError, 1, 0, ncclSuccess,
     ncclSuccess, ncclSuccess, 0, 0, 0, 0}, 0, 5},
    {"an error returned without a communicator", {ncclInvalidArgument, 0, 0, ncclSuccess,
     ncclSuccess, ncclSuccess, 0, 0, 0, 0}, 0, 5},
    {"an asynchronous error while settling", {ncclInProgress, 1, 2, ncclRemoteError,
     ncclSuccess, ncclSuccess, 0, 0, 0, 0}, 0, 5},
    {"the time limit", {ncclInProgress, 1, 1 << 30, ncclSuccess, ncclSuccess, ncclSuccess,
     0, 0, 0, 0}, 0, 0.01},
    {"ncclCommGetAsyncError failing", {ncclInProgress, 1, 0, ncclSuccess,
     ncclInvalidArgument, ncclSuccess, 0, 0, 0, 0}, 0, 5},
    {"in progress without a communicator", {ncclInProgress, 0, 0, ncclSuccess, ncclSuccess,
     ncclSuccess, 0, 0, 0, 0}, 0, 5},
    {"success, then a clean destroy", {ncclInProgress, 1, 2, ncclSuccess, ncclSuccess,
     ncclInProgress, 0, 0, 0, 0}, 1, 5},
    {"success, then a finalize that fails", {ncclSuccess, 1, 0, ncclSystemError, ncclSuccess,
     ncclInProgress, 0, 0, 0, 0}, 1, 5},
  };
  int failed = 0;
  if (n) report[0] = 0;
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    nccl_script sc = cases[i].s;
    script = &sc;
    emk_nccl *c = calloc(1, sizeof *c);
    if (!c) return -1;
    c->f = &f;
    c->dev = 0;
    c->nranks = 2;
    c->timeout_s = cases[i].timeout_s;
    unsigned char id[sizeof(ncclUniqueId)] = {0};
    char err[300] = "";
    em_status st = comm_init(c, id, 0, err, sizeof err);
    int ok = (st == EM_OK) == cases[i].ok;
    if (st == EM_OK) emk_nccl_destroy(c);        /* frees c */
    else free(c);
    int alive = sc.made - sc.aborted - sc.destroyed;
    if (!ok || alive != 0 || (st && !strstr(err, "NCCL"))) {
      if (!failed && n)
        snprintf(report, n, "%s: init %s (%s); %d made, %d aborted, %d destroyed", cases[i].name,
                 st ? "failed" : "succeeded", st ? err : "ok", sc.made, sc.aborted, sc.destroyed);
      failed++;
    }
  }
  script = NULL;
  return failed;
}

#endif

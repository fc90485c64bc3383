/*
** nccl_real.c -- NCCL communicators for GPU replicas on real devices (the
** device half of core/dist/nccl.c, reached through kernels/comm_cuda.c).
** libnccl is loaded with dlopen like the other CUDA libraries (libs.h), so every
** call goes through the emk_nccl_fns table.
**
** Never blocking without a limit. A communicator is made non-blocking
** (config.blocking = 0): ncclCommInitRankConfig, the collectives and
** ncclGroupEnd may return ncclInProgress, and ncclCommGetAsyncError is polled
** until the operation left that state -- bounded by the strategy's timeout, after
** which the caller aborts the communicator (ncclCommAbort), which is the only
** way to get a rank out of NCCL when a peer died. Completion of the queued
** collectives themselves is an event on the comm stream that comm_cuda.c polls,
** asking ncclCommGetAsyncError in between (a peer gone shows there as
** ncclRemoteError or ncclSystemError).
**
** Not run on a GPU yet: nothing here was executed in this project's CI (no GPU);
** it compiles against the real nccl.h, and what NCCL does without a GPU
** (ncclGetVersion, ncclGetUniqueId) is tested through libs.c.
*/
#include "real.h"
#include "../../core/dist/comm.h"
#include <stdio.h>
#include <stdlib.h>
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

/* A non-blocking call returned r: wait (polling the communicator's state) until
** it is no longer in progress, at most timeout_s. */
static em_status settle(emk_nccl *n, ncclResult_t r, const char *call, char *err,
                        size_t errlen) {
  struct timespec t0, now, nap = {0, 50000};
  clock_gettime(CLOCK_MONOTONIC, &t0);
  while (r == ncclInProgress) {
    nanosleep(&nap, NULL);
    ncclResult_t st = n->f->ncclCommGetAsyncError(n->comm, &r);
    if (st != ncclSuccess) r = st;
    clock_gettime(CLOCK_MONOTONIC, &now);
    if (r == ncclInProgress && (double)(now.tv_sec - t0.tv_sec) +
        (now.tv_nsec - t0.tv_nsec) * 1e-9 > n->timeout_s)
      return emk_errf(err, errlen, EM_ERR_IO, "NCCL (cuda:%d): %s did not complete within "
                      "%g s (a peer did not join)", n->dev, call, n->timeout_s);
  }
  return r == ncclSuccess ? EM_OK : nccl_err(n, r, call, err, errlen);
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
  ncclUniqueId uid;
  memcpy(&uid, id, sizeof uid);
  ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
  cfg.blocking = 0;
  ncclResult_t r = f->ncclCommInitRankConfig(&n->comm, nranks, uid, rank, &cfg);
  if (r != ncclSuccess && r != ncclInProgress) {
    st = nccl_err(n, r, "ncclCommInitRankConfig", err, errlen);
    free(n);
    return st;
  }
  if ((st = settle(n, r, "ncclCommInitRankConfig", err, errlen))) {
    f->ncclCommAbort(n->comm);
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

em_status emk_nccl_collective(emk_nccl *n, int kind, int op, em_dtype dt, const void *in,
                              void *out, int64_t count, int root, emk_stream *s, char *err,
                              size_t errlen) {
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
    /* recvcount: this rank's part; comm.c checked that count splits evenly */
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

#endif

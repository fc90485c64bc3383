/*
** real.h -- the internals of the real device runtime, shared by its files:
** runtime_real.c (the object, devices, memory, streams, events, copies),
** launch_real.c (kernels from the embedded fatbins), gemm_real.c (cuBLASLt),
** dnn_real.c (cuDNN) and nccl_real.c (NCCL).
** Only compiled with the CUDA headers (libs_fn.h); everything CUDA is reached
** through the dlopen'ed tables of libs.c.
*/
#ifndef EMBER_KERNELS_REAL_REAL_H
#define EMBER_KERNELS_REAL_REAL_H
#include "libs_fn.h"
#include "../runtime.h"
#include <pthread.h>

#define EMR_STREAM_MAGIC 0x5354524du   /* "STRM" */
#define EMR_EVENT_MAGIC 0x4556544eu    /* "EVTN" */

struct emk_stream {
  uint32_t magic;
  int dev;
  cudaStream_t s;
  void *ws;                 /* cuBLASLt's workspace on this stream (NULL: none yet) */
  size_t ws_size;
  int ws_tried;             /* the workspace was asked for (it may have failed) */
  emk_stream *prev, *next;  /* live streams, for close */
  /* Capture (runtime_real.c): what the emulator refuses while a stream captures,
  ** this runtime refuses too, before CUDA sees it, so both report the same error
  ** (CUDA would accept some of it, or invalidate the capture with error 900-907). */
  int capturing;
  em_status cap_err;        /* the first refusal while capturing (EM_OK: none) */
  char cap_msg[EMK_ERRMSG_SIZE];
};

struct emk_event {
  uint32_t magic;
  int dev;
  cudaEvent_t e;
  emk_event *prev, *next;
};

/* A kernel descriptor's device function, found once (launch_real.c). */
typedef struct emr_kslot {
  const emk_kernel *k;      /* NULL: empty slot */
  cudaKernel_t fn;
  size_t param_size;        /* bytes of its argument struct; 0 = not known */
} emr_kslot;

typedef struct emr {
  emk_runtime rt;
  emk_libs *L;
  const emk_cudart_fns *f;
  int ndev;
  pthread_mutex_t mu;       /* the lists, caches and lazily made handles below */
  pthread_mutex_t err_mu;   /* rt.errmsg */
  emk_stream *streams;
  emk_event *events;
  uint32_t peer_tried[EMK_MAX_DEVICES];   /* bit j of [i]: i -> j peer access asked */
  /* Atomic: bit d once device d was made current (so has its context: emr_use),
  ** and the first such device (-1: none), which pinned host memory goes through. */
  unsigned contexts;
  int home;
  /* kernels (launch_real.c) */
  int mods_state;           /* 0 not loaded, 1 loaded, -1 failed (mods_why) */
  char mods_why[EMK_ERRMSG_SIZE];
  cudaLibrary_t *mods;      /* one per embedded fatbin */
  size_t nmods;
  emr_kslot *kslots;        /* open addressing on the descriptor's address */
  size_t kcap, klen;
  struct emr_kname *knames; /* every kernel of the modules by name, sorted (NULL: the
                            ** runtime can't enumerate them; lookups search each module) */
  size_t nknames;
  uint8_t kernels_on[EMK_MAX_DEVICES];   /* the kernels are loaded into device i */
  /* gemm (gemm_real.c) */
  int lt_state;             /* 0 not loaded, 1 loaded, -1 failed (lt_why) */
  char lt_why[EMK_ERRMSG_SIZE];
  const emk_cublaslt_fns *lt;
  void *lt_handle[EMK_MAX_DEVICES];   /* cublasLtHandle_t, made at a device's first gemm */
  struct emk_plan_cache *lt_plans;    /* gemm plans per shape (plan_cache.h), with the first handle */
  /* nn (dnn_real.c): cuDNN's handles and descriptor sets, made at the first nn call */
  struct emr_dnn *dnn;
} emr;

/* rt->errmsg = the message (under err_mu), returns code. */
em_status emr_fail(emr *R, em_status code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* A failed CUDA call: "entry (cuda:N): call: cudaErrorX: text", with an em_status
** for the error (out of memory, bad argument, or a device error). Clears the
** thread's last error so it is not reported twice. */
em_status emr_cuda(emr *R, cudaError_t e, const char *entry, int dev, const char *call);
/* cudaSetDevice(dev) for entry, with the device checked first. */
em_status emr_use(emr *R, int dev, const char *entry);
em_status emr_check_stream(emr *R, emk_stream *s, const char *entry);

/* launch_real.c */
em_status emr_launch(emk_runtime *rt, const emk_kernel *k, emk_dim3 grid, emk_dim3 block,
                     size_t dyn_shared, emk_stream *s, const void *args, size_t args_size);
void emr_kernels_close(emr *R);
void emr_kernels_load_on(emr *R, int dev);

/* gemm_real.c */
em_status emr_gemm(emk_runtime *rt, emk_stream *s, em_dtype dtype, int64_t m, int64_t n,
                   int64_t k, int64_t batch,
                   const void *a, int64_t a_rs, int64_t a_cs, int64_t a_bs,
                   const void *b, int64_t b_rs, int64_t b_cs, int64_t b_bs,
                   void *c, int64_t c_rs, int64_t c_cs, int64_t c_bs, int allow_tf32);
/* Frees a stream's workspace (the stream drained) and, at close, the handles. */
void emr_gemm_stream_done(emr *R, emk_stream *s);
void emr_gemm_close(emr *R);

#endif

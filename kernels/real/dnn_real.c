/*
** dnn_real.c -- the real runtime's nn entries (runtime.h) on cuDNN 9's
** descriptor API (the v8 API that cuDNN 9 keeps beside the graph API): the
** convolutions in three directions, NCHW or NHWC (cuDNN's tensor and filter
** formats), float32 (computing in float32, TF32 only when the caller allows
** it), float64, and float16 / bfloat16 computing in float32; training batch
** norm, NCHW or NHWC.
**
** Layers, as in gemm_real.c, the first testable without a GPU:
**   1. describe: the tensor, filter and convolution descriptors for an
**      emk_conv_desc (cudnnCreate*Descriptor and the Set calls need no driver);
**      emk_dnn_describe_check builds them and reads back cuDNN's output dims, so
**      the tests check our geometry against cuDNN's on any machine with cuDNN,
**      and emk_dnn_math_check sets and reads back a math mode the way conv does.
**   2. per runtime (R->dnn, struct emr_dnn): a cuDNN handle per device, made at
**      the device's first nn call and destroyed at the runtime's close. Every
**      ember state opens its own runtime (eight replicas, eight runtimes), so
**      nothing here is shared between runtimes and nothing limits their number.
**      A handle is not to be used by two threads at once, and its stream is
**      state, so each call takes the device's lock, sets the handle's stream to
**      the caller's, and queues its work. A convolution's five descriptors are
**      kept per geometry and device (conv_key) in a bounded table (plan_cache.h),
**      so a repeated shape builds none; they are host objects read at the call.
**   3. conv_algos asks cuDNN's heuristics (Get*Algorithm_v7: no trial runs, no
**      memory) for its ranked list and keeps the algorithms whose status is
**      success, each with the math mode it was ranked in as dnn.h's
**      emk_conv_math lets it run (float32 without TF32: FMA only) and the
**      workspace of that mode; k_dnn.c picks one per shape and caches it, and
**      conv sets that mode on the descriptor before it runs. Before that list,
**      conv_algos times the algorithms (cudnnFind*AlgorithmEx, as PyTorch's
**      cudnn.benchmark does: the heuristics rank channels-last convolutions
**      poorly) on operands and a workspace it allocates for the trial and frees
**      at once, and puts Find's list, fastest first, ahead of the heuristics'.
**      The trial runs once per shape and direction (k_dnn.c caches the pick);
**      EMBER_CUDNN_FIND=0 turns it off, and any failure (no Find in the loaded
**      cuDNN, a stream of this runtime capturing a graph, no memory for the
**      operands, any status) leaves the heuristics' list alone, silently.
** cuDNN is loaded at the first nn call; an entry the loaded cuDNN lacks (the nn
** functions are optional in libs_fn.h) is EM_ERR_UNSUPPORTED naming it.
*/
#include "libs_fn.h"
#include "../dnn.h"
#include "plan_cache.h"
#include <stdlib.h>
#include <limits.h>
#include <stdio.h>
#include <string.h>

/* The bytes of x, w and y (N*C*H*W, O*(C/G)*kH*kW, N*O*OH*OW elements of c's
** dtype) that Find's trial allocates; 0 for a geometry it refuses (a size not
** positive, C not a multiple of G, a product past SIZE_MAX). Pure, so the
** tests check it on any machine. */
int emk_dnn_find_bytes(const emk_conv_desc *c, size_t bytes[3]) {
  bytes[0] = bytes[1] = bytes[2] = 0;
  size_t el = c->dtype == EM_FLOAT64 ? 8 : c->dtype == EM_FLOAT32 ? 4
              : c->dtype == EM_FLOAT16 || c->dtype == EM_BFLOAT16 ? 2 : 0;
  if (!el || c->G < 1 || c->C % c->G) return 0;
  const int64_t dims[3][4] = {{c->N, c->C, c->H, c->W},
                              {c->O, c->C / c->G, c->kH, c->kW},
                              {c->N, c->O, c->OH, c->OW}};
  for (int i = 0; i < 3; i++) {
    size_t b = el;
    for (int j = 0; j < 4; j++) {
      int64_t d = dims[i][j];
      if (d < 1 || (uint64_t)d > SIZE_MAX / b) {
        bytes[0] = bytes[1] = bytes[2] = 0;
        return 0;
      }
      b *= (size_t)d;
    }
    bytes[i] = b;
  }
  return 1;
}

/* Whether conv_algos tries Find: yes unless EMBER_CUDNN_FIND is 0 (or off,
** false, no). Read at each trial, which runs once per shape and direction. */
int emk_dnn_find_on(void) {
  const char *e = getenv("EMBER_CUDNN_FIND");
  return !(e && (!strcmp(e, "0") || !strcmp(e, "off") || !strcmp(e, "false") ||
                 !strcmp(e, "no")));
}

#if defined(EMK_HAVE_CUDART_H) && defined(EMK_HAVE_CUDNN_H)
#include "real.h"

_Static_assert((int)EMK_MATH_DEFAULT == (int)CUDNN_DEFAULT_MATH &&
               (int)EMK_MATH_TENSOR_OP == (int)CUDNN_TENSOR_OP_MATH &&
               (int)EMK_MATH_TENSOR_OP_CONVERT == (int)CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION &&
               (int)EMK_MATH_FMA == (int)CUDNN_FMA_MATH, "runtime.h's math modes are cuDNN's");

/* "cuDNN: call: CUDNN_STATUS_X" with an em_status for it. */
static em_status dnn_say(const emk_cudnn_fns *f, cudnnStatus_t s, const char *call, char *err,
                         size_t errlen) {
  em_status code = s == CUDNN_STATUS_NOT_SUPPORTED ? EM_ERR_UNSUPPORTED
                 : s == CUDNN_STATUS_BAD_PARAM ? EM_ERR_SHAPE
                 : s == CUDNN_STATUS_ALLOC_FAILED ? EM_ERR_NOMEM : EM_ERR_DEVICE;
  char detail[300] = "";
  if (f->cudnnGetLastErrorString) f->cudnnGetLastErrorString(detail, sizeof detail);
  size_t n = strlen(detail);
  while (n && (detail[n - 1] == '\n' || detail[n - 1] == ' ')) detail[--n] = 0;
  return emk_errf(err, errlen, code, "cuDNN: %s: %s%s%s%s", call, f->cudnnGetErrorString(s),
                  n ? " (" : "", detail, n ? ")" : "");
}

/* == 1. Descriptors ======================================================================= */

typedef struct conv_objs {
  cudnnTensorDescriptor_t x, y, bias;
  cudnnFilterDescriptor_t w;
  cudnnConvolutionDescriptor_t conv;
} conv_objs;

static void conv_free(const emk_cudnn_fns *f, conv_objs *o) {
  if (o->x) f->cudnnDestroyTensorDescriptor(o->x);
  if (o->y) f->cudnnDestroyTensorDescriptor(o->y);
  if (o->bias) f->cudnnDestroyTensorDescriptor(o->bias);
  if (o->w) f->cudnnDestroyFilterDescriptor(o->w);
  if (o->conv) f->cudnnDestroyConvolutionDescriptor(o->conv);
  memset(o, 0, sizeof *o);
}

static int fits_int(const emk_conv_desc *c) {
  const int64_t v[] = {c->N, c->C, c->H, c->W, c->O, c->kH, c->kW, c->OH, c->OW,
                       c->sH, c->sW, c->pH, c->pW, c->dH, c->dW, c->G};
  for (size_t i = 0; i < sizeof v / sizeof v[0]; i++)
    if (v[i] < 0 || v[i] > INT_MAX) return 0;
  return 1;
}

static em_status describe(const emk_cudnn_fns *f, const emk_conv_desc *c, conv_objs *o,
                          char *err, size_t errlen) {
  memset(o, 0, sizeof *o);
  if (c->dtype != EM_FLOAT32 && c->dtype != EM_FLOAT64 && c->dtype != EM_FLOAT16 &&
      c->dtype != EM_BFLOAT16)
    return emk_errf(err, errlen, EM_ERR_DTYPE, "cuDNN convolution: dtype %s (float32, "
                    "float64, float16 or bfloat16 only)", em_dtype_name(c->dtype));
  if (!fits_int(c))
    return emk_errf(err, errlen, EM_ERR_UNSUPPORTED, "cuDNN convolution: a size beyond "
                    "cuDNN's int range");
  /* half types are stored as such and accumulated in float (the convolution
  ** descriptor's compute type), as mixed precision wants */
  cudnnDataType_t dt = c->dtype == EM_FLOAT64   ? CUDNN_DATA_DOUBLE
                       : c->dtype == EM_FLOAT16  ? CUDNN_DATA_HALF
                       : c->dtype == EM_BFLOAT16 ? CUDNN_DATA_BFLOAT16
                                                 : CUDNN_DATA_FLOAT;
  cudnnDataType_t compute = c->dtype == EM_FLOAT64 ? CUDNN_DATA_DOUBLE : CUDNN_DATA_FLOAT;
  /* channels last: x, y and the filter in cuDNN's NHWC order (the filter's
  ** (O, kH, kW, C/G) is what to_channels_last gives a weight); the bias is
  ** (1, O, 1, 1), the same in either order */
  cudnnTensorFormat_t fmt = c->nhwc ? CUDNN_TENSOR_NHWC : CUDNN_TENSOR_NCHW;
  cudnnStatus_t s;
  const char *call = "cudnnCreateTensorDescriptor";
  if ((s = f->cudnnCreateTensorDescriptor(&o->x)) || (s = f->cudnnCreateTensorDescriptor(&o->y)) ||
      (s = f->cudnnCreateTensorDescriptor(&o->bias)))
    goto bad;
  call = "cudnnSetTensor4dDescriptor(x)";
  if ((s = f->cudnnSetTensor4dDescriptor(o->x, fmt, dt, (int)c->N, (int)c->C,
                                         (int)c->H, (int)c->W)))
    goto bad;
  call = "cudnnSetTensor4dDescriptor(y)";
  if ((s = f->cudnnSetTensor4dDescriptor(o->y, fmt, dt, (int)c->N, (int)c->O,
                                         (int)c->OH, (int)c->OW)))
    goto bad;
  call = "cudnnSetTensor4dDescriptor(bias)";
  if ((s = f->cudnnSetTensor4dDescriptor(o->bias, CUDNN_TENSOR_NCHW, dt, 1, (int)c->O, 1, 1)))
    goto bad;
  call = "cudnnCreateFilterDescriptor";
  if ((s = f->cudnnCreateFilterDescriptor(&o->w))) goto bad;
  call = "cudnnSetFilter4dDescriptor";
  if ((s = f->cudnnSetFilter4dDescriptor(o->w, dt, fmt, (int)c->O,
                                         (int)(c->C / c->G), (int)c->kH, (int)c->kW)))
    goto bad;
  call = "cudnnCreateConvolutionDescriptor";
  if ((s = f->cudnnCreateConvolutionDescriptor(&o->conv))) goto bad;
  call = "cudnnSetConvolution2dDescriptor";
  if ((s = f->cudnnSetConvolution2dDescriptor(o->conv, (int)c->pH, (int)c->pW, (int)c->sH,
                                              (int)c->sW, (int)c->dH, (int)c->dW,
                                              CUDNN_CROSS_CORRELATION, compute)))
    goto bad;
  if (c->G > 1) {
    call = "cudnnSetConvolutionGroupCount";
    if (!f->cudnnSetConvolutionGroupCount) goto missing;
    if ((s = f->cudnnSetConvolutionGroupCount(o->conv, (int)c->G))) goto bad;
  }
  if (f->cudnnSetConvolutionMathType) {
    /* TF32 only where the caller allows it, as the gemm does; conv sets the
    ** algorithm's own mode before it runs */
    call = "cudnnSetConvolutionMathType";
    cudnnMathType_t m = (cudnnMathType_t)emk_conv_query_math(c->dtype, c->allow_tf32);
    if ((s = f->cudnnSetConvolutionMathType(o->conv, m))) goto bad;
  }
  return EM_OK;
missing:
  conv_free(f, o);
  return emk_errf(err, errlen, EM_ERR_UNSUPPORTED, "cuDNN: the loaded library has no %s", call);
bad:
  conv_free(f, o);
  return dnn_say(f, s, call, err, errlen);
}

em_status emk_dnn_describe_check(const emk_conv_desc *c, int dims[4], char *err,
                                 size_t errlen) {
  emk_libs *L = NULL;
  const emk_cudnn_fns *f;
  em_status st = emk_libs_open(&L, err, errlen);
  if (st) return st;
  if ((st = emk_libs_cudnn(L, &f, err, errlen))) goto done;
  conv_objs o;
  if ((st = describe(f, c, &o, err, errlen))) goto done;
  cudnnStatus_t s = f->cudnnGetConvolution2dForwardOutputDim(o.conv, o.x, o.w, &dims[0],
                                                             &dims[1], &dims[2], &dims[3]);
  if (s) st = dnn_say(f, s, "cudnnGetConvolution2dForwardOutputDim", err, errlen);
  conv_free(f, &o);
done:
  emk_libs_close(L);
  return st;
}

em_status emk_dnn_math_check(const emk_conv_desc *c, int math, int *got, char *err,
                             size_t errlen) {
  emk_libs *L = NULL;
  const emk_cudnn_fns *f;
  *got = -1;
  em_status st = emk_libs_open(&L, err, errlen);
  if (st) return st;
  if ((st = emk_libs_cudnn(L, &f, err, errlen))) goto done;
  if (!f->cudnnSetConvolutionMathType || !f->cudnnGetConvolutionMathType) {
    st = emk_errf(err, errlen, EM_ERR_UNSUPPORTED, "cuDNN: the loaded library has no "
                  "cudnnSet/GetConvolutionMathType");
    goto done;
  }
  conv_objs o;
  if ((st = describe(f, c, &o, err, errlen))) goto done;
  cudnnMathType_t m = CUDNN_DEFAULT_MATH;
  cudnnStatus_t s = f->cudnnSetConvolutionMathType(o.conv, (cudnnMathType_t)math);
  if (s) st = dnn_say(f, s, "cudnnSetConvolutionMathType", err, errlen);
  else if ((s = f->cudnnGetConvolutionMathType(o.conv, &m)))
    st = dnn_say(f, s, "cudnnGetConvolutionMathType", err, errlen);
  else *got = (int)m;
  conv_free(f, &o);
done:
  emk_libs_close(L);
  return st;
}

em_status emk_dnn_find_symbols(int *count, char *err, size_t errlen) {
  emk_libs *L = NULL;
  const emk_cudnn_fns *f;
  *count = 0;
  em_status st = emk_libs_open(&L, err, errlen);
  if (st) return st;
  if (!(st = emk_libs_cudnn(L, &f, err, errlen)))
    *count = !!f->cudnnFindConvolutionForwardAlgorithmEx +
             !!f->cudnnFindConvolutionBackwardDataAlgorithmEx +
             !!f->cudnnFindConvolutionBackwardFilterAlgorithmEx;
  emk_libs_close(L);
  return st;
}

/* == 2. Per runtime: handles and descriptor sets ============================================ */

/* R->dnn (real.h): everything cuDNN of one runtime, so that any number of runtimes
** (one per ember state: `--replicas 8` opens eight) each have their own. */
struct emr_dnn {
  const emk_cudnn_fns *f;
  int state;                       /* 0 not loaded, 1 loaded, -1 failed (why) */
  char why[EMK_ERRMSG_SIZE];
  cudnnHandle_t h[EMK_MAX_DEVICES];
  pthread_mutex_t dev_mu[EMK_MAX_DEVICES];   /* one user of a device's handle at a time */
  emk_plan_cache *descs;           /* conv_objs per conv_key; NULL: built per call */
};

enum { CONV_PLANS = 64 };

/* What a convolution's descriptors depend on. Not the direction (the same five
** describe all three) nor TF32 (the math mode is set before every call); the
** device, so that each device's sets are used only under its lock. */
typedef struct conv_key {
  int32_t dev, dtype, nhwc, pad_;
  int64_t g[16];
} conv_key;

static void conv_key_of(conv_key *k, int dev, const emk_conv_desc *c) {
  memset(k, 0, sizeof *k);
  k->dev = dev;
  k->dtype = (int32_t)c->dtype;
  k->nhwc = c->nhwc != 0;
  const int64_t g[16] = {c->N, c->C, c->H, c->W, c->O, c->kH, c->kW, c->OH, c->OW,
                         c->sH, c->sW, c->pH, c->pW, c->dH, c->dW, c->G};
  memcpy(k->g, g, sizeof g);
}

static void conv_plan_free(void *ud, void *plan) {
  struct emr_dnn *D = (struct emr_dnn *)ud;
  conv_free(D->f, (conv_objs *)plan);
  free(plan);
}

/* R's cuDNN state, made (and cuDNN loaded) at its first nn call; NULL: no memory. */
static struct emr_dnn *dnn_of(emr *R) {
  pthread_mutex_lock(&R->mu);
  struct emr_dnn *D = R->dnn;
  if (!D && (D = (struct emr_dnn *)calloc(1, sizeof *D)) != NULL) {
    for (int d = 0; d < EMK_MAX_DEVICES; d++) pthread_mutex_init(&D->dev_mu[d], NULL);
    D->descs = emk_plan_cache_new(CONV_PLANS, sizeof(conv_key), conv_plan_free, D);
    R->dnn = D;
  }
  if (D && D->state == 0)
    D->state = emk_libs_cudnn(R->L, &D->f, D->why, sizeof D->why) ? -1 : 1;
  pthread_mutex_unlock(&R->mu);
  return D;
}

/* At close (runtime_real.c), every stream drained: the descriptor sets, then the
** handles, each destroyed on its device. */
void emr_dnn_close(emr *R) {
  struct emr_dnn *D = R->dnn;
  if (!D) return;
  emk_plan_cache_delete(D->descs);
  for (int d = 0; d < EMK_MAX_DEVICES; d++) {
    if (D->h[d] && R->f->cudaSetDevice(d) == cudaSuccess) D->f->cudnnDestroy(D->h[d]);
    pthread_mutex_destroy(&D->dev_mu[d]);
  }
  free(D);
  R->dnn = NULL;
}

int emk_real_conv_plans(emk_runtime *rt, emk_plan_cache_stats *out) {
  if (!rt || strcmp(rt->ops->name, "cuda") != 0) return -1;
  emr *R = (emr *)rt->impl;
  pthread_mutex_lock(&R->mu);
  emk_plan_cache *c = R->dnn ? R->dnn->descs : NULL;
  pthread_mutex_unlock(&R->mu);
  if (!c) return -1;
  emk_plan_cache_stats_get(c, out);
  return 0;
}

/* cuDNN's handle for dev with the device current and its lock held (unlock with
** handle_done); what names the call in messages. */
static em_status handle_take(emr *R, int dev, const char *what, struct emr_dnn **out) {
  em_status st = emr_use(R, dev, what);
  if (st) return st;
  struct emr_dnn *D = dnn_of(R);
  if (!D) return emr_fail(R, EM_ERR_NOMEM, "%s: out of host memory for cuDNN's state", what);
  if (D->state < 0) return emr_fail(R, EM_ERR_UNSUPPORTED, "%s: %s", what, D->why);
  pthread_mutex_lock(&D->dev_mu[dev]);
  if (!D->h[dev]) {
    cudnnStatus_t s = D->f->cudnnCreate(&D->h[dev]);
    if (s) {
      char why[400];
      dnn_say(D->f, s, "cudnnCreate", why, sizeof why);
      D->h[dev] = NULL;
      pthread_mutex_unlock(&D->dev_mu[dev]);
      return emr_fail(R, EM_ERR_DEVICE, "%s (cuda:%d): %s", what, dev, why);
    }
  }
  *out = D;
  return EM_OK;
}

static void handle_done(struct emr_dnn *D, int dev) { pthread_mutex_unlock(&D->dev_mu[dev]); }

/* The descriptor set of c on dev (the device's lock held): from the table, or
** built now and kept there; *kept says which way conv_done gives it back. */
static em_status conv_take(emr *R, struct emr_dnn *D, int dev, const emk_conv_desc *c,
                           conv_objs **out, int *kept, const char *what) {
  conv_key k;
  conv_key_of(&k, dev, c);
  *out = D->descs ? (conv_objs *)emk_plan_cache_take(D->descs, &k) : NULL;
  *kept = *out != NULL;
  if (*out) return EM_OK;
  char why[EMK_ERRMSG_SIZE];
  conv_objs *o = (conv_objs *)calloc(1, sizeof *o);
  if (!o) return emr_fail(R, EM_ERR_NOMEM, "%s: out of host memory for descriptors", what);
  em_status st = describe(D->f, c, o, why, sizeof why);
  if (st) {
    free(o);
    return emr_fail(R, st, "%s: %s", what, why);
  }
  *kept = D->descs && emk_plan_cache_add(D->descs, &k, o);
  *out = o;
  return EM_OK;
}

static void conv_done(struct emr_dnn *D, conv_objs *o, int kept) {
  if (kept) emk_plan_cache_give_back(D->descs, o);
  else conv_plan_free(D, o);
}

/* == 3. Entries ============================================================================= */

static const char *dir_name(int dir) {
  return dir == EMK_CONV_FWD ? "forward" : dir == EMK_CONV_BWD_DATA ? "backward data"
                                                                    : "backward filter";
}

/* "conv_algos (forward, cuda:0, x [2,3,8,8], w [4,3,3,3], float32)" */
static void conv_what(char *buf, size_t n, const char *entry, int dev, const emk_conv_desc *c) {
  snprintf(buf, n, "%s (%s, cuda:%d, x [%lld,%lld,%lld,%lld], w [%lld,%lld,%lld,%lld], "
           "groups %lld, %s)", entry, dir_name(c->dir), dev, (long long)c->N, (long long)c->C,
           (long long)c->H, (long long)c->W, (long long)c->O,
           (long long)(c->G ? c->C / c->G : c->C), (long long)c->kH, (long long)c->kW,
           (long long)c->G, em_dtype_name(c->dtype));
}

/* The workspace algo needs in math mode math (the descriptor set to it), or
** `fallback` (the heuristic's figure) when cuDNN cannot say. The heuristic ranks
** in the mode it reports; when ember runs another (a DEFAULT algorithm as FMA)
** the need is asked again rather than assumed. */
static size_t conv_workspace(const emk_cudnn_fns *f, cudnnHandle_t h, const conv_objs *o,
                             int dir, int algo, size_t fallback) {
  size_t n = 0;
  cudnnStatus_t s = CUDNN_STATUS_NOT_SUPPORTED;
  if (dir == EMK_CONV_FWD && f->cudnnGetConvolutionForwardWorkspaceSize)
    s = f->cudnnGetConvolutionForwardWorkspaceSize(h, o->x, o->w, o->conv, o->y,
                                                   (cudnnConvolutionFwdAlgo_t)algo, &n);
  else if (dir == EMK_CONV_BWD_DATA && f->cudnnGetConvolutionBackwardDataWorkspaceSize)
    s = f->cudnnGetConvolutionBackwardDataWorkspaceSize(h, o->w, o->y, o->conv, o->x,
                                                        (cudnnConvolutionBwdDataAlgo_t)algo, &n);
  else if (dir == EMK_CONV_BWD_FILTER && f->cudnnGetConvolutionBackwardFilterWorkspaceSize)
    s = f->cudnnGetConvolutionBackwardFilterWorkspaceSize(
        h, o->x, o->y, o->conv, o->w, (cudnnConvolutionBwdFilterAlgo_t)algo, &n);
  return s == CUDNN_STATUS_SUCCESS && n > fallback ? n : fallback;
}

/* -- Choosing by trial: cuDNN's Find*Ex ------------------------------------------------
** conv_algos first times the algorithms on buffers of its own, as PyTorch's
** cudnn.benchmark does, for float32 and float64: on an H100 that made the float32
** ResNet-18 step 20% faster than the heuristics' pick. For float16/bfloat16 the
** trial's pick ran 5-10% slower than the heuristics' (tensor-op) pick in the same
** measurements, so half types keep the heuristics. Everything
** here fails quietly (find_list returns -1) and the heuristics' list serves:
** EMBER_CUDNN_FIND=0, an older cuDNN without Find, a stream of this runtime
** capturing a graph (the trial must not be recorded, and its cudaFree waits for
** the device), too little free memory, or any CUDA or cuDNN status. The trial
** runs on a stream of its own (non-blocking, so it joins no capture elsewhere)
** that the handle leaves again before the stream is destroyed. */

/* Any stream of R capturing? (Streams are made and captured by R's one user, so
** the flag is read as that user wrote it.) */
static int any_capturing(emr *R) {
  int busy = 0;
  pthread_mutex_lock(&R->mu);
  for (emk_stream *s = R->streams; s && !busy; s = s->next) busy = s->capturing;
  pthread_mutex_unlock(&R->mu);
  return busy;
}

enum { FIND_WS_CAP = 256 << 20 };

/* Find's list for c on dev (the device's lock held, descriptors o in the query
** mode): up to max entries, fastest first, into algo/math/mem, *got of them; 0, or
** -1 with the CUDA error state cleared when the trial could not run. ws_want is
** the largest workspace the heuristics listed: the trial's workspace is that,
** at most FIND_WS_CAP and a quarter of the free memory. */
static int find_list(emr *R, struct emr_dnn *D, int dev, const conv_objs *o,
                     const emk_conv_desc *c, size_t ws_want, int max, int *algo, int *math,
                     size_t *mem, int *got) {
  const emk_cudnn_fns *f = D->f;
  const emk_cudart_fns *rf = R->f;
  cudnnHandle_t h = D->h[dev];
  *got = 0;
  if (max <= 0 || !emk_dnn_find_on() || !f->cudnnSetStream) return -1;
  if (c->dtype != EM_FLOAT32 && c->dtype != EM_FLOAT64) return -1;
  if ((c->dir == EMK_CONV_FWD && !f->cudnnFindConvolutionForwardAlgorithmEx) ||
      (c->dir == EMK_CONV_BWD_DATA && !f->cudnnFindConvolutionBackwardDataAlgorithmEx) ||
      (c->dir == EMK_CONV_BWD_FILTER && !f->cudnnFindConvolutionBackwardFilterAlgorithmEx))
    return -1;
  if (any_capturing(R)) return -1;
  size_t bytes[3];
  if (!emk_dnn_find_bytes(c, bytes)) return -1;
  size_t fr = 0, to = 0;
  if (rf->cudaMemGetInfo(&fr, &to) != cudaSuccess) {
    (void)rf->cudaGetLastError();
    return -1;
  }
  size_t ws_size = ws_want;
  if (ws_size > FIND_WS_CAP) ws_size = FIND_WS_CAP;
  if (ws_size > fr / 4) ws_size = fr / 4;
  /* the operands and the workspace within half the free memory */
  size_t need = ws_size;
  for (int i = 0; i < 3; i++) {
    if (bytes[i] > SIZE_MAX / 2 - need) return -1;
    need += bytes[i];
  }
  if (need > fr / 2) return -1;
  void *buf[3] = {NULL, NULL, NULL}, *ws = NULL;
  cudaStream_t stream = NULL;
  int ok = 0, set = 0, n = 0;
  for (int i = 0; i < 3; i++)
    if (rf->cudaMalloc(&buf[i], bytes[i]) != cudaSuccess) {
      buf[i] = NULL;
      goto out;
    }
  if (ws_size && rf->cudaMalloc(&ws, ws_size) != cudaSuccess) {
    ws = NULL;
    goto out;
  }
  if (rf->cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) != cudaSuccess) {
    stream = NULL;
    goto out;
  }
  if (f->cudnnSetStream(h, stream)) goto out;
  set = 1;
  enum { FINDP = 16 };
  cudnnStatus_t s;
  void *x = buf[0], *w = buf[1], *y = buf[2];
  if (max > FINDP) max = FINDP;
  if (c->dir == EMK_CONV_FWD) {
    cudnnConvolutionFwdAlgoPerf_t p[FINDP];
    memset(p, 0, sizeof p);
    s = f->cudnnFindConvolutionForwardAlgorithmEx(h, o->x, x, o->w, w, o->conv, o->y, y, max,
                                                  &n, p, ws, ws_size);
    for (int i = 0; !s && i < n && i < max; i++) {
      algo[i] = p[i].status || p[i].time < 0 ? -1 : (int)p[i].algo;
      math[i] = (int)p[i].mathType, mem[i] = p[i].memory;
    }
  } else if (c->dir == EMK_CONV_BWD_DATA) {
    cudnnConvolutionBwdDataAlgoPerf_t p[FINDP];
    memset(p, 0, sizeof p);
    s = f->cudnnFindConvolutionBackwardDataAlgorithmEx(h, o->w, w, o->y, y, o->conv, o->x, x,
                                                       max, &n, p, ws, ws_size);
    for (int i = 0; !s && i < n && i < max; i++) {
      algo[i] = p[i].status || p[i].time < 0 ? -1 : (int)p[i].algo;
      math[i] = (int)p[i].mathType, mem[i] = p[i].memory;
    }
  } else {
    cudnnConvolutionBwdFilterAlgoPerf_t p[FINDP];
    memset(p, 0, sizeof p);
    s = f->cudnnFindConvolutionBackwardFilterAlgorithmEx(h, o->x, x, o->y, y, o->conv, o->w, w,
                                                         max, &n, p, ws, ws_size);
    for (int i = 0; !s && i < n && i < max; i++) {
      algo[i] = p[i].status || p[i].time < 0 ? -1 : (int)p[i].algo;
      math[i] = (int)p[i].mathType, mem[i] = p[i].memory;
    }
  }
  if (s || n < 0) {
    /* cuDNN's message stays behind otherwise, to be appended to a later error */
    char drop[256];
    if (f->cudnnGetLastErrorString) f->cudnnGetLastErrorString(drop, sizeof drop);
    goto out;
  }
  if (n > max) n = max;
  if (rf->cudaStreamSynchronize(stream) != cudaSuccess) goto out;
  ok = 1;
out:
  /* the handle leaves the trial's stream before it goes (conv and batch norm set
  ** theirs before every call) */
  if (set && f->cudnnSetStream(h, NULL)) ok = 0;
  if (stream) {
    if (rf->cudaStreamSynchronize(stream) != cudaSuccess) ok = 0;
    if (rf->cudaStreamDestroy(stream) != cudaSuccess) ok = 0;
  }
  if (ws && rf->cudaFree(ws) != cudaSuccess) ok = 0;
  for (int i = 0; i < 3; i++)
    if (buf[i] && rf->cudaFree(buf[i]) != cudaSuccess) ok = 0;
  if (!ok) {
    (void)rf->cudaGetLastError();     /* an allocation that failed is not reported later */
    return -1;
  }
  *got = n;
  return 0;
}

em_status emr_conv_algos(emk_runtime *rt, int dev, const emk_conv_desc *c, emk_conv_algo *out,
                         int max, int *n) {
  emr *R = (emr *)rt->impl;
  *n = 0;
  char what[240], why[EMK_ERRMSG_SIZE];
  conv_what(what, sizeof what, "conv_algos", dev, c);
  struct emr_dnn *D;
  em_status st = handle_take(R, dev, what, &D);
  if (st) return st;
  const emk_cudnn_fns *f = D->f;
  cudnnHandle_t h = D->h[dev];
  conv_objs *o;
  int kept;
  if ((st = conv_take(R, D, dev, c, &o, &kept, what))) {
    handle_done(D, dev);
    return st;
  }
  enum { MAXP = 16 };
  /* the candidates: (algorithm, reported math mode, reported workspace), Find's
  ** first (when it ran), then the heuristics' ranked list */
  int got = 0, algo[2 * MAXP], math[2 * MAXP];
  size_t mem[2 * MAXP];
  int *halgo = algo + MAXP, *hmath = math + MAXP;
  size_t *hmem = mem + MAXP;
  cudnnStatus_t s = CUDNN_STATUS_SUCCESS;
  const char *call = "cudnnSetConvolutionMathType";
  if (max > MAXP) max = MAXP;
  /* asked in the most the caller allows (FMA for float32 without TF32) */
  if (!f->cudnnSetConvolutionMathType) goto missing;
  if ((s = f->cudnnSetConvolutionMathType(
           o->conv, (cudnnMathType_t)emk_conv_query_math(c->dtype, c->allow_tf32))))
    goto bad;
  if (c->dir == EMK_CONV_FWD) {
    cudnnConvolutionFwdAlgoPerf_t p[MAXP];
    call = "cudnnGetConvolutionForwardAlgorithm_v7";
    if (!f->cudnnGetConvolutionForwardAlgorithm_v7) goto missing;
    s = f->cudnnGetConvolutionForwardAlgorithm_v7(h, o->x, o->w, o->conv, o->y, max, &got, p);
    for (int i = 0; !s && i < got && i < max; i++) {
      halgo[i] = p[i].status ? -1 : (int)p[i].algo;
      hmath[i] = (int)p[i].mathType, hmem[i] = p[i].memory;
    }
  } else if (c->dir == EMK_CONV_BWD_DATA) {
    cudnnConvolutionBwdDataAlgoPerf_t p[MAXP];
    call = "cudnnGetConvolutionBackwardDataAlgorithm_v7";
    if (!f->cudnnGetConvolutionBackwardDataAlgorithm_v7) goto missing;
    s = f->cudnnGetConvolutionBackwardDataAlgorithm_v7(h, o->w, o->y, o->conv, o->x, max, &got,
                                                       p);
    for (int i = 0; !s && i < got && i < max; i++) {
      halgo[i] = p[i].status ? -1 : (int)p[i].algo;
      hmath[i] = (int)p[i].mathType, hmem[i] = p[i].memory;
    }
  } else {
    cudnnConvolutionBwdFilterAlgoPerf_t p[MAXP];
    call = "cudnnGetConvolutionBackwardFilterAlgorithm_v7";
    if (!f->cudnnGetConvolutionBackwardFilterAlgorithm_v7) goto missing;
    s = f->cudnnGetConvolutionBackwardFilterAlgorithm_v7(h, o->x, o->y, o->conv, o->w, max,
                                                         &got, p);
    for (int i = 0; !s && i < got && i < max; i++) {
      halgo[i] = p[i].status ? -1 : (int)p[i].algo;
      hmath[i] = (int)p[i].mathType, hmem[i] = p[i].memory;
    }
  }
  if (s) goto bad;
  if (got > max) got = max;
  if (got < 0) got = 0;
  /* Find before the heuristics' entries, which stay behind as the fallback of
  ** an algorithm Find skipped; without Find the list is the heuristics' alone */
  size_t ws_want = 0;
  for (int i = 0; i < got; i++)
    if (halgo[i] >= 0 && hmem[i] > ws_want) ws_want = hmem[i];
  int found = 0, first = MAXP;
  if (!find_list(R, D, dev, o, c, ws_want, max, algo, math, mem, &found) && found > 0) {
    /* Find's entries, then the heuristics' moved up behind them */
    memmove(algo + found, halgo, (size_t)got * sizeof *algo);
    memmove(math + found, hmath, (size_t)got * sizeof *math);
    memmove(mem + found, hmem, (size_t)got * sizeof *mem);
    first = 0, got += found;
  }
  /* each usable entry in the mode it may run in (dnn.h), once */
  for (int i = first; i < first + got && *n < max; i++) {
    int use, dup = 0;
    if (algo[i] < 0 || !emk_conv_math(c->dtype, c->allow_tf32, math[i], &use)) continue;
    for (int j = 0; j < *n && !dup; j++) dup = out[j].algo == algo[i] && out[j].math == use;
    if (dup) continue;
    size_t ws = mem[i];
    if (use != math[i] && !f->cudnnSetConvolutionMathType(o->conv, (cudnnMathType_t)use))
      ws = conv_workspace(f, h, o, c->dir, algo[i], mem[i]);
    out[*n].algo = algo[i];
    out[*n].workspace = ws;
    out[*n].math = use;
    (*n)++;
  }
  conv_done(D, o, kept);
  handle_done(D, dev);
  return EM_OK;
missing:
  conv_done(D, o, kept);
  handle_done(D, dev);
  return emr_fail(R, EM_ERR_UNSUPPORTED, "%s: the loaded cuDNN has no %s", what, call);
bad:
  conv_done(D, o, kept);
  handle_done(D, dev);
  st = dnn_say(f, s, call, why, sizeof why);
  return emr_fail(R, st == EM_ERR_SHAPE ? st : EM_ERR_DEVICE, "%s: %s", what, why);
}

em_status emr_conv(emk_runtime *rt, emk_stream *s, const emk_conv_desc *c,
                   const emk_conv_algo *algo, void *ws, size_t ws_size, void *x, void *w,
                   void *y, void *bias) {
  emr *R = (emr *)rt->impl;
  char what[260], why[EMK_ERRMSG_SIZE];
  em_status st = emr_check_stream(R, s, "conv");
  if (st) return st;
  conv_what(what, sizeof what, "conv", s->dev, c);
  if (!algo) return emr_fail(R, EM_ERR_ARG, "%s: no algorithm (NULL)", what);
  size_t wl = strlen(what);
  snprintf(what + wl - 1, sizeof what - wl + 1, ", algorithm %d, math mode %d)", algo->algo,
           algo->math);
  int use;
  if (!emk_conv_math(c->dtype, c->allow_tf32, algo->math, &use) || use != algo->math)
    return emr_fail(R, EM_ERR_ARG, "%s: that math mode may not run for %s with TF32 %s", what,
                    em_dtype_name(c->dtype), c->allow_tf32 ? "allowed" : "off");
  if (!x || !w || !y) return emr_fail(R, EM_ERR_ARG, "%s: NULL operand", what);
  struct emr_dnn *D;
  if ((st = handle_take(R, s->dev, what, &D))) return st;
  const emk_cudnn_fns *f = D->f;
  cudnnHandle_t h = D->h[s->dev];
  conv_objs *o;
  int kept;
  if ((st = conv_take(R, D, s->dev, c, &o, &kept, what))) {
    handle_done(D, s->dev);
    return st;
  }
  float one_f = 1, zero_f = 0;
  double one_d = 1, zero_d = 0;
  int dbl = c->dtype == EM_FLOAT64;
  const void *one = dbl ? (const void *)&one_d : (const void *)&one_f;
  const void *zero = dbl ? (const void *)&zero_d : (const void *)&zero_f;
  cudnnStatus_t cs;
  /* the mode the algorithm was ranked in, on a descriptor that may carry another */
  const char *call = "cudnnSetConvolutionMathType";
  if (!f->cudnnSetConvolutionMathType) goto missing;
  if ((cs = f->cudnnSetConvolutionMathType(o->conv, (cudnnMathType_t)algo->math))) goto bad;
  call = "cudnnSetStream";
  if (!f->cudnnSetStream) goto missing;
  if ((cs = f->cudnnSetStream(h, s->s))) goto bad;
  if (c->dir == EMK_CONV_FWD) {
    call = "cudnnConvolutionForward";
    if (!f->cudnnConvolutionForward) goto missing;
    if ((cs = f->cudnnConvolutionForward(h, one, o->x, x, o->w, w, o->conv,
                                         (cudnnConvolutionFwdAlgo_t)algo->algo, ws, ws_size,
                                         zero, o->y, y)))
      goto bad;
    if (bias) {
      call = "cudnnAddTensor (bias)";
      if (!f->cudnnAddTensor) goto missing;
      if ((cs = f->cudnnAddTensor(h, one, o->bias, bias, one, o->y, y))) goto bad;
    }
  } else if (c->dir == EMK_CONV_BWD_DATA) {
    call = "cudnnConvolutionBackwardData";
    if (!f->cudnnConvolutionBackwardData) goto missing;
    if ((cs = f->cudnnConvolutionBackwardData(h, one, o->w, w, o->y, y, o->conv,
                                              (cudnnConvolutionBwdDataAlgo_t)algo->algo, ws,
                                              ws_size, zero, o->x, x)))
      goto bad;
  } else {
    call = "cudnnConvolutionBackwardFilter";
    if (!f->cudnnConvolutionBackwardFilter) goto missing;
    if ((cs = f->cudnnConvolutionBackwardFilter(h, one, o->x, x, o->y, y, o->conv,
                                                (cudnnConvolutionBwdFilterAlgo_t)algo->algo, ws,
                                                ws_size, zero, o->w, w)))
      goto bad;
    if (bias) {              /* NULL: the caller wants no bias gradient */
      call = "cudnnConvolutionBackwardBias";
      if (!f->cudnnConvolutionBackwardBias) goto missing;
      if ((cs = f->cudnnConvolutionBackwardBias(h, one, o->y, y, zero, o->bias, bias))) goto bad;
    }
  }
  conv_done(D, o, kept);
  handle_done(D, s->dev);
  return EM_OK;
missing:
  conv_done(D, o, kept);
  handle_done(D, s->dev);
  return emr_fail(R, EM_ERR_UNSUPPORTED, "%s: the loaded cuDNN has no %s", what, call);
bad:
  conv_done(D, o, kept);
  handle_done(D, s->dev);
  st = dnn_say(f, cs, call, why, sizeof why);
  return emr_fail(R, st, "%s: %s", what, why);
}

/* -- Batch norm: x as (N, C, L, 1), spatial mode (statistics per channel) -------------- */

/* x is described as (N, C, L, 1) in NCHW or, for a channels-last x, NHWC order
** (strides L*C, 1, C, C: N*L rows of C), and the same descriptor serves y, gy and
** gx. The derived parameter descriptor is (1, C, 1, 1) either way, float32 for
** half data. Channels-last float16/bfloat16 runs cuDNN's persistent spatial mode
** (its fast NHWC kernels, what PyTorch picks for channels last); every other case
** the plain spatial mode. Both take the saved mean and invstd in the backward. */
typedef struct bn_objs { cudnnTensorDescriptor_t x, p; cudnnBatchNormMode_t mode; } bn_objs;

static cudnnBatchNormMode_t bn_mode(const emk_bn_desc *b) {
  return b->nhwc && (b->dtype == EM_FLOAT16 || b->dtype == EM_BFLOAT16)
             ? CUDNN_BATCHNORM_SPATIAL_PERSISTENT
             : CUDNN_BATCHNORM_SPATIAL;
}

static em_status bn_describe(const emk_cudnn_fns *f, const emk_bn_desc *b, bn_objs *o,
                             const char *what, char *err, size_t errlen) {
  memset(o, 0, sizeof *o);
  if (b->dtype != EM_FLOAT32 && b->dtype != EM_FLOAT64 && b->dtype != EM_FLOAT16 &&
      b->dtype != EM_BFLOAT16)
    return emk_errf(err, errlen, EM_ERR_DTYPE, "dtype %s (a floating dtype expected)",
                    em_dtype_name(b->dtype));
  if (b->N > INT_MAX || b->C > INT_MAX || b->L > INT_MAX)
    return emk_errf(err, errlen, EM_ERR_UNSUPPORTED, "a size beyond cuDNN's int range");
  if (!f->cudnnDeriveBNTensorDescriptor)
    return emk_errf(err, errlen, EM_ERR_UNSUPPORTED, "the loaded cuDNN has no batch norm");
  /* half data: cuDNN derives a float parameter descriptor (scale, bias, running
  ** and saved statistics), the float32 the ops layer gives with a half x */
  cudnnDataType_t dt = b->dtype == EM_FLOAT64   ? CUDNN_DATA_DOUBLE
                       : b->dtype == EM_FLOAT16 ? CUDNN_DATA_HALF
                       : b->dtype == EM_BFLOAT16 ? CUDNN_DATA_BFLOAT16
                                                 : CUDNN_DATA_FLOAT;
  cudnnStatus_t s;
  const char *call = "cudnnCreateTensorDescriptor";
  if ((s = f->cudnnCreateTensorDescriptor(&o->x)) || (s = f->cudnnCreateTensorDescriptor(&o->p)))
    goto bad;
  call = "cudnnSetTensor4dDescriptor";
  if ((s = f->cudnnSetTensor4dDescriptor(o->x, b->nhwc ? CUDNN_TENSOR_NHWC : CUDNN_TENSOR_NCHW,
                                         dt, (int)b->N, (int)b->C, (int)b->L, 1)))
    goto bad;
  o->mode = bn_mode(b);
  call = "cudnnDeriveBNTensorDescriptor";
  if ((s = f->cudnnDeriveBNTensorDescriptor(o->p, o->x, o->mode))) goto bad;
  return EM_OK;
bad:
  if (o->x) f->cudnnDestroyTensorDescriptor(o->x);
  if (o->p) f->cudnnDestroyTensorDescriptor(o->p);
  memset(o, 0, sizeof *o);
  (void)what;
  return dnn_say(f, s, call, err, errlen);
}

static void bn_free(const emk_cudnn_fns *f, bn_objs *o) {
  if (o->x) f->cudnnDestroyTensorDescriptor(o->x);
  if (o->p) f->cudnnDestroyTensorDescriptor(o->p);
}

em_status emr_batch_norm_fwd(emk_runtime *rt, emk_stream *s, const emk_bn_desc *b,
                             const void *x, const void *w, const void *bias, void *y,
                             void *mean, void *invstd, void *running_mean, void *running_var) {
  emr *R = (emr *)rt->impl;
  char what[120], why[EMK_ERRMSG_SIZE];
  snprintf(what, sizeof what, "batch_norm_fwd (%s, N %lld, C %lld, L %lld%s)",
           em_dtype_name(b->dtype), (long long)b->N, (long long)b->C, (long long)b->L,
           b->nhwc ? ", channels last" : "");
  em_status st = emr_check_stream(R, s, what);
  if (st) return st;
  struct emr_dnn *H;
  if ((st = handle_take(R, s->dev, what, &H))) return st;
  const emk_cudnn_fns *f = H->f;
  bn_objs o;
  if ((st = bn_describe(f, b, &o, what, why, sizeof why))) {
    handle_done(H, s->dev);
    return emr_fail(R, st, "%s: %s", what, why);
  }
  float one_f = 1, zero_f = 0;
  double one_d = 1, zero_d = 0;
  int dbl = b->dtype == EM_FLOAT64;
  cudnnStatus_t cs = CUDNN_STATUS_NOT_SUPPORTED;
  const char *call = "cudnnBatchNormalizationForwardTraining";
  if (f->cudnnSetStream && f->cudnnBatchNormalizationForwardTraining &&
      !(cs = f->cudnnSetStream(H->h[s->dev], s->s)))
    /* cuDNN's running variance moves towards the unbiased variance, its saved
    ** inverse variance is 1/sqrt(biased var + eps): the contract's two */
    cs = f->cudnnBatchNormalizationForwardTraining(
        H->h[s->dev], o.mode, dbl ? (const void *)&one_d : (const void *)&one_f,
        dbl ? (const void *)&zero_d : (const void *)&zero_f, o.x, x, o.x, y, o.p, w, bias,
        b->momentum, running_mean, running_var, b->eps, mean, invstd);
  bn_free(f, &o);
  handle_done(H, s->dev);
  if (cs) {
    st = dnn_say(f, cs, call, why, sizeof why);
    return emr_fail(R, st, "%s: %s", what, why);
  }
  return EM_OK;
}

em_status emr_batch_norm_bwd(emk_runtime *rt, emk_stream *s, const emk_bn_desc *b,
                             const void *x, const void *gy, const void *w, const void *mean,
                             const void *invstd, void *gx, void *gw, void *gb) {
  emr *R = (emr *)rt->impl;
  char what[120], why[EMK_ERRMSG_SIZE];
  snprintf(what, sizeof what, "batch_norm_bwd (%s, N %lld, C %lld, L %lld%s)",
           em_dtype_name(b->dtype), (long long)b->N, (long long)b->C, (long long)b->L,
           b->nhwc ? ", channels last" : "");
  em_status st = emr_check_stream(R, s, what);
  if (st) return st;
  struct emr_dnn *H;
  if ((st = handle_take(R, s->dev, what, &H))) return st;
  const emk_cudnn_fns *f = H->f;
  bn_objs o;
  if ((st = bn_describe(f, b, &o, what, why, sizeof why))) {
    handle_done(H, s->dev);
    return emr_fail(R, st, "%s: %s", what, why);
  }
  float one_f = 1, zero_f = 0;
  double one_d = 1, zero_d = 0;
  int dbl = b->dtype == EM_FLOAT64;
  const void *one = dbl ? (const void *)&one_d : (const void *)&one_f;
  const void *zero = dbl ? (const void *)&zero_d : (const void *)&zero_f;
  cudnnStatus_t cs = CUDNN_STATUS_NOT_SUPPORTED;
  const char *call = "cudnnBatchNormalizationBackward";
  /* eps only matters where the saved statistics are not given; they always are */
  if (f->cudnnSetStream && f->cudnnBatchNormalizationBackward &&
      !(cs = f->cudnnSetStream(H->h[s->dev], s->s)))
    cs = f->cudnnBatchNormalizationBackward(H->h[s->dev], o.mode, one, zero,
                                            one, zero, o.x, x, o.x, gy, o.x, gx, o.p, w, gw, gb,
                                            1e-5, mean, invstd);
  bn_free(f, &o);
  handle_done(H, s->dev);
  if (cs) {
    st = dnn_say(f, cs, call, why, sizeof why);
    return emr_fail(R, st, "%s: %s", what, why);
  }
  return EM_OK;
}

#else
/* Without the cuDNN headers (the CUDA runtime's present): the entries say so. */
#ifdef EMK_HAVE_CUDART_H
#include "real.h"
#define NO_DNN(R, what) emr_fail((emr *)(R)->impl, EM_ERR_UNSUPPORTED, \
                                 "%s: ember was built without cudnn.h (no cuDNN)", what)
em_status emr_conv_algos(emk_runtime *rt, int dev, const emk_conv_desc *c, emk_conv_algo *out,
                         int max, int *n) {
  *n = 0;
  return NO_DNN(rt, "conv_algos");
}
em_status emr_conv(emk_runtime *rt, emk_stream *s, const emk_conv_desc *c,
                   const emk_conv_algo *algo, void *ws, size_t ws_size, void *x, void *w,
                   void *y, void *bias) {
  return NO_DNN(rt, "conv");
}
em_status emr_batch_norm_fwd(emk_runtime *rt, emk_stream *s, const emk_bn_desc *b,
                             const void *x, const void *w, const void *bias, void *y,
                             void *mean, void *invstd, void *running_mean, void *running_var) {
  return NO_DNN(rt, "batch_norm_fwd");
}
em_status emr_batch_norm_bwd(emk_runtime *rt, emk_stream *s, const emk_bn_desc *b,
                             const void *x, const void *gy, const void *w, const void *mean,
                             const void *invstd, void *gx, void *gw, void *gb) {
  return NO_DNN(rt, "batch_norm_bwd");
}
void emr_dnn_close(emr *R) { (void)R; }
#endif
em_status emk_dnn_describe_check(const emk_conv_desc *c, int dims[4], char *err,
                                 size_t errlen) {
  return emk_errf(err, errlen, EM_ERR_UNSUPPORTED, "cuDNN: ember was built without cudnn.h");
}
em_status emk_dnn_math_check(const emk_conv_desc *c, int math, int *got, char *err,
                             size_t errlen) {
  *got = -1;
  return emk_errf(err, errlen, EM_ERR_UNSUPPORTED, "cuDNN: ember was built without cudnn.h");
}
int emk_real_conv_plans(emk_runtime *rt, emk_plan_cache_stats *out) {
  (void)rt, (void)out;
  return -1;
}
em_status emk_dnn_find_symbols(int *count, char *err, size_t errlen) {
  *count = 0;
  return emk_errf(err, errlen, EM_ERR_UNSUPPORTED, "cuDNN: ember was built without cudnn.h");
}
#endif

/*
** dnn_real.c -- the real runtime's nn entries (runtime.h) on cuDNN 9's
** descriptor API (the v8 API that cuDNN 9 keeps beside the graph API): the
** convolutions in three directions and training batch norm, NCHW, float32
** (computing in float32, TF32 only when the caller allows it) and float64.
**
** Layers, as in gemm_real.c, the first testable without a GPU:
**   1. describe: the tensor, filter and convolution descriptors for an
**      emk_conv_desc (cudnnCreate*Descriptor and the Set calls need no driver);
**      emk_dnn_describe_check builds them and reads back cuDNN's output dims, so
**      the tests check our geometry against cuDNN's on any machine with cuDNN.
**   2. the calls. A cuDNN handle per device, made at the device's first nn call
**      and kept until close; a handle is not to be used by two threads at once,
**      and its stream is state, so each call takes the device's lock, sets the
**      handle's stream to the caller's, and queues its work. Descriptors are host
**      objects read at the call: destroyed right after.
**   3. conv_algos asks cuDNN's heuristics (Get*Algorithm_v7: no trial runs, no
**      memory) for its ranked list and keeps the algorithms whose status is
**      success, with their workspace; k_dnn.c picks one per shape and caches it.
** cuDNN is loaded at the first nn call; an entry the loaded cuDNN lacks (the nn
** functions are optional in libs_fn.h) is EM_ERR_UNSUPPORTED naming it.
**
** Never run on a GPU by its author (the machine had none): only layer 1 is
** exercised by the tests (tests/c/test_cuda_dnn.c).
*/
#include "libs_fn.h"
#include "../dnn.h"
#include <limits.h>
#include <stdio.h>
#include <string.h>

#if defined(EMK_HAVE_CUDART_H) && defined(EMK_HAVE_CUDNN_H)
#include "real.h"

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
  if (c->dtype != EM_FLOAT32 && c->dtype != EM_FLOAT64)
    return emk_errf(err, errlen, EM_ERR_DTYPE, "cuDNN convolution: dtype %s (float32 or "
                    "float64 only)", em_dtype_name(c->dtype));
  if (!fits_int(c))
    return emk_errf(err, errlen, EM_ERR_UNSUPPORTED, "cuDNN convolution: a size beyond "
                    "cuDNN's int range");
  cudnnDataType_t dt = c->dtype == EM_FLOAT64 ? CUDNN_DATA_DOUBLE : CUDNN_DATA_FLOAT;
  cudnnStatus_t s;
  const char *call = "cudnnCreateTensorDescriptor";
  if ((s = f->cudnnCreateTensorDescriptor(&o->x)) || (s = f->cudnnCreateTensorDescriptor(&o->y)) ||
      (s = f->cudnnCreateTensorDescriptor(&o->bias)))
    goto bad;
  call = "cudnnSetTensor4dDescriptor(x)";
  if ((s = f->cudnnSetTensor4dDescriptor(o->x, CUDNN_TENSOR_NCHW, dt, (int)c->N, (int)c->C,
                                         (int)c->H, (int)c->W)))
    goto bad;
  call = "cudnnSetTensor4dDescriptor(y)";
  if ((s = f->cudnnSetTensor4dDescriptor(o->y, CUDNN_TENSOR_NCHW, dt, (int)c->N, (int)c->O,
                                         (int)c->OH, (int)c->OW)))
    goto bad;
  call = "cudnnSetTensor4dDescriptor(bias)";
  if ((s = f->cudnnSetTensor4dDescriptor(o->bias, CUDNN_TENSOR_NCHW, dt, 1, (int)c->O, 1, 1)))
    goto bad;
  call = "cudnnCreateFilterDescriptor";
  if ((s = f->cudnnCreateFilterDescriptor(&o->w))) goto bad;
  call = "cudnnSetFilter4dDescriptor";
  if ((s = f->cudnnSetFilter4dDescriptor(o->w, dt, CUDNN_TENSOR_NCHW, (int)c->O,
                                         (int)(c->C / c->G), (int)c->kH, (int)c->kW)))
    goto bad;
  call = "cudnnCreateConvolutionDescriptor";
  if ((s = f->cudnnCreateConvolutionDescriptor(&o->conv))) goto bad;
  call = "cudnnSetConvolution2dDescriptor";
  if ((s = f->cudnnSetConvolution2dDescriptor(o->conv, (int)c->pH, (int)c->pW, (int)c->sH,
                                              (int)c->sW, (int)c->dH, (int)c->dW,
                                              CUDNN_CROSS_CORRELATION, dt)))
    goto bad;
  if (c->G > 1) {
    call = "cudnnSetConvolutionGroupCount";
    if (!f->cudnnSetConvolutionGroupCount) goto missing;
    if ((s = f->cudnnSetConvolutionGroupCount(o->conv, (int)c->G))) goto bad;
  }
  if (f->cudnnSetConvolutionMathType) {
    /* TF32 only where the caller allows it, as the gemm does */
    call = "cudnnSetConvolutionMathType";
    cudnnMathType_t m = c->dtype == EM_FLOAT32 && c->allow_tf32 ? CUDNN_DEFAULT_MATH
                                                                : CUDNN_FMA_MATH;
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

/* == 2. Handles ============================================================================= */

/* The handles of one real runtime (the runtime has no slot of its own for them). */
typedef struct dnn_handles {
  emr *R;
  const emk_cudnn_fns *f;
  int state;                       /* 0 not loaded, 1 loaded, -1 failed (why) */
  char why[EMK_ERRMSG_SIZE];
  cudnnHandle_t h[EMK_MAX_DEVICES];
  pthread_mutex_t dev_mu[EMK_MAX_DEVICES];   /* one user of a device's handle at a time */
} dnn_handles;

enum { MAX_RUNTIMES = 4 };
static pthread_mutex_t handles_mu = PTHREAD_MUTEX_INITIALIZER;
static dnn_handles handles[MAX_RUNTIMES];

/* R's table, claimed at its first nn call. */
static dnn_handles *handles_of(emr *R) {
  dnn_handles *out = NULL;
  pthread_mutex_lock(&handles_mu);
  for (int i = 0; i < MAX_RUNTIMES && !out; i++)
    if (handles[i].R == R) out = &handles[i];
  for (int i = 0; i < MAX_RUNTIMES && !out; i++)
    if (!handles[i].R) {
      memset(&handles[i], 0, sizeof handles[i]);
      handles[i].R = R;
      for (int d = 0; d < EMK_MAX_DEVICES; d++) pthread_mutex_init(&handles[i].dev_mu[d], NULL);
      out = &handles[i];
    }
  pthread_mutex_unlock(&handles_mu);
  return out;
}

/* At close (runtime_real.c): destroys R's handles and frees its slot. */
void emr_dnn_close(emr *R) {
  pthread_mutex_lock(&handles_mu);
  for (int i = 0; i < MAX_RUNTIMES; i++) {
    dnn_handles *H = &handles[i];
    if (H->R != R) continue;
    for (int d = 0; d < EMK_MAX_DEVICES; d++) {
      if (H->h[d] && R->f->cudaSetDevice(d) == cudaSuccess) H->f->cudnnDestroy(H->h[d]);
      pthread_mutex_destroy(&H->dev_mu[d]);
    }
    memset(H, 0, sizeof *H);
  }
  pthread_mutex_unlock(&handles_mu);
}

/* cuDNN's handle for dev with the device current and its lock held (unlock with
** handle_done); what names the call in messages. */
static em_status handle_take(emr *R, int dev, const char *what, dnn_handles **out) {
  em_status st = emr_use(R, dev, what);
  if (st) return st;
  dnn_handles *H = handles_of(R);
  if (!H) return emr_fail(R, EM_ERR_INTERNAL, "%s: too many CUDA runtimes open", what);
  pthread_mutex_lock(&H->dev_mu[dev]);
  if (H->state == 0) {
    H->state = emk_libs_cudnn(R->L, &H->f, H->why, sizeof H->why) ? -1 : 1;
  }
  if (H->state < 0) {
    pthread_mutex_unlock(&H->dev_mu[dev]);
    return emr_fail(R, EM_ERR_UNSUPPORTED, "%s: %s", what, H->why);
  }
  if (!H->h[dev]) {
    cudnnStatus_t s = H->f->cudnnCreate(&H->h[dev]);
    if (s) {
      char why[400];
      dnn_say(H->f, s, "cudnnCreate", why, sizeof why);
      H->h[dev] = NULL;
      pthread_mutex_unlock(&H->dev_mu[dev]);
      return emr_fail(R, EM_ERR_DEVICE, "%s: %s", what, why);
    }
  }
  *out = H;
  return EM_OK;
}

static void handle_done(dnn_handles *H, int dev) { pthread_mutex_unlock(&H->dev_mu[dev]); }

/* == 3. Entries ============================================================================= */

static const char *dir_name(int dir) {
  return dir == EMK_CONV_FWD ? "forward" : dir == EMK_CONV_BWD_DATA ? "backward data"
                                                                    : "backward filter";
}

em_status emr_conv_algos(emk_runtime *rt, int dev, const emk_conv_desc *c, emk_conv_algo *out,
                         int max, int *n) {
  emr *R = (emr *)rt->impl;
  *n = 0;
  char what[80], why[EMK_ERRMSG_SIZE];
  snprintf(what, sizeof what, "conv_algos (%s)", dir_name(c->dir));
  dnn_handles *H;
  em_status st = handle_take(R, dev, what, &H);
  if (st) return st;
  const emk_cudnn_fns *f = H->f;
  conv_objs o;
  if ((st = describe(f, c, &o, why, sizeof why))) {
    handle_done(H, dev);
    return emr_fail(R, st, "%s: %s", what, why);
  }
  enum { MAXP = 16 };
  int got = 0;
  cudnnStatus_t s = CUDNN_STATUS_SUCCESS;
  const char *call = "";
  if (max > MAXP) max = MAXP;
  if (c->dir == EMK_CONV_FWD) {
    cudnnConvolutionFwdAlgoPerf_t p[MAXP];
    call = "cudnnGetConvolutionForwardAlgorithm_v7";
    if (!f->cudnnGetConvolutionForwardAlgorithm_v7) goto missing;
    s = f->cudnnGetConvolutionForwardAlgorithm_v7(H->h[dev], o.x, o.w, o.conv, o.y, max, &got, p);
    for (int i = 0; !s && i < got; i++)
      if (p[i].status == CUDNN_STATUS_SUCCESS)
        out[(*n)++] = (emk_conv_algo){(int)p[i].algo, p[i].memory};
  } else if (c->dir == EMK_CONV_BWD_DATA) {
    cudnnConvolutionBwdDataAlgoPerf_t p[MAXP];
    call = "cudnnGetConvolutionBackwardDataAlgorithm_v7";
    if (!f->cudnnGetConvolutionBackwardDataAlgorithm_v7) goto missing;
    s = f->cudnnGetConvolutionBackwardDataAlgorithm_v7(H->h[dev], o.w, o.y, o.conv, o.x, max,
                                                       &got, p);
    for (int i = 0; !s && i < got; i++)
      if (p[i].status == CUDNN_STATUS_SUCCESS)
        out[(*n)++] = (emk_conv_algo){(int)p[i].algo, p[i].memory};
  } else {
    cudnnConvolutionBwdFilterAlgoPerf_t p[MAXP];
    call = "cudnnGetConvolutionBackwardFilterAlgorithm_v7";
    if (!f->cudnnGetConvolutionBackwardFilterAlgorithm_v7) goto missing;
    s = f->cudnnGetConvolutionBackwardFilterAlgorithm_v7(H->h[dev], o.x, o.y, o.conv, o.w, max,
                                                         &got, p);
    for (int i = 0; !s && i < got; i++)
      if (p[i].status == CUDNN_STATUS_SUCCESS)
        out[(*n)++] = (emk_conv_algo){(int)p[i].algo, p[i].memory};
  }
  conv_free(f, &o);
  handle_done(H, dev);
  if (s) {
    dnn_say(f, s, call, why, sizeof why);
    return emr_fail(R, EM_ERR_DEVICE, "%s: %s", what, why);
  }
  return EM_OK;
missing:
  conv_free(f, &o);
  handle_done(H, dev);
  return emr_fail(R, EM_ERR_UNSUPPORTED, "%s: the loaded cuDNN has no %s", what, call);
}

em_status emr_conv(emk_runtime *rt, emk_stream *s, const emk_conv_desc *c, int algo, void *ws,
                   size_t ws_size, void *x, void *w, void *y, void *bias) {
  emr *R = (emr *)rt->impl;
  char what[80], why[EMK_ERRMSG_SIZE];
  snprintf(what, sizeof what, "conv (%s, algorithm %d)", dir_name(c->dir), algo);
  em_status st = emr_check_stream(R, s, what);
  if (st) return st;
  if (!x || !w || !y) return emr_fail(R, EM_ERR_ARG, "%s: NULL operand", what);
  dnn_handles *H;
  if ((st = handle_take(R, s->dev, what, &H))) return st;
  const emk_cudnn_fns *f = H->f;
  cudnnHandle_t h = H->h[s->dev];
  conv_objs o;
  if ((st = describe(f, c, &o, why, sizeof why))) {
    handle_done(H, s->dev);
    return emr_fail(R, st, "%s: %s", what, why);
  }
  float one_f = 1, zero_f = 0;
  double one_d = 1, zero_d = 0;
  int dbl = c->dtype == EM_FLOAT64;
  const void *one = dbl ? (const void *)&one_d : (const void *)&one_f;
  const void *zero = dbl ? (const void *)&zero_d : (const void *)&zero_f;
  cudnnStatus_t cs;
  const char *call = "cudnnSetStream";
  if (!f->cudnnSetStream) goto missing;
  if ((cs = f->cudnnSetStream(h, s->s))) goto bad;
  if (c->dir == EMK_CONV_FWD) {
    call = "cudnnConvolutionForward";
    if (!f->cudnnConvolutionForward) goto missing;
    if ((cs = f->cudnnConvolutionForward(h, one, o.x, x, o.w, w, o.conv,
                                         (cudnnConvolutionFwdAlgo_t)algo, ws, ws_size, zero,
                                         o.y, y)))
      goto bad;
    if (bias) {
      call = "cudnnAddTensor (bias)";
      if (!f->cudnnAddTensor) goto missing;
      if ((cs = f->cudnnAddTensor(h, one, o.bias, bias, one, o.y, y))) goto bad;
    }
  } else if (c->dir == EMK_CONV_BWD_DATA) {
    call = "cudnnConvolutionBackwardData";
    if (!f->cudnnConvolutionBackwardData) goto missing;
    if ((cs = f->cudnnConvolutionBackwardData(h, one, o.w, w, o.y, y, o.conv,
                                              (cudnnConvolutionBwdDataAlgo_t)algo, ws, ws_size,
                                              zero, o.x, x)))
      goto bad;
  } else {
    call = "cudnnConvolutionBackwardFilter";
    if (!f->cudnnConvolutionBackwardFilter) goto missing;
    if ((cs = f->cudnnConvolutionBackwardFilter(h, one, o.x, x, o.y, y, o.conv,
                                                (cudnnConvolutionBwdFilterAlgo_t)algo, ws,
                                                ws_size, zero, o.w, w)))
      goto bad;
    if (bias) {
      call = "cudnnConvolutionBackwardBias";
      if (!f->cudnnConvolutionBackwardBias) goto missing;
      if ((cs = f->cudnnConvolutionBackwardBias(h, one, o.y, y, zero, o.bias, bias))) goto bad;
    }
  }
  conv_free(f, &o);
  handle_done(H, s->dev);
  return EM_OK;
missing:
  conv_free(f, &o);
  handle_done(H, s->dev);
  return emr_fail(R, EM_ERR_UNSUPPORTED, "%s: the loaded cuDNN has no %s", what, call);
bad:
  conv_free(f, &o);
  handle_done(H, s->dev);
  st = dnn_say(f, cs, call, why, sizeof why);
  return emr_fail(R, st, "%s: %s", what, why);
}

/* -- Batch norm: x as (N, C, L, 1), spatial mode (statistics per channel) -------------- */

typedef struct bn_objs { cudnnTensorDescriptor_t x, p; } bn_objs;

static em_status bn_describe(const emk_cudnn_fns *f, const emk_bn_desc *b, bn_objs *o,
                             const char *what, char *err, size_t errlen) {
  memset(o, 0, sizeof *o);
  if (b->dtype != EM_FLOAT32 && b->dtype != EM_FLOAT64)
    return emk_errf(err, errlen, EM_ERR_DTYPE, "dtype %s (float32 or float64 only)",
                    em_dtype_name(b->dtype));
  if (b->N > INT_MAX || b->C > INT_MAX || b->L > INT_MAX)
    return emk_errf(err, errlen, EM_ERR_UNSUPPORTED, "a size beyond cuDNN's int range");
  if (!f->cudnnDeriveBNTensorDescriptor)
    return emk_errf(err, errlen, EM_ERR_UNSUPPORTED, "the loaded cuDNN has no batch norm");
  cudnnDataType_t dt = b->dtype == EM_FLOAT64 ? CUDNN_DATA_DOUBLE : CUDNN_DATA_FLOAT;
  cudnnStatus_t s;
  const char *call = "cudnnCreateTensorDescriptor";
  if ((s = f->cudnnCreateTensorDescriptor(&o->x)) || (s = f->cudnnCreateTensorDescriptor(&o->p)))
    goto bad;
  call = "cudnnSetTensor4dDescriptor";
  if ((s = f->cudnnSetTensor4dDescriptor(o->x, CUDNN_TENSOR_NCHW, dt, (int)b->N, (int)b->C,
                                         (int)b->L, 1)))
    goto bad;
  call = "cudnnDeriveBNTensorDescriptor";
  if ((s = f->cudnnDeriveBNTensorDescriptor(o->p, o->x, CUDNN_BATCHNORM_SPATIAL))) goto bad;
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
  snprintf(what, sizeof what, "batch_norm_fwd (%s, N %lld, C %lld, L %lld)",
           em_dtype_name(b->dtype), (long long)b->N, (long long)b->C, (long long)b->L);
  em_status st = emr_check_stream(R, s, what);
  if (st) return st;
  dnn_handles *H;
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
        H->h[s->dev], CUDNN_BATCHNORM_SPATIAL, dbl ? (const void *)&one_d : (const void *)&one_f,
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
  snprintf(what, sizeof what, "batch_norm_bwd (%s, N %lld, C %lld, L %lld)",
           em_dtype_name(b->dtype), (long long)b->N, (long long)b->C, (long long)b->L);
  em_status st = emr_check_stream(R, s, what);
  if (st) return st;
  dnn_handles *H;
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
    cs = f->cudnnBatchNormalizationBackward(H->h[s->dev], CUDNN_BATCHNORM_SPATIAL, one, zero,
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
em_status emr_conv(emk_runtime *rt, emk_stream *s, const emk_conv_desc *c, int algo, void *ws,
                   size_t ws_size, void *x, void *w, void *y, void *bias) {
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
#endif

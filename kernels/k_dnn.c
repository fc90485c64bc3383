/*
** k_dnn.c -- the CUDA backend's nn entries (core/backend.h): conv2d and its
** backward, batch norm and its backward (each NCHW or channels last, as cuDNN's
** descriptors and our kernels take either: the table's EMI_NHWC_CONV and _BN). The evaluation batch norm kernels are k_dnn.cu; pooling
** is k_pool.c.
**
** Who computes what, and why:
**   - Convolutions go to the runtime's conv entry (runtime.h): cuDNN on a GPU
**     (real/dnn_real.c), the CPU backend's conv on the emulator (emu/dnn_emu.c).
**     This file picks the algorithm once per shape and owns the workspace, so the
**     policy is the same code on both runtimes and is tested without a GPU:
**       * the algorithm cache: the first convolution of a key (device,
**         direction, dtype, allow_tf32, geometry, layout) asks the runtime's conv_algos
**         for its list, best first, and keeps the first whose workspace is at
**         most a quarter of the device's free memory (and WS_LIMIT) -- else the
**         one needing least. The pick is the runtime's whole answer (number,
**         workspace and the math mode cuDNN ranked it under, already fitted to
**         allow_tf32 by the runtime), and conv gets it whole, so the mode that
**         was ranked is the mode that runs. Later calls of that key take it from
**         the table (hits and misses are counted for tests). The table is the
**         state's, in its CUDA context (algo_cache.c, emk_cuda.algos), so it
**         needs no lock and two states share nothing; without it (no memory for
**         it when the context opened) every convolution chooses afresh.
**       * the workspace comes from the caching allocator on the compute stream
**         and is released right after the call is queued: the allocator hands
**         that memory again only to later work on the same stream. No room for it
**         is a clear EM_ERR_NOMEM naming the op, shapes, dtype, device, algorithm.
**   - Batch norm in training goes to the runtime's batch_norm_fwd/bwd (cuDNN's
**     spatial batch norm; the CPU's on the emulator). cuDNN wants a scale and a
**     bias, contiguous running statistics (both or neither) and every gradient:
**     stand-ins (ones, zeros, scratch, contiguous copies) are made here. A
**     float16/bfloat16 x keeps float32 parameters and statistics, as cuDNN's
**     derived batch norm descriptor has them, so autocast needs no casts around it.
**     A channels-last x (dense, as the ops layer gives it) goes to the runtime as
**     it is, with the desc's nhwc set: cuDNN's NHWC descriptors, the CPU's NHWC
**     loops on the emulator, so an NHWC model reorders nothing around batch norm.
**   - Evaluation-mode batch norm and its backward are our own kernels
**     (k_dnn.cu), on both runtimes: inference batch norm is a per-channel affine
**     that cuDNN would not run faster, and ours also yields mean and invstd. The
**     forward kernel gives each thread one element; the backward gives each
**     thread one channel and walks it in the CPU's order, with no atomics:
**     results equal the CPU's bit for bit and are deterministic.
*/
#include "cuda.h"
#include "dnn.h"
#include "k_dnn_args.h"
#include "k_reduce.h"
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

static emk_runtime *rt_of(emi_device *d) { return emk_dev(d)->cuda->rt; }

static em_status launch(emi_device *d, const char *op, const emk_kernel *k, int64_t items,
                        const void *args, size_t size) {
  if (items <= 0) return EM_OK;
  emk_runtime *rt = rt_of(d);
  int64_t blocks = (items + THREADS - 1) / THREADS;
  if (blocks > MAX_BLOCKS) blocks = MAX_BLOCKS;
  emk_dim3 grid = {(unsigned)blocks, 1, 1}, block = {THREADS, 1, 1};
  em_status st = rt->ops->launch(rt, k, grid, block, 0, emk_dev(d)->compute, args, size);
  return st ? emk_error(d, op, st) : EM_OK;
}

/* "x [2,3,8,8], w [4,3,3,3], float32" for messages about a convolution. */
static const char *conv_what(em_state *S, const emk_conv_desc *c, char *buf, size_t n) {
  snprintf(buf, n, "x [%lld,%lld,%lld,%lld], w [%lld,%lld,%lld,%lld], stride %lldx%lld, "
           "padding %lldx%lld, dilation %lldx%lld, groups %lld, %s%s",
           (long long)c->N, (long long)c->C, (long long)c->H, (long long)c->W,
           (long long)c->O, (long long)(c->C / c->G), (long long)c->kH, (long long)c->kW,
           (long long)c->sH, (long long)c->sW, (long long)c->pH, (long long)c->pW,
           (long long)c->dH, (long long)c->dW, (long long)c->G, em_dtype_name(c->dtype),
           c->nhwc ? ", channels last" : "");
  (void)S;
  return buf;
}

/* -- Choosing an algorithm ------------------------------------------------------------ */

enum { ALGO_LIST = 16 };
static const size_t WS_LIMIT = (size_t)1 << 30;

/* The algorithm for c on d: cached, or chosen now from the runtime's list. */
static em_status pick_algo(emi_device *d, const char *op, const emk_conv_desc *c,
                           emk_conv_algo *out) {
  emk_runtime *rt = rt_of(d);
  emk_algo_cache *cache = emk_dev(d)->cuda->algos;
  if (cache && emk_algo_cache_find(cache, d->index, c, out)) return EM_OK;
  emk_conv_algo list[ALGO_LIST];
  int n = 0;
  em_status st = rt->ops->conv_algos(rt, d->index, c, list, ALGO_LIST, &n);
  char what[300];
  if (st) return emk_error(d, op, st);
  if (n < 1)
    return emi_error(d->S, EM_ERR_UNSUPPORTED, "%s: cuda:%d: the %s runtime has no "
                     "convolution algorithm for %s", op, d->index, rt->ops->name,
                     conv_what(d->S, c, what, sizeof what));
  size_t free_b = 0, total = 0, limit = WS_LIMIT;
  if (!rt->ops->mem_info(rt, d->index, &free_b, &total) && free_b / 4 < limit)
    limit = free_b / 4;
  int best = -1, least = 0;
  for (int i = 0; i < n; i++) {
    if (best < 0 && list[i].workspace <= limit) best = i;
    if (list[i].workspace < list[least].workspace) least = i;
  }
  *out = list[best >= 0 ? best : least];
  if (cache) emk_algo_cache_put(cache, d->index, c, out);
  return EM_OK;
}

/* One convolution on d's compute stream, with its algorithm and workspace. */
static em_status run_conv(emi_device *d, const char *op, const emk_conv_desc *c, void *x,
                          void *w, void *y, void *bias) {
  emk_cuda_device *cd = emk_dev(d);
  emk_runtime *rt = cd->cuda->rt;
  char what[300];
  if (!rt->ops->conv || !rt->ops->conv_algos)
    return emi_error(d->S, EM_ERR_UNSUPPORTED, "%s: cuda:%d: the %s runtime has no "
                     "convolutions", op, d->index, rt->ops->name);
  emk_conv_algo algo;
  em_status st = pick_algo(d, op, c, &algo);
  if (st) return st;
  void *ws = NULL;
  char err[EMK_ERRMSG_SIZE];
  if (algo.workspace &&
      emk_alloc_malloc(cd->cuda->alloc, cd->index, algo.workspace, cd->compute, &ws, err,
                       sizeof err))
    return emi_error(d->S, EM_ERR_NOMEM, "%s: cuda:%d: out of memory for the %zu-byte "
                     "workspace of convolution algorithm %d (%s): %s", op, d->index,
                     algo.workspace, algo.algo, conv_what(d->S, c, what, sizeof what), err);
  st = rt->ops->conv(rt, cd->compute, c, &algo, ws, algo.workspace, x, w, y, bias);
  if (st) st = emk_error(d, op, st);
  if (ws) emk_alloc_release(cd->cuda->alloc, ws, err, sizeof err);   /* reused only by
                                                                      later work on the stream */
  return st;
}

static void conv_desc(emk_conv_desc *c, emi_device *d, const emi_conv_geom *g, em_dtype dt,
                      int dir) {
  memset(c, 0, sizeof *c);
  c->dir = dir;
  c->allow_tf32 = emi_allow_tf32(d->S);
  c->dtype = dt;
  c->N = g->N, c->C = g->C, c->H = g->H, c->W = g->W, c->O = g->O, c->kH = g->kH;
  c->kW = g->kW, c->OH = g->OH, c->OW = g->OW, c->sH = g->sH, c->sW = g->sW;
  c->pH = g->pH, c->pW = g->pW, c->dH = g->dH, c->dW = g->dW, c->G = g->G;
  c->nhwc = g->nhwc;
}

static void *dptr(const em_tensor *t) { return t ? em_tensor_data(t) : NULL; }

/* cuDNN has no channels-last float64 convolution (no algorithm, forward or backward):
** such a conv runs on NCHW copies of its operands, the results written back in
** their own order. Internal, so not counted as the model's layout conversions. */
static bool nhwc_unserved(const emi_conv_geom *g, em_dtype dt) {
  return g->nhwc && dt == EM_FLOAT64;
}

/* *out = an NCHW copy of t (t NULL: NULL); with copy 0 only the buffer. */
static em_status nchw_copy(emi_device *d, const char *op, const em_tensor *t, int copy,
                           em_tensor **out) {
  *out = NULL;
  if (!t) return EM_OK;
  em_status st = emi_tensor_new(d->S, op, t->sizes, t->ndim, t->dtype, d->index, out);
  if (!st && copy && (st = emk_copy_same_dtype(d, *out, t))) {
    em_tensor_release(*out);
    *out = NULL;
  }
  return st;
}

/* cuDNN's bias gradient takes float32, float64 and float16 only: a bfloat16 bias
** gradient is our own sum of gy over N, H and W (float accumulation, one rounding). */
static em_status bias_grad_sum(emi_device *d, em_tensor *gb, const em_tensor *gy) {
  int64_t sizes[4] = {1, gb->sizes[0], 1, 1}, strides[4] = {gb->sizes[0] * gb->strides[0],
                                                            gb->strides[0], 1, 1};
  em_tensor *v = NULL;
  em_status st = emi_tensor_view(d->S, gb, sizes, strides, 4, gb->offset, &v);
  if (st) return st;
  st = emk_reduce(d, EM_SUM, v, gy, 1u | 4u | 8u);
  em_tensor_release(v);
  return st;
}

em_status emk_conv2d(emi_device *d, const emi_conv_geom *g, em_tensor *y, const em_tensor *x,
                     const em_tensor *w, const em_tensor *b) {
  if (y->numel == 0) return EM_OK;
  if (nhwc_unserved(g, x->dtype)) {
    emi_conv_geom gn = *g;
    gn.nhwc = 0;
    em_tensor *t[3] = {NULL, NULL, NULL};
    em_status st;
    if (!(st = nchw_copy(d, "conv2d", x, 1, &t[0])) &&
        !(st = nchw_copy(d, "conv2d", w, 1, &t[1])) &&
        !(st = nchw_copy(d, "conv2d", y, 0, &t[2])) &&
        !(st = emk_conv2d(d, &gn, t[2], t[0], t[1], b)))
      st = emk_copy_same_dtype(d, y, t[2]);
    for (int i = 0; i < 3; i++) em_tensor_release(t[i]);
    return st;
  }
  emk_conv_desc c;
  conv_desc(&c, d, g, x->dtype, EMK_CONV_FWD);
  return run_conv(d, "conv2d", &c, dptr(x), dptr(w), dptr(y), dptr(b));
}

em_status emk_conv2d_backward(emi_device *d, const emi_conv_geom *g, em_tensor *gx,
                              em_tensor *gw, em_tensor *gb, const em_tensor *gy,
                              const em_tensor *x, const em_tensor *w) {
  const char *op = "conv2d_backward";
  emk_conv_desc c;
  em_status st = EM_OK;
  if (nhwc_unserved(g, x->dtype)) {
    emi_conv_geom gn = *g;
    gn.nhwc = 0;
    em_tensor *t[6] = {NULL, NULL, NULL, NULL, NULL, NULL};
    if (!(st = nchw_copy(d, op, gy, 1, &t[0])) && !(st = nchw_copy(d, op, x, 1, &t[1])) &&
        !(st = nchw_copy(d, op, w, 1, &t[2])) && !(st = nchw_copy(d, op, gx, 0, &t[3])) &&
        !(st = nchw_copy(d, op, gw, 0, &t[4])) &&
        !(st = emk_conv2d_backward(d, &gn, t[3], t[4], gb, t[0], t[1], t[2])) &&
        !(st = gx ? emk_copy_same_dtype(d, gx, t[3]) : EM_OK))
      st = gw ? emk_copy_same_dtype(d, gw, t[4]) : EM_OK;
    for (int i = 0; i < 6; i++) em_tensor_release(t[i]);
    return st;
  }
  if (gx) {
    conv_desc(&c, d, g, x->dtype, EMK_CONV_BWD_DATA);
    if ((st = run_conv(d, op, &c, dptr(gx), dptr(w), dptr(gy), NULL))) return st;
  }
  if (gb && gb->dtype == EM_BFLOAT16) {
    if ((st = bias_grad_sum(d, gb, gy))) return st;
    gb = NULL;
  }
  if (!gw && !gb) return EM_OK;
  em_tensor *tmp = NULL;          /* the filter pass writes a weight gradient anyway */
  if (!gw && (st = emi_tensor_new_fmt(d->S, op, w->sizes, w->ndim, w->dtype, d->index,
                                      g->nhwc, &tmp)))
    return st;
  conv_desc(&c, d, g, x->dtype, EMK_CONV_BWD_FILTER);
  st = run_conv(d, op, &c, dptr(x), gw ? dptr(gw) : dptr(tmp), dptr(gy), dptr(gb));
  em_tensor_release(tmp);
  return st;
}

#define BY_DTYPE(name, dt) ((dt) == EM_FLOAT64 ? &name##_f64 : &name##_f32)

/* -- Batch norm ---------------------------------------------------------------------------- */

/* A float16/bfloat16 x comes with float32 weight, bias and statistics (the ops
** layer's rule; cuDNN derives float parameter descriptors for half data too): the
** parameters' dtype, and the kernel of x's dtype. */
static em_dtype bn_pdt(em_dtype dt) {
  return dt == EM_FLOAT16 || dt == EM_BFLOAT16 ? EM_FLOAT32 : dt;
}
#define BN_BY_DTYPE(name, dt)                                                         \
  ((dt) == EM_FLOAT16 ? &name##_f16 : (dt) == EM_BFLOAT16 ? &name##_bf16              \
                                                          : BY_DTYPE(name, dt))

static void bn_dims(const em_tensor *x, int64_t *N, int64_t *C, int64_t *L) {
  *N = x->sizes[0];
  *C = x->sizes[1];
  *L = 1;
  for (int i = 2; i < x->ndim; i++) *L *= x->sizes[i];
}

/* The ops layer hands x dense: NCHW-contiguous, or else channels last. */
static int bn_nhwc(const em_tensor *x) { return !em_tensor_is_contiguous(x); }

/* cuDNN's channels-last training batch norm in float32/float64 (SPATIAL mode) ran 7
** to 11 times slower than its NCHW one on an H100 (1.25 ms against 0.11 forward,
** 1.9 against 0.28 backward, a ResNet-18 layer at batch 512): those run on NCHW
** copies, which cost a few tens of microseconds. Half types take the persistent
** NHWC kernels. Internal, so not counted as the model's layout conversions. */
static int bn_via_nchw(const em_tensor *x) {
  return bn_nhwc(x) && (x->dtype == EM_FLOAT32 || x->dtype == EM_FLOAT64);
}

/* A fresh (C) tensor of dt on d filled with v (v NAN: left unwritten). */
static em_status vec(emi_device *d, const char *op, int64_t C, em_dtype dt, double v,
                     em_tensor **out) {
  em_status st = emi_tensor_new(d->S, op, &C, 1, dt, d->index, out);
  if (!st && !isnan(v) && (st = emk_fill(d, *out, v))) {
    em_tensor_release(*out);
    *out = NULL;
  }
  return st;
}

/* A running statistic as the runtime wants it: t itself when contiguous, else a
** contiguous copy (*tmp) that the caller copies back. */
static em_status running(emi_device *d, const char *op, em_tensor *t, em_tensor **use,
                         em_tensor **tmp) {
  *tmp = NULL;
  *use = t;
  if (!t || em_tensor_is_contiguous(t)) return EM_OK;
  em_status st = emi_tensor_new(d->S, op, t->sizes, t->ndim, t->dtype, d->index, tmp);
  if (!st && (st = emk_copy_same_dtype(d, *tmp, t))) {
    em_tensor_release(*tmp);
    *tmp = NULL;
  }
  *use = *tmp;
  return st;
}

static em_status bn_eval(emi_device *d, em_tensor *y, em_tensor *mean, em_tensor *invstd,
                         em_tensor *rm, em_tensor *rv, const em_tensor *x, const em_tensor *w,
                         const em_tensor *b, double eps) {
  bn_args a;
  memset(&a, 0, sizeof a);
  bn_dims(x, &a.N, &a.C, &a.L);
  a.nhwc = bn_nhwc(x);
  a.rm = dptr(rm), a.rv = dptr(rv), a.rms = rm->strides[0], a.rvs = rv->strides[0];
  a.mean = dptr(mean), a.invstd = dptr(invstd), a.eps = eps;
  a.x = dptr(x), a.y = dptr(y), a.w = dptr(w), a.b = dptr(b);
  em_status st = launch(d, "batch_norm", BY_DTYPE(k_dnn_bn_eval_stats, bn_pdt(x->dtype)),
                        a.C, &a, sizeof a);
  a.total = x->numel;
  if (!st) st = launch(d, "batch_norm", BN_BY_DTYPE(k_dnn_bn_apply, x->dtype), a.total, &a,
                       sizeof a);
  return st;
}

em_status emk_batch_norm(emi_device *d, em_tensor *y, em_tensor *mean, em_tensor *invstd,
                         em_tensor *running_mean, em_tensor *running_var, const em_tensor *x,
                         const em_tensor *w, const em_tensor *b, int training,
                         double momentum, double eps) {
  const char *op = "batch_norm";
  if (!training) return bn_eval(d, y, mean, invstd, running_mean, running_var, x, w, b, eps);
  if (bn_via_nchw(x)) {
    em_tensor *xc = NULL, *yc = NULL;
    em_status st;
    if (!(st = nchw_copy(d, op, x, 1, &xc)) && !(st = nchw_copy(d, op, y, 0, &yc)) &&
        !(st = emk_batch_norm(d, yc, mean, invstd, running_mean, running_var, xc, w, b, 1,
                              momentum, eps)))
      st = emk_copy_same_dtype(d, y, yc);
    em_tensor_release(xc);
    em_tensor_release(yc);
    return st;
  }
  emk_runtime *rt = rt_of(d);
  if (!rt->ops->batch_norm_fwd)
    return emi_error(d->S, EM_ERR_UNSUPPORTED, "%s: cuda:%d: the %s runtime has no batch "
                     "norm", op, d->index, rt->ops->name);
  emk_bn_desc bd;
  memset(&bd, 0, sizeof bd);
  bd.dtype = x->dtype;
  bd.momentum = momentum;
  bd.eps = eps;
  bn_dims(x, &bd.N, &bd.C, &bd.L);
  bd.nhwc = bn_nhwc(x);
  em_tensor *ones = NULL, *zeros = NULL, *rm = NULL, *rv = NULL, *tm = NULL, *tv = NULL;
  em_tensor *scratch = NULL;
  em_status st = EM_OK;
  em_dtype pdt = bn_pdt(x->dtype);
  if ((!w && (st = vec(d, op, bd.C, pdt, 1, &ones))) ||
      (!b && (st = vec(d, op, bd.C, pdt, 0, &zeros))) ||
      (st = running(d, op, running_mean, &rm, &tm)) ||
      (st = running(d, op, running_var, &rv, &tv)))
    goto done;
  if ((rm == NULL) != (rv == NULL)) {   /* cuDNN moves both or neither */
    if ((st = vec(d, op, bd.C, pdt, rm ? 1 : 0, &scratch))) goto done;
    if (!rm) rm = scratch;
    else rv = scratch;
  }
  if ((st = rt->ops->batch_norm_fwd(rt, emk_dev(d)->compute, &bd, dptr(x),
                                    w ? dptr(w) : dptr(ones), b ? dptr(b) : dptr(zeros),
                                    dptr(y), dptr(mean), dptr(invstd), dptr(rm), dptr(rv)))) {
    st = emk_error(d, op, st);
    goto done;
  }
  if (tm) st = emk_copy_same_dtype(d, running_mean, tm);
  if (!st && tv) st = emk_copy_same_dtype(d, running_var, tv);
done:
  em_tensor_release(ones);
  em_tensor_release(zeros);
  em_tensor_release(tm);
  em_tensor_release(tv);
  em_tensor_release(scratch);
  return st;
}

em_status emk_batch_norm_backward(emi_device *d, em_tensor *gx, em_tensor *gw, em_tensor *gb,
                                  const em_tensor *gy, const em_tensor *x,
                                  const em_tensor *mean, const em_tensor *invstd,
                                  const em_tensor *w, int training) {
  const char *op = "batch_norm_backward";
  if (!training) {
    bn_args a;
    memset(&a, 0, sizeof a);
    bn_dims(x, &a.N, &a.C, &a.L);
    a.nhwc = bn_nhwc(x);
    a.x = dptr(x), a.gy = dptr(gy), a.w = dptr(w), a.mean = dptr(mean);
    a.invstd = dptr(invstd), a.gx = dptr(gx), a.gw = dptr(gw), a.gb = dptr(gb);
    return launch(d, op, BN_BY_DTYPE(k_dnn_bn_eval_bwd, x->dtype), a.C, &a, sizeof a);
  }
  if (bn_via_nchw(x)) {
    em_tensor *xc = NULL, *gyc = NULL, *gxc = NULL;
    em_status st;
    if (!(st = nchw_copy(d, op, x, 1, &xc)) && !(st = nchw_copy(d, op, gy, 1, &gyc)) &&
        !(st = nchw_copy(d, op, gx, 0, &gxc)) &&
        !(st = emk_batch_norm_backward(d, gxc, gw, gb, gyc, xc, mean, invstd, w, 1)))
      st = gx ? emk_copy_same_dtype(d, gx, gxc) : EM_OK;
    em_tensor_release(xc);
    em_tensor_release(gyc);
    em_tensor_release(gxc);
    return st;
  }
  emk_runtime *rt = rt_of(d);
  if (!rt->ops->batch_norm_bwd)
    return emi_error(d->S, EM_ERR_UNSUPPORTED, "%s: cuda:%d: the %s runtime has no batch "
                     "norm", op, d->index, rt->ops->name);
  emk_bn_desc bd;
  memset(&bd, 0, sizeof bd);
  bd.dtype = x->dtype;
  bn_dims(x, &bd.N, &bd.C, &bd.L);
  bd.nhwc = bn_nhwc(x);
  /* cuDNN computes all three gradients and wants a scale */
  em_tensor *ones = NULL, *tx = NULL, *tw = NULL, *tb = NULL;
  em_status st = EM_OK;
  em_dtype pdt = bn_pdt(x->dtype);
  if ((!w && (st = vec(d, op, bd.C, pdt, 1, &ones))) ||
      (!gx && (st = emi_tensor_new_fmt(d->S, op, x->sizes, x->ndim, x->dtype, d->index,
                                       bd.nhwc, &tx))) ||
      (!gw && (st = vec(d, op, bd.C, pdt, NAN, &tw))) ||
      (!gb && (st = vec(d, op, bd.C, pdt, NAN, &tb))))
    goto done;
  if ((st = rt->ops->batch_norm_bwd(rt, emk_dev(d)->compute, &bd, dptr(x), dptr(gy),
                                    w ? dptr(w) : dptr(ones), dptr(mean), dptr(invstd),
                                    gx ? dptr(gx) : dptr(tx), gw ? dptr(gw) : dptr(tw),
                                    gb ? dptr(gb) : dptr(tb))))
    st = emk_error(d, op, st);
done:
  em_tensor_release(ones);
  em_tensor_release(tx);
  em_tensor_release(tw);
  em_tensor_release(tb);
  return st;
}

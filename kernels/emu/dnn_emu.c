/*
** dnn_emu.c -- the emulated runtime's nn entries (runtime.h): the CPU stand-ins
** for cuDNN's convolutions and training batch norm. Each call checks its
** arguments and queues a work item (emi_emu_queue_work); on the stream's thread
** the item pins every device range it reads or writes (a range outside live
** device memory is the stream's sticky error, as an illegal address is on a GPU)
** and runs the CPU backend's kernel on the device memory wrapped as CPU tensors
** (channels last when a convolution's or batch norm's descriptor says NHWC, as
** cuDNN's).
**
** A private state per item. The CPU kernels take an emi_device and use its
** state for scratch memory, error messages and the worker pool. The caller's
** state is in use on the main thread meanwhile, and emi_parallel_for is not
** reentrant, so a stand-in running on a stream's thread must not touch it: each
** item opens a state of its own with one thread (no pool: the kernels run
** inline) and closes it after. Its error message becomes the item's.
**
** Made-up algorithms. So that the backend's algorithm cache and workspace
** handling (k_dnn.c) run here as on a GPU, conv_algos reports three algorithms,
** best first, needing a workspace of N image columns (algorithm 2), one image's
** columns (1), or none (0) -- emk_emu_conv_workspace. conv refuses a workspace
** smaller than the algorithm needs, and fills the one it gets (so a workspace
** that is not live device memory of that size is caught by the pin and the
** guards); the result never depends on the algorithm.
**
** Math modes, as cuDNN's heuristics give them: algorithm 2 is offered first as a
** tensor-core variant (EMK_MATH_TENSOR_OP), then in the default mode; 1 in the
** default mode; 0 as FMA. The list passes through dnn.h's emk_conv_math, as
** cuDNN's does in dnn_real.c, so float32 without TF32 gets three FMA algorithms
** and float32 with TF32 (or float64) four. conv refuses a mode that emk_conv_math
** would not let run for the descriptor: the mode the backend picked must reach
** the runtime, and here a wrong one fails as it would silently lose precision
** on a GPU. The computation is the CPU's whatever the mode.
*/
#include "emu.h"
#include "../dnn.h"
#include <stdio.h>
#include <string.h>

enum { EMU_ALGOS = 3 };

size_t emk_emu_conv_workspace(const emk_conv_desc *c, int algo) {
  size_t col = (size_t)(c->C / (c->G ? c->G : 1) * c->kH * c->kW * c->OH * c->OW) *
               em_dtype_size(c->dtype);
  return algo == 2 ? col * (size_t)c->N : algo == 1 ? col : 0;
}

static const char *dir_name(int dir) {
  return dir == EMK_CONV_FWD ? "forward" : dir == EMK_CONV_BWD_DATA ? "backward data"
                                                                    : "backward filter";
}

static em_status check_desc(emu *E, const emk_conv_desc *c) {
  /* half types as cuDNN takes them: the CPU kernel run below accumulates in float32 */
  if (c->dtype != EM_FLOAT32 && c->dtype != EM_FLOAT64 && c->dtype != EM_FLOAT16 &&
      c->dtype != EM_BFLOAT16)
    return emi_emu_fail(E, EM_ERR_DTYPE, "conv: dtype %s (float32, float64, float16 or "
                        "bfloat16 only)", em_dtype_name(c->dtype));
  if (c->dir < EMK_CONV_FWD || c->dir > EMK_CONV_BWD_FILTER)
    return emi_emu_fail(E, EM_ERR_ARG, "conv: direction %d", c->dir);
  if (c->N < 1 || c->C < 1 || c->O < 1 || c->G < 1 || c->C % c->G || c->O % c->G ||
      c->kH < 1 || c->kW < 1 || c->OH < 1 || c->OW < 1 || c->sH < 1 || c->sW < 1 ||
      c->dH < 1 || c->dW < 1 || c->pH < 0 || c->pW < 0)
    return emi_emu_fail(E, EM_ERR_SHAPE, "conv: bad geometry (N %lld, C %lld, O %lld, "
                        "groups %lld, kernel %lldx%lld, output %lldx%lld)", (long long)c->N,
                        (long long)c->C, (long long)c->O, (long long)c->G, (long long)c->kH,
                        (long long)c->kW, (long long)c->OH, (long long)c->OW);
  return EM_OK;
}

em_status emi_emu_conv_algos(emk_runtime *rt, int dev, const emk_conv_desc *c,
                             emk_conv_algo *out, int max, int *n) {
  emu *E = (emu *)rt->impl;
  *n = 0;
  if (dev < 0 || dev >= E->ndev)
    return emi_emu_fail(E, EM_ERR_DEVICE, "conv_algos: no device cuda:%d", dev);
  em_status st = emi_emu_context(E, dev, "conv_algos");   /* cuDNN's handle needs one */
  if (st) return st;
  st = check_desc(E, c);
  if (st) return st;
  static const struct { int algo, math; } offer[] = {
    {2, EMK_MATH_TENSOR_OP}, {2, EMK_MATH_DEFAULT}, {1, EMK_MATH_DEFAULT}, {0, EMK_MATH_FMA}};
  int seen[EMU_ALGOS] = {0};
  for (size_t i = 0; i < sizeof offer / sizeof offer[0] && *n < max; i++) {
    int use, a = offer[i].algo;
    if (!emk_conv_math(c->dtype, c->allow_tf32, offer[i].math, &use)) continue;
    if (use != offer[i].math && seen[a]) continue;   /* a mode folded into one listed */
    seen[a] = 1;
    out[*n].algo = a;
    out[*n].workspace = emk_emu_conv_workspace(c, a);
    out[*n].math = use;
    (*n)++;
  }
  return EM_OK;
}

static const char *math_name(int m) {
  return m == EMK_MATH_DEFAULT ? "default" : m == EMK_MATH_TENSOR_OP ? "tensor op"
       : m == EMK_MATH_TENSOR_OP_CONVERT ? "tensor op with conversion"
       : m == EMK_MATH_FMA ? "FMA" : "unknown";
}

/* -- Running the CPU kernels on device memory ----------------------------------------- */

static void no_free(void *ud, void *p, size_t n) { (void)ud, (void)p, (void)n; }

/* The ranges an item touches, pinned for its run. */
typedef struct pins {
  emu_block *b[8];
  int n;
} pins;

static int pin(emu *E, pins *P, const char *what, const void *p, size_t n, char *err,
               size_t errlen, const char *op) {
  if (!p || !n) return 1;
  char why[400];
  if (!emi_emu_pin(E, p, n, &P->b[P->n], why, sizeof why)) {
    snprintf(err, errlen, "%s: %s (%zu bytes) %s", op, what, n, why);
    return 0;
  }
  P->n++;
  return 1;
}

static void unpin_all(emu *E, pins *P) {
  for (int i = 0; i < P->n; i++) emi_emu_unpin(E, P->b[i]);
  P->n = 0;
}

/* A private single-threaded state for one item (see the top). */
static em_state *private_state(char *err, size_t errlen, const char *op) {
  em_config cfg;
  em_config_init(&cfg);
  cfg.num_threads = 1;
  cfg.cache_limit = -1;
  em_state *P = NULL;
  if (em_open(&P, &cfg) != EM_OK) {
    snprintf(err, errlen, "%s: out of host memory for the CPU stand-in", op);
    return NULL;
  }
  return P;
}

/* Device memory as a contiguous CPU tensor of P (NULL p: NULL). */
static em_tensor *wrap(em_state *P, const void *p, em_dtype dt, const int64_t *sizes,
                       int ndim, int *bad) {
  if (!p) return NULL;
  size_t nb = (size_t)emi_shape_numel(sizes, ndim) * em_dtype_size(dt);
  em_tensor *t = emi_tensor_try_external(P, (void *)p, nb, no_free, NULL, sizes, ndim, dt);
  if (!t) *bad = 1;
  return t;
}

/* The same, a 4-D (N, C, H, W) array stored channels last when nhwc. */
static em_tensor *wrap4(em_state *P, const void *p, em_dtype dt, const int64_t *sizes,
                        int nhwc, int *bad) {
  em_tensor *t = wrap(P, p, dt, sizes, 4, bad);
  if (t && nhwc) emi_nhwc_strides(sizes, t->strides);
  return t;
}

/* -- Convolutions ------------------------------------------------------------------------ */

typedef struct conv_item {
  emk_conv_desc c;
  int algo;
  void *ws, *x, *w, *y, *bias;
  size_t ws_need;
} conv_item;

static em_status run_conv(emu *E, void *args, char *err, size_t errlen) {
  const conv_item *it = (const conv_item *)args;
  const emk_conv_desc *c = &it->c;
  em_dtype dt = c->dtype;
  size_t es = em_dtype_size(dt);
  int64_t xs[4] = {c->N, c->C, c->H, c->W}, ws[4] = {c->O, c->C / c->G, c->kH, c->kW};
  int64_t ys[4] = {c->N, c->O, c->OH, c->OW}, bs[1] = {c->O};
  pins P;
  P.n = 0;
  const char *op = "conv";
  if (!pin(E, &P, "x", it->x, (size_t)emi_shape_numel(xs, 4) * es, err, errlen, op) ||
      !pin(E, &P, "w", it->w, (size_t)emi_shape_numel(ws, 4) * es, err, errlen, op) ||
      !pin(E, &P, "y", it->y, (size_t)emi_shape_numel(ys, 4) * es, err, errlen, op) ||
      !pin(E, &P, "bias", it->bias, (size_t)c->O * es, err, errlen, op) ||
      !pin(E, &P, "workspace", it->ws, it->ws_need, err, errlen, op)) {
    unpin_all(E, &P);
    return EM_ERR_ARG;
  }
  /* the algorithm's workspace, used as a GPU algorithm would: all of it */
  if (it->ws_need) memset(it->ws, 0xA5, it->ws_need);
  em_status st = EM_OK;
  em_state *S = private_state(err, errlen, op);
  emi_device *cpu = S ? emi_cpu_device(S) : NULL;
  if (!S) {
    unpin_all(E, &P);
    return EM_ERR_NOMEM;
  }
  int bad = 0;
  /* channels last as cuDNN's NHWC descriptors: the CPU's conv serves it natively */
  em_tensor *x = wrap4(S, it->x, dt, xs, c->nhwc, &bad);
  em_tensor *w = wrap4(S, it->w, dt, ws, c->nhwc, &bad);
  em_tensor *y = wrap4(S, it->y, dt, ys, c->nhwc, &bad);
  em_tensor *b = wrap(S, it->bias, dt, bs, 1, &bad);
  emi_conv_geom g = {c->N, c->C, c->H, c->W, c->O, c->kH, c->kW, c->OH, c->OW,
                     c->sH, c->sW, c->pH, c->pW, c->dH, c->dW, c->G, c->nhwc};
  if (bad) {
    snprintf(err, errlen, "%s: out of host memory", op);
    st = EM_ERR_NOMEM;
  } else if (c->dir == EMK_CONV_FWD) {
    st = cpu->backend->conv2d(cpu, &g, y, x, w, b);
  } else if (c->dir == EMK_CONV_BWD_DATA) {
    /* the CPU kernel takes x for its dtype even when it computes only gx: x is
    ** the output here, which it does not read for gx */
    st = cpu->backend->conv2d_backward(cpu, &g, x, NULL, NULL, y, x, w);
  } else {
    /* likewise w, which only gx needs: the gradient buffer stands in */
    st = cpu->backend->conv2d_backward(cpu, &g, NULL, w, b, y, x, w);
  }
  if (st && !bad) snprintf(err, errlen, "%s", em_errmsg(S));
  em_tensor_release(x);
  em_tensor_release(w);
  em_tensor_release(y);
  em_tensor_release(b);
  em_close(S);
  unpin_all(E, &P);
  return st;
}

em_status emi_emu_conv(emk_runtime *rt, emk_stream *s, const emk_conv_desc *c,
                       const emk_conv_algo *pick, void *ws, size_t ws_size, void *x, void *w,
                       void *y, void *bias) {
  emu *E = (emu *)rt->impl;
  em_status st = check_desc(E, c);
  if (st) return st;
  if (!pick) return emi_emu_fail(E, EM_ERR_ARG, "conv (%s): no algorithm (NULL)",
                                 dir_name(c->dir));
  int algo = pick->algo, use;
  if (!emk_conv_math(c->dtype, c->allow_tf32, pick->math, &use) || use != pick->math)
    return emi_emu_fail(E, EM_ERR_ARG, "conv (%s): algorithm %d in math mode %d (%s) may not "
                        "run for %s with TF32 %s", dir_name(c->dir), algo, pick->math,
                        math_name(pick->math), em_dtype_name(c->dtype),
                        c->allow_tf32 ? "allowed" : "off");
  if (algo < 0 || algo >= EMU_ALGOS)
    return emi_emu_fail(E, EM_ERR_ARG, "conv (%s): no algorithm %d (the emulator has 0 .. %d)",
                        dir_name(c->dir), algo, EMU_ALGOS - 1);
  size_t need = emk_emu_conv_workspace(c, algo);
  if (ws_size < need || (need && !ws))
    return emi_emu_fail(E, EM_ERR_ARG, "conv (%s): algorithm %d needs a %zu-byte workspace, "
                        "got %zu bytes", dir_name(c->dir), algo, need, ws ? ws_size : 0);
  if (!x || !w || !y)
    return emi_emu_fail(E, EM_ERR_ARG, "conv (%s): NULL operand", dir_name(c->dir));
  if (bias && c->dir == EMK_CONV_BWD_DATA)
    return emi_emu_fail(E, EM_ERR_ARG, "conv (backward data): takes no bias");
  conv_item it;
  memset(&it, 0, sizeof it);
  it.c = *c;
  it.algo = algo;
  it.ws = ws, it.x = x, it.w = w, it.y = y, it.bias = bias;
  it.ws_need = need;
  return emi_emu_queue_work(E, s, "conv", run_conv, &it, sizeof it);
}

/* -- Batch norm (training) ------------------------------------------------------------------ */

/* x, y, gy, gx as the CPU backend's (N, C, L) tensor: contiguous, or with the
** strides (L*C, 1, C) of N*L rows of C when the desc says channels last -- the
** order they are stored in, which the CPU's batch norm takes as it is. */
static em_tensor *wrap_bn(em_state *P, const void *p, const emk_bn_desc *b, int *bad) {
  int64_t xs[3] = {b->N, b->C, b->L};
  em_tensor *t = wrap(P, p, b->dtype, xs, 3, bad);
  if (t && b->nhwc) {
    t->strides[0] = b->L * b->C;
    t->strides[1] = 1;
    t->strides[2] = b->C;
  }
  return t;
}

typedef struct bn_item {
  emk_bn_desc b;
  int fwd;
  const void *x, *gy, *w, *bias, *mean_in, *invstd_in;
  void *y, *mean, *invstd, *rm, *rv, *gx, *gw, *gb;
} bn_item;

static em_status run_bn(emu *E, void *args, char *err, size_t errlen) {
  const bn_item *it = (const bn_item *)args;
  const emk_bn_desc *bd = &it->b;
  /* a float16/bfloat16 x has float32 parameters and statistics, as cuDNN's derived
  ** descriptor has them */
  em_dtype dt = bd->dtype;
  em_dtype pt = dt == EM_FLOAT16 || dt == EM_BFLOAT16 ? EM_FLOAT32 : dt;
  int64_t cs[1] = {bd->C};
  size_t xb = (size_t)(bd->N * bd->C * bd->L) * em_dtype_size(dt);
  size_t cb = (size_t)bd->C * em_dtype_size(pt);
  const char *op = it->fwd ? "batch_norm_fwd" : "batch_norm_bwd";
  pins P;
  P.n = 0;
  int ok = it->fwd
      ? pin(E, &P, "x", it->x, xb, err, errlen, op) && pin(E, &P, "y", it->y, xb, err, errlen, op) &&
        pin(E, &P, "w", it->w, cb, err, errlen, op) &&
        pin(E, &P, "bias", it->bias, cb, err, errlen, op) &&
        pin(E, &P, "mean", it->mean, cb, err, errlen, op) &&
        pin(E, &P, "invstd", it->invstd, cb, err, errlen, op) &&
        pin(E, &P, "running_mean", it->rm, cb, err, errlen, op) &&
        pin(E, &P, "running_var", it->rv, cb, err, errlen, op)
      : pin(E, &P, "x", it->x, xb, err, errlen, op) && pin(E, &P, "gy", it->gy, xb, err, errlen, op) &&
        pin(E, &P, "gx", it->gx, xb, err, errlen, op) &&
        pin(E, &P, "w", it->w, cb, err, errlen, op) &&
        pin(E, &P, "mean", it->mean_in, cb, err, errlen, op) &&
        pin(E, &P, "invstd", it->invstd_in, cb, err, errlen, op) &&
        pin(E, &P, "gw", it->gw, cb, err, errlen, op) && pin(E, &P, "gb", it->gb, cb, err, errlen, op);
  if (!ok) {
    unpin_all(E, &P);
    return EM_ERR_ARG;
  }
  em_state *S = private_state(err, errlen, op);
  emi_device *cpu = S ? emi_cpu_device(S) : NULL;
  if (!S) {
    unpin_all(E, &P);
    return EM_ERR_NOMEM;
  }
  int bad = 0;
  em_tensor *t[10];
  int nt = 0;
  em_status st;
#define W_(p, sz, nd) (t[nt++] = wrap(S, (p), pt, (sz), (nd), &bad))
#define X_(p) (t[nt++] = wrap_bn(S, (p), bd, &bad))
  if (it->fwd) {
    em_tensor *x = X_(it->x), *y = X_(it->y), *w = W_(it->w, cs, 1);
    em_tensor *b = W_(it->bias, cs, 1), *m = W_(it->mean, cs, 1), *is = W_(it->invstd, cs, 1);
    em_tensor *rm = W_(it->rm, cs, 1), *rv = W_(it->rv, cs, 1);
    st = bad ? EM_ERR_NOMEM
             : cpu->backend->batch_norm(cpu, y, m, is, rm, rv, x, w, b, 1, bd->momentum,
                                        bd->eps);
  } else {
    em_tensor *x = X_(it->x), *gy = X_(it->gy), *gx = X_(it->gx);
    em_tensor *w = W_(it->w, cs, 1), *m = W_(it->mean_in, cs, 1);
    em_tensor *is = W_(it->invstd_in, cs, 1), *gw = W_(it->gw, cs, 1), *gb = W_(it->gb, cs, 1);
    st = bad ? EM_ERR_NOMEM
             : cpu->backend->batch_norm_backward(cpu, gx, gw, gb, gy, x, m, is, w, 1);
  }
#undef W_
#undef X_
  if (st) snprintf(err, errlen, "%s: %s", op, bad ? "out of host memory" : em_errmsg(S));
  for (int i = 0; i < nt; i++) em_tensor_release(t[i]);
  em_close(S);
  unpin_all(E, &P);
  return st;
}

static em_status check_bn(emu *E, const char *op, const emk_bn_desc *b) {
  if (b->dtype != EM_FLOAT32 && b->dtype != EM_FLOAT64 && b->dtype != EM_FLOAT16 &&
      b->dtype != EM_BFLOAT16)
    return emi_emu_fail(E, EM_ERR_DTYPE, "%s: dtype %s (a floating dtype expected)", op,
                        em_dtype_name(b->dtype));
  if (b->N < 1 || b->C < 1 || b->L < 1 || b->N * b->L < 2)
    return emi_emu_fail(E, EM_ERR_SHAPE, "%s: (N %lld, C %lld, L %lld): training wants N*L "
                        ">= 2", op, (long long)b->N, (long long)b->C, (long long)b->L);
  return EM_OK;
}

em_status emi_emu_batch_norm_fwd(emk_runtime *rt, emk_stream *s, const emk_bn_desc *b,
                                 const void *x, const void *w, const void *bias, void *y,
                                 void *mean, void *invstd, void *running_mean,
                                 void *running_var) {
  emu *E = (emu *)rt->impl;
  em_status st = check_bn(E, "batch_norm_fwd", b);
  if (st) return st;
  if (!x || !w || !bias || !y || !mean || !invstd)
    return emi_emu_fail(E, EM_ERR_ARG, "batch_norm_fwd: NULL operand");
  if ((running_mean == NULL) != (running_var == NULL))
    return emi_emu_fail(E, EM_ERR_ARG, "batch_norm_fwd: running_mean and running_var are "
                        "both given or both NULL");
  bn_item it;
  memset(&it, 0, sizeof it);
  it.b = *b;
  it.fwd = 1;
  it.x = x, it.w = w, it.bias = bias, it.y = y, it.mean = mean, it.invstd = invstd;
  it.rm = running_mean, it.rv = running_var;
  return emi_emu_queue_work(E, s, "batch_norm_fwd", run_bn, &it, sizeof it);
}

em_status emi_emu_batch_norm_bwd(emk_runtime *rt, emk_stream *s, const emk_bn_desc *b,
                                 const void *x, const void *gy, const void *w,
                                 const void *mean, const void *invstd, void *gx, void *gw,
                                 void *gb) {
  emu *E = (emu *)rt->impl;
  em_status st = check_bn(E, "batch_norm_bwd", b);
  if (st) return st;
  if (!x || !gy || !w || !mean || !invstd || !gx || !gw || !gb)
    return emi_emu_fail(E, EM_ERR_ARG, "batch_norm_bwd: NULL operand");
  bn_item it;
  memset(&it, 0, sizeof it);
  it.b = *b;
  it.x = x, it.gy = gy, it.w = w, it.mean_in = mean, it.invstd_in = invstd;
  it.gx = gx, it.gw = gw, it.gb = gb;
  return emi_emu_queue_work(E, s, "batch_norm_bwd", run_bn, &it, sizeof it);
}

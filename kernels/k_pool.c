/*
** k_pool.c -- the CUDA backend's pooling entries (core/backend.h): max, average
** and adaptive average pooling and their backwards, for every floating dtype,
** NCHW or channels last (the backend table's EMI_NHWC_POOL: an NHWC model pools
** without reordering). The kernels are k_pool.cu. cuDNN's pooling is not used:
** it returns no argmax indices (max_pool2d's contract), has no adaptive pooling,
** and its output size rule differs from ceil_mode.
**
** The max-pool backward's indices. Indices max_pool2d made are in range by
** construction, and the autograd passes only those (g->ind_trusted), so that
** path queues the kernel and nothing more. Indices a caller supplies are checked
** on the host first (a copy, hence a sync), so that a bad one is an error naming
** it before gx is written, as on the CPU; the kernel skips an out-of-range index
** either way.
*/
#include "cuda.h"
#include "dnn.h"
#include "k_pool_args.h"
#include "k_elementwise.h"

static em_status launch(emi_device *d, const char *op, const emk_kernel *k, int64_t items,
                        const pool_args *a) {
  if (items <= 0) return EM_OK;
  emk_runtime *rt = emk_dev(d)->cuda->rt;
  int64_t blocks = (items + POOL_THREADS - 1) / POOL_THREADS;
  if (blocks > POOL_MAX_BLOCKS) blocks = POOL_MAX_BLOCKS;
  emk_dim3 grid = {(unsigned)blocks, 1, 1}, block = {POOL_THREADS, 1, 1};
  em_status st = rt->ops->launch(rt, k, grid, block, 0, emk_dev(d)->compute, a, sizeof *a);
  return st ? emk_error(d, op, st) : EM_OK;
}

#define BY_DTYPE(name, dt) \
  ((dt) == EM_FLOAT64 ? &name##_f64 : (dt) == EM_FLOAT16 ? &name##_f16 \
   : (dt) == EM_BFLOAT16 ? &name##_bf16 : &name##_f32)

/* t's strides (n, c, h, w) for the kernels: its own when the geometry is NHWC
** (a backward's gy may be NCHW then: read in place), else dense NCHW planes. */
static void strides_of(const emi_pool_geom *g, const em_tensor *t, int64_t *s) {
  if (g->nhwc && t->ndim == 4) {
    memcpy(s, t->strides, 4 * sizeof *s);
    return;
  }
  int64_t h = t->sizes[t->ndim - 2], w = t->sizes[t->ndim - 1];
  s[0] = h * w, s[1] = 0, s[2] = w, s[3] = 1;
}

/* xt: x or gx; yt: y or gy; it: the indices or NULL. */
static void pool_init(pool_args *a, const emi_pool_geom *g, const em_tensor *xt,
                      const em_tensor *yt, const em_tensor *it) {
  memset(a, 0, sizeof *a);
  a->H = g->H, a->W = g->W, a->OH = g->OH, a->OW = g->OW, a->kH = g->kH, a->kW = g->kW;
  a->sH = g->sH, a->sW = g->sW, a->pH = g->pH, a->pW = g->pW, a->dH = g->dH, a->dW = g->dW;
  a->nhwc = g->nhwc && g->C > 0;
  a->C = a->nhwc ? g->C : 1;
  a->N = g->planes / a->C;
  strides_of(g, xt, a->xs);
  strides_of(g, yt, a->ys);
  if (it) strides_of(g, it, a->is);
}

static void *dptr(const em_tensor *t) { return t ? em_tensor_data(t) : NULL; }

em_status emk_max_pool2d(emi_device *d, const emi_pool_geom *g, em_tensor *y, em_tensor *ind,
                         const em_tensor *x, int index_base) {
  pool_args a;
  pool_init(&a, g, x, y, ind);
  a.x = dptr(x), a.y = dptr(y), a.ind = (int64_t *)dptr(ind), a.base = index_base;
  a.total = g->planes * g->OH * g->OW;
  return launch(d, "max_pool2d", BY_DTYPE(k_pool_max, x->dtype), a.total, &a);
}

/* Caller-supplied indices, checked on the host (see the top). */
static em_status check_indices(emi_device *d, const char *op, const emi_pool_geom *g,
                               const em_tensor *ind, int index_base) {
  if (!ind->numel) return EM_OK;
  em_tensor *h = NULL;
  em_status st = emi_tensor_new(d->S, op, ind->sizes, ind->ndim, EM_INT64, EM_CPU, &h);
  if (!st) st = emk_cuda_backend.copy(d, h, ind);
  const int64_t *pi = st ? NULL : (const int64_t *)em_tensor_data(h);
  int64_t HW = g->H * g->W;
  for (int64_t i = 0; pi && i < h->numel; i++)
    if (pi[i] - index_base < 0 || pi[i] - index_base >= HW) {
      st = emi_error(d->S, EM_ERR_INDEX, "%s: index %lld out of range for a %lldx%lld plane "
                     "(index_base %d)", op, (long long)pi[i], (long long)g->H,
                     (long long)g->W, index_base);
      break;
    }
  em_tensor_release(h);
  return st;
}

em_status emk_max_pool2d_backward(emi_device *d, const emi_pool_geom *g, em_tensor *gx,
                                  const em_tensor *gy, const em_tensor *ind, int index_base) {
  const char *op = "max_pool2d_backward";
  em_status st = g->ind_trusted ? EM_OK : check_indices(d, op, g, ind, index_base);
  if (st) return st;
  /* the half types add into a float32 gradient, rounded once (k_pool.cu) */
  int lowp = gx->dtype == EM_FLOAT16 || gx->dtype == EM_BFLOAT16;
  em_tensor *acc = NULL;
  if (lowp && (st = emi_tensor_new_fmt(d->S, op, gx->sizes, gx->ndim, EM_FLOAT32, d->index,
                                       g->nhwc && gx->ndim == 4, &acc)))
    return st;
  em_tensor *out = lowp ? acc : gx;
  pool_args a;
  pool_init(&a, g, out, gy, ind);
  a.x = dptr(gy), a.y = dptr(out), a.cind = (const int64_t *)dptr(ind), a.base = index_base;
  a.total = g->planes;
  st = launch(d, op, BY_DTYPE(k_pool_max_bwd, gx->dtype), a.total, &a);
  if (!st && lowp) st = emk_cast(d, gx, acc);
  em_tensor_release(acc);
  return st;
}

em_status emk_avg_pool2d(emi_device *d, const emi_pool_geom *g, em_tensor *y,
                         const em_tensor *x, int count_include_pad) {
  pool_args a;
  pool_init(&a, g, x, y, NULL);
  a.x = dptr(x), a.y = dptr(y), a.include_pad = count_include_pad;
  a.total = g->planes * g->OH * g->OW;
  return launch(d, "avg_pool2d", BY_DTYPE(k_pool_avg, x->dtype), a.total, &a);
}

em_status emk_avg_pool2d_backward(emi_device *d, const emi_pool_geom *g, em_tensor *gx,
                                  const em_tensor *gy, int count_include_pad) {
  pool_args a;
  pool_init(&a, g, gx, gy, NULL);
  a.x = dptr(gy), a.y = dptr(gx), a.include_pad = count_include_pad;
  a.total = g->planes * g->H * g->W;
  return launch(d, "avg_pool2d_backward", BY_DTYPE(k_pool_avg_bwd, gx->dtype), a.total, &a);
}

em_status emk_adaptive_avg_pool2d(emi_device *d, const emi_pool_geom *g, em_tensor *y,
                                  const em_tensor *x) {
  pool_args a;
  pool_init(&a, g, x, y, NULL);
  a.x = dptr(x), a.y = dptr(y);
  a.total = g->planes * g->OH * g->OW;
  return launch(d, "adaptive_avg_pool2d", BY_DTYPE(k_pool_ada, x->dtype), a.total, &a);
}

em_status emk_adaptive_avg_pool2d_backward(emi_device *d, const emi_pool_geom *g,
                                           em_tensor *gx, const em_tensor *gy) {
  pool_args a;
  pool_init(&a, g, gx, gy, NULL);
  a.x = dptr(gy), a.y = dptr(gx);
  a.total = g->planes * g->H * g->W;
  return launch(d, "adaptive_avg_pool2d_backward", BY_DTYPE(k_pool_ada_bwd, gx->dtype),
                a.total, &a);
}

/*
** pool_nhwc.c -- CPU 2-d pooling (max, average, adaptive average), forward and
** backward, on channels-last tensors: x (N, H, W, C), y and ind (N, OH, OW, C).
** The channel is the innermost loop, so each window position reads C contiguous
** values and the loops vectorize over channels. Forward work is split by output
** rows (n, oh); backward by samples, since a sample's gradient is written by
** that sample's outputs only. The choices match pool_impl.h's (the first maximum
** wins, a NaN is taken; the same windows, divisors and summation order), so
** NHWC and NCHW agree exactly. Indices are plane positions h*W + w, as NCHW's.
** The loops are written once, in pool_nhwc_impl.h, included for float and double.
*/
#include "cpu.h"
#include <math.h>

typedef struct pnhwc_job {
  const emi_pool_geom *g;
  int64_t N;
  const void *x, *gy;
  void *y, *gx;
  int64_t *ind;
  const int64_t *cind;
  int64_t gs[4];      /* gy's strides (n, c, oh, ow): NHWC, or NCHW as a flatten's
                       ** backward gives it, read in place rather than reordered */
  int base, include_pad;
} pnhwc_job;

static void gy_strides(pnhwc_job *j, const em_tensor *gy) {
  for (int d = 0; d < 4; d++) j->gs[d] = gy->ndim == 4 ? gy->strides[d] : 0;
  if (gy->ndim == 3) {   /* (C, OH, OW): one sample */
    j->gs[1] = gy->strides[0];
    j->gs[2] = gy->strides[1];
    j->gs[3] = gy->strides[2];
  }
}

static int64_t ada_start(int64_t o, int64_t in, int64_t out) { return (o * in) / out; }
static int64_t ada_end(int64_t o, int64_t in, int64_t out) {
  return ((o + 1) * in + out - 1) / out;
}

/* The window of output (oh, ow) clipped to the input, and the divisor's count
** (pool_impl.h's avg_window). */
static int64_t avg_window(const emi_pool_geom *g, int64_t oh, int64_t ow, int include_pad,
                          int64_t *h0, int64_t *h1, int64_t *w0, int64_t *w1) {
  int64_t hs = oh * g->sH - g->pH, ws = ow * g->sW - g->pW;
  int64_t he = hs + g->kH, we = ws + g->kW;
  if (he > g->H + g->pH) he = g->H + g->pH;
  if (we > g->W + g->pW) we = g->W + g->pW;
  int64_t padded = (he - hs) * (we - ws);
  *h0 = hs < 0 ? 0 : hs;
  *w0 = ws < 0 ? 0 : ws;
  *h1 = he > g->H ? g->H : he;
  *w1 = we > g->W ? g->W : we;
  return include_pad ? padded : (*h1 - *h0) * (*w1 - *w0);
}

#define T float
#define FN(name) name##_f32
#include "pool_nhwc_impl.h"
#define T double
#define FN(name) name##_f64
#include "pool_nhwc_impl.h"

static int64_t row_grain(const emi_pool_geom *g) {
  int64_t per = g->OW * g->kH * g->kW * g->C;
  int64_t grain = 32768 / (per ? per : 1);
  return grain < 1 ? 1 : grain;
}

#define ROWS(fn, S, dt, g, j) \
  emi_parallel_for(S, (j)->N * (g)->OH, row_grain(g), (dt) == EM_FLOAT32 ? fn##_f32 : fn##_f64, j)
#define SAMPLES(fn, S, dt, g, j) \
  emi_parallel_for(S, (j)->N, 1, (dt) == EM_FLOAT32 ? fn##_f32 : fn##_f64, j)

static int64_t samples(const emi_pool_geom *g) { return g->C ? g->planes / g->C : 0; }

void emi_cpu_pool_nhwc_max(em_state *S, const emi_pool_geom *g, em_tensor *y, em_tensor *ind,
                           const em_tensor *x, int index_base) {
  pnhwc_job j = {.g = g, .N = samples(g), .x = em_tensor_data(x), .y = em_tensor_data(y),
                 .ind = em_tensor_data(ind), .base = index_base};
  ROWS(pn_max_fwd, S, x->dtype, g, &j);
}

void emi_cpu_pool_nhwc_max_bwd(em_state *S, const emi_pool_geom *g, em_tensor *gx,
                               const em_tensor *gy, const int64_t *ind, int index_base) {
  pnhwc_job j = {.g = g, .N = samples(g), .gy = em_tensor_data(gy), .gx = em_tensor_data(gx),
                 .cind = ind, .base = index_base};
  gy_strides(&j, gy);
  SAMPLES(pn_max_bwd, S, gx->dtype, g, &j);
}

void emi_cpu_pool_nhwc_avg(em_state *S, const emi_pool_geom *g, em_tensor *y,
                           const em_tensor *x, int include_pad) {
  pnhwc_job j = {.g = g, .N = samples(g), .x = em_tensor_data(x), .y = em_tensor_data(y),
                 .include_pad = include_pad};
  ROWS(pn_avg_fwd, S, x->dtype, g, &j);
}

void emi_cpu_pool_nhwc_avg_bwd(em_state *S, const emi_pool_geom *g, em_tensor *gx,
                               const em_tensor *gy, int include_pad) {
  pnhwc_job j = {.g = g, .N = samples(g), .gy = em_tensor_data(gy), .gx = em_tensor_data(gx),
                 .include_pad = include_pad};
  gy_strides(&j, gy);
  SAMPLES(pn_avg_bwd, S, gx->dtype, g, &j);
}

void emi_cpu_pool_nhwc_adaptive(em_state *S, const emi_pool_geom *g, em_tensor *y,
                                const em_tensor *x) {
  pnhwc_job j = {.g = g, .N = samples(g), .x = em_tensor_data(x), .y = em_tensor_data(y)};
  ROWS(pn_ada_fwd, S, x->dtype, g, &j);
}

void emi_cpu_pool_nhwc_adaptive_bwd(em_state *S, const emi_pool_geom *g, em_tensor *gx,
                                    const em_tensor *gy) {
  pnhwc_job j = {.g = g, .N = samples(g), .gy = em_tensor_data(gy), .gx = em_tensor_data(gx)};
  gy_strides(&j, gy);
  SAMPLES(pn_ada_bwd, S, gx->dtype, g, &j);
}

/*
** optim.c -- fused optimizer updates on the CPU: one pass over a parameter does
** the whole SGD or Adam(W) step (weight decay, moment buffers, bias-corrected
** update), where the unfused form would make four to six passes and temporaries.
** The arithmetic follows PyTorch 1.13's single-tensor rules operation by operation
** (each intermediate rounded to the parameter's dtype), so results agree to the
** last few ulps. Loops test only flags fixed for the call, over restrict pointers,
** so they vectorize; large parameters are split across the state's workers.
**
** The entries take a list of parameters (one call, as the CUDA backend runs them
** in one launch; a single parameter is a list of one) and make one fused pass
** over each. The CUDA kernels (kernels/k_optim.cu) repeat these expressions in
** the same order, and neither side lets the compiler fuse a*b + c into an FMA
** (fp-contract off below), so a step gives the same bits on both. norm_multi
** (clip_grad_norm) folds in the fixed chunk / lane / tree order core/backend.h
** prescribes, which the GPU keeps too.
*/
#pragma GCC optimize("fp-contract=off")
#include <math.h>
#include "cpu.h"

/* Below this many elements a step runs on the calling thread. */
enum { OPTIM_GRAIN = 32768 };

/* -- SGD ----------------------------------------------------------------------------
** d = g + wd*p; m = first ? d : momentum*buf + (1-dampening)*d; buf = m;
** p -= lr * (nesterov ? d + momentum*m : m). Without a buffer (momentum 0), m = d.
** Both flags are fixed for a call, so the compiler hoists their tests out of the
** loop and vectorizes each variant. */
typedef struct sgd_ctx {
  void *p, *buf;               /* buf NULL: no momentum */
  const void *g;
  double lr, momentum, dampening, wd;
  int nesterov, first;
} sgd_ctx;

/* Elements [0, n) of p, g, buf in T's arithmetic: each intermediate rounds to T. */
#define SGD_LOOP(T)                                                                  \
  for (int64_t i = 0; i < n; i++) {                                                  \
    T d = g[i] + wd * p[i], m = (!buf || first) ? d : mom * buf[i] + damp1 * d;      \
    if (buf) buf[i] = m;                                                             \
    p[i] = p[i] - lr * (nesterov ? d + mom * m : m);                                 \
  }

static void sgd_f32(void *c_, int64_t b, int64_t e) {
  const sgd_ctx *c = c_;
  const int64_t n = e - b;
  const int first = c->first, nesterov = c->nesterov;
  float *restrict p = (float *)c->p + b, *restrict buf = c->buf ? (float *)c->buf + b : NULL;
  const float *restrict g = (const float *)c->g + b;
  const float lr = (float)c->lr, wd = (float)c->wd, mom = (float)c->momentum;
  const float damp1 = (float)(1.0 - c->dampening);
  SGD_LOOP(float)
}

static void sgd_f64(void *c_, int64_t b, int64_t e) {
  const sgd_ctx *c = c_;
  const int64_t n = e - b;
  const int first = c->first, nesterov = c->nesterov;
  double *restrict p = (double *)c->p + b, *restrict buf = c->buf ? (double *)c->buf + b : NULL;
  const double *restrict g = (const double *)c->g + b;
  const double lr = c->lr, wd = c->wd, mom = c->momentum, damp1 = 1.0 - c->dampening;
  SGD_LOOP(double)
}

/* -- Adam / AdamW ----------------------------------------------------------------------
** p *= decay; g' = g + wd*p; m = b1*m + (1-b1)*g'; v = b2*v + (1-b2)*g'*g';
** p -= step_size * m / (sqrt(v)/bc2_sqrt + eps). */
typedef struct adam_ctx {
  void *p, *m, *v;
  const void *g;
  double beta1, beta2, eps, wd, decay, step_size, bc2_sqrt;
} adam_ctx;

/* Elements [0, n) of p, g, m, v in T's arithmetic, as SGD_LOOP. */
#define ADAM_LOOP(T, SQRT)                                                           \
  for (int64_t i = 0; i < n; i++) {                                                  \
    T x = p[i] * decay, gi = g[i] + wd * x;                                          \
    T mi = b1 * m[i] + one_b1 * gi, vi = b2 * v[i] + one_b2 * (gi * gi);             \
    m[i] = mi;                                                                       \
    v[i] = vi;                                                                       \
    p[i] = x - step * (mi / (SQRT(vi) / bc2 + eps));                                 \
  }

static void adam_f32(void *c_, int64_t b, int64_t e) {
  const adam_ctx *c = c_;
  const int64_t n = e - b;
  float *restrict p = (float *)c->p + b, *restrict m = (float *)c->m + b;
  float *restrict v = (float *)c->v + b;
  const float *restrict g = (const float *)c->g + b;
  const float b1 = (float)c->beta1, b2 = (float)c->beta2, one_b1 = (float)(1.0 - c->beta1);
  const float one_b2 = (float)(1.0 - c->beta2), eps = (float)c->eps, wd = (float)c->wd;
  const float decay = (float)c->decay, step = (float)c->step_size, bc2 = (float)c->bc2_sqrt;
  ADAM_LOOP(float, sqrtf)
}

static void adam_f64(void *c_, int64_t b, int64_t e) {
  const adam_ctx *c = c_;
  const int64_t n = e - b;
  double *restrict p = (double *)c->p + b, *restrict m = (double *)c->m + b;
  double *restrict v = (double *)c->v + b;
  const double *restrict g = (const double *)c->g + b;
  const double b1 = c->beta1, b2 = c->beta2, one_b1 = 1.0 - c->beta1;
  const double one_b2 = 1.0 - c->beta2, eps = c->eps, wd = c->wd;
  const double decay = c->decay, step = c->step_size, bc2 = c->bc2_sqrt;
  ADAM_LOOP(double, sqrt)
}

/* -- The entries: a fused pass per parameter, split over the workers when large ---- */

em_status emi_cpu_sgd_step_multi(emi_device *dev, int n, em_tensor *const *p,
                                 const em_tensor *const *g, em_tensor *const *buf,
                                 const int *first, double lr, double momentum,
                                 double dampening, double wd, int nesterov) {
  for (int i = 0; i < n; i++) {
    sgd_ctx c = { em_tensor_data(p[i]), buf ? em_tensor_data(buf[i]) : NULL,
                  em_tensor_data(g[i]), lr, momentum, dampening, wd, nesterov != 0,
                  first[i] != 0 };
    emi_parallel_for(dev->S, p[i]->numel, OPTIM_GRAIN,
                     p[i]->dtype == EM_FLOAT64 ? sgd_f64 : sgd_f32, &c);
  }
  return EM_OK;
}

em_status emi_cpu_adam_step_multi(emi_device *dev, int n, em_tensor *const *p,
                                  const em_tensor *const *g, em_tensor *const *m,
                                  em_tensor *const *v, const double *step_size,
                                  const double *bc2_sqrt, double beta1, double beta2,
                                  double eps, double wd, double decay) {
  for (int i = 0; i < n; i++) {
    adam_ctx c = { em_tensor_data(p[i]), em_tensor_data(m[i]), em_tensor_data(v[i]),
                   em_tensor_data(g[i]), beta1, beta2, eps, wd, decay, step_size[i],
                   bc2_sqrt[i] };
    emi_parallel_for(dev->S, p[i]->numel, OPTIM_GRAIN,
                     p[i]->dtype == EM_FLOAT64 ? adam_f64 : adam_f32, &c);
  }
  return EM_OK;
}

/* -- norm_multi ----------------------------------------------------------------------
** The order backend.h prescribes (and kernels/k_optim.cu's k_mt_norm keeps): chunks
** of NCHUNK elements within one tensor; in a chunk, lane l of NLANES folds elements
** l, l + NLANES, ... (here: a row of NLANES at a time, so the loop vectorizes), then
** the lanes combine by halving; the chunks' results fold in order from 0. Chunks run
** on the workers, each into its own slot, so the order never depends on them. */
enum { NCHUNK = 4096, NLANES = 256 };
enum { NK_SUMSQ, NK_SUMABS, NK_SUMPOW, NK_MAXABS };

typedef struct norm_ctx {
  const em_tensor *const *t;
  const int64_t *chunk0;       /* first chunk of each tensor, n + 1 entries */
  int n, kind;
  double p;
  double *partial;
} norm_ctx;

static inline double nm_comb(int kind, double acc, double y) {
  if (kind == NK_MAXABS) return (y > acc || y != y) ? y : acc;
  return acc + y;
}

/* Folds w <= NLANES values x[0..w) into lanes 0..w). */
static void norm_row(const norm_ctx *c, double *lane, const double *restrict x, int64_t w) {
  switch (c->kind) {
  case NK_SUMSQ: for (int64_t l = 0; l < w; l++) lane[l] += x[l] * x[l]; break;
  case NK_SUMABS: for (int64_t l = 0; l < w; l++) lane[l] += fabs(x[l]); break;
  case NK_SUMPOW: for (int64_t l = 0; l < w; l++) lane[l] += pow(fabs(x[l]), c->p); break;
  default: for (int64_t l = 0; l < w; l++) lane[l] = nm_comb(c->kind, lane[l], fabs(x[l]));
  }
}

/* Chunks [b, e): each folded row by row into the lanes (float32 rows widened to
** double first, exactly), then the lanes' halving tree into partial[k]. */
static void norm_chunks(void *c_, int64_t b, int64_t e) {
  const norm_ctx *c = c_;
  double lane[NLANES], wide[NLANES];
  int ti = 0;
  for (int64_t k = b; k < e; k++) {
    while (c->chunk0[ti + 1] <= k) ti++;
    const em_tensor *t = c->t[ti];
    int64_t off = (k - c->chunk0[ti]) * NCHUNK;
    int64_t len = t->numel - off < NCHUNK ? t->numel - off : NCHUNK;
    for (int l = 0; l < NLANES; l++) lane[l] = 0;
    for (int64_t r = 0; r < len; r += NLANES) {
      int64_t w = len - r < NLANES ? len - r : NLANES;
      if (t->dtype == EM_FLOAT64) {
        norm_row(c, lane, (const double *)em_tensor_data(t) + off + r, w);
      } else {
        const float *x = (const float *)em_tensor_data(t) + off + r;
        for (int64_t l = 0; l < w; l++) wide[l] = x[l];
        norm_row(c, lane, wide, w);
      }
    }
    for (int s = NLANES / 2; s > 0; s >>= 1)
      for (int l = 0; l < s; l++) lane[l] = nm_comb(c->kind, lane[l], lane[l + s]);
    c->partial[k] = lane[0];
  }
}

em_status emi_cpu_norm_multi(emi_device *dev, em_tensor *out, int n,
                             const em_tensor *const *t, double p) {
  em_state *S = dev->S;
  size_t cbytes = sizeof(int64_t) * (size_t)(n + 1);
  int64_t *chunk0 = emi_malloc(S, cbytes);
  if (!chunk0) return emi_error(S, EM_ERR_NOMEM, "clip_grad_norm: out of memory");
  chunk0[0] = 0;
  for (int i = 0; i < n; i++) chunk0[i + 1] = chunk0[i] + (t[i]->numel + NCHUNK - 1) / NCHUNK;
  int64_t nc = chunk0[n];
  double *partial = emi_malloc(S, sizeof(double) * (size_t)nc);
  if (!partial) {
    emi_free(S, chunk0, cbytes);
    return emi_error(S, EM_ERR_NOMEM, "clip_grad_norm: out of memory");
  }
  norm_ctx c = { t, chunk0, n,
                 isinf(p) ? NK_MAXABS : p == 2 ? NK_SUMSQ : p == 1 ? NK_SUMABS : NK_SUMPOW,
                 p, partial };
  emi_parallel_for(S, nc, 8, norm_chunks, &c);
  double tot = 0;
  for (int64_t k = 0; k < nc; k++) tot = nm_comb(c.kind, tot, partial[k]);
  *(double *)em_tensor_data(out) = tot;
  emi_free(S, partial, sizeof(double) * (size_t)nc);
  emi_free(S, chunk0, cbytes);
  return EM_OK;
}

/* t[i] *= (T)scale */
typedef struct scale_ctx { void *x; double s; int f64; } scale_ctx;

static void scale_range(void *c_, int64_t b, int64_t e) {
  const scale_ctx *c = c_;
  if (c->f64) {
    double *restrict x = (double *)c->x, s = c->s;
    for (int64_t i = b; i < e; i++) x[i] = x[i] * s;
  } else {
    float *restrict x = (float *)c->x, s = (float)c->s;
    for (int64_t i = b; i < e; i++) x[i] = x[i] * s;
  }
}

em_status emi_cpu_scale_multi(emi_device *dev, int n, em_tensor *const *t, double scale) {
  for (int i = 0; i < n; i++) {
    scale_ctx c = { em_tensor_data(t[i]), scale, t[i]->dtype == EM_FLOAT64 };
    emi_parallel_for(dev->S, t[i]->numel, OPTIM_GRAIN, scale_range, &c);
  }
  return EM_OK;
}

/*
** optim.c -- fused optimizer updates on the CPU: one pass over a parameter does
** the whole SGD or Adam(W) step (weight decay, moment buffers, bias-corrected
** update), where the unfused form would make four to six passes and temporaries.
** The arithmetic follows PyTorch 1.13's single-tensor rules operation by operation
** (each intermediate rounded to the parameter's dtype), so results agree to the
** last few ulps. Loops are branch-free inside, over restrict pointers, so they
** vectorize; large parameters are split across the state's workers.
**
** The multi-tensor entries (one call for a list of parameters, as the CUDA
** backend runs them in one launch) loop over the per-tensor kernels here. The CUDA
** kernels (kernels/k_optim.cu) repeat these expressions in the same order, and
** neither side lets the compiler fuse a*b + c into an FMA (fp-contract off below),
** so a step gives the same bits on both. norm_multi (clip_grad_norm) folds in the
** fixed chunk / lane / tree order internal.h prescribes, which the GPU keeps too.
*/
#pragma GCC optimize("fp-contract=off")
#include <math.h>
#include "cpu.h"

/* Below this many elements a step runs on the calling thread. */
enum { OPTIM_GRAIN = 32768 };

/* -- SGD ----------------------------------------------------------------------------
** d = g + wd*p; buf = first ? d : momentum*buf + (1-dampening)*d;
** d = nesterov ? d + momentum*buf : buf; p -= lr*d. */
typedef struct sgd_ctx {
  void *p, *buf;
  const void *g;
  double lr, momentum, dampening, wd;
  int nesterov, first, has_buf;
} sgd_ctx;

#define SGD_KERNEL(NAME, T)                                                           \
  static void NAME(void *c_, int64_t b, int64_t e) {                                  \
    const sgd_ctx *c = c_;                                                            \
    T *restrict p = (T *)c->p + b;                                                    \
    const T *restrict g = (const T *)c->g + b;                                        \
    T *restrict buf = c->has_buf ? (T *)c->buf + b : NULL;                            \
    const T lr = (T)c->lr, wd = (T)c->wd, mom = (T)c->momentum;                       \
    const T damp1 = (T)(1.0 - c->dampening);                                          \
    int64_t n = e - b;                                                                \
    if (!buf) {                                                                       \
      for (int64_t i = 0; i < n; i++) {                                               \
        T d = g[i] + wd * p[i];                                                       \
        p[i] = p[i] - lr * d;                                                         \
      }                                                                               \
    } else if (c->first) {                                                            \
      for (int64_t i = 0; i < n; i++) {                                               \
        T d = g[i] + wd * p[i];                                                       \
        buf[i] = d;                                                                   \
        T u = c->nesterov ? d + mom * d : d;                                          \
        p[i] = p[i] - lr * u;                                                         \
      }                                                                               \
    } else if (c->nesterov) {                                                         \
      for (int64_t i = 0; i < n; i++) {                                               \
        T d = g[i] + wd * p[i];                                                       \
        T m = mom * buf[i] + damp1 * d;                                               \
        buf[i] = m;                                                                   \
        p[i] = p[i] - lr * (d + mom * m);                                             \
      }                                                                               \
    } else {                                                                          \
      for (int64_t i = 0; i < n; i++) {                                               \
        T d = g[i] + wd * p[i];                                                       \
        T m = mom * buf[i] + damp1 * d;                                               \
        buf[i] = m;                                                                   \
        p[i] = p[i] - lr * m;                                                         \
      }                                                                               \
    }                                                                                 \
  }
SGD_KERNEL(sgd_f32, float)
SGD_KERNEL(sgd_f64, double)

em_status emi_cpu_sgd_step(emi_device *dev, em_tensor *p, const em_tensor *g, em_tensor *buf,
                           double lr, double momentum, double dampening, double wd,
                           int nesterov, int first_step) {
  em_state *S = dev->S;
  sgd_ctx c = { em_tensor_data(p), buf ? em_tensor_data(buf) : NULL, em_tensor_data(g),
                lr, momentum, dampening, wd, nesterov != 0, first_step != 0, buf != NULL };
  emi_parallel_for(S, p->numel, OPTIM_GRAIN, p->dtype == EM_FLOAT64 ? sgd_f64 : sgd_f32, &c);
  return EM_OK;
}

/* -- Adam / AdamW ----------------------------------------------------------------------
** p *= decay; g' = g + wd*p; m = b1*m + (1-b1)*g'; v = b2*v + (1-b2)*g'*g';
** p -= step_size * m / (sqrt(v)/bc2_sqrt + eps). */
typedef struct adam_ctx {
  void *p, *m, *v;
  const void *g;
  double beta1, beta2, eps, wd, decay, step_size, bc2_sqrt;
} adam_ctx;

#define ADAM_KERNEL(NAME, T, SQRT)                                                    \
  static void NAME(void *c_, int64_t b, int64_t e) {                                  \
    const adam_ctx *c = c_;                                                           \
    T *restrict p = (T *)c->p + b;                                                    \
    T *restrict m = (T *)c->m + b;                                                    \
    T *restrict v = (T *)c->v + b;                                                    \
    const T *restrict g = (const T *)c->g + b;                                        \
    const T b1 = (T)c->beta1, b2 = (T)c->beta2, one_b1 = (T)(1.0 - c->beta1);         \
    const T one_b2 = (T)(1.0 - c->beta2), eps = (T)c->eps, wd = (T)c->wd;             \
    const T decay = (T)c->decay, step = (T)c->step_size, bc2 = (T)c->bc2_sqrt;        \
    int64_t n = e - b;                                                                \
    for (int64_t i = 0; i < n; i++) {                                                 \
      T x = p[i] * decay;                                                             \
      T gi = g[i] + wd * x;                                                           \
      T mi = b1 * m[i] + one_b1 * gi;                                                 \
      T vi = b2 * v[i] + one_b2 * (gi * gi);                                          \
      m[i] = mi;                                                                      \
      v[i] = vi;                                                                      \
      p[i] = x - step * (mi / (SQRT(vi) / bc2 + eps));                                \
    }                                                                                 \
  }
ADAM_KERNEL(adam_f32, float, sqrtf)
ADAM_KERNEL(adam_f64, double, sqrt)

em_status emi_cpu_adam_step(emi_device *dev, em_tensor *p, const em_tensor *g, em_tensor *m,
                            em_tensor *v, double beta1, double beta2, double eps, double wd,
                            double decay, double step_size, double bc2_sqrt) {
  em_state *S = dev->S;
  adam_ctx c = { em_tensor_data(p), em_tensor_data(m), em_tensor_data(v),
                 em_tensor_data(g), beta1, beta2, eps, wd, decay, step_size, bc2_sqrt };
  emi_parallel_for(S, p->numel, OPTIM_GRAIN, p->dtype == EM_FLOAT64 ? adam_f64 : adam_f32,
                   &c);
  return EM_OK;
}

/* -- Multi-tensor entries ---------------------------------------------------------- */

em_status emi_cpu_sgd_step_multi(emi_device *dev, int n, em_tensor *const *p,
                                 const em_tensor *const *g, em_tensor *const *buf,
                                 const int *first, double lr, double momentum,
                                 double dampening, double wd, int nesterov) {
  for (int i = 0; i < n; i++)
    emi_cpu_sgd_step(dev, p[i], g[i], buf ? buf[i] : NULL, lr, momentum, dampening, wd,
                     nesterov, first[i]);
  return EM_OK;
}

em_status emi_cpu_adam_step_multi(emi_device *dev, int n, em_tensor *const *p,
                                  const em_tensor *const *g, em_tensor *const *m,
                                  em_tensor *const *v, const double *step_size,
                                  const double *bc2_sqrt, double beta1, double beta2,
                                  double eps, double wd, double decay) {
  for (int i = 0; i < n; i++)
    emi_cpu_adam_step(dev, p[i], g[i], m[i], v[i], beta1, beta2, eps, wd, decay,
                      step_size[i], bc2_sqrt[i]);
  return EM_OK;
}

/* -- norm_multi ----------------------------------------------------------------------
** The order internal.h prescribes (and kernels/k_optim.cu's k_mt_norm keeps): chunks
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

#define NORM_ROW(T)                                                                   \
  do {                                                                                \
    const T *x = (const T *)xv;                                                       \
    for (int64_t r = 0; r < len; r += NLANES) {                                       \
      int64_t w = len - r < NLANES ? len - r : NLANES;                                \
      const T *xr = x + r;                                                            \
      if (kind == NK_SUMSQ)                                                           \
        for (int64_t l = 0; l < w; l++) lane[l] += (double)xr[l] * (double)xr[l];     \
      else if (kind == NK_SUMABS)                                                     \
        for (int64_t l = 0; l < w; l++) lane[l] += fabs((double)xr[l]);               \
      else if (kind == NK_SUMPOW)                                                     \
        for (int64_t l = 0; l < w; l++) lane[l] += pow(fabs((double)xr[l]), c->p);    \
      else                                                                            \
        for (int64_t l = 0; l < w; l++) lane[l] = nm_comb(kind, lane[l], fabs((double)xr[l])); \
    }                                                                                 \
  } while (0)

static void norm_chunks(void *c_, int64_t b, int64_t e) {
  const norm_ctx *c = c_;
  double lane[NLANES];
  int ti = 0;
  for (int64_t k = b; k < e; k++) {
    while (c->chunk0[ti + 1] <= k) ti++;
    const em_tensor *t = c->t[ti];
    int64_t off = (k - c->chunk0[ti]) * NCHUNK;
    int64_t len = t->numel - off < NCHUNK ? t->numel - off : NCHUNK;
    int kind = c->kind;
    for (int l = 0; l < NLANES; l++) lane[l] = 0;
    if (t->dtype == EM_FLOAT64) {
      const double *xv = (const double *)em_tensor_data(t) + off;
      NORM_ROW(double);
    } else {
      const float *xv = (const float *)em_tensor_data(t) + off;
      NORM_ROW(float);
    }
    for (int s = NLANES / 2; s > 0; s >>= 1)
      for (int l = 0; l < s; l++) lane[l] = nm_comb(kind, lane[l], lane[l + s]);
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

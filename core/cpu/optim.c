/*
** optim.c -- fused optimizer updates on the CPU: one pass over a parameter does
** the whole SGD or Adam(W) step (weight decay, moment buffers, bias-corrected
** update), where the unfused form would make four to six passes and temporaries.
** The arithmetic follows PyTorch 1.13's single-tensor rules operation by operation
** (each intermediate rounded to the parameter's dtype), so results agree to the
** last few ulps. Loops are branch-free inside, over restrict pointers, so they
** vectorize; large parameters are split across the state's workers.
*/
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

/*
** bn_half.c -- batch norm on a float16 or bfloat16 x with float32 weight, bias,
** running statistics and saved mean / invstd (autocast's batch norm, as cuDNN and
** PyTorch's CPU kernel take it). normalize.c calls these for a half x, in NCHW
** (x dense as (N, C, L)) or channels-last (M = N*L rows of C) order.
**
** Nothing widens the whole tensor: each loop reads a run of at most
** EMI_HALF_CHUNK (NCHW) or BUF (NHWC) elements into a float buffer on the stack
** through loops.h's adapters, computes there in float32 exactly as the float32
** loops of normalize_impl.h and bn_nhwc_impl.h do (per-run sums in float, the
** channel totals and the variance in double), and rounds each result element
** once into x's dtype. So the output equals the float32 computation on the
** widened input up to that final rounding, and an autocast network skips the
** cast up and the cast down around every batch norm.
*/
#include "cpu.h"
#include "loops.h"
#include "bn_rows.h"

enum { RUN = EMI_HALF_CHUNK, BUF = 2048 };

typedef struct bnl_job {
  em_dtype dt;
  int64_t N, C, L;                 /* NCHW view; channels last: N*L rows of C */
  const char *x, *gy;
  const float *w, *b, *cmean, *cinv; /* params and the saved statistics (float32) */
  const double *mean, *invstd;     /* the statistics apply uses (double) */
  double *s1, *s2;                 /* per channel results of the reductions */
  char *y, *gx;
  float *gw, *gb;
  int training;
  int64_t nt;                      /* channels last: row tasks of the reductions */
  double *part;                    /* their partial sums, 2*C per task */
  int kind;                        /* which reduction nhwc_red runs */
  int relu;                        /* apply: then ReLU (before the rounding: the same) */
} bnl_job;

static void ld(float *dst, const char *src, int64_t n, em_dtype dt) {
  emi_half_to_float_n(dst, src, n, 2, dt);
}
static void st(char *dst, const float *src, int64_t n, em_dtype dt) {
  emi_float_to_half_n(dst, src, n, 2, dt);
}
static int64_t grain(int64_t per) {
  int64_t g = 32768 / (per ? per : 1);
  return g < 1 ? 1 : g;
}

/* -- NCHW: channel c's rows are x[(n*C + c)*L ...], L long ---------------------------- */

static const char *row(const char *base, const bnl_job *j, int64_t n, int64_t c) {
  return base + ((n * j->C + c) * j->L) * 2;
}

/* s1 = mean, s2 = biased variance per channel (two passes, as bn_stats). */
static void nchw_stats(void *ctx, int64_t c0, int64_t c1) {
  const bnl_job *j = ctx;
  float buf[RUN];
  for (int64_t c = c0; c < c1; c++) {
    double s = 0, q = 0;
    for (int64_t n = 0; n < j->N; n++) {
      const char *r = row(j->x, j, n, c);
      float a = 0;
      for (int64_t l0 = 0; l0 < j->L; l0 += RUN) {
        int64_t k = j->L - l0 < RUN ? j->L - l0 : RUN;
        ld(buf, r + l0 * 2, k, j->dt);
        for (int64_t i = 0; i < k; i++) a += buf[i];
      }
      s += a;
    }
    double m = s / (double)(j->N * j->L);
    for (int64_t n = 0; n < j->N; n++) {
      const char *r = row(j->x, j, n, c);
      for (int64_t l0 = 0; l0 < j->L; l0 += RUN) {
        int64_t k = j->L - l0 < RUN ? j->L - l0 : RUN;
        ld(buf, r + l0 * 2, k, j->dt);
        for (int64_t i = 0; i < k; i++) {
          double d = (double)buf[i] - m;
          q += d * d;
        }
      }
    }
    j->s1[c] = m;
    j->s2[c] = q / (double)(j->N * j->L);
  }
}

static void nchw_apply(void *ctx, int64_t p0, int64_t p1) {
  const bnl_job *j = ctx;
  float buf[RUN];
  for (int64_t p = p0; p < p1; p++) {
    int64_t c = p % j->C;
    float sc = (float)j->invstd[c] * (j->w ? j->w[c] : 1);
    float sh = (j->b ? j->b[c] : 0) - (float)j->mean[c] * sc;
    const char *r = j->x + p * j->L * 2;
    char *o = j->y + p * j->L * 2;
    for (int64_t l0 = 0; l0 < j->L; l0 += RUN) {
      int64_t k = j->L - l0 < RUN ? j->L - l0 : RUN;
      ld(buf, r + l0 * 2, k, j->dt);
      for (int64_t i = 0; i < k; i++) buf[i] = buf[i] * sc + sh;
      if (j->relu)
        for (int64_t i = 0; i < k; i++) buf[i] = buf[i] < 0 ? 0.0f : buf[i];
      st(o + l0 * 2, buf, k, j->dt);
    }
  }
}

/* Per channel: sums of gy and gy*(x - mean), then gw, gb and gx (as bn_bwd). */
static void nchw_bwd(void *ctx, int64_t c0, int64_t c1) {
  const bnl_job *j = ctx;
  float xb[RUN], gb[RUN];
  double cnt = (double)(j->N * j->L);
  for (int64_t c = c0; c < c1; c++) {
    float m = j->cmean[c];
    double is = (double)j->cinv[c], sg = 0, sgx = 0;
    for (int64_t n = 0; n < j->N; n++) {
      const char *r = row(j->x, j, n, c), *g = row(j->gy, j, n, c);
      float a = 0, b = 0;
      for (int64_t l0 = 0; l0 < j->L; l0 += RUN) {
        int64_t k = j->L - l0 < RUN ? j->L - l0 : RUN;
        ld(xb, r + l0 * 2, k, j->dt);
        ld(gb, g + l0 * 2, k, j->dt);
        for (int64_t i = 0; i < k; i++) {
          a += gb[i];
          b += gb[i] * (xb[i] - m);
        }
      }
      sg += a;
      sgx += b;
    }
    if (j->gw) j->gw[c] = (float)(sgx * is);
    if (j->gb) j->gb[c] = (float)sg;
    if (!j->gx) continue;
    double wc = j->w ? (double)j->w[c] : 1;
    float k_ = (float)(wc * is), mg = (float)(sg / cnt), pr = (float)(sgx * is * is / cnt);
    for (int64_t n = 0; n < j->N; n++) {
      const char *r = row(j->x, j, n, c), *g = row(j->gy, j, n, c);
      char *o = (char *)row(j->gx, j, n, c);
      for (int64_t l0 = 0; l0 < j->L; l0 += RUN) {
        int64_t k = j->L - l0 < RUN ? j->L - l0 : RUN;
        ld(gb, g + l0 * 2, k, j->dt);
        if (j->training) {
          ld(xb, r + l0 * 2, k, j->dt);
          for (int64_t i = 0; i < k; i++) gb[i] = k_ * (gb[i] - mg - (xb[i] - m) * pr);
        } else {
          for (int64_t i = 0; i < k; i++) gb[i] = k_ * gb[i];
        }
        st(o + l0 * 2, gb, k, j->dt);
      }
    }
  }
}

/* -- Channels last: M = N*L rows of C -------------------------------------------------
** The reductions split the rows among tasks (bn_rows.h) so that a small C still
** keeps every thread busy; all passes convert a run of whole rows (k*C
** contiguous values) per call while C fits in BUF, else one BUF-channel slice of a
** row. Sums are float over a run of at most BUF values per channel (<= BUF/C
** rows), double across runs and tasks. */

enum { RED_SUM, RED_SQ, RED_BWD };   /* x; (x - mean)^2; gy and gy*(x - mean) */

/* Channels [c0, c0+n) of the slice starting at c0, and the rows per converted run. */
static int64_t slice(int64_t C, int64_t c0, int64_t *rows) {
  int64_t n = C - c0 < BUF ? C - c0 : BUF;
  *rows = n == C ? BUF / C : 1;
  return n;
}

/* Task t writes its rows' sums to part[t*2C ...] (first reduction) and
** part[t*2C + C ...] (second, RED_BWD only). */
static void nhwc_red(void *ctx, int64_t t0, int64_t t1) {
  const bnl_job *j = ctx;
  int64_t M = j->N * j->L, C = j->C;
  float xb[BUF], gb[BUF], f1[BUF], f2[BUF], m[BUF];
  for (int64_t t = t0; t < t1; t++) {
    int64_t r0, r1;
    emi_bn_task_rows(M, j->nt, t, &r0, &r1);
    double *p1 = j->part + t * 2 * C, *p2 = p1 + C;
    for (int64_t c0 = 0; c0 < C; c0 += BUF) {
      int64_t R, n = slice(C, c0, &R);
      for (int64_t c = 0; c < n; c++) {
        p1[c0 + c] = p2[c0 + c] = 0;
        m[c] = j->kind == RED_SQ ? (float)j->mean[c0 + c]
             : j->kind == RED_BWD ? j->cmean[c0 + c] : 0;
      }
      for (int64_t r = r0; r < r1; r += R) {
        int64_t k = r1 - r < R ? r1 - r : R;
        size_t off = (size_t)(r * C + c0) * 2;
        ld(xb, j->x + off, k * n, j->dt);
        for (int64_t c = 0; c < n; c++) f1[c] = f2[c] = 0;
        if (j->kind == RED_SUM) {
          for (int64_t i = 0; i < k; i++) {
            const float *v = xb + i * n;
            for (int64_t c = 0; c < n; c++) f1[c] += v[c];
          }
        } else if (j->kind == RED_SQ) {
          for (int64_t i = 0; i < k; i++) {
            const float *v = xb + i * n;
            for (int64_t c = 0; c < n; c++) {
              float d = v[c] - m[c];
              f1[c] += d * d;
            }
          }
        } else {
          ld(gb, j->gy + off, k * n, j->dt);
          for (int64_t i = 0; i < k; i++) {
            const float *v = xb + i * n, *g = gb + i * n;
            for (int64_t c = 0; c < n; c++) {
              f1[c] += g[c];
              f2[c] += g[c] * (v[c] - m[c]);
            }
          }
        }
        for (int64_t c = 0; c < n; c++) {
          p1[c0 + c] += (double)f1[c];
          p2[c0 + c] += (double)f2[c];
        }
      }
    }
  }
}

/* Runs reduction kind over the row tasks and adds the task sums in order:
** s1 (and s2 for RED_BWD) get the per-channel totals. */
static void nhwc_reduce(em_state *S, bnl_job *j, int kind, double *s1, double *s2) {
  int64_t C = j->C;
  j->kind = kind;
  emi_parallel_for(S, j->nt, 1, nhwc_red, j);
  emi_bn_combine(s1, j->part, j->nt, 2 * C, C);
  if (s2) emi_bn_combine(s2, j->part + C, j->nt, 2 * C, C);
}

static void nhwc_apply(void *ctx, int64_t r0, int64_t r1) {
  const bnl_job *j = ctx;
  int64_t C = j->C;
  float sc[BUF], sh[BUF], buf[BUF];
  for (int64_t c0 = 0; c0 < C; c0 += BUF) {
    int64_t R, n = slice(C, c0, &R);
    for (int64_t c = 0; c < n; c++) {
      sc[c] = (float)j->invstd[c0 + c] * (j->w ? j->w[c0 + c] : 1);
      sh[c] = (j->b ? j->b[c0 + c] : 0) - (float)j->mean[c0 + c] * sc[c];
    }
    for (int64_t r = r0; r < r1; r += R) {
      int64_t k = r1 - r < R ? r1 - r : R;
      size_t off = (size_t)(r * C + c0) * 2;
      ld(buf, j->x + off, k * n, j->dt);
      for (int64_t i = 0; i < k; i++) {
        float *v = buf + i * n;
        for (int64_t c = 0; c < n; c++) v[c] = v[c] * sc[c] + sh[c];
      }
      if (j->relu)
        for (int64_t i = 0; i < k * n; i++) buf[i] = buf[i] < 0 ? 0.0f : buf[i];
      st(j->y + off, buf, k * n, j->dt);
    }
  }
}

static void nhwc_gx(void *ctx, int64_t r0, int64_t r1) {
  const bnl_job *j = ctx;
  int64_t C = j->C;
  double cnt = (double)(j->N * j->L);
  float k_[BUF], mg[BUF], pr[BUF], m[BUF], xb[BUF], gb[BUF];
  for (int64_t c0 = 0; c0 < C; c0 += BUF) {
    int64_t R, n = slice(C, c0, &R);
    for (int64_t c = 0; c < n; c++) {
      double isc = (double)j->cinv[c0 + c], wc = j->w ? (double)j->w[c0 + c] : 1;
      k_[c] = (float)(wc * isc);
      mg[c] = (float)(j->s1[c0 + c] / cnt);
      pr[c] = (float)(j->s2[c0 + c] * isc * isc / cnt);
      m[c] = j->cmean[c0 + c];
    }
    for (int64_t r = r0; r < r1; r += R) {
      int64_t k = r1 - r < R ? r1 - r : R;
      size_t off = (size_t)(r * C + c0) * 2;
      ld(gb, j->gy + off, k * n, j->dt);
      if (j->training) {
        ld(xb, j->x + off, k * n, j->dt);
        for (int64_t i = 0; i < k; i++) {
          float *g = gb + i * n;
          const float *v = xb + i * n;
          for (int64_t c = 0; c < n; c++) g[c] = k_[c] * (g[c] - mg[c] - (v[c] - m[c]) * pr[c]);
        }
      } else {
        for (int64_t i = 0; i < k; i++) {
          float *g = gb + i * n;
          for (int64_t c = 0; c < n; c++) g[c] = k_[c] * g[c];
        }
      }
      st(j->gx + off, gb, k * n, j->dt);
    }
  }
}

/* -- Entries (cpu.h) ------------------------------------------------------------------- */

/* The row tasks' partial sums (2*C doubles each) and extra doubles after them. */
static double *part_alloc(em_state *S, bnl_job *j, int64_t extra, size_t *bytes,
                          const char *op) {
  j->nt = emi_bn_tasks(j->N * j->L, j->C);
  *bytes = (size_t)(j->nt * 2 * j->C + extra) * sizeof(double) + 8;
  j->part = emi_malloc(S, *bytes);
  if (!j->part)
    emi_error(S, EM_ERR_NOMEM, "%s: out of memory for %zu bytes", op, *bytes);
  return j->part;
}

em_status emi_cpu_bn_half_stats(em_state *S, em_dtype dt, int64_t N, int64_t C, int64_t L,
                                bool nhwc, const void *x, double *mean, double *var) {
  bnl_job j = {.dt = dt, .N = N, .C = C, .L = L, .x = x, .s1 = mean, .s2 = var};
  if (!nhwc) {
    emi_parallel_for(S, C, grain(N * L * 2), nchw_stats, &j);
    return EM_OK;
  }
  size_t bytes;
  if (!part_alloc(S, &j, 0, &bytes, "batch_norm")) return EM_ERR_NOMEM;
  double M = (double)(N * L);
  nhwc_reduce(S, &j, RED_SUM, mean, NULL);
  for (int64_t c = 0; c < C; c++) mean[c] /= M;
  j.mean = mean;
  nhwc_reduce(S, &j, RED_SQ, var, NULL);
  for (int64_t c = 0; c < C; c++) var[c] /= M;
  emi_free(S, j.part, bytes);
  return EM_OK;
}

void emi_cpu_bn_half_apply(em_state *S, em_dtype dt, int64_t N, int64_t C, int64_t L,
                           bool nhwc, const void *x, const double *mean, const double *invstd,
                           const float *w, const float *b, void *y, int relu) {
  bnl_job j = {.dt = dt, .N = N, .C = C, .L = L, .x = x, .mean = mean, .invstd = invstd,
               .w = w, .b = b, .y = y, .relu = relu};
  if (nhwc) emi_parallel_for(S, N * L, grain(C), nhwc_apply, &j);
  else emi_parallel_for(S, N * C, grain(L), nchw_apply, &j);
}

em_status emi_cpu_bn_half_backward(em_state *S, em_dtype dt, int64_t N, int64_t C, int64_t L,
                                   bool nhwc, const void *gy, const void *x, const float *mean,
                                   const float *invstd, const float *w, int training, void *gx,
                                   float *gw, float *gb) {
  bnl_job j = {.dt = dt, .N = N, .C = C, .L = L, .gy = gy, .x = x, .cmean = mean,
               .cinv = invstd, .w = w, .training = training, .gx = gx, .gw = gw, .gb = gb};
  if (!nhwc) {
    emi_parallel_for(S, C, grain(N * L * 3), nchw_bwd, &j);
    return EM_OK;
  }
  size_t bytes;
  if (!part_alloc(S, &j, 2 * C, &bytes, "batch_norm_backward")) return EM_ERR_NOMEM;
  j.s1 = j.part + j.nt * 2 * C, j.s2 = j.s1 + C;
  nhwc_reduce(S, &j, RED_BWD, j.s1, j.s2);
  for (int64_t c = 0; c < C; c++) {
    if (gw) gw[c] = (float)(j.s2[c] * (double)invstd[c]);
    if (gb) gb[c] = (float)j.s1[c];
  }
  if (gx) emi_parallel_for(S, N * L, grain(C), nhwc_gx, &j);
  emi_free(S, j.part, bytes);
  return EM_OK;
}

/*
** bn_half.c -- batch norm on a float16 or bfloat16 x with float32 weight, bias,
** running statistics and saved mean / invstd (autocast's batch norm, as cuDNN and
** PyTorch's CPU kernel take it). normalize.c calls these for a half x, in NCHW
** (x dense as (N, C, L)) or channels-last (M = N*L rows of C) order.
**
** Nothing widens the whole tensor: each loop reads a run of at most
** EMI_HALF_CHUNK (NCHW) or CBLK (NHWC) elements into a float buffer on the stack
** through loops.h's adapters, computes there in float32 exactly as the float32
** loops of normalize_impl.h and bn_nhwc_impl.h do (per-run sums in float, the
** channel totals and the variance in double), and rounds each result element
** once into x's dtype. So the output equals the float32 computation on the
** widened input up to that final rounding, and an autocast network skips the
** cast up and the cast down around every batch norm.
*/
#include "cpu.h"
#include "loops.h"

enum { RUN = EMI_HALF_CHUNK, CBLK = 64 };

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
static int64_t nblocks(int64_t C) { return (C + CBLK - 1) / CBLK; }

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

/* -- Channels last: M = N*L rows of C; reductions by blocks of CBLK channels ---------- */

static int64_t blk(const bnl_job *j, int64_t b, int64_t *c0) {
  *c0 = b * CBLK;
  return *c0 + CBLK < j->C ? CBLK : j->C - *c0;
}

static void nhwc_stats(void *ctx, int64_t b0, int64_t b1) {
  const bnl_job *j = ctx;
  int64_t M = j->N * j->L;
  float buf[CBLK];
  for (int64_t b = b0; b < b1; b++) {
    int64_t c0, n = blk(j, b, &c0);
    double acc[CBLK] = {0}, m[CBLK];
    for (int64_t r = 0; r < M; r++) {
      ld(buf, j->x + (r * j->C + c0) * 2, n, j->dt);
      for (int64_t c = 0; c < n; c++) acc[c] += (double)buf[c];
    }
    for (int64_t c = 0; c < n; c++) { m[c] = acc[c] / (double)M; acc[c] = 0; }
    for (int64_t r = 0; r < M; r++) {
      ld(buf, j->x + (r * j->C + c0) * 2, n, j->dt);
      for (int64_t c = 0; c < n; c++) {
        double d = (double)buf[c] - m[c];
        acc[c] += d * d;
      }
    }
    for (int64_t c = 0; c < n; c++) {
      j->s1[c0 + c] = m[c];
      j->s2[c0 + c] = acc[c] / (double)M;
    }
  }
}

static void nhwc_apply(void *ctx, int64_t r0, int64_t r1) {
  const bnl_job *j = ctx;
  float sc[CBLK], sh[CBLK], buf[CBLK];
  for (int64_t b = 0; b < nblocks(j->C); b++) {   /* blocks outside: sc, sh on the stack */
    int64_t c0, n = blk(j, b, &c0);
    for (int64_t c = 0; c < n; c++) {
      sc[c] = (float)j->invstd[c0 + c] * (j->w ? j->w[c0 + c] : 1);
      sh[c] = (j->b ? j->b[c0 + c] : 0) - (float)j->mean[c0 + c] * sc[c];
    }
    for (int64_t r = r0; r < r1; r++) {
      ld(buf, j->x + (r * j->C + c0) * 2, n, j->dt);
      for (int64_t c = 0; c < n; c++) buf[c] = buf[c] * sc[c] + sh[c];
      st(j->y + (r * j->C + c0) * 2, buf, n, j->dt);
    }
  }
}

/* s1 = sum of gy, s2 = sum of gy * (x - mean), per channel. */
static void nhwc_sums(void *ctx, int64_t b0, int64_t b1) {
  const bnl_job *j = ctx;
  int64_t M = j->N * j->L;
  float xb[CBLK], gb[CBLK];
  for (int64_t b = b0; b < b1; b++) {
    int64_t c0, n = blk(j, b, &c0);
    double a[CBLK] = {0}, q[CBLK] = {0};
    for (int64_t r = 0; r < M; r++) {
      ld(xb, j->x + (r * j->C + c0) * 2, n, j->dt);
      ld(gb, j->gy + (r * j->C + c0) * 2, n, j->dt);
      for (int64_t c = 0; c < n; c++) {
        a[c] += (double)gb[c];
        q[c] += (double)gb[c] * (double)(xb[c] - j->cmean[c0 + c]);
      }
    }
    for (int64_t c = 0; c < n; c++) { j->s1[c0 + c] = a[c]; j->s2[c0 + c] = q[c]; }
  }
}

static void nhwc_gx(void *ctx, int64_t r0, int64_t r1) {
  const bnl_job *j = ctx;
  double cnt = (double)(j->N * j->L);
  float k[CBLK], mg[CBLK], pr[CBLK], m[CBLK], xb[CBLK], gb[CBLK];
  for (int64_t b = 0; b < nblocks(j->C); b++) {
    int64_t c0, n = blk(j, b, &c0);
    for (int64_t c = 0; c < n; c++) {
      double isc = (double)j->cinv[c0 + c], wc = j->w ? (double)j->w[c0 + c] : 1;
      k[c] = (float)(wc * isc);
      mg[c] = (float)(j->s1[c0 + c] / cnt);
      pr[c] = (float)(j->s2[c0 + c] * isc * isc / cnt);
      m[c] = j->cmean[c0 + c];
    }
    for (int64_t r = r0; r < r1; r++) {
      ld(gb, j->gy + (r * j->C + c0) * 2, n, j->dt);
      if (j->training) {
        ld(xb, j->x + (r * j->C + c0) * 2, n, j->dt);
        for (int64_t c = 0; c < n; c++) gb[c] = k[c] * (gb[c] - mg[c] - (xb[c] - m[c]) * pr[c]);
      } else {
        for (int64_t c = 0; c < n; c++) gb[c] = k[c] * gb[c];
      }
      st(j->gx + (r * j->C + c0) * 2, gb, n, j->dt);
    }
  }
}

/* -- Entries (cpu.h) ------------------------------------------------------------------- */

void emi_cpu_bn_half_stats(em_state *S, em_dtype dt, int64_t N, int64_t C, int64_t L,
                           bool nhwc, const void *x, double *mean, double *var) {
  bnl_job j = {.dt = dt, .N = N, .C = C, .L = L, .x = x, .s1 = mean, .s2 = var};
  if (nhwc) emi_parallel_for(S, nblocks(C), 1, nhwc_stats, &j);
  else emi_parallel_for(S, C, grain(N * L * 2), nchw_stats, &j);
}

void emi_cpu_bn_half_apply(em_state *S, em_dtype dt, int64_t N, int64_t C, int64_t L,
                           bool nhwc, const void *x, const double *mean, const double *invstd,
                           const float *w, const float *b, void *y) {
  bnl_job j = {.dt = dt, .N = N, .C = C, .L = L, .x = x, .mean = mean, .invstd = invstd,
               .w = w, .b = b, .y = y};
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
  size_t bytes = (size_t)C * 2 * sizeof(double) + 8;
  double *sums = emi_malloc(S, bytes);
  if (!sums)
    return emi_error(S, EM_ERR_NOMEM, "batch_norm_backward: out of memory for %zu bytes",
                     bytes);
  j.s1 = sums, j.s2 = sums + C;
  emi_parallel_for(S, nblocks(C), 1, nhwc_sums, &j);
  for (int64_t c = 0; c < C; c++) {
    if (gw) gw[c] = (float)(j.s2[c] * (double)invstd[c]);
    if (gb) gb[c] = (float)j.s1[c];
  }
  if (gx) emi_parallel_for(S, N * L, grain(C), nhwc_gx, &j);
  emi_free(S, sums, bytes);
  return EM_OK;
}

/*
** softmax.c -- CPU softmax and log_softmax along one dim (emi_cpu_softmax).
**
** Numerically stable form: m = max(x), e = exp(x - m), softmax = e / sum(e),
** log_softmax = (x - m) - log(sum(e)). A NaN anywhere in a slice makes the
** whole slice NaN, and so does a slice of all -inf or one holding +inf (as in
** PyTorch).
**
** Three shapes, fastest first:
**   rows     float32, the dim contiguous in a and in out (softmax over the last
**            dim of (B, C) logits: every classifier's loss). exp is a
**            vectorisable float polynomial (emi_vexpf, vmath.h), sums in double.
**   columns  a contiguous and the dim not last: (P, n, Q) with Q > 1; blocks of
**            up to CB columns go through the n rows three times (max, exp-sum,
**            scale), each pass a vectorisable loop over contiguous columns.
**   generic  any strides, float16/bfloat16/float64: each slice is read three
**            times in chunks through a double buffer (no allocation at all).
*/
#include "reduce.h"
#include "vecmath.h"
#include "vmath.h"
#include <math.h>

enum { CB = 256, CHUNK = 256, LANES = 16 };

/* Sum in double lanes (the values are exps in [0, 1], already in L1). */
static double sum_f32(const float *restrict a, int64_t n) {
  int64_t i = 0;
  if (n <= LANES) {          /* short rows: no lanes to set up and fold */
    double r = 0;
    for (; i < n; i++) r += a[i];
    return r;
  }
  double acc[LANES] = {0};
  for (; i + LANES <= n; i += LANES)
    for (int j = 0; j < LANES; j++) acc[j] += a[i + j];
  for (int j = 0; i < n; i++, j++) acc[j] += a[i];
  for (int w = LANES / 2; w > 0; w /= 2)
    for (int j = 0; j < w; j++) acc[j] += acc[j + w];
  return acc[0];
}

/* One slice, contiguous in a and in out. The exps go to o first (a plain
** loop that vectorises), then are summed; log_softmax overwrites them. */
static void row_f32(float *restrict o, const float *restrict a, int64_t n, int lg) {
  float m = emi_extreme_f32(a, n, 1);
  for (int64_t i = 0; i < n; i++) o[i] = emi_vexpf(a[i] - m);
  double s = sum_f32(o, n);
  if (lg) {
    float ls = (float)log(s);
    for (int64_t i = 0; i < n; i++) o[i] = (a[i] - m) - ls;
  } else {
    float inv = (float)(1.0 / s);
    for (int64_t i = 0; i < n; i++) o[i] *= inv;
  }
}

/* -- Slices ----------------------------------------------------------------------
** The slice dim d has n elements, st bytes apart in a and ost elements apart in
** out; the other dims are walked with offsets into both. */
typedef struct sjob {
  const char *base;
  char *obase;
  em_dtype dt;
  int64_t esz, n, st, ost;
  int log;
  int no;                                  /* other dims */
  int64_t osz[EM_MAX_DIMS], ist[EM_MAX_DIMS], oost[EM_MAX_DIMS];
  int64_t P, Q;                            /* columns shape: (P, n, Q) */
} sjob;


static void rows_task(void *ctx, int64_t r0, int64_t r1) {
  const sjob *j = ctx;
  emi_walker w;
  emi_walk_init(&w, j->no, j->osz, j->ist, j->oost, r0);
  for (int64_t r = r0; r < r1; r++, emi_walk_next(&w))
    row_f32((float *)j->obase + w.off2, (const float *)(j->base + w.off), j->n, j->log);
}

static void generic_task(void *ctx, int64_t r0, int64_t r1) {
  const sjob *j = ctx;
  double buf[CHUNK];
  int64_t n = j->n, st = j->st, osz = (int64_t)em_dtype_size(j->dt);
  emi_walker w;
  emi_walk_init(&w, j->no, j->osz, j->ist, j->oost, r0);
  for (int64_t r = r0; r < r1; r++, emi_walk_next(&w)) {
    const char *p = j->base + w.off;
    char *o = j->obase + w.off2 * osz;
    double m = -INFINITY, s = 0;
    for (int64_t c = 0; c < n; c += CHUNK) {
      int64_t k = n - c < CHUNK ? n - c : CHUNK;
      for (int64_t i = 0; i < k; i++) buf[i] = emi_load_f64(p + (c + i) * st, j->dt);
      for (int64_t i = 0; i < k; i++) m = (buf[i] > m || buf[i] != buf[i]) ? buf[i] : m;
    }
    for (int64_t c = 0; c < n; c += CHUNK) {
      int64_t k = n - c < CHUNK ? n - c : CHUNK;
      for (int64_t i = 0; i < k; i++) buf[i] = emi_load_f64(p + (c + i) * st, j->dt);
      for (int64_t i = 0; i < k; i++) s += exp(buf[i] - m);
    }
    double ls = log(s), inv = 1.0 / s;
    for (int64_t i = 0; i < n; i++) {
      double x = emi_load_f64(p + i * st, j->dt);
      emi_store_f64(o + i * j->ost * osz, j->dt, j->log ? (x - m) - ls : exp(x - m) * inv);
    }
  }
}

/* Columns: task t = (p, column block); a and out contiguous, same layout. */
static void cols_task(void *ctx, int64_t t0, int64_t t1) {
  const sjob *j = ctx;
  int64_t ncb = (j->Q + CB - 1) / CB, n = j->n, Q = j->Q;
  for (int64_t t = t0; t < t1; t++) {
    int64_t p = t / ncb, c0 = t % ncb * CB, W = Q - c0 < CB ? Q - c0 : CB;
    const float *a = (const float *)j->base + p * n * Q + c0;
    float *o = (float *)j->obase + p * n * Q + c0;
    float m[CB];
    double s[CB];
    for (int64_t c = 0; c < W; c++) { m[c] = -INFINITY; s[c] = 0; }
    for (int64_t i = 0; i < n; i++)
      for (int64_t c = 0; c < W; c++) {
        float x = a[i * Q + c];
        m[c] = ((x > m[c]) | (x != x)) ? x : m[c];
      }
    for (int64_t i = 0; i < n; i++) {
      float *restrict oi = o + i * Q;
      const float *restrict ai = a + i * Q;
      for (int64_t c = 0; c < W; c++) oi[c] = emi_vexpf(ai[c] - m[c]);
      for (int64_t c = 0; c < W; c++) s[c] += oi[c];
    }
    float f[CB];
    if (j->log) {
      for (int64_t c = 0; c < W; c++) f[c] = (float)log(s[c]);
      for (int64_t i = 0; i < n; i++)
        for (int64_t c = 0; c < W; c++) o[i * Q + c] = (a[i * Q + c] - m[c]) - f[c];
    } else {
      for (int64_t c = 0; c < W; c++) f[c] = (float)(1.0 / s[c]);
      for (int64_t i = 0; i < n; i++)
        for (int64_t c = 0; c < W; c++) o[i * Q + c] *= f[c];
    }
  }
}

em_status emi_cpu_softmax(emi_device *dev, em_tensor *out, const em_tensor *a, int dim,
                          int log) {
  em_state *S = dev->S;
  sjob j;
  j.base = em_tensor_data(a);
  j.obase = em_tensor_data(out);
  j.dt = a->dtype;
  j.esz = (int64_t)em_dtype_size(a->dtype);
  j.log = log;
  j.no = 0;
  j.n = 1;
  j.st = 0;
  j.ost = 0;
  j.P = 1;
  j.Q = 1;
  if (a->numel == 0) return EM_OK;
  for (int d = 0; d < a->ndim; d++) {
    if (d == dim) {
      j.n = a->sizes[d];
      j.st = a->strides[d] * j.esz;
      j.ost = out->strides[d];
      continue;
    }
    if (d < dim) j.P *= a->sizes[d]; else j.Q *= a->sizes[d];
    if (a->sizes[d] == 1) continue;
    j.osz[j.no] = a->sizes[d];
    j.ist[j.no] = a->strides[d] * j.esz;
    j.oost[j.no++] = out->strides[d];
  }
  /* Work estimates for the thread decision, in "sum elements": the float
  ** paths make four passes, one with an exp, and a log per slice; the generic
  ** one calls libm per element. */
  int64_t rows = a->numel / j.n;
  if (j.dt == EM_FLOAT32 && (j.st == 4 || j.n == 1) && (j.ost == 1 || j.n == 1)) {
    emi_parallel_dynamic(S, rows, 8 * j.n, rows_task, &j);
  } else if (j.dt == EM_FLOAT32 && em_tensor_is_contiguous(a) && j.Q > 1) {
    int64_t ncb = (j.Q + CB - 1) / CB;
    emi_parallel_dynamic(S, j.P * ncb, 8 * j.n * (j.Q < CB ? j.Q : CB), cols_task, &j);
  } else {
    emi_parallel_dynamic(S, rows, 32 * j.n, generic_task, &j);
  }
  return EM_OK;
}

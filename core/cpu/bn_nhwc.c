/*
** bn_nhwc.c -- batch norm's loops on channels-last input: x is M = N*H*W rows of
** C channels. Statistics want per-channel sums down the rows; the rows are split
** among tasks with a partial sum vector each, added in task order (bn_rows.h), so
** that a small C (one block of channels) still keeps every thread busy, and the
** sums are kept in double, as normalize.c's NCHW loops keep them. The
** element-wise passes (y, gx) are split by rows and vectorize over channels. normalize.c calls these for a non-contiguous
** (channels-last) x and keeps the running statistics and saved copies itself.
*/
#include "cpu.h"
#include "bn_rows.h"

enum { CBLK = 64 };   /* channels per pass over a task's rows (accumulators on the stack) */
enum { BNH_SUM, BNH_SQ, BNH_BWD };   /* x; (x - mean)^2; gy and gy*(x - mean) */

typedef struct bnh_job {
  int64_t M, C;
  const void *x, *gy, *w, *b, *cmean, *crstd;
  const double *mean, *invstd;
  double *s1, *s2;    /* per channel: sum / mean, then squared deviations / sums */
  void *y, *gx, *gw, *gb;
  int training;
  int64_t nt;         /* row tasks of the reductions */
  double *part;       /* their partial sums, 2*C per task */
  int kind;           /* which reduction bnh_red runs */
  int relu;           /* apply: then ReLU */
} bnh_job;

static int64_t rows_grain(int64_t C) {
  int64_t g = 32768 / (C ? C : 1);
  return g < 1 ? 1 : g;
}

#define T float
#define FN(name) name##_f32
#include "bn_nhwc_impl.h"
#define T double
#define FN(name) name##_f64
#include "bn_nhwc_impl.h"

#define PICK(fn, dt) ((dt) == EM_FLOAT32 ? fn##_f32 : fn##_f64)

/* The row tasks' partial sums (2*C doubles each) and extra doubles after them. */
static double *part_alloc(em_state *S, bnh_job *j, int64_t extra, size_t *bytes,
                          const char *op) {
  j->nt = emi_bn_tasks(j->M, j->C);
  *bytes = (size_t)(j->nt * 2 * j->C + extra) * sizeof(double) + 8;
  j->part = emi_malloc(S, *bytes);
  if (!j->part)
    emi_error(S, EM_ERR_NOMEM, "%s: out of memory for %zu bytes", op, *bytes);
  return j->part;
}

/* Runs reduction kind over the row tasks and adds the task sums in order. */
static void reduce(em_state *S, em_dtype dt, bnh_job *j, int kind, double *s1, double *s2) {
  j->kind = kind;
  emi_parallel_for(S, j->nt, 1, PICK(bnh_red, dt), j);
  emi_bn_combine(s1, j->part, j->nt, 2 * j->C, j->C);
  if (s2) emi_bn_combine(s2, j->part + j->C, j->nt, 2 * j->C, j->C);
}

em_status emi_cpu_bn_nhwc_stats(em_state *S, em_dtype dt, int64_t M, int64_t C, const void *x,
                                double *mean, double *var) {
  bnh_job j = {.M = M, .C = C, .x = x, .s1 = mean, .s2 = var};
  size_t bytes;
  if (!part_alloc(S, &j, 0, &bytes, "batch_norm")) return EM_ERR_NOMEM;
  reduce(S, dt, &j, BNH_SUM, mean, NULL);
  for (int64_t c = 0; c < C; c++) mean[c] /= (double)M;
  j.mean = mean;
  reduce(S, dt, &j, BNH_SQ, var, NULL);
  for (int64_t c = 0; c < C; c++) var[c] /= (double)M;
  emi_free(S, j.part, bytes);
  return EM_OK;
}

void emi_cpu_bn_nhwc_apply(em_state *S, em_dtype dt, int64_t M, int64_t C, const void *x,
                           const double *mean, const double *invstd, const void *w,
                           const void *b, void *y, int relu) {
  bnh_job j = {.M = M, .C = C, .x = x, .mean = mean, .invstd = invstd, .w = w, .b = b, .y = y,
               .relu = relu};
  emi_parallel_for(S, M, rows_grain(C), PICK(bnh_apply, dt), &j);
}

em_status emi_cpu_bn_nhwc_backward(em_state *S, em_dtype dt, int64_t M, int64_t C,
                                   const void *gy, const void *x, const void *mean,
                                   const void *invstd, const void *w, int training, void *gx,
                                   void *gw, void *gb) {
  bnh_job j = {.M = M, .C = C, .gy = gy, .x = x, .cmean = mean, .crstd = invstd, .w = w,
               .training = training, .gx = gx, .gw = gw, .gb = gb};
  size_t bytes;
  if (!part_alloc(S, &j, 2 * C, &bytes, "batch_norm_backward")) return EM_ERR_NOMEM;
  j.s1 = j.part + j.nt * 2 * C, j.s2 = j.s1 + C;
  reduce(S, dt, &j, BNH_BWD, j.s1, j.s2);
  PICK(bnh_params, dt)(&j);
  if (gx) emi_parallel_for(S, M, rows_grain(C), PICK(bnh_gx, dt), &j);
  emi_free(S, j.part, bytes);
  return EM_OK;
}

/*
** bn_nhwc.c -- batch norm's loops on channels-last input: x is M = N*H*W rows of
** C channels. Statistics want per-channel sums down the rows, so the work is
** split by blocks of channels (each block walks all rows, reading its channels'
** contiguous run of each row) and the sums are kept in double, as normalize.c's
** NCHW loops keep them; the element-wise passes (y, gx) are split by rows and
** vectorize over channels. normalize.c calls these for a non-contiguous
** (channels-last) x and keeps the running statistics and saved copies itself.
*/
#include "cpu.h"

enum { CBLK = 64 };   /* channels per statistics task */

typedef struct bnh_job {
  int64_t M, C;
  const void *x, *gy, *w, *b, *cmean, *crstd;
  const double *mean, *invstd;
  double *s1, *s2;    /* per channel: sum / mean, then squared deviations / sums */
  void *y, *gx, *gw, *gb;
  int training;
} bnh_job;

static int64_t blocks(int64_t C) { return (C + CBLK - 1) / CBLK; }
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

void emi_cpu_bn_nhwc_stats(em_state *S, em_dtype dt, int64_t M, int64_t C, const void *x,
                           double *mean, double *var) {
  bnh_job j = {.M = M, .C = C, .x = x, .s1 = mean, .s2 = var};
  emi_parallel_for(S, blocks(C), 1, PICK(bnh_stats, dt), &j);
}

void emi_cpu_bn_nhwc_apply(em_state *S, em_dtype dt, int64_t M, int64_t C, const void *x,
                           const double *mean, const double *invstd, const void *w,
                           const void *b, void *y) {
  bnh_job j = {.M = M, .C = C, .x = x, .mean = mean, .invstd = invstd, .w = w, .b = b, .y = y};
  emi_parallel_for(S, M, rows_grain(C), PICK(bnh_apply, dt), &j);
}

em_status emi_cpu_bn_nhwc_backward(em_state *S, em_dtype dt, int64_t M, int64_t C,
                                   const void *gy, const void *x, const void *mean,
                                   const void *invstd, const void *w, int training, void *gx,
                                   void *gw, void *gb) {
  size_t bytes = (size_t)C * 2 * sizeof(double) + 8;
  double *sums = emi_malloc(S, bytes);
  if (!sums)
    return emi_error(S, EM_ERR_NOMEM, "batch_norm_backward: out of memory for %zu bytes",
                     bytes);
  bnh_job j = {.M = M, .C = C, .gy = gy, .x = x, .cmean = mean, .crstd = invstd, .w = w,
               .training = training, .gx = gx, .gw = gw, .gb = gb, .s1 = sums,
               .s2 = sums + C};
  emi_parallel_for(S, blocks(C), 1, PICK(bnh_sums, dt), &j);
  PICK(bnh_params, dt)(&j);
  if (gx) emi_parallel_for(S, M, rows_grain(C), PICK(bnh_gx, dt), &j);
  emi_free(S, sums, bytes);
  return EM_OK;
}

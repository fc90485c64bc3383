/*
** bn_rows.h -- how the channels-last batch norms (bn_nhwc.c, bn_half.c) split a
** per-channel reduction over M rows of C among threads.
**
** Splitting by channels leaves threads idle when C is small (16 to 64 channels is
** one block), so the rows are split instead: task t sums rows
** [t*M/T, (t+1)*M/T) into its own slot of T partial vectors, and the caller adds
** the slots in task order. T depends on M and C only, never on the thread count
** or on timing, so the sums are the same bits run to run and on any machine
** width.
*/
#ifndef EMI_BN_ROWS_H
#define EMI_BN_ROWS_H

#include <stdint.h>

enum { EMI_BN_TASK_ELEMS = 32768, EMI_BN_MAX_TASKS = 64 };

/* Number of row tasks for M rows of C: about EMI_BN_TASK_ELEMS elements each. */
static inline int64_t emi_bn_tasks(int64_t M, int64_t C) {
  int64_t t = (M * C + EMI_BN_TASK_ELEMS - 1) / EMI_BN_TASK_ELEMS;
  if (t > EMI_BN_MAX_TASKS) t = EMI_BN_MAX_TASKS;
  if (t > M) t = M;
  return t < 1 ? 1 : t;
}

/* Rows of task t of T. */
static inline void emi_bn_task_rows(int64_t M, int64_t T, int64_t t, int64_t *r0,
                                    int64_t *r1) {
  *r0 = t * M / T;
  *r1 = (t + 1) * M / T;
}

/* out[c] = sum over t in order of part[t*stride + c], c < C. */
static inline void emi_bn_combine(double *out, const double *part, int64_t T, int64_t stride,
                                  int64_t C) {
  for (int64_t c = 0; c < C; c++) {
    double s = 0;
    for (int64_t t = 0; t < T; t++) s += part[t * stride + c];
    out[c] = s;
  }
}

#endif

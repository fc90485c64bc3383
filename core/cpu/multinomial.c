/*
** multinomial.c -- em.multinomial's draws with replacement on the CPU, in one
** pass per row (em_cpu_multinomial, ember.h).
**
** Each draw is the category whose cumulative weight first passes u * total: the
** count of cumulative weights <= u * total, plus one. Composed from ops (other
** devices), that is a float64 copy of the weights, passes for the checks (any
** NaN or inf, a negative weight, a row summing to 0), a scan, and a binary search
** run as rounds of gathers. Here each row is read once: its running sum in double
** (the same sequential sum as the float64 scan, so the draws are the composed
** path's bit for bit) goes into a row buffer while the checks are noted, then
** each of the row's draws searches that buffer. The checks are reported after
** every row is seen, in the composed path's order and words.
*/
#include "internal.h"
#include <math.h>
#include <stdlib.h>

typedef struct {
  em_dtype dt;
  int64_t k, n;
  const void *probs;
  const double *u;
  int64_t *out;
  double *row_min;         /* per row: the least weight (NaN: a weight not finite) */
  int *failed;             /* out of memory for a row buffer */
  int *zero_sum;           /* a row whose weights (finite, >= 0) sum to 0 */
} draw_job;

/* The count of cdf[0..k) that are <= target (cdf ascending). */
static int64_t count_le(const double *cdf, int64_t k, double target) {
  int64_t lo = 0, hi = k;
  while (lo < hi) {
    int64_t mid = lo + (hi - lo) / 2;
    if (cdf[mid] <= target) lo = mid + 1;
    else hi = mid;
  }
  return lo;
}

static void draw_rows(void *ctx, int64_t r0, int64_t r1) {
  draw_job *j = ctx;
  int64_t k = j->k;
  double *cdf = malloc((size_t)k * sizeof *cdf);
  if (!cdf) { __atomic_store_n(j->failed, 1, __ATOMIC_RELAXED); return; }
  for (int64_t r = r0; r < r1; r++) {
    double acc = 0, lo = INFINITY;
    int finite = 1;
    const float *pf = j->dt == EM_FLOAT32 ? (const float *)j->probs + r * k : NULL;
    const double *pd = pf ? NULL : (const double *)j->probs + r * k;
    for (int64_t i = 0; i < k; i++) {
      double v = pf ? pf[i] : pd[i];
      finite &= isfinite(v);
      lo = v < lo ? v : lo;
      cdf[i] = acc += v;
    }
    j->row_min[r] = finite ? lo : NAN;
    if (finite && lo >= 0 && !(acc > 0)) __atomic_store_n(j->zero_sum, 1, __ATOMIC_RELAXED);
    if (!finite || lo < 0 || !(acc > 0)) continue;   /* reported by the caller */
    const double *u = j->u + r * j->n;
    int64_t *o = j->out + r * j->n;
    for (int64_t d = 0; d < j->n; d++) {
      int64_t c = count_le(cdf, k, u[d] * acc) + 1;
      o[d] = c < k ? c : k;
    }
  }
  free(cdf);
}

em_status em_cpu_multinomial(em_state *S, em_dtype dt, int64_t rows, int64_t k,
                             const void *probs, int64_t n, const double *u, int64_t *out) {
  const char *op = "multinomial (cpu kernel)";
  if (dt != EM_FLOAT32 && dt != EM_FLOAT64)
    return emi_error(S, EM_ERR_DTYPE, "%s: the weights must be float32 or float64, got %s",
                        op, em_dtype_name(dt));
  if (rows < 1 || k < 1 || n < 1)
    return emi_error(S, EM_ERR_ARG, "%s: bad sizes: %lld rows of %lld categories, %lld "
                        "draws", op, (long long)rows, (long long)k, (long long)n);
  if (!probs || !u || !out) return emi_error(S, EM_ERR_ARG, "%s: NULL buffer", op);
  double *row_min = malloc((size_t)rows * sizeof *row_min);
  if (!row_min) return emi_error(S, EM_ERR_NOMEM, "%s: out of memory", op);
  int failed = 0, zero_sum = 0;
  draw_job j = {dt, k, n, probs, u, out, row_min, &failed, &zero_sum};
  int64_t grain = 65536 / k;
  if (grain < 1) grain = 1;
  if (rows <= grain) draw_rows(&j, 0, rows);
  else emi_parallel_for(S, rows, grain, draw_rows, &j);
  /* the composed path's checks, in its order: finite, non-negative, positive sums */
  double lo = INFINITY;
  int finite = 1;
  for (int64_t r = 0; r < rows; r++) {
    finite &= !isnan(row_min[r]);
    lo = row_min[r] < lo ? row_min[r] : lo;
  }
  free(row_min);
  if (failed) return emi_error(S, EM_ERR_NOMEM, "%s: out of memory for a row of %lld "
                                  "categories", op, (long long)k);
  if (!finite) return emi_error(S, EM_ERR_ARG, "multinomial: probs must be finite and not NaN");
  if (lo < 0)
    return emi_error(S, EM_ERR_ARG, "multinomial: probs must be non-negative, got a minimum "
                        "of %g", lo);
  if (zero_sum) return emi_error(S, EM_ERR_ARG, "multinomial: every row of probs must have "
                                    "a positive sum");
  return EM_OK;
}

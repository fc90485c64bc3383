/*
** test_cpu_multinomial.c -- em.multinomial's CPU kernel (core/cpu/multinomial.c)
** against the definition written here: each draw is 1 + the count of the row's
** running sums (in double, in order) that are <= u * the row's total. Rows with
** zero-weight runs, a uniform at a running sum, float32 and
** float64, enough rows for two threads; the errors for a NaN, an infinite or a
** negative weight, a zero row, a bad dtype, sizes and NULL buffers.
*/
#include "check.h"
#include <math.h>

static double value(uint32_t *s) {
  *s = *s * 1664525u + 1013904223u;
  return (double)(*s >> 8) / 16777216.0;
}

/* The definition, for row r of k weights (as doubles). */
static int64_t draw(const double *w, int64_t k, double u) {
  double total = 0;
  for (int64_t i = 0; i < k; i++) total += w[i];
  double acc = 0, t = u * total;
  int64_t count = 0;
  for (int64_t i = 0; i < k; i++) count += (acc += w[i]) <= t;
  return count + 1 < k ? count + 1 : k;
}

static void one_case(em_state *S, em_dtype dt, int64_t rows, int64_t k, int64_t n) {
  uint32_t s = 7;
  double *w = malloc(sizeof(double) * (size_t)(rows * k));
  double *u = malloc(sizeof(double) * (size_t)(rows * n));
  int64_t *out = malloc(sizeof(int64_t) * (size_t)(rows * n));
  void *buf = malloc(8 * (size_t)(rows * k));
  for (int64_t i = 0; i < rows * k; i++) {
    /* a third of the weights 0, in runs */
    w[i] = (i / 5) % 3 == 1 ? 0 : (double)(float)value(&s);
    if (dt == EM_FLOAT32) ((float *)buf)[i] = (float)w[i];
    else ((double *)buf)[i] = w[i];
  }
  for (int64_t i = 0; i < rows * n; i++) u[i] = value(&s);
  /* a uniform at (or within a rounding of) the first running sum of row 0 */
  double total = 0;
  for (int64_t i = 0; i < k; i++) total += w[i];
  u[0] = w[0] / total;
  int bad = 0;
  if (CHECK_OK(S, em_cpu_multinomial(S, dt, rows, k, buf, n, u, out))) {
    for (int64_t r = 0; r < rows; r++)
      for (int64_t d = 0; d < n; d++)
        bad += out[r * n + d] != draw(w + r * k, k, u[r * n + d]);
  }
  CHECK(bad == 0, "%s rows=%lld k=%lld: %d draws differ from the definition",
        em_dtype_name(dt), (long long)rows, (long long)k, bad);
  free(w);
  free(u);
  free(out);
  free(buf);
}

static void test_draws(em_state *S) {
  one_case(S, EM_FLOAT32, 3, 17, 40);
  one_case(S, EM_FLOAT64, 3, 17, 40);
  one_case(S, EM_FLOAT32, 40, 5000, 30);   /* many rows: two threads */
  one_case(S, EM_FLOAT64, 1, 1, 3);
}

static void test_errors(em_state *S) {
  float w[4] = {1, 2, 3, 4};
  double u[2] = {0.5, 0.5};
  int64_t out[2];
  w[2] = NAN;
  CHECK_ERR(S, em_cpu_multinomial(S, EM_FLOAT32, 2, 2, w, 1, u, out), EM_ERR_ARG,
            "multinomial", "finite and not NaN");
  w[2] = INFINITY;
  CHECK_ERR(S, em_cpu_multinomial(S, EM_FLOAT32, 2, 2, w, 1, u, out), EM_ERR_ARG, "finite");
  w[2] = -0.5f;
  CHECK_ERR(S, em_cpu_multinomial(S, EM_FLOAT32, 2, 2, w, 1, u, out), EM_ERR_ARG,
            "non-negative", "minimum of -0.5");
  w[2] = 0;
  w[3] = 0;
  CHECK_ERR(S, em_cpu_multinomial(S, EM_FLOAT32, 2, 2, w, 1, u, out), EM_ERR_ARG,
            "positive sum");
  CHECK_ERR(S, em_cpu_multinomial(S, EM_BFLOAT16, 2, 2, w, 1, u, out), EM_ERR_DTYPE,
            "float32 or float64", "bfloat16");
  CHECK_ERR(S, em_cpu_multinomial(S, EM_FLOAT32, 2, 0, w, 1, u, out), EM_ERR_ARG, "bad sizes");
  CHECK_ERR(S, em_cpu_multinomial(S, EM_FLOAT32, 2, 2, w, 1, NULL, out), EM_ERR_ARG,
            "NULL buffer");
}

int main(void) {
  em_config cfg;
  em_config_init(&cfg);
  cfg.num_threads = 2;
  em_state *S = NULL;
  if (em_open(&S, &cfg) != EM_OK) return 1;
  RUN(test_draws, S);
  RUN(test_errors, S);
  em_close(S);
  return check_done();
}

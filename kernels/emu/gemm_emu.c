/*
** gemm_emu.c -- the emulated runtime's gemm (runtime.h): the CPU stand-in for
** cuBLASLt. The call checks its arguments and queues a work item; on the
** stream's thread the item pins the device range every operand spans (so a
** range outside live device memory is the stream's sticky error, as an illegal
** address is on a GPU), then computes:
**   - float32/float64 with OpenBLAS sgemm/dgemm, one call per batch matrix,
**     when every matrix has a unit stride (transposed operands go in as
**     CblasTrans); otherwise a plain loop;
**   - float16/bfloat16 converted to dense float32 matrices, sgemm, and each
**     result rounded once with the CPU's conversions (core/backend.h).
** allow_tf32 is ignored: the emulator computes in full float32.
*/
#include "emu.h"
#include "backend.h"
#include <cblas.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct gemm_args {
  em_dtype dt;
  int64_t m, n, k, batch;
  const char *a, *b;
  char *c;
  int64_t ars, acs, abs_, brs, bcs, bbs, crs, ccs, cbs;
} gemm_args;

/* Bytes spanned by rows x cols matrices over batch (all >= 1, strides >= 0). */
static size_t span(int64_t batch, int64_t rows, int64_t cols, int64_t rs, int64_t cs,
                   int64_t bs, size_t es) {
  return (size_t)((batch - 1) * bs + (rows - 1) * rs + (cols - 1) * cs + 1) * es;
}

/* A rows x cols matrix as a row-major BLAS operand: 1 with *tr and *ld set. */
static int blas_op(int64_t rows, int64_t cols, int64_t rs, int64_t cs,
                   enum CBLAS_TRANSPOSE *tr, int *ld) {
  if (cols == 1) cs = 1;
  if (rows == 1) rs = cs == 1 ? (cols > 1 ? cols : 1) : 1;
  if (cs == 1 && rs >= (cols > 1 ? cols : 1) && rs <= INT_MAX) {
    *tr = CblasNoTrans;
    *ld = (int)rs;
    return 1;
  }
  if (rs == 1 && cs >= (rows > 1 ? rows : 1) && cs <= INT_MAX) {
    *tr = CblasTrans;
    *ld = (int)cs;
    return 1;
  }
  return 0;
}

static float load_f(const char *p, em_dtype dt) {
  switch (dt) {
  case EM_FLOAT16: return emi_half_to_float(*(const uint16_t *)p);
  case EM_BFLOAT16: return emi_bf16_to_float(*(const uint16_t *)p);
  default: return *(const float *)p;
  }
}

/* One batch matrix, float32 or float64, strides as given (element units). */
static void one_matrix(const gemm_args *g, const char *a, const char *b, char *c) {
  int64_t m = g->m, n = g->n, k = g->k;
  int64_t ars = g->ars, acs = g->acs, brs = g->brs, bcs = g->bcs, crs = g->crs, ccs = g->ccs;
  if (k == 0) {
    for (int64_t i = 0; i < m; i++)
      for (int64_t j = 0; j < n; j++) {
        if (g->dt == EM_FLOAT64) ((double *)c)[i * crs + j * ccs] = 0;
        else ((float *)c)[i * crs + j * ccs] = 0;
      }
    return;
  }
  /* C as row-major NoTrans; a C that is only column-major is computed as
  ** C^T = B^T A^T */
  enum CBLAS_TRANSPOSE tc, ta, tb;
  int ldc, lda, ldb;
  int ok = m <= INT_MAX && n <= INT_MAX && k <= INT_MAX && blas_op(m, n, crs, ccs, &tc, &ldc);
  int swap = ok && tc == CblasTrans;
  if (swap) {
    const char *t = a; a = b; b = t;
    int64_t x = m; m = n; n = x;
    x = ars; ars = bcs; bcs = x;
    x = acs; acs = brs; brs = x;
    x = crs; crs = ccs; ccs = x;
  }
  ok = ok && blas_op(m, k, ars, acs, &ta, &lda) && blas_op(k, n, brs, bcs, &tb, &ldb);
  if (ok) {
    if (g->dt == EM_FLOAT64)
      cblas_dgemm(CblasRowMajor, ta, tb, (int)m, (int)n, (int)k, 1.0, (const double *)a, lda,
                  (const double *)b, ldb, 0.0, (double *)c, ldc);
    else
      cblas_sgemm(CblasRowMajor, ta, tb, (int)m, (int)n, (int)k, 1.0f, (const float *)a, lda,
                  (const float *)b, ldb, 0.0f, (float *)c, ldc);
    return;
  }
  for (int64_t i = 0; i < m; i++)
    for (int64_t j = 0; j < n; j++) {
      if (g->dt == EM_FLOAT64) {
        const double *x = (const double *)a + i * ars, *y = (const double *)b + j * bcs;
        double s = 0;
        for (int64_t q = 0; q < k; q++) s += x[q * acs] * y[q * brs];
        ((double *)c)[i * crs + j * ccs] = s;
      } else {
        const float *x = (const float *)a + i * ars, *y = (const float *)b + j * bcs;
        float s = 0;
        for (int64_t q = 0; q < k; q++) s += x[q * acs] * y[q * brs];
        ((float *)c)[i * crs + j * ccs] = s;
      }
    }
}

/* float16/bfloat16: dense float32 copies, sgemm, one rounding per result. */
static em_status half_matrices(const gemm_args *g, char *err, size_t errlen) {
  int64_t m = g->m, n = g->n, k = g->k;
  size_t es = 2;
  float *fa = malloc(sizeof(float) * (size_t)(m * k + 1));
  float *fb = malloc(sizeof(float) * (size_t)(k * n + 1));
  float *fc = malloc(sizeof(float) * (size_t)(m * n + 1));
  if (!fa || !fb || !fc) {
    free(fa); free(fb); free(fc);
    snprintf(err, errlen, "gemm: out of host memory for the float32 copies");
    return EM_ERR_NOMEM;
  }
  gemm_args d = *g;
  d.dt = EM_FLOAT32;
  d.ars = k; d.acs = 1; d.brs = n; d.bcs = 1; d.crs = n; d.ccs = 1;
  for (int64_t bi = 0; bi < g->batch; bi++) {
    const char *a = g->a + (size_t)(bi * g->abs_) * es, *b = g->b + (size_t)(bi * g->bbs) * es;
    char *c = g->c + (size_t)(bi * g->cbs) * es;
    for (int64_t i = 0; i < m; i++)
      for (int64_t q = 0; q < k; q++)
        fa[i * k + q] = load_f(a + (size_t)(i * g->ars + q * g->acs) * es, g->dt);
    for (int64_t q = 0; q < k; q++)
      for (int64_t j = 0; j < n; j++)
        fb[q * n + j] = load_f(b + (size_t)(q * g->brs + j * g->bcs) * es, g->dt);
    one_matrix(&d, (const char *)fa, (const char *)fb, (char *)fc);
    for (int64_t i = 0; i < m; i++)
      for (int64_t j = 0; j < n; j++) {
        float v = fc[i * n + j];
        *(uint16_t *)(c + (size_t)(i * g->crs + j * g->ccs) * es) =
            g->dt == EM_FLOAT16 ? emi_float_to_half(v) : emi_float_to_bf16(v);
      }
  }
  free(fa); free(fb); free(fc);
  return EM_OK;
}

/* On the stream's thread. */
static em_status run_gemm(emu *E, void *args, char *err, size_t errlen) {
  const gemm_args *g = args;
  if (!g->batch) return EM_OK;
  size_t es = em_dtype_size(g->dt);
  struct { const char *name; const void *p; size_t n; } ops[3] = {
    {"A", g->a, g->k ? span(g->batch, g->m, g->k, g->ars, g->acs, g->abs_, es) : 0},
    {"B", g->b, g->k ? span(g->batch, g->k, g->n, g->brs, g->bcs, g->bbs, es) : 0},
    {"C", g->c, span(g->batch, g->m, g->n, g->crs, g->ccs, g->cbs, es)},
  };
  emu_block *pins[3] = {NULL, NULL, NULL};
  em_status st = EM_OK;
  for (int i = 0; i < 3 && !st; i++) {
    if (!ops[i].n) continue;
    char why[400];
    if (!emi_emu_pin(E, ops[i].p, ops[i].n, &pins[i], why, sizeof why)) {
      snprintf(err, errlen, "gemm (%lld x %lld x %lld, batch %lld): operand %s (%zu bytes) %s",
               (long long)g->m, (long long)g->n, (long long)g->k, (long long)g->batch,
               ops[i].name, ops[i].n, why);
      st = EM_ERR_ARG;
    }
  }
  if (!st) {
    if (g->dt == EM_FLOAT16 || g->dt == EM_BFLOAT16) st = half_matrices(g, err, errlen);
    else
      for (int64_t bi = 0; bi < g->batch; bi++)
        one_matrix(g, g->a + (size_t)(bi * g->abs_) * es, g->b + (size_t)(bi * g->bbs) * es,
                   g->c + (size_t)(bi * g->cbs) * es);
  }
  for (int i = 0; i < 3; i++)
    if (pins[i]) emi_emu_unpin(E, pins[i]);
  return st;
}

em_status emi_emu_gemm(emk_runtime *rt, emk_stream *s, em_dtype dtype, int64_t m, int64_t n,
                       int64_t k, int64_t batch,
                       const void *a, int64_t a_rs, int64_t a_cs, int64_t a_bs,
                       const void *b, int64_t b_rs, int64_t b_cs, int64_t b_bs,
                       void *c, int64_t c_rs, int64_t c_cs, int64_t c_bs, int allow_tf32) {
  emu *E = (emu *)rt->impl;
  if (dtype != EM_FLOAT32 && dtype != EM_FLOAT64 && dtype != EM_FLOAT16 &&
      dtype != EM_BFLOAT16)
    return emi_emu_fail(E, EM_ERR_DTYPE, "gemm: dtype %s (float32, float64, float16 or "
                        "bfloat16 only)", em_dtype_name(dtype));
  if (m < 0 || n < 0 || k < 0 || batch < 0)
    return emi_emu_fail(E, EM_ERR_ARG, "gemm: negative size (m %lld, n %lld, k %lld, "
                        "batch %lld)", (long long)m, (long long)n, (long long)k,
                        (long long)batch);
  if (a_rs < 0 || a_cs < 0 || a_bs < 0 || b_rs < 0 || b_cs < 0 || b_bs < 0 || c_rs < 0 ||
      c_cs < 0 || c_bs < 0)
    return emi_emu_fail(E, EM_ERR_ARG, "gemm: negative stride");
  gemm_args g = {dtype, m, n, k, batch, a, b, c, a_rs, a_cs, a_bs, b_rs, b_cs, b_bs,
                 c_rs, c_cs, c_bs};
  if (m == 0 || n == 0 || batch == 0) g.batch = 0;   /* nothing to write */
  if (g.batch && (!c || (k && (!a || !b))))
    return emi_emu_fail(E, EM_ERR_ARG, "gemm: NULL operand");
  return emi_emu_queue_work(E, s, "gemm", run_gemm, &g, sizeof g);
}

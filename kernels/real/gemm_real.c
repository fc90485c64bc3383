/*
** gemm_real.c -- the real runtime's gemm (runtime.h) on cuBLASLt.
**
** Three layers, the first two testable without a GPU:
**   1. emk_lt_plan_gemm: pure arithmetic, from the runtime's row and column element
**      strides to cuBLASLt's column-major matrices, transposes and batch offsets
**      (gemm_lt.h has the mapping and why). Compiled in every build.
**   2. lt_build: the matmul descriptor and the three matrix layouts for a plan
**      (cublasLtMatmulDescCreate and cublasLtMatrixLayoutCreate need no driver),
**      shared by the real gemm and by emk_lt_gemm_check, which reads every
**      attribute back for the tests.
**   3. emr_gemm: the call. cuBLASLt is loaded at the first gemm (a machine that
**      never multiplies does not need it); a handle per device is made at that
**      device's first gemm, and a 32 MiB workspace per stream at the stream's
**      first (without one when the device has no room: fewer algorithms, same
**      results). The descriptor, the layouts and the algorithm that
**      cublasLtMatmulAlgoGetHeuristic picks given the operands' actual pointer
**      alignments (cuBLASLt assumes 256 bytes unless told, and a view into a
**      tensor is often less aligned) make a plan, kept in the runtime's plan
**      table (plan_cache.h) under an emk_lt_key (gemm_lt.h: plan, dtype, TF32,
**      device, alignments, workspace): a repeated gemm costs a lookup and
**      cublasLtMatmul. The table is bounded (LT_PLANS, least recently used out)
**      and freed at close; its hits and misses are read by emk_real_gemm_plans.
** Types: float32 computes in float32 (CUBLAS_COMPUTE_32F_FAST_TF32 when the caller
** allows TF32), float64 in float64, float16 and bfloat16 accumulate in float32
** with a float scale, rounding once. k = 0 writes zeros with cudaMemset2DAsync
** (0 bits are +0.0 in every float type), as cuBLASLt is not asked for an empty
** inner dimension.
*/
#include "../runtime.h"
#include "libs_fn.h"
#include "gemm_lt.h"
#include "plan_cache.h"
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* == 1. The plan ======================================================================= */

/* One operand of ours (name, r x c, strides) as cuBLASLt's matrix *out. */
static em_status plan_operand(const char *name, int64_t r, int64_t c, int64_t rs, int64_t cs,
                              int64_t bs, int64_t batch, int transposed, emk_lt_matrix *out,
                              char *err, size_t errlen) {
  int64_t rows, cols, ld;
  if (!emk_lt_operand(r, c, rs, cs, &out->trans, &rows, &cols, &ld)) {
    /* report the operand as the caller sees it, not its transpose */
    int64_t ur = transposed ? c : r, uc = transposed ? r : c;
    int64_t urs = transposed ? cs : rs, ucs = transposed ? rs : cs;
    return emk_errf(err, errlen, EM_ERR_UNSUPPORTED, "operand %s (%lld x %lld, element strides "
               "%lld and %lld) is no cuBLASLt matrix: one stride must be 1 and the other at "
               "least the size it steps over (copy it to a contiguous tensor first)", name,
               (long long)ur, (long long)uc, (long long)urs, (long long)ucs);
  }
  out->rows = rows, out->cols = cols, out->ld = ld;
  out->batch_stride = batch > 1 ? bs : 0;
  return EM_OK;
}

em_status emk_lt_plan_gemm(const emk_lt_args *g, emk_lt_plan *p, char *err, size_t errlen) {
  memset(p, 0, sizeof *p);
  if (g->m < 1 || g->n < 1 || g->batch < 1 || g->k < 0)
    return emk_errf(err, errlen, EM_ERR_ARG, "gemm plan: sizes m %lld, n %lld, batch %lld (>= 1) "
               "and k %lld (>= 0)", (long long)g->m, (long long)g->n, (long long)g->batch,
               (long long)g->k);
  if (g->a_rs < 0 || g->a_cs < 0 || g->a_bs < 0 || g->b_rs < 0 || g->b_cs < 0 || g->b_bs < 0 ||
      g->c_rs < 0 || g->c_cs < 0 || g->c_bs < 0)
    return emk_errf(err, errlen, EM_ERR_ARG, "gemm plan: negative stride");
  if (g->m > INT32_MAX || g->n > INT32_MAX || g->k > INT32_MAX || g->batch > INT32_MAX)
    return emk_errf(err, errlen, EM_ERR_UNSUPPORTED, "sizes m %lld, n %lld, k %lld, batch %lld: "
               "cuBLASLt takes at most %d each", (long long)g->m, (long long)g->n,
               (long long)g->k, (long long)g->batch, INT32_MAX);
  p->batch = g->batch;
  /* C: column-major as it is (no swap), or row-major: then compute C^T. */
  int t;
  int64_t rows, cols, ld;
  if (!emk_lt_operand(g->m, g->n, g->c_rs, g->c_cs, &t, &rows, &cols, &ld))
    return emk_errf(err, errlen, EM_ERR_UNSUPPORTED, "result C (%lld x %lld, element strides %lld "
               "and %lld) is no cuBLASLt matrix: one stride must be 1 and the other at least "
               "the size it steps over", (long long)g->m, (long long)g->n, (long long)g->c_rs,
               (long long)g->c_cs);
  p->swap = t;
  p->c.trans = 0;
  p->c.rows = rows, p->c.cols = cols, p->c.ld = ld;
  p->c.batch_stride = g->batch > 1 ? g->c_bs : 0;
  p->k = g->k;
  if (!p->swap) {
    p->m = g->m, p->n = g->n;
    if (g->k == 0) return EM_OK;
    em_status st = plan_operand("A", g->m, g->k, g->a_rs, g->a_cs, g->a_bs, g->batch, 0, &p->a,
                                err, errlen);
    if (!st) st = plan_operand("B", g->k, g->n, g->b_rs, g->b_cs, g->b_bs, g->batch, 0, &p->b,
                               err, errlen);
    return st;
  }
  /* C^T (n x m) = B^T (n x k) A^T (k x m): the views transposed swap their strides */
  p->m = g->n, p->n = g->m;
  if (g->k == 0) return EM_OK;
  em_status st = plan_operand("B", g->n, g->k, g->b_cs, g->b_rs, g->b_bs, g->batch, 1, &p->a,
                              err, errlen);
  if (!st) st = plan_operand("A", g->k, g->m, g->a_cs, g->a_rs, g->a_bs, g->batch, 1, &p->b,
                             err, errlen);
  return st;
}

#if !defined(EMK_HAVE_CUDART_H) || !defined(EMK_HAVE_CUBLASLT_H)
/* == Without the cuBLASLt headers: the plan only ========================================== */
em_status emk_lt_gemm_check(emk_libs *L, em_dtype dtype, const emk_lt_args *g, int allow_tf32,
                            emk_lt_readback *out, char *err, size_t errlen) {
  memset(out, 0, sizeof *out);
  return emk_errf(err, errlen, EM_ERR_UNSUPPORTED, "cuBLASLt: ember was built without cublasLt.h");
}
int emk_real_gemm_plans(emk_runtime *rt, emk_plan_cache_stats *out) {
  (void)rt, (void)out;
  return -1;
}
#endif

#ifdef EMK_HAVE_CUDART_H
#include "real.h"

#ifndef EMK_HAVE_CUBLASLT_H
em_status emr_gemm(emk_runtime *rt, emk_stream *s, em_dtype dtype, int64_t m, int64_t n,
                   int64_t k, int64_t batch,
                   const void *a, int64_t a_rs, int64_t a_cs, int64_t a_bs,
                   const void *b, int64_t b_rs, int64_t b_cs, int64_t b_bs,
                   void *c, int64_t c_rs, int64_t c_cs, int64_t c_bs, int allow_tf32) {
  return emr_fail((emr *)rt->impl, EM_ERR_UNSUPPORTED,
                  "gemm: ember was built without cublasLt.h (no cuBLASLt)");
}
void emr_gemm_stream_done(emr *R, emk_stream *s) { (void)R, (void)s; }
void emr_gemm_close(emr *R) { (void)R; }
#else
/* == 2. Descriptors ======================================================================== */

_Static_assert((int)EMK_LT_COMPUTE_32F == (int)CUBLAS_COMPUTE_32F &&
               (int)EMK_LT_COMPUTE_64F == (int)CUBLAS_COMPUTE_64F &&
               (int)EMK_LT_COMPUTE_32F_FAST_TF32 == (int)CUBLAS_COMPUTE_32F_FAST_TF32 &&
               (int)EMK_LT_R_32F == (int)CUDA_R_32F && (int)EMK_LT_R_64F == (int)CUDA_R_64F &&
               (int)EMK_LT_R_16F == (int)CUDA_R_16F && (int)EMK_LT_R_16BF == (int)CUDA_R_16BF &&
               (int)EMK_LT_ORDER_COL == (int)CUBLASLT_ORDER_COL &&
               (int)EMK_LT_OP_N == (int)CUBLAS_OP_N && (int)EMK_LT_OP_T == (int)CUBLAS_OP_T,
               "gemm_lt.h's numbers are cuBLASLt's");

enum { WORKSPACE_BYTES = 32 << 20, LT_PLANS = 64 };

typedef struct lt_objs {
  cublasLtMatmulDesc_t desc;
  cublasLtMatrixLayout_t lay[3];     /* cuBLASLt's A, B, C (C is also D) */
} lt_objs;

static em_status lt_say(const emk_cublaslt_fns *f, cublasStatus_t s, const char *call,
                        char *err, size_t errlen) {
  em_status code = s == CUBLAS_STATUS_ALLOC_FAILED ? EM_ERR_NOMEM
                 : s == CUBLAS_STATUS_NOT_SUPPORTED ? EM_ERR_UNSUPPORTED
                 : s == CUBLAS_STATUS_INVALID_VALUE ? EM_ERR_ARG : EM_ERR_DEVICE;
  return emk_errf(err, errlen, code, "cuBLASLt: %s: %s (%s)", call, f->cublasLtGetStatusName(s),
             f->cublasLtGetStatusString(s));
}

static void lt_free(const emk_cublaslt_fns *f, lt_objs *o) {
  for (int i = 0; i < 3; i++)
    if (o->lay[i]) f->cublasLtMatrixLayoutDestroy(o->lay[i]);
  if (o->desc) f->cublasLtMatmulDescDestroy(o->desc);
  memset(o, 0, sizeof *o);
}

static cudaDataType_t data_type(em_dtype dt) {
  switch (dt) {
  case EM_FLOAT64: return CUDA_R_64F;
  case EM_FLOAT16: return CUDA_R_16F;
  case EM_BFLOAT16: return CUDA_R_16BF;
  default: return CUDA_R_32F;
  }
}

/* The descriptor and the layouts of plan p (k >= 1); on failure nothing is left. */
static em_status lt_build(const emk_cublaslt_fns *f, em_dtype dt, const emk_lt_plan *p,
                          int allow_tf32, lt_objs *o, char *err, size_t errlen) {
  memset(o, 0, sizeof *o);
  cublasComputeType_t ct = dt == EM_FLOAT64 ? CUBLAS_COMPUTE_64F
                         : dt == EM_FLOAT32 && allow_tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32
                         : CUBLAS_COMPUTE_32F;
  cudaDataType_t scale = dt == EM_FLOAT64 ? CUDA_R_64F : CUDA_R_32F, type = data_type(dt);
  cublasStatus_t s;
  const char *call = "cublasLtMatmulDescCreate";
  if ((s = f->cublasLtMatmulDescCreate(&o->desc, ct, scale))) goto bad;
  cublasOperation_t ta = p->a.trans ? CUBLAS_OP_T : CUBLAS_OP_N;
  cublasOperation_t tb = p->b.trans ? CUBLAS_OP_T : CUBLAS_OP_N;
  call = "cublasLtMatmulDescSetAttribute(TRANSA)";
  if ((s = f->cublasLtMatmulDescSetAttribute(o->desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta)))
    goto bad;
  call = "cublasLtMatmulDescSetAttribute(TRANSB)";
  if ((s = f->cublasLtMatmulDescSetAttribute(o->desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb)))
    goto bad;
  const emk_lt_matrix *mat[3] = {&p->a, &p->b, &p->c};
  for (int i = 0; i < 3; i++) {
    const emk_lt_matrix *x = mat[i];
    call = "cublasLtMatrixLayoutCreate";
    if ((s = f->cublasLtMatrixLayoutCreate(&o->lay[i], type, (uint64_t)x->rows,
                                           (uint64_t)x->cols, x->ld)))
      goto bad;
    if (p->batch > 1) {
      int32_t count = (int32_t)p->batch;
      int64_t off = x->batch_stride;
      call = "cublasLtMatrixLayoutSetAttribute(BATCH_COUNT)";
      if ((s = f->cublasLtMatrixLayoutSetAttribute(o->lay[i], CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT,
                                                    &count, sizeof count)))
        goto bad;
      call = "cublasLtMatrixLayoutSetAttribute(STRIDED_BATCH_OFFSET)";
      if ((s = f->cublasLtMatrixLayoutSetAttribute(
               o->lay[i], CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &off, sizeof off)))
        goto bad;
    }
  }
  return EM_OK;
bad:
  lt_free(f, o);
  return lt_say(f, s, call, err, errlen);
}

/* Reads one attribute of exactly sizeof *dst bytes. */
#define GET(getter, obj, attr, dst) do { \
    size_t w_ = 0; \
    cublasStatus_t s_ = f->getter(obj, attr, dst, sizeof *(dst), &w_); \
    if (s_) { st = lt_say(f, s_, #getter "(" #attr ")", err, errlen); goto done; } \
    if (w_ != sizeof *(dst)) { \
      st = emk_errf(err, errlen, EM_ERR_INTERNAL, "cuBLASLt: %s(%s) wrote %zu bytes, expected %zu", \
               #getter, #attr, w_, sizeof *(dst)); \
      goto done; \
    } \
  } while (0)

em_status emk_lt_gemm_check(emk_libs *L, em_dtype dtype, const emk_lt_args *g, int allow_tf32,
                            emk_lt_readback *out, char *err, size_t errlen) {
  memset(out, 0, sizeof *out);
  const emk_cublaslt_fns *f;
  em_status st = emk_libs_cublaslt(L, &f, err, errlen);
  if (st) return st;
  if (g->k < 1) return emk_errf(err, errlen, EM_ERR_ARG, "emk_lt_gemm_check: k must be >= 1");
  emk_lt_plan p;
  if ((st = emk_lt_plan_gemm(g, &p, err, errlen))) return st;
  lt_objs o;
  if ((st = lt_build(f, dtype, &p, allow_tf32, &o, err, errlen))) return st;
  out->swap = p.swap;
  GET(cublasLtMatmulDescGetAttribute, o.desc, CUBLASLT_MATMUL_DESC_TRANSA, &out->trans_a);
  GET(cublasLtMatmulDescGetAttribute, o.desc, CUBLASLT_MATMUL_DESC_TRANSB, &out->trans_b);
  GET(cublasLtMatmulDescGetAttribute, o.desc, CUBLASLT_MATMUL_DESC_COMPUTE_TYPE, &out->compute_type);
  GET(cublasLtMatmulDescGetAttribute, o.desc, CUBLASLT_MATMUL_DESC_SCALE_TYPE, &out->scale_type);
  emk_lt_layout_back *back[3] = {&out->a, &out->b, &out->c};
  for (int i = 0; i < 3; i++) {
    emk_lt_layout_back *b = back[i];
    GET(cublasLtMatrixLayoutGetAttribute, o.lay[i], CUBLASLT_MATRIX_LAYOUT_TYPE, &b->type);
    GET(cublasLtMatrixLayoutGetAttribute, o.lay[i], CUBLASLT_MATRIX_LAYOUT_ORDER, &b->order);
    GET(cublasLtMatrixLayoutGetAttribute, o.lay[i], CUBLASLT_MATRIX_LAYOUT_ROWS, &b->rows);
    GET(cublasLtMatrixLayoutGetAttribute, o.lay[i], CUBLASLT_MATRIX_LAYOUT_COLS, &b->cols);
    GET(cublasLtMatrixLayoutGetAttribute, o.lay[i], CUBLASLT_MATRIX_LAYOUT_LD, &b->ld);
    GET(cublasLtMatrixLayoutGetAttribute, o.lay[i], CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT,
        &b->batch_count);
    GET(cublasLtMatrixLayoutGetAttribute, o.lay[i], CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET,
        &b->batch_offset);
  }
  st = EM_OK;
done:
  lt_free(f, &o);
  return st;
}

/* == 3. The call ============================================================================= */

/* cuBLASLt, loaded now if needed; under R->mu. */
static em_status lt_load_locked(emr *R) {
  if (R->lt_state == 0) {
    const emk_cublaslt_fns *f = NULL;
    if (emk_libs_cublaslt(R->L, &f, R->lt_why, sizeof R->lt_why) == EM_OK) {
      R->lt = f;
      R->lt_state = 1;
    } else {
      R->lt_state = -1;
    }
  }
  return R->lt_state > 0 ? EM_OK : EM_ERR_UNSUPPORTED;
}

/* A gemm's plan (plan_cache.h): the objects and the algorithm the heuristic chose. */
typedef struct lt_plan {
  lt_objs o;
  cublasLtMatmulAlgo_t algo;
} lt_plan;

static void lt_plan_free(void *ud, void *plan) {
  emr *R = (emr *)ud;
  lt_free(R->lt, &((lt_plan *)plan)->o);
  free(plan);
}

int emk_real_gemm_plans(emk_runtime *rt, emk_plan_cache_stats *out) {
  if (!rt || strcmp(rt->ops->name, "cuda") != 0) return -1;
  emr *R = (emr *)rt->impl;
  pthread_mutex_lock(&R->mu);
  emk_plan_cache *c = R->lt_plans;
  pthread_mutex_unlock(&R->mu);
  if (!c) return -1;
  emk_plan_cache_stats_get(c, out);
  return 0;
}

/* The cuBLASLt handle of the current device dev (made now if needed), and the
** runtime's plan table (made with the first handle). */
static em_status lt_handle(emr *R, int dev, cublasLtHandle_t *out, const char *what) {
  em_status st = EM_OK;
  pthread_mutex_lock(&R->mu);
  if (lt_load_locked(R)) {
    st = emr_fail(R, EM_ERR_UNSUPPORTED, "%s: %s", what, R->lt_why);
  } else if (!R->lt_handle[dev]) {
    cublasLtHandle_t h = NULL;
    cublasStatus_t s = R->lt->cublasLtCreate(&h);
    if (s) {
      char why[300];
      lt_say(R->lt, s, "cublasLtCreate", why, sizeof why);
      st = emr_fail(R, EM_ERR_DEVICE, "%s: %s", what, why);
    } else {
      R->lt_handle[dev] = h;
    }
  }
  if (!st && !R->lt_plans)           /* no memory for it: every gemm builds its plan */
    R->lt_plans = emk_plan_cache_new(LT_PLANS, sizeof(emk_lt_key), lt_plan_free, R);
  *out = (cublasLtHandle_t)R->lt_handle[dev];
  pthread_mutex_unlock(&R->mu);
  return st;
}

/* The stream's workspace, allocated at its first gemm; none when the device is full. */
static void stream_workspace(emr *R, emk_stream *s) {
  pthread_mutex_lock(&R->mu);
  if (!s->ws_tried) {
    s->ws_tried = 1;
    void *p = NULL;
    if (R->f->cudaMalloc(&p, WORKSPACE_BYTES) == cudaSuccess) {
      s->ws = p;
      s->ws_size = WORKSPACE_BYTES;
    } else {
      (void)R->f->cudaGetLastError();
    }
  }
  pthread_mutex_unlock(&R->mu);
}

void emr_gemm_stream_done(emr *R, emk_stream *s) {
  if (s->ws && R->f->cudaFree(s->ws) != cudaSuccess) (void)R->f->cudaGetLastError();
  s->ws = NULL;
  s->ws_size = 0;
}

void emr_gemm_close(emr *R) {
  emk_plan_cache_delete(R->lt_plans);   /* the descriptors need no device */
  R->lt_plans = NULL;
  for (int d = 0; d < EMK_MAX_DEVICES; d++) {
    if (!R->lt_handle[d]) continue;
    if (R->f->cudaSetDevice(d) == cudaSuccess)
      R->lt->cublasLtDestroy((cublasLtHandle_t)R->lt_handle[d]);
    R->lt_handle[d] = NULL;
  }
}

/* The largest power of two (<= 256) that divides the address. */
static uint32_t alignment(const void *p) {
  uintptr_t x = (uintptr_t)p;
  uintptr_t a = x & (~x + 1);
  return !x || a > 256 ? 256 : (uint32_t)a;
}

/* k = 0: C = 0, each batch matrix as rows x cols of ld (cuBLASLt's view of it). */
static em_status zero_c(emr *R, emk_stream *s, const emk_lt_plan *p, void *c, size_t es,
                        const char *what) {
  size_t pitch = (size_t)p->c.ld * es, width = (size_t)p->c.rows * es;
  int64_t nmat = p->batch, height = p->c.cols;
  if (p->batch > 1 && p->c.batch_stride == p->c.ld * p->c.cols) {
    height *= p->batch;      /* consecutive matrices: one 2-D memset */
    nmat = 1;
  } else if (p->batch > 1 && p->c.batch_stride == 0) {
    nmat = 1;
  }
  for (int64_t i = 0; i < nmat; i++) {
    char *ci = (char *)c + (size_t)(i * p->c.batch_stride) * es;
    cudaError_t e = R->f->cudaMemset2DAsync(ci, pitch, 0, width, (size_t)height, s->s);
    if (e != cudaSuccess) return emr_cuda(R, e, what, s->dev, "cudaMemset2DAsync (k = 0)");
  }
  return EM_OK;
}

static em_status lt_code(cublasStatus_t ls) {
  return ls == CUBLAS_STATUS_ALLOC_FAILED ? EM_ERR_NOMEM
       : ls == CUBLAS_STATUS_NOT_SUPPORTED ? EM_ERR_UNSUPPORTED
       : ls == CUBLAS_STATUS_INVALID_VALUE ? EM_ERR_ARG : EM_ERR_DEVICE;
}

/* A new plan for p: the objects, and the heuristic's best algorithm for operands
** of alignments al (A, B, C, D) with a workspace of ws bytes. */
static em_status plan_build(emr *R, cublasLtHandle_t h, em_dtype dtype, const emk_lt_plan *p,
                            int allow_tf32, const uint32_t al[4], uint64_t ws, lt_plan **out,
                            const char *what) {
  const emk_cublaslt_fns *f = R->lt;
  char why[EMK_ERRMSG_SIZE];
  *out = NULL;
  lt_plan *plan = (lt_plan *)calloc(1, sizeof *plan);
  if (!plan) return emr_fail(R, EM_ERR_NOMEM, "%s: out of host memory for its plan", what);
  em_status st = lt_build(f, dtype, p, allow_tf32, &plan->o, why, sizeof why);
  if (st) {
    free(plan);
    return emr_fail(R, st, "%s: %s", what, why);
  }
  cublasLtMatmulPreference_t pref = NULL;
  cublasStatus_t ls;
  const char *call = "cublasLtMatmulPreferenceCreate";
  if ((ls = f->cublasLtMatmulPreferenceCreate(&pref))) goto bad;
  call = "cublasLtMatmulPreferenceSetAttribute(MAX_WORKSPACE_BYTES)";
  if ((ls = f->cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                    &ws, sizeof ws)))
    goto bad;
  static const cublasLtMatmulPreferenceAttributes_t al_attr[4] = {
    CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
    CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES};
  call = "cublasLtMatmulPreferenceSetAttribute(MIN_ALIGNMENT)";
  for (int i = 0; i < 4; i++)
    if ((ls = f->cublasLtMatmulPreferenceSetAttribute(pref, al_attr[i], &al[i], sizeof al[i])))
      goto bad;
  cublasLtMatmulHeuristicResult_t res;
  memset(&res, 0, sizeof res);
  int found = 0;
  call = "cublasLtMatmulAlgoGetHeuristic";
  if ((ls = f->cublasLtMatmulAlgoGetHeuristic(h, plan->o.desc, plan->o.lay[0], plan->o.lay[1],
                                              plan->o.lay[2], plan->o.lay[2], pref, 1, &res,
                                              &found)))
    goto bad;
  f->cublasLtMatmulPreferenceDestroy(pref);
  if (found < 1) {
    lt_plan_free(R, plan);
    return emr_fail(R, EM_ERR_UNSUPPORTED, "%s: cuBLASLt has no algorithm for it (operand "
                    "alignments %u, %u, %u bytes; workspace %llu bytes)", what, al[0], al[1],
                    al[2], (unsigned long long)ws);
  }
  plan->algo = res.algo;
  *out = plan;
  return EM_OK;
bad:
  if (pref) f->cublasLtMatmulPreferenceDestroy(pref);
  lt_plan_free(R, plan);
  lt_say(f, ls, call, why, sizeof why);
  return emr_fail(R, lt_code(ls), "%s: %s", what, why);
}

em_status emr_gemm(emk_runtime *rt, emk_stream *s, em_dtype dtype, int64_t m, int64_t n,
                   int64_t k, int64_t batch,
                   const void *a, int64_t a_rs, int64_t a_cs, int64_t a_bs,
                   const void *b, int64_t b_rs, int64_t b_cs, int64_t b_bs,
                   void *c, int64_t c_rs, int64_t c_cs, int64_t c_bs, int allow_tf32) {
  emr *R = (emr *)rt->impl;
  if (dtype != EM_FLOAT32 && dtype != EM_FLOAT64 && dtype != EM_FLOAT16 && dtype != EM_BFLOAT16)
    return emr_fail(R, EM_ERR_DTYPE, "gemm: dtype %s (float32, float64, float16 or bfloat16 "
                    "only)", em_dtype_name(dtype));
  if (m < 0 || n < 0 || k < 0 || batch < 0)
    return emr_fail(R, EM_ERR_ARG, "gemm: negative size (m %lld, n %lld, k %lld, batch %lld)",
                    (long long)m, (long long)n, (long long)k, (long long)batch);
  if (a_rs < 0 || a_cs < 0 || a_bs < 0 || b_rs < 0 || b_cs < 0 || b_bs < 0 || c_rs < 0 ||
      c_cs < 0 || c_bs < 0)
    return emr_fail(R, EM_ERR_ARG, "gemm: negative stride");
  em_status st = emr_check_stream(R, s, "gemm");
  if (st) return st;
  if (m == 0 || n == 0 || batch == 0) return EM_OK;
  if (!c || (k && (!a || !b))) return emr_fail(R, EM_ERR_ARG, "gemm: NULL operand");
  char what[160], why[EMK_ERRMSG_SIZE];
  snprintf(what, sizeof what, "gemm (cuda:%d, %s, %lld x %lld x %lld, batch %lld)", s->dev,
           em_dtype_name(dtype), (long long)m, (long long)n, (long long)k, (long long)batch);
  emk_lt_args g = {m, n, k, batch, a_rs, a_cs, a_bs, b_rs, b_cs, b_bs, c_rs, c_cs, c_bs};
  emk_lt_plan p;
  if ((st = emk_lt_plan_gemm(&g, &p, why, sizeof why)))
    return emr_fail(R, st, "%s: %s", what, why);
  size_t es = em_dtype_size(dtype);
  if (k == 0) return zero_c(R, s, &p, c, es, what);

  cublasLtHandle_t h;
  if ((st = lt_handle(R, s->dev, &h, what))) return st;
  stream_workspace(R, s);
  const emk_cublaslt_fns *f = R->lt;
  const void *pa = p.swap ? b : a, *pb = p.swap ? a : b;
  uint64_t ws = s->ws_size;
  uint32_t al[4] = {alignment(pa), alignment(pb), alignment(c), alignment(c)};
  emk_lt_key key;
  emk_lt_key_make(&key, &p, dtype, allow_tf32, s->dev, al, ws);
  emk_plan_cache *table = R->lt_plans;
  lt_plan *plan = table ? (lt_plan *)emk_plan_cache_take(table, &key) : NULL;
  int kept = plan != NULL;
  if (!plan && (st = plan_build(R, h, dtype, &p, allow_tf32, al, ws, &plan, what)))
    return st;
  if (!kept && table) kept = emk_plan_cache_add(table, &key, plan);
  float one_f = 1, zero_f = 0;
  double one_d = 1, zero_d = 0;
  const void *alpha = dtype == EM_FLOAT64 ? (const void *)&one_d : (const void *)&one_f;
  const void *beta = dtype == EM_FLOAT64 ? (const void *)&zero_d : (const void *)&zero_f;
  cublasStatus_t ls = f->cublasLtMatmul(h, plan->o.desc, alpha, pa, plan->o.lay[0], pb,
                                        plan->o.lay[1], beta, c, plan->o.lay[2], c,
                                        plan->o.lay[2], &plan->algo, s->ws, s->ws_size, s->s);
  if (kept) emk_plan_cache_give_back(table, plan);
  else lt_plan_free(R, plan);
  if (ls) {
    lt_say(f, ls, "cublasLtMatmul", why, sizeof why);
    return emr_fail(R, lt_code(ls), "%s: %s", what, why);
  }
  return EM_OK;
}
#endif /* EMK_HAVE_CUBLASLT_H */
#endif /* EMK_HAVE_CUDART_H */

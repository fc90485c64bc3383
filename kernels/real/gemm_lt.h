/*
** gemm_lt.h -- how the runtime's strided GEMM (runtime.h: C = A x B over row and
** column element strides) maps onto cuBLASLt's column-major matmul, as pure
** arithmetic that needs no GPU and no CUDA header, so that it is tested on every
** machine (tests/c/test_cuda_real.c) and k_matmul.c can ask, before it calls
** gemm, whether an operand must first be copied.
**
** The mapping. cuBLASLt computes D (M x N) = op(A) (M x K) op(B) (K x N) on
** column-major matrices: element (i, j) of a stored rows x cols matrix is at
** i + j*ld, with ld >= rows. A view X (r x c) with strides (rs, cs) is such a
** matrix in one of two ways:
**   - rs == 1: X itself, column-major, ld = cs: op N, stored r x c;
**   - cs == 1: X^T is column-major with ld = rs, so X = op(X^T) with op T,
**     stored c x r.
** (A dim of size 1 makes its stride irrelevant.) An operand with neither unit
** stride, or whose other stride is smaller than the dim it must step over (rows
** that overlap, a broadcast stride 0 inside the matrix), has no layout: such a
** gemm is EM_ERR_UNSUPPORTED, and k_matmul.c copies the operand first.
** D has no op, so C must be column-major itself; a row-major C (the usual case)
** is handled by computing the transpose, C^T (n x m) = B^T (n x k) A^T (k x m):
** then cuBLASLt's A is our B viewed transposed (strides swapped), its B our A.
** The batch stride of each operand becomes its layout's strided batch offset (0
** reuses one matrix: broadcast), and every layout gets the batch count.
*/
#ifndef EMBER_KERNELS_REAL_GEMM_LT_H
#define EMBER_KERNELS_REAL_GEMM_LT_H
#include "ember.h"
#include <stddef.h>
#include <stdint.h>
#include <string.h>

/* Whether a rows x cols view with element strides (rs, cs) is a column-major
** cuBLASLt operand: 1 with *trans (0 = N, 1 = T), the stored rows x cols and the
** leading dimension; else 0. */
static inline int emk_lt_operand(int64_t rows, int64_t cols, int64_t rs, int64_t cs,
                                 int *trans, int64_t *srows, int64_t *scols, int64_t *ld) {
  int64_t r1 = rows > 1 ? rows : 1, c1 = cols > 1 ? cols : 1;
  if ((rs == 1 || rows <= 1) && (cols <= 1 || cs >= r1)) {     /* column-major: N */
    *trans = 0, *srows = rows, *scols = cols, *ld = cols <= 1 ? r1 : cs;
    return 1;
  }
  if ((cs == 1 || cols <= 1) && (rows <= 1 || rs >= c1)) {     /* row-major: T */
    *trans = 1, *srows = cols, *scols = rows, *ld = rows <= 1 ? c1 : rs;
    return 1;
  }
  return 0;
}

/* The same question without the answer's details (k_matmul.c). */
static inline int emk_lt_operand_ok(int64_t rows, int64_t cols, int64_t rs, int64_t cs) {
  int t;
  int64_t a, b, c;
  return emk_lt_operand(rows, cols, rs, cs, &t, &a, &b, &c);
}

/* The runtime's gemm arguments, sizes and element strides (runtime.h). */
typedef struct emk_lt_args {
  int64_t m, n, k, batch;
  int64_t a_rs, a_cs, a_bs, b_rs, b_cs, b_bs, c_rs, c_cs, c_bs;
} emk_lt_args;

/* One of cuBLASLt's three matrices: column-major, stored rows x cols. */
typedef struct emk_lt_matrix {
  int trans;                /* op: 0 N, 1 T (always 0 for C) */
  int64_t rows, cols, ld;
  int64_t batch_stride;     /* elements; 0 = one matrix for every batch index */
} emk_lt_matrix;

typedef struct emk_lt_plan {
  int swap;                 /* 1: computes C^T = B^T A^T, so cuBLASLt's A is our B */
  int64_t m, n, k;          /* cuBLASLt's: D (m x n) = op(A) (m x k) op(B) (k x n) */
  int64_t batch;
  emk_lt_matrix a, b, c;    /* cuBLASLt's A, B and C (= D). With k = 0 only c is set. */
} emk_lt_plan;

/* The plan for a gemm with m, n, batch >= 1 (k >= 0): EM_OK, or
** EM_ERR_UNSUPPORTED with a message naming the operand that has no layout (or a
** size beyond int32, which cuBLASLt does not take), or EM_ERR_ARG for negative
** sizes or strides. No GPU, no library. */
em_status emk_lt_plan_gemm(const emk_lt_args *g, emk_lt_plan *out, char *err, size_t errlen);

/* The plan cache's key of a gemm (gemm_real.c, plan_cache.h): everything the
** descriptor, the layouts and the heuristic's answer depend on -- the plan (sizes,
** transposes, leading dimensions, batch offsets), the dtype, TF32 (float32 only:
** other dtypes ignore it, so their calls share a plan), the device, the operands'
** pointer alignments and the workspace the heuristic may use. Two gemms with the
** same key can run the same cuBLASLt algorithm on the same objects. */
typedef struct emk_lt_key {
  int32_t dtype, tf32, dev, swap;
  int64_t m, n, k, batch;
  int64_t mat[3][5];        /* A, B, C: trans, rows, cols, ld, batch_stride */
  uint32_t align[4];        /* A, B, C, D: bytes */
  uint64_t workspace;
} emk_lt_key;

static inline void emk_lt_key_make(emk_lt_key *key, const emk_lt_plan *p, em_dtype dt,
                                   int allow_tf32, int dev, const uint32_t align[4],
                                   uint64_t workspace) {
  memset(key, 0, sizeof *key);        /* padding too: keys are compared as bytes */
  key->dtype = (int32_t)dt;
  key->tf32 = dt == EM_FLOAT32 && allow_tf32;
  key->dev = dev;
  key->swap = p->swap;
  key->m = p->m, key->n = p->n, key->k = p->k, key->batch = p->batch;
  const emk_lt_matrix *x[3] = {&p->a, &p->b, &p->c};
  for (int i = 0; i < 3; i++) {
    key->mat[i][0] = x[i]->trans, key->mat[i][1] = x[i]->rows, key->mat[i][2] = x[i]->cols;
    key->mat[i][3] = x[i]->ld, key->mat[i][4] = x[i]->batch_stride;
  }
  for (int i = 0; i < 4; i++) key->align[i] = align[i];
  key->workspace = workspace;
}

/* What cuBLASLt's descriptor and layouts say, read back after they were built by
** the same code as the real gemm's (gemm_real.c): emk_lt_gemm_check builds them
** for dtype and g (k >= 1), reads every attribute ember sets, destroys them.
** Needs cuBLASLt loaded, not a GPU. The numbers are cuBLASLt's own: */
enum {
  EMK_LT_COMPUTE_32F = 68, EMK_LT_COMPUTE_32F_FAST_TF32 = 77, EMK_LT_COMPUTE_64F = 70,
  EMK_LT_R_32F = 0, EMK_LT_R_64F = 1, EMK_LT_R_16F = 2, EMK_LT_R_16BF = 14,
  EMK_LT_ORDER_COL = 0, EMK_LT_OP_N = 0, EMK_LT_OP_T = 1
};

typedef struct emk_lt_layout_back {
  uint64_t rows, cols;
  int64_t ld;
  int32_t order;            /* cublasLtOrder_t */
  uint32_t type;            /* cudaDataType */
  int32_t batch_count;
  int64_t batch_offset;     /* CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET */
} emk_lt_layout_back;

typedef struct emk_lt_readback {
  int swap;                 /* the plan's: which of our operands is cuBLASLt's A */
  int32_t trans_a, trans_b, compute_type, scale_type;
  emk_lt_layout_back a, b, c;   /* cuBLASLt's A, B, and C (also D's) */
} emk_lt_readback;

typedef struct emk_libs emk_libs;
em_status emk_lt_gemm_check(emk_libs *L, em_dtype dtype, const emk_lt_args *g, int allow_tf32,
                            emk_lt_readback *out, char *err, size_t errlen);

#endif

/*
** test_cuda_real.c -- the real device runtime (kernels/real/runtime_real.c,
** launch_real.c, gemm_real.c), as far as a machine without a GPU can run it, and
** all of it where one is found:
**   - emk_real_open without a driver fails cleanly: EM_ERR_DEVICE, a message
**     that names the driver, nothing left behind (run under ASan for leaks);
**   - the gemm plan (gemm_lt.h): row-major, transposed, column-major, padded,
**     batched and broadcast operands map to the cuBLASLt layouts the math
**     requires (checked field by field for known cases), and for hundreds of
**     random stride layouts, a CPU model of cuBLASLt's column-major matmul fed
**     with those layouts computes exactly the strided product runtime.h defines;
**     operands with no unit stride are refused with a message naming them;
**   - the same through real cuBLASLt descriptors and layouts, read back with
**     cublasLt*GetAttribute (no GPU needed), with the compute, scale and data
**     types of each dtype;
**   - the fatbins embedded in libember: one per kernels/k_*.cu, a real fatbin
**     each, holding the C-linkage symbol k_xxx_emk_dev of every kernel its
**     source defines (and no other module holding it);
**   - the plan table (plan_cache.h) that keeps gemm and convolution plans: hits,
**     misses, least-recently-used eviction, a plan out to one caller is neither
**     handed to another nor evicted, every plan freed at the end; and the gemm
**     plan's key (gemm_lt.h): equal for equal gemms, distinct for distinct
**     layouts, batch strides, TF32 (float32 only), devices, alignments;
**   - with a GPU: devices, memory, copies, events, host callbacks, gemm against
**     a CPU product (a repeated gemm a plan-table hit), launch errors. Without
**     one each is a counted skip with the reason.
*/
#include "check.h"
#include "../../kernels/runtime.h"
#include "../../kernels/real/libs.h"
#include "../../kernels/real/gemm_lt.h"
#include "../../kernels/real/fatbins.h"
#include "../../kernels/real/plan_cache.h"
#include <glob.h>
#include <stdint.h>
#include <unistd.h>

static char why[2048];

/* -- Opening without a driver ------------------------------------------------------------- */

static emk_runtime *try_open(void) {
  emk_runtime *rt = NULL;
  char err[EMK_ERRMSG_SIZE];
  if (emk_real_open(&rt, err, sizeof err) == EM_OK) return rt;
  return NULL;
}

static void test_open(void *unused) {
  emk_libs *L = NULL;
  int n = 0;
  int have_driver = 0;
  if (emk_libs_open(&L, why, sizeof why) == EM_OK) {
    have_driver = emk_libs_device_count(L, &n, why, sizeof why) == EM_OK && n > 0;
    emk_libs_close(L);
  }
  for (int round = 0; round < 3; round++) {     /* repeated: leaks would add up */
    emk_runtime *rt = (emk_runtime *)&why;       /* must be overwritten */
    char err[EMK_ERRMSG_SIZE] = "";
    em_status st = emk_real_open(&rt, err, sizeof err);
    if (have_driver) {
      CHECK(st == EM_OK, "a driver and %d devices, yet: %s", n, err);
      if (st == EM_OK) {
        CHECK(rt && rt->ops && strcmp(rt->ops->name, "cuda") == 0, "the real runtime");
        CHECK(rt->ops->device_count(rt) == (n < EMK_MAX_DEVICES ? n : EMK_MAX_DEVICES),
              "device count");
        rt->ops->close(rt);
      }
      continue;
    }
    CHECK(st == EM_ERR_DEVICE, "no driver: EM_ERR_DEVICE, got %d (%s)", (int)st, err);
    CHECK(rt == NULL, "no runtime is returned");
    CHECK(chk_msg_has(err, "driver", NULL) || chk_msg_has(err, "CUDA runtime", NULL),
          "the message says why: %s", err);
    if (round == 0) printf("     %s\n", err);
  }
  /* a NULL output is an argument error, not a crash */
  char err[64];
  CHECK(emk_real_open(NULL, err, sizeof err) != EM_OK, "NULL output refused");
}

/* -- A CPU model of cuBLASLt ------------------------------------------------------------ */

/* Elements spanned by batch matrices r x c with strides (all sizes >= 1). */
static int64_t span(int64_t batch, int64_t r, int64_t c, int64_t rs, int64_t cs, int64_t bs) {
  return (batch - 1) * bs + (r - 1) * rs + (c - 1) * cs + 1;
}

/* runtime.h's definition: C[i] = A[i] B[i] with element strides. */
static void direct(const emk_lt_args *g, const double *A, const double *B, double *C) {
  for (int64_t bi = 0; bi < g->batch; bi++)
    for (int64_t i = 0; i < g->m; i++)
      for (int64_t j = 0; j < g->n; j++) {
        double s = 0;
        for (int64_t q = 0; q < g->k; q++)
          s += A[bi * g->a_bs + i * g->a_rs + q * g->a_cs] * B[bi * g->b_bs + q * g->b_rs + j * g->b_cs];
        C[bi * g->c_bs + i * g->c_rs + j * g->c_cs] = s;
      }
}

/* cuBLASLt's matmul as its descriptor and column-major layouts r say: D = op(A)
** op(B) on each batch index, with r's A fed our B when r->swap. 0 (and why)
** when the layouts do not fit together or reach outside the buffers. */
static int lt_model(const emk_lt_readback *r, int64_t batch, const double *A, int64_t na,
                    const double *B, int64_t nb, double *C, int64_t nc) {
  const double *la = r->swap ? B : A, *lb = r->swap ? A : B;
  int64_t nla = r->swap ? nb : na, nlb = r->swap ? na : nb;
  int64_t M = (int64_t)r->c.rows, N = (int64_t)r->c.cols;
  int64_t am = (int64_t)(r->trans_a ? r->a.cols : r->a.rows);
  int64_t ak = (int64_t)(r->trans_a ? r->a.rows : r->a.cols);
  int64_t bk = (int64_t)(r->trans_b ? r->b.cols : r->b.rows);
  int64_t bn = (int64_t)(r->trans_b ? r->b.rows : r->b.cols);
  if (am != M || bn != N || ak != bk) {
    snprintf(why, sizeof why, "dims do not chain: op(A) %lldx%lld, op(B) %lldx%lld, D %lldx%lld",
             (long long)am, (long long)ak, (long long)bk, (long long)bn, (long long)M,
             (long long)N);
    return 0;
  }
  if (r->a.ld < (int64_t)r->a.rows || r->b.ld < (int64_t)r->b.rows ||
      r->c.ld < (int64_t)r->c.rows) {
    snprintf(why, sizeof why, "a leading dimension below its rows");
    return 0;
  }
  int64_t cb = r->c.batch_count > 0 ? r->c.batch_count : 1;
  if (cb != batch || r->a.batch_count != r->c.batch_count || r->b.batch_count != r->c.batch_count) {
    snprintf(why, sizeof why, "batch counts %d, %d, %d for a batch of %lld", r->a.batch_count,
             r->b.batch_count, r->c.batch_count, (long long)batch);
    return 0;
  }
  for (int64_t bi = 0; bi < batch; bi++)
    for (int64_t i = 0; i < M; i++)
      for (int64_t j = 0; j < N; j++) {
        double s = 0;
        for (int64_t q = 0; q < ak; q++) {
          int64_t ia = bi * r->a.batch_offset + (r->trans_a ? q + i * r->a.ld : i + q * r->a.ld);
          int64_t ib = bi * r->b.batch_offset + (r->trans_b ? j + q * r->b.ld : q + j * r->b.ld);
          if (ia < 0 || ia >= nla || ib < 0 || ib >= nlb) {
            snprintf(why, sizeof why, "reads outside its operands (A[%lld] of %lld, B[%lld] of "
                     "%lld)", (long long)ia, (long long)nla, (long long)ib, (long long)nlb);
            return 0;
          }
          s += la[ia] * lb[ib];
        }
        int64_t ic = bi * r->c.batch_offset + i + j * r->c.ld;
        if (ic < 0 || ic >= nc) {
          snprintf(why, sizeof why, "writes outside C ([%lld] of %lld)", (long long)ic,
                   (long long)nc);
          return 0;
        }
        C[ic] = s;
      }
  return 1;
}

/* The plan as the read-back record (what lt_build sets from it). */
static emk_lt_readback from_plan(const emk_lt_plan *p) {
  emk_lt_readback r;
  memset(&r, 0, sizeof r);
  r.swap = p->swap;
  r.trans_a = p->a.trans;
  r.trans_b = p->b.trans;
  const emk_lt_matrix *m[3] = {&p->a, &p->b, &p->c};
  emk_lt_layout_back *b[3] = {&r.a, &r.b, &r.c};
  for (int i = 0; i < 3; i++) {
    b[i]->rows = (uint64_t)m[i]->rows;
    b[i]->cols = (uint64_t)m[i]->cols;
    b[i]->ld = m[i]->ld;
    b[i]->batch_count = (int32_t)p->batch;
    b[i]->batch_offset = m[i]->batch_stride;
  }
  return r;
}

static uint64_t rng = 0x9E3779B97F4A7C15ull;
static int64_t rnd(int64_t n) {       /* 0 .. n-1 */
  rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
  return (int64_t)(rng % (uint64_t)n);
}

/* Strides for an r x c operand: row-major or column-major, maybe padded; the
** batch stride dense, padded, or 0 (broadcast) when allowed. */
static void pick_layout(int64_t r, int64_t c, int64_t batch, int allow_bcast, int64_t *rs,
                        int64_t *cs, int64_t *bs) {
  int64_t pad = rnd(3);
  if (rnd(2)) *rs = c + pad, *cs = 1;
  else *rs = 1, *cs = r + pad;
  int64_t one = span(1, r, c, *rs, *cs, 0);
  *bs = allow_bcast && batch > 1 && rnd(3) == 0 ? 0 : one + rnd(3);
}

/* Compares C of the model with the direct product; both start from the same
** sentinel, so the elements outside C must agree too. */
static int same(const double *x, const double *y, int64_t n) {
  for (int64_t i = 0; i < n; i++)
    if (x[i] != y[i]) {
      snprintf(why, sizeof why, "C[%lld]: %g by the layouts, %g by the definition",
               (long long)i, x[i], y[i]);
      return 0;
    }
  return 1;
}

/* One random gemm: the plan (and with L, cuBLASLt's read-back layouts) run on the
** model must give the direct product. */
static void random_case(emk_libs *L, int iter) {
  emk_lt_args g;
  g.m = 1 + rnd(5), g.n = 1 + rnd(5), g.k = 1 + rnd(5), g.batch = 1 + rnd(3);
  pick_layout(g.m, g.k, g.batch, 1, &g.a_rs, &g.a_cs, &g.a_bs);
  pick_layout(g.k, g.n, g.batch, 1, &g.b_rs, &g.b_cs, &g.b_bs);
  pick_layout(g.m, g.n, g.batch, 0, &g.c_rs, &g.c_cs, &g.c_bs);
  int64_t na = span(g.batch, g.m, g.k, g.a_rs, g.a_cs, g.a_bs);
  int64_t nb = span(g.batch, g.k, g.n, g.b_rs, g.b_cs, g.b_bs);
  int64_t nc = span(g.batch, g.m, g.n, g.c_rs, g.c_cs, g.c_bs);
  double *A = malloc(sizeof(double) * (size_t)na), *B = malloc(sizeof(double) * (size_t)nb);
  double *C1 = malloc(sizeof(double) * (size_t)nc), *C2 = malloc(sizeof(double) * (size_t)nc);
  for (int64_t i = 0; i < na; i++) A[i] = (double)(rnd(19) - 9);
  for (int64_t i = 0; i < nb; i++) B[i] = (double)(rnd(19) - 9);
  for (int64_t i = 0; i < nc; i++) C1[i] = C2[i] = -12345;
  direct(&g, A, B, C1);
  char desc[300];
  snprintf(desc, sizeof desc, "case %d: m %lld n %lld k %lld batch %lld; A (%lld,%lld,%lld) "
           "B (%lld,%lld,%lld) C (%lld,%lld,%lld)", iter, (long long)g.m, (long long)g.n,
           (long long)g.k, (long long)g.batch, (long long)g.a_rs, (long long)g.a_cs,
           (long long)g.a_bs, (long long)g.b_rs, (long long)g.b_cs, (long long)g.b_bs,
           (long long)g.c_rs, (long long)g.c_cs, (long long)g.c_bs);
  emk_lt_plan p;
  em_status st = emk_lt_plan_gemm(&g, &p, why, sizeof why);
  CHECK(st == EM_OK, "%s: %s", desc, why);
  if (st == EM_OK) {
    emk_lt_readback r = from_plan(&p);
    int ok = lt_model(&r, g.batch, A, na, B, nb, C2, nc);
    CHECK(ok && same(C2, C1, nc), "plan, %s: %s", desc, why);
  }
  if (L) {
    emk_lt_readback r;
    static const em_dtype dts[4] = {EM_FLOAT32, EM_FLOAT64, EM_FLOAT16, EM_BFLOAT16};
    st = emk_lt_gemm_check(L, dts[iter % 4], &g, iter % 2, &r, why, sizeof why);
    CHECK(st == EM_OK, "%s: %s", desc, why);
    if (st == EM_OK) {
      for (int64_t i = 0; i < nc; i++) C2[i] = -12345;
      int ok = lt_model(&r, g.batch, A, na, B, nb, C2, nc);
      CHECK(ok && same(C2, C1, nc), "cuBLASLt's layouts, %s: %s", desc, why);
      CHECK(r.a.order == EMK_LT_ORDER_COL && r.b.order == EMK_LT_ORDER_COL &&
            r.c.order == EMK_LT_ORDER_COL, "column-major throughout");
    }
  }
  free(A); free(B); free(C1); free(C2);
}

/* -- The plan, by hand ------------------------------------------------------------------ */

#define ARGS(m, n, k, batch, ars, acs, abs_, brs, bcs, bbs, crs, ccs, cbs) \
  (emk_lt_args){m, n, k, batch, ars, acs, abs_, brs, bcs, bbs, crs, ccs, cbs}

static int mat_is(const emk_lt_matrix *x, int trans, int64_t rows, int64_t cols, int64_t ld,
                  int64_t bs) {
  return x->trans == trans && x->rows == rows && x->cols == cols && x->ld == ld &&
         x->batch_stride == bs;
}
#define MAT_IS(x, t_, r_, c_, ld_, bs_) \
  CHECK(mat_is(&(x), t_, r_, c_, ld_, bs_), #x ": trans %d, %lld x %lld, ld %lld, batch stride %lld", \
        (x).trans, (long long)(x).rows, (long long)(x).cols, (long long)(x).ld, \
        (long long)(x).batch_stride)

static void test_plan(void *unused) {
  emk_lt_plan p;
  emk_lt_args g;
  /* row-major A (2x4), B (4x3), C (2x3): C^T (3x2) = B^T (3x4, ld 3) A^T (4x2, ld 4) */
  g = ARGS(2, 3, 4, 1, 4, 1, 0, 3, 1, 0, 3, 1, 0);
  REQUIRE(emk_lt_plan_gemm(&g, &p, why, sizeof why) == EM_OK, "%s", why);
  CHECK(p.swap == 1 && p.m == 3 && p.n == 2 && p.k == 4 && p.batch == 1, "row-major: swapped");
  MAT_IS(p.a, 0, 3, 4, 3, 0);
  MAT_IS(p.b, 0, 4, 2, 4, 0);
  MAT_IS(p.c, 0, 3, 2, 3, 0);
  /* A transposed (stored 4x2 row-major: strides 1, 2): A^T (4x2) is then row-major
  ** too, cuBLASLt takes it as op T of a 2x4 column-major with ld 2 */
  g = ARGS(2, 3, 4, 1, 1, 2, 0, 3, 1, 0, 3, 1, 0);
  REQUIRE(emk_lt_plan_gemm(&g, &p, why, sizeof why) == EM_OK, "%s", why);
  MAT_IS(p.a, 0, 3, 4, 3, 0);
  MAT_IS(p.b, 1, 2, 4, 2, 0);
  /* B transposed, padded (stored 3x4 with row stride 6: strides 1, 6) */
  g = ARGS(2, 3, 4, 1, 4, 1, 0, 1, 6, 0, 3, 1, 0);
  REQUIRE(emk_lt_plan_gemm(&g, &p, why, sizeof why) == EM_OK, "%s", why);
  MAT_IS(p.a, 1, 4, 3, 6, 0);
  /* column-major C (strides 1, 5; padded): no swap, A and B as they are */
  g = ARGS(2, 3, 4, 1, 1, 2, 0, 1, 4, 0, 1, 5, 0);
  REQUIRE(emk_lt_plan_gemm(&g, &p, why, sizeof why) == EM_OK, "%s", why);
  CHECK(p.swap == 0 && p.m == 2 && p.n == 3, "column-major C: not swapped");
  MAT_IS(p.a, 0, 2, 4, 2, 0);
  MAT_IS(p.b, 0, 4, 3, 4, 0);
  MAT_IS(p.c, 0, 2, 3, 5, 0);
  /* batched, A broadcast (batch stride 0): each layout keeps its own batch stride */
  g = ARGS(2, 3, 4, 5, 4, 1, 0, 3, 1, 12, 3, 1, 6);
  REQUIRE(emk_lt_plan_gemm(&g, &p, why, sizeof why) == EM_OK, "%s", why);
  CHECK(p.batch == 5, "batch %lld", (long long)p.batch);
  MAT_IS(p.a, 0, 3, 4, 3, 12);    /* cuBLASLt's A is our B */
  MAT_IS(p.b, 0, 4, 2, 4, 0);     /* our A, broadcast */
  MAT_IS(p.c, 0, 3, 2, 3, 6);
  /* vectors: m = 1 and n = 1 need no particular stride in the size-1 dim */
  g = ARGS(1, 3, 4, 1, 999, 1, 0, 3, 1, 0, 777, 1, 0);
  CHECK(emk_lt_plan_gemm(&g, &p, why, sizeof why) == EM_OK, "a row vector times B: %s", why);
  g = ARGS(3, 1, 4, 1, 4, 1, 0, 1, 555, 0, 1, 333, 0);
  CHECK(emk_lt_plan_gemm(&g, &p, why, sizeof why) == EM_OK, "A times a column: %s", why);
  /* k = 0: only C is planned (the gemm writes zeros) */
  g = ARGS(2, 3, 0, 2, 7, 7, 7, 7, 7, 7, 3, 1, 6);
  CHECK(emk_lt_plan_gemm(&g, &p, why, sizeof why) == EM_OK, "k = 0: %s", why);
  MAT_IS(p.c, 0, 3, 2, 3, 6);

  /* no unit stride: refused, naming the operand as the caller sees it */
  g = ARGS(2, 3, 4, 1, 8, 2, 0, 3, 1, 0, 3, 1, 0);
  CHECK(emk_lt_plan_gemm(&g, &p, why, sizeof why) == EM_ERR_UNSUPPORTED, "A strided both ways");
  CHECK(chk_msg_has(why, "operand A (2 x 4", "strides 8 and 2", "copy", NULL), "%s", why);
  g = ARGS(2, 3, 4, 1, 4, 1, 0, 6, 2, 0, 3, 1, 0);
  CHECK(emk_lt_plan_gemm(&g, &p, why, sizeof why) == EM_ERR_UNSUPPORTED, "B strided both ways");
  CHECK(chk_msg_has(why, "operand B (4 x 3", "strides 6 and 2", NULL), "%s", why);
  g = ARGS(2, 3, 4, 1, 0, 1, 0, 3, 1, 0, 3, 1, 0);
  CHECK(emk_lt_plan_gemm(&g, &p, why, sizeof why) == EM_ERR_UNSUPPORTED,
        "A broadcast along its rows (row stride 0)");
  g = ARGS(2, 3, 4, 1, 1, 1, 0, 3, 1, 0, 3, 1, 0);
  CHECK(emk_lt_plan_gemm(&g, &p, why, sizeof why) == EM_ERR_UNSUPPORTED,
        "A's rows overlap (strides 1 and 1)");
  g = ARGS(2, 3, 4, 1, 4, 1, 0, 3, 1, 0, 6, 2, 0);
  CHECK(emk_lt_plan_gemm(&g, &p, why, sizeof why) == EM_ERR_UNSUPPORTED, "C strided both ways");
  CHECK(chk_msg_has(why, "C (2 x 3", NULL), "%s", why);
  g = ARGS(2, 3, 4, 1, 4, -1, 0, 3, 1, 0, 3, 1, 0);
  CHECK(emk_lt_plan_gemm(&g, &p, why, sizeof why) == EM_ERR_ARG, "negative stride");
  g = ARGS(2, 3, 4, 1, 4, 1, 0, 3, 1, 0, 3, 1, 0);
  g.k = (int64_t)1 << 31;
  g.a_rs = g.k;
  CHECK(emk_lt_plan_gemm(&g, &p, why, sizeof why) == EM_ERR_UNSUPPORTED, "k beyond int32");
  /* what k_matmul.c asks before it calls gemm */
  CHECK(emk_lt_operand_ok(3, 4, 4, 1) && emk_lt_operand_ok(3, 4, 1, 3) &&
        emk_lt_operand_ok(1, 4, 0, 1) && emk_lt_operand_ok(3, 1, 1, 0) &&
        !emk_lt_operand_ok(3, 4, 8, 2) && !emk_lt_operand_ok(3, 4, 0, 1) &&
        !emk_lt_operand_ok(3, 4, 1, 2), "emk_lt_operand_ok");
  /* random layouts against the definition */
  for (int i = 0; i < 400; i++) random_case(NULL, i);
}

/* -- cuBLASLt's own descriptors ---------------------------------------------------------- */

static void test_cublaslt_layouts(emk_libs *L) {
  if (!L || emk_libs_load(L, EMK_LIB_CUBLASLT, why, sizeof why) != EM_OK) {
    check_skip(L ? why : "cuBLASLt layouts: no CUDA libraries");
    return;
  }
  emk_lt_readback r;
  /* row-major float32, batched, A broadcast */
  emk_lt_args g = ARGS(2, 3, 4, 5, 4, 1, 0, 3, 1, 12, 3, 1, 6);
  REQUIRE(emk_lt_gemm_check(L, EM_FLOAT32, &g, 0, &r, why, sizeof why) == EM_OK, "%s", why);
  CHECK(r.swap == 1 && r.trans_a == EMK_LT_OP_N && r.trans_b == EMK_LT_OP_N, "ops N, N, swapped");
  CHECK(r.compute_type == EMK_LT_COMPUTE_32F && r.scale_type == EMK_LT_R_32F,
        "float32: compute %d, scale %d", r.compute_type, r.scale_type);
  CHECK(r.a.rows == 3 && r.a.cols == 4 && r.a.ld == 3 && r.a.batch_count == 5 &&
        r.a.batch_offset == 12 && r.a.type == EMK_LT_R_32F && r.a.order == EMK_LT_ORDER_COL,
        "A: %llux%llu ld %lld, batch %d offset %lld", (unsigned long long)r.a.rows,
        (unsigned long long)r.a.cols, (long long)r.a.ld, r.a.batch_count,
        (long long)r.a.batch_offset);
  CHECK(r.b.rows == 4 && r.b.cols == 2 && r.b.ld == 4 && r.b.batch_count == 5 &&
        r.b.batch_offset == 0, "B (our A, broadcast): %llux%llu ld %lld, offset %lld",
        (unsigned long long)r.b.rows, (unsigned long long)r.b.cols, (long long)r.b.ld,
        (long long)r.b.batch_offset);
  CHECK(r.c.rows == 3 && r.c.cols == 2 && r.c.ld == 3 && r.c.batch_count == 5 &&
        r.c.batch_offset == 6, "C: %llux%llu ld %lld offset %lld", (unsigned long long)r.c.rows,
        (unsigned long long)r.c.cols, (long long)r.c.ld, (long long)r.c.batch_offset);
  /* transposed A: op T */
  g = ARGS(2, 3, 4, 1, 1, 2, 0, 3, 1, 0, 3, 1, 0);
  REQUIRE(emk_lt_gemm_check(L, EM_FLOAT32, &g, 1, &r, why, sizeof why) == EM_OK, "%s", why);
  CHECK(r.trans_a == EMK_LT_OP_N && r.trans_b == EMK_LT_OP_T && r.b.rows == 2 && r.b.cols == 4 &&
        r.b.ld == 2 && r.b.batch_count == 1, "A^T: op T of 2x4 ld 2");
  CHECK(r.compute_type == EMK_LT_COMPUTE_32F_FAST_TF32, "allow_tf32: compute %d",
        r.compute_type);
  /* the dtypes */
  struct { em_dtype dt; int compute, scale, type; } types[] = {
    {EM_FLOAT64, EMK_LT_COMPUTE_64F, EMK_LT_R_64F, EMK_LT_R_64F},
    {EM_FLOAT16, EMK_LT_COMPUTE_32F, EMK_LT_R_32F, EMK_LT_R_16F},
    {EM_BFLOAT16, EMK_LT_COMPUTE_32F, EMK_LT_R_32F, EMK_LT_R_16BF},
  };
  for (size_t i = 0; i < sizeof types / sizeof *types; i++) {
    REQUIRE(emk_lt_gemm_check(L, types[i].dt, &g, 1, &r, why, sizeof why) == EM_OK, "%s", why);
    CHECK(r.compute_type == types[i].compute && r.scale_type == types[i].scale &&
          (int)r.a.type == types[i].type && (int)r.b.type == types[i].type &&
          (int)r.c.type == types[i].type, "%s: compute %d, scale %d, types %u %u %u",
          em_dtype_name(types[i].dt), r.compute_type, r.scale_type, r.a.type, r.b.type,
          r.c.type);
  }
  /* refused before cuBLASLt sees it */
  g = ARGS(2, 3, 4, 1, 8, 2, 0, 3, 1, 0, 3, 1, 0);
  CHECK(emk_lt_gemm_check(L, EM_FLOAT32, &g, 0, &r, why, sizeof why) == EM_ERR_UNSUPPORTED,
        "no unit stride: %s", why);
  /* random layouts: cuBLASLt's read-back layouts against the definition */
  for (int i = 0; i < 200; i++) random_case(L, i);
}

/* -- The embedded fatbins ------------------------------------------------------------------ */

static const unsigned char *find(const unsigned char *h, size_t n, const char *s) {
  size_t k = strlen(s);
  for (size_t i = 0; i + k <= n; i++)
    if (h[i] == (unsigned char)s[0] && memcmp(h + i, s, k) == 0) return h + i;
  return NULL;
}

static const emk_fatbin *module(const char *name) {
  for (uint64_t i = 0; i < emk_fatbin_count; i++)
    if (strcmp(emk_fatbins[i].name, name) == 0) return &emk_fatbins[i];
  return NULL;
}

/* The kernel names a source defines: EMK_KERNEL(name, ...) and EMK_KERNEL_SYNC(name, ...). */
static int kernel_names(const char *path, char names[][64], int max) {
  FILE *f = fopen(path, "r");
  if (!f) return -1;
  char line[1024];
  int n = 0;
  while (fgets(line, sizeof line, f) && n < max) {
    const char *p = strstr(line, "EMK_KERNEL(");
    size_t skip = 11;
    if (!p) {
      p = strstr(line, "EMK_KERNEL_SYNC(");
      skip = 16;
    }
    if (!p || p != line) continue;             /* definitions start their line */
    p += skip;
    size_t k = strcspn(p, ", )");
    if (k == 0 || k >= 64) continue;
    memcpy(names[n], p, k);
    names[n++][k] = 0;
  }
  fclose(f);
  return n;
}

static void test_fatbins(void *unused) {
  if (emk_fatbin_count == 0) {
    CHECK(emk_fatbins[0].name == NULL, "an empty table ends at once");
    check_skip("fatbins: libember was built without nvcc (no embedded device code)");
    return;
  }
  uint64_t n = 0;
  while (emk_fatbins[n].name) n++;
  CHECK(n == emk_fatbin_count, "table of %llu entries, count %llu", (unsigned long long)n,
        (unsigned long long)emk_fatbin_count);
  for (uint64_t i = 0; i < n; i++) {
    const emk_fatbin *fb = &emk_fatbins[i];
    uint32_t magic = 0;
    if (fb->size >= 4) memcpy(&magic, fb->data, 4);
    CHECK(fb->size > 16 && magic == 0xBA55ED50u && (uintptr_t)fb->data % 8 == 0,
          "%s: a fatbin (%llu bytes, magic %08x, at %p)", fb->name,
          (unsigned long long)fb->size, magic, (const void *)fb->data);
  }
  /* one module per kernels/k_*.cu, each holding its kernels' C-linkage names */
  const char *dirs[] = {"kernels", "../kernels", "../../kernels"};
  glob_t gl;
  memset(&gl, 0, sizeof gl);
  int found = 0;
  for (size_t d = 0; d < sizeof dirs / sizeof *dirs && !found; d++) {
    char pat[64];
    snprintf(pat, sizeof pat, "%s/k_*.cu", dirs[d]);
    if (glob(pat, 0, NULL, &gl) == 0 && gl.gl_pathc > 0) found = 1;
    else globfree(&gl);
  }
  if (!found) {
    char msg[600];
    snprintf(msg, sizeof msg, "kernel names: kernels/k_*.cu not found from %.512s",
             getcwd(why, 512) ? why : "?");
    check_skip(msg);
    return;
  }
  CHECK(gl.gl_pathc == n, "%zu sources, %llu modules", gl.gl_pathc, (unsigned long long)n);
  int kernels = 0;
  for (size_t i = 0; i < gl.gl_pathc; i++) {
    const char *src = gl.gl_pathv[i], *base = strrchr(src, '/') + 1;
    char mod[64];
    snprintf(mod, sizeof mod, "%.*s", (int)(strlen(base) - 3), base);
    const emk_fatbin *fb = module(mod);
    CHECK(fb != NULL, "no module %s for %s", mod, src);
    if (!fb) continue;
    char names[64][64];
    int k = kernel_names(src, names, 64);
    CHECK(k > 0, "%s defines kernels", src);
    for (int j = 0; j < k; j++, kernels++) {
      char sym[96], mangled[128];
      snprintf(sym, sizeof sym, "%.63s_emk_dev", names[j]);
      CHECK(find(fb->data, fb->size, sym) != NULL, "%s holds %s", mod, sym);
      snprintf(mangled, sizeof mangled, "_Z%zu%s", strlen(sym), sym);
      CHECK(find(fb->data, fb->size, mangled) == NULL, "%s: %s has C linkage", mod, sym);
      for (uint64_t o = 0; o < n; o++) {
        if (&emk_fatbins[o] == fb) continue;
        char dot[128];      /* the section of a kernel of that name: ".text.NAME" */
        snprintf(dot, sizeof dot, ".text.%s", sym);
        CHECK(find(emk_fatbins[o].data, emk_fatbins[o].size, dot) == NULL,
              "%s is defined in %s too (the lookup takes the first)", sym, emk_fatbins[o].name);
      }
    }
  }
  printf("     %llu modules, %d kernels\n", (unsigned long long)n, kernels);
  globfree(&gl);
}

/* -- The plan table ------------------------------------------------------------------------ */

typedef struct { int id, freed; } fake_plan;
static int plans_freed;
static void free_fake(void *ud, void *plan) {
  (void)ud;
  ((fake_plan *)plan)->freed++;
  plans_freed++;
}

static void test_plan_cache(void *unused) {
  fake_plan p[6];
  memset(p, 0, sizeof p);
  for (int i = 0; i < 6; i++) p[i].id = i;
  plans_freed = 0;
  typedef struct { int64_t a, b; } key;
  emk_plan_cache *c = emk_plan_cache_new(3, sizeof(key), free_fake, NULL);
  REQUIRE(c != NULL, "new");
  key k[6];
  memset(k, 0, sizeof k);
  for (int i = 0; i < 6; i++) k[i].a = i, k[i].b = 100 + i;
  emk_plan_cache_stats st;
  CHECK(emk_plan_cache_take(c, &k[0]) == NULL, "empty: a miss");
  CHECK(emk_plan_cache_add(c, &k[0], &p[0]) == 1, "kept");
  /* out to the first caller: a second one misses (busy) and its plan is not kept */
  CHECK(emk_plan_cache_take(c, &k[0]) == NULL, "busy: a miss");
  CHECK(emk_plan_cache_add(c, &k[0], &p[5]) == 0, "a second plan for the key is not kept");
  emk_plan_cache_give_back(c, &p[0]);
  CHECK(emk_plan_cache_take(c, &k[0]) == &p[0], "given back: a hit");
  emk_plan_cache_give_back(c, &p[0]);
  CHECK(emk_plan_cache_add(c, &k[1], &p[1]) == 1 && emk_plan_cache_add(c, &k[2], &p[2]) == 1,
        "fill");
  emk_plan_cache_give_back(c, &p[1]);
  emk_plan_cache_give_back(c, &p[2]);
  /* k[0] used last: the least recently used is k[1], evicted for k[3] */
  CHECK(emk_plan_cache_take(c, &k[0]) == &p[0], "hit");
  emk_plan_cache_give_back(c, &p[0]);
  CHECK(emk_plan_cache_add(c, &k[3], &p[3]) == 1, "kept in a full table");
  CHECK(p[1].freed == 1 && p[0].freed == 0 && p[2].freed == 0, "the least recently used "
        "plan was freed (%d %d %d)", p[0].freed, p[1].freed, p[2].freed);
  CHECK(emk_plan_cache_take(c, &k[1]) == NULL, "evicted: a miss");
  /* every plan out: nothing can be evicted, the new plan is not kept */
  CHECK(emk_plan_cache_take(c, &k[0]) == &p[0] && emk_plan_cache_take(c, &k[2]) == &p[2],
        "take two more");
  CHECK(emk_plan_cache_add(c, &k[4], &p[4]) == 0 && !p[4].freed, "all out: not kept, "
        "not freed (the caller frees it)");
  emk_plan_cache_give_back(c, &p[0]);
  emk_plan_cache_give_back(c, &p[2]);
  emk_plan_cache_give_back(c, &p[3]);
  emk_plan_cache_stats_get(c, &st);
  CHECK(st.entries == 3 && st.capacity == 3 && st.evictions == 1 && st.hits == 4 &&
        st.misses == 3 && st.busy == 1 && st.not_kept == 2,
        "stats: %zu entries, %llu hits, %llu misses, %llu busy, %llu evictions, %llu not kept",
        st.entries, (unsigned long long)st.hits, (unsigned long long)st.misses,
        (unsigned long long)st.busy, (unsigned long long)st.evictions,
        (unsigned long long)st.not_kept);
  emk_plan_cache_delete(c);
  CHECK(plans_freed == 4 && p[0].freed == 1 && p[2].freed == 1 && p[3].freed == 1 &&
        p[4].freed == 0 && p[5].freed == 0, "delete frees every kept plan once (%d)",
        plans_freed);
  (void)unused;
}

/* The gemm plan's key: what differs in cuBLASLt's objects or algorithm differs. */
static void test_gemm_key(void *unused) {
  emk_lt_args base = {8, 6, 5, 3, 5, 1, 40, 6, 1, 30, 6, 1, 48};
  uint32_t al[4] = {256, 256, 256, 256};
  emk_lt_plan p;
  emk_lt_key k0, k1;
  REQUIRE(emk_lt_plan_gemm(&base, &p, why, sizeof why) == EM_OK, "%s", why);
  emk_lt_key_make(&k0, &p, EM_FLOAT32, 0, 0, al, 1 << 20);
  emk_lt_key_make(&k1, &p, EM_FLOAT32, 0, 0, al, 1 << 20);
  CHECK(!memcmp(&k0, &k1, sizeof k0), "the same gemm, the same key");
  struct { const char *what; emk_lt_args g; } var[] = {
    {"A transposed", {8, 6, 5, 3, 1, 8, 40, 6, 1, 30, 6, 1, 48}},
    {"B column-major", {8, 6, 5, 3, 5, 1, 40, 1, 5, 30, 6, 1, 48}},
    {"A padded rows", {8, 6, 5, 3, 7, 1, 56, 6, 1, 30, 6, 1, 48}},
    {"A batch stride", {8, 6, 5, 3, 5, 1, 48, 6, 1, 30, 6, 1, 48}},
    {"A broadcast over the batch", {8, 6, 5, 3, 5, 1, 0, 6, 1, 30, 6, 1, 48}},
    {"C batch stride", {8, 6, 5, 3, 5, 1, 40, 6, 1, 30, 6, 1, 50}},
    {"C column-major", {8, 6, 5, 3, 5, 1, 40, 6, 1, 30, 1, 8, 48}},
    {"batch", {8, 6, 5, 2, 5, 1, 40, 6, 1, 30, 6, 1, 48}},
    {"k", {8, 6, 4, 3, 5, 1, 40, 6, 1, 30, 6, 1, 48}},
  };
  for (size_t i = 0; i < sizeof var / sizeof var[0]; i++) {
    emk_lt_plan q;
    if (!CHECK(emk_lt_plan_gemm(&var[i].g, &q, why, sizeof why) == EM_OK, "%s: %s", var[i].what,
               why))
      continue;
    emk_lt_key_make(&k1, &q, EM_FLOAT32, 0, 0, al, 1 << 20);
    CHECK(memcmp(&k0, &k1, sizeof k0) != 0, "%s: a key of its own", var[i].what);
  }
  emk_lt_key_make(&k1, &p, EM_FLOAT32, 1, 0, al, 1 << 20);
  CHECK(memcmp(&k0, &k1, sizeof k0) != 0, "TF32: a key of its own for float32");
  emk_lt_key_make(&k0, &p, EM_FLOAT64, 0, 0, al, 1 << 20);
  emk_lt_key_make(&k1, &p, EM_FLOAT64, 1, 0, al, 1 << 20);
  CHECK(!memcmp(&k0, &k1, sizeof k0), "float64 ignores TF32: one plan");
  emk_lt_key_make(&k1, &p, EM_FLOAT16, 0, 0, al, 1 << 20);
  CHECK(memcmp(&k0, &k1, sizeof k0) != 0, "dtype");
  emk_lt_key_make(&k1, &p, EM_FLOAT64, 0, 1, al, 1 << 20);
  CHECK(memcmp(&k0, &k1, sizeof k0) != 0, "device");
  uint32_t al2[4] = {256, 16, 256, 256};
  emk_lt_key_make(&k1, &p, EM_FLOAT64, 0, 0, al2, 1 << 20);
  CHECK(memcmp(&k0, &k1, sizeof k0) != 0, "alignment");
  emk_lt_key_make(&k1, &p, EM_FLOAT64, 0, 0, al, 0);
  CHECK(memcmp(&k0, &k1, sizeof k0) != 0, "workspace");
  (void)unused;
}

/* -- With a GPU ---------------------------------------------------------------------------- */

static int flag;
static void set_flag(void *ud) { *(int *)ud = 1; }

#define RT_OK(call) CHECK((call) == EM_OK, "%s", rt->errmsg)

static void test_gpu(void *unused) {
  emk_runtime *rt = try_open();
  if (!rt) {
    char err[EMK_ERRMSG_SIZE];
    emk_real_open(&rt, err, sizeof err);
    char msg[EMK_ERRMSG_SIZE + 16];
    snprintf(msg, sizeof msg, "the GPU: %s", err);
    check_skip(msg);
    return;
  }
  const emk_runtime_ops *o = rt->ops;
  emk_device_props pr;
  RT_OK(o->device_props(rt, 0, &pr));
  printf("     %s, sm_%d%d, %d SMs, %zu MiB\n", pr.name, pr.major, pr.minor, pr.multiprocessors,
         pr.total_memory >> 20);
  CHECK(pr.warp_size == 32 && pr.max_threads_per_block >= 1024 && !pr.emulated && pr.name[0],
        "props");
  size_t fr = 0, to = 0;
  RT_OK(o->mem_info(rt, 0, &fr, &to));
  CHECK(to > 0 && fr <= to, "mem_info %zu of %zu", fr, to);
  CHECK(o->device_props(rt, o->device_count(rt), &pr) == EM_ERR_DEVICE, "no such device");

  emk_stream *s = NULL;
  RT_OK(o->stream_create(rt, 0, &s));
  if (!s) { o->close(rt); return; }
  /* gemm: A (m x k) row-major, B (k x n) transposed storage, C row-major; batch 2
  ** with A broadcast; float32 and float64 */
  enum { M = 37, N = 19, K = 23, NB = 2 };
  float *ha = NULL, *hb = NULL, *hc = NULL;
  RT_OK(o->host_alloc(rt, sizeof(float) * M * K, (void **)&ha));
  RT_OK(o->host_alloc(rt, sizeof(float) * K * N * NB, (void **)&hb));
  RT_OK(o->host_alloc(rt, sizeof(float) * M * N * NB, (void **)&hc));
  void *da = NULL, *db = NULL, *dc = NULL;
  RT_OK(o->malloc(rt, 0, sizeof(double) * M * K, &da));
  RT_OK(o->malloc(rt, 0, sizeof(double) * K * N * NB, &db));
  RT_OK(o->malloc(rt, 0, sizeof(double) * M * N * NB, &dc));
  if (!ha || !hb || !hc || !da || !db || !dc) { o->close(rt); return; }
  for (int i = 0; i < M * K; i++) ha[i] = (float)((i * 7) % 11 - 5);
  for (int i = 0; i < K * N * NB; i++) hb[i] = (float)((i * 5) % 13 - 6);
  RT_OK(o->memcpy_async(rt, da, ha, sizeof(float) * M * K, EMK_HOST_TO_DEVICE, s));
  RT_OK(o->memcpy_async(rt, db, hb, sizeof(float) * K * N * NB, EMK_HOST_TO_DEVICE, s));
  RT_OK(o->memset_async(rt, dc, 0xFF, sizeof(float) * M * N * NB, s));
  /* B[i] (k x n) stored n x k row-major: element (q, j) at j*K + q */
  RT_OK(o->gemm(rt, s, EM_FLOAT32, M, N, K, NB, da, K, 1, 0, db, 1, K, (int64_t)K * N, dc, N, 1,
                (int64_t)M * N, 0));
  RT_OK(o->memcpy_async(rt, hc, dc, sizeof(float) * M * N * NB, EMK_DEVICE_TO_HOST, s));
  flag = 0;
  RT_OK(o->host_callback(rt, s, set_flag, &flag));
  emk_event *ev = NULL;
  RT_OK(o->event_create(rt, 0, &ev));
  RT_OK(o->event_record(rt, ev, s));
  RT_OK(o->event_sync(rt, ev));
  int done = 0;
  RT_OK(o->event_query(rt, ev, &done));
  CHECK(done == 1 && flag == 1, "event done %d, callback ran %d", done, flag);
  int bad = 0;
  for (int bi = 0; bi < NB; bi++)
    for (int i = 0; i < M; i++)
      for (int j = 0; j < N; j++) {
        double want = 0;
        for (int q = 0; q < K; q++) want += (double)ha[i * K + q] * hb[bi * K * N + j * K + q];
        if (hc[bi * M * N + i * N + j] != (float)want) bad++;
      }
  CHECK(bad == 0, "gemm float32: %d of %d wrong", bad, M * N * NB);
  /* the same gemm again: its plan comes from the table */
  emk_plan_cache_stats p0, p1;
  RT_OK(o->stream_sync(rt, s));
  if (CHECK(emk_real_gemm_plans(rt, &p0) == 0, "the gemm plan table exists")) {
    RT_OK(o->gemm(rt, s, EM_FLOAT32, M, N, K, NB, da, K, 1, 0, db, 1, K, (int64_t)K * N, dc, N,
                  1, (int64_t)M * N, 0));
    CHECK(emk_real_gemm_plans(rt, &p1) == 0 && p1.hits == p0.hits + 1 &&
          p1.misses == p0.misses && p1.entries == p0.entries, "a repeated gemm is a hit "
          "(%llu -> %llu hits, %llu -> %llu misses)", (unsigned long long)p0.hits,
          (unsigned long long)p1.hits, (unsigned long long)p0.misses,
          (unsigned long long)p1.misses);
    RT_OK(o->gemm(rt, s, EM_FLOAT32, M, N, K, NB, da, K, 1, 0, db, 1, K, (int64_t)K * N, dc, N,
                  1, (int64_t)M * N, 1));
    CHECK(emk_real_gemm_plans(rt, &p1) == 0 && p1.misses == p0.misses + 1,
          "TF32 allowed: a plan of its own");
  }
  /* k = 0 writes zeros */
  RT_OK(o->memset_async(rt, dc, 0xFF, sizeof(float) * M * N, s));
  RT_OK(o->gemm(rt, s, EM_FLOAT32, M, N, 0, 1, da, K, 1, 0, db, N, 1, 0, dc, N, 1, 0, 0));
  RT_OK(o->memcpy_async(rt, hc, dc, sizeof(float) * M * N, EMK_DEVICE_TO_HOST, s));
  RT_OK(o->stream_sync(rt, s));
  bad = 0;
  for (int i = 0; i < M * N; i++) bad += hc[i] != 0;
  CHECK(bad == 0, "k = 0: %d of %d not zero", bad, M * N);
  /* a strided-both-ways operand is refused with a message */
  CHECK(o->gemm(rt, s, EM_FLOAT32, 4, 4, 4, 1, da, 8, 2, 0, db, 4, 1, 0, dc, 4, 1, 0, 0) ==
        EM_ERR_UNSUPPORTED && strstr(rt->errmsg, "operand A"), "%s", rt->errmsg);
  /* launches: limits and a kernel nobody compiled */
  static const emk_kernel nosuch = {"k_nosuch", NULL, NULL, 0};
  int arg = 0;
  emk_dim3 g1 = {1, 1, 1}, b2048 = {2048, 1, 1}, b32 = {32, 1, 1};
  CHECK(o->launch(rt, &nosuch, g1, b2048, 0, s, &arg, sizeof arg) == EM_ERR_ARG &&
        strstr(rt->errmsg, "k_nosuch"), "a block of 2048: %s", rt->errmsg);
  em_status st = o->launch(rt, &nosuch, g1, b32, 0, s, &arg, sizeof arg);
  CHECK(st == EM_ERR_UNSUPPORTED && strstr(rt->errmsg, "k_nosuch"), "unknown kernel: %s",
        rt->errmsg);
  /* a real kernel: k_matmul.c's integer matmul, by name (its argument struct is
  ** mirrored here; the launch compares its size with the device code's) */
  struct {
    char *out;
    const char *a, *b;
    int dtype, nb;
    int64_t total, M, N, K;
    int64_t bsizes[EM_MAX_DIMS], abs_[EM_MAX_DIMS], bbs[EM_MAX_DIMS];
    int64_t ars, acs, brs, bcs;
  } ia;
  static const emk_kernel k_int = {"k_matmul_int", NULL, NULL, 0};
  int32_t *hi = (int32_t *)ha;             /* a: 2x3, b: 3x2, out: 2x2 */
  for (int i = 0; i < 12; i++) hi[i] = i + 1;
  memset(&ia, 0, sizeof ia);
  ia.out = (char *)dc;
  ia.a = (const char *)da;
  ia.b = (const char *)da + 6 * sizeof(int32_t);
  ia.dtype = EM_INT32;
  ia.total = 4, ia.M = 2, ia.N = 2, ia.K = 3;
  ia.ars = 3, ia.acs = 1, ia.brs = 2, ia.bcs = 1;
  RT_OK(o->memcpy_async(rt, da, hi, 12 * sizeof(int32_t), EMK_HOST_TO_DEVICE, s));
  st = o->launch(rt, &k_int, g1, b32, 0, s, &ia, sizeof ia);
  if (emk_fatbin_count == 0) {
    CHECK(st == EM_ERR_UNSUPPORTED && strstr(rt->errmsg, "nvcc"), "%s", rt->errmsg);
  } else {
    CHECK(st == EM_OK, "launch k_matmul_int: %s", rt->errmsg);
    int32_t got[4] = {0, 0, 0, 0};
    RT_OK(o->memcpy_async(rt, got, dc, sizeof got, EMK_DEVICE_TO_HOST, s));
    RT_OK(o->stream_sync(rt, s));
    /* [1 2 3; 4 5 6] x [7 8; 9 10; 11 12] */
    CHECK(got[0] == 58 && got[1] == 64 && got[2] == 139 && got[3] == 154,
          "k_matmul_int: %d %d %d %d", got[0], got[1], got[2], got[3]);
    st = o->launch(rt, &k_int, g1, b32, 0, s, &ia, sizeof ia - 8);
    CHECK(st == EM_ERR_ARG && strstr(rt->errmsg, "bytes"), "a short argument struct: %s",
          rt->errmsg);
  }
  /* a second stream waits for the first through an event */
  emk_stream *s2 = NULL;
  RT_OK(o->stream_create(rt, 0, &s2));
  RT_OK(o->event_record(rt, ev, s));
  RT_OK(o->stream_wait_event(rt, s2, ev));
  RT_OK(o->memcpy_async(rt, hc, dc, sizeof(float), EMK_DEVICE_TO_HOST, s2));
  RT_OK(o->stream_destroy(rt, s2));
  RT_OK(o->event_destroy(rt, ev));
  RT_OK(o->stream_destroy(rt, s));
  RT_OK(o->free(rt, 0, da));
  RT_OK(o->free(rt, 0, db));
  RT_OK(o->free(rt, 0, dc));
  RT_OK(o->host_free(rt, ha));
  RT_OK(o->host_free(rt, hb));
  RT_OK(o->host_free(rt, hc));
  void *huge = NULL;
  CHECK(o->malloc(rt, 0, (size_t)1 << 50, &huge) == EM_ERR_NOMEM && !huge, "1 PiB refused: %s",
        rt->errmsg);
  o->close(rt);
}

int main(void) {
  emk_libs *L = NULL;
  if (emk_libs_open(&L, why, sizeof why) != EM_OK) L = NULL;
  RUN(test_open, NULL);
  RUN(test_plan, NULL);
  RUN(test_cublaslt_layouts, L);
  RUN(test_plan_cache, NULL);
  RUN(test_gemm_key, NULL);
  RUN(test_fatbins, NULL);
  RUN(test_gpu, NULL);
  emk_libs_close(L);
  return check_done();
}

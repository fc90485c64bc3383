/*
** matmul.c -- the CPU matmul: out (*batch, M, N) = a (*batch, M, K) @ b (*batch, K, N).
**
** Everything is computed in one of three types: float32 (for float32, float16
** and bfloat16 results), float64, or int64 (integer and bool results: exact
** accumulation, then cast like PyTorch's integer matmul; bool is "any product
** non-zero"). Operands of another dtype are first converted to that type once
** (broadcast batch dims stay broadcast, so a shared weight is converted once).
**
** Two engines:
**  - OpenBLAS sgemm/dgemm (gemv/dot for vector shapes), one call per batch
**    matrix, for float32/float64 matrices big enough to amortise a BLAS call.
**    Transposed operands go in as CblasTrans with their leading dimension, no
**    copy; only a matrix whose neither stride is 1 is packed first.
**  - a plain kernel (the readable reference, plus a register-tiled version of
**    the same loop): blocks of rows of every batch matrix spread over the
**    state's workers. It serves the integer types and stacks of small matrices,
**    where per-call BLAS overhead would dominate.
*/
#include "cpu.h"
#include "dnnl.h"
#include <cblas.h>
#include <limits.h>

/* Up to this many multiply-adds per matrix the plain kernel beats a BLAS call
** (measured on the 2-core AVX-512 dev machine with Debian's OpenBLAS 0.3.21: the
** tiled plain kernel matched or beat sgemm up to 128^3; 64^3 leaves a margin for
** machines where OpenBLAS has a better kernel). */
enum { SMALL_MACS = 64 * 64 * 64 };

/* OpenBLAS's thread count is process-wide and managed in blas.c (set to the
** largest count wanted by a live state, never per call). */

static em_dtype compute_type(em_dtype dt) {
  if (dt == EM_FLOAT64) return EM_FLOAT64;
  if (em_dtype_is_floating(dt)) return EM_FLOAT32;
  return EM_INT64;
}

/* -- Dtype conversion ---------------------------------------------------------------- */

static inline int64_t load_i64(const char *p, em_dtype dt) {
  switch (dt) {
  case EM_INT64: return *(const int64_t *)p;
  case EM_INT32: return *(const int32_t *)p;
  case EM_UINT8: return *(const uint8_t *)p;
  case EM_BOOL: return *(const uint8_t *)p != 0;
  default: return (int64_t)emi_load_f64(p, dt);   /* not reached: ints only */
  }
}

/* n elements from src (dtype sdt, byte stride ss) into dense dst of type ct. */
static void convert_row(void *dst, em_dtype ct, const char *src, em_dtype sdt,
                        int64_t ss, int64_t n) {
  if (ct == EM_FLOAT32) {
    float *d = dst;
    if (sdt == EM_FLOAT16)
      for (int64_t i = 0; i < n; i++) d[i] = emi_half_to_float(*(const uint16_t *)(src + i * ss));
    else if (sdt == EM_BFLOAT16)
      for (int64_t i = 0; i < n; i++) d[i] = emi_bf16_to_float(*(const uint16_t *)(src + i * ss));
    else if (sdt == EM_FLOAT32)
      for (int64_t i = 0; i < n; i++) d[i] = *(const float *)(src + i * ss);
    else
      for (int64_t i = 0; i < n; i++) d[i] = (float)emi_load_f64(src + i * ss, sdt);
  } else if (ct == EM_FLOAT64) {
    double *d = dst;
    for (int64_t i = 0; i < n; i++) d[i] = emi_load_f64(src + i * ss, sdt);
  } else {
    int64_t *d = dst;
    for (int64_t i = 0; i < n; i++) d[i] = load_i64(src + i * ss, sdt);
  }
}

/* t (any dtype) as a tensor of type ct with t's sizes: dims that t broadcasts
** (stride 0) stay stride 0 in the copy, so they are converted only once. */
static em_status convert_operand(em_state *S, const em_tensor *t, em_dtype ct,
                                 em_tensor **out) {
  int64_t csz[EM_MAX_DIMS], cst[EM_MAX_DIMS], st[EM_MAX_DIMS];
  int nc = 0;
  for (int d = 0; d < t->ndim; d++)
    if (t->strides[d] != 0 || t->sizes[d] == 1) { csz[nc] = t->sizes[d]; cst[nc++] = t->strides[d]; }
  em_tensor *dense, *src = NULL;
  em_status s = emi_tensor_new(S, "matmul", csz, nc, ct, t->device, &dense);
  if (s) return s;
  if ((s = emi_tensor_view(S, t, csz, cst, nc, t->offset, &src))) {
    em_tensor_release(dense);
    return s;
  }
  emi_iter it;
  em_tensor *ops[2] = {dense, src};
  emi_iter_init(&it, ops, 2);
  for (int64_t r = 0; r < it.nrows; r++) {
    char *p[2];
    emi_iter_row(&it, r, p);
    convert_row(p[0], ct, p[1], t->dtype, it.strides[1][it.ndim - 1], it.inner);
  }
  em_tensor_release(src);
  /* re-expand: dense strides for the kept dims, 0 for the broadcast ones */
  int64_t dst_strides[EM_MAX_DIMS];
  emi_contiguous_strides(csz, nc, dst_strides);
  for (int d = 0, k = 0; d < t->ndim; d++)
    st[d] = (t->strides[d] != 0 || t->sizes[d] == 1) ? dst_strides[k++] : 0;
  s = emi_tensor_view(S, dense, t->sizes, st, t->ndim, 0, out);
  em_tensor_release(dense);
  return s;
}

/* The ct-typed result (dense, n elements) into out (dense) of its own dtype. */
static void store_result(em_tensor *out, const void *src, em_dtype ct, int64_t n) {
  char *d = em_tensor_data(out);
  em_dtype dt = out->dtype;
  if (ct == EM_FLOAT32) {
    const float *s = src;
    if (dt == EM_FLOAT16) for (int64_t i = 0; i < n; i++) ((uint16_t *)d)[i] = emi_float_to_half(s[i]);
    else for (int64_t i = 0; i < n; i++) ((uint16_t *)d)[i] = emi_float_to_bf16(s[i]);
  } else {
    const int64_t *s = src;
    if (dt == EM_INT32) for (int64_t i = 0; i < n; i++) ((int32_t *)d)[i] = (int32_t)s[i];
    else if (dt == EM_UINT8) for (int64_t i = 0; i < n; i++) ((uint8_t *)d)[i] = (uint8_t)s[i];
    else for (int64_t i = 0; i < n; i++) ((uint8_t *)d)[i] = s[i] != 0;   /* bool */
  }
}

/* -- The batched problem ----------------------------------------------------------- */

typedef struct mm_problem {
  em_dtype ct;
  size_t es;                          /* sizeof ct */
  int nb;                             /* batch dims */
  int64_t bsizes[EM_MAX_DIMS], astr[EM_MAX_DIMS], bstr[EM_MAX_DIMS];  /* elements */
  int64_t nbatch, M, N, K;
  int64_t a_rs, a_cs, b_rs, b_cs;     /* matrix strides, elements */
  const char *A, *B;                  /* ct data at [0,...,0] */
  char *C;                            /* dense (nbatch, M, N) of ct */
} mm_problem;

/* Element offsets of batch matrix bi in A and B. */
static void batch_offsets(const mm_problem *p, int64_t bi, int64_t *ao, int64_t *bo) {
  int64_t x = 0, y = 0;
  for (int d = p->nb - 1; d >= 0 && bi; d--) {
    int64_t i = bi % p->bsizes[d];
    bi /= p->bsizes[d];
    x += i * p->astr[d];
    y += i * p->bstr[d];
  }
  *ao = x; *bo = y;
}

/* -- Plain kernel ----------------------------------------------------------------------
** The work is cut into units of MR rows of one batch matrix. The reference loop
** computes c[i, n0:n1] = sum_k a[i,k] * b[k, n0:n1] with the k loop outside the j
** loop, so that a row of b streams through a vectorised axpy. Where b's rows are
** dense, full MR x NR tiles instead keep their sums in registers for the whole k
** loop (each b load feeds MR multiply-adds), which is what makes stacks of small
** matrices fast. Each output element is summed in k order by one thread. */
enum { MR = 4 };

/* The sum of a vector's lanes by halving (a fixed order, so the same bits every
** time): two or three vector adds where a plain loop makes NR dependent scalar
** adds. For the dot products of the row kernel (matmul_impl.h); the 8-lane
** version of the other types is there. */
typedef float v16f __attribute__((vector_size(64)));
typedef float v8f __attribute__((vector_size(32)));
typedef float v4f __attribute__((vector_size(16)));
static inline float hsum_f32(v16f s) {
  v8f a, b;
  memcpy(&a, &s, sizeof a); memcpy(&b, (const char *)&s + sizeof a, sizeof b);
  a += b;
  v4f c, d;
  memcpy(&c, &a, sizeof c); memcpy(&d, (const char *)&a + sizeof c, sizeof d);
  c += d;
  return (c[0] + c[2]) + (c[1] + c[3]);
}

/* The kernel (matmul_impl.h) for each compute type; int64 as uint64_t. */
#define T float
#define NR 16
#define HSUM hsum_f32
#define FN(name) name##_f32
#include "matmul_impl.h"
#define T double
#define NR 8
#define HSUM hsum8_f64
#define FN(name) name##_f64
#include "matmul_impl.h"
#define T uint64_t
#define NR 8
#define HSUM hsum8_i64
#define FN(name) name##_i64
#include "matmul_impl.h"

static void run_plain(em_state *S, mm_problem *p) {
  emi_range_fn fn = p->ct == EM_FLOAT32 ? units_f32 : p->ct == EM_FLOAT64 ? units_f64 : units_i64;
  int64_t units = p->nbatch * ((p->M + MR - 1) / MR);
  int64_t work = MR * p->N * p->K;           /* multiply-adds per unit */
  emi_parallel_for(S, units, 65536 / work + 1, fn, p);
}

/* -- BLAS engine -------------------------------------------------------------------- */

/* How BLAS can read a rows x cols matrix with strides (rs, cs): row-major as is
** (NoTrans) or as the transpose of a row-major matrix (Trans), with leading
** dimension *ld. A stride of a size-1 dim is irrelevant and ignored. */
static bool blas_layout(int64_t rows, int64_t cols, int64_t rs, int64_t cs,
                        enum CBLAS_TRANSPOSE *tr, int64_t *ld) {
  if ((cs == 1 || cols == 1) && (rows == 1 || rs >= cols)) {
    *tr = CblasNoTrans;
    *ld = rows == 1 ? cols : rs;
    return *ld <= INT_MAX;
  }
  if ((rs == 1 || rows == 1) && (cols == 1 || cs >= rows)) {
    *tr = CblasTrans;
    *ld = cols == 1 ? rows : cs;
    return *ld <= INT_MAX;
  }
  return false;
}

/* Stride of a vector of n elements for BLAS (which rejects 0), or 0 when it
** must be packed. */
static int64_t blas_inc(int64_t n, int64_t s) { return n == 1 ? 1 : (s >= 1 && s <= INT_MAX ? s : 0); }

/* Copy a rows x cols strided float32/float64 matrix to dense row-major dst. */
static void pack(void *dst, const char *src, size_t es, int64_t rows, int64_t cols,
                 int64_t rs, int64_t cs) {
  if (es == 4) {
    const float *s = (const float *)src;
    for (int64_t i = 0; i < rows; i++)
      for (int64_t j = 0; j < cols; j++) ((float *)dst)[i * cols + j] = s[i * rs + j * cs];
  } else {
    const double *s = (const double *)src;
    for (int64_t i = 0; i < rows; i++)
      for (int64_t j = 0; j < cols; j++) ((double *)dst)[i * cols + j] = s[i * rs + j * cs];
  }
}

/* One matrix (or vector) product through BLAS; a and b dense or BLAS-readable. */
static void blas_one(const mm_problem *p, const char *a, int64_t ars, int64_t acs,
                     const char *b, int64_t brs, int64_t bcs, char *c) {
  int M = (int)p->M, N = (int)p->N, K = (int)p->K;
  bool f32 = p->ct == EM_FLOAT32;
  enum CBLAS_TRANSPOSE ta = CblasNoTrans, tb = CblasNoTrans;
  int64_t lda = 1, ldb = 1;
  if (M == 1 && N == 1) {             /* dot */
    int ia = (int)blas_inc(K, acs), ib = (int)blas_inc(K, brs);
    if (f32) *(float *)c = cblas_sdot(K, (const float *)a, ia, (const float *)b, ib);
    else *(double *)c = cblas_ddot(K, (const double *)a, ia, (const double *)b, ib);
  } else if (N == 1) {                /* c (M) = A (M x K) . b (K) */
    blas_layout(p->M, p->K, ars, acs, &ta, &lda);
    int rows = ta == CblasNoTrans ? M : K, cols = ta == CblasNoTrans ? K : M;
    int ib = (int)blas_inc(K, brs);
    if (f32) cblas_sgemv(CblasRowMajor, ta, rows, cols, 1.0f, (const float *)a, (int)lda,
                         (const float *)b, ib, 0.0f, (float *)c, 1);
    else cblas_dgemv(CblasRowMajor, ta, rows, cols, 1.0, (const double *)a, (int)lda,
                     (const double *)b, ib, 0.0, (double *)c, 1);
  } else if (M == 1) {                /* c (N) = a (K) . B (K x N) = B^T a */
    blas_layout(p->K, p->N, brs, bcs, &tb, &ldb);
    /* B row-major K x N: use its transpose; B stored as N x K (Trans): as is */
    enum CBLAS_TRANSPOSE t = tb == CblasNoTrans ? CblasTrans : CblasNoTrans;
    int rows = tb == CblasNoTrans ? K : N, cols = tb == CblasNoTrans ? N : K;
    int ia = (int)blas_inc(K, acs);
    if (f32) cblas_sgemv(CblasRowMajor, t, rows, cols, 1.0f, (const float *)b, (int)ldb,
                         (const float *)a, ia, 0.0f, (float *)c, 1);
    else cblas_dgemv(CblasRowMajor, t, rows, cols, 1.0, (const double *)b, (int)ldb,
                     (const double *)a, ia, 0.0, (double *)c, 1);
  } else {
    blas_layout(p->M, p->K, ars, acs, &ta, &lda);
    blas_layout(p->K, p->N, brs, bcs, &tb, &ldb);
    if (f32) cblas_sgemm(CblasRowMajor, ta, tb, M, N, K, 1.0f, (const float *)a, (int)lda,
                         (const float *)b, (int)ldb, 0.0f, (float *)c, N);
    else cblas_dgemm(CblasRowMajor, ta, tb, M, N, K, 1.0, (const double *)a, (int)lda,
                     (const double *)b, (int)ldb, 0.0, (double *)c, N);
  }
}

/* Whether BLAS can read an operand as it is: as a matrix (gemm/gemv) or, in the
** vector shapes, as a vector with a non-zero stride. */
static bool a_ok(const mm_problem *p) {
  enum CBLAS_TRANSPOSE t;
  int64_t ld;
  if (p->M == 1) return blas_inc(p->K, p->a_cs) != 0;
  return blas_layout(p->M, p->K, p->a_rs, p->a_cs, &t, &ld);
}
static bool b_ok(const mm_problem *p) {
  enum CBLAS_TRANSPOSE t;
  int64_t ld;
  if (p->N == 1) return blas_inc(p->K, p->b_rs) != 0;
  return blas_layout(p->K, p->N, p->b_rs, p->b_cs, &t, &ld);
}

static em_status run_blas(em_state *S, mm_problem *p) {
  bool pa = !a_ok(p), pb = !b_ok(p);
  size_t es = p->es;
  char *sa = NULL, *sb = NULL;
  size_t na = (size_t)(p->M * p->K) * es, nbb = (size_t)(p->K * p->N) * es;
  if (pa && !(sa = emi_malloc(S, na))) goto nomem;
  if (pb && !(sb = emi_malloc(S, nbb))) goto nomem;
  int64_t last_ao = -1, last_bo = -1;
  for (int64_t bi = 0; bi < p->nbatch; bi++) {
    int64_t ao, bo;
    batch_offsets(p, bi, &ao, &bo);
    const char *a = p->A + ao * (int64_t)es, *b = p->B + bo * (int64_t)es;
    int64_t ars = p->a_rs, acs = p->a_cs, brs = p->b_rs, bcs = p->b_cs;
    if (pa) {   /* a broadcast batch matrix is packed once */
      if (ao != last_ao) pack(sa, a, es, p->M, p->K, ars, acs);
      a = sa; ars = p->K; acs = 1; last_ao = ao;
    }
    if (pb) {
      if (bo != last_bo) pack(sb, b, es, p->K, p->N, brs, bcs);
      b = sb; brs = p->N; bcs = 1; last_bo = bo;
    }
    blas_one(p, a, ars, acs, b, brs, bcs, p->C + bi * p->M * p->N * (int64_t)es);
  }
  emi_free(S, sa, na);
  emi_free(S, sb, nbb);
  return EM_OK;
nomem:
  emi_free(S, sa, na);
  return emi_error(S, EM_ERR_NOMEM, "matmul: out of memory packing a strided operand "
                   "(M=%lld, N=%lld, K=%lld)", (long long)p->M, (long long)p->N,
                   (long long)p->K);
}

/* -- Entry --------------------------------------------------------------------------- */

em_status emi_cpu_matmul(emi_device *dev, em_tensor *out, const em_tensor *a, const em_tensor *b) {
  em_state *S = dev->S;
  int nb = out->ndim - 2;
  mm_problem p = {.nb = nb, .M = out->sizes[nb], .N = out->sizes[nb + 1],
                  .K = a->sizes[nb + 1]};
  if (out->numel == 0) return EM_OK;
  if (p.K == 0) {   /* empty sums: zeros (all-zero bits in every dtype) */
    memset(em_tensor_data(out), 0, (size_t)out->numel * em_dtype_size(out->dtype));
    return EM_OK;
  }
  bool served;   /* oneDNN for the cases it measured faster at (dnnl.c) */
  em_status dst = emi_dnnl_matmul(S, out, a, b, &served);
  if (served || dst) return dst;
  p.ct = compute_type(out->dtype);
  p.es = em_dtype_size(p.ct);
  em_tensor *ca = NULL, *cb = NULL;
  void *cbuf = NULL;
  size_t cbytes = (size_t)out->numel * p.es;
  em_status st = EM_OK;
  if (a->dtype != p.ct && (st = convert_operand(S, a, p.ct, &ca))) goto done;
  if (b->dtype != p.ct && (st = convert_operand(S, b, p.ct, &cb))) goto done;
  if (out->dtype != p.ct && !(cbuf = emi_malloc(S, cbytes))) {
    st = emi_error(S, EM_ERR_NOMEM, "matmul: out of memory for a %s accumulation buffer "
                   "of shape %s", em_dtype_name(p.ct), emi_tshape(S, out));
    goto done;
  }
  const em_tensor *A = ca ? ca : a, *B = cb ? cb : b;
  p.nbatch = 1;
  for (int d = 0; d < nb; d++) {
    p.bsizes[d] = out->sizes[d];
    p.astr[d] = A->strides[d];
    p.bstr[d] = B->strides[d];
    p.nbatch *= out->sizes[d];
  }
  p.a_rs = A->strides[nb]; p.a_cs = A->strides[nb + 1];
  p.b_rs = B->strides[nb]; p.b_cs = B->strides[nb + 1];
  p.A = em_tensor_data(A);
  p.B = em_tensor_data(B);
  p.C = cbuf ? cbuf : em_tensor_data(out);

  bool fits = p.M <= INT_MAX && p.N <= INT_MAX && p.K <= INT_MAX;
  if (p.ct != EM_INT64 && fits && p.M * p.N * p.K > SMALL_MACS)
    st = run_blas(S, &p);
  else
    run_plain(S, &p);
  if (!st && cbuf) store_result(out, cbuf, p.ct, out->numel);
done:
  em_tensor_release(ca);
  em_tensor_release(cb);
  emi_free(S, cbuf, cbytes);
  return st;
}

/*
** reduce.c -- CPU reductions over any set of dims of any strided tensor: sum,
** mean, prod, amax, amin, logsumexp, any, all (emi_cpu_reduce), var/std
** (emi_cpu_var) and p-norms (emi_cpu_norm). max/min along a dim are in
** reduce_arg.c, softmax in softmax.c; the plan and loop helpers they share are
** in reduce.h.
**
** How it works. A reduction is "res[k] = COMB over r of f(a[k, r])" for K
** outputs of R elements each. emi_reduce_plan splits a's dims into kept dims
** (in logical order, so that the linear index k over them is the offset into
** the contiguous `out`) and reduced dims (sorted by stride, innermost last),
** drops size-1 dims and merges neighbours whose strides allow. Then one of two
** shapes:
**
**   INNER  the innermost reduced dim is walked as segments: each output reduces
**          its segments with a kernel of independent lanes (vectorises without
**          -ffast-math, since no lane's sum is reassociated). When a kept dim
**          lies between reduced ones (mean over (0, 2, 3) of NCHW), a block of
**          outputs is walked together in memory order.
**   OUTER  a kept dim is contiguous in a (column sums, sum(0) of (N, C), mean
**          over a batch): whole rows are folded into a vector of per-column
**          accumulators, acc[j] op= f(row[j]), again vectorisable. When rows are
**          short and back to back, q rows are taken as one longer row and the
**          lanes folded by column at the end.
**
** Precision: float inputs accumulate in double. The float32 sums (sum, mean,
** the 2- and 1-norms) first add short runs in float (16 elements per lane, or
** 4 rows), then go to double: as accurate as PyTorch's cascade sum and at
** memory speed; the other kinds convert every element. Integer sums and
** products are exact in int64 with two's complement wrap-around, as PyTorch's.
**
** Determinism: a long reduction is cut into blocks of a fixed number of
** elements (BLOCK) whatever the thread count; each block gives a partial and
** the partials are combined in block order. Threads only pick which blocks
** they run, so results never depend on timing or on the number of threads.
**
** Two-pass ops use the same machinery twice: var = mean first, then the sum of
** squared deviations from it; logsumexp = amax first, then sum(exp(x - max)).
*/
#include "reduce.h"
#include "vecmath.h"
#include "vmath.h"
#include <math.h>
#include <stdlib.h>

enum {
  LANES = 16,        /* independent accumulators of the segment kernels */
  BLOCK = 65536,     /* elements per partial of a long reduction */
  CB = EMI_CB,
  CHUNK = EMI_CHUNK,
};

/* -- Accumulation kinds -------------------------------------------------------
** F kinds accumulate doubles: acc = COMB(acc, EXPR(x)), x a double, s the
** output's shift (var, logsumexp), p the norm's exponent. I kinds accumulate
** int64 for integer sums, products, max and min. */
enum {
  K_SUM, K_SUMEXP, K_SUMSQDEV, K_SUMABS, K_SUMSQ, K_SUMPOW, K_CNTNZ,
  K_PROD, K_MAX, K_MIN, K_MAXABS, K_MINABS, K_NF,
  K_ISUM = K_NF, K_IPROD, K_IMAX, K_IMIN
};
enum { C_ADD, C_MUL, C_MAX, C_MIN };

/* NaN-propagating: once acc is NaN no comparison replaces it. `|`, not `||`:
** a branch-free condition is what lets GCC vectorise the loops. */
#define COMB_MAX(a, b) ((((b) > (a)) | ((b) != (b))) ? (b) : (a))
#define COMB_MIN(a, b) ((((b) < (a)) | ((b) != (b))) ? (b) : (a))

/* Each kernel below is written once as a function of the kind and of the
** element type, inlined into one small wrapper per kind and type: in each
** wrapper the kind is a constant, its switches fold away, and the loop
** vectorises as if it had been written for that kind alone. */
#define INLINE static inline __attribute__((always_inline))

INLINE double comb(int c, double a, double b) {
  switch (c) {
  case C_ADD: return a + b;
  case C_MUL: return a * b;
  case C_MAX: return COMB_MAX(a, b);
  default: return COMB_MIN(a, b);
  }
}

/* What kind k accumulates for an element x: s is the output's shift (var,
** logsumexp), p the norm's exponent. */
INLINE double term(int k, double x, double s, double p) {
  switch (k) {
  case K_SUMEXP: return exp(x - s);
  case K_SUMSQDEV: return (x - s) * (x - s);
  case K_SUMABS: case K_MAXABS: case K_MINABS: return fabs(x);
  case K_SUMSQ: return x * x;
  case K_SUMPOW: return pow(fabs(x), p);
  case K_CNTNZ: return (double)(x != 0);
  default: return x;                   /* K_SUM, K_PROD, K_MAX, K_MIN */
  }
}

/* How kind k combines its terms, and the identity it starts from. */
INLINE int kind_comb(int k) {
  switch (k) {
  case K_PROD: return C_MUL;
  case K_MAX: case K_MAXABS: return C_MAX;
  case K_MIN: case K_MINABS: return C_MIN;
  default: return C_ADD;
  }
}
INLINE double kind_id(int k) {
  switch (k) {
  case K_PROD: return 1.0;
  case K_MAX: return -INFINITY;
  case K_MIN: case K_MINABS: return INFINITY;
  default: return 0.0;
  }
}

/* Element i of a float (f64 = 0) or double (f64 = 1) array, as a double. */
INLINE double load(const void *restrict a, int64_t i, int f64) {
  return f64 ? ((const double *)a)[i] : (double)((const float *)a)[i];
}

/* Segment kernel: kind k reduces n contiguous values into one double, in
** LANES independent accumulators folded by halves at the end. */
INLINE double seg(int k, int f64, const void *restrict a, int64_t n, double s, double p) {
  int c = kind_comb(k);
  double acc[LANES];
  if (n <= LANES) {            /* short rows: skip the lanes' set-up and fold */
    double r = kind_id(k);
    for (int64_t i = 0; i < n; i++) r = comb(c, r, term(k, load(a, i, f64), s, p));
    return r;
  }
  for (int j = 0; j < LANES; j++) acc[j] = kind_id(k);
  int64_t i = 0;
  for (; i + LANES <= n; i += LANES)
    for (int j = 0; j < LANES; j++)
      acc[j] = comb(c, acc[j], term(k, load(a, i + j, f64), s, p));
  for (int j = 0; i < n; i++, j++) acc[j] = comb(c, acc[j], term(k, load(a, i, f64), s, p));
  for (int w = LANES / 2; w > 0; w /= 2)
    for (int j = 0; j < w; j++) acc[j] = comb(c, acc[j], acc[j + w]);
  return acc[0];
}

/* Rows kernel: acc[j] = COMB(acc[j], term(row_r[j])) for nrows rows of M
** contiguous values, rs bytes apart; sh[j] is column j's shift. */
INLINE void rows(int k, int f64, double *restrict acc, const char *base, int64_t M,
                 int64_t nrows, int64_t rs, const double *restrict sh, double p) {
  int c = kind_comb(k);
  for (int64_t r = 0; r < nrows; r++) {
    const double *restrict ad = (const double *)(base + r * rs);
    const float *restrict af = (const float *)(base + r * rs);
    if (f64)
      for (int64_t j = 0; j < M; j++) acc[j] = comb(c, acc[j], term(k, ad[j], sh[j], p));
    else
      for (int64_t j = 0; j < M; j++) acc[j] = comb(c, acc[j], term(k, af[j], sh[j], p));
  }
}

/* NAME_seg32, NAME_seg64, NAME_rows32 and NAME_rows64: the kernels of kind K
** (the table below keeps only those it uses). */
#define SEG_FN(NAME, T, K, F64)                                                     \
  static __attribute__((unused)) double NAME(const T *restrict a, int64_t n, double s, \
                                             double p) { return seg(K, F64, a, n, s, p); }
#define ROWS_FN(NAME, K, F64)                                                       \
  static __attribute__((unused)) void NAME(double *restrict acc, const char *base, int64_t M, \
      int64_t nrows, int64_t rs, const double *restrict sh, double p) {             \
    rows(K, F64, acc, base, M, nrows, rs, sh, p); }
#define KIND_FNS(NAME, K) SEG_FN(NAME##_seg32, float, K, 0) SEG_FN(NAME##_seg64, double, K, 1) \
  ROWS_FN(NAME##_rows32, K, 0) ROWS_FN(NAME##_rows64, K, 1)

KIND_FNS(k_sum, K_SUM)
KIND_FNS(k_sumexp, K_SUMEXP)
KIND_FNS(k_sumsqdev, K_SUMSQDEV)
KIND_FNS(k_sumabs, K_SUMABS)
KIND_FNS(k_sumsq, K_SUMSQ)
KIND_FNS(k_sumpow, K_SUMPOW)
KIND_FNS(k_cntnz, K_CNTNZ)
KIND_FNS(k_prod, K_PROD)
KIND_FNS(k_max, K_MAX)
KIND_FNS(k_min, K_MIN)
KIND_FNS(k_maxabs, K_MAXABS)
KIND_FNS(k_minabs, K_MINABS)

/* float32 fast kernels for the hot kinds (K_SUM, K_SUMSQ, K_SUMABS). Sums read
** the segment as four streams at once (its quarters): one stream leaves the
** core waiting on memory -- the hardware prefetcher runs ahead of one stream
** only so far -- and four double the bytes per second out of L3 or DRAM on
** the machines measured (16 MB: 15 -> 35 GB/s on one core of an AMD EPYC).
** Each stream has two 8-float vector lanes that add runs of 16 elements in
** float (so float rounding stays tiny), then every run goes into double lanes;
** this runs at memory speed where converting every element to double would
** not. The order of additions depends on n alone: results are bitwise the
** same on every run. max/min: emi_extreme_f32 (vecmath.h). */

/* The term of those kinds in float. */
INLINE float fterm(int k, float x) {
  return k == K_SUMSQ ? x * x : k == K_SUMABS ? fabsf(x) : x;
}

typedef float v8f __attribute__((vector_size(32), aligned(4)));
typedef double v4d __attribute__((vector_size(32)));
typedef int32_t v8i __attribute__((vector_size(32)));

/* *acc += the terms of the 8 floats at p (by pointer: no vector passes by value,
** whose ABI differs between builds with and without AVX) */
INLINE void vfadd(int k, v8f *acc, const float *p) {
  v8f x = *(const v8f *)p;
  if (k == K_SUMSQ) x = x * x;
  if (k == K_SUMABS) x = (v8f)((v8i)x & 0x7fffffff);
  *acc += x;
}

enum { FRUN = 16 };        /* elements per float lane before they go to double */

/* The 8 float lanes' runs g[0..7] added into the 16 double lanes d. */
INLINE void runs_to_double(v4d *d, const v8f *g) {
  for (int j = 0; j < 8; j++) {
    d[2 * j] += __builtin_convertvector(__builtin_shufflevector(g[j], g[j], 0, 1, 2, 3), v4d);
    d[2 * j + 1] += __builtin_convertvector(__builtin_shufflevector(g[j], g[j], 4, 5, 6, 7), v4d);
  }
}

INLINE double fsum(int k, const float *restrict a, int64_t n) {
  if (n <= 16) {                  /* short rows: no lanes to set up and fold */
    double r = 0;
    for (int64_t i = 0; i < n; i++) r += term(k, a[i], 0, 0);
    return r;
  }
  /* (streams of q elements, q a whole number of runs of 16 per lane) */
  int64_t q = (n / 4) & ~(int64_t)(16 * FRUN - 1);
  v4d d[16] = {{0}};
  if (q > 0) {
    const float *restrict s0 = a, *restrict s1 = a + q, *restrict s2 = a + 2 * q,
                *restrict s3 = a + 3 * q;
    for (int64_t i = 0; i < q; i += 16 * FRUN) {
      v8f g[8] = {{0}};
      for (int64_t e = i; e < i + 16 * FRUN; e += 16) {
        vfadd(k, &g[0], s0 + e);
        vfadd(k, &g[1], s0 + e + 8);
        vfadd(k, &g[2], s1 + e);
        vfadd(k, &g[3], s1 + e + 8);
        vfadd(k, &g[4], s2 + e);
        vfadd(k, &g[5], s2 + e + 8);
        vfadd(k, &g[6], s3 + e);
        vfadd(k, &g[7], s3 + e + 8);
      }
      runs_to_double(d, g);
    }
  }
  /* the rest (all of a short segment): one stream of 64 float lanes over whole
  ** 64s, runs of 16 per lane again; then 16 double lanes */
  int64_t i = 4 * q;
  while (i + 64 <= n) {
    int64_t blk = n - i >= 64 * FRUN ? 64 * FRUN : (n - i) & ~(int64_t)63;
    v8f g[8] = {{0}};
    for (int64_t e = i; e < i + blk; e += 64)
      for (int j = 0; j < 8; j++) vfadd(k, &g[j], a + e + 8 * j);
    runs_to_double(d, g);
    i += blk;
  }
  double t[16] = {0};
  for (; i + 16 <= n; i += 16)
    for (int j = 0; j < 16; j++) t[j] += term(k, a[i + j], 0, 0);
  for (int j = 0; i < n; i++, j++) t[j] += term(k, a[i], 0, 0);
  for (int j = 0; j < 4; j++) d[0][j] += (t[j] + t[j + 4]) + (t[j + 8] + t[j + 12]);
  for (int w = 8; w >= 1; w /= 2)
    for (int j = 0; j < w; j++) d[j] += d[j + w];
  return (d[0][0] + d[0][2]) + (d[0][1] + d[0][3]);
}

/* Rows of float32 summed into double column accumulators: four rows are
** added in float first (pairwise), so the accumulator row is loaded and stored
** once per four input rows. */
INLINE void frows(int k, double *restrict acc, const char *base, int64_t M, int64_t nrows,
                  int64_t rs) {
  int64_t r = 0;
  for (; r + 4 <= nrows; r += 4) {
    const float *restrict a0 = (const float *)(base + r * rs);
    const float *restrict a1 = (const float *)(base + (r + 1) * rs);
    const float *restrict a2 = (const float *)(base + (r + 2) * rs);
    const float *restrict a3 = (const float *)(base + (r + 3) * rs);
    for (int64_t j = 0; j < M; j++) {
      float t0 = fterm(k, a0[j]), t1 = fterm(k, a1[j]), t2 = fterm(k, a2[j]),
            t3 = fterm(k, a3[j]);
      acc[j] += (double)((t0 + t1) + (t2 + t3));
    }
  }
  for (; r < nrows; r++) {
    const float *restrict a = (const float *)(base + r * rs);
    for (int64_t j = 0; j < M; j++) acc[j] += term(k, a[j], 0, 0);
  }
}

/* SEG and ROWS: the float32 fast kernels of kind K. */
#define FSUM_FNS(SEG, ROWS, K)                                                      \
  static double SEG(const float *restrict a, int64_t n, double s, double p) {       \
    return fsum(K, a, n); }                                                         \
  static void ROWS(double *restrict acc, const char *base, int64_t M, int64_t nrows, \
      int64_t rs, const double *restrict sh, double p) { frows(K, acc, base, M, nrows, rs); }
FSUM_FNS(fsum32, frows_sum32, K_SUM)
FSUM_FNS(fsumsq32, frows_sumsq32, K_SUMSQ)
FSUM_FNS(fsumabs32, frows_sumabs32, K_SUMABS)

static double fmax32(const float *restrict a, int64_t n, double s, double p) {
  (void)s; (void)p;
  return emi_extreme_f32(a, n, 1);
}
static double fmin32(const float *restrict a, int64_t n, double s, double p) {
  (void)s; (void)p;
  return emi_extreme_f32(a, n, 0);
}

/* exp(x - s) summed, float32: the exps come from the vectorisable emi_vexpf
** (about 1 ulp) in blocks, and are added in double lanes. */
static double fsumexp32(const float *restrict a, int64_t n, double s, double p) {
  float sf = (float)s, e[256];
  double d[32] = {0};
  (void)p;
  for (int64_t i = 0; i < n; i += 256) {
    int64_t m = n - i < 256 ? n - i : 256, k = 0;
    for (int64_t c = 0; c < m; c++) e[c] = emi_vexpf(a[i + c] - sf);
    for (; k + 32 <= m; k += 32)
      for (int j = 0; j < 32; j++) d[j] += e[k + j];
    for (int j = 0; k < m; k++, j++) d[j] += e[k];
  }
  for (int w = 16; w > 0; w /= 2)
    for (int j = 0; j < w; j++) d[j] += d[j + w];
  return d[0];
}

static void fsumexp_rows32(double *restrict acc, const char *base, int64_t M,
                           int64_t nrows, int64_t rs, const double *restrict sh,
                           double p) {
  float shf[CB], e[CB];       /* M <= CB: a column block, or q short rows */
  (void)p;
  for (int64_t c = 0; c < M; c++) shf[c] = (float)sh[c];
  for (int64_t r = 0; r < nrows; r++) {
    const float *restrict a = (const float *)(base + r * rs);
    for (int64_t c = 0; c < M; c++) e[c] = emi_vexpf(a[c] - shf[c]);
    for (int64_t c = 0; c < M; c++) acc[c] += e[c];
  }
}

typedef double (*seg32_fn)(const float *, int64_t, double, double);
typedef double (*seg64_fn)(const double *, int64_t, double, double);
typedef void (*rows_fn)(double *, const char *, int64_t, int64_t, int64_t,
                        const double *, double);
typedef struct fkind {
  seg32_fn seg32;
  seg64_fn seg64;
  rows_fn rows32, rows64;
  int comb;
  double id;
} fkind;

/* FK: the macro-made kernels; FK32 / FKS32: a float32 fast segment kernel
** (and rows kernel) in place of the generic one. */
#define FK(NAME, C, ID) \
  {NAME##_seg32, NAME##_seg64, NAME##_rows32, NAME##_rows64, C, ID}
#define FK32(NAME, SEG32, C, ID) {SEG32, NAME##_seg64, NAME##_rows32, NAME##_rows64, C, ID}
#define FKS32(NAME, SEG32, ROWS32) {SEG32, NAME##_seg64, ROWS32, NAME##_rows64, C_ADD, 0.0}
static const fkind FKINDS[K_NF] = {
  [K_SUM] = FKS32(k_sum, fsum32, frows_sum32),
  [K_SUMEXP] = FKS32(k_sumexp, fsumexp32, fsumexp_rows32),
  [K_SUMSQDEV] = FK(k_sumsqdev, C_ADD, 0.0),
  [K_SUMABS] = FKS32(k_sumabs, fsumabs32, frows_sumabs32),
  [K_SUMSQ] = FKS32(k_sumsq, fsumsq32, frows_sumsq32),
  [K_SUMPOW] = FK(k_sumpow, C_ADD, 0.0),
  [K_CNTNZ] = FK(k_cntnz, C_ADD, 0.0),
  [K_PROD] = FK(k_prod, C_MUL, 1.0),
  [K_MAX] = FK32(k_max, fmax32, C_MAX, -INFINITY),
  [K_MIN] = FK32(k_min, fmin32, C_MIN, INFINITY),
  [K_MAXABS] = FK(k_maxabs, C_MAX, 0.0),
  [K_MINABS] = FK(k_minabs, C_MIN, INFINITY),
};

/* Integer kinds: wrap-around arithmetic through uint64 (no signed overflow). */
static inline int64_t icomb(int kind, int64_t a, int64_t b) {
  switch (kind) {
  case K_ISUM: return (int64_t)((uint64_t)a + (uint64_t)b);
  case K_IPROD: return (int64_t)((uint64_t)a * (uint64_t)b);
  case K_IMAX: return b > a ? b : a;
  default: return b < a ? b : a;
  }
}
static int64_t iident(int kind) {
  switch (kind) {
  case K_ISUM: return 0;
  case K_IPROD: return 1;
  case K_IMAX: return INT64_MIN;
  default: return INT64_MAX;
  }
}
/* The kind is a constant inside each loop, so icomb's switch folds away. */
#define ILOOP(KIND, N, STMT) \
  case KIND: for (int64_t i = 0; i < (N); i++) { STMT; } break
static int64_t iseg(int kind, const int64_t *a, int64_t n, int64_t acc) {
  switch (kind) {
  ILOOP(K_ISUM, n, acc = icomb(K_ISUM, acc, a[i]));
  ILOOP(K_IPROD, n, acc = icomb(K_IPROD, acc, a[i]));
  ILOOP(K_IMAX, n, acc = icomb(K_IMAX, acc, a[i]));
  default: for (int64_t i = 0; i < n; i++) acc = icomb(K_IMIN, acc, a[i]); break;
  }
  return acc;
}
static void irows(int kind, int64_t *acc, const int64_t *a, int64_t M) {
  switch (kind) {
  ILOOP(K_ISUM, M, acc[i] = icomb(K_ISUM, acc[i], a[i]));
  ILOOP(K_IPROD, M, acc[i] = icomb(K_IPROD, acc[i], a[i]));
  ILOOP(K_IMAX, M, acc[i] = icomb(K_IMAX, acc[i], a[i]));
  default: for (int64_t i = 0; i < M; i++) acc[i] = icomb(K_IMIN, acc[i], a[i]); break;
  }
}

/* -- Loading any dtype ---------------------------------------------------------
** n elements st bytes apart, into a double or int64 buffer. */
#define LOAD(T, CONV) for (int64_t i = 0; i < n; i++) buf[i] = CONV(*(const T *)(p + i * st))
#define AS_IS(v) (v)
#define NONZERO(v) ((v) != 0)
void emi_load_row_f64(double *buf, const char *p, int64_t n, int64_t st, em_dtype dt) {
  switch (dt) {
  case EM_FLOAT32: LOAD(float, AS_IS); break;
  case EM_FLOAT64: LOAD(double, AS_IS); break;
  case EM_FLOAT16: LOAD(uint16_t, emi_half_to_float); break;
  case EM_BFLOAT16: LOAD(uint16_t, emi_bf16_to_float); break;
  case EM_INT32: LOAD(int32_t, AS_IS); break;
  case EM_INT64: LOAD(int64_t, (double)); break;
  case EM_UINT8: LOAD(uint8_t, AS_IS); break;
  case EM_BOOL: LOAD(uint8_t, NONZERO); break;
  default: for (int64_t i = 0; i < n; i++) buf[i] = 0; break;
  }
}

void emi_load_row_i64(int64_t *buf, const char *p, int64_t n, int64_t st, em_dtype dt) {
  switch (dt) {
  case EM_INT32: LOAD(int32_t, AS_IS); break;
  case EM_INT64: LOAD(int64_t, AS_IS); break;
  case EM_UINT8: LOAD(uint8_t, AS_IS); break;
  case EM_BOOL: LOAD(uint8_t, NONZERO); break;
  default: for (int64_t i = 0; i < n; i++) buf[i] = (int64_t)emi_load_f64(p + i * st, dt); break;
  }
}
#undef LOAD

static void store_i64(void *p, em_dtype dt, int64_t v) {
  switch (dt) {
  case EM_INT64: *(int64_t *)p = v; break;
  case EM_INT32: *(int32_t *)p = (int32_t)v; break;
  case EM_UINT8: *(uint8_t *)p = (uint8_t)v; break;
  case EM_BOOL: *(uint8_t *)p = v != 0; break;
  default: emi_store_f64(p, dt, (double)v); break;
  }
}

/* -- Plan -------------------------------------------------------------------- */


void emi_reduce_plan(emi_rplan *pl, const em_tensor *a, unsigned mask) {
  int64_t esz = (int64_t)em_dtype_size(a->dtype);
  int64_t ost[EM_MAX_DIMS], s = 1;
  pl->base = em_tensor_data(a);
  pl->dt = a->dtype;
  pl->esz = esz;
  pl->K = pl->R = 1;
  pl->nk = pl->nr = 0;
  pl->outer = 0;
  pl->vk = -1;
  for (int d = a->ndim - 1; d >= 0; d--)
    if (!(mask >> d & 1)) { ost[d] = s; s *= a->sizes[d]; }
  for (int d = 0; d < a->ndim; d++) {
    int64_t n = a->sizes[d], st = a->strides[d] * esz;
    if (mask >> d & 1) {
      pl->R *= n;
      if (n != 1) { pl->rsz[pl->nr] = n; pl->rst[pl->nr++] = st; }
      continue;
    }
    pl->K *= n;
    if (n == 1) continue;
    int m = pl->nk - 1;
    if (m >= 0 && pl->kst[m] == st * n) {   /* merge into the previous kept dim */
      pl->ksz[m] *= n;
      pl->kst[m] = st;
      pl->kos[m] = ost[d];
    } else {
      pl->ksz[pl->nk] = n;
      pl->kst[pl->nk] = st;
      pl->kos[pl->nk++] = ost[d];
    }
  }
  /* Reduced dims: the order does not change the result's meaning, so sort by
  ** decreasing |stride| (innermost last), then merge. */
  for (int i = 1; i < pl->nr; i++)
    for (int j = i; j > 0 && llabs(pl->rst[j]) > llabs(pl->rst[j - 1]); j--) {
      int64_t t = pl->rst[j]; pl->rst[j] = pl->rst[j - 1]; pl->rst[j - 1] = t;
      t = pl->rsz[j]; pl->rsz[j] = pl->rsz[j - 1]; pl->rsz[j - 1] = t;
    }
  int m = 0;
  for (int i = 1; i < pl->nr; i++) {
    if (pl->rst[m] == pl->rst[i] * pl->rsz[i]) {
      pl->rsz[m] *= pl->rsz[i];
      pl->rst[m] = pl->rst[i];
    } else {
      m++;
      pl->rsz[m] = pl->rsz[i];
      pl->rst[m] = pl->rst[i];
    }
  }
  pl->nr = pl->nr ? m + 1 : 0;
  if (pl->nr == 0) { pl->rsz[0] = 1; pl->rst[0] = 0; pl->nr = 1; }
  if (pl->rst[pl->nr - 1] != esz)
    for (int i = 0; i < pl->nk; i++)
      if (pl->kst[i] == esz) { pl->outer = 1; pl->vk = i; }
}

/* -- Jobs ---------------------------------------------------------------------- */

typedef union racc { double f; int64_t i; } racc;

enum { FIN_ID, FIN_MEAN, FIN_SQRT, FIN_ROOT, FIN_LSE, FIN_LSESHIFT, FIN_VAR, FIN_STD,
       FIN_ANY, FIN_ALL };

typedef struct rjob {
  emi_rplan pl;
  int kind, icls;
  double p;              /* norm exponent */
  const double *shift;   /* per output (indexed by out offset), or NULL */
  int fin;
  double fin_arg;        /* FIN_ROOT: 1/p; FIN_VAR/STD: the correction */
  char *obase;           /* out data, out dtype */
  em_dtype odt;
  int64_t osz;
  double *dres;          /* when set, results go here as doubles instead */
  racc *partial;         /* nb > 1: partial[b * K + k] */
  int64_t nb, rb;        /* blocks per output and reduced elements per block */
  int64_t kblk;          /* INNER, nb == 1: outputs per task (inner_block) when > 1 */
  int64_t M, W, ncb, Ko; /* OUTER: vector length, task width, column blocks, rows of k */
  int kon;
  int64_t kosz[EM_MAX_DIMS], kost[EM_MAX_DIMS], kooo[EM_MAX_DIMS];
} rjob;

static inline void finish(const rjob *j, int64_t k, racc acc) {
  if (j->icls) { store_i64(j->obase + k * j->osz, j->odt, acc.i); return; }
  double v = acc.f, R = (double)j->pl.R;
  if (!j->dres && j->odt == EM_FLOAT32 && (j->fin == FIN_ID || j->fin == FIN_MEAN)) {
    ((float *)j->obase)[k] = (float)(j->fin == FIN_MEAN ? v / R : v);  /* common cases */
    return;
  }
  switch (j->fin) {
  case FIN_MEAN: v = v / R; break;
  case FIN_SQRT: v = sqrt(v); break;
  case FIN_ROOT: v = pow(v, j->fin_arg); break;
  case FIN_LSE: v = log(v) + j->shift[k]; break;
  case FIN_LSESHIFT: if (isinf(v)) v = 0; break;   /* all -inf, or +inf present */
  case FIN_VAR: case FIN_STD: {
    double dof = R - j->fin_arg;
    v = v / (dof > 0 ? dof : 0);
    if (j->fin == FIN_STD) v = sqrt(v);
    break;
  }
  case FIN_ANY: v = v > 0; break;
  case FIN_ALL: v = v == R; break;
  default: break;
  }
  if (j->dres) j->dres[k] = v;
  else emi_store_f64(j->obase + k * j->osz, j->odt, v);
}

/* Fold one segment of n elements, sst bytes apart, into acc. */
static inline racc seg_acc(const rjob *j, const char *p, int64_t n, int64_t sst, racc acc,
                           double s) {
  const emi_rplan *pl = &j->pl;
  if (j->icls) {
    int64_t buf[CHUNK];
    for (int64_t c = 0; c < n; c += CHUNK) {
      int64_t m = n - c < CHUNK ? n - c : CHUNK;
      emi_load_row_i64(buf, p + c * sst, m, sst, pl->dt);
      acc.i = iseg(j->kind, buf, m, acc.i);
    }
    return acc;
  }
  const fkind *fk = &FKINDS[j->kind];
  if (sst == pl->esz && pl->dt == EM_FLOAT32) {
    acc.f = comb(fk->comb, acc.f, fk->seg32((const float *)p, n, s, j->p));
  } else if (sst == pl->esz && pl->dt == EM_FLOAT64) {
    acc.f = comb(fk->comb, acc.f, fk->seg64((const double *)p, n, s, j->p));
  } else {
    double buf[CHUNK];
    for (int64_t c = 0; c < n; c += CHUNK) {
      int64_t m = n - c < CHUNK ? n - c : CHUNK;
      emi_load_row_f64(buf, p + c * sst, m, sst, pl->dt);
      acc.f = comb(fk->comb, acc.f, fk->seg64(buf, m, s, j->p));
    }
  }
  return acc;
}

static inline racc ident(const rjob *j) {
  racc a;
  if (j->icls) a.i = iident(j->kind); else a.f = FKINDS[j->kind].id;
  return a;
}

/* Reduce the reduced elements [r0, r1) of the output whose input starts at p0:
** segments along the innermost reduced dim, the outer reduced dims walked. */
static racc inner_range(const rjob *j, const char *p0, int64_t r0, int64_t r1, double s) {
  const emi_rplan *pl = &j->pl;
  int nr = pl->nr;
  int64_t L = pl->rsz[nr - 1], sst = pl->rst[nr - 1];
  emi_walker w;
  emi_walk_init(&w, nr - 1, pl->rsz, pl->rst, NULL, r0 ? r0 / L : 0);
  int64_t ri = r0 ? r0 % L : 0;
  racc acc = ident(j);
  for (int64_t r = r0; r < r1;) {
    int64_t n = L - ri < r1 - r ? L - ri : r1 - r;
    acc = seg_acc(j, p0 + w.off + ri * sst, n, sst, acc, s);
    r += n;
    ri = 0;
    emi_walk_next(&w);
  }
  return acc;
}

/* Outputs [k0, k1) together, in memory order: for each position of the outer
** reduced dims, one segment per output. When a kept dim lies between reduced
** ones (mean over (0, 2, 3) of NCHW) this reads memory front to back instead
** of jumping between short segments far apart; each output still folds its
** segments in the same order, so results are those of inner_range. */
static void inner_block(const rjob *j, int64_t k0, int64_t k1) {
  enum { KB = 64 };
  const emi_rplan *pl = &j->pl;
  int nr = pl->nr;
  int64_t L = pl->rsz[nr - 1], sst = pl->rst[nr - 1], Ro = pl->R / L;
  emi_walker kw;
  emi_walk_init(&kw, pl->nk, pl->ksz, pl->kst, NULL, k0);
  for (int64_t kb = k0; kb < k1; kb += KB) {
    int64_t nk = k1 - kb < KB ? k1 - kb : KB;
    int64_t koff[KB];
    racc acc[KB];
    double sh[KB];
    for (int64_t i = 0; i < nk; i++, emi_walk_next(&kw)) {
      koff[i] = kw.off;
      acc[i] = ident(j);
      sh[i] = j->shift ? j->shift[kb + i] : 0;
    }
    emi_walker rw;
    emi_walk_init(&rw, nr - 1, pl->rsz, pl->rst, NULL, 0);
    for (int64_t ro = 0; ro < Ro; ro++, emi_walk_next(&rw))
      for (int64_t i = 0; i < nk; i++)
        acc[i] = seg_acc(j, pl->base + koff[i] + rw.off, L, sst, acc[i], sh[i]);
    for (int64_t i = 0; i < nk; i++) finish(j, kb + i, acc[i]);
  }
}

/* INNER tasks: t = k * nb + b. */
static void inner_task(void *ctx, int64_t t0, int64_t t1) {
  const rjob *j = ctx;
  const emi_rplan *pl = &j->pl;
  if (j->nb == 1) {
    emi_walker kw;
    emi_walk_init(&kw, pl->nk, pl->ksz, pl->kst, NULL, t0);
    int64_t L = pl->rsz[0];
    if (!j->icls && pl->nr == 1 && pl->rst[0] == pl->esz &&
        (pl->dt == EM_FLOAT32 || pl->dt == EM_FLOAT64)) {
      /* One contiguous segment per output (sum(-1) of a matrix): no walking. */
      const fkind *fk = &FKINDS[j->kind];
      for (int64_t k = t0; k < t1; k++, emi_walk_next(&kw)) {
        const char *p = pl->base + kw.off;
        double s = j->shift ? j->shift[k] : 0;
        racc acc;
        acc.f = pl->dt == EM_FLOAT32 ? fk->seg32((const float *)p, L, s, j->p)
                                     : fk->seg64((const double *)p, L, s, j->p);
        finish(j, k, acc);
      }
      return;
    }
    if (j->kblk > 1) {       /* tasks are blocks of outputs */
      int64_t k1 = t1 * j->kblk < pl->K ? t1 * j->kblk : pl->K;
      inner_block(j, t0 * j->kblk, k1);
      return;
    }
    for (int64_t k = t0; k < t1; k++, emi_walk_next(&kw)) {
      racc acc = inner_range(j, pl->base + kw.off, 0, pl->R, j->shift ? j->shift[k] : 0);
      finish(j, k, acc);
    }
    return;
  }
  for (int64_t t = t0; t < t1; t++) {
    int64_t k = t / j->nb, b = t % j->nb;
    emi_walker kw;
    emi_walk_init(&kw, pl->nk, pl->ksz, pl->kst, NULL, k);
    int64_t r0 = b * j->rb, r1 = r0 + j->rb < pl->R ? r0 + j->rb : pl->R;
    j->partial[b * pl->K + k] =
        inner_range(j, pl->base + kw.off, r0, r1, j->shift ? j->shift[k] : 0);
  }
}

/* Fold rows [r0, r1) of the reduced space into acc[0..W): columns start at p0. */
static void outer_rows(const rjob *j, const char *p0, int64_t W, int64_t r0, int64_t r1,
                       racc *acc, const double *sh) {
  const emi_rplan *pl = &j->pl;
  int nr = pl->nr;
  int64_t L = pl->rsz[nr - 1], rs = pl->rst[nr - 1], esz = pl->esz;
  emi_walker w;
  emi_walk_init(&w, nr - 1, pl->rsz, pl->rst, NULL, r0 / L);
  int64_t ri = r0 % L;
  const fkind *fk = j->icls ? NULL : &FKINDS[j->kind];
  int native = !j->icls && (pl->dt == EM_FLOAT32 || pl->dt == EM_FLOAT64);
  rows_fn rows = !fk ? NULL : pl->dt == EM_FLOAT32 ? fk->rows32 : fk->rows64;
  for (int64_t r = r0; r < r1;) {
    int64_t n = L - ri < r1 - r ? L - ri : r1 - r;
    const char *p = p0 + w.off + ri * rs;
    r += n;
    ri = 0;
    emi_walk_next(&w);
    if (native) {
      double *da = &acc[0].f;
      /* Short rows back to back: take q rows as one row of M*q columns. */
      if (W == j->M && W < 32 && rs == W * esz) {
        int64_t q = (64 + W - 1) / W, W2 = W * q, ng = n / q;
        if (ng >= 2) {
          double acc2[128], sh2[128];
          for (int64_t c = 0; c < W2; c++) { acc2[c] = fk->id; sh2[c] = sh[c % W]; }
          rows(acc2, p, W2, ng, W2 * esz, sh2, j->p);
          for (int64_t c = 0; c < W2; c++) da[c % W] = comb(fk->comb, da[c % W], acc2[c]);
          p += ng * q * rs;
          n -= ng * q;
        }
      }
      rows(da, p, W, n, rs, sh, j->p);
      continue;
    }
    for (int64_t i = 0; i < n; i++, p += rs) {
      if (j->icls) {
        int64_t buf[CB];
        emi_load_row_i64(buf, p, W, esz, pl->dt);
        irows(j->kind, &acc[0].i, buf, W);
      } else {
        double buf[CB];
        emi_load_row_f64(buf, p, W, esz, pl->dt);
        fk->rows64(&acc[0].f, (const char *)buf, W, 1, 0, sh, j->p);
      }
    }
  }
}

/* OUTER tasks: t = (ko * ncb + cb) * nb + b. */
static void outer_task(void *ctx, int64_t t0, int64_t t1) {
  const rjob *j = ctx;
  const emi_rplan *pl = &j->pl;
  int64_t vos = pl->kos[pl->vk];
  static const double zeros[CB];
  for (int64_t t = t0; t < t1; t++) {
    int64_t b = t % j->nb, cb = t / j->nb % j->ncb, ko = t / j->nb / j->ncb;
    int64_t c0 = cb * CB, W = j->M - c0 < CB ? j->M - c0 : CB;
    emi_walker kw;
    emi_walk_init(&kw, j->kon, j->kosz, j->kost, j->kooo, ko);
    int64_t obase = kw.off2 + c0 * vos;        /* out offset of column c0 */
    const char *p0 = pl->base + kw.off + c0 * pl->esz;
    racc acc[CB];
    double shbuf[CB];
    const double *sh = zeros;
    if (j->shift) {
      for (int64_t c = 0; c < W; c++) shbuf[c] = j->shift[obase + c * vos];
      sh = shbuf;
    }
    for (int64_t c = 0; c < W; c++) {
      if (j->icls) acc[c].i = iident(j->kind);
      else acc[c].f = FKINDS[j->kind].id;
    }
    int64_t r0 = b * j->rb, r1 = r0 + j->rb < pl->R ? r0 + j->rb : pl->R;
    outer_rows(j, p0, W, r0, r1, acc, sh);
    if (j->nb > 1) {
      for (int64_t c = 0; c < W; c++) j->partial[b * pl->K + obase + c * vos] = acc[c];
    } else if (!j->icls && !j->dres && j->odt == EM_FLOAT32 &&
               (j->fin == FIN_ID || j->fin == FIN_MEAN)) {
      /* The common finish as one vectorisable loop rather than a call each. */
      double R = j->fin == FIN_MEAN ? (double)pl->R : 1.0;
      float *o = (float *)j->obase + obase;
      for (int64_t c = 0; c < W; c++) o[c * vos] = (float)(acc[c].f / R);
    } else {
      for (int64_t c = 0; c < W; c++) finish(j, obase + c * vos, acc[c]);
    }
  }
}

/* Combine the partials of outputs [k0, k1) in block order and finish them. */
static void combine_task(void *ctx, int64_t k0, int64_t k1) {
  const rjob *j = ctx;
  int64_t K = j->pl.K;
  for (int64_t k = k0; k < k1; k++) {
    racc acc = j->partial[k];
    for (int64_t b = 1; b < j->nb; b++) {
      racc x = j->partial[b * K + k];
      if (j->icls) acc.i = icomb(j->kind, acc.i, x.i);
      else acc.f = comb(FKINDS[j->kind].comb, acc.f, x.f);
    }
    finish(j, k, acc);
  }
}

/* Run one pass: kind/fin over plan pl into out (or into dres). */
static em_status run_job(em_state *S, const char *op, const emi_rplan *pl, int kind, double p,
                         const double *shift, int fin, double fin_arg, em_tensor *out,
                         double *dres) {
  rjob j;
  j.pl = *pl;
  j.kind = kind;
  j.icls = kind >= K_NF;
  j.p = p;
  j.shift = shift;
  j.fin = fin;
  j.fin_arg = fin_arg;
  j.obase = em_tensor_data(out);
  j.odt = out->dtype;
  j.osz = (int64_t)em_dtype_size(out->dtype);
  j.dres = dres;
  j.partial = NULL;
  j.kblk = 1;
  int64_t K = pl->K, R = pl->R;
  if (K == 0) return EM_OK;
  if (R == 0) {     /* every output is the identity, finished */
    racc id;
    if (j.icls) id.i = iident(kind); else id.f = FKINDS[kind].id;
    for (int64_t k = 0; k < K; k++) finish(&j, k, id);
    return EM_OK;
  }
  int64_t ntask, per;     /* per: elements in one task */
  if (pl->outer) {
    j.M = pl->ksz[pl->vk];
    j.W = j.M < CB ? j.M : CB;
    j.ncb = (j.M + CB - 1) / CB;
    j.Ko = K / j.M;
    j.kon = 0;
    for (int i = 0; i < pl->nk; i++) {
      if (i == pl->vk) continue;
      j.kosz[j.kon] = pl->ksz[i];
      j.kost[j.kon] = pl->kst[i];
      j.kooo[j.kon++] = pl->kos[i];
    }
    int64_t rows = (BLOCK + j.W - 1) / j.W;
    j.nb = R > rows ? (R + rows - 1) / rows : 1;
    j.rb = j.nb > 1 ? rows : R;
    ntask = j.Ko * j.ncb * j.nb;
    per = j.W * j.rb;
  } else {
    j.nb = R > BLOCK ? (R + BLOCK - 1) / BLOCK : 1;
    j.rb = j.nb > 1 ? BLOCK : R;
    ntask = K * j.nb;
    per = j.rb;
    if (j.nb == 1 && pl->nr >= 2 && K >= 16) {   /* memory order: see inner_block */
      j.kblk = K / 16 < 64 ? K / 16 : 64;
      ntask = (K + j.kblk - 1) / j.kblk;
      per = j.kblk * R;
    }
  }
  if (j.nb > 1) {
    size_t nbytes = sizeof(racc) * (size_t)(K * j.nb);
    j.partial = emi_malloc(S, nbytes);
    if (!j.partial)
      return emi_error(S, EM_ERR_NOMEM, "%s: out of memory for %lld partial results", op,
                       (long long)(K * j.nb));
  }
  emi_parallel_dynamic(S, ntask, per, pl->outer ? outer_task : inner_task, &j);
  if (j.partial) {
    emi_parallel_dynamic(S, K, j.nb, combine_task, &j);
    emi_free(S, j.partial, sizeof(racc) * (size_t)(K * j.nb));
  }
  return EM_OK;
}

static int is_int(em_dtype dt) { return !em_dtype_is_floating(dt); }

/* One pass with no shift and no parameter: most ops. */
static em_status run_one(em_state *S, const char *op, const emi_rplan *pl, int kind, int fin,
                         em_tensor *out) {
  return run_job(S, op, pl, kind, 0, NULL, fin, 0, out, NULL);
}

/* Two passes: first (kind1, fin1) into a K-double temporary, then kind2 with it
** as the shift. */
static em_status run_two(em_state *S, const char *op, const emi_rplan *pl, int kind1,
                         int fin1, int kind2, int fin2, double fin_arg, em_tensor *out) {
  int64_t K = pl->K;
  double small[64], *tmp = small;
  size_t nbytes = sizeof(double) * (size_t)(K > 0 ? K : 1);
  if (K > 64) {
    tmp = emi_malloc(S, nbytes);
    if (!tmp)
      return emi_error(S, EM_ERR_NOMEM, "%s: out of memory for %lld intermediate results",
                       op, (long long)K);
  }
  em_status st = run_job(S, op, pl, kind1, 0, NULL, fin1, 0, out, tmp);
  if (!st) st = run_job(S, op, pl, kind2, 0, tmp, fin2, fin_arg, out, NULL);
  if (tmp != small) emi_free(S, tmp, nbytes);
  return st;
}

/* -- Entries ------------------------------------------------------------------- */

em_status emi_cpu_reduce(emi_device *dev, em_redop op, em_tensor *out, const em_tensor *a,
                         unsigned mask) {
  em_state *S = dev->S;
  emi_rplan pl;
  emi_reduce_plan(&pl, a, mask);
  int ic = is_int(a->dtype);
  switch (op) {
  case EM_SUM: return run_one(S, "sum", &pl, ic ? K_ISUM : K_SUM, FIN_ID, out);
  case EM_MEAN: return run_one(S, "mean", &pl, K_SUM, FIN_MEAN, out);
  case EM_PROD: return run_one(S, "prod", &pl, ic ? K_IPROD : K_PROD, FIN_ID, out);
  case EM_AMAX: return run_one(S, "amax", &pl, ic ? K_IMAX : K_MAX, FIN_ID, out);
  case EM_AMIN: return run_one(S, "amin", &pl, ic ? K_IMIN : K_MIN, FIN_ID, out);
  case EM_ANY: return run_one(S, "any", &pl, K_CNTNZ, FIN_ANY, out);
  case EM_ALL: return run_one(S, "all", &pl, K_CNTNZ, FIN_ALL, out);
  case EM_LOGSUMEXP:
    return run_two(S, "logsumexp", &pl, K_MAX, FIN_LSESHIFT, K_SUMEXP, FIN_LSE, 0, out);
  default:
    return emi_error(S, EM_ERR_ARG, "reduce: unknown reduction %d", (int)op);
  }
}

em_status emi_cpu_var(emi_device *dev, em_tensor *out, const em_tensor *a, unsigned mask,
                      double correction, int take_sqrt) {
  em_state *S = dev->S;
  emi_rplan pl;
  emi_reduce_plan(&pl, a, mask);
  return run_two(S, take_sqrt ? "std" : "var", &pl, K_SUM, FIN_MEAN, K_SUMSQDEV,
                 take_sqrt ? FIN_STD : FIN_VAR, correction, out);
}

em_status emi_cpu_norm(emi_device *dev, em_tensor *out, const em_tensor *a, unsigned mask,
                       double p) {
  em_state *S = dev->S;
  emi_rplan pl;
  emi_reduce_plan(&pl, a, mask);
  if (pl.R == 0) p = 1;      /* PyTorch: the norm of nothing is 0 for every p */
  if (p == 2) return run_one(S, "norm", &pl, K_SUMSQ, FIN_SQRT, out);
  if (p == 1) return run_one(S, "norm", &pl, K_SUMABS, FIN_ID, out);
  if (p == 0) return run_one(S, "norm", &pl, K_CNTNZ, FIN_ID, out);
  if (isinf(p)) return run_one(S, "norm", &pl, p > 0 ? K_MAXABS : K_MINABS, FIN_ID, out);
  return run_job(S, "norm", &pl, K_SUMPOW, p, NULL, FIN_ROOT, 1.0 / p, out, NULL);
}

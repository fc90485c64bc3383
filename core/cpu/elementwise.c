/*
** elementwise.c -- the driver every CPU element-wise kernel runs through
** (emi_cpu_foreach: rows, coalescing, threads), the float16/bfloat16 adapters,
** and the where kernel. The op tables live in unary.c, binary.c and copy.c.
*/
#include "loops.h"
#if defined(__F16C__)
#include <immintrin.h>
#endif

/* -- Driver -------------------------------------------------------------------------
** Work is a flat range [0, numel) in row-major order of the (coalesced) operand
** shape; a thread's share may start and end in the middle of a row. When every
** operand is contiguous the whole tensor is one row and no iterator is built: that
** is the common case, and tiny tensors must not pay for more. */

typedef struct fe_ctx {
  emi_row_fn fn;
  void *ctx;
  int nops, flat;
  char *base[EMI_ITER_MAX];
  int64_t es[EMI_ITER_MAX];       /* element sizes (the flat case's strides) */
  int64_t nblk;                   /* tiled walk: row blocks per outer index */
  emi_iter it;
} fe_ctx;

/* Tiles of TILE x TILE elements over the two inner dims (see want_tiles). */
enum { TILE = 32 };

static void fe_range(void *c_, int64_t begin, int64_t end) {
  fe_ctx *c = c_;
  char *p[EMI_ITER_MAX];
  int nops = c->nops;
  if (c->flat) {
    for (int k = 0; k < nops; k++) p[k] = c->base[k] + begin * c->es[k];
    c->fn(c->ctx, p, c->es, end - begin);
    return;
  }
  const emi_iter *it = &c->it;
  int last = it->ndim - 1;
  int64_t inner = it->inner, r = begin / inner, col = begin % inner;
  int64_t idx[EM_MAX_DIMS], s[EMI_ITER_MAX];
  for (int k = 0; k < nops; k++) {
    s[k] = it->strides[k][last];
    p[k] = it->base[k] + col * s[k];
  }
  for (int d = last - 1; d >= 0; d--) {          /* row number -> outer index */
    idx[d] = r % it->sizes[d];
    r /= it->sizes[d];
    for (int k = 0; k < nops; k++) p[k] += idx[d] * it->strides[k][d];
  }
  for (;;) {
    int64_t m = inner - col < end - begin ? inner - col : end - begin;
    c->fn(c->ctx, p, s, m);
    begin += m;
    if (begin >= end) break;
    for (int k = 0; k < nops; k++) p[k] -= col * s[k];
    col = 0;
    for (int d = last - 1; d >= 0; d--) {        /* odometer step to the next row */
      for (int k = 0; k < nops; k++) p[k] += it->strides[k][d];
      if (++idx[d] < it->sizes[d]) break;
      for (int k = 0; k < nops; k++) p[k] -= it->strides[k][d] * it->sizes[d];
      idx[d] = 0;
    }
  }
}

/* A transposed operand walks memory with a large stride along the inner dim and
** a small one along the next: row by row, each of its elements touches a new
** cache line (and often a new page). Walking TILE x TILE tiles instead reuses
** every line TILE times -- what makes t:contiguous() 10x faster. */
static int want_tiles(const emi_iter *it, int nops) {
  if (it->ndim < 2) return 0;
  int last = it->ndim - 1, d = last - 1;
  if (it->sizes[last] < TILE || it->sizes[d] < TILE) return 0;
  for (int k = 0; k < nops; k++) {
    int64_t si = it->strides[k][last], sd = it->strides[k][d];
    si = si < 0 ? -si : si;
    sd = sd < 0 ? -sd : sd;
    if (si > 64 && sd != 0 && sd < si) return 1;
  }
  return 0;
}

/* Work items are (outer index, block of TILE rows of dim ndim-2); each walks its
** rows tile column by tile column. */
static void fe_tiles(void *c_, int64_t begin, int64_t end) {
  fe_ctx *c = c_;
  const emi_iter *it = &c->it;
  int nops = c->nops, last = it->ndim - 1, d = last - 1;
  int64_t rows_total = it->sizes[d], inner = it->inner;
  int64_t s[EMI_ITER_MAX];
  for (int k = 0; k < nops; k++) s[k] = it->strides[k][last];
  for (int64_t item = begin; item < end; item++) {
    int64_t outer = item / c->nblk, blk = item % c->nblk;
    char *b[EMI_ITER_MAX], *p[EMI_ITER_MAX];
    for (int k = 0; k < nops; k++) b[k] = it->base[k] + blk * TILE * it->strides[k][d];
    for (int dd = d - 1; dd >= 0; dd--) {
      int64_t i = outer % it->sizes[dd];
      outer /= it->sizes[dd];
      for (int k = 0; k < nops; k++) b[k] += i * it->strides[k][dd];
    }
    int64_t rows = rows_total - blk * TILE < TILE ? rows_total - blk * TILE : TILE;
    for (int64_t c0 = 0; c0 < inner; c0 += TILE) {
      int64_t m = inner - c0 < TILE ? inner - c0 : TILE;
      for (int64_t r = 0; r < rows; r++) {
        for (int k = 0; k < nops; k++) p[k] = b[k] + r * it->strides[k][d] + c0 * s[k];
        c->fn(c->ctx, p, s, m);
      }
    }
  }
}

void emi_cpu_foreach(em_state *S, em_tensor *const *ops, int nops, int64_t grain,
                     emi_row_fn fn, void *ctx) {
  int64_t n = ops[0]->numel;
  if (n <= 0) return;
  fe_ctx c;
  c.fn = fn;
  c.ctx = ctx;
  c.nops = nops;
  c.flat = 1;
  for (int k = 0; k < nops; k++) {
    c.base[k] = (char *)em_tensor_data(ops[k]);
    c.es[k] = (int64_t)em_dtype_size(ops[k]->dtype);
    if (c.flat && !em_tensor_is_contiguous(ops[k])) c.flat = 0;
  }
  /* all channels last (dense, one memory order, one shape): flat as well */
  for (int k = 0; !c.flat && k < nops; k++) {
    if (!em_tensor_is_channels_last(ops[k]) || ops[k]->numel != n) break;
    if (k == nops - 1) c.flat = 1;
  }
  if (!c.flat) {
    emi_iter_init_by_memory(&c.it, ops, nops);
    if (want_tiles(&c.it, nops)) {
      int d = c.it.ndim - 2;
      int64_t per_item = TILE * c.it.inner;
      c.nblk = (c.it.sizes[d] + TILE - 1) / TILE;
      emi_parallel_for(S, n / c.it.sizes[d] / c.it.inner * c.nblk,
                       grain / per_item > 1 ? grain / per_item : 1, fe_tiles, &c);
      return;
    }
  }
  emi_parallel_for(S, n, grain, fe_range, &c);
}

/* -- float16 / bfloat16 adapters ------------------------------------------------- */

/* F16C converts 8 float16 at a time (the scalar emi_half_to_float is a call with
** branches per element): float -> float16 is 6x faster with it. Rounding is to
** nearest even either way; NaNs stay NaN (payload bits may differ). F16C is part
** of x86-64-v3, the portable build's baseline, so installed builds keep it. */
/* bfloat16 is float32's top half: widening is a shift, narrowing a rounding add
** (to nearest even; a NaN keeps its sign and becomes quiet), 8 lanes at a time with
** AVX2, which the portable build's baseline has, as emi_bf16_to_float and
** emi_float_to_bf16 do one at a time. */
#if defined(__AVX2__)
static void bf16_widen8(float *dst, const char *src) {
  __m256i u = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)src));
  _mm256_storeu_si256((__m256i *)dst, _mm256_slli_epi32(u, 16));
}

static void bf16_narrow8(char *dst, const float *src) {
  __m256i u = _mm256_castps_si256(_mm256_loadu_ps(src));
  __m256i odd = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
  __m256i r = _mm256_srli_epi32(
      _mm256_add_epi32(_mm256_add_epi32(u, _mm256_set1_epi32(0x7fff)), odd), 16);
  __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(u, _mm256_set1_epi32(0x7fffffff)),
                                   _mm256_set1_epi32(0x7f800000));
  __m256i q = _mm256_or_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(0x40));
  r = _mm256_blendv_epi8(r, q, nan);
  /* 8 x 32-bit lanes, each <= 0xffff, to 8 x 16-bit: pack within lanes, then
  ** gather the two 64-bit halves that hold them */
  __m256i p = _mm256_permute4x64_epi64(_mm256_packus_epi32(r, r), 0x08);
  _mm_storeu_si128((__m128i *)dst, _mm256_castsi256_si128(p));
}
#endif

void emi_half_to_float_n(float *dst, const char *src, int64_t n, int64_t s, em_dtype dt) {
  int64_t i = 0;
  if (dt == EM_BFLOAT16) {
#if defined(__AVX2__)
    if (s == 2)
      for (; i + 8 <= n; i += 8) bf16_widen8(dst + i, src + 2 * i);
#endif
    for (; i < n; i++) dst[i] = emi_bf16_to_float(*(const uint16_t *)(src + i * s));
    return;
  }
#if defined(__F16C__)
  if (s == 2)
    for (; i + 8 <= n; i += 8)
      _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(src + 2 * i))));
#endif
  for (; i < n; i++) dst[i] = emi_half_to_float(*(const uint16_t *)(src + i * s));
}

void emi_float_to_half_n(char *dst, const float *src, int64_t n, int64_t s, em_dtype dt) {
  int64_t i = 0;
  if (dt == EM_BFLOAT16) {
#if defined(__AVX2__)
    if (s == 2)
      for (; i + 8 <= n; i += 8) bf16_narrow8(dst + 2 * i, src + i);
#endif
    for (; i < n; i++) *(uint16_t *)(dst + i * s) = emi_float_to_bf16(src[i]);
    return;
  }
#if defined(__F16C__)
  if (s == 2)
    for (; i + 8 <= n; i += 8)
      _mm_storeu_si128((__m128i *)(dst + 2 * i),
                       _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT));
#endif
  for (; i < n; i++) *(uint16_t *)(dst + i * s) = emi_float_to_half(src[i]);
}

#define half_load(dst, src, n, s, dt) emi_half_to_float_n(dst, src, n, s, dt)
#define half_store(dst, src, n, s, dt) emi_float_to_half_n(dst, src, n, s, dt)

/* Widen one operand's chunk: a stride-0 operand is loaded once and stays stride 0. */
static const char *half_operand(float *buf, const char *x, int64_t m, int64_t sx,
                                int is_f32, em_dtype dt, int64_t *fs) {
  if (is_f32) { *fs = 0; return x; }
  if (sx == 0) { half_load(buf, x, 1, 0, dt); *fs = 0; return (const char *)buf; }
  half_load(buf, x, m, sx, dt);
  *fs = sizeof(float);
  return (const char *)buf;
}

static void half_result(char *o, int64_t so, const char *tmp, int64_t m, int out_bool,
                        em_dtype dt) {
  if (!out_bool) { half_store(o, (const float *)tmp, m, so, dt); return; }
  for (int64_t i = 0; i < m; i++) o[i * so] = tmp[i];
}

void emi_half_loop1(emi_loop1 f32, em_dtype dt, int out_bool, char *o, const char *a,
                    int64_t n, int64_t so, int64_t sa, emi_kparams *p) {
  float A[EMI_HALF_CHUNK], O[EMI_HALF_CHUNK];
  for (int64_t i = 0; i < n; i += EMI_HALF_CHUNK) {
    int64_t m = n - i < EMI_HALF_CHUNK ? n - i : EMI_HALF_CHUNK, fa;
    const char *pa = half_operand(A, a + i * sa, m, sa, 0, dt, &fa);
    f32((char *)O, pa, m, out_bool ? 1 : (int64_t)sizeof(float), fa, p);
    half_result(o + i * so, so, (const char *)O, m, out_bool, dt);
  }
}

void emi_half_loop2(emi_loop2 f32, em_dtype dt, int out_bool, char *o, const char *a,
                    const char *b, int64_t n, int64_t so, int64_t sa, int64_t sb,
                    int a_f32, int b_f32, emi_kparams *p) {
  float A[EMI_HALF_CHUNK], B[EMI_HALF_CHUNK], O[EMI_HALF_CHUNK];
  for (int64_t i = 0; i < n; i += EMI_HALF_CHUNK) {
    int64_t m = n - i < EMI_HALF_CHUNK ? n - i : EMI_HALF_CHUNK, fa, fb;
    const char *pa = half_operand(A, a + i * sa, m, sa, a_f32, dt, &fa);
    const char *pb = half_operand(B, b + i * sb, m, sb, b_f32, dt, &fb);
    f32((char *)O, pa, pb, m, out_bool ? 1 : (int64_t)sizeof(float), fa, fb, p);
    half_result(o + i * so, so, (const char *)O, m, out_bool, dt);
  }
}

/* -- where -------------------------------------------------------------------------
** A pure selection, so one loop per element size serves every dtype: where_impl.h,
** included once per size. */

#define T uint8_t
#define FN(name) name##_1
#include "where_impl.h"
#define T uint16_t
#define FN(name) name##_2
#include "where_impl.h"
#define T uint32_t
#define FN(name) name##_4
#include "where_impl.h"
#define T uint64_t
#define FN(name) name##_8
#include "where_impl.h"

typedef void (*where_fn)(char *const *p, const int64_t *s, int64_t n);
typedef struct where_ctx { where_fn fn; } where_ctx;

static void where_row(void *ctx, char *const *p, const int64_t *s, int64_t n) {
  ((where_ctx *)ctx)->fn(p, s, n);
}

em_status emi_cpu_where(emi_device *dev, em_tensor *out, const em_tensor *cond,
                        const em_tensor *a, const em_tensor *b) {
  em_state *S = dev->S;
  where_fn fn;
  switch (em_dtype_size(out->dtype)) {
  case 1: fn = where_1; break;
  case 2: fn = where_2; break;
  case 4: fn = where_4; break;
  case 8: fn = where_8; break;
  default:
    return emi_error(S, EM_ERR_DTYPE, "where: dtype %s not supported on cpu",
                     em_dtype_name(out->dtype));
  }
  em_tensor *ops[4] = {out, (em_tensor *)cond, (em_tensor *)a, (em_tensor *)b};
  where_ctx c = {fn};
  emi_cpu_foreach(S, ops, 4, EMI_GRAIN_CHEAP, where_row, &c);
  return EM_OK;
}

/*
** index.c -- CPU kernels for index_select and gather.
**
** Both copy elements without looking at their values, so they work on raw
** element bits of 1, 2, 4 or 8 bytes and every dtype shares one path. Index
** values are checked as they are read: an out-of-range value makes the kernel
** report an error (naming the first bad index in the caller's base) and the
** half-written output is dropped by the ops layer, so inputs are never touched.
*/
#include "cpu.h"

/* An int32/int64 index value at p. */
static inline int64_t load_index(const char *p, em_dtype dt) {
  return dt == EM_INT64 ? *(const int64_t *)p : *(const int32_t *)p;
}

/* Copy n elements of es bytes from src (byte stride ss) to dense dst. */
static void copy_run(char *dst, const char *src, int64_t ss, int64_t n, size_t es) {
  if (ss == (int64_t)es) { memcpy(dst, src, (size_t)n * es); return; }
  switch (es) {
  case 1: for (int64_t i = 0; i < n; i++) dst[i] = src[i * ss]; break;
  case 2: for (int64_t i = 0; i < n; i++) ((uint16_t *)dst)[i] = *(const uint16_t *)(src + i * ss); break;
  case 4: for (int64_t i = 0; i < n; i++) ((uint32_t *)dst)[i] = *(const uint32_t *)(src + i * ss); break;
  default: for (int64_t i = 0; i < n; i++) ((uint64_t *)dst)[i] = *(const uint64_t *)(src + i * ss); break;
  }
}

/* Dims [d0, d1) of t merged where the strides allow (sizes-1 dropped), in bytes:
** the geometry of one block of t. Returns the number of merged dims (>= 1). */
static int block_dims(const em_tensor *t, int d0, int d1, int64_t *sizes, int64_t *strides) {
  int n = 0;
  int64_t es = (int64_t)em_dtype_size(t->dtype);
  for (int d = d0; d < d1; d++) {
    if (t->sizes[d] == 1) continue;
    if (n > 0 && strides[n - 1] == t->strides[d] * es * t->sizes[d]) {
      sizes[n - 1] *= t->sizes[d];
      strides[n - 1] = t->strides[d] * es;
    } else {
      sizes[n] = t->sizes[d];
      strides[n++] = t->strides[d] * es;
    }
  }
  if (n == 0) { sizes[0] = 1; strides[0] = es; n = 1; }
  return n;
}

/* Byte offset of t's element whose dims [0, nd) have the row-major index r, with
** the dims given by sizes/strides (elements). */
static int64_t outer_offset(int64_t r, const int64_t *sizes, const int64_t *strides,
                            int nd, int64_t es) {
  int64_t off = 0;
  for (int d = nd - 1; d >= 0 && r; d--) {
    off += (r % sizes[d]) * strides[d];
    r /= sizes[d];
  }
  return off * es;
}

/* -- index_select -------------------------------------------------------------------
** a has at least one dim (the ops layer views a 0-D a as [1]); idx is 1-D or 0-D.
** out (contiguous) is a's shape with dim resized to n = idx.numel: block (o, i) of
** out, o over the dims before dim and i over the indices, is a's block at
** (o, idx[i]) -- the dims after dim, `inner` elements. */
typedef struct isel_ctx {
  const em_tensor *a, *out;
  int dim, nin;
  int64_t n, inner, *ind;           /* ind: checked 0-based indices */
  int64_t isz[EM_MAX_DIMS], ist[EM_MAX_DIMS];   /* a's inner block, bytes */
} isel_ctx;

static void isel_range(void *ctx, int64_t u0, int64_t u1) {
  const isel_ctx *c = ctx;
  const em_tensor *a = c->a;
  size_t es = em_dtype_size(a->dtype);
  char *obase = em_tensor_data(c->out);
  const char *abase = em_tensor_data(a);
  int64_t astep = a->strides[c->dim] * (int64_t)es;
  for (int64_t u = u0; u < u1; u++) {
    int64_t o = u / c->n, i = u % c->n;
    const char *src = abase + outer_offset(o, a->sizes, a->strides, c->dim, (int64_t)es) +
                      c->ind[i] * astep;
    char *dst = obase + u * c->inner * (int64_t)es;
    if (c->inner == 1) {   /* selecting along the last dim: one element per unit */
      switch (es) {
      case 1: *dst = *src; break;
      case 2: *(uint16_t *)dst = *(const uint16_t *)src; break;
      case 4: *(uint32_t *)dst = *(const uint32_t *)src; break;
      default: *(uint64_t *)dst = *(const uint64_t *)src; break;
      }
      continue;
    }
    if (c->nin == 1) { copy_run(dst, src, c->ist[0], c->inner, es); continue; }
    /* a strided block: rows of the last merged dim, outer ones counted out */
    int64_t rows = c->inner / c->isz[c->nin - 1], len = c->isz[c->nin - 1];
    for (int64_t r = 0; r < rows; r++) {
      int64_t off = 0, q = r;
      for (int d = c->nin - 2; d >= 0; d--) { off += (q % c->isz[d]) * c->ist[d]; q /= c->isz[d]; }
      copy_run(dst + r * len * (int64_t)es, src + off, c->ist[c->nin - 1], len, es);
    }
  }
}

em_status emi_cpu_index_select(emi_device *dev, em_tensor *out, const em_tensor *a, int dim,
                               const em_tensor *idx, int index_base) {
  em_state *S = dev->S;
  int64_t n = idx->numel, size = a->sizes[dim];
  int64_t stack[64], *ind = n <= 64 ? stack : emi_malloc(S, (size_t)n * sizeof(int64_t));
  if (!ind)
    return emi_error(S, EM_ERR_NOMEM, "index_select: out of memory for %lld indices", (long long)n);
  /* check (and make 0-based) every index first: idx is small next to the copy */
  const char *ip = em_tensor_data(idx);
  int64_t istride = idx->ndim ? idx->strides[0] * (int64_t)em_dtype_size(idx->dtype) : 0;
  for (int64_t i = 0; i < n; i++) {
    int64_t v = load_index(ip + i * istride, idx->dtype);
    if (v - index_base < 0 || v - index_base >= size) {
      if (ind != stack) emi_free(S, ind, (size_t)n * sizeof(int64_t));
      return emi_error(S, EM_ERR_INDEX, "index_select: index %lld is out of range for "
                       "dimension %lld of size %lld (indices count from %d)", (long long)v,
                       emi_ix(S, dim), (long long)size, index_base);
    }
    ind[i] = v - index_base;
  }
  isel_ctx c = {.a = a, .out = out, .dim = dim, .n = n, .ind = ind, .inner = 1};
  for (int d = dim + 1; d < a->ndim; d++) c.inner *= a->sizes[d];
  c.nin = block_dims(a, dim + 1, a->ndim, c.isz, c.ist);
  int64_t units = out->numel / (c.inner ? c.inner : 1);
  if (out->numel > 0) emi_parallel_for(S, units, 32768 / (c.inner + 1) + 1, isel_range, &c);
  if (ind != stack) emi_free(S, ind, (size_t)n * sizeof(int64_t));
  return EM_OK;
}

/* -- gather ---------------------------------------------------------------------------
** out (contiguous, idx's shape): out[p] = a[p with p[dim] = idx[p] - base]. Rows
** of the last dim are spread over the workers; each finds its offsets in a and idx
** from its row number. */
typedef struct gather_ctx {
  const em_tensor *a, *idx, *out;
  int dim, index_base;
  int64_t bad_pos, bad_val;          /* first bad index by position (atomic min) */
} gather_ctx;

static void gather_range(void *ctx, int64_t r0, int64_t r1) {
  gather_ctx *c = ctx;
  const em_tensor *a = c->a, *idx = c->idx, *out = c->out;
  int nd = out->ndim, last = nd - 1, dim = c->dim;
  size_t es = em_dtype_size(a->dtype), is = em_dtype_size(idx->dtype);
  int64_t inner = out->sizes[last], size = a->sizes[dim];
  int64_t as_last = a->strides[last], as_dim = a->strides[dim];
  int64_t is_last = idx->strides[last] * (int64_t)is;
  const char *abase = em_tensor_data(a), *ibase = em_tensor_data(idx);
  char *obase = em_tensor_data(out);
  for (int64_t r = r0; r < r1; r++) {
    /* offsets of row r: a over the outer dims except dim; idx over all outer dims */
    int64_t aoff = 0, ioff = 0, q = r;
    for (int d = last - 1; d >= 0; d--) {
      int64_t k = q % out->sizes[d];
      q /= out->sizes[d];
      if (d != dim) aoff += k * a->strides[d];
      ioff += k * idx->strides[d];
    }
    const char *ip = ibase + ioff * (int64_t)is;
    char *dst = obase + r * inner * (int64_t)es;
    for (int64_t j = 0; j < inner; j++) {
      int64_t v = load_index(ip + j * is_last, idx->dtype) - c->index_base;
      if (v < 0 || v >= size) {
        int64_t pos = r * inner + j, seen = __atomic_load_n(&c->bad_pos, __ATOMIC_RELAXED);
        while (pos < seen && !__atomic_compare_exchange_n(&c->bad_pos, &seen, pos, false,
                                                         __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {}
        return;   /* this share is done: the op fails */
      }
      int64_t e = aoff + v * as_dim + (last == dim ? 0 : j * as_last);
      const char *src = abase + e * (int64_t)es;
      switch (es) {
      case 1: dst[j] = *src; break;
      case 2: ((uint16_t *)dst)[j] = *(const uint16_t *)src; break;
      case 4: ((uint32_t *)dst)[j] = *(const uint32_t *)src; break;
      default: ((uint64_t *)dst)[j] = *(const uint64_t *)src; break;
      }
    }
  }
}

em_status emi_cpu_gather(emi_device *dev, em_tensor *out, const em_tensor *a, int dim,
                         const em_tensor *idx, int index_base) {
  em_state *S = dev->S;
  if (out->numel == 0) return EM_OK;
  gather_ctx c = {.a = a, .idx = idx, .out = out, .dim = dim, .index_base = index_base,
                  .bad_pos = INT64_MAX};
  int64_t inner = out->sizes[out->ndim - 1];
  emi_parallel_for(S, out->numel / inner, 32768 / (inner + 1) + 1, gather_range, &c);
  if (c.bad_pos != INT64_MAX) {
    /* read the offending value again (serially) for the message */
    int64_t p = c.bad_pos, off = 0;
    for (int d = idx->ndim - 1; d >= 0; d--) { off += (p % idx->sizes[d]) * idx->strides[d]; p /= idx->sizes[d]; }
    int64_t v = load_index((const char *)em_tensor_data(idx) + off * (int64_t)em_dtype_size(idx->dtype),
                           idx->dtype);
    return emi_error(S, EM_ERR_INDEX, "gather: index %lld is out of range for dimension %lld "
                     "of size %lld (indices count from %d)", (long long)v, emi_ix(S, dim),
                     (long long)a->sizes[dim], index_base);
  }
  return EM_OK;
}

/*
** sort_scan.c -- the CPU's sort and scan entries (backend.h): a stable sort of
** every line of a tensor along one dim, giving the positions in sorted order
** (sort, argsort and topk are built on it in ops/sort_scan.c), and the inclusive
** scans cumsum and cumprod.
**
** A line is the elements along dim at one position of the other dims; lines are
** split over the state's workers. Sorting orders (key, position) pairs with the
** position breaking ties, so qsort's result is the stable order. Float keys are
** doubles (exact for every float dtype and the small integers), int64 keys stay
** int64; NaN sorts above every number, as in PyTorch.
**
** topk wants only a line's first k: for k up to a quarter of the line, a heap of
** the k best pairs seen so far takes each next pair in log k (the line in
** n log k rather than n log n: a 50,000-word vocabulary's top 50 in a fifth of
** the sort's time), and only those k are sorted at the end. The pairs' order is
** total, so the result is the whole sort's head, ties included.
*/
#include "cpu.h"
#include <math.h>
#include <stdlib.h>

/* Where line k (of outer * inner lines) starts in a, and in a contiguous tensor of
** a's shape. outer: the product of the sizes before dim; inner: after it. */
typedef struct lines {
  const em_tensor *a;
  int dim;
  int64_t len, inner;
} lines;

static int64_t line_offset(const lines *l, int64_t k) {
  const em_tensor *a = l->a;
  int64_t off = a->offset, rest = k;
  for (int d = a->ndim - 1; d >= 0; d--) {
    if (d == l->dim) continue;
    int64_t i = rest % a->sizes[d];
    rest /= a->sizes[d];
    off += i * a->strides[d];
  }
  return off;
}

/* Where line k starts in a contiguous tensor of a's shape with `width`
** elements along dim. */
static int64_t line_start_contig(const lines *l, int64_t k, int64_t width) {
  return (k / l->inner) * width * l->inner + k % l->inner;
}

static void lines_init(lines *l, const em_tensor *a, int dim) {
  l->a = a;
  l->dim = dim;
  l->len = a->sizes[dim];
  l->inner = 1;
  for (int d = dim + 1; d < a->ndim; d++) l->inner *= a->sizes[d];
}

static int64_t lines_count(const lines *l) {
  return l->len ? l->a->numel / l->len : 0;
}

/* -- sort ------------------------------------------------------------------------- */

typedef struct skey {
  union { double f; int64_t i; } k;
  int64_t pos;
} skey;

static int ties(const skey *x, const skey *y) { return (x->pos > y->pos) - (x->pos < y->pos); }

/* NaN above everything, NaNs equal to each other. */
static int cmp_f(double a, double b) {
  int na = a != a, nb = b != b;
  if (na || nb) return na - nb;
  return (a > b) - (a < b);
}

static int asc_f(const void *p, const void *q) {
  const skey *x = p, *y = q;
  int c = cmp_f(x->k.f, y->k.f);
  return c ? c : ties(x, y);
}
static int desc_f(const void *p, const void *q) {
  const skey *x = p, *y = q;
  int c = cmp_f(y->k.f, x->k.f);
  return c ? c : ties(x, y);
}
static int asc_i(const void *p, const void *q) {
  const skey *x = p, *y = q;
  int c = (x->k.i > y->k.i) - (x->k.i < y->k.i);
  return c ? c : ties(x, y);
}
static int desc_i(const void *p, const void *q) {
  const skey *x = p, *y = q;
  int c = (y->k.i > x->k.i) - (y->k.i < x->k.i);
  return c ? c : ties(x, y);
}

typedef int (*key_order)(const void *, const void *);

/* h[0..n) a heap with the last in order at its root: h[i] moved down to its place. */
static void sift_down(skey *h, int64_t n, int64_t i, key_order cmp) {
  for (;;) {
    int64_t c = 2 * i + 1;
    if (c >= n) return;
    if (c + 1 < n && cmp(&h[c + 1], &h[c]) > 0) c++;
    if (cmp(&h[c], &h[i]) <= 0) return;
    skey t = h[c];
    h[c] = h[i];
    h[i] = t;
    i = c;
  }
}

/* keys[0..k) become the first k of keys[0..n) in order. */
static void first_k(skey *keys, int64_t n, int64_t k, key_order cmp) {
  if (k * 4 > n) {
    qsort(keys, (size_t)n, sizeof *keys, cmp);
    return;
  }
  for (int64_t i = k / 2; i-- > 0;) sift_down(keys, k, i, cmp);
  for (int64_t i = k; i < n; i++) {
    if (cmp(&keys[i], &keys[0]) < 0) {
      keys[0] = keys[i];
      sift_down(keys, k, 0, cmp);
    }
  }
  qsort(keys, (size_t)k, sizeof *keys, cmp);
}

/* -- lines of 32-bit keys ----------------------------------------------------------
** Every sortable dtype but float64 and int64 maps its values to 32 bits whose
** unsigned order is the sort's (floats widen to float32 exactly; -0 and 0 are
** one key, NaN is above every number). A line's word i holds that key
** (inverted when descending) above i, so the words' unsigned order is the
** stable order itself: a radix sort of the keys' four bytes (stable passes,
** skipped where every key shares the byte) sorts a line, and topk's heap
** compares single words. float64 and int64 lines sort (key, position) pairs. */
static int word_keyed(em_dtype dt) { return dt != EM_FLOAT64 && dt != EM_INT64; }

static inline uint32_t word_key(const char *e, em_dtype dt) {
  if (dt == EM_INT32) return (uint32_t)*(const int32_t *)e ^ 0x80000000u;
  if (dt == EM_UINT8 || dt == EM_BOOL) return *(const uint8_t *)e;
  float f = dt == EM_FLOAT32 ? *(const float *)e : (float)emi_load_f64(e, dt);
  if (f != f) return 0xffffffffu;
  if (f == 0) return 0x80000000u;
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  return u & 0x80000000u ? ~u : u | 0x80000000u;
}

/* The float32 value of a key (NaN for NaN's). */
static float key_float(uint32_t key) {
  uint32_t u = key & 0x80000000u ? key ^ 0x80000000u : ~key;
  float f;
  memcpy(&f, &u, sizeof f);
  return key == 0xffffffffu ? NAN : f;
}

/* w[0..n) in unsigned order of their high 32 bits, stably; tmp holds n words. */
static void radix_sort_high(uint64_t *w, uint64_t *tmp, int64_t n) {
  uint64_t *src = w, *dst = tmp;
  for (int shift = 32; shift < 64; shift += 8) {
    int64_t at[257] = {0};
    for (int64_t i = 0; i < n; i++) at[((src[i] >> shift) & 255) + 1]++;
    if (at[((src[0] >> shift) & 255) + 1] == n) continue;
    for (int b = 0; b < 256; b++) at[b + 1] += at[b];
    for (int64_t i = 0; i < n; i++) dst[at[(src[i] >> shift) & 255]++] = src[i];
    uint64_t *t = src;
    src = dst;
    dst = t;
  }
  if (src != w) memcpy(w, src, (size_t)n * sizeof *w);
}

static int word_order(const void *p, const void *q) {
  uint64_t x = *(const uint64_t *)p, y = *(const uint64_t *)q;
  return (x > y) - (x < y);
}

/* h[0..n) a max-heap of words: h[i] moved down to its place. */
static void sift_down_word(uint64_t *h, int64_t n, int64_t i) {
  for (;;) {
    int64_t c = 2 * i + 1;
    if (c >= n) return;
    if (c + 1 < n && h[c + 1] > h[c]) c++;
    if (h[c] <= h[i]) return;
    uint64_t t = h[c];
    h[c] = h[i];
    h[i] = t;
    i = c;
  }
}

/* Whether the eight floats at p all sort after `last` (descending: are below
** it; ascending: above it). */
typedef float v8f_sort __attribute__((vector_size(32)));
typedef int v8i_sort __attribute__((vector_size(32)));
static inline int block_loses(const char *p, float last, int descending) {
  v8f_sort v, l = {last, last, last, last, last, last, last, last};
  memcpy(&v, p, sizeof v);
  v8i_sort lose = descending ? v < l : v > l;
  int all = -1;
  for (int j = 0; j < 8; j++) all &= lose[j];
  return all != 0;
}

/* w[0..k) become the first k words of the line at p (n elements, stride st bytes)
** in order; w and tmp hold n words (w holds k when k is at most a quarter of n). */
static void line_words(uint64_t *w, uint64_t *tmp, const char *p, int64_t n, int64_t st,
                       em_dtype dt, int descending, int64_t k) {
  uint32_t flip = descending ? 0xffffffffu : 0;
#define WORD(i) ((uint64_t)(word_key(p + (i) * st, dt) ^ flip) << 32 | (uint64_t)(i))
  if (k * 4 > n) {
    for (int64_t i = 0; i < n; i++) w[i] = WORD(i);
    radix_sort_high(w, tmp, n);
    return;
  }
  for (int64_t i = 0; i < k; i++) w[i] = WORD(i);
  for (int64_t i = k / 2; i-- > 0;) sift_down_word(w, k, i);
  /* (float32: most elements lose to the heap's last by value alone, in a
  ** compare of floats; equal ones, NaN and the rest take the words' way) */
  int f32 = dt == EM_FLOAT32;
  float last = f32 ? key_float((uint32_t)(w[0] >> 32) ^ flip) : 0;
  for (int64_t i = k; i < n; i++) {
    /* (a contiguous float32 line: eight at a time, skipped whole while all of
    ** them lose -- NaN never does, its compares being false) */
    if (f32 && st == (int64_t)sizeof(float) && (i & 7) == 0 && i + 8 <= n &&
        block_loses(p + i * st, last, descending)) {
      i += 7;
      continue;
    }
    if (f32) {
      float f = *(const float *)(p + i * st);
      if (descending ? f < last : f > last) continue;
    }
    uint64_t x = WORD(i);
    if (x < w[0]) {
      w[0] = x;
      sift_down_word(w, k, 0);
      if (f32) last = key_float((uint32_t)(w[0] >> 32) ^ flip);
    }
  }
#undef WORD
  (void)tmp;    /* (the heap's positions are out of order: its words sort whole) */
  qsort(w, (size_t)k, sizeof *w, word_order);
}

typedef struct sort_job {
  lines l;
  int64_t *out;
  int64_t k;                /* the positions written per line */
  int descending, index_base;
  int failed;               /* a task could not get its scratch (atomic) */
} sort_job;

static void sort_words_task(sort_job *j, int64_t k0, int64_t k1) {
  const em_tensor *a = j->l.a;
  int64_t n = j->l.len, esz = (int64_t)em_dtype_size(a->dtype);
  int64_t cap = j->k * 4 > n ? n : j->k;
  uint64_t *w = malloc((size_t)cap * 2 * sizeof *w);   /* (the words and the radix's) */
  if (!w) { __atomic_store_n(&j->failed, 1, __ATOMIC_RELAXED); return; }
  const char *base = (const char *)a->storage->data;
  for (int64_t k = k0; k < k1; k++) {
    line_words(w, w + cap, base + line_offset(&j->l, k) * esz, n,
               a->strides[j->l.dim] * esz, a->dtype, j->descending, j->k);
    int64_t *o = j->out + line_start_contig(&j->l, k, j->k);
    for (int64_t i = 0; i < j->k; i++)
      o[i * j->l.inner] = (int64_t)(uint32_t)w[i] + j->index_base;
  }
  free(w);
}

static void sort_pairs_task(sort_job *j, int64_t k0, int64_t k1) {
  const em_tensor *a = j->l.a;
  int64_t n = j->l.len, st = a->strides[j->l.dim];
  size_t esz = em_dtype_size(a->dtype);
  int i64 = a->dtype == EM_INT64;
  const char *base = (const char *)a->storage->data;
  skey *keys = malloc((size_t)n * sizeof *keys);
  if (!keys) { __atomic_store_n(&j->failed, 1, __ATOMIC_RELAXED); return; }
  key_order cmp = i64 ? (j->descending ? desc_i : asc_i) : (j->descending ? desc_f : asc_f);
  for (int64_t k = k0; k < k1; k++) {
    const char *p = base + line_offset(&j->l, k) * (int64_t)esz;
    for (int64_t i = 0; i < n; i++) {
      const char *e = p + i * st * (int64_t)esz;
      if (i64) keys[i].k.i = *(const int64_t *)e;
      else keys[i].k.f = emi_load_f64(e, a->dtype);
      keys[i].pos = i;
    }
    first_k(keys, n, j->k, cmp);
    int64_t *o = j->out + line_start_contig(&j->l, k, j->k);
    for (int64_t i = 0; i < j->k; i++) o[i * j->l.inner] = keys[i].pos + j->index_base;
  }
  free(keys);
}

static void sort_task(void *ctx, int64_t k0, int64_t k1) {
  sort_job *j = ctx;
  if (word_keyed(j->l.a->dtype) && j->l.len <= UINT32_MAX) sort_words_task(j, k0, k1);
  else sort_pairs_task(j, k0, k1);
}

em_status emi_cpu_sort(emi_device *dev, em_tensor *indices, const em_tensor *a, int dim,
                       int descending, int index_base, int64_t k) {
  sort_job j = {.out = em_tensor_data(indices), .k = k, .descending = descending,
                .index_base = index_base};
  lines_init(&j.l, a, dim);
  int64_t nl = lines_count(&j.l);
  if (nl == 0 || k == 0) return EM_OK;
  int64_t grain = 4096 / (j.l.len + 1) + 1;
  emi_parallel_for(dev->S, nl, grain, sort_task, &j);
  if (j.failed)
    return emi_error(dev->S, EM_ERR_NOMEM, "sort: out of memory for the scratch of a line "
                     "of %lld elements", (long long)j.l.len);
  return EM_OK;
}

/* -- scans ------------------------------------------------------------------------ */

typedef struct scan_job {
  lines l;
  char *out;
  int op;
} scan_job;

static void scan_task(void *ctx, int64_t k0, int64_t k1) {
  scan_job *j = ctx;
  const em_tensor *a = j->l.a;
  em_dtype dt = a->dtype;
  int64_t n = j->l.len, st = a->strides[j->l.dim], ost = j->l.inner;
  const char *base = (const char *)a->storage->data;
  for (int64_t k = k0; k < k1; k++) {
    int64_t ao = line_offset(&j->l, k), oo = line_start_contig(&j->l, k, n);
    if (dt == EM_INT64) {
      const int64_t *p = (const int64_t *)base + ao;
      int64_t *o = (int64_t *)j->out + oo;
      uint64_t acc = j->op == EMI_SCAN_SUM ? 0 : 1;   /* unsigned: wraps, as torch's */
      for (int64_t i = 0; i < n; i++) {
        uint64_t v = (uint64_t)p[i * st];
        acc = j->op == EMI_SCAN_SUM ? acc + v : acc * v;
        o[i * ost] = (int64_t)acc;
      }
    } else if (dt == EM_FLOAT32) {
      const float *p = (const float *)base + ao;
      float *o = (float *)j->out + oo;
      double acc = j->op == EMI_SCAN_SUM ? 0 : 1;
      for (int64_t i = 0; i < n; i++) {
        acc = j->op == EMI_SCAN_SUM ? acc + p[i * st] : acc * p[i * st];
        o[i * ost] = (float)acc;
      }
    } else if (dt == EM_FLOAT64) {
      const double *p = (const double *)base + ao;
      double *o = (double *)j->out + oo;
      double acc = j->op == EMI_SCAN_SUM ? 0 : 1;
      for (int64_t i = 0; i < n; i++) {
        acc = j->op == EMI_SCAN_SUM ? acc + p[i * st] : acc * p[i * st];
        o[i * ost] = acc;
      }
    } else {
      size_t esz = em_dtype_size(dt);
      double acc = j->op == EMI_SCAN_SUM ? 0 : 1;
      for (int64_t i = 0; i < n; i++) {
        double v = emi_load_f64(base + (ao + i * st) * (int64_t)esz, dt);
        acc = j->op == EMI_SCAN_SUM ? acc + v : acc * v;
        emi_store_f64(j->out + (oo + i * ost) * (int64_t)esz, dt, acc);
      }
    }
  }
}

em_status emi_cpu_scan(emi_device *dev, int op, em_tensor *out, const em_tensor *a, int dim) {
  scan_job j = {.out = em_tensor_data(out), .op = op};
  lines_init(&j.l, a, dim);
  int64_t nl = lines_count(&j.l);
  if (nl == 0) return EM_OK;
  emi_parallel_for(dev->S, nl, 16384 / (j.l.len + 1) + 1, scan_task, &j);
  return EM_OK;
}

/*
** dataset.c -- what every dataset node shares: the per-thread context samples
** are computed in, per-sample random streams, node lifetime, and reading one
** sample or a stack of them (the generic batch assembly that stages without a
** fast path fall back on).
*/
#include "data.h"
#include "../philox.h"
#include <stdio.h>

/* -- Context ------------------------------------------------------------------------ */

void emi_dctx_init(emi_dctx *c, em_state *S, int worker, int64_t epoch) {
  memset(c, 0, sizeof *c);
  c->S = S;
  c->worker = worker;
  c->epoch = epoch;
}

em_status emi_dfail(emi_dctx *c, em_status code, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(c->err, sizeof c->err, fmt, ap);
  va_end(ap);
  return code;
}

static em_status check_new(emi_dctx *c, const char *op, const int64_t *sizes, int ndim,
                           em_dtype dt) {
  if (ndim < 0 || ndim > EM_MAX_DIMS)
    return emi_dfail(c, EM_ERR_SHAPE, "%s: %d dimensions (at most %d)", op, ndim,
                     EM_MAX_DIMS);
  for (int d = 0; d < ndim; d++)
    if (sizes[d] < 0) return emi_dfail(c, EM_ERR_SHAPE, "%s: negative size", op);
  if (!emi_shape_ok(sizes, ndim)) {   /* e.g. a decoder's (C, H, W) from a lying header */
    char b[EMI_SHAPE_STR];
    return emi_dfail(c, EM_ERR_SHAPE, "%s: shape %s is too large", op,
                     emi_shape_str(b, sizes, ndim));
  }
  if ((unsigned)dt >= EM_NUM_DTYPES)
    return emi_dfail(c, EM_ERR_DTYPE, "%s: invalid dtype %d", op, (int)dt);
  return EM_OK;
}

static em_status oom(emi_dctx *c, const char *op, const int64_t *sizes, int ndim,
                     em_dtype dt) {
  char b[EMI_SHAPE_STR];
  return emi_dfail(c, EM_ERR_NOMEM, "%s: out of memory allocating a %s tensor of shape %s",
                   op, em_dtype_name(dt), emi_shape_str(b, sizes, ndim));
}

em_status emi_dtensor_new(emi_dctx *c, const char *op, const int64_t *sizes, int ndim,
                          em_dtype dt, em_tensor **out) {
  em_status st = check_new(c, op, sizes, ndim, dt);
  if (st) return st;
  *out = emi_tensor_try_new(c->S, sizes, ndim, dt);
  return *out ? EM_OK : oom(c, op, sizes, ndim, dt);
}

em_status emi_dbuffer_new(emi_dctx *c, const char *op, const int64_t *sizes, int ndim,
                          em_dtype dt, em_tensor **out) {
  if (!c->buffer_alloc) return emi_dtensor_new(c, op, sizes, ndim, dt, out);
  em_status st = check_new(c, op, sizes, ndim, dt);
  if (st) return st;
  size_t nbytes = (size_t)emi_shape_numel(sizes, ndim) * em_dtype_size(dt);
  void *p = c->buffer_alloc(c->buffer_ud, nbytes ? nbytes : 1);
  if (!p) return oom(c, op, sizes, ndim, dt);
  *out = emi_tensor_try_external(c->S, p, nbytes, c->buffer_free, c->buffer_ud, sizes,
                                 ndim, dt);
  if (*out) return EM_OK;
  c->buffer_free(c->buffer_ud, p, nbytes);
  return oom(c, op, sizes, ndim, dt);
}

/* -- Per-sample random streams ---------------------------------------------------------
** Counter words: (draw number, index low, index high, epoch). The draw number
** runs in the first word so that one sample may take up to 2^32 * 4 words. */

void emi_drng_init(emi_drng *r, uint64_t seed, int64_t epoch, int64_t index) {
  r->key = seed;
  r->ctr[0] = 0;
  r->ctr[1] = (uint32_t)(uint64_t)index;
  r->ctr[2] = (uint32_t)((uint64_t)index >> 32);
  r->ctr[3] = (uint32_t)(uint64_t)epoch;
  r->left = 0;
}

uint32_t emi_drng_u32(emi_drng *r) {
  if (r->left == 0) {
    uint32_t key[2] = {(uint32_t)r->key, (uint32_t)(r->key >> 32)};
    emi_philox(r->ctr, key, r->buf);
    r->ctr[0]++;
    r->left = 4;
  }
  return r->buf[4 - r->left--];
}

double emi_drng_uniform(emi_drng *r) {
  uint64_t hi = emi_drng_u32(r) >> 5, lo = emi_drng_u32(r) >> 6;   /* 27 + 26 bits */
  return (double)(hi << 26 | lo) * (1.0 / 9007199254740992.0);
}

int64_t emi_drng_below(emi_drng *r, int64_t n) {
  if (n <= 1) return 0;
  /* Lemire's multiply-shift with rejection: exact uniformity, one draw usually. */
  uint64_t un = (uint64_t)n;
  if (un <= 0xffffffffu) {
    uint64_t m = (uint64_t)emi_drng_u32(r) * un;
    uint32_t low = (uint32_t)m;
    if (low < un) {
      uint32_t t = (uint32_t)(-(uint32_t)un) % (uint32_t)un;
      while (low < t) {
        m = (uint64_t)emi_drng_u32(r) * un;
        low = (uint32_t)m;
      }
    }
    return (int64_t)(m >> 32);
  }
  uint64_t lim = UINT64_MAX - UINT64_MAX % un, v;      /* huge n: plain rejection */
  do v = (uint64_t)emi_drng_u32(r) << 32 | emi_drng_u32(r); while (v >= lim);
  return (int64_t)(v % un);
}

/* -- Nodes ----------------------------------------------------------------------------- */

em_status emi_dataset_new(em_state *S, const emi_dataset_vt *vt, em_dataset *parent,
                          int64_t len, int nfields, void *impl, em_dataset **out) {
  em_dataset *d = emi_malloc(S, sizeof *d);
  if (!d) {
    em_dataset tmp = {.S = S, .vt = vt, .impl = impl};
    if (vt->destroy) vt->destroy(&tmp);
    return emi_error(S, EM_ERR_NOMEM, "%s: out of memory", vt->kind);
  }
  d->refcount = 1;
  d->S = S;
  d->vt = vt;
  d->parent = parent;
  if (parent) em_dataset_retain(parent);
  d->len = len;
  d->nfields = nfields;
  d->batched = parent ? parent->batched : 0;
  d->impl = impl;
  *out = d;
  return EM_OK;
}

void em_dataset_retain(em_dataset *d) { if (d) emi_atomic_inc(&d->refcount); }

void em_dataset_release(em_dataset *d) {
  while (d && emi_atomic_dec(&d->refcount) == 0) {   /* a chain dies stage by stage */
    em_dataset *parent = d->parent;
    if (d->vt->destroy) d->vt->destroy(d);
    emi_free(d->S, d, sizeof *d);
    d = parent;
  }
}

int64_t em_dataset_len(const em_dataset *d) { return d ? d->len : 0; }
int em_dataset_nfields(const em_dataset *d) { return d ? d->nfields : 0; }
const char *em_dataset_kind(const em_dataset *d) { return d ? d->vt->kind : "none"; }

em_status emi_dataset_get(em_dataset *d, emi_dctx *c, int64_t i, em_tensor **out) {
  if (i < 0 || i >= d->len)
    return emi_dfail(c, EM_ERR_INDEX, "%s: sample %lld out of range (dataset has %lld)",
                     d->vt->kind, (long long)i, (long long)d->len);
  for (int k = 0; k < d->nfields; k++) out[k] = NULL;
  em_status st = d->vt->get(d, c, i, out);
  if (st)
    for (int k = 0; k < d->nfields; k++) { em_tensor_release(out[k]); out[k] = NULL; }
  return st;
}

em_status em_dataset_get(em_state *S, em_dataset *d, int64_t i, int64_t epoch,
                         em_tensor **out) {
  if (!d || !out) return emi_error(S, EM_ERR_ARG, "dataset get: dataset and out are required");
  emi_dctx c;
  emi_dctx_init(&c, S, -1, epoch);
  em_status st = emi_dataset_get(d, &c, i, out);
  return st ? emi_error(S, st, "%s", c.err) : EM_OK;
}

/* -- Stacking samples -------------------------------------------------------------------- */

/* Samples are copied into the batch with emi_copy_strided (cpu/strided.c): on
** this thread, never the state's workers. */

em_status emi_dataset_get_many(em_dataset *d, emi_dctx *c, const int64_t *idx, int64_t n,
                               em_tensor **out) {
  int nf = d->nfields;
  for (int k = 0; k < nf; k++) out[k] = NULL;
  if (d->vt->get_many) {
    em_status st = d->vt->get_many(d, c, idx, n, out);
    if (st != EM_ERR_UNSUPPORTED) return st;
  }
  /* Generic path: the first sample fixes shapes and dtypes, the batch buffers are
  ** allocated once, and every sample is copied into its row as it comes. */
  em_tensor *s[EM_DATA_MAX_FIELDS] = {0};
  em_status st = EM_OK;
  for (int64_t j = 0; j < n && !st; j++) {
    st = emi_dataset_get(d, c, idx[j], s);
    if (st) break;
    for (int k = 0; k < nf && !st; k++) {
      if (j == 0) {
        int64_t sizes[EM_MAX_DIMS];
        if (s[k]->ndim + 1 > EM_MAX_DIMS) {
          st = emi_dfail(c, EM_ERR_SHAPE, "batch: samples of %d dims can't be stacked",
                         s[k]->ndim);
          break;
        }
        sizes[0] = n;
        for (int e = 0; e < s[k]->ndim; e++) sizes[e + 1] = s[k]->sizes[e];
        st = emi_dbuffer_new(c, "batch", sizes, s[k]->ndim + 1, s[k]->dtype, &out[k]);
        if (st) break;
      }
      /* out[k] is (n, *sample shape): every sample must match the first */
      int ok = s[k]->dtype == out[k]->dtype && s[k]->ndim + 1 == out[k]->ndim;
      for (int e = 0; ok && e < s[k]->ndim; e++) ok = s[k]->sizes[e] == out[k]->sizes[e + 1];
      if (!ok) {
        char a[EMI_SHAPE_STR], b[EMI_SHAPE_STR];
        st = emi_dfail(c, EM_ERR_SHAPE,
                       "batch: sample %lld has field %d of %s %s, but the batch's first "
                       "sample has %s %s (resize or crop to one size before batch)",
                       (long long)idx[j], k + 1, em_dtype_name(s[k]->dtype),
                       emi_shape_str(a, s[k]->sizes, s[k]->ndim),
                       em_dtype_name(out[k]->dtype),
                       emi_shape_str(b, out[k]->sizes + 1, out[k]->ndim - 1));
        break;
      }
      size_t row = (size_t)s[k]->numel * em_dtype_size(s[k]->dtype);
      emi_copy_strided((char *)em_tensor_data(out[k]) + (size_t)j * row, s[k]);
    }
    for (int k = 0; k < nf; k++) { em_tensor_release(s[k]); s[k] = NULL; }
  }
  if (st)
    for (int k = 0; k < nf; k++) { em_tensor_release(out[k]); out[k] = NULL; }
  return st;
}

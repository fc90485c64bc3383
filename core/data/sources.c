/*
** sources.c -- datasets that need no files: tensors already in memory (also the
** form the IDX, CIFAR and CSV readers hand their data in) and synthetic data,
** the quick check that tells an input-bound job from a compute-bound one.
*/
#include "data.h"
#include "../philox.h"

/* -- In-memory tensors ----------------------------------------------------------------
** Sample i is row i of every field, as a view: nothing is copied. A batch of
** consecutive rows (no shuffle) is a view too; any other set of rows is
** gathered into a batch buffer with one memcpy per row. */

typedef struct mem_src {
  const char *kind;
  int nfields;
  em_tensor *f[EM_DATA_MAX_FIELDS];
} mem_src;

static em_status mem_get(em_dataset *d, emi_dctx *c, int64_t i, em_tensor **out) {
  mem_src *m = d->impl;
  for (int k = 0; k < m->nfields; k++) {
    const em_tensor *t = m->f[k];
    out[k] = emi_tensor_try_view(c->S, t, t->sizes + 1, t->strides + 1, t->ndim - 1,
                                 t->offset + i * t->strides[0]);
    if (!out[k]) return emi_dfail(c, EM_ERR_NOMEM, "%s: out of memory", m->kind);
  }
  return EM_OK;
}

static em_status mem_get_many(em_dataset *d, emi_dctx *c, const int64_t *idx, int64_t n,
                              em_tensor **out) {
  mem_src *m = d->impl;
  int consecutive = 1;
  for (int64_t j = 1; j < n && consecutive; j++) consecutive = idx[j] == idx[0] + j;
  for (int k = 0; k < m->nfields; k++) {
    const em_tensor *t = m->f[k];
    int64_t sizes[EM_MAX_DIMS];
    sizes[0] = n;
    for (int e = 1; e < t->ndim; e++) sizes[e] = t->sizes[e];
    if (consecutive && n > 0) {                 /* zero-copy: a narrow of the field */
      out[k] = emi_tensor_try_view(c->S, t, sizes, t->strides, t->ndim,
                                   t->offset + idx[0] * t->strides[0]);
      if (!out[k]) return emi_dfail(c, EM_ERR_NOMEM, "%s: out of memory", m->kind);
      continue;
    }
    em_status st = emi_dbuffer_new(c, "batch", sizes, t->ndim, t->dtype, &out[k]);
    if (st) return st;
    size_t esz = em_dtype_size(t->dtype);
    int64_t rowel = t->ndim > 1 ? t->numel / (t->sizes[0] ? t->sizes[0] : 1) : 1;
    size_t row = (size_t)rowel * esz;
    char *dst = em_tensor_data(out[k]);
    /* Rows are contiguous when the field is apart from its first dim. */
    int64_t expect = 1;
    int rows_contig = 1;
    for (int e = t->ndim - 1; e >= 1; e--) {
      if (t->sizes[e] != 1 && t->strides[e] != expect) rows_contig = 0;
      expect *= t->sizes[e];
    }
    const char *base = em_tensor_data(t);
    for (int64_t j = 0; j < n; j++, dst += row) {
      if (rows_contig) {
        memcpy(dst, base + idx[j] * t->strides[0] * (int64_t)esz, row);
        continue;
      }
      em_tensor *v = emi_tensor_try_view(c->S, t, t->sizes + 1, t->strides + 1, t->ndim - 1,
                                         t->offset + idx[j] * t->strides[0]);
      if (!v) return emi_dfail(c, EM_ERR_NOMEM, "%s: out of memory", m->kind);
      emi_copy_strided(dst, v);
      em_tensor_release(v);
    }
  }
  return EM_OK;
}

static void mem_destroy(em_dataset *d) {
  mem_src *m = d->impl;
  if (!m) return;
  for (int k = 0; k < m->nfields; k++) em_tensor_release(m->f[k]);
  emi_free(d->S, m, sizeof *m);
}

static const emi_dataset_vt mem_vt[] = {
  {"tensors", mem_get, mem_get_many, mem_destroy}, {"idx", mem_get, mem_get_many, mem_destroy},
  {"cifar10", mem_get, mem_get_many, mem_destroy}, {"csv", mem_get, mem_get_many, mem_destroy},
};

em_status emi_data_tensors_kind(em_state *S, const char *kind, em_tensor *const *fields,
                                int nfields, em_dataset **out) {
  if (!out) return emi_error(S, EM_ERR_ARG, "%s: out is required", kind);
  *out = NULL;
  if (!fields || nfields < 1 || nfields > EM_DATA_MAX_FIELDS)
    return emi_error(S, EM_ERR_ARG, "%s: need 1 to %d tensors, got %d", kind,
                     EM_DATA_MAX_FIELDS, nfields);
  for (int k = 0; k < nfields; k++) {
    em_status st = emi_check_tensor(S, kind, fields[k]);
    if (st) return st;
    if (fields[k]->ndim < 1)
      return emi_error(S, EM_ERR_SHAPE, "%s: tensor %d is 0-d; samples are rows of the "
                       "first dimension", kind, k + 1);
    if (fields[k]->device != EM_CPU)
      return emi_error(S, EM_ERR_DEVICE, "%s: tensor %d is not on the cpu", kind, k + 1);
    if (fields[k]->sizes[0] != fields[0]->sizes[0])
      return emi_error(S, EM_ERR_SHAPE, "%s: tensors %s and %s differ in their first "
                       "dimension (%lld vs %lld samples)", kind, emi_tshape(S, fields[0]),
                       emi_tshape(S, fields[k]), (long long)fields[0]->sizes[0],
                       (long long)fields[k]->sizes[0]);
  }
  const emi_dataset_vt *vt = &mem_vt[0];
  for (size_t v = 0; v < sizeof mem_vt / sizeof mem_vt[0]; v++)
    if (!strcmp(mem_vt[v].kind, kind)) vt = &mem_vt[v];
  mem_src *m = emi_malloc(S, sizeof *m);
  if (!m) return emi_error(S, EM_ERR_NOMEM, "%s: out of memory", kind);
  m->kind = vt->kind;
  m->nfields = nfields;
  for (int k = 0; k < nfields; k++) { m->f[k] = fields[k]; em_tensor_retain(fields[k]); }
  return emi_dataset_new(S, vt, NULL, fields[0]->sizes[0], nfields, m, out);
}

em_status em_dataset_tensor(em_state *S, em_dataset *d, int field, em_tensor **out) {
  if (!d || !out) return emi_error(S, EM_ERR_ARG, "dataset tensor: dataset and out are required");
  *out = NULL;
  if (d->vt->get != mem_get)
    return emi_error(S, EM_ERR_ARG, "dataset tensor: a %s dataset does not hold its samples "
                     "as tensors (only in-memory sources do: tensors, idx, cifar10, csv)",
                     d->vt->kind);
  mem_src *m = d->impl;
  if (field < 0 || field >= m->nfields)
    return emi_error(S, EM_ERR_INDEX, "dataset tensor: field %d out of range (%d fields)",
                     field, m->nfields);
  *out = m->f[field];
  em_tensor_retain(*out);
  return EM_OK;
}

em_status em_data_tensors(em_state *S, em_tensor *const *fields, int nfields,
                          em_dataset **out) {
  return emi_data_tensors_kind(S, "tensors", fields, nfields, out);
}

/* -- Synthetic data ------------------------------------------------------------------------
** Sample i is a pure function of (seed, i): Philox counters i * words .. give the
** values, one more counter the label. Same data every epoch, as a real dataset. */

typedef struct synth_src {
  int64_t shape[EM_MAX_DIMS];
  int ndim;
  em_dtype dt;
  int64_t classes, numel;
  uint64_t seed;
  int label_base;
} synth_src;

/* Fills numel values of sample i at dst (sample layout, dtype dt). */
static void synth_fill(const synth_src *s, int64_t i, char *dst) {
  uint32_t words[4 * EMI_PHILOX_RUN];
  uint64_t per = (uint64_t)(s->numel + 3) / 4 + 1;     /* counters per sample */
  uint64_t ctr = (uint64_t)i * per;
  size_t esz = em_dtype_size(s->dt);
  for (int64_t done = 0; done < s->numel;) {
    int64_t want = s->numel - done;
    int nc = (int)((want + 3) / 4 < EMI_PHILOX_RUN ? (want + 3) / 4 : EMI_PHILOX_RUN);
    emi_philox_run(s->seed, ctr, nc, words);
    ctr += (uint64_t)nc;
    int64_t m = want < 4 * nc ? want : 4 * nc;
    for (int64_t j = 0; j < m; j++) {
      char *p = dst + (size_t)(done + j) * esz;
      uint32_t w = words[j];
      switch (s->dt) {
      case EM_UINT8: *(uint8_t *)p = (uint8_t)(w >> 24); break;
      case EM_FLOAT32: *(float *)p = (float)(w >> 8) * (1.0f / 16777216.0f); break;
      default: emi_store_f64(p, s->dt, s->dt == EM_BOOL ? (double)(w >> 31)
                             : em_dtype_is_floating(s->dt) ? (w >> 8) * (1.0 / 16777216.0)
                             : (double)(w >> 24));
      }
    }
    done += m;
  }
}

static int64_t synth_label(const synth_src *s, int64_t i) {
  emi_drng r;
  emi_drng_init(&r, s->seed ^ 0x6c6162656c73ull, 0, i);    /* "labels" */
  return s->label_base + emi_drng_below(&r, s->classes);
}

static em_status synth_get(em_dataset *d, emi_dctx *c, int64_t i, em_tensor **out) {
  synth_src *s = d->impl;
  em_status st = emi_dtensor_new(c, "synthetic", s->shape, s->ndim, s->dt, &out[0]);
  if (st) return st;
  synth_fill(s, i, em_tensor_data(out[0]));
  st = emi_dtensor_new(c, "synthetic", NULL, 0, EM_INT64, &out[1]);
  if (st) return st;
  *(int64_t *)em_tensor_data(out[1]) = synth_label(s, i);
  return EM_OK;
}

static em_status synth_get_many(em_dataset *d, emi_dctx *c, const int64_t *idx, int64_t n,
                                em_tensor **out) {
  synth_src *s = d->impl;
  int64_t sizes[EM_MAX_DIMS + 1];
  sizes[0] = n;
  for (int e = 0; e < s->ndim; e++) sizes[e + 1] = s->shape[e];
  em_status st = emi_dbuffer_new(c, "batch", sizes, s->ndim + 1, s->dt, &out[0]);
  if (!st) st = emi_dbuffer_new(c, "batch", sizes, 1, EM_INT64, &out[1]);
  if (st) return st;
  size_t row = (size_t)s->numel * em_dtype_size(s->dt);
  for (int64_t j = 0; j < n; j++) {
    synth_fill(s, idx[j], (char *)em_tensor_data(out[0]) + (size_t)j * row);
    ((int64_t *)em_tensor_data(out[1]))[j] = synth_label(s, idx[j]);
  }
  return EM_OK;
}

static void synth_destroy(em_dataset *d) { emi_free(d->S, d->impl, sizeof(synth_src)); }

static const emi_dataset_vt synth_vt = {"synthetic", synth_get, synth_get_many,
                                        synth_destroy};

em_status em_data_synthetic(em_state *S, const int64_t *shape, int ndim, em_dtype dt,
                            int64_t classes, int64_t size, uint64_t seed, int label_base,
                            em_dataset **out) {
  if (!out) return emi_error(S, EM_ERR_ARG, "synthetic: out is required");
  *out = NULL;
  if (ndim < 0 || ndim >= EM_MAX_DIMS || (ndim && !shape))
    return emi_error(S, EM_ERR_SHAPE, "synthetic: a sample shape of 0 to %d dims is "
                     "needed, got %d", EM_MAX_DIMS - 1, ndim);
  if ((unsigned)dt >= EM_NUM_DTYPES)
    return emi_error(S, EM_ERR_DTYPE, "synthetic: invalid dtype %d", (int)dt);
  if (classes < 1) return emi_error(S, EM_ERR_ARG, "synthetic: classes must be >= 1, got %lld",
                                    (long long)classes);
  if (size < 0) return emi_error(S, EM_ERR_ARG, "synthetic: size must be >= 0, got %lld",
                                 (long long)size);
  synth_src *s = emi_malloc(S, sizeof *s);
  if (!s) return emi_error(S, EM_ERR_NOMEM, "synthetic: out of memory");
  s->ndim = ndim;
  s->numel = 1;
  for (int e = 0; e < ndim; e++) {
    if (shape[e] < 0) {
      emi_free(S, s, sizeof *s);
      return emi_error(S, EM_ERR_SHAPE, "synthetic: negative size in the sample shape");
    }
    s->shape[e] = shape[e];
    s->numel *= shape[e];
  }
  s->dt = dt;
  s->classes = classes;
  s->seed = seed;
  s->label_base = label_base;
  return emi_dataset_new(S, &synth_vt, NULL, size, 2, s, out);
}

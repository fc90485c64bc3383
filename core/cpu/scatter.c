/*
** scatter.c -- CPU in-place scatter-adds: index_add (the backward of
** index_select / embedding) and scatter_add (the backward of gather). Any dtype
** and strides; float32/float64 add natively, the others go through double
** (float16/bfloat16 round once per add, as PyTorch's CPU kernels do). Every
** index is range-checked before out is touched, so an error leaves out intact.
** Serial: duplicate indices would race if split across threads (and out may
** share storage with src, which a serial walk in this order handles).
*/
#include "cpu.h"

/* Index value at element offset off of idx (int32/int64). */
static int64_t idx_at(const em_tensor *idx, int64_t off) {
  const char *p = (const char *)em_tensor_data(idx) + off * (int64_t)em_dtype_size(idx->dtype);
  return idx->dtype == EM_INT64 ? *(const int64_t *)p : *(const int32_t *)p;
}

static inline void add_at(char *o, const char *s, em_dtype dt) {
  switch (dt) {
  case EM_FLOAT32: *(float *)o += *(const float *)s; break;
  case EM_FLOAT64: *(double *)o += *(const double *)s; break;
  case EM_INT64: *(int64_t *)o += *(const int64_t *)s; break;
  case EM_INT32: *(int32_t *)o = (int32_t)((uint32_t)*(int32_t *)o + (uint32_t)*(const int32_t *)s); break;
  case EM_UINT8: *(uint8_t *)o = (uint8_t)(*(uint8_t *)o + *(const uint8_t *)s); break;
  case EM_BOOL: *(uint8_t *)o = *(uint8_t *)o || *(const uint8_t *)s; break;
  default: emi_store_f64(o, dt, emi_load_f64(o, dt) + emi_load_f64(s, dt)); break;
  }
}

/* -- index_add: out[.., idx[i], ..] += src[.., i, ..] along dim ---------------------- */
em_status emi_cpu_index_add(emi_device *dev, em_tensor *out, int dim, const em_tensor *idx,
                            const em_tensor *src, int index_base) {
  int64_t n = idx->numel;
  /* 0-d tensors act as 1-element vectors */
  int nd = out->ndim ? out->ndim : 1;
  int64_t osz[EM_MAX_DIMS], ost[EM_MAX_DIMS], ssz[EM_MAX_DIMS], sst[EM_MAX_DIMS];
  for (int d = 0; d < nd; d++) {
    osz[d] = out->ndim ? out->sizes[d] : 1;
    ost[d] = out->ndim ? out->strides[d] : 0;
    ssz[d] = src->ndim ? src->sizes[d] : 1;
    sst[d] = src->ndim ? src->strides[d] : 0;
  }
  int64_t is = idx->ndim ? idx->strides[0] : 0;
  for (int64_t i = 0; i < n; i++) {
    int64_t v = idx_at(idx, i * is) - index_base;
    if (v < 0 || v >= osz[dim])
      return emi_error(dev->S, EM_ERR_INDEX, "index_add_: index %lld is out of range for "
                       "dim %lld of size %lld (index_base %d)", (long long)(v + index_base),
                       emi_ix(dev->S, dim), (long long)osz[dim], index_base);
  }
  if (src->numel == 0) return EM_OK;
  size_t es = em_dtype_size(out->dtype);
  char *ob = em_tensor_data(out);
  const char *sb = em_tensor_data(src);
  /* Walk src with a counter over every dim but dim; for each, add along dim. */
  int64_t cnt[EM_MAX_DIMS] = {0};
  for (;;) {
    int64_t so = 0, oo = 0;
    for (int d = 0; d < nd; d++)
      if (d != dim) { so += cnt[d] * sst[d]; oo += cnt[d] * ost[d]; }
    for (int64_t i = 0; i < n; i++) {
      int64_t v = idx_at(idx, i * is) - index_base;
      add_at(ob + (oo + v * ost[dim]) * (int64_t)es, sb + (so + i * sst[dim]) * (int64_t)es,
             out->dtype);
    }
    int d = nd - 1;
    for (; d >= 0; d--) {
      if (d == dim) continue;
      if (++cnt[d] < ssz[d]) break;
      cnt[d] = 0;
    }
    if (d < 0) break;
  }
  return EM_OK;
}

/* -- scatter_add: out[.., idx[p], ..] += src[p] at every position p of idx ----------- */
em_status emi_cpu_scatter_add(emi_device *dev, em_tensor *out, int dim, const em_tensor *idx,
                              const em_tensor *src, int index_base) {
  em_state *S = dev->S;
  int nd = out->ndim;
  if (idx->numel == 0) return EM_OK;
  if (nd == 0) {
    int64_t v = idx_at(idx, 0) - index_base;
    if (v != 0)
      return emi_error(S, EM_ERR_INDEX, "scatter_add_: index %lld is out of range for a 0-d "
                       "self", (long long)(v + index_base));
    add_at(em_tensor_data(out), em_tensor_data(src), out->dtype);
    return EM_OK;
  }
  size_t es = em_dtype_size(out->dtype);
  char *ob = em_tensor_data(out);
  const char *sb = em_tensor_data(src);
  /* two passes over idx: check every index, then add */
  for (int pass = 0; pass < 2; pass++) {
    int64_t cnt[EM_MAX_DIMS] = {0};
    for (;;) {
      int64_t io = 0, so = 0, oo = 0;
      for (int d = 0; d < nd; d++) {
        io += cnt[d] * idx->strides[d];
        so += cnt[d] * src->strides[d];
        if (d != dim) oo += cnt[d] * out->strides[d];
      }
      int64_t v = idx_at(idx, io) - index_base;
      if (pass == 0) {
        if (v < 0 || v >= out->sizes[dim])
          return emi_error(S, EM_ERR_INDEX, "scatter_add_: index %lld is out of range for "
                           "dim %lld of size %lld (index_base %d)", (long long)(v + index_base),
                           emi_ix(S, dim), (long long)out->sizes[dim], index_base);
      } else {
        add_at(ob + (oo + v * out->strides[dim]) * (int64_t)es, sb + so * (int64_t)es,
               out->dtype);
      }
      int d = nd - 1;
      for (; d >= 0; d--) {
        if (++cnt[d] < idx->sizes[d]) break;
        cnt[d] = 0;
      }
      if (d < 0) break;
    }
  }
  return EM_OK;
}

/*
** strided.c -- same-dtype copies from any strides into contiguous memory, on
** the calling thread.
**
** Why beside copy.c: emi_cpu_copy (the backend's copy entry) converts dtypes
** and splits the work over the state's workers, which belong to the thread that
** owns the state. The input pipeline's loader threads must not use those
** workers (core/data/data.h), yet they stack samples into batches, gather rows
** and copy the rows of crops and flips all the time. This is their one strided
** copy: moves by element size (1, 2, 4, 8 bytes; memcpy otherwise), a memcpy
** per row when the row is contiguous, and dims merged first wherever the
** strides allow, so a narrowed or sliced view copies in few long rows.
*/
#include "../internal.h"

void emi_copy_row(void *dst_, const void *src_, int64_t n, int64_t ss, size_t es) {
  char *dst = dst_;
  const char *src = src_;
  if (n <= 0) return;
  if (ss == (int64_t)es) {
    memcpy(dst, src, (size_t)n * es);
    return;
  }
  switch (es) {
  case 1: for (int64_t i = 0; i < n; i++) dst[i] = src[i * ss]; break;
  case 2: for (int64_t i = 0; i < n; i++) ((uint16_t *)dst)[i] = *(const uint16_t *)(src + i * ss); break;
  case 4: for (int64_t i = 0; i < n; i++) ((uint32_t *)dst)[i] = *(const uint32_t *)(src + i * ss); break;
  case 8: for (int64_t i = 0; i < n; i++) ((uint64_t *)dst)[i] = *(const uint64_t *)(src + i * ss); break;
  default: for (int64_t i = 0; i < n; i++) memcpy(dst + (size_t)i * es, src + i * ss, es); break;
  }
}

void emi_copy_strided(void *dst_, const em_tensor *src) {
  char *dst = dst_;
  size_t es = em_dtype_size(src->dtype);
  if (src->numel == 0) return;
  const char *base = em_tensor_data(src);
  /* sizes and byte strides with size-1 dims dropped and mergeable neighbours
  ** merged (d and d+1 merge when stepping d is stepping d+1 sizes[d+1] times) */
  int64_t size[EM_MAX_DIMS], stride[EM_MAX_DIMS];
  int nd = 0;
  for (int d = 0; d < src->ndim; d++) {
    if (src->sizes[d] == 1) continue;
    int64_t s = src->strides[d] * (int64_t)es;
    if (nd > 0 && stride[nd - 1] == s * src->sizes[d]) {
      size[nd - 1] *= src->sizes[d];
      stride[nd - 1] = s;
    } else {
      size[nd] = src->sizes[d];
      stride[nd++] = s;
    }
  }
  if (nd == 0) {                                   /* one element */
    memcpy(dst, base, es);
    return;
  }
  int64_t inner = size[nd - 1], istride = stride[nd - 1];
  size_t row = (size_t)inner * es;
  int64_t idx[EM_MAX_DIMS] = {0};
  for (int64_t done = 0; done < src->numel; done += inner, dst += row) {
    const char *p = base;
    for (int d = 0; d < nd - 1; d++) p += idx[d] * stride[d];
    emi_copy_row(dst, p, inner, istride, es);
    for (int d = nd - 2; d >= 0; d--) {            /* odometer over the outer dims */
      if (++idx[d] < size[d]) break;
      idx[d] = 0;
    }
  }
}

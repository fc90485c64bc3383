/*
** k_index.c -- the CUDA backend's index_select, gather, index_add and
** scatter_add. One source for nvcc and the grid emulator (device.h).
**
** Range checks. The indices are copied back to the host (a sync) and checked
** there in the CPU backend's order, before any kernel is queued, so an error
** names the same first bad index with the same message as the CPU and leaves
** the output untouched. Correctness over speed: the indices are small next to
** the data they move.
**
** The adds are deterministic, without atomics: index_add gives each thread one
** position of src outside dim and walks the indices in order; scatter_add gives
** each thread one line of idx along dim and walks it in order. Threads write
** disjoint elements of out and each element sees its additions in the CPU's
** order, so float sums match the CPU bit for bit (as long as out and src do not
** overlap, where the CPU's serial walk defines the result).
*/
#include "cuda.h"
#include "device.h"
#include "dtype_dev.h"
#include "k_index.h"

enum { THREADS = 256, MAX_BLOCKS = 4096 };

typedef struct ix_args {
  char *out;
  const char *a;                  /* index_select/gather: source; adds: src */
  const char *idx;
  int64_t n;                      /* threads' work items */
  int ndim, dim, esize, idt, dt, index_base;
  int64_t nidx;                   /* index_select/index_add: idx numel; scatter_add: line length */
  int64_t istride;                /* idx stride for 1-D idx (elements) */
  int64_t sizes[EM_MAX_DIMS];     /* the geometry walked (see each kernel) */
  int64_t ostrides[EM_MAX_DIMS];
  int64_t astrides[EM_MAX_DIMS];
  int64_t istrides[EM_MAX_DIMS];
} ix_args;

EMK_DEVICE int64_t ix_load(const char *p, int idt) {
  return idt == EM_INT64 ? *(const int64_t *)p : (int64_t)*(const int32_t *)p;
}

EMK_DEVICE void ix_move(char *dst, const char *src, int esize) {
  switch (esize) {
  case 1: *(uint8_t *)dst = *(const uint8_t *)src; break;
  case 2: *(uint16_t *)dst = *(const uint16_t *)src; break;
  case 4: *(uint32_t *)dst = *(const uint32_t *)src; break;
  default: *(uint64_t *)dst = *(const uint64_t *)src; break;
  }
}

/* *o += *s as the CPU's add_at (core/cpu/scatter.c) */
EMK_DEVICE void ix_add(char *o, const char *s, int dt) {
  switch (dt) {
  case EM_FLOAT32: *(float *)o += *(const float *)s; break;
  case EM_FLOAT64: *(double *)o += *(const double *)s; break;
  case EM_INT64: *(int64_t *)o = (int64_t)((uint64_t)*(int64_t *)o + (uint64_t)*(const int64_t *)s); break;
  case EM_INT32: *(int32_t *)o = (int32_t)((uint32_t)*(int32_t *)o + (uint32_t)*(const int32_t *)s); break;
  case EM_UINT8: *(uint8_t *)o = (uint8_t)(*(uint8_t *)o + *(const uint8_t *)s); break;
  case EM_BOOL: *(uint8_t *)o = *(uint8_t *)o || *(const uint8_t *)s; break;
  default: emk_store_f64(o, dt, emk_load_f64(o, dt) + emk_load_f64(s, dt)); break;
  }
}

/* index_select: one thread per element of out (contiguous, sizes = out's);
** a's offset from every dim but dim, plus idx[k_dim] along dim. */
EMK_KERNEL(k_index_select, ix_args) {
  int64_t step = (int64_t)gridDim.x * blockDim.x;
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < a.n; i += step) {
    int64_t rest = i, ao = 0;
    for (int d = a.ndim - 1; d >= 0; d--) {
      int64_t k = rest % a.sizes[d];
      rest /= a.sizes[d];
      if (d == a.dim)
        k = ix_load(a.idx + k * a.istride * (a.idt == EM_INT64 ? 8 : 4), a.idt) - a.index_base;
      ao += k * a.astrides[d];
    }
    ix_move(a.out + i * a.esize, a.a + ao * a.esize, a.esize);
  }
}

/* gather: one thread per element of out (contiguous, idx's shape). */
EMK_KERNEL(k_gather, ix_args) {
  int64_t step = (int64_t)gridDim.x * blockDim.x;
  int is = a.idt == EM_INT64 ? 8 : 4;
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < a.n; i += step) {
    int64_t rest = i, ao = 0, io = 0;
    for (int d = a.ndim - 1; d >= 0; d--) {
      int64_t k = rest % a.sizes[d];
      rest /= a.sizes[d];
      io += k * a.istrides[d];
      if (d != a.dim) ao += k * a.astrides[d];
    }
    int64_t v = ix_load(a.idx + io * is, a.idt) - a.index_base;
    ao += v * a.astrides[a.dim];
    ix_move(a.out + i * a.esize, a.a + ao * a.esize, a.esize);
  }
}

/* index_add: one thread per position of src outside dim (sizes = src's with
** sizes[dim] = 1); walks the nidx indices in order. */
EMK_KERNEL(k_index_add, ix_args) {
  int64_t step = (int64_t)gridDim.x * blockDim.x;
  int is = a.idt == EM_INT64 ? 8 : 4;
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < a.n; i += step) {
    int64_t rest = i, so = 0, oo = 0;
    for (int d = a.ndim - 1; d >= 0; d--) {
      int64_t k = rest % a.sizes[d];
      rest /= a.sizes[d];
      so += k * a.astrides[d];
      oo += k * a.ostrides[d];
    }
    for (int64_t j = 0; j < a.nidx; j++) {
      int64_t v = ix_load(a.idx + j * a.istride * is, a.idt) - a.index_base;
      ix_add(a.out + (oo + v * a.ostrides[a.dim]) * a.esize,
             a.a + (so + j * a.astrides[a.dim]) * a.esize, a.dt);
    }
  }
}

/* scatter_add: one thread per line of idx along dim (sizes = idx's with
** sizes[dim] = 1); walks the line's nidx positions in order. */
EMK_KERNEL(k_scatter_add, ix_args) {
  int64_t step = (int64_t)gridDim.x * blockDim.x;
  int is = a.idt == EM_INT64 ? 8 : 4;
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < a.n; i += step) {
    int64_t rest = i, so = 0, oo = 0, io = 0;
    for (int d = a.ndim - 1; d >= 0; d--) {
      int64_t k = rest % a.sizes[d];
      rest /= a.sizes[d];
      so += k * a.astrides[d];
      oo += k * a.ostrides[d];
      io += k * a.istrides[d];
    }
    for (int64_t j = 0; j < a.nidx; j++) {
      int64_t v = ix_load(a.idx + (io + j * a.istrides[a.dim]) * is, a.idt) - a.index_base;
      ix_add(a.out + (oo + v * a.ostrides[a.dim]) * a.esize,
             a.a + (so + j * a.astrides[a.dim]) * a.esize, a.dt);
    }
  }
}

static em_status launch(emi_device *d, const char *op, const emk_kernel *k, ix_args *a) {
  emk_cuda_device *cd = emk_dev(d);
  emk_runtime *rt = cd->cuda->rt;
  int64_t blocks = (a->n + THREADS - 1) / THREADS;
  if (blocks > MAX_BLOCKS) blocks = MAX_BLOCKS;
  if (blocks < 1) blocks = 1;
  emk_dim3 grid = {(unsigned)blocks, 1, 1}, block = {THREADS, 1, 1};
  em_status st = rt->ops->launch(rt, k, grid, block, 0, cd->compute, a, sizeof *a);
  return st ? emk_error(d, op, st) : EM_OK;
}

/* idx's values on the host, contiguous, in idx's row-major order (a sync). */
static em_status host_indices(emi_device *d, const char *op, const em_tensor *idx,
                              em_tensor **h) {
  em_status st = emi_tensor_new(d->S, op, idx->sizes, idx->ndim, idx->dtype, EM_CPU, h);
  if (st) return st;
  if ((st = emk_cuda_backend.copy(d, *h, idx))) {
    em_tensor_release(*h);
    *h = NULL;
  }
  return st;
}

static int64_t hidx(const em_tensor *h, int64_t i) {
  const char *p = (const char *)em_tensor_data(h);
  return h->dtype == EM_INT64 ? ((const int64_t *)p)[i] : ((const int32_t *)p)[i];
}

/* The first index of h outside [base, base + size), or -1 when all are in range. */
static int64_t first_bad(const em_tensor *h, int64_t size, int base) {
  for (int64_t i = 0; i < h->numel; i++) {
    int64_t v = hidx(h, i) - base;
    if (v < 0 || v >= size) return i;
  }
  return -1;
}

static void init_args(ix_args *a, const em_tensor *idx, int index_base, em_dtype dt) {
  memset(a, 0, sizeof *a);
  a->idx = (const char *)em_tensor_data(idx);
  a->idt = idx->dtype;
  a->index_base = index_base;
  a->dt = dt;
  a->esize = (int)em_dtype_size(dt);
  a->istride = idx->ndim ? idx->strides[0] : 0;
}

em_status emk_index_select(emi_device *d, em_tensor *out, const em_tensor *a, int dim,
                           const em_tensor *idx, int index_base) {
  em_state *S = d->S;
  em_tensor *h = NULL;
  em_status st = EM_OK;
  if (idx->numel == 0) return EM_OK;
  if ((st = host_indices(d, "index_select", idx, &h))) return st;
  int64_t size = a->sizes[dim], bad = first_bad(h, size, index_base);
  if (bad >= 0) {
    st = emi_error(S, EM_ERR_INDEX, "index_select: index %lld is out of range for "
                   "dimension %lld of size %lld (indices count from %d)",
                   (long long)hidx(h, bad), emi_ix(S, dim), (long long)size, index_base);
    goto done;
  }
  if (out->numel == 0) goto done;
  ix_args x;
  init_args(&x, idx, index_base, a->dtype);
  x.out = (char *)em_tensor_data(out);
  x.a = (const char *)em_tensor_data(a);
  x.n = out->numel;
  x.ndim = a->ndim;
  x.dim = dim;
  for (int k = 0; k < a->ndim; k++) {
    x.sizes[k] = out->sizes[k];
    x.astrides[k] = a->strides[k];
  }
  st = launch(d, "index_select", &k_index_select, &x);
done:
  em_tensor_release(h);
  return st;
}

em_status emk_gather(emi_device *d, em_tensor *out, const em_tensor *a, int dim,
                     const em_tensor *idx, int index_base) {
  em_state *S = d->S;
  em_tensor *h = NULL;
  em_status st = EM_OK;
  if (out->numel == 0) return EM_OK;
  if ((st = host_indices(d, "gather", idx, &h))) return st;
  int64_t size = a->sizes[dim], bad = first_bad(h, size, index_base);
  if (bad >= 0) {
    st = emi_error(S, EM_ERR_INDEX, "gather: index %lld is out of range for dimension %lld "
                   "of size %lld (indices count from %d)", (long long)hidx(h, bad),
                   emi_ix(S, dim), (long long)size, index_base);
    goto done;
  }
  ix_args x;
  init_args(&x, idx, index_base, a->dtype);
  x.out = (char *)em_tensor_data(out);
  x.a = (const char *)em_tensor_data(a);
  x.n = out->numel;
  x.ndim = idx->ndim;
  x.dim = dim;
  for (int k = 0; k < idx->ndim; k++) {
    x.sizes[k] = idx->sizes[k];
    x.astrides[k] = a->strides[k];
    x.istrides[k] = idx->strides[k];
  }
  st = launch(d, "gather", &k_gather, &x);
done:
  em_tensor_release(h);
  return st;
}

em_status emk_index_add(emi_device *d, em_tensor *out, int dim, const em_tensor *idx,
                        const em_tensor *src, int index_base) {
  em_state *S = d->S;
  em_tensor *h = NULL;
  em_status st = EM_OK;
  int64_t n = idx->numel;
  if (n == 0) return EM_OK;
  int nd = out->ndim ? out->ndim : 1;     /* 0-d tensors act as [1] */
  int64_t osize = out->ndim ? out->sizes[dim] : 1;
  if ((st = host_indices(d, "index_add_", idx, &h))) return st;
  int64_t bad = first_bad(h, osize, index_base);
  if (bad >= 0) {
    st = emi_error(S, EM_ERR_INDEX, "index_add_: index %lld is out of range for "
                   "dim %lld of size %lld (index_base %d)", (long long)hidx(h, bad),
                   emi_ix(S, dim), (long long)osize, index_base);
    goto done;
  }
  if (src->numel == 0) goto done;
  ix_args x;
  init_args(&x, idx, index_base, out->dtype);
  x.out = (char *)em_tensor_data(out);
  x.a = (const char *)em_tensor_data(src);
  x.ndim = nd;
  x.dim = dim;
  x.nidx = n;
  x.n = 1;
  for (int k = 0; k < nd; k++) {
    x.sizes[k] = k == dim ? 1 : (src->ndim ? src->sizes[k] : 1);
    x.astrides[k] = src->ndim ? src->strides[k] : 0;
    x.ostrides[k] = out->ndim ? out->strides[k] : 0;
    x.n *= x.sizes[k];
  }
  st = launch(d, "index_add_", &k_index_add, &x);
done:
  em_tensor_release(h);
  return st;
}

em_status emk_scatter_add(emi_device *d, em_tensor *out, int dim, const em_tensor *idx,
                          const em_tensor *src, int index_base) {
  em_state *S = d->S;
  em_tensor *h = NULL;
  em_status st = EM_OK;
  int nd = out->ndim ? out->ndim : 1;     /* a 0-d out acts as [1] */
  if (idx->numel == 0) return EM_OK;
  if ((st = host_indices(d, "scatter_add_", idx, &h))) return st;
  if (out->ndim == 0) {
    int64_t v = hidx(h, 0) - index_base;
    if (v != 0) {
      st = emi_error(S, EM_ERR_INDEX, "scatter_add_: index %lld is out of range for a 0-d "
                     "self", (long long)(v + index_base));
      goto done;
    }
  } else {
    int64_t bad = first_bad(h, out->sizes[dim], index_base);
    if (bad >= 0) {
      st = emi_error(S, EM_ERR_INDEX, "scatter_add_: index %lld is out of range for "
                     "dim %lld of size %lld (index_base %d)", (long long)hidx(h, bad),
                     emi_ix(S, dim), (long long)out->sizes[dim], index_base);
      goto done;
    }
  }
  ix_args x;
  init_args(&x, idx, index_base, out->dtype);
  x.out = (char *)em_tensor_data(out);
  x.a = (const char *)em_tensor_data(src);
  x.ndim = nd;
  x.dim = out->ndim ? dim : 0;
  x.n = 1;
  for (int k = 0; k < nd; k++) {
    int64_t isz = idx->ndim ? idx->sizes[k] : 1;
    x.sizes[k] = k == x.dim ? 1 : isz;
    if (k == x.dim) x.nidx = isz;
    x.astrides[k] = src->ndim ? src->strides[k] : 0;
    x.ostrides[k] = out->ndim ? out->strides[k] : 0;
    x.istrides[k] = idx->ndim ? idx->strides[k] : 0;
    x.n *= x.sizes[k];
  }
  st = launch(d, "scatter_add_", &k_scatter_add, &x);
done:
  em_tensor_release(h);
  return st;
}

/*
** k_index.c -- the launchers of index_select, gather, index_add and scatter_add
** (k_index.cu): each entry copies the indices back (a sync) and checks them in
** the CPU backend's order before it queues anything, then describes the walk
** and launches the kernel on the compute stream.
*/
#include "cuda.h"
#include "k_index.h"
#include "k_index_args.h"

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

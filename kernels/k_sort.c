/*
** k_sort.c -- the launchers of the sort and scan kernels (k_sort.cu): each
** describes a's lines along dim and launches on the compute stream.
**
** The sort kernel's work grows with the square of a line's length, so lines
** longer than SORT_RANK_MAX sort on the host instead: a copy of a to the CPU (a
** sync), the CPU backend's sort (the same stable order), the indices copied back.
** That is n log n plus two copies, and what a long line wants until the device
** has a merge sort of its own.
*/
#include "cuda.h"
#include "k_sort.h"
#include "k_sort_args.h"

static em_status launch(emi_device *d, const char *op, const emk_kernel *k, sort_args *a) {
  emk_cuda_device *cd = emk_dev(d);
  emk_runtime *rt = cd->cuda->rt;
  int64_t blocks = (a->n + SORT_THREADS - 1) / SORT_THREADS;
  if (blocks > SORT_MAX_BLOCKS) blocks = SORT_MAX_BLOCKS;
  if (blocks < 1) blocks = 1;
  emk_dim3 grid = {(unsigned)blocks, 1, 1}, block = {SORT_THREADS, 1, 1};
  em_status st = rt->ops->launch(rt, k, grid, block, 0, cd->compute, a, sizeof *a);
  return st ? emk_error(d, op, st) : EM_OK;
}

static void describe(sort_args *x, char *out, const em_tensor *a, int dim) {
  memset(x, 0, sizeof *x);
  x->out = out;
  x->a = (const char *)em_tensor_data(a);
  x->ndim = a->ndim;
  x->dim = dim;
  x->dt = a->dtype;
  x->esize = (int)em_dtype_size(a->dtype);
  x->len = a->sizes[dim];
  x->inner = 1;
  for (int k = 0; k < a->ndim; k++) {
    x->sizes[k] = a->sizes[k];
    x->astrides[k] = a->strides[k];
    if (k > dim) x->inner *= a->sizes[k];
  }
}

enum { SORT_RANK_MAX = 4096 };

static em_status sort_on_host(emi_device *d, em_tensor *indices, const em_tensor *a, int dim,
                              int descending, int index_base, int64_t k) {
  em_state *S = d->S;
  emi_device *cpu = emi_cpu_device(S);
  em_tensor *ha = NULL, *hi = NULL;
  em_status st = emi_tensor_new(S, "sort", a->sizes, a->ndim, a->dtype, EM_CPU, &ha);
  if (!st) st = emi_tensor_new(S, "sort", indices->sizes, indices->ndim, EM_INT64, EM_CPU, &hi);
  if (!st) st = emk_cuda_backend.copy(d, ha, a);
  if (!st) st = cpu->backend->sort(cpu, hi, ha, dim, descending, index_base, k);
  if (!st) st = emk_cuda_backend.copy(d, indices, hi);
  em_tensor_release(ha);
  em_tensor_release(hi);
  return st;
}

em_status emk_sort(emi_device *d, em_tensor *indices, const em_tensor *a, int dim,
                   int descending, int index_base, int64_t k) {
  if (a->numel == 0 || k == 0) return EM_OK;
  if (a->sizes[dim] > SORT_RANK_MAX)
    return sort_on_host(d, indices, a, dim, descending, index_base, k);
  sort_args x;
  describe(&x, (char *)em_tensor_data(indices), a, dim);
  x.n = a->numel;
  x.k = k;
  x.descending = descending;
  x.index_base = index_base;
  return launch(d, "sort", &k_sort_rank, &x);
}

em_status emk_scan(emi_device *d, int op, em_tensor *out, const em_tensor *a, int dim) {
  if (a->numel == 0) return EM_OK;
  sort_args x;
  describe(&x, (char *)em_tensor_data(out), a, dim);
  x.n = a->numel / x.len;
  x.op = op;
  return launch(d, op == EMI_SCAN_SUM ? "cumsum" : "cumprod", &k_scan, &x);
}

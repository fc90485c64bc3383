/*
** k_copy.c -- the launchers of fill and the same-dtype strided copy
** (k_copy.cu): the geometry of the output's walk and, for a fill, the value's
** bit pattern, converted on the host.
*/
#include "cuda.h"
#include "k_copy_args.h"

static em_status launch_strided(emi_device *d, const char *op, strided_args *a) {
  emk_cuda_device *cd = emk_dev(d);
  emk_runtime *rt = cd->cuda->rt;
  int64_t blocks = (a->n + THREADS - 1) / THREADS;
  if (blocks > MAX_BLOCKS) blocks = MAX_BLOCKS;
  emk_dim3 grid = {(unsigned)blocks, 1, 1}, block = {THREADS, 1, 1};
  em_status st = rt->ops->launch(rt, &k_strided, grid, block, 0, cd->compute, a, sizeof *a);
  return st ? emk_error(d, op, st) : EM_OK;
}

static void geometry(strided_args *a, const em_tensor *out) {
  a->n = out->numel;
  a->ndim = out->ndim;
  a->esize = (int)em_dtype_size(out->dtype);
  for (int k = 0; k < out->ndim; k++) {
    a->sizes[k] = out->sizes[k];
    a->ostrides[k] = out->strides[k];
  }
  a->out = (char *)em_tensor_data(out);
}

em_status emk_fill(emi_device *d, em_tensor *out, double value) {
  if (out->numel == 0) return EM_OK;
  strided_args a;
  memset(&a, 0, sizeof a);
  geometry(&a, out);
  unsigned char bits[8] = {0};
  emi_store_f64(bits, out->dtype, value);
  memcpy(&a.pattern, bits, sizeof bits);
  return launch_strided(d, "fill", &a);
}

em_status emk_copy_same_dtype(emi_device *d, em_tensor *out, const em_tensor *src) {
  if (out->numel == 0) return EM_OK;
  strided_args a;
  memset(&a, 0, sizeof a);
  geometry(&a, out);
  a.src = (const char *)em_tensor_data(src);
  for (int k = 0; k < src->ndim; k++) a.sstrides[k] = src->strides[k];
  return launch_strided(d, "copy", &a);
}

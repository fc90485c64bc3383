/*
** k_copy.c -- the CUDA backend's fill and same-dtype strided copy kernels, and
** their launches. One source for nvcc and the grid emulator (device.h).
**
** Both walk the output's elements in flat (row-major) order with a grid-stride
** loop, unravel the flat index into the tensor's dims and move whole elements as
** 1-, 2-, 4- or 8-byte words: a copy within one dtype never needs to know the
** dtype, and a fill writes the value's bit pattern, converted on the host.
*/
#include "cuda.h"
#include "device.h"

enum { THREADS = 256, MAX_BLOCKS = 4096 };

typedef struct strided_args {
  char *out;
  const char *src;                /* NULL for a fill */
  int64_t n;
  int ndim, esize;
  int64_t sizes[EM_MAX_DIMS];
  int64_t ostrides[EM_MAX_DIMS];  /* in elements */
  int64_t sstrides[EM_MAX_DIMS];
  uint64_t pattern;               /* fill: the value's bits */
} strided_args;

EMK_DEVICE void move_word(char *dst, const char *src, uint64_t pattern, int esize) {
  switch (esize) {
  case 1: *(uint8_t *)dst = src ? *(const uint8_t *)src : (uint8_t)pattern; break;
  case 2: *(uint16_t *)dst = src ? *(const uint16_t *)src : (uint16_t)pattern; break;
  case 4: *(uint32_t *)dst = src ? *(const uint32_t *)src : (uint32_t)pattern; break;
  default: *(uint64_t *)dst = src ? *(const uint64_t *)src : pattern; break;
  }
}

/* grid-stride over the flat index; offsets unravelled from the last dim */
EMK_KERNEL(k_strided, strided_args) {
  int64_t step = (int64_t)gridDim.x * blockDim.x;
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < a.n; i += step) {
    int64_t rest = i, oo = 0, so = 0;
    for (int d = a.ndim - 1; d >= 0; d--) {
      int64_t k = rest % a.sizes[d];
      rest /= a.sizes[d];
      oo += k * a.ostrides[d];
      so += k * a.sstrides[d];
    }
    move_word(a.out + oo * a.esize, a.src ? a.src + so * a.esize : NULL, a.pattern,
              a.esize);
  }
}

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

/*
** k_index.cu -- the CUDA backend's index_select, gather, index_add and scatter_add.
** The device code, one source for nvcc and the grid emulator (device.h); the
** launchers are k_index.c.
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
#include "k_index_args.h"
#include "device.h"
#include "dtype_dev.h"

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

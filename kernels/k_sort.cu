/*
** k_sort.cu -- the CUDA backend's stable sort along one dim and its inclusive
** scans (cumsum, cumprod). The device code, one source for nvcc and the grid
** emulator (device.h); the launchers are k_sort.c.
**
** The sort gives each element its own thread, which counts the elements of its
** line that sort before it (smaller, or equal and earlier: the stable order) and
** writes its position at that rank (topk: if the rank is below k). Quadratic in the line's length but without
** scratch memory or synchronisation, and exactly the CPU's order, ties
** included; it serves lines of up to a few thousand elements, and k_sort.c
** sorts longer ones on the host. The scan gives each line one thread,
** accumulating in double (int64: wrapping) in the CPU's order.
*/
#include "k_sort_args.h"
#include "device.h"
#include "dtype_dev.h"

/* a's offset (elements) of line k. */
EMK_DEVICE int64_t sort_line_offset(const sort_args &a, int64_t k) {
  int64_t off = 0;
  for (int d = a.ndim - 1; d >= 0; d--) {
    if (d == a.dim) continue;
    off += (k % a.sizes[d]) * a.astrides[d];
    k /= a.sizes[d];
  }
  return off;
}

/* -1, 0, 1 for x < y, x == y, x > y; NaN above everything, NaNs equal. */
EMK_DEVICE int sort_cmp_f(double x, double y) {
  int nx = x != x, ny = y != y;
  if (nx || ny) return nx - ny;
  return (x > y) - (x < y);
}

EMK_KERNEL(k_sort_rank, sort_args) {
  int64_t step = (int64_t)gridDim.x * blockDim.x;
  int64_t st = a.astrides[a.dim] * a.esize;
  for (int64_t t = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; t < a.n; t += step) {
    int64_t k = t / a.len, i = t % a.len;
    const char *line = a.a + sort_line_offset(a, k) * a.esize;
    int64_t rank = 0;
    if (a.dt == EM_INT64) {
      int64_t x = *(const int64_t *)(line + i * st);
      for (int64_t j = 0; j < a.len; j++) {
        int64_t y = *(const int64_t *)(line + j * st);
        int c = (y > x) - (y < x);
        if (a.descending) c = -c;
        rank += c < 0 || (c == 0 && j < i);
      }
    } else {
      double x = emk_load_f64(line + i * st, a.dt);
      for (int64_t j = 0; j < a.len; j++) {
        int c = sort_cmp_f(emk_load_f64(line + j * st, a.dt), x);
        if (a.descending) c = -c;
        rank += c < 0 || (c == 0 && j < i);
      }
    }
    if (rank >= a.k) continue;
    int64_t o = (k / a.inner) * a.k * a.inner + k % a.inner + rank * a.inner;
    ((int64_t *)a.out)[o] = i + a.index_base;
  }
}

EMK_KERNEL(k_scan, sort_args) {
  int64_t step = (int64_t)gridDim.x * blockDim.x;
  int64_t st = a.astrides[a.dim];
  for (int64_t k = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; k < a.n; k += step) {
    int64_t ao = sort_line_offset(a, k);
    int64_t oo = (k / a.inner) * a.len * a.inner + k % a.inner;
    if (a.dt == EM_INT64) {
      const int64_t *p = (const int64_t *)a.a + ao;
      int64_t *o = (int64_t *)a.out + oo;
      uint64_t acc = a.op == 0 ? 0 : 1;
      for (int64_t i = 0; i < a.len; i++) {
        uint64_t v = (uint64_t)p[i * st];
        acc = a.op == 0 ? acc + v : acc * v;
        o[i * a.inner] = (int64_t)acc;
      }
    } else {
      double acc = a.op == 0 ? 0 : 1;
      for (int64_t i = 0; i < a.len; i++) {
        double v = emk_load_f64(a.a + (ao + i * st) * a.esize, a.dt);
        acc = a.op == 0 ? acc + v : acc * v;
        emk_store_f64(a.out + (oo + i * a.inner) * a.esize, a.dt, acc);
      }
    }
  }
}

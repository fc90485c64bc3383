/*
** k_copy.cu -- the CUDA backend's fill and same-dtype strided copy kernels. The
** device code, one source for nvcc and the grid emulator (device.h); the
** launchers are k_copy.c.
**
** Both walk the output's elements in flat (row-major) order with a grid-stride
** loop, unravel the flat index into the tensor's dims and move whole elements as
** 1-, 2-, 4- or 8-byte words: a copy within one dtype never needs to know the
** dtype, and a fill writes the value's bit pattern, converted on the host.
*/
#include "k_copy_args.h"
#include "device.h"

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

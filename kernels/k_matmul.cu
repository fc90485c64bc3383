/*
** k_matmul.cu -- the CUDA backend's integer and bool matmul kernel: one thread
** per output element, accumulating in 64-bit integers that wrap like the CPU's
** (core/cpu/matmul.c); bool is "any product non-zero". The device code, one
** source for nvcc and the grid emulator (device.h); the entry, which sends float
** results to the runtime's gemm, is k_matmul.c.
*/
#include "k_matmul_args.h"
#include "device.h"

EMK_DEVICE uint64_t imm_load(const char *p, int64_t i, int dt) {
  switch (dt) {
  case EM_INT64: return (uint64_t)((const int64_t *)p)[i];
  case EM_INT32: return (uint64_t)(int64_t)((const int32_t *)p)[i];
  case EM_UINT8: return ((const uint8_t *)p)[i];
  default: return ((const uint8_t *)p)[i] != 0;     /* bool */
  }
}

EMK_DEVICE void imm_store(char *p, int64_t i, int dt, uint64_t v) {
  switch (dt) {
  case EM_INT64: ((int64_t *)p)[i] = (int64_t)v; break;
  case EM_INT32: ((int32_t *)p)[i] = (int32_t)(uint32_t)v; break;
  case EM_UINT8: ((uint8_t *)p)[i] = (uint8_t)v; break;
  default: ((uint8_t *)p)[i] = v != 0; break;
  }
}

/* grid-stride over out's elements */
EMK_KERNEL(k_matmul_int, imm_args) {
  int64_t step = (int64_t)gridDim.x * blockDim.x;
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < a.total; i += step) {
    int64_t col = i % a.N, row = (i / a.N) % a.M, rest = i / a.N / a.M, ao = 0, bo = 0;
    for (int d = a.nb - 1; d >= 0; d--) {
      int64_t q = rest % a.bsizes[d];
      rest /= a.bsizes[d];
      ao += q * a.abs_[d];
      bo += q * a.bbs[d];
    }
    ao += row * a.ars;
    bo += col * a.bcs;
    uint64_t s = 0;
    for (int64_t q = 0; q < a.K; q++)
      s += imm_load(a.a, ao + q * a.acs, a.dtype) * imm_load(a.b, bo + q * a.brs, a.dtype);
    imm_store(a.out, i, a.dtype, s);
  }
}

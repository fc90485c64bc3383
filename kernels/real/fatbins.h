/*
** fatbins.h -- the device code of the CUDA backend, embedded in libember_cuda.
**
** nvcc compiles every kernels/k_*.cu into $(BUILD)/kernels/k_*.fatbin (SASS for
** sm_80 and sm_90, PTX for newer GPUs); the Makefile then generates
** $(BUILD)/kernels/fatbins.S, which pulls each file in with the assembler's
** .incbin and lists them in the table below, and links it into libember_cuda. So the
** real runtime (runtime_real.c) finds its kernels in its own image -- no file
** path at run time, no fatbin out of step with the library. In a build without
** nvcc the generated table is empty, and a launch says so.
*/
#ifndef EMBER_KERNELS_REAL_FATBINS_H
#define EMBER_KERNELS_REAL_FATBINS_H
#include <stdint.h>

/* One module: its name (the source's: "k_copy"), its bytes and their number.
** The table ends with a NULL name; emk_fatbin_count entries come before it. */
typedef struct emk_fatbin {
  const char *name;
  const unsigned char *data;
  uint64_t size;
} emk_fatbin;
extern const emk_fatbin emk_fatbins[];
extern const uint64_t emk_fatbin_count;

#endif

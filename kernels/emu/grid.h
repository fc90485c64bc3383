/*
** grid.h -- the grid emulator's entry (kernels/emu/grid.c): runs one kernel
** launch on the calling thread (the emulated stream's worker). Replaced by the
** full emulator; the launch macro and intrinsics live in kernels/device.h.
*/
#ifndef EMBER_KERNELS_GRID_H
#define EMBER_KERNELS_GRID_H
#include "../runtime.h"

/* Runs k over grid x block threads: EM_OK, or an error with a message in err
** (a barrier only some threads reached, a block too large, out of memory). */
em_status emk_grid_run(const emk_kernel *k, emk_dim3 grid, emk_dim3 block,
                       size_t dyn_shared, const void *args, char *err, size_t errlen);

#endif

/*
** grid.h -- the grid emulator's entry (kernels/emu/grid.c): runs one kernel
** launch on the calling thread (the emulated stream's worker). Kernels are
** written with kernels/device.h, which also holds the limits the emulated
** runtime reports as device properties (EMK_MAX_BLOCK_THREADS, EMK_SHARED_MAX,
** EMK_WARP_SIZE).
**
** Thread safety: launches on different OS threads run independently (all state
** is per launch, the current thread's pointers are __thread variables). One
** launch runs entirely on the thread that called emk_grid_run.
*/
#ifndef EMBER_KERNELS_GRID_H
#define EMBER_KERNELS_GRID_H
#include "../runtime.h"
#define EMK_DEVICE_LIMITS_ONLY
#include "../device.h"
#undef EMK_DEVICE_LIMITS_ONLY

/* Runs k over grid x block threads, blocks in order (x fastest, then y, z):
**   EM_OK;
**   EM_ERR_ARG for a launch CUDA would refuse: a zero dimension, more than 1024
**     threads (or block.z > 64, grid.y/z > 65535), dynamic shared memory over
**     EMK_SHARED_MAX, a kernel without a host body;
**   EM_ERR_INTERNAL for a kernel that misbehaves: a barrier only some threads
**     reached, warp operations with mismatched masks or lanes, __syncthreads or
**     a shuffle in a kernel not declared EMK_KERNEL_SYNC, static + dynamic shared
**     memory over EMK_SHARED_MAX;
**   EM_ERR_NOMEM when the fibers' stacks or the shared memory can't be had.
** The message (in err, errlen bytes) names the kernel and, for a kernel's fault,
** the block. A failed launch stops at the failing block; what earlier blocks
** wrote stays written.
**
** EMBER_EMU_SCHEDULE=reverse runs the threads of an EMK_KERNEL_SYNC kernel's
** blocks in reverse order between rendezvous points (the default is thread
** order): a kernel whose result is the same both ways has no missing barrier
** in either direction.
**
** Costs (measured by tests/c/test_grid_emu.c): plain kernels run about 10^8
** threads a second; EMK_KERNEL_SYNC kernels 10-15 ns per thread and
** rendezvous. Each OS thread that ran a sync kernel keeps its fibers (64 KiB of
** stack each, 256 KiB under sanitizers, mostly untouched) until it exits. */
em_status emk_grid_run(const emk_kernel *k, emk_dim3 grid, emk_dim3 block,
                       size_t dyn_shared, const void *args, char *err, size_t errlen);

#endif

/* grid.c -- placeholder until the grid emulator lands: refuses every launch. */
#include "grid.h"
#include <stdio.h>

em_status emk_grid_run(const emk_kernel *k, emk_dim3 grid, emk_dim3 block,
                       size_t dyn_shared, const void *args, char *err, size_t errlen) {
  (void)grid; (void)block; (void)dyn_shared; (void)args;
  snprintf(err, errlen, "%s: the grid emulator is not built yet", k ? k->name : "?");
  return EM_ERR_INTERNAL;
}

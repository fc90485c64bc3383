/*
** ffi_exports.h -- the functions of lua/host that the Lua layer calls through
** the FFI: the ember command exports them, and libember_lua.so carries those of
** luamap.c for a plain `luajit` host (lua/ember/data/luamap.lua finds them).
**
** The build turns this file into ffi.cdef declarations (build/lua/ember/
** hostdefs.lua, by tools/gen_cdefs.sh, as it does ember.h), so it stays as
** plain as ember.h: nothing but declarations outside the preprocessor lines.
*/
#ifndef EMBER_FFI_EXPORTS_H
#define EMBER_FFI_EXPORTS_H
#include <stddef.h>
#include <stdint.h>

#include "ember.h"

/* alloc.c: em_config.alloc for the host (per-thread caches of small blocks). */
void *ember_host_alloc(void *ud, void *ptr, size_t osize, size_t nsize);

/* luamap.c: worker Lua states for ds:map(fn). ember_luamap_new makes the
** em_sample_fn's ud from fn's serialized blob and the main state's package
** paths; ember_luamap_call is that em_sample_fn; ember_luamap_release its
** release; ember_luamap_live counts the worker states open in the process. */
void *ember_luamap_new(const char *blob, size_t len, const char *path, const char *cpath);
int ember_luamap_call(void *ud, int worker, uint64_t seed, em_tensor **fields, int nfields,
                      char *err, size_t errlen);
void ember_luamap_release(void *ud);
int ember_luamap_live(void);

#endif

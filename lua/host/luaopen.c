/*
** luaopen.c -- luaopen_ember: loads ember's Lua layer into a LuaJIT state, for
** the ember command and for any C host that embeds ember in its own state:
**
**     luaL_openlibs(L);
**     luaopen_ember(L);             pushes the em table (also package.loaded.ember)
**     lua_setglobal(L, "em");
**
** The Lua files are looked up beside the executable (<exe dir>/lua/, where the
** build puts them; <exe dir>/../share/lua/5.1/, an install moved elsewhere),
** then beside the library this file is in (<lib dir>/lua/, the build tree;
** <lib dir>/../share/lua/5.1/: a C host linking an installed libember_lua.so,
** whatever PREFIX the objects were compiled with), then under the install
** prefix (<prefix>/share/lua/5.1/), then wherever
** package.path (LUA_PATH) already points. The C functions are
** found through ffi.C when the host exports the core's symbols (-rdynamic, or
** libember.so linked), else the Lua layer loads libember.so itself.
**
** A host that wants its own em_config for the state the Lua layer opens (an
** allocator with a memory cap, one thread, a seed) sets the global EMBER_CONFIG
** to a light userdata pointing to it before the Lua layer opens its state, at
** the first field read of em (ember loads lazily): em_open copies it; the
** allocator's ud must live as long as the Lua state. A C host
** links this file from libember_lua.so (examples/embed/ shows the whole set-up).
*/
#define _GNU_SOURCE        /* dladdr */
#include "host.h"
#include <dlfcn.h>
#include <lauxlib.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#ifndef EMBER_PREFIX
#define EMBER_PREFIX "/usr/local"
#endif

/* Once per process: replicas (threads) all ask at start-up. */
static char exe_dir[PATH_MAX];
static void find_exe_dir(void) {
  ssize_t n = readlink("/proc/self/exe", exe_dir, sizeof exe_dir - 1);
  exe_dir[n > 0 ? n : 0] = 0;
  char *slash = strrchr(exe_dir, '/');
  if (slash) *slash = 0;
  else exe_dir[0] = 0;
}

const char *ember_host_exe_dir(void) {
  static pthread_once_t once = PTHREAD_ONCE_INIT;
  pthread_once(&once, find_exe_dir);
  return exe_dir;
}

/* The directory of the file holding this code: the executable (the ember
** command) or libember_lua.so (a C host). Once per process, as above. */
static char lib_dir[PATH_MAX];
static void find_lib_dir(void) {
  Dl_info info;
  if (dladdr((void *)luaopen_ember, &info) && info.dli_fname &&
      strchr(info.dli_fname, '/'))
    snprintf(lib_dir, sizeof lib_dir, "%s", info.dli_fname);
  char *slash = strrchr(lib_dir, '/');
  if (slash) *slash = 0;
  else lib_dir[0] = 0;
}

void ember_host_paths(lua_State *L) {
  static pthread_once_t once = PTHREAD_ONCE_INIT;
  pthread_once(&once, find_lib_dir);
  char mine[8 * PATH_MAX + 256];
  const char *dirs[2] = {ember_host_exe_dir(), lib_dir};
  int n = 0;
  for (int i = 0; i < 2; i++) {
    const char *d = dirs[i];
    if (!*d || (i == 1 && !strcmp(d, dirs[0]))) continue;
    /* the build tree, then a relocated install */
    n += snprintf(mine + n, sizeof mine - n, "%s/lua/?.lua;%s/lua/?/init.lua;"
                  "%s/../share/lua/5.1/?.lua;%s/../share/lua/5.1/?/init.lua;",
                  d, d, d, d);
  }
  snprintf(mine + n, sizeof mine - n, "%s", EMBER_PREFIX "/share/lua/5.1/?.lua;"
           EMBER_PREFIX "/share/lua/5.1/?/init.lua;");
  lua_getglobal(L, "package");
  if (!lua_istable(L, -1)) { lua_pop(L, 1); return; }
  lua_getfield(L, -1, "path");
  const char *old = lua_tostring(L, -1);
  if (old && strstr(old, mine)) { lua_pop(L, 2); return; }   /* done already */
  lua_pushfstring(L, "%s%s", mine, old ? old : "");
  lua_setfield(L, -3, "path");
  lua_pop(L, 2);
}

int luaopen_ember(lua_State *L) {
  ember_host_paths(L);
  lua_getglobal(L, "require");
  lua_pushliteral(L, "ember");
  lua_call(L, 1, 1);
  return 1;
}

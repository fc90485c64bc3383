/*
** host.h -- what the files of the ember command share: the Lua state set-up
** (paths, the em global), the caching allocator, protected calls with
** tracebacks, Ctrl-C handling and the REPL.
*/
#ifndef EMBER_HOST_H
#define EMBER_HOST_H
#include <lua.h>
#include <stddef.h>

#include "ffi_exports.h"   /* what the Lua layer calls here: alloc.c, luamap.c */

/* luaopen.c */
int luaopen_ember(lua_State *L);
/* Puts the ember Lua directories (beside the executable, then the install
** prefix) in front of package.path. Idempotent. */
void ember_host_paths(lua_State *L);
/* The directory of the running executable (static buffer; "" if unknown). */
const char *ember_host_exe_dir(void);

/* main.c: run the function below the nargs arguments on the stack in protected
** mode with a traceback handler and Ctrl-C armed; returns the lua_pcall status
** and leaves nresults (LUA_MULTRET allowed) or the message on the stack. */
int ember_host_docall(lua_State *L, int nargs, int nresults);
/* Prints the message on top of the stack (and pops it) to stderr; an os.exit
** unwinding is popped silently. */
void ember_host_report(lua_State *L, int status);
/* Whether the script of this thread's Lua state called os.exit, and its code. */
int ember_host_exit_requested(int *code);

/* main.c: the command line. */
typedef struct opts {
  int interactive, version, info, help;
  int script;        /* index of the script in argv, or 0 */
  int has_e;         /* any -e */
  int stdin_script;  /* '-' given */
  int replicas;      /* --replicas N, or 0 */
  int profile;       /* --profile */
  const char *doc;   /* --doc NAME, or NULL */
} opts;

/* Which replica a Lua state is: rank, world size, intra-op threads (0 = the
** default), and the local group joining replicas that are threads (NULL for an
** MPI process). */
typedef struct ember_replica {
  int rank, world_size, threads;
  struct em_local_group *group;
} ember_replica;

/* main.c: runs the command in a new Lua state (replica NULL: a plain process).
** Returns the exit status; a failure's message goes into failure. */
int ember_host_run(int argc, char **argv, opts *o, const ember_replica *replica,
                   char *failure, size_t failure_size);
/* replicas.c: `ember --replicas N`: N threads, each ember_host_run as one replica. */
int ember_replicas_main(int argc, char **argv, opts *o, const char *progname);

/* repl.c: the interactive loop; returns the exit status. */
int ember_repl(lua_State *L);
/* main.c: set to 1 while no Lua code runs (Ctrl-C then cancels the input line). */
extern volatile int ember_host_interrupted;

#endif

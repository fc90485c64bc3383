/*
** main.c -- the ember command: a LuaJIT interpreter with ember preloaded as the
** global `em`.
**
**   ember script.lua [args]   run a script (args in the global `arg`, arg[0] =
**                             the script, as lua does; also passed as ...)
**   ember -e 'code'           run a string (repeatable; then a script, if any)
**   ember -                   run stdin
**   ember                     the REPL when stdin is a terminal, else run stdin
**   ember -i ...              the REPL after the script / -e code
**   ember -l name             require(name) into the global `name` first
**   ember --memory-limit SIZE caps each replica's CPU tensor memory
**   ember --doc NAME          print the reference's entry for NAME (ember.doc)
**   ember --version | --info | --help
**
** The global `help` (help(em.sum), help('Conv2d'), help() for its usage) prints
** the reference's entries (lua/ember/doc.lua); it loads ember.doc at its first call.
**
** Errors print a traceback to stderr and exit with status 1. Ctrl-C while Lua
** code runs arms a count hook that raises "interrupted" at the next
** instruction the interpreter executes (LuaJIT's compiled traces do not check
** hooks, so a pure-Lua loop running as machine code may not stop: a second
** Ctrl-C then exits). The core's symbols are linked in and exported, so the
** Lua layer reaches them through ffi.C.
*/
#include "host.h"
#include "ember.h"
#include <lauxlib.h>
#include <lualib.h>
#include <luajit.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static const char *progname = "ember";
/* Per thread: replicas (lua/host/replicas.c) run one Lua state per thread, and
** each reports its errors as "[rank k] ember: ...". */
static __thread lua_State *globalL;
static __thread const char *report_prefix = "";
static __thread char last_error[1024];   /* the last message reported, for replicas */

/* -- Ctrl-C ------------------------------------------------------------------------
** running: Lua code is executing (arm the hook); otherwise the REPL is waiting
** for input and only records the interrupt, which cancels the line. */
volatile int ember_host_interrupted;
static __thread volatile sig_atomic_t running, hook_armed;

static void stop_hook(lua_State *L, lua_Debug *ar) {
  (void)ar;
  lua_sethook(L, NULL, 0, 0);
  hook_armed = 0;
  luaL_error(L, "interrupted");
}

static void on_sigint(int sig) {
  (void)sig;
  if (!running) { ember_host_interrupted = 1; return; }
  if (hook_armed) {    /* the first one did not get through: give up */
    static const char msg[] = "\nember: interrupted again, exiting\n";
    ssize_t r = write(2, msg, sizeof msg - 1);
    (void)r;
    _exit(130);
  }
  hook_armed = 1;
  lua_sethook(globalL, stop_hook, LUA_MASKCALL | LUA_MASKRET | LUA_MASKCOUNT, 1);
}

/* -- os.exit ----------------------------------------------------------------------
** os.exit ends the script of its own Lua state only: under `--replicas` the
** state is one replica among threads of one process, and under mpirun the
** process must still close its communicator (which finalizes MPI) after a zero
** exit. So os.exit(code) raises a sentinel error (the address of exit_token)
** that unwinds the script like any error, and the host sees it where it sees
** errors: it reports nothing, closes the state (files are flushed, the em_state
** and its communicator closed) and ends this replica with the code. pcall,
** xpcall and coroutine.resume pass the sentinel on, so a script's own error
** handling can't stop an exit. */
static const char exit_token = 0;
static __thread int exit_requested, exit_code;

static int is_exit(lua_State *L, int idx) {
  return lua_touserdata(L, idx) == (void *)&exit_token;
}

/* os.exit([code [, close]]): true or none is 0, false is 1, a number itself. */
static int host_exit(lua_State *L) {
  int code = 0;
  if (lua_isboolean(L, 1)) code = lua_toboolean(L, 1) ? 0 : 1;
  else if (!lua_isnoneornil(L, 1)) code = (int)luaL_checkinteger(L, 1);
  exit_requested = 1;
  exit_code = code;
  lua_pushlightuserdata(L, (void *)&exit_token);
  return lua_error(L);
}

static const char EXIT_LUA[] =
  "local token, exit = ...\n"
  "local error, pcall0, xpcall0, resume0 = error, pcall, xpcall, coroutine.resume\n"
  "local function pass(ok, ...)\n"
  "  if not ok and (...) == token then error(token) end\n"
  "  return ok, ...\n"
  "end\n"
  "os.exit = exit\n"
  "pcall = function(...) return pass(pcall0(...)) end\n"
  "xpcall = function(f, h, ...)\n"
  "  return pass(xpcall0(f, function(e) if e == token then return e end return h(e) end, ...))\n"
  "end\n"
  "coroutine.resume = function(...) return pass(resume0(...)) end\n";

static void install_exit(lua_State *L) {
  /* ember's messages and tracebacks skip this chunk's frames by its name
  ** (ember/ffi.lua's blame_level, trim_traceback below) */
  if (luaL_loadbuffer(L, EXIT_LUA, sizeof EXIT_LUA - 1, "=[ember host]") == 0) {
    lua_pushlightuserdata(L, (void *)&exit_token);
    lua_pushcfunction(L, host_exit);
    lua_call(L, 2, 0);
  } else {
    lua_pop(L, 1);
  }
}

int ember_host_exit_requested(int *code) {
  if (exit_requested && code) *code = exit_code;
  return exit_requested;
}

/* -- Protected calls -------------------------------------------------------------- */
/* The frames inside ember's own Lua files (and the error() call that raised
** from there) say nothing to a user whose error ember reported: drop them from
** the traceback on top of the stack. EMBER_TRACEBACK=full keeps everything. */
static void trim_traceback(lua_State *L) {
  const char *full = getenv("EMBER_TRACEBACK");
  if (full && strcmp(full, "full") == 0) return;
  lua_getglobal(L, "package");
  if (!lua_istable(L, -1)) { lua_pop(L, 1); return; }
  lua_getfield(L, -1, "loaded");
  lua_getfield(L, -1, "ember.ffi");
  if (!lua_istable(L, -1)) { lua_pop(L, 3); return; }
  lua_getfield(L, -1, "dir");
  const char *dir = lua_tostring(L, -1);
  const char *tb = lua_tostring(L, -5);
  if (!dir || !tb) { lua_pop(L, 4); return; }
  luaL_Buffer b;
  luaL_buffinit(L, &b);
  const char *p = tb;
  while (*p) {
    const char *nl = strchr(p, '\n');
    size_t len = nl ? (size_t)(nl - p + 1) : strlen(p);
    /* a frame line is "\t<where>: ..."; drop ember's and a [C] error() just above them */
    int drop = 0;
    if (p[0] == '\t') {
      if (strncmp(p + 1, dir, strlen(dir)) == 0 || strncmp(p + 1, "[ember host]:", 13) == 0)
        drop = 1;
      else if (strncmp(p + 1, "[C]: in function 'error'", 24) == 0 && nl &&
               strncmp(nl + 2, dir, strlen(dir)) == 0)
        drop = 1;
    }
    if (!drop) luaL_addlstring(&b, p, len);
    p += len;
  }
  luaL_pushresult(&b);
  lua_replace(L, -6);       /* the traceback */
  lua_pop(L, 4);
}

static int traceback(lua_State *L) {
  if (is_exit(L, 1)) return 1;          /* os.exit: no message, no traceback */
  if (!lua_isstring(L, 1)) {           /* an error object: try its __tostring */
    if (lua_isnoneornil(L, 1) || !luaL_callmeta(L, 1, "__tostring") || !lua_isstring(L, -1)) {
      lua_pushfstring(L, "(error object is a %s value)", luaL_typename(L, 1));
    }
    lua_replace(L, 1);
    lua_settop(L, 1);
  }
  lua_getglobal(L, "debug");
  if (lua_istable(L, -1)) {
    lua_getfield(L, -1, "traceback");
    if (lua_isfunction(L, -1)) {
      lua_pushvalue(L, 1);
      lua_pushinteger(L, 2);
      lua_call(L, 2, 1);
      trim_traceback(L);
      return 1;
    }
  }
  lua_settop(L, 1);
  return 1;
}

int ember_host_docall(lua_State *L, int nargs, int nresults) {
  int base = lua_gettop(L) - nargs;
  lua_pushcfunction(L, traceback);
  lua_insert(L, base);
  running = 1;
  int status = lua_pcall(L, nargs, nresults, base);
  running = 0;
  if (hook_armed) { lua_sethook(L, NULL, 0, 0); hook_armed = 0; }
  lua_remove(L, base);
  if (status != 0) lua_gc(L, LUA_GCCOLLECT, 0);
  return status;
}

/* A line left open on stdout -- the data loader's progress bar, drawn with '\r'
** and no newline, says so in ember.ffi's stdout_line_open -- is ended first, so
** that a message starts on a line of its own. The stack is left as it was. */
static void end_open_line(lua_State *L) {
  lua_getglobal(L, "package");
  if (lua_istable(L, -1)) {
    lua_getfield(L, -1, "loaded");
    if (lua_istable(L, -1)) {
      lua_getfield(L, -1, "ember.ffi");
      if (lua_istable(L, -1)) {
        lua_getfield(L, -1, "stdout_line_open");
        if (lua_toboolean(L, -1)) {
          fputs("\n", stdout);
          lua_pushboolean(L, 0);
          lua_setfield(L, -3, "stdout_line_open");
        }
        lua_pop(L, 1);
      }
      lua_pop(L, 1);
    }
    lua_pop(L, 1);
  }
  lua_pop(L, 1);
}

void ember_host_report(lua_State *L, int status) {
  if (status && is_exit(L, -1)) { lua_pop(L, 1); return; }   /* os.exit: nothing to say */
  if (status && !lua_isnil(L, -1)) {
    const char *msg = lua_tostring(L, -1);
    if (!msg) msg = "(error object is not a string)";
    end_open_line(L);
    fflush(stdout);
    fprintf(stderr, "%s%s: %s\n", report_prefix, progname, msg);
    fflush(stderr);
    /* the message without its traceback: what other replicas are told */
    const char *tb = strstr(msg, "\nstack traceback:");
    int len = tb ? (int)(tb - msg) : (int)strlen(msg);
    snprintf(last_error, sizeof last_error, "%.*s", len, msg);
    lua_pop(L, 1);
  }
}

static int dochunk(lua_State *L, int status) {
  if (status == 0) status = ember_host_docall(L, 0, 0);
  ember_host_report(L, status);
  return status;
}

/* The global help(x): ember.doc's help, required at the first call so that
** a script that never asks pays nothing. */
static const char HELP_LUA[] =
  "help = function(...) return require('ember.doc').help(...) end\n";

static void install_help(lua_State *L) {
  if (luaL_loadbuffer(L, HELP_LUA, sizeof HELP_LUA - 1, "=[ember host]") == 0) lua_call(L, 0, 0);
  else lua_pop(L, 1);
}

/* -- Options ------------------------------------------------------------------------ */
static void usage(FILE *f) {
  fprintf(f,
    "usage: %s [options] [script [args]]\n"
    "  -e code     run code (may be repeated)\n"
    "  -l name     require library 'name' into the global 'name'\n"
    "  -i          enter the REPL after running the script / code\n"
    "  -           run stdin\n"
    "  --          stop handling options\n"
    "  --replicas N  run the script as N replicas (threads) of em.distribute\n"
    "  --devices L   the replicas' devices, e.g. cuda:0,cuda:1 (replica k takes\n"
    "                entry k mod the count; also EMBER_DEVICES)\n"
    "  --memory-limit SIZE  cap each replica's CPU tensor memory: bytes, or a\n"
    "                whole number with K, M or G (powers of 1024), e.g. 256M\n"
    "                (also EMBER_MEMORY_LIMIT; em.set_memory_limit)\n"
    "  --profile     profile the whole script: print a report at exit and write\n"
    "                ember-trace.json and ember-profile.html (em.profile)\n"
    "  --doc NAME  print the reference's entry for NAME (em.sum, Tensor:matmul,\n"
    "              nn.Conv2d, Conv2d; a package or class lists what it holds);\n"
    "              exit status 1, with the close matches, when there is none.\n"
    "              In the REPL and in -e code: help(x)\n"
    "  --version   print the version\n"
    "  --info      print version, threads, backends and libraries\n"
    "  --help      print this help\n"
    "With no script and no -e, runs the REPL (stdin a terminal) or stdin.\n"
    "The global 'em' is ember (require 'ember').\n", progname);
}

static void print_version(void) {
  printf("ember %s (%s)\n", em_version(), LUAJIT_VERSION);
}

/* --info runs in Lua, after ember is loaded, so it can report what was loaded. */
static const char INFO_LUA[] =
  "local em, ffi = em, require 'ffi'\n"
  "local core = require 'ember.ffi'\n"
  "print('ember ' .. em.version)\n"
  "local jit = require 'jit'\n"
  "print(('%s (%s %s) JIT: %s %s'):format(jit.version, jit.os, jit.arch,\n"
  "  jit.status() and 'on' or 'off', table.concat({select(2, jit.status())}, ' ')))\n"
  "print('threads: ' .. em.get_num_threads())\n"
  "for line in em.build_info():gmatch('[^\\n]+') do print(line) end\n"
  /* The real CUDA libraries, loaded (dlopen) only to ask: versions and files, or
  ** where they were looked for. pcall: an older libember without this call
  ** leaves the section out. */
  "do local buf = ffi.new('char[4096]')\n"
  "  if pcall(function() return core.C.em_cuda_libs_info end)\n"
  "     and core.C.em_cuda_libs_info(buf, 4096) == 0 then\n"
  "    print('cuda libraries (loaded when used):')\n"
  "    for line in ffi.string(buf):gmatch('[^\\n]+') do print('  ' .. line) end\n"
  "  end\n"
  "end\n"
  /* which library serves which CPU op (oneDNN where it measured faster) */
  "if em.cpu_kernels_info then print('cpu kernels:')\n"
  "  for line in em.cpu_kernels_info():gmatch('[^\\n]+') do print('  ' .. line) end\n"
  "end\n"
  /* the devices this state can use: emulated, real, or why none */
  "do local n = em.cuda.device_count()\n"
  "  if n == 0 then print('cuda devices: none (' .. em.cuda.why_not() .. ')')\n"
  "  else print(('cuda devices: %d%s'):format(n, em.cuda.emulated() and ' emulated' or ''))\n"
  "    for i = 0, n - 1 do local p = em.cuda.get_device_properties(i)\n"
  "      print(('  cuda:%d  %s, %.0f MB, compute capability %d.%d, %d multiprocessors')\n"
  "        :format(i, p.name, p.total_memory / 2^20, p.major, p.minor,\n"
  "                p.multi_processor_count)) end end\n"
  "end\n"
  "print('lua files: ' .. core.dir)\n"
  "print('core library: ' .. (core.libpath == 'process' and 'linked into ' .. (arg and arg[-1] or 'ember') or core.libpath))\n";

/* arg table: arg[0] = script, arg[1..] its arguments, negative indices the
** interpreter and options before it (as lua). */
static void make_arg(lua_State *L, char **argv, int argc, int script) {
  lua_createtable(L, argc - script - 1 > 0 ? argc - script - 1 : 0, script + 1);
  for (int i = 0; i < argc; i++) {
    lua_pushstring(L, argv[i]);
    lua_rawseti(L, -2, i - script);
  }
  lua_setglobal(L, "arg");
}

/* A size for --memory-limit / EMBER_MEMORY_LIMIT: digits, then K, M or G (powers
** of 1024) or nothing (bytes). The Lua layer (ember/memlimit.lua) reads the same
** forms from the variable in each replica's state. */
static int size_ok(const char *v) {
  if (!v) return 0;
  while (*v == ' ') v++;
  const char *p = v;
  unsigned long long n = 0;
  while (*p >= '0' && *p <= '9') {
    if (n > (1ull << 62) / 10) return 0;
    n = n * 10 + (unsigned)(*p++ - '0');
  }
  if (p == v) return 0;
  int shift = 0;
  switch (*p) {
  case 'K': case 'k': shift = 10; p++; break;
  case 'M': case 'm': shift = 20; p++; break;
  case 'G': case 'g': shift = 30; p++; break;
  }
  while (*p == ' ') p++;
  return !*p && n < (1ull << (62 - shift));
}

static int parse(int argc, char **argv, opts *o) {
  memset(o, 0, sizeof *o);
  int i;
  for (i = 1; i < argc; i++) {
    const char *a = argv[i];
    if (a[0] != '-') break;
    if (strcmp(a, "-") == 0) { o->stdin_script = 1; o->script = i; return 0; }
    if (strcmp(a, "--") == 0) { i++; break; }
    if (strcmp(a, "-e") == 0 || strcmp(a, "-l") == 0) {
      if (++i >= argc) { fprintf(stderr, "%s: %s needs an argument\n", progname, a); return -1; }
      if (a[1] == 'e') o->has_e = 1;
    } else if (strncmp(a, "-e", 2) == 0 || strncmp(a, "-l", 2) == 0) {
      if (a[1] == 'e') o->has_e = 1;    /* -ecode, -lname */
    } else if (strcmp(a, "-i") == 0) o->interactive = 1;
    else if (strcmp(a, "-v") == 0 || strcmp(a, "--version") == 0) o->version = 1;
    else if (strcmp(a, "--info") == 0) o->info = 1;
    else if (strcmp(a, "--doc") == 0 || strncmp(a, "--doc=", 6) == 0) {
      const char *v = a[5] == '=' ? a + 6 : (++i < argc ? argv[i] : NULL);
      if (!v || !*v) {
        fprintf(stderr, "%s: --doc needs a name, e.g. --doc em.sum\n", progname);
        return -1;
      }
      o->doc = v;
    }
    else if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) o->help = 1;
    else if (strcmp(a, "--replicas") == 0 || strncmp(a, "--replicas=", 11) == 0) {
      const char *v = a[10] == '=' ? a + 11 : (++i < argc ? argv[i] : NULL);
      char *end = NULL;
      long n = v ? strtol(v, &end, 10) : 0;
      if (!v || *end || n < 1 || n > 1024) {
        fprintf(stderr, "%s: --replicas needs a number of replicas from 1 to 1024, got %s\n",
                progname, v ? v : "nothing");
        return -1;
      }
      o->replicas = (int)n;
    } else if (strcmp(a, "--profile") == 0) {
      o->profile = 1;
    } else if (strcmp(a, "--memory-limit") == 0 || strncmp(a, "--memory-limit=", 15) == 0) {
      /* each replica's state reads the variable when it opens (ember/memlimit.lua) */
      const char *v = a[14] == '=' ? a + 15 : (++i < argc ? argv[i] : NULL);
      if (!size_ok(v)) {
        fprintf(stderr, "%s: --memory-limit needs a size: bytes, or a whole number with K, M "
                "or G (powers of 1024), e.g. 256M; got '%s'\n", progname, v ? v : "nothing");
        return -1;
      }
      setenv("EMBER_MEMORY_LIMIT", v, 1);
    } else if (strcmp(a, "--devices") == 0 || strncmp(a, "--devices=", 10) == 0) {
      /* em.distribute reads the list from the environment (so that MPI processes
      ** given EMBER_DEVICES by their launcher behave the same): replica k takes
      ** entry k mod n (lua/ember/distribute.lua) */
      const char *v = a[9] == '=' ? a + 10 : (++i < argc ? argv[i] : NULL);
      if (!v || !*v) {
        fprintf(stderr, "%s: --devices needs a list of devices, e.g. cuda:0,cuda:1\n", progname);
        return -1;
      }
      setenv("EMBER_DEVICES", v, 1);
    } else {
      fprintf(stderr, "%s: unknown option '%s'\n", progname, a);
      usage(stderr);
      return -1;
    }
  }
  if (i < argc) o->script = i;
  const char *env = getenv("EMBER_MEMORY_LIMIT");
  if (env && *env && !size_ok(env)) {
    fprintf(stderr, "%s: EMBER_MEMORY_LIMIT needs a size: bytes, or a whole number with K, M "
            "or G (powers of 1024), e.g. 256M; got '%s'\n", progname, env);
    return -1;
  }
  return 0;
}

/* Runs -e and -l in order (options that take a value are skipped whole). */
static int run_options(lua_State *L, int argc, char **argv, int upto) {
  for (int i = 1; i < upto; i++) {
    const char *a = argv[i];
    if (strcmp(a, "--") == 0) break;
    if (strcmp(a, "--replicas") == 0 || strcmp(a, "--devices") == 0 ||
        strcmp(a, "--memory-limit") == 0 || strcmp(a, "--doc") == 0) { i++; continue; }
    if (a[0] != '-' || (a[1] != 'e' && a[1] != 'l')) continue;
    const char *val = a[2] ? a + 2 : argv[++i];
    int status;
    if (a[1] == 'e') {
      status = dochunk(L, luaL_loadbuffer(L, val, strlen(val), "=(command line)"));
    } else {
      lua_getglobal(L, "require");
      lua_pushstring(L, val);
      status = ember_host_docall(L, 1, 1);
      if (status == 0) lua_setglobal(L, val);
      else ember_host_report(L, status);
    }
    if (status) return status;
  }
  return 0;
}

static int run_script(lua_State *L, int argc, char **argv, int script, int from_stdin) {
  const char *fname = from_stdin ? NULL : argv[script];
  int status = luaL_loadfile(L, fname);
  if (status == 0) {
    int n = argc - script - 1;
    luaL_checkstack(L, n + 3, "too many arguments to script");
    for (int i = script + 1; i < argc; i++) lua_pushstring(L, argv[i]);
    status = ember_host_docall(L, n, 0);
  }
  ember_host_report(L, status);
  return status;
}

/* EMBER_REPLICA = {rank, world_size, group, threads} tells em.distribute which
** replica this Lua state is (lua/host/replicas.c); under an MPI launcher only the
** output prefix is set here, em.distribute finds the rest itself. */
static void set_replica(lua_State *L, const ember_replica *r) {
  if (!r) return;
  lua_createtable(L, 0, 4);
  lua_pushinteger(L, r->rank);
  lua_setfield(L, -2, "rank");
  lua_pushinteger(L, r->world_size);
  lua_setfield(L, -2, "world_size");
  lua_pushinteger(L, r->threads);
  lua_setfield(L, -2, "threads");
  if (r->group) {
    lua_pushlightuserdata(L, r->group);
    lua_setfield(L, -2, "group");
  }
  lua_setglobal(L, "EMBER_REPLICA");
}

/* Lines printed by replica k > 0 start with "[rank k] " (print and io.write), and
** every replica's print writes its whole line at once: Lua's own print writes
** each argument and the newline separately, and replicas that are threads share
** stdout, so their lines would interleave mid-line. */
static const char PREFIX_LUA[] =
  "local prefix = ...\n"
  "local write, at_start = io.write, true\n"
  "local function pre(s)\n"
  "  local out = (at_start and prefix or '') .. s:gsub('\\n(.)', '\\n' .. prefix .. '%1')\n"
  "  at_start = s:sub(-1) == '\\n'\n"
  "  return out\n"
  "end\n"
  "io.write = function(...)\n"
  "  local parts = {...}\n"
  "  for i = 1, select('#', ...) do parts[i] = tostring(parts[i]) end\n"
  "  return write(pre(table.concat(parts)))\n"
  "end\n"
  "print = function(...)\n"
  "  local parts = {...}\n"
  "  for i = 1, select('#', ...) do parts[i] = tostring(parts[i]) end\n"
  "  write(pre(table.concat(parts, '\\t') .. '\\n'))\n"
  "  io.stdout:flush()\n"
  "end\n";

static void prefix_output(lua_State *L, int rank) {
  char prefix[32] = "";
  if (rank > 0) snprintf(prefix, sizeof prefix, "[rank %d] ", rank);
  if (luaL_loadbuffer(L, PREFIX_LUA, sizeof PREFIX_LUA - 1, "=prefix") == 0) {
    lua_pushstring(L, prefix);
    lua_call(L, 1, 0);
  } else {
    lua_pop(L, 1);
  }
}

/* After a failed script: em.distribute tells the other replicas (MPI peers
** hear it through their communicator; a local group is also told by the host). */
static void tell_replicas(lua_State *L, const char *msg) {
  lua_getglobal(L, "package");
  if (!lua_istable(L, -1)) { lua_pop(L, 1); return; }
  lua_getfield(L, -1, "loaded");
  lua_getfield(L, -1, "ember.distribute");
  if (lua_istable(L, -1)) {
    lua_getfield(L, -1, "_abort");
    if (lua_isfunction(L, -1)) {
      lua_pushstring(L, msg);
      if (lua_pcall(L, 1, 0, 0)) lua_pop(L, 1);
    } else {
      lua_pop(L, 1);
    }
  }
  lua_pop(L, 3);
}

/* Everything that runs inside the Lua state, under lua_cpcall so that an
** out-of-memory error while setting up cannot escape. */
struct smain { int argc; char **argv; opts *o; int status; const ember_replica *replica;
               char *failure; size_t failure_size; };

/* Reports a failed chunk, keeps its message for the replicas' host, and tells
** the other replicas. */
static void record_failure(lua_State *L, struct smain *s, const char *msg) {
  if (s->failure && s->failure_size && !s->failure[0])
    snprintf(s->failure, s->failure_size, "%s", msg ? msg : "error");
  tell_replicas(L, msg ? msg : "error");
}

/* ember --profile: em.profile around the whole script (ember/profile.lua). */
static const char PROFILE_START_LUA[] = "require('ember.profile')._host_start()";
static const char PROFILE_STOP_LUA[] =
    "require('ember.profile')._host_stop(_EMBER_PROFILE_FAILED); _EMBER_PROFILE_FAILED = nil";

static int pmain(lua_State *L) {
  struct smain *s = lua_touserdata(L, 1);
  int argc = s->argc;
  char **argv = s->argv;
  opts *o = s->o;
  lua_gc(L, LUA_GCSTOP, 0);
  luaL_openlibs(L);
  lua_gc(L, LUA_GCRESTART, -1);
  install_exit(L);
  make_arg(L, argv, argc, o->script ? o->script : 0);
  set_replica(L, s->replica);
  if (s->replica && s->replica->world_size > 1) prefix_output(L, s->replica->rank);

  lua_pushcfunction(L, luaopen_ember);
  int status = ember_host_docall(L, 0, 1);
  if (status) { ember_host_report(L, status); s->status = 1; return 0; }
  lua_setglobal(L, "em");
  install_help(L);

  if (o->doc) {   /* ember --doc NAME: the entry, or the close matches and status 1 */
    lua_getglobal(L, "require");
    lua_pushliteral(L, "ember.doc");
    status = ember_host_docall(L, 1, 1);
    if (status == 0) {
      lua_getfield(L, -1, "cli");
      lua_pushstring(L, o->doc);
      status = ember_host_docall(L, 1, 1);
      if (status == 0) {
        s->status = (int)lua_tointeger(L, -1);
        return 0;
      }
    }
    ember_host_report(L, status);
    s->status = 1;
    return 0;
  }
  if (o->info) {
    status = dochunk(L, luaL_loadbuffer(L, INFO_LUA, sizeof INFO_LUA - 1, "=info"));
    s->status = status ? 1 : 0;
    return 0;
  }
  if (o->profile && (status = dochunk(L, luaL_loadstring(L, PROFILE_START_LUA)))) {
    s->status = 1;
    return 0;
  }
  status = run_options(L, argc, argv, o->script ? o->script : argc);
  if (!status && o->script) status = run_script(L, argc, argv, o->script, o->stdin_script);
  if (o->profile) {          /* the report, also for a failed script (its replicas
                                may be gone: then this replica's view alone) */
    /* os.exit(0) is no failure */
    lua_pushboolean(L, status != 0 && !(exit_requested && exit_code == 0));
    lua_setglobal(L, "_EMBER_PROFILE_FAILED");
    if (dochunk(L, luaL_loadstring(L, PROFILE_STOP_LUA)) && !status) status = 1;
  }
  int code;
  if (ember_host_exit_requested(&code)) {
    /* os.exit: a zero exit is a clean end; another code fails this replica, and
    ** the others are told (under mpirun the job ends, naming it) */
    s->status = code;
    if (code) {
      char msg[64];
      snprintf(msg, sizeof msg, "os.exit(%d)", code);
      record_failure(L, s, msg);
    }
    return 0;
  }
  if (status) {
    record_failure(L, s, last_error);
    s->status = 1;
    return 0;
  }
  if (o->interactive) {
    s->status = ember_repl(L);
  } else if (!o->script && !o->has_e) {
    if (isatty(0)) {
      print_version();
      s->status = ember_repl(L);
    } else {
      s->status = run_script(L, argc, argv, 0, 1) ? 1 : 0;
    }
  }
  if (ember_host_exit_requested(&code)) s->status = code;   /* os.exit in the REPL or stdin */
  return 0;
}

/* One Lua state runs the command: the whole process, or one replica's thread. */
int ember_host_run(int argc, char **argv, opts *o, const ember_replica *replica,
                   char *failure, size_t failure_size) {
  char prefix[32] = "";
  if (replica && replica->world_size > 1 && replica->rank > 0)
    snprintf(prefix, sizeof prefix, "[rank %d] ", replica->rank);
  report_prefix = prefix;
  exit_requested = exit_code = 0;
  if (failure && failure_size) failure[0] = 0;
  lua_State *L = luaL_newstate();
  if (!L) {
    fprintf(stderr, "%s%s: cannot create a Lua state (out of memory)\n", prefix, progname);
    if (failure) snprintf(failure, failure_size, "cannot create a Lua state (out of memory)");
    return 1;
  }
  globalL = L;
  int sigint = !replica || replica->group == NULL;   /* threads: Ctrl-C ends the process */
  if (sigint) signal(SIGINT, on_sigint);
  struct smain s = { argc, argv, o, 0, replica, failure, failure_size };
  int status = lua_cpcall(L, pmain, &s);
  if (status) {
    ember_host_report(L, status);
    if (failure && !failure[0]) snprintf(failure, failure_size, "%s", last_error);
    s.status = 1;
  }
  if (sigint) signal(SIGINT, SIG_DFL);  /* from here on Ctrl-C just stops a slow close */
  lua_close(L);
  report_prefix = "";
  return s.status;
}

int main(int argc, char **argv) {
  if (argv[0] && argv[0][0]) {
    const char *slash = strrchr(argv[0], '/');
    progname = slash ? slash + 1 : argv[0];
  }
  opts o;
  if (parse(argc, argv, &o)) return 1;
  if (o.help) { usage(stdout); return 0; }
  if (o.version) { print_version(); return 0; }
  if (o.replicas > 0) return ember_replicas_main(argc, argv, &o, progname);
  /* Under mpirun (or another MPI launcher) this process is one replica: its lines
  ** get the rank prefix; em.distribute joins the job when the script asks. */
  int rank = 0, size = 1;
  if (em_mpi_launched(&rank, &size) && size > 1) {
    ember_replica r = { rank, size, 0, NULL };
    return ember_host_run(argc, argv, &o, &r, NULL, 0);
  }
  return ember_host_run(argc, argv, &o, NULL, NULL, 0);
}

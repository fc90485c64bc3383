/*
** luamap.c -- the worker LuaJIT states behind ds:map(fn) with a Lua function.
**
** The loader computes samples on C worker threads, and a Lua state can run on
** one thread at a time, so the user's function cannot run in the state that
** called ds:map. Instead the main state serializes the function (bytecode plus
** its upvalues, lua/ember/data/luamap.lua) into a blob, and each worker gets a
** LuaJIT state of its own, created on its first sample: the standard libraries,
** the main state's package.path/cpath, EMBER_WORKER = the worker's number (so
** ember opens its em_state with one thread), `em` = require 'ember', and the
** function rebuilt by require('ember.data.worker').load(blob). Per sample the
** worker's runner wraps the fields, calls the function and stores what it
** returned back into fields (lua/ember/data/worker.lua).
**
** This file is linked into the ember command (symbols exported, found through
** ffi.C) and built alone as libember_lua.so for a plain `luajit` host. It uses
** the Lua C API only, never the core: in the plain-luajit case libember.so is
** loaded RTLD_LOCAL and its symbols cannot be linked against. (ember.h is
** included for its types.)
**
** Slots: worker -1 (the loader's caller) is slot 0, worker k slot k + 1. The
** slot table grows under a mutex; each slot has its own mutex, because two
** loaders over one dataset share the transform and may both have a worker 0.
** Nothing here aborts: failures come back as messages in err.
*/
#include <lauxlib.h>
#include <lua.h>
#include <lualib.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ember.h"
#include "ffi_exports.h"

typedef struct luamap_slot {
  pthread_mutex_t mu;
  lua_State *L;       /* NULL until the worker's first sample */
  int runner;         /* registry reference of the runner function */
  char *broken;       /* set when creating the state failed: the message */
} luamap_slot;

typedef struct ember_luamap {
  char *blob;
  size_t len;
  char *path, *cpath;
  pthread_mutex_t mu; /* guards slots / nslots */
  luamap_slot **slots;
  int nslots;
} ember_luamap;

/* Worker states open in the process, for tests (a dropped loader and dataset
** must close theirs). */
static int live_states;
int ember_luamap_live(void) { return __atomic_load_n(&live_states, __ATOMIC_RELAXED); }

static char *dup_n(const char *s, size_t n) {
  char *p = malloc(n + 1);
  if (!p) return NULL;
  if (n) memcpy(p, s, n);
  p[n] = 0;
  return p;
}

/* NULL when out of memory (the Lua side reports it). */
void *ember_luamap_new(const char *blob, size_t len, const char *path, const char *cpath) {
  ember_luamap *m = calloc(1, sizeof *m);
  if (!m) return NULL;
  m->blob = dup_n(blob, len);
  m->len = len;
  m->path = dup_n(path ? path : "", path ? strlen(path) : 0);
  m->cpath = dup_n(cpath ? cpath : "", cpath ? strlen(cpath) : 0);
  if (!m->blob || !m->path || !m->cpath || pthread_mutex_init(&m->mu, NULL) != 0) {
    free(m->blob); free(m->path); free(m->cpath); free(m);
    return NULL;
  }
  return m;
}

/* The slot of `worker`, created if new; NULL when out of memory. */
static luamap_slot *get_slot(ember_luamap *m, int worker) {
  int i = worker + 1;
  if (i < 0) return NULL;
  luamap_slot *s = NULL;
  pthread_mutex_lock(&m->mu);
  if (i >= m->nslots) {
    int n = m->nslots ? m->nslots : 8;
    while (n <= i) n *= 2;
    luamap_slot **grown = realloc(m->slots, (size_t)n * sizeof *grown);
    if (!grown) goto done;
    for (int k = m->nslots; k < n; k++) grown[k] = NULL;
    m->slots = grown;
    m->nslots = n;
  }
  if (!m->slots[i]) {
    luamap_slot *fresh = calloc(1, sizeof *fresh);
    if (!fresh) goto done;
    if (pthread_mutex_init(&fresh->mu, NULL) != 0) { free(fresh); goto done; }
    m->slots[i] = fresh;
  }
  s = m->slots[i];
done:
  pthread_mutex_unlock(&m->mu);
  return s;
}

/* What setup gets through lua_cpcall, and the runner's registry reference back. */
typedef struct setup_args {
  ember_luamap *m;
  int worker;
  int runner;
} setup_args;

/* Protected (lua_cpcall, so that even running out of memory here is an error,
** not a panic): sets up the fresh state and keeps the runner in the registry. */
static int setup(lua_State *L) {
  setup_args *a = lua_touserdata(L, 1);
  ember_luamap *m = a->m;
  luaL_openlibs(L);
  lua_getglobal(L, "package");
  if (*m->path) { lua_pushstring(L, m->path); lua_setfield(L, -2, "path"); }
  if (*m->cpath) { lua_pushstring(L, m->cpath); lua_setfield(L, -2, "cpath"); }
  lua_pop(L, 1);
  lua_pushinteger(L, a->worker);
  lua_setglobal(L, "EMBER_WORKER");
  lua_getglobal(L, "require");
  lua_pushliteral(L, "ember");
  lua_call(L, 1, 1);
  lua_setglobal(L, "em");
  lua_getglobal(L, "require");
  lua_pushliteral(L, "ember.data.worker");
  lua_call(L, 1, 1);
  lua_getfield(L, -1, "load");
  lua_pushlstring(L, m->blob, m->len);
  lua_pushinteger(L, a->worker);
  lua_call(L, 2, 1);
  if (lua_type(L, -1) != LUA_TFUNCTION)
    return luaL_error(L, "ember.data.worker.load returned no runner");
  a->runner = luaL_ref(L, LUA_REGISTRYINDEX);
  return 0;
}

/* "ds:map function (worker 2)", or without the number on the caller's thread. */
static void prefix(char *buf, size_t n, int worker) {
  if (worker < 0) snprintf(buf, n, "ds:map function");
  else snprintf(buf, n, "ds:map function (worker %d)", worker);
}

/* The error on top of L as a string (errors may be any value). */
static const char *message(lua_State *L) {
  const char *msg = lua_tostring(L, -1);
  if (!msg) msg = lua_pushfstring(L, "(error object is a %s value)", luaL_typename(L, -1));
  return msg;
}

/* Creates the slot's state; 0, or 1 with the message in err. The slot is locked. */
static int open_slot(ember_luamap *m, luamap_slot *s, int worker, char *err, size_t errlen) {
  char who[64];
  prefix(who, sizeof who, worker);
  lua_State *L = luaL_newstate();
  if (!L) {
    snprintf(err, errlen, "%s: cannot create a Lua state (out of memory)", who);
    return 1;
  }
  setup_args a = {m, worker, LUA_NOREF};
  if (lua_cpcall(L, setup, &a) != 0) {
    const char *msg = message(L);
    snprintf(err, errlen, "%s: could not set up its Lua state: %s", who, msg);
    s->broken = dup_n(err, strlen(err));
    lua_close(L);
    return 1;
  }
  s->runner = a.runner;
  s->L = L;
  __atomic_add_fetch(&live_states, 1, __ATOMIC_RELAXED);
  return 0;
}

int ember_luamap_call(void *ud, int worker, uint64_t seed, em_tensor **fields, int nfields,
                      char *err, size_t errlen) {
  ember_luamap *m = ud;
  char who[64];
  prefix(who, sizeof who, worker);
  luamap_slot *s = get_slot(m, worker);
  if (!s) {
    snprintf(err, errlen, "%s: out of memory", who);
    return 1;
  }
  int rc = 0;
  pthread_mutex_lock(&s->mu);
  if (s->broken) {      /* the set-up failed before: the same message each time */
    snprintf(err, errlen, "%s", s->broken);
    rc = 1;
  } else if (!s->L) {
    rc = open_slot(m, s, worker, err, errlen);
  }
  if (rc == 0) {
    lua_State *L = s->L;
    int top = lua_gettop(L);
    lua_rawgeti(L, LUA_REGISTRYINDEX, s->runner);
    lua_pushlightuserdata(L, fields);
    lua_pushinteger(L, nfields);
    lua_pushnumber(L, (lua_Number)(seed >> 11));   /* 53 bits: exact in a double */
    if (lua_pcall(L, 3, 0, 0) != 0) {
      snprintf(err, errlen, "%s: %s", who, message(L));
      rc = 1;
    }
    lua_settop(L, top);
  }
  pthread_mutex_unlock(&s->mu);
  return rc;
}

/* When the transform dies: no call is in flight any more. */
void ember_luamap_release(void *ud) {
  ember_luamap *m = ud;
  if (!m) return;
  for (int i = 0; i < m->nslots; i++) {
    luamap_slot *s = m->slots[i];
    if (!s) continue;
    if (s->L) {
      lua_close(s->L);
      __atomic_sub_fetch(&live_states, 1, __ATOMIC_RELAXED);
    }
    free(s->broken);
    pthread_mutex_destroy(&s->mu);
    free(s);
  }
  free(m->slots);
  pthread_mutex_destroy(&m->mu);
  free(m->blob); free(m->path); free(m->cpath);
  free(m);
}

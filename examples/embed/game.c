/*
** game.c -- a game-loop host that embeds ember: what a game engine does with a
** policy network, in a few hundred lines.
**
** The world is a small grid: an agent must reach a target without walking into
** an obstacle. The host owns the world, the frame loop and the clock; the policy
** network lives in a Lua script (policy.lua) that runs in the host's own LuaJIT
** state with ember loaded through luaopen_ember. Each frame the host hands the
** script the observation (a pointer to floats, no copies into Lua tables), the
** script's act() picks the action, and its learn() is told what a scripted
** teacher (a breadth-first search over the grid) would have done: the policy
** learns online from the states it visits itself, and gets visibly better.
**
** What an embedder needs, and where it is shown:
**  - latency: every act() call and every whole frame is timed; p50/p99/max are
**    printed at the end (after a warm-up, so that LuaJIT's traces exist);
**  - script errors: every call into Lua is a lua_pcall with a traceback; an
**    error is reported with its frame, and the game goes on with the last good
**    policy (the previous action for that frame; after three failed learn()s in
**    a row the host stops calling learn and keeps the policy it has);
**  - a memory cap: the em_state the Lua layer opens gets the host's em_config
**    (global EMBER_CONFIG, see lua/host/luaopen.c) whose allocator counts bytes
**    and refuses past a cap: ember turns that into EM_ERR_NOMEM, the Lua layer
**    into an error, this file into a message -- never a crash;
**  - independent agents: --agents N runs N agents on N threads, each with its
**    own lua_State, em_state, allocator and world. Each agent's result is the
**    same as when it runs alone (the test compares checksums, under TSan).
**
** Usage: game [--episodes N] [--seed S] [--agents N] [--script policy.lua]
**             [--mem-cap BYTES] [--fail-at FRAME] [--fail-in act|learn]
**             [--fail-mode once|always] [--quiet]
** Exit status: 0, or 2 when an agent could not start (its script failed to load,
** the memory cap refused the state), 1 for bad arguments.
*/
#include <ember.h>
#include <lauxlib.h>
#include <lua.h>
#include <lualib.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* From libember_lua.so (lua/host/luaopen.c): loads ember's Lua layer into L and
** pushes the em table. Declared here because ember.h never includes lua.h. */
int luaopen_ember(lua_State *L);

/* -- Options --------------------------------------------------------------------- */
typedef struct options {
  int episodes, agents, quiet;
  uint64_t seed;
  const char *script;
  size_t mem_cap;                 /* 0: no cap */
  long fail_at;                   /* 0: no injected error */
  const char *fail_in, *fail_mode;
} options;

/* -- Counting allocator with a cap (em_config.alloc) -----------------------------
** ember calls it from any thread that drops a tensor's last reference, so the
** counters are atomic; it must not call into ember, and doesn't. */
typedef struct capped {
  size_t cap;
  atomic_size_t used, peak;
  atomic_long refused;
} capped;

static void *capped_alloc(void *ud, void *ptr, size_t osize, size_t nsize) {
  capped *c = ud;
  if (nsize == 0) {
    free(ptr);
    if (ptr) atomic_fetch_sub(&c->used, osize);
    return NULL;
  }
  size_t old = ptr ? osize : 0;
  size_t now = atomic_fetch_add(&c->used, nsize - old) + nsize - old;
  if (c->cap && now > c->cap) {          /* refuse: ember reports EM_ERR_NOMEM */
    atomic_fetch_sub(&c->used, nsize - old);
    atomic_fetch_add(&c->refused, 1);
    return NULL;
  }
  void *p = realloc(ptr, nsize);
  if (!p) { atomic_fetch_sub(&c->used, nsize - old); return NULL; }
  size_t pk = atomic_load(&c->peak);
  while (now > pk && !atomic_compare_exchange_weak(&c->peak, &pk, now)) {}
  return p;
}

/* -- The world ---------------------------------------------------------------------
** A W x H grid with obstacles. The host's own random numbers (splitmix64) make
** every episode a function of the seed alone. */
enum { W = 10, H = 10, NOBST = 14, MAX_STEPS = 40, OBS = 32, NACT = 4 };
static const int DX[NACT] = {0, 1, 0, -1}, DY[NACT] = {-1, 0, 1, 0};  /* up right down left */

typedef struct world {
  uint64_t rng;
  unsigned char block[H][W];
  int dist[H][W];                 /* BFS steps to the target; -1 unreachable */
  int ax, ay, tx, ty, steps;
} world;

static uint64_t next_u64(uint64_t *s) {
  uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}
static int rnd(world *w, int n) { return (int)(next_u64(&w->rng) % (uint64_t)n); }

static int blocked(const world *w, int x, int y) {
  return x < 0 || y < 0 || x >= W || y >= H || w->block[y][x];
}

/* Distances to the target: the teacher reads them, and they prove a level
** solvable before it is played. */
static void bfs(world *w) {
  int qx[W * H], qy[W * H], head = 0, tail = 0;
  for (int y = 0; y < H; y++)
    for (int x = 0; x < W; x++) w->dist[y][x] = -1;
  w->dist[w->ty][w->tx] = 0;
  qx[tail] = w->tx; qy[tail++] = w->ty;
  while (head < tail) {
    int x = qx[head], y = qy[head++];
    for (int a = 0; a < NACT; a++) {
      int nx = x + DX[a], ny = y + DY[a];
      if (blocked(w, nx, ny) || w->dist[ny][nx] >= 0) continue;
      w->dist[ny][nx] = w->dist[y][x] + 1;
      qx[tail] = nx; qy[tail++] = ny;
    }
  }
}

static void world_reset(world *w) {
  for (;;) {
    memset(w->block, 0, sizeof w->block);
    for (int i = 0; i < NOBST; i++) w->block[rnd(w, H)][rnd(w, W)] = 1;
    do { w->ax = rnd(w, W); w->ay = rnd(w, H); } while (w->block[w->ay][w->ax]);
    do { w->tx = rnd(w, W); w->ty = rnd(w, H); } while (w->block[w->ty][w->tx]);
    bfs(w);
    int d = w->dist[w->ay][w->ax];
    if (d >= 4) break;             /* reachable and not trivially close */
  }
  w->steps = 0;
}

/* The teacher: the first move (in DX/DY order) that gets closer to the target. */
static int teacher(const world *w) {
  for (int a = 0; a < NACT; a++) {
    int nx = w->ax + DX[a], ny = w->ay + DY[a];
    if (!blocked(w, nx, ny) && w->dist[ny][nx] == w->dist[w->ay][w->ax] - 1) return a;
  }
  return 0;
}

/* What the agent sees: where the target is, the 5x5 window around it (walls
** count as obstacles), and how far it can walk straight in each direction. */
static void observe(const world *w, float *o) {
  int dx = w->tx - w->ax, dy = w->ty - w->ay, k = 4;
  o[0] = (float)dx / W; o[1] = (float)dy / H;
  o[2] = (float)((dx > 0) - (dx < 0)); o[3] = (float)((dy > 0) - (dy < 0));
  for (int y = -2; y <= 2; y++)
    for (int x = -2; x <= 2; x++)
      if (x || y) o[k++] = (float)blocked(w, w->ax + x, w->ay + y);
  for (int a = 0; a < NACT; a++) {
    int n = 0;
    while (n < 4 && !blocked(w, w->ax + DX[a] * (n + 1), w->ay + DY[a] * (n + 1))) n++;
    o[k++] = n / 4.0f;
  }
}

/* Moves the agent: 1 reached the target, -1 crashed or out of time, 0 going on. */
static int world_step(world *w, int a) {
  w->ax += DX[a]; w->ay += DY[a]; w->steps++;
  if (blocked(w, w->ax, w->ay)) return -1;
  if (w->ax == w->tx && w->ay == w->ty) return 1;
  return w->steps >= MAX_STEPS ? -1 : 0;
}

/* -- One agent ------------------------------------------------------------------------ */
typedef struct agent {
  int id;
  const options *o;
  capped mem;
  lua_State *L;
  int ref_act, ref_learn, ref_info;
  world w;
  int *wins;                      /* per episode: 1 reached the target */
  double *fwd_us, *frame_us;      /* per frame */
  size_t frames, frames_cap;
  long script_errors, learn_fail_streak, learning_stopped_at;
  char first_error[512];
  int failed;                     /* could not start: error holds why */
  char error[512];
  double param_sum, loss;
  uint64_t outcome_hash;
} agent;

static double now_us(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1e6 + ts.tv_nsec / 1e3;
}

/* A traceback for errors from Lua, so that the report names the script's line. */
static int traceback(lua_State *L) {
  const char *msg = lua_tostring(L, 1);
  luaL_traceback(L, L, msg ? msg : "(error object is not a string)", 1);
  return 1;
}

/* Calls the function at registry ref on the nargs arguments on top of the
** stack: 0 and nres results there, or lua_pcall's status and the message with
** its traceback. */
static int call_ref(lua_State *L, int ref, int nargs, int nres) {
  lua_rawgeti(L, LUA_REGISTRYINDEX, ref);
  lua_insert(L, -(nargs + 1));
  lua_pushcfunction(L, traceback);
  lua_insert(L, -(nargs + 2));
  int base = lua_gettop(L) - nargs - 1;
  int st = lua_pcall(L, nargs, nres, base);
  lua_remove(L, base);
  return st;
}

static void script_error(agent *g, long frame, const char *where) {
  const char *msg = lua_tostring(g->L, -1);
  g->script_errors++;
  if (g->script_errors == 1)
    snprintf(g->first_error, sizeof g->first_error, "frame %ld, %s(): %s", frame, where,
             msg ? msg : "?");
  if (!g->o->quiet && g->script_errors <= 3) {
    fflush(stdout);
    /* first line only: the traceback is in first_error for the summary */
    const char *nl = msg ? strchr(msg, '\n') : NULL;
    fprintf(stderr, "agent %d: script error at frame %ld in %s(): %.*s -- going on with "
            "the last good policy\n", g->id, frame, where,
            nl ? (int)(nl - msg) : (int)strlen(msg ? msg : "?"), msg ? msg : "?");
  }
  lua_pop(g->L, 1);
  /* The error may have been memory refused: what the frames left for the
  ** collector is freed now, so that the next frame finds it. */
  lua_gc(g->L, LUA_GCCOLLECT, 0);
}

/* Opens the agent's Lua state, ember (with the capped allocator) and the
** script, which returns {act = fn, learn = fn, info = fn}. */
static int agent_start(agent *g) {
  const options *o = g->o;
  lua_State *L = g->L = luaL_newstate();
  if (!L) { snprintf(g->error, sizeof g->error, "cannot create a Lua state"); return 0; }
  luaL_openlibs(L);
  /* The em_state the Lua layer opens takes this config: the cap, one thread
  ** (a game frame has no time to wake workers), the agent's seed. em_open
  ** copies it; the allocator's ud (g->mem) lives as long as the agent. */
  em_config cfg;
  em_config_init(&cfg);
  cfg.num_threads = 1;
  cfg.alloc = capped_alloc;
  cfg.alloc_ud = &g->mem;
  cfg.seed = o->seed + (uint64_t)g->id;
  lua_pushlightuserdata(L, &cfg);
  lua_setglobal(L, "EMBER_CONFIG");
  /* luaopen_ember returns em at once; the core (and its em_state) loads at the
  ** first field read. Reading one here, under the pcall, makes a refused state
  ** an error of the start-up, and lets cfg go when this function returns. */
  lua_pushcfunction(L, traceback);
  if (luaL_loadstring(L, "local open = ... local em = open() local _ = em.zeros return em") ||
      (lua_pushcfunction(L, luaopen_ember), lua_pcall(L, 1, 1, -3) != 0)) {
    snprintf(g->error, sizeof g->error, "loading ember failed: %s", lua_tostring(L, -1));
    return 0;
  }
  lua_setglobal(L, "em");
  lua_pop(L, 1);
  lua_pushnil(L);
  lua_setglobal(L, "EMBER_CONFIG");   /* it points into this stack frame */
  if (luaL_loadfile(L, o->script) != 0) {
    snprintf(g->error, sizeof g->error, "%s", lua_tostring(L, -1));
    return 0;
  }
  /* The script's arguments: sizes, the seed and the error to inject. */
  lua_newtable(L);
  lua_pushinteger(L, OBS); lua_setfield(L, -2, "obs");
  lua_pushinteger(L, NACT); lua_setfield(L, -2, "actions");
  lua_pushnumber(L, (double)(o->seed + (uint64_t)g->id)); lua_setfield(L, -2, "seed");
  lua_pushinteger(L, o->fail_at); lua_setfield(L, -2, "fail_at");
  lua_pushstring(L, o->fail_in); lua_setfield(L, -2, "fail_in");
  lua_pushstring(L, o->fail_mode); lua_setfield(L, -2, "fail_mode");
  lua_pushcfunction(L, traceback);
  lua_insert(L, -3);
  if (lua_pcall(L, 1, 1, -3) != 0 || !lua_istable(L, -1)) {
    snprintf(g->error, sizeof g->error, "%s", lua_istable(L, -1) ? "?" :
             lua_isstring(L, -1) ? lua_tostring(L, -1) : "the script must return a table");
    return 0;
  }
  int *refs[3] = {&g->ref_act, &g->ref_learn, &g->ref_info};
  const char *names[3] = {"act", "learn", "info"};
  for (int i = 0; i < 3; i++) {
    lua_getfield(L, -1, names[i]);
    if (!lua_isfunction(L, -1)) {
      snprintf(g->error, sizeof g->error, "the script's table has no %s function", names[i]);
      return 0;
    }
    *refs[i] = luaL_ref(L, LUA_REGISTRYINDEX);
  }
  lua_settop(L, 0);
  return 1;
}

static void record(agent *g, double fwd, double frame) {
  if (g->frames == g->frames_cap) {
    g->frames_cap = g->frames_cap ? 2 * g->frames_cap : 4096;
    g->fwd_us = realloc(g->fwd_us, g->frames_cap * sizeof *g->fwd_us);
    g->frame_us = realloc(g->frame_us, g->frames_cap * sizeof *g->frame_us);
  }
  g->fwd_us[g->frames] = fwd;
  g->frame_us[g->frames++] = frame;
}

static void *agent_run(void *arg) {
  agent *g = arg;
  const options *o = g->o;
  /* Agent i of a run with seed s plays the levels of a lone agent with seed
  ** s + i: the two-agent test compares them. */
  g->w.rng = 0x5eed0000ull + (o->seed + (uint64_t)g->id) * 7919;
  g->wins = calloc((size_t)o->episodes, sizeof *g->wins);
  g->outcome_hash = 1469598103934665603ull;
  if (!agent_start(g)) {
    g->failed = 1;
    if (g->L) lua_close(g->L);
    g->L = NULL;
    return NULL;
  }
  lua_State *L = g->L;
  float obs[OBS];
  long frame = 0;
  int last_action = 0;
  for (int ep = 0; ep < o->episodes; ep++) {
    world_reset(&g->w);
    int result = 0;
    while (result == 0) {
      double t0 = now_us();
      frame++;
      observe(&g->w, obs);
      /* The policy's forward pass: what the game waits for each frame. */
      double f0 = now_us();
      lua_pushlightuserdata(L, obs);
      int action = last_action;
      if (call_ref(L, g->ref_act, 1, 1) != 0) script_error(g, frame, "act");
      else {
        action = (int)lua_tointeger(L, -1);
        lua_pop(L, 1);
        if (action < 0 || action >= NACT) action = last_action;
      }
      double f1 = now_us();
      int teach = teacher(&g->w);
      result = world_step(&g->w, action);
      last_action = action;
      /* Learning: the script is told the teacher's action for what it saw. */
      if (!g->learning_stopped_at) {
        lua_pushinteger(L, teach);
        if (call_ref(L, g->ref_learn, 1, 0) != 0) {
          script_error(g, frame, "learn");
          if (++g->learn_fail_streak == 3) {
            g->learning_stopped_at = frame;
            if (!o->quiet && !fflush(stdout))
              fprintf(stderr, "agent %d: learn() failed 3 times in a row: learning stopped at "
                      "frame %ld, acting with the last good policy\n", g->id, frame);
          }
        } else g->learn_fail_streak = 0;
      }
      /* The tensors a frame leaves behind are small in Lua's eyes (a handle)
      ** and large in ember's: a step of the collector each frame keeps their
      ** memory from piling up between Lua's own, rarer, collections. */
      lua_gc(L, LUA_GCSTEP, 10);
      record(g, f1 - f0, now_us() - t0);
    }
    g->wins[ep] = result > 0;
    g->outcome_hash = (g->outcome_hash ^ (uint64_t)(result > 0)) * 1099511628211ull;
    g->outcome_hash = (g->outcome_hash ^ (uint64_t)g->w.steps) * 1099511628211ull;
  }
  /* info() -> sum of |parameters|, last training loss: the checksum's Lua half. */
  if (call_ref(L, g->ref_info, 0, 2) == 0) {
    g->param_sum = lua_tonumber(L, -2);
    g->loss = lua_tonumber(L, -1);
    lua_pop(L, 2);
  } else script_error(g, frame, "info");
  /* Closed on the agent's own thread, as ember.h asks: lua_close releases the
  ** Lua layer's tensors, then closes its em_state. */
  lua_close(L);
  g->L = NULL;
  return NULL;
}

/* -- Report ------------------------------------------------------------------------------- */
static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

/* p50, p99 and max of v[skip..n). */
static void percentiles(const double *v, size_t n, size_t skip, double out[3]) {
  out[0] = out[1] = out[2] = 0;
  if (n <= skip) return;
  size_t m = n - skip;
  double *s = malloc(m * sizeof *s);
  memcpy(s, v + skip, m * sizeof *s);
  qsort(s, m, sizeof *s, cmp_double);
  out[0] = s[m / 2];
  out[1] = s[(size_t)(0.99 * (double)(m - 1))];
  out[2] = s[m - 1];
  free(s);
}

static void report(agent *g) {
  const options *o = g->o;
  if (g->failed) {
    printf("agent %d: could not start: %s\n", g->id, g->error);
    printf("agent %d memory: peak %zu bytes, cap %zu, %ld allocations refused\n", g->id,
           atomic_load(&g->mem.peak), g->mem.cap, atomic_load(&g->mem.refused));
    return;
  }
  printf("agent %d learning curve (success rate per 100 episodes):\n", g->id);
  for (int e = 0; e < o->episodes; e += 100) {
    int n = o->episodes - e < 100 ? o->episodes - e : 100, won = 0;
    for (int i = 0; i < n; i++) won += g->wins[e + i];
    printf("agent %d episodes %4d-%-4d success %3d%%\n", g->id, e + 1, e + n, 100 * won / n);
  }
  /* The first frames run while LuaJIT compiles its traces: a game pays that at
  ** load time, so the figures leave out the first 200 frames. */
  size_t skip = g->frames > 400 ? 200 : 0;
  double fw[3], fr[3];
  percentiles(g->fwd_us, g->frames, skip, fw);
  percentiles(g->frame_us, g->frames, skip, fr);
  printf("agent %d latency over %zu frames: policy forward p50 %.1f us, p99 %.1f us, max %.1f us;"
         " whole frame (incl. learning) p50 %.1f us, p99 %.1f us, max %.1f us\n", g->id,
         g->frames - skip, fw[0], fw[1], fw[2], fr[0], fr[1], fr[2]);
  printf("agent %d script errors: %ld%s%s\n", g->id, g->script_errors,
         g->script_errors ? " (first: " : "", g->script_errors ? "see below)" : "");
  if (g->script_errors) {
    /* the message's first line, then the traceback indented */
    printf("agent %d first script error: ", g->id);
    for (const char *p = g->first_error; *p; p++) {
      putchar(*p);
      if (*p == '\n') printf("    ");
    }
    putchar('\n');
  }
  if (g->learning_stopped_at)
    printf("agent %d learning stopped at frame %ld; kept acting with the last good policy\n",
           g->id, g->learning_stopped_at);
  printf("agent %d memory: peak %zu bytes%s, %ld allocations refused\n", g->id,
         atomic_load(&g->mem.peak), g->mem.cap ? " (capped)" : "", atomic_load(&g->mem.refused));
  printf("agent %d checksum %016llx %.9g\n", g->id, (unsigned long long)g->outcome_hash,
         g->param_sum);
}

static int usage(const char *prog) {
  fprintf(stderr, "usage: %s [--episodes N] [--seed S] [--agents N] [--script FILE]\n"
          "       [--mem-cap BYTES] [--fail-at FRAME] [--fail-in act|learn]\n"
          "       [--fail-mode once|always] [--quiet]\n", prog);
  return 1;
}

int main(int argc, char **argv) {
  options o = {.episodes = 600, .agents = 1, .seed = 1, .script = "policy.lua",
               .fail_in = "learn", .fail_mode = "once"};
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
    if (!strcmp(a, "--quiet")) { o.quiet = 1; continue; }
    if (!v) return usage(argv[0]);
    i++;
    if (!strcmp(a, "--episodes")) o.episodes = atoi(v);
    else if (!strcmp(a, "--seed")) o.seed = strtoull(v, NULL, 10);
    else if (!strcmp(a, "--agents")) o.agents = atoi(v);
    else if (!strcmp(a, "--script")) o.script = v;
    else if (!strcmp(a, "--mem-cap")) o.mem_cap = strtoull(v, NULL, 10);
    else if (!strcmp(a, "--fail-at")) o.fail_at = atol(v);
    else if (!strcmp(a, "--fail-in")) o.fail_in = v;
    else if (!strcmp(a, "--fail-mode")) o.fail_mode = v;
    else return usage(argv[0]);
  }
  if (o.episodes < 1 || o.agents < 1 || o.agents > 64) return usage(argv[0]);
  /* OpenBLAS keeps one thread count for the process: one thread, so that each
  ** agent's matmuls run on its own thread and its results don't depend on the
  ** others'. */
  em_blas_pin_threads(1);
  printf("ember %s embedded: %d agent(s), %d episodes, seed %llu, script %s\n", em_version(),
         o.agents, o.episodes, (unsigned long long)o.seed, o.script);
  agent *g = calloc((size_t)o.agents, sizeof *g);
  pthread_t *th = calloc((size_t)o.agents, sizeof *th);
  for (int i = 0; i < o.agents; i++) {
    g[i].id = i;
    g[i].o = &o;
    g[i].mem.cap = o.mem_cap;
    if (pthread_create(&th[i], NULL, agent_run, &g[i]) != 0) {
      fprintf(stderr, "cannot start thread %d\n", i);
      return 2;
    }
  }
  int status = 0;
  for (int i = 0; i < o.agents; i++) pthread_join(th[i], NULL);
  for (int i = 0; i < o.agents; i++) {
    report(&g[i]);
    if (g[i].failed) status = 2;
    if (atomic_load(&g[i].mem.used) != 0)
      printf("agent %d: %zu bytes still allocated after lua_close\n", i,
             atomic_load(&g[i].mem.used));
    free(g[i].wins); free(g[i].fwd_us); free(g[i].frame_us);
  }
  free(g); free(th);
  return status;
}

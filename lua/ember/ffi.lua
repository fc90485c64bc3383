--[[
ember.ffi -- the bottom of the Lua layer: the C declarations, where the C
functions come from, this Lua state's em_state, and the helpers every other
module uses to talk to C (errors, dtypes, devices, dims, shapes; the last four
are in ember.ffi_args, which this module installs onto `core`).

Where the symbols come from. Inside the `ember` command (or any host that links
the core with its symbols exported) they are in the process already and ffi.C
finds them. From a plain `luajit`, the shared library is loaded: $EMBER_LIB if
set, else the libember.so next to this tree (build/lua/ember/ -> build/, or
<prefix>/share/lua/5.1/ember/ -> <prefix>/lib/), else ember/libember.so on
package.cpath (a luarocks tree), else the system's search path.

This is the one module that touches ffi.C. The others reach the core through
core.C, the table of ember.h's functions and constants (ember.capi, generated
from the header: the functions that may allocate tensor memory are wrapped
there with the collect-and-retry below, so no call site writes it out), and
the process itself -- the C library, and the functions of lua/host inside the
ember command -- through core.process, declared by ember.hostdefs (also
generated: lua/host/ffi_exports.h and the C library as the compiler sees it).

One em_state per Lua state, opened when this module is first required and
closed when the Lua state closes (a userdata sentinel whose __gc releases every
live tensor, then the state).

Errors. A failed call raises a Lua error carrying em_errmsg. The level is
found by walking up the stack past this package's own frames, so the position
is the user's line however deep inside ember the failure happened (tail calls
and metamethods included). That walk only happens on the error path.

For other modules (nn, autograd, ...): a tensor is an `em_box` cdata whose
_h field is its em_tensor*; core.H(x, op, n) checks an argument and returns
the handle, core.wrap(h) turns an owned handle into a tensor, core.fail()
raises the last C error, core.raise(msg) a Lua-side one, core.cdim converts a
1-based dim. Methods go into core.Tensor, computed fields into core.getters /
core.setters (t.name reads / writes). Environment: EMBER_LIB (library path),
EMBER_NUM_THREADS, EMBER_MALLOC=1 (use malloc even where the host offers its
caching allocator).
]]
local ffi = require 'ffi'
require 'ember.cdefs'
require 'ember.hostdefs'

local core = {}

ffi.cdef [[ typedef struct em_box { em_tensor *_h; int32_t _id; } em_box; ]]

-- -- Where this package lives ---------------------------------------------------
local src = debug.getinfo(1, 'S').source
local dir = src:match('^@(.*)/[^/]*$') or '.'
core.dir = dir
local pkg_prefix = '@' .. dir .. '/'

-- -- The library --------------------------------------------------------------------
local function exists(path)
  local f = io.open(path, 'rb')
  if f then f:close() return true end
  return false
end

local function find_lib()
  if pcall(function() return ffi.C.em_open end) then return ffi.C, 'process' end
  local env = os.getenv('EMBER_LIB')
  if env and env ~= '' then return ffi.load(env), env end
  for _, rel in ipairs({ '/../../libember.so', '/../../../../lib/libember.so' }) do
    local p = dir .. rel
    if exists(p) then return ffi.load(p), p end
  end
  -- A luarocks tree keeps libraries apart from modules, in lib/lua/5.1/ember/
  -- (Makefile's install-rock), which `luarocks path` puts on package.cpath.
  local rock = package.searchpath('ember.libember', package.cpath)
  if rock then return ffi.load(rock), rock end
  local ok, lib = pcall(ffi.load, 'ember')
  if ok then return lib, 'ember' end
  error(('ember: cannot find the C library libember.so (looked beside %s and in the ' ..
    'system library path: %s); set EMBER_LIB to its path'):format(dir, tostring(lib)), 0)
end

local lib, libpath = find_lib()
core.libpath = libpath
core.process = ffi.C

-- The second try of a call that failed (ember.capi's wrappers call it with
-- the function, its status and its arguments): when it failed because a
-- device ran out of memory (the allocator raised the pressure flag), Lua's
-- garbage is collected -- the allocator can't do that from inside the op --
-- and fn(...) is called once more; its status is returned. Otherwise the
-- first status is. (A failed op leaves the state as it was, so calling it
-- again is safe.) S is set below, before any op can run.
local S, pressure
local function again(fn, st, ...)
  pressure = pressure or lib.em_memory_pressure_flag(S)
  if pressure[0] ~= 0 and core.collect then
    core.collect()
    return fn(...)
  end
  return st
end

local C = require('ember.capi')(lib, again)
core.C = C

-- The CPU cores online (sysconf), at least 1: what the state's threads, the
-- planner's shared-core slowdown and the profiler's input advice divide.
local cpu_count
function core.cpu_count()
  if not cpu_count then
    pcall(ffi.cdef, 'long sysconf(int name);')
    -- (84: _SC_NPROCESSORS_ONLN on Linux)
    local ok, n = pcall(function() return tonumber(ffi.C.sysconf(84)) end)
    cpu_count = ok and n and n > 0 and n or 1
  end
  return cpu_count
end

-- -- The state ----------------------------------------------------------------------------
local cfg = ffi.new('em_config')
C.em_config_init(cfg)
cfg.num_threads = tonumber(os.getenv('EMBER_NUM_THREADS') or '') or 0
-- A replica of `ember --replicas N` gets its share of the cores (lua/host/replicas.c).
local replica = rawget(_G, 'EMBER_REPLICA')
if type(replica) == 'table' and (replica.threads or 0) > 0 then cfg.num_threads = replica.threads end
-- One of several MPI processes on this host (mpirun sets the local count): the
-- same share, so that the processes don't oversubscribe the cores.
if cfg.num_threads == 0 and replica == nil then
  local here = tonumber(os.getenv('OMPI_COMM_WORLD_LOCAL_SIZE') or os.getenv('MPI_LOCALNRANKS') or
    os.getenv('PMIX_LOCAL_SIZE') or '')
  if here and here > 1 then
    cfg.num_threads = math.max(1, math.floor(core.cpu_count() / here))
  end
end
-- A ds:map worker's Lua state (lua/host/luamap.c sets EMBER_WORKER): the loader's
-- worker threads are the parallelism, so its ops run on the calling thread.
if rawget(_G, 'EMBER_WORKER') ~= nil then cfg.num_threads = 1 end
-- A C host's own em_config (luaopen.c: the global EMBER_CONFIG, a light userdata
-- set before em's first field read, which loads this): its allocator -- a memory
-- cap, say --, threads and seed replace everything above. em_open copies it.
local hostcfg = rawget(_G, 'EMBER_CONFIG')
if type(hostcfg) == 'userdata' then
  ffi.copy(cfg, ffi.cast('const em_config *', hostcfg), ffi.sizeof('em_config'))
end
do  -- the host's caching allocator, when the process has one (the ember command)
  local ok, fn = pcall(function() return ffi.C.ember_host_alloc end)
  if ok and os.getenv('EMBER_MALLOC') ~= '1' and cfg.alloc == nil then cfg.alloc = fn end
end
local Sbox = ffi.new('em_state*[1]')
local open_status = C.em_open(Sbox, cfg)
if open_status ~= 0 then
  -- There is no state to hold a message: a refused allocation (a host's memory
  -- cap) is told by its status.
  error('ember: could not open the C state: ' .. (open_status == C.EM_ERR_NOMEM and
    'out of memory (the allocator refused the state)' or ffi.string(C.em_errmsg(nil))), 0)
end
S = Sbox[0]
core.S = S
-- C messages then number dims, list positions and indices from 1, as Lua does.
C.em_set_index_base(S, 1)

-- -- Errors -------------------------------------------------------------------------
local getinfo = debug.getinfo
-- The level of the first Lua frame outside this package, counted from the
-- caller of blame_level's caller (error's numbering). C frames are skipped
-- too: after a tail call (`return t:add(u)`) the user's frame is gone and the
-- next frame may be pcall; the nearest Lua line is the useful position then.
-- The ember command's pcall and xpcall wrappers (lua/host/main.c, the chunk
-- '=[ember host]') are skipped as well. 0 (no position) when there is none.
local function blame_level()
  local lvl = 3
  while true do
    local info = getinfo(lvl, 'S')
    if not info then return 0 end
    if info.what ~= 'C' and info.source:sub(1, #pkg_prefix) ~= pkg_prefix and
       info.source ~= '=[ember host]' then
      return lvl - 1
    end
    lvl = lvl + 1
  end
end
core.blame_level = blame_level

-- Raise msg at the user's line.
local function raise(msg)
  error(msg, blame_level())
end
core.raise = raise

-- The state's last error message, already in Lua's numbering (the state's
-- index base is 1, so C numbers dims, positions and indices from 1 itself).
local function errmsg() return ffi.string(C.em_errmsg(S)) end
core.errmsg = errmsg

-- Raise the state's last error message. When a device ran out of memory, Lua's
-- garbage is collected first, so the memory of the tensors it no longer
-- reaches is free when the caller goes on (handles.lua sets core.collect).
local function fail()
  local msg = errmsg()
  pressure = pressure or C.em_memory_pressure_flag(S)
  if pressure[0] ~= 0 and core.collect then core.collect() end
  error(msg, blame_level())
end

core.fail = fail

local function check(st)
  if st ~= 0 then error(errmsg(), blame_level()) end
end
core.check = check

-- "number", "string", "tensor", "table", ... for messages.
local box_t = ffi.typeof('em_box')
core.box_t = box_t
local istype = ffi.istype
local function kind(x)
  if istype(box_t, x) then return 'tensor' end
  return type(x)
end
core.kind = kind

-- -- Dtypes, devices, shapes, dims (ember.ffi_args) ----------------------------------
require('ember.ffi_args')(core)

-- A JSON string literal of s (UTF-8), by the core's JSON writer (the one that
-- writes safetensors headers): checkpoints and the profiler's trace share it.
local qbuf, qcap = nil, 0
function core.json_quote(s)
  local n = C.em_json_quote(nil, s, #s)
  if n > qcap then
    qcap = tonumber(n) * 2
    qbuf = ffi.new('char[?]', qcap)
  end
  C.em_json_quote(qbuf, s, #s)
  return ffi.string(qbuf, n)
end

-- The finalizer of a cdata box whose _h the C function cfree releases: it nils the
-- handle first, so that a box released early (before the state closes) and again
-- by its finalizer frees once.
function core.releaser(cfree)
  return function(b)
    if b._h ~= nil then
      local h = b._h
      b._h = nil
      cfree(h)
    end
  end
end

-- Free the registry etc. when the Lua state closes: set by handles.lua.
core.on_close = {}
local closer = newproxy(true)
getmetatable(closer).__gc = function()
  for i = #core.on_close, 1, -1 do core.on_close[i]() end
  C.em_close(S)
  core.closed = true
end
core._closer = closer

return core

--[[
ember.ffi -- the bottom of the Lua layer: the C declarations, where the C
functions come from, this Lua state's em_state, and the helpers every other
module uses to talk to C (errors, dtypes, devices, dims, shapes).

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

-- -- Dtypes ----------------------------------------------------------------------------
-- Ids are em_dtype's values; names and kinds come from the core.
local dtype_names, dtype_ids, is_float = {}, {}, {}
for i = 0, C.EM_NUM_DTYPES - 1 do
  dtype_names[i] = ffi.string(C.em_dtype_name(i))
  dtype_ids[dtype_names[i]] = i
  is_float[i] = C.em_dtype_is_floating(i) ~= 0
end
local aliases = { float = C.EM_FLOAT32, double = C.EM_FLOAT64, half = C.EM_FLOAT16,
  int = C.EM_INT32, long = C.EM_INT64, byte = C.EM_UINT8 }
core.dtype_names, core.dtype_ids = dtype_names, dtype_ids
core.is_float = is_float

function core.dtype_id(name, op)
  local id = dtype_ids[name] or aliases[name]
  if id then return id end
  raise(('%s: unknown dtype %s (expected float32, float64, float16, bfloat16, int32, ' ..
    'int64, uint8 or bool)'):format(op, type(name) == 'string' and "'" .. name .. "'" or
    'of type ' .. kind(name)))
end

-- -- Devices -----------------------------------------------------------------------
-- Names resolve through the core's registry (em_device_parse): 'cpu' -> -1,
-- 'meta' -> -2, 'cuda' -> 0, 'cuda:N' -> N (0-based, as CUDA numbers them).
-- Each name is asked once; a device number passes as it is.
local device_ids = { cpu = -1 }
local device_out = ffi.new('int[1]')
function core.device_id(d, op)
  if d == nil then return -1 end
  local id = device_ids[d]
  if id then return id end
  if type(d) == 'string' then
    if C.em_device_parse(S, d, device_out) ~= 0 then
      raise(('%s: unknown device \'%s\' (expected \'cpu\', \'meta\', \'cuda\' or ' ..
        '\'cuda:N\')'):format(op, d))
    end
    id = device_out[0]
    device_ids[d] = id
    return id
  elseif type(d) == 'number' and d >= -2 and d % 1 == 0 then
    return d
  end
  raise(('%s: unknown device %s (expected \'cpu\', \'meta\', \'cuda\' or \'cuda:N\')')
    :format(op, 'of type ' .. kind(d)))
end

function core.device_name(id)
  if id == -1 then return 'cpu' end
  if id == -2 then return 'meta' end
  return 'cuda:' .. id
end

-- -- Shapes -------------------------------------------------------------------------
local MAXD = 8
core.MAXD = MAXD
local shape_buf = ffi.new('int64_t[8]')
local shape_buf2 = ffi.new('int64_t[8]')
core.shape_buf2 = shape_buf2

local function bad_size(op, v)
  raise(('%s: sizes must be non-negative integers, got %s'):format(op,
    type(v) == 'number' and tostring(v) or kind(v)))
end

-- A shape from varargs (numbers, then maybe an options table) or from one table
-- (then maybe an options table). Fills shape_buf; returns ndim, opts.
-- allow_neg lets -1 through (view/reshape/expand).
function core.parse_shape(op, allow_neg, a1, ...)
  local n, opts = 0, nil
  if type(a1) == 'table' and not istype(box_t, a1) and (a1[1] ~= nil or next(a1) == nil) then
    n = #a1
    if n > MAXD then raise(('%s: %d dimensions (at most %d)'):format(op, n, MAXD)) end
    for i = 1, n do
      local v = a1[i]
      if type(v) ~= 'number' or v % 1 ~= 0 or (v < 0 and not (allow_neg and v == -1)) then
        bad_size(op, v)
      end
      shape_buf[i - 1] = v
    end
    opts = ...
  else
    local nargs = select('#', ...) + 1
    for i = 1, nargs do
      local v
      if i == 1 then v = a1 else v = select(i - 1, ...) end
      if type(v) == 'table' and not istype(box_t, v) then
        opts = v
        if i ~= nargs then
          raise(op .. ': the options table must come last')
        end
        break
      elseif v == nil and i == nargs then
        break
      end
      if type(v) ~= 'number' or v % 1 ~= 0 or (v < 0 and not (allow_neg and v == -1)) then
        bad_size(op, v)
      end
      if n >= MAXD then raise(('%s: more than %d dimensions'):format(op, MAXD)) end
      shape_buf[n] = v
      n = n + 1
    end
  end
  if opts ~= nil and type(opts) ~= 'table' then
    raise(op .. ': expected an options table after the shape, got ' .. kind(opts))
  end
  return n, opts, shape_buf
end

-- Options {dtype=, device=} with defaults; a bare dtype string is accepted too.
function core.parse_opts(op, opts, def_dtype, def_device)
  if opts == nil then return def_dtype, def_device or -1 end
  if type(opts) == 'string' then return core.dtype_id(opts, op), def_device or -1 end
  if type(opts) ~= 'table' then
    raise(op .. ': expected an options table, got ' .. kind(opts))
  end
  local dt, dev = def_dtype, def_device or -1
  if opts.dtype ~= nil then dt = core.dtype_id(opts.dtype, op) end
  if opts.device ~= nil then dev = core.device_id(opts.device, op) end
  return dt, dev
end

-- The dtype of a handle as a Lua number (C returns an enum cdata).
local em_tensor_dtype = C.em_tensor_dtype
function core.dtype_of(h) return tonumber(em_tensor_dtype(h)) end

-- Shape of a tensor handle as a Lua list.
function core.shape_of(h)
  local n = C.em_tensor_ndim(h)
  local sz = C.em_tensor_sizes(h)
  local t = {}
  for i = 1, n do t[i] = tonumber(sz[i - 1]) end
  return t
end

-- "[2,3]" for messages.
function core.shape_str(h)
  return '[' .. table.concat(core.shape_of(h), ',') .. ']'
end

-- -- Dimensions ------------------------------------------------------------------------
-- A 1-based (or negative, from the end) dim of a tensor with n dims -> 0-based.
-- extra = 1 for dims that may point one past the end (unsqueeze, stack).
function core.cdim(op, h, d, extra)
  local n = C.em_tensor_ndim(h) + (extra or 0)
  local m = n > 0 and n or 1
  if type(d) ~= 'number' or d % 1 ~= 0 then
    raise(('%s: dim must be an integer, got %s'):format(op,
      type(d) == 'number' and tostring(d) or kind(d)))
  end
  if d >= 1 and d <= m then return d - 1 end
  if d < 0 and d >= -m then return d + m end
  local range = d == 0 and ' (dims are 1-based)' or ''
  raise(('%s: dimension %d out of range for a %d-D tensor of shape %s%s'):format(op, d,
    n - (extra or 0), core.shape_str(h), range))
end

-- The finalizer of a cdata box whose _h the C function cfree releases: it nils the
-- handle first, so that a box released early (before the state closes) and again
-- by its finalizer frees once.
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

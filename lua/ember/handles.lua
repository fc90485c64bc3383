--[[
ember.handles -- how a C tensor handle lives and dies under Lua's GC.

A Lua tensor is an `em_box` cdata {_h = em_tensor*, _id}. The obvious way to
free the handle, ffi.gc(h, em_tensor_release) or a __gc metamethod on the box,
costs about 135 ns per object in LuaJIT's finalizer machinery alone (a hash
insert into the finalizer table, then a protected call per object from the
collector), more than the whole budget of a tiny `a + b`. So boxes carry no
finalizer. Instead:

  * every box gets a slot id; ptrs[id] (C memory) holds its handle, and a
    weak-valued table reg[id] holds the box. When the collector finds the box
    dead it clears reg[id] -- in bulk, in its atomic phase, without calls;
  * a sentinel userdata is re-created at every collection; its __gc (one per
    cycle) only sets a flag, and the next wrap() sweeps: it looks at the ids
    handed out since the last sweep (the nursery), releases those whose reg
    entry is gone and recycles their ids. Survivors stay one more cycle in the
    nursery (they may have been born after the atomic phase and not judged yet),
    then move to the old list, which is swept only when it has doubled or every
    16th sweep. So a sweep costs time in proportion to the garbage plus the
    young objects, not to every live tensor;
  * dead handles of small tensors are not released in one burst at the
    sweep: they queue, and each wrap() releases two, just before the next op
    allocates, so malloc hands the same blocks straight back (glibc takes a
    burst of frees of these 150-200 byte blocks badly: ~3x the cost). Big
    ones are released at once;
  * all bookkeeping except reg lives in C memory (realloc), so it does not
    inflate the Lua heap and with it the collector's pause. Each wrap adds a
    little GC debt (collectgarbage 'step' every 2048 wraps) so cycles keep up
    with tensor creation (this also restarts a collector the user stopped);
  * a full collection -- `collectgarbage()`, em.collect, or one ember starts
    itself -- releases every dead handle before it returns, old list and
    queue included, and runs another cycle while a round released anything
    (a tensor may have held the last reference to Lua objects that hold
    more): this file replaces the global collectgarbage with one that does,
    so that em.memory_stats() after it counts live tensors only. ember's own
    collections make one round;
  * big tensors are invisible to the Lua heap, so a full collection also runs
    when the C memory held by tensors has grown past max(64 MB, a quarter of
    what it was after the last sweep; under a cpu cap, memlimit.cap_slack). Host
    (cpu, meta) and device memory are judged apart: device memory gets a wider
    slack, up to 1 GiB (a 16th of cuda:0's memory at most), because a full
    collection costs ~50-250 us of host time, in which a GPU op of a few MB
    finishes (collecting every 64 MB of 16 MB results made `a + b` on 4M floats
    host-bound). The cached blocks stay in the CUDA allocator, so the slack is
    memory held, not asked again of the driver. Collection also runs when the
    CUDA allocator raised the state's memory pressure flag (a device past 80 %
    of its memory, or out of it); the allocator can't collect itself: Lua
    can't be entered from inside an op;
  * a training step collects at its two natural boundaries, so that its peak
    is what it needs and the same step after step: as a backward pass begins
    (before_backward), the forward's outputs autograd did not save are dead
    and go; as it ends (after_backward), the rest of the forward's go. Both
    only where 4 MB or more of tensors is held or the cpu has a cap (a tiny
    uncapped model's step costs less than a collection). Each step then
    starts from the same memory and collects at the same ops -- on the meta
    device too, so the planner's measured step holds what the real one holds.
    Code that runs many backwards per step and collects itself (a pipeline)
    turns this off around them (step_collects).

Measured on the development VM (2 cores, busy), `c = a + b` on 16-float
tensors including the eventual release: with ffi.gc on the handle ~600 ns,
with this ~170 ns on glibc malloc and ~130 ns with the ember command's caching
allocator (lua/host/alloc.c).
]]
local ffi = require 'ffi'
local core = require 'ember.ffi'
local C, S = core.C, core.S
local memlimit = require 'ember.memlimit'
local box_t = core.box_t
local tnew = require 'table.new'
local rel = C.em_tensor_release
local mem_allocated = C.em_memory_allocated
local realloc, cfree = core.process.em_host_realloc, core.process.em_host_free

local M = {}

local cap = 0
local ptrs, age, freeids, young, old       -- C arrays indexed by id / position
local pending, npending = nil, 0           -- dead small handles not yet released
local reg                                  -- weak: id -> box
local nfree, hi, ny, nold, nold_swept, sweeps = 0, 0, 0, 0, 0, 0
local dirty, debt = false, 0
local closing = false
local mem_limit = 64 * 2 ^ 20
local MEM_SLACK = 64 * 2 ^ 20
local DEBT_STEP = 2048                     -- wraps between GC debt steps
local STEP_KB = 64                         -- KB of debt charged per step

local function resize(n)
  local function re(p, ct, sz)
    local q = realloc(p, sz * (n + 1))
    if q == nil then error('ember: out of memory growing the tensor registry') end
    return ffi.cast(ct, q)
  end
  ptrs = re(ptrs, 'em_tensor **', 8)
  pending = re(pending, 'em_tensor **', 8)
  age = re(age, 'uint8_t *', 1)
  freeids = re(freeids, 'int32_t *', 4)
  young = re(young, 'int32_t *', 4)
  old = re(old, 'int32_t *', 4)
  -- A fresh weak table whose array part covers every id, so stores never fall
  -- into the hash part (where holes could make a rehash demote the array).
  local r = setmetatable(tnew(n + 1, 0), { __mode = 'v' })
  if reg then for i = 1, hi do r[i] = reg[i] end end
  reg = r
  cap = n
end
resize(4096)

-- One sentinel per GC cycle: its finalizer marks the registry dirty, and tells
-- whoever else asked (M.on_cycle: a finalizer may only set flags, so each
-- listener does the same).
local cycle_listeners = {}
local function sentinel()
  local u = newproxy(true)
  getmetatable(u).__gc = function()
    dirty = true
    for i = 1, #cycle_listeners do cycle_listeners[i]() end
    if not closing then sentinel() end
  end
end
sentinel()
function M.on_cycle(fn) cycle_listeners[#cycle_listeners + 1] = fn end

-- The next forced full collection (the essay's slacks): mem_limit is the cheap
-- test wrap() makes on the total, crossed no later than either the host's or
-- the devices' limit is; then check_limit() looks at the two apart.
local MB = 2 ^ 20
local DEV_SLACK_MAX = 2 ^ 30
local dstats = ffi.new('em_device_memory_stats')
local host_limit, dev_limit = 0, 0
local dev_slack_v               -- found once a device holds tensors
local eager = false             -- M.eager: collect at every new tensor

local function held(device)
  if C.em_device_memory(S, device, dstats) ~= 0 then return 0 end
  return tonumber(dstats.allocated)
end

-- The slack for device memory: 1 GiB, or a 16th of cuda:0's memory if less.
local function dev_slack()
  if dev_slack_v then return dev_slack_v end
  local v = DEV_SLACK_MAX
  if C.em_device_memory(S, 0, dstats) == 0 and dstats.capacity > 0 then
    v = math.min(v, tonumber(dstats.capacity) / 16)
  end
  dev_slack_v = math.max(v, MEM_SLACK)
  return dev_slack_v
end
-- The total now, split into host and device bytes.
local function split()
  local m = tonumber(mem_allocated(S))
  local host = held(-1) + held(-2)
  local dev = m - host
  return m, host, dev > 0 and dev or 0
end

local function host_cap()      -- the cpu's cap (em.set_memory_limit, --memory-limit), or 0
  if C.em_device_memory(S, C.EM_CPU, dstats) ~= 0 then return 0 end
  return tonumber(dstats.capacity)
end

local function set_limit()
  local m, host, dev = split()
  local hs, cap = host * 0.25 > MEM_SLACK and host * 0.25 or MEM_SLACK, host_cap()
  if cap > 0 then hs = memlimit.cap_slack(cap, host) end
  local ds = dev * 0.25 > MEM_SLACK and dev * 0.25 or MEM_SLACK
  if dev > 0 and dev_slack() > ds then ds = dev_slack() end
  host_limit, dev_limit = host + hs, dev + ds
  mem_limit = eager and -1 or m + (hs < ds and hs or ds)
end

-- The total passed mem_limit: true when either limit is passed; otherwise moves
-- mem_limit up to the nearer of the two.
local function check_limit()
  if eager then return true end
  local m, host, dev = split()
  if host > host_limit or dev > dev_limit then return true end
  local h, d = host_limit - host, dev_limit - dev
  mem_limit = m + (h < d and h or d)
  return false
end

-- A dead handle: big ones are released now; small ones queue, and wrap()
-- releases two per call, just before the next op allocates -- so glibc's
-- per-thread cache hands the same blocks straight back instead of taking a
-- burst of frees (which costs it ~3x more per tensor).
local numel = C.em_tensor_numel
local SMALL = 4096
local released = 0     -- handles let go of, for a full collection's rounds
local function drop(p)
  released = released + 1
  if npending < cap and numel(p) <= SMALL then
    pending[npending] = p; npending = npending + 1
  else
    rel(p)
  end
end

local function flush()
  for i = 0, npending - 1 do rel(pending[i]) end
  npending = 0
end
M.flush = flush

local function scan_old()
  local n, f = 0, nfree
  for i = 0, nold - 1 do
    local id = old[i]
    if reg[id] == nil then
      local p = ptrs[id]
      if p ~= nil then drop(p); ptrs[id] = nil end
      freeids[f] = id; f = f + 1
    else
      old[n] = id; n = n + 1
    end
  end
  nfree, nold, nold_swept = f, n, n
end

local function sweep()
  dirty = false
  local n, f = 0, nfree
  for i = 0, ny - 1 do
    local id = young[i]
    if reg[id] == nil then
      local p = ptrs[id]
      if p ~= nil then drop(p); ptrs[id] = nil end
      freeids[f] = id; f = f + 1
    elseif age[id] == 0 then
      age[id] = 1; young[n] = id; n = n + 1
    else
      old[nold] = id; nold = nold + 1
    end
  end
  nfree, ny = f, n
  sweeps = sweeps + 1
  if nold > 2 * nold_swept + 256 or sweeps % 16 == 0 then scan_old() end
  set_limit()
end
M.sweep = sweep

local pressure = C.em_memory_pressure_flag(S)   -- set by the CUDA allocator

-- After a full cycle of Lua's collector every dead box is known: release all
-- their handles now, the old list's and the queued small ones too.
local function release_dead()
  sweep()
  scan_old()
  flush()
  set_limit()
end

-- collectgarbage() and collectgarbage('collect') release what they found dead
-- before they return; everything else is Lua's own. A released tensor may have
-- been the last hold on Lua objects (a custom autograd node's record, and the
-- module its closure keeps), which only another cycle finds dead: the rounds
-- go on while one releases anything, four at most. The global is looked up at
-- each call (a caller may wrap it: the planner's measurement does).
local lua_collectgarbage = collectgarbage
local max_rounds = 4
local function full_rounds()
  for round = 1, max_rounds do
    released = 0
    release_dead()
    if released == 0 or round == max_rounds then return end
    lua_collectgarbage()
  end
end
local function collectgarbage_releasing(what, ...)
  local r = lua_collectgarbage(what, ...)
  if (what == nil or what == 'collect') and ptrs then full_rounds() end
  return r
end
_G.collectgarbage = collectgarbage_releasing

-- A collection ember starts itself: one round (what the released tensors alone
-- kept goes at the next collection).
local function paced_collect()
  pressure[0] = 0
  max_rounds = 1
  local ok, err = pcall(collectgarbage)   -- (a finalizer may raise)
  max_rounds = 4
  if not ok then error(err, 0) end
end

-- Collect everything unreachable now and release its C memory. Two cycles at
-- least: a finalizer that ran in the first may have dropped the last reference
-- to tensors only the second finds dead.
local function collect()
  pressure[0] = 0
  lua_collectgarbage()
  full_rounds()
  collectgarbage()   -- the global: a caller's wrapper sees a full collection
end
M.collect = collect
core.collect = collect     -- for core.fail, after a device ran out of memory

-- A backward pass begins, and ends: the collections of the essay's last point.
local STEP_MIN = 4 * MB
local step_collects = true
local function step_worth()
  return step_collects and (tonumber(mem_allocated(S)) >= STEP_MIN or host_cap() > 0)
end
function M.before_backward()
  if step_worth() then paced_collect() end
end
-- (backwards: how many have run, for the profiler: a loader's step that ran none
-- is no training step)
M.backwards = 0
function M.after_backward()
  M.backwards = M.backwards + 1
  if step_worth() then paced_collect() end
end

-- step_collects(false): no collections as backward passes begin and end, for
-- code that runs many backwards a step and collects itself (a pipeline's
-- micro-batches). Returns the previous setting.
function M.step_collects(on)
  local was = step_collects
  step_collects = on and true or false
  return was
end

-- eager(true): a full collection before every new tensor (dead tensors go at
-- once, as under reference counting), for measuring what a computation must
-- hold -- the step-peak benchmark's "needs" -- never for running one.
function M.eager(on)
  eager = on and true or false
  set_limit()
end

-- Releases box b's handle now, for library code that knows b is its own and
-- dead (a sharded model's gather buffers: megabytes that must not wait for a
-- collection). b must not be used after; its id is recycled by a later sweep.
function M.release(b)
  local id = b._id
  local p = ptrs[id]
  if p ~= nil and p == b._h then
    rel(p)
    ptrs[id] = nil
  end
  b._h = nil
end

local function pace()
  debt = 0
  collectgarbage('step', STEP_KB)
end

-- Take ownership of one reference to handle h and return its Lua tensor.
local function wrap(h)
  if dirty then sweep() end
  local id
  if nfree > 0 then
    nfree = nfree - 1; id = freeids[nfree]
  else
    hi = hi + 1
    if hi >= cap then resize(cap * 2) end
    id = hi
  end
  ptrs[id] = h; age[id] = 0
  local b = box_t(h, id)
  reg[id] = b
  young[ny] = id; ny = ny + 1
  if npending > 0 then
    npending = npending - 1; rel(pending[npending])
    if npending > 0 then npending = npending - 1; rel(pending[npending]) end
  end
  debt = debt + 1
  if debt >= DEBT_STEP then pace() end
  if pressure[0] ~= 0 or (mem_allocated(S) > mem_limit and check_limit()) then
    paced_collect()
  end
  return b
end
M.wrap = wrap

function M.stats()
  return { slots = hi, young = ny, old = nold, free = nfree, sweeps = sweeps,
    live = hi - nfree }
end

-- At lua_close: every handle still held goes, then the registry itself.
table.insert(core.on_close, function()
  closing = true
  if _G.collectgarbage == collectgarbage_releasing then _G.collectgarbage = lua_collectgarbage end
  flush()
  for id = 1, hi do
    local p = ptrs[id]
    if p ~= nil then rel(p); ptrs[id] = nil end
  end
  for _, p in ipairs({ ptrs, pending, age, freeids, young, old }) do cfree(p) end
  ptrs, hi = nil, 0
end)

core.wrap = wrap
core.handles = M
return M

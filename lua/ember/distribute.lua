--[[
ember.distribute -- the mirrored strategy (API.md, "em.distribute"): one script
runs as N replicas, each training a full copy of the model on its share of the
data, with gradients averaged across replicas during backward.

  local s = em.distribute.mirrored{backend = 'auto', timeout = 300}
  local dm = s:wrap(model)                -- ember.distribute.wrap
  local loader = s:shard(ds):batch(128):loader{}
  s:allreduce(t, 'mean'); s:broadcast(t, 0); s:allgather(t); s:reduce_scatter(t)
  s:barrier(); s:check_replicas(model); s.rank, s.world_size, s:is_main()
  s:send(t, rank); s:recv(t, rank)        -- point-to-point; {async = true} as well
  local g = s:group{1, 3}                 -- a strategy of some replicas: g:wrap(model) ...

Which replica this Lua state is. `ember --replicas N` runs N threads and gives
each Lua state the global EMBER_REPLICA = {rank, world_size, group, threads}; the
communicator is then `local` (shared memory through that group). Under mpirun (or
another MPI launcher, recognised from the environment by em_mpi_launched) it is
`mpi`. Otherwise the script is a single replica: a local group of one, where every
collective is a copy at most, so the same script runs unchanged on 1 to N
replicas.

Which device. `ember --devices cuda:0,cuda:1 ...` (or the environment variable
EMBER_DEVICES, the same list) gives replica k -- thread rank k, or the MPI
process of local rank k -- device k mod #list; 'cpu' is a device too. Without a
list, MPI processes on a host with real GPUs take cuda:<local rank mod device
count> (the usual one GPU per process), and everything else stays on the CPU.
A replica on a CUDA device is a GPU replica: 'auto' picks the `nccl`
communicator (core/dist/nccl.c: NCCL on real GPUs; on emulated devices the
local group or MPI through host memory), its collectives take tensors on that
device, and wrap moves the model there. NCCL refuses two ranks on one GPU, so
where two replicas share a real GPU (--devices cuda:0,cuda:0) 'auto' picks the
host communicator instead, and an explicit 'nccl' fails saying so. 'local' and
'mpi' keep GPU replicas on their GPUs as well (core/dist/staged.c): each
collective copies its device buffers to pinned host memory and back on the
device's communication stream, ordered against the compute stream as NCCL's
would be, so the reducer's buckets still overlap backward. EMBER_DIST_BACKEND
names the backend for strategies that name none.

One communicator per backend and Lua state: a second mirrored{} shares it (MPI
can be initialised only once per process). Communicators and reducers are freed
before the state closes (core.on_close) -- a reducer also as soon as its wrapped
model is collected -- and when the script fails the host calls _abort(message),
which fails them so that the other replicas hear about it.

The strategy's methods live by concern in distribute/: collective.lua (the
collectives), p2p.lua (send / recv), group.lua (group / split), over the
communicator and work handles of comm.lua.
]]
local ffi = require 'ffi'
local em = require 'ember'
local core = require 'ember.ffi'
local cm = require 'ember.distribute.comm'
local C, S = core.C, core.S
local raise = core.raise

local M = {}

-- Every box of a communicator, work or reducer (wrap.lua, shard.lua), freed in order
-- when the state closes (distribute/comm.lua).
M._track = cm.track
local comms, commbox_t, free_comm = cm.comms, cm.commbox_t, cm.free_comm

-- -- Where this replica is -----------------------------------------------------------------
local replica = rawget(_G, 'EMBER_REPLICA')
local mpi_rank, mpi_size = ffi.new('int[1]'), ffi.new('int[1]')
local function mpi_launched()
  return C.em_mpi_launched(mpi_rank, mpi_size) ~= 0 and mpi_size[0] > 1
end

-- -- Which device this replica is on ---------------------------------------------------------
-- The launcher's local rank of this process (one host's processes count 0, 1, ...).
local function local_rank()
  for _, v in ipairs { 'OMPI_COMM_WORLD_LOCAL_RANK', 'MPI_LOCALRANKID', 'SLURM_LOCALID',
                       'PMI_LOCAL_RANK', 'PMIX_LOCAL_RANK' } do
    local n = tonumber(os.getenv(v) or '')
    if n then return n end
  end
  return mpi_rank[0]
end

-- 'cpu' -> -1, 'cuda' -> 0, 'cuda:N' -> N; nil for anything else.
local function device_index(d)
  if d == 'cpu' then return -1 end
  if d == 'cuda' then return 0 end
  local n = type(d) == 'string' and d:match('^cuda:(%d+)$')
  return n and tonumber(n) or nil
end

-- The device of this host's replica k: entry k mod the count of --devices /
-- EMBER_DEVICES; without a list, MPI processes on real GPUs take one GPU each
-- (local rank mod the device count), everything else the CPU.
local function device_rule()
  local list = os.getenv('EMBER_DEVICES')
  if list and list ~= '' then
    local devs = {}
    for d in list:gmatch('[^,%s]+') do
      if not device_index(d) then
        raise(("mirrored: --devices / EMBER_DEVICES: '%s' is not a device ('cpu', 'cuda' " ..
          "or 'cuda:N'), in '%s'"):format(d, list))
      end
      devs[#devs + 1] = d == 'cuda' and 'cuda:0' or d
    end
    if #devs == 0 then raise("mirrored: EMBER_DEVICES is empty") end
    return function(k) return devs[k % #devs + 1] end
  end
  if mpi_launched() and not replica then      -- one GPU per process, real GPUs only
    local ok, n = pcall(function() return em.cuda.device_count() end)
    if ok and n > 0 and not em.cuda.emulated() then
      return function(k) return 'cuda:' .. (k % n) end
    end
  end
  return function() return 'cpu' end
end

-- How many replicas of this host the rule deals devices to (the threads of
-- --replicas, or the launcher's processes here); nil when the launcher does not say.
local function local_count()
  if replica and replica.group then return replica.world_size end
  if not mpi_launched() then return 1 end
  for _, v in ipairs { 'OMPI_COMM_WORLD_LOCAL_SIZE', 'MPI_LOCALNRANKS', 'PMI_LOCAL_SIZE',
                       'PMIX_LOCAL_SIZE' } do
    local n = tonumber(os.getenv(v) or '')
    if n then return n end
  end
end

-- This replica's device, and the GPU that two replicas of this host share (nil
-- when none does): every replica finds the same one, so all pick one backend.
local function pick_device()
  local rule = device_rule()
  local k = replica and replica.rank or (mpi_launched() and local_rank()) or 0
  local seen, shared = {}, nil
  for j = 0, (local_count() or 1) - 1 do
    local d = rule(j)
    if d ~= 'cpu' and seen[d] and not shared then shared = d end
    seen[d] = true
  end
  return rule(k), shared
end

-- The host communicator: threads of --replicas, MPI processes, or a single replica.
local function host_backend()
  if replica and replica.group then return 'local' end
  if mpi_launched() then return 'mpi' end
  return 'local'
end

-- The backend a replica on `device` runs ('auto' resolved). NCCL refuses two
-- ranks on one GPU, so where two replicas share a real one (`shared`, `native`)
-- 'auto' takes the host communicator, which stages device buffers through host
-- memory; emulated devices stage under 'nccl' already and may be shared.
function M._choose_backend(backend, device, shared, native)
  if backend == 'auto' then
    if device ~= 'cpu' and not (shared and native) then return 'nccl' end
    return host_backend()
  end
  if backend == 'nccl' and device ~= 'cpu' and shared and native then
    raise(("mirrored: NCCL refuses two replicas on one GPU (%s twice); use backend = '%s'")
      :format(shared, host_backend()))
  end
  return backend
end

local single_group   -- a local group of one, for a plain `ember script.lua`

local function open_comm(backend, timeout, device)
  if comms[backend] then return comms[backend] end
  local out = ffi.new('em_comm*[1]')
  local st
  local gpu = device_index(device) or -1
  if backend == 'local' then
    local g, rank
    if replica and replica.group then
      g, rank = ffi.cast('em_local_group *', replica.group), replica.rank
    else
      if mpi_launched() then
        raise('mirrored: this process was started by an MPI launcher as one of ' ..
          mpi_size[0] .. " processes; the 'local' backend joins threads of one process " ..
          "(ember --replicas N); use backend = 'mpi' or 'auto'")
      end
      single_group = single_group or ffi.gc(C.em_local_group_new(1), C.em_local_group_release)
      g, rank = single_group, 0
    end
    -- a GPU replica of a host communicator stays on its GPU, staged through host memory
    if gpu >= 0 then st = C.em_comm_staged(S, gpu, g, rank, timeout, out)
    else st = C.em_comm_local(S, g, rank, timeout, out) end
  elseif backend == 'mpi' then
    if replica and replica.group then
      raise("mirrored: backend 'mpi' was asked for, but this script runs as threads of one " ..
        "process (ember --replicas); use backend = 'local' or 'auto'")
    end
    if gpu >= 0 then st = C.em_comm_staged(S, gpu, nil, 0, timeout, out)
    else st = C.em_comm_mpi(S, timeout, out) end
  elseif backend == 'nccl' then
    local dev = device_index(device)
    if dev < 0 then
      raise("mirrored: backend 'nccl' needs GPU replicas: this replica's device is cpu " ..
        "(ember --devices cuda:0,cuda:1 ..., or EMBER_DEVICES); use 'auto', 'local' or 'mpi'")
    end
    local g, rank = nil, 0
    if replica and replica.group then
      g, rank = ffi.cast('em_local_group *', replica.group), replica.rank
    elseif not mpi_launched() then
      single_group = single_group or ffi.gc(C.em_local_group_new(1), C.em_local_group_release)
      g = single_group
    end
    st = C.em_comm_nccl(S, dev, g, rank, timeout, out)
  else
    raise(("mirrored: unknown backend %s (expected 'auto', 'local', 'mpi' or 'nccl')")
      :format(type(backend) == 'string' and "'" .. backend .. "'" or core.kind(backend)))
  end
  if st ~= 0 then core.fail() end
  local box = M._track(commbox_t(out[0]), free_comm)
  comms[backend] = box
  return box
end

-- -- The strategy ------------------------------------------------------------------------------
local Strategy = {}
Strategy.__index = Strategy
M.Strategy = Strategy

function M.mirrored(o)
  o = o or {}
  if type(o) ~= 'table' then raise('mirrored: expected an options table, got ' .. core.kind(o)) end
  for k in pairs(o) do
    if k ~= 'backend' and k ~= 'timeout' then
      raise(("mirrored: unknown option '%s' (backend, timeout)"):format(tostring(k)))
    end
  end
  local timeout = o.timeout or 300
  if type(timeout) ~= 'number' or timeout <= 0 then
    raise('mirrored: timeout must be a number of seconds > 0, got ' .. tostring(timeout))
  end
  -- EMBER_DIST_BACKEND names the backend of strategies whose script does not, so
  -- that an unchanged script (and the pipeline's own strategy) runs on another
  local env = os.getenv('EMBER_DIST_BACKEND')
  local backend = o.backend or (env ~= '' and env) or 'auto'
  local device, shared = pick_device()
  -- (emulated devices behave as real ones under the stand-in NCCL: nccl_emu.c)
  local native = device ~= 'cpu' and
    (not em.cuda.emulated() or os.getenv('EMBER_NCCL_EMULATE') == '1')
  backend = M._choose_backend(backend, device, shared, native)
  local box = open_comm(backend, timeout, device)
  local c = box._h
  -- 'cuda' is this replica's GPU from now on
  if device:match('^cuda:') then em.cuda.set_device(device) end
  return setmetatable({
    _box = box, backend = backend, timeout = timeout,
    rank = C.em_comm_rank(c), world_size = C.em_comm_size(c), device = device,
  }, Strategy)
end

function Strategy:is_main() return self.rank == 0 end
function Strategy:__tostring()
  if self.parent then
    return ('group strategy: replica %d of %d (ranks %s of the parent, %s, %s)'):format(
      self.rank, self.world_size, table.concat(self.ranks, ', '), self.backend, self.device)
  end
  return ('mirrored strategy: replica %d of %d (%s, %s)'):format(self.rank, self.world_size,
    self.backend, self.device)
end

function Strategy:shard(ds, o)
  if (type(ds) ~= 'table' and type(ds) ~= 'cdata') or not pcall(function() return ds.shard end) then
    raise('shard: expected a dataset, got ' .. core.kind(ds))
  end
  return ds:shard(self.rank, self.world_size, o)
end

-- -- Checks ---------------------------------------------------------------------------------------
-- Do all replicas hold the same parameters (and buffers)? One float64 checksum per
-- tensor (the sum of its values and of its values weighted by position, so that
-- a permutation shows too), allgathered: every replica sees every checksum and
-- reaches the same verdict. Returns true, or false and a message naming the first
-- tensor that differs and the replicas that disagree.
function Strategy:check_replicas(model)
  if type(model) ~= 'table' or not model.named_parameters then
    raise('check_replicas: expected a model (em.nn.Module or a wrapped model), got ' ..
      core.kind(model))
  end
  local m = model.module or model
  local named = m:named_parameters()
  for _, nb in ipairs(m:named_buffers()) do named[#named + 1] = nb end
  local sums = em.zeros(#named * 2, { dtype = 'float64' })
  em.no_grad(function()
    for i, np in ipairs(named) do
      local v = np[2]:detach():to('cpu'):double():flatten()   -- GPU replicas too
      local n = v:numel()
      sums[2 * i - 1] = v:sum():item()
      sums[2 * i] = n > 0 and (v * em.arange(1, n + 1, { dtype = 'float64' })):sum():item() or 0
    end
  end)
  local all = self:allgather(sums:view(1, -1))    -- (world_size, 2 * #named)
  local rows = all:totable()
  for i, np in ipairs(named) do
    local bad = {}
    for r = 2, #rows do
      if rows[r][2 * i - 1] ~= rows[1][2 * i - 1] or rows[r][2 * i] ~= rows[1][2 * i] then
        bad[#bad + 1] = r - 1
      end
    end
    if #bad > 0 then
      return false, ('check_replicas: %s differs between replicas: replica%s %s disagree%s ' ..
        'with replica 0'):format(np[1], #bad > 1 and 's' or '', table.concat(bad, ', '),
        #bad > 1 and '' or 's')
    end
  end
  return true
end

-- -- Collectives, point-to-point, groups ------------------------------------------------------
for _, part in ipairs({ 'collective', 'p2p', 'group' }) do
  for k, f in pairs(require('ember.distribute.' .. part)) do Strategy[k] = f end
end

-- -- Wrapping -------------------------------------------------------------------------------------
function Strategy:wrap(model, o)
  return require('ember.distribute.wrap').wrap(self, model, o)
end

-- A pipeline over this strategy's replicas (ember.distribute.pipeline).
function Strategy:pipeline(model, o)
  return require('ember.distribute.pipeline').pipeline(model, o, self)
end
function M.pipeline(model, o)
  return require('ember.distribute.pipeline').pipeline(model, o)
end
-- The planner (ember.distribute.plan): whether and how a model fits N devices.
function M.plan(model, o) return require('ember.distribute.plan')(model, o) end

-- Called by the ember command when the script failed: every communicator of this
-- state fails, and the other replicas hear "replica K failed: <message>".
function M._abort(message)
  for _, box in pairs(comms) do
    if box._h ~= nil then C.em_comm_abort(box._h, tostring(message)) end
  end
end

-- This replica's rank without making a strategy (the loader draws progress on 0).
function M.replica() return replica and replica.rank or (mpi_launched() and mpi_rank[0]) or 0 end

return M

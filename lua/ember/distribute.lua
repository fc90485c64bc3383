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
device, and wrap moves the model there.

One communicator per backend and Lua state: a second mirrored{} shares it (MPI
can be initialised only once per process). Communicators and reducers are freed
before the state closes (core.on_close) -- a reducer also as soon as its wrapped
model is collected -- and when the script fails the host calls _abort(message),
which fails them so that the other replicas hear about it.
]]
local ffi = require 'ffi'
local em = require 'ember'
local core = require 'ember.ffi'
local C, S = core.C, core.S
local raise = core.raise

local M = {}

ffi.cdef [[ typedef struct em_commbox { em_comm *_h; } em_commbox;
            typedef struct em_workbox { em_comm_work *_h; } em_workbox; ]]
local commbox_t, workbox_t = ffi.typeof('em_commbox'), ffi.typeof('em_workbox')

-- -- Lifetime ----------------------------------------------------------------------------
local live = setmetatable({}, { __mode = 'k' })   -- box -> release function
function M._track(obj, release) live[obj] = release; return obj end
local releaser = core.releaser
local free_comm, free_work = releaser(C.em_comm_free), releaser(C.em_comm_work_free)
local free_group = releaser(C.em_comm_free)     -- a group goes before its parent

-- A group whose strategy was collected (a dropped pipeline's stage group) is
-- freed -- its comm thread joined, its channels given back -- at the next safe
-- point, not inside the collector: a work of the group collected in the same
-- cycle must be waited for and freed first, and the collector runs finalizers
-- in no set order. The safe points: the next collective or group made, and the
-- state's close. (Freeing it on one replica while another still holds its own
-- is safe: a group moves no byte itself, see core/dist/group.c.)
local dead_groups = {}
local function group_collected(box)
  if box._h ~= nil then
    dead_groups[#dead_groups + 1] = ffi.cast('em_comm *', box._h)
    box._h = nil
  end
end
local function free_dead_groups()
  for i = #dead_groups, 1, -1 do
    local h = dead_groups[i]
    dead_groups[i] = nil
    C.em_comm_free(h)
  end
end

-- Works first (they hold tensors and wait for their collective), then reducers
-- (registered by wrap.lua), then groups, then communicators.
local comms = {}            -- backend name -> comm box
core.on_close[#core.on_close + 1] = function()
  for obj, release in pairs(live) do if release == free_work then release(obj) end end
  for obj, release in pairs(live) do
    if release ~= free_work and release ~= free_comm and release ~= free_group then release(obj) end
  end
  free_dead_groups()
  for obj, release in pairs(live) do if release == free_group then release(obj) end end
  for obj, release in pairs(live) do release(obj) end
end

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

local function pick_device()
  local list = os.getenv('EMBER_DEVICES')
  local k = replica and replica.rank or (mpi_launched() and local_rank()) or 0
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
    return devs[k % #devs + 1]
  end
  if mpi_launched() and not replica then      -- one GPU per process, real GPUs only
    local ok, n = pcall(function() return em.cuda.device_count() end)
    if ok and n > 0 and not em.cuda.emulated() then return 'cuda:' .. (k % n) end
  end
  return 'cpu'
end

-- The backend 'auto' picks, and why.
local function auto_backend(device)
  if device ~= 'cpu' then return 'nccl' end
  if replica and replica.group then return 'local' end
  if mpi_launched() then return 'mpi' end
  return 'local'
end

local single_group   -- a local group of one, for a plain `ember script.lua`

local function open_comm(backend, timeout, device)
  if comms[backend] then return comms[backend] end
  local out = ffi.new('em_comm*[1]')
  local st
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
    st = C.em_comm_local(S, g, rank, timeout, out)
  elseif backend == 'mpi' then
    if replica and replica.group then
      raise("mirrored: backend 'mpi' was asked for, but this script runs as threads of one " ..
        "process (ember --replicas); use backend = 'local' or 'auto'")
    end
    st = C.em_comm_mpi(S, timeout, out)
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
  local backend = o.backend or 'auto'
  local device = pick_device()
  if backend == 'auto' then backend = auto_backend(device) end
  -- a host communicator moves CPU tensors: its replicas are CPU replicas
  if backend ~= 'nccl' then device = 'cpu' end
  local box = open_comm(backend, timeout, device)
  local c = box._h
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

local function comm(self, op)
  if dead_groups[1] then free_dead_groups() end
  local c = self._box._h
  if c == nil then raise(op .. ': the strategy was closed') end
  return c
end

function Strategy:shard(ds, o)
  if (type(ds) ~= 'table' and type(ds) ~= 'cdata') or not pcall(function() return ds.shard end) then
    raise('shard: expected a dataset, got ' .. core.kind(ds))
  end
  return ds:shard(self.rank, self.world_size, o)
end

-- -- Collectives ---------------------------------------------------------------------------------
local ops = { sum = 0, mean = 1, max = 2, min = 3 }
local function op_id(name, where)
  local id = ops[name or 'sum']
  if not id then
    raise(("%s: unknown reduction %s (expected 'sum', 'mean', 'max' or 'min')"):format(where,
      type(name) == 'string' and "'" .. name .. "'" or core.kind(name)))
  end
  return id
end

-- Trailing arguments: (x, opts) or (opts) or (x) where opts = {async = true}.
local function split_opts(a, b)
  if type(a) == 'table' and b == nil then return nil, a end
  if b ~= nil and type(b) ~= 'table' then raise('expected an options table {async = true}') end
  return a, b or {}
end

local Work = {}
Work.__index = Work
local workout = ffi.new('em_comm_work*[1]')
local done_buf = ffi.new('int[1]')

-- Runs a collective: synchronously, or as a handle whose wait() returns the
-- result: t (in place), or the new tensor start left in out[0]. Values, not a
-- closure over them: a LuaJIT trace through a call keeps the called closure as
-- a constant, and with it the tensors it captured, until the trace is flushed
-- (a model's original weights, broadcast when it was wrapped, say). start's
-- closures capture raw handles only.
local function run(self, async, start, t, out)
  if not async then
    if start(nil) ~= 0 then core.fail() end
    if out then return core.wrap(out[0]) end
    return t
  end
  if start(workout) ~= 0 then core.fail() end
  local result = t
  if out then result = core.wrap(out[0]) end
  -- (a handle dropped unwaited is waited for and freed when it is collected: it
  -- holds the collective's tensors)
  local box = M._track(ffi.gc(workbox_t(workout[0]), free_work), free_work)
  -- (_strategy: a group's work keeps the group alive until it is done with)
  return setmetatable({ _box = box, _result = result, _strategy = self }, Work)
end

function Work:wait()
  local h = self._box._h
  if h ~= nil then
    local st = C.em_comm_work_wait(S, h)
    if st ~= 0 then
      local msg = core.errmsg()
      free_work(self._box)
      error(msg, core.blame_level())
    end
    free_work(self._box)
  end
  return self._result
end

function Work:done()
  local h = self._box._h
  if h == nil then return true end
  C.em_comm_work_test(S, h, done_buf)
  return done_buf[0] ~= 0
end

function Strategy:allreduce(t, op, o)
  op, o = split_opts(op, o)
  local h = core.H(t, 'allreduce', 1)
  local id, c = op_id(op, 'allreduce'), comm(self, 'allreduce')
  return run(self, o.async, function(w) return C.em_comm_allreduce(S, c, h, id, w) end, t)
end

function Strategy:broadcast(t, root, o)
  root, o = split_opts(root, o)
  local h = core.H(t, 'broadcast', 1)
  root = root or 0
  if type(root) ~= 'number' or root % 1 ~= 0 then
    raise('broadcast: root must be a rank (0-based integer), got ' .. tostring(root))
  end
  local c = comm(self, 'broadcast')
  return run(self, o.async, function(w) return C.em_comm_broadcast(S, c, h, root, w) end, t)
end

local function out_collective(self, name, t, start, o)
  local h = core.H(t, name, 1)
  local c = comm(self, name)
  local out = ffi.new('em_tensor*[1]')
  return run(self, o.async, function(w) return start(c, h, out, w) end, nil, out)
end

function Strategy:allgather(t, o)
  if o ~= nil and type(o) ~= 'table' then raise('allgather: expected an options table {async = true}') end
  return out_collective(self, 'allgather', t, function(c, h, out, w)
    return C.em_comm_allgather(S, c, h, out, w)
  end, o or {})
end

function Strategy:reduce_scatter(t, op, o)
  op, o = split_opts(op, o)
  local id = op_id(op, 'reduce_scatter')
  return out_collective(self, 'reduce_scatter', t, function(c, h, out, w)
    return C.em_comm_reduce_scatter(S, c, h, id, out, w)
  end, o)
end

-- Point-to-point: the k-th send to a rank meets that rank's k-th recv from this
-- one. A send returns once the peer has the values (use async sends when two
-- replicas send to each other first); recv fills t in place.
local function p2p(self, name, t, rank, o, start)
  o = o or {}
  if type(o) ~= 'table' then raise(name .. ': expected an options table {async = true}') end
  local h = core.H(t, name, 1)
  if type(rank) ~= 'number' or rank % 1 ~= 0 or rank < 0 or rank >= self.world_size
     or rank == self.rank then
    raise(('%s: rank must be another replica of this job (0..%d, this one is %d), got %s')
      :format(name, self.world_size - 1, self.rank, tostring(rank)))
  end
  local c = comm(self, name)
  return run(self, o.async, function(w) return start(c, h, rank, w) end, t)
end

function Strategy:send(t, rank, o)
  return p2p(self, 'send', t, rank, o,
    function(c, h, r, w) return C.em_comm_send(S, c, h, r, w) end)
end

function Strategy:recv(t, rank, o)
  return p2p(self, 'recv', t, rank, o,
    function(c, h, r, w) return C.em_comm_recv(S, c, h, r, w) end)
end

function Strategy:barrier(o)
  o = o or {}
  local c = comm(self, 'barrier')
  return run(self, o.async, function(w) return C.em_comm_barrier(S, c, w) end, nil)
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

-- -- Groups -------------------------------------------------------------------------------------
-- s:group(ranks): a strategy of some of s's replicas (core/dist/group.c), for
-- instance one pipeline stage's replicas {p, p + P, p + 2P, ...}. Every member
-- calls it with the same ranks (ascending, 0-based ranks of s); the result is a
-- strategy like s -- rank is this replica's index in ranks, world_size #ranks --
-- whose collectives, send / recv and wrap (any shard mode) stay among the members,
-- with `parent` (s) and `ranks` besides. Its bytes travel by s's point-to-point on
-- channels of its own, so s's sends between the same replicas never mix with it.
function Strategy:group(ranks)
  if type(ranks) ~= 'table' then
    raise('group: expected a list of ranks, got ' .. core.kind(ranks))
  end
  local n = #ranks
  local arr = ffi.new('int[?]', math.max(n, 1))
  local copy = {}
  for i = 1, n do
    local r = ranks[i]
    if type(r) ~= 'number' or r % 1 ~= 0 then
      raise(('group: ranks[%d] must be a rank (0-based integer), got %s'):format(i, tostring(r)))
    end
    arr[i - 1], copy[i] = r, r
  end
  local c = comm(self, 'group')
  local out = ffi.new('em_comm*[1]')
  if C.em_comm_group(S, c, n, arr, out) ~= 0 then core.fail() end
  local box = M._track(ffi.gc(commbox_t(out[0]), group_collected), free_group)
  local g = box._h
  return setmetatable({
    _box = box, backend = ffi.string(C.em_comm_backend(g)), timeout = self.timeout,
    rank = C.em_comm_rank(g), world_size = C.em_comm_size(g), device = self.device,
    parent = self, ranks = copy,
  }, Strategy)
end

-- s:split(color): every replica of s calls it; those that pass the same color
-- (an integer) form one group, in the order of their ranks in s.
function Strategy:split(color)
  if type(color) ~= 'number' or color % 1 ~= 0 then
    raise('split: color must be an integer, got ' .. tostring(color))
  end
  local all = self:allgather(em.tensor({ color }, { dtype = 'int64' }):to(self.device))
  local ranks = {}
  for r, v in ipairs(all:to('cpu'):totable()) do
    if v == color then ranks[#ranks + 1] = r - 1 end
  end
  return self:group(ranks)
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

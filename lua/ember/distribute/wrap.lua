--[[
ember.distribute.wrap -- s:wrap(model, {bucket_mb = 25, broadcast_buffers = true,
find_unused = false}): the model whose gradients are averaged across replicas.

  local dm = s:wrap(model)
  local loss = F.cross_entropy(dm(x), y)
  loss:backward()          -- returns with the same averaged .grad on every replica
  dm:no_sync(fn, ...)      -- fn runs with averaging off (gradient accumulation)

On a GPU replica (s.device 'cuda:N') wrap first moves the model to that device.
Wrapping broadcasts the parameters and buffers from replica 0, so that every
replica starts from the same model whatever its own initialisation did. The
averaging itself is C (core/dist/reducer.c): gradient hooks on the parameters
fill buckets in reverse registration order and start each bucket's allreduce as
soon as it is full, while backward goes on; an end-of-backward callback waits for
them. dm(x) arms it (when grad mode is on), so a backward that does not follow a
forward through dm -- or one under no_sync -- averages nothing.

dm.module is the model; every other method and field (parameters, state_dict,
train, eval, ...) passes through to it, so optimizers and checkpoints take dm or
dm.module alike.
]]
local ffi = require 'ffi'
local em = require 'ember'
local core = require 'ember.ffi'
local dist = require 'ember.distribute'
local memory_kinds = require 'ember.memory_kinds'
local C, S = core.C, core.S
local raise = core.raise

local M = {}

ffi.cdef [[ typedef struct em_reducerbox { em_reducer *_h; } em_reducerbox; ]]
local reducerbox_t = ffi.typeof('em_reducerbox')
local free_reducer = core.releaser(C.em_reducer_free)

local MB = 1024 * 1024
local FIRST_BUCKET_MB = 1      -- small, so that communication starts early

local DistributedModel = {}
M.DistributedModel = DistributedModel

local function check_opts(o)
  o = o or {}
  if type(o) ~= 'table' then raise('wrap: expected an options table, got ' .. core.kind(o)) end
  local known = { bucket_mb = true, broadcast_buffers = true, find_unused = true,
                  first_bucket_mb = true, shard = true, offload = true, comm_dtype = true }
  for k in pairs(o) do
    if not known[k] then
      raise(("wrap: unknown option '%s' (bucket_mb, broadcast_buffers, find_unused, " ..
        "shard, offload, comm_dtype)")
        :format(tostring(k)))
    end
  end
  local mb = o.bucket_mb or 25
  if type(mb) ~= 'number' or not (mb > 0) then
    raise('wrap: bucket_mb must be a number > 0, got ' .. tostring(o.bucket_mb))
  end
  local first = o.first_bucket_mb or math.min(FIRST_BUCKET_MB, mb)
  if type(first) ~= 'number' or not (first > 0) then
    raise('wrap: first_bucket_mb must be a number > 0, got ' .. tostring(o.first_bucket_mb))
  end
  return mb, first, o.broadcast_buffers ~= false, o.find_unused and true or false
end

local function broadcast_all(s, tensors)
  em.no_grad(function()
    for _, t in ipairs(tensors) do s:broadcast(t, 0) end
  end)
end

function M.wrap(s, model, o)
  if type(model) ~= 'table' or not model.named_parameters then
    raise('wrap: expected an em.nn.Module, got ' .. core.kind(model))
  end
  local mb, first, bcast_buffers, find_unused = check_opts(o)
  -- sharded, or gradients sent in another dtype: ember.distribute.shard
  if o and (o.shard ~= nil or o.offload ~= nil or (o.comm_dtype ~= nil and o.comm_dtype ~= 'float32')) then
    local shard = require 'ember.distribute.shard'
    shard.check(o)
    return shard.wrap(s, model, o)
  end
  -- a GPU replica trains on its device (the batches are the script's to move)
  if s.device ~= 'cpu' then model:to(s.device) end
  local named = {}
  for _, np in ipairs(model:named_parameters()) do
    if np[2].requires_grad then named[#named + 1] = np end
  end
  local buffers = model:buffers()

  -- the same starting point everywhere
  local all = {}
  for i, np in ipairs(named) do all[i] = np[2] end
  for _, b in ipairs(buffers) do all[#all + 1] = b end
  -- (a world of one has nothing to agree on: a model on any device wraps, as a
  -- plain `ember --device cuda script` of a CPU strategy does)
  if s.world_size > 1 then broadcast_all(s, all) end

  local n = #named
  local handles = ffi.new('em_tensor*[?]', math.max(n, 1))
  local names = ffi.new('const char*[?]', math.max(n, 1))
  local keep = {}
  for i, np in ipairs(named) do
    handles[i - 1] = core.H(np[2], 'wrap', 1)
    keep[i] = np[1]
    names[i - 1] = keep[i]
  end
  local out = ffi.new('em_reducer*[1]')
  if C.em_reducer_new(S, s._box._h, handles, names, n, mb * MB, first * MB,
                      find_unused and 1 or 0, out) ~= 0 then
    core.fail()
  end
  -- The reducer holds the parameters (and its buckets) in C and has a callback on
  -- the state: it goes with the wrapped model, or at the state's close if that
  -- comes first (whichever is second finds nil).
  local box = dist._track(ffi.gc(reducerbox_t(out[0]), free_reducer), free_reducer)
  local dm = setmetatable({
    module = model, strategy = s, _reducer = box, _buffers = buffers,
    _broadcast_buffers = bcast_buffers and #buffers > 0 and s.world_size > 1,
    _sync = true, _params = all, _step_start = 0,
  }, DistributedModel)
  -- (not registered with memory_kinds: the profiler counts a plain model's
  -- memory from its optimizers, as it does without a wrap)
  return dm
end

-- -- The wrapped model ---------------------------------------------------------------------
-- The __index of a wrapped model class: its own methods, then the model's fields
-- and methods, which pass through (dm:train() is dm.module:train()). The sharded
-- model (ember.distribute.shard) shares it.
function M.model_index(Class)
  return function(self, k)
    local v = rawget(Class, k)
    if v ~= nil then return v end
    local m = rawget(self, 'module')
    local f = m[k]
    if type(f) == 'function' then
      return function(first, ...)
        if first == self then return f(m, ...) end
        return f(first, ...)
      end
    end
    return f
  end
end
DistributedModel.__index = M.model_index(DistributedModel)

function DistributedModel.__call(self, ...)
  local r = self._reducer._h
  if r == nil then raise('wrapped model: its strategy was closed') end
  if self._broadcast_buffers then broadcast_all(self.strategy, self._buffers) end
  if self._sync and em.is_grad_enabled() then
    if C.em_reducer_prepare(S, r) ~= 0 then core.fail() end
    -- a step's activations: its peak above where it began
    em.reset_peak_memory_stats(self.strategy.device)
    self._step_start = em.memory_stats(self.strategy.device).allocated
  end
  return self.module(...)
end

-- The next backward averages gradients, as after a forward through dm: a
-- pipeline runs its micro-batches' forwards under no_sync and arms the stage
-- just before its last backward, so the accumulated gradients are averaged once.
function DistributedModel:arm()
  local r = self._reducer._h
  if r == nil then raise('wrapped model: its strategy was closed') end
  if C.em_reducer_prepare(S, r) ~= 0 then core.fail() end
end

-- This replica's bytes by kind: {parameters, gradients, optimizer, activations}
-- (activations: the peak of the last step above its start).
function DistributedModel:memory()
  local params, grads = self.module:parameters(), {}
  for _, p in ipairs(params) do
    local g = p.grad
    if g then grads[#grads + 1] = g end
  end
  local peak = em.memory_stats(self.strategy.device).peak
  return { parameters = memory_kinds.bytes(params), gradients = memory_kinds.bytes(grads),
           optimizer = memory_kinds.optimizer_bytes(params),
           activations = math.max(0, peak - self._step_start) }
end

function DistributedModel.__tostring(self)
  return ('wrapped for %d replicas (%d buckets):\n%s'):format(self.strategy.world_size,
    self:num_buckets(), tostring(self.module))
end

-- fn(...) runs with gradient averaging off; its results are returned (the
-- sharded model's too).
function DistributedModel:no_sync(fn, ...)
  if type(fn) ~= 'function' then raise('no_sync: expected a function, got ' .. core.kind(fn)) end
  local was = self._sync
  self._sync = false
  local function finish(ok, ...)
    self._sync = was
    if not ok then error((...), 0) end
    return ...
  end
  return finish(pcall(fn, ...))
end

function DistributedModel:num_buckets() return C.em_reducer_num_buckets(self._reducer._h) end

-- Parameter counts of the buckets, in the order they are reduced.
function DistributedModel:buckets()
  local list = {}
  for b = 0, self:num_buckets() - 1 do list[b + 1] = C.em_reducer_bucket_size(self._reducer._h, b) end
  return list
end

-- {buckets, steps, comm_s, overlap_s, wait_s, overlap}: the time bucket
-- allreduces ran, the part of it while backward was still computing, and the
-- time backward waited for them at its end.
local stats_buf = ffi.new('em_reducer_stats')
function DistributedModel:comm_stats()
  C.em_reducer_stats_get(self._reducer._h, stats_buf)
  local s = stats_buf
  local comm = tonumber(s.comm_s)
  return { buckets = tonumber(s.buckets), steps = tonumber(s.steps), comm_s = comm,
           overlap_s = tonumber(s.overlap_s), wait_s = tonumber(s.wait_s),
           overlap = comm > 0 and tonumber(s.overlap_s) / comm or 0 }
end

return M

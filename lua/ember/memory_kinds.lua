--[[
ember.memory_kinds -- the memory of one replica by kind: parameters, gradients,
optimizer state and activations, measured. The profiler reports it (r.memory,
r.replicas[k].memory) and its scaling projection predicts the same kinds for
other replica counts and sharding modes from the sizes given here.

  local mk = require 'ember.memory_kinds'
  mk.register_optimizer(opt)   -- em.optim's Optimizer base does this on construction
  mk.register_model(dm)        -- wrapped models do this (a sharded one has dm:memory())
  mk.measure()                 -- {[device] = {parameters, gradients, optimizer}}
  local t = mk.tracker()       -- peaks per step: t:step() at each step's end,
  t:result()                   -- {parameters, gradients, optimizer, activations, other, peak,
                               --  devices = {[device] = {...}}}

What is counted. Without a registered model that reports its own memory, the
live optimizers say what there is: parameters are their parameters, gradients
those parameters' .grad tensors, optimizer the tensors in opt.state. Each
storage is counted once, by its identity (views of one storage, a parameter
that is a slice of a flat buffer, share it) and its full size. A registered
model with dm:memory() -- the sharded model, whose shards and gathered buffers
only it knows -- reports those three (and its activations) itself, and the
optimizers are not counted then (they hold its shards).

Activations are what is left of the step's peak: a step's peak allocated bytes
on the device (em.memory_stats; the tracker resets the peak as each step
begins) less the other three kinds as they stand at the step's end, which is
what they were at the peak as long as the step neither creates nor frees
parameters, gradients or state between the two, and less what the device
held beyond those three as the step began (other: a dataset kept in memory, a
fixed batch -- no activation of the step); it is never below 0. A step that
ran no backward (an evaluation batch) is not reported. The step with the
highest peak is the one reported; the first step, which also holds what ran
before it (data read, a model built), only when it is the only one.

The registries are weak: an optimizer or model that is no longer referenced
drops out at the next collection.
]]
local ffi = require 'ffi'
local core = require 'ember.ffi'
local C, S = core.C, core.S
local box_t, istype = core.box_t, ffi.istype

local M = {}

local optimizers = setmetatable({}, { __mode = 'k' })
local models = setmetatable({}, { __mode = 'k' })
local order = 0       -- registration order, so that reports list models stably

function M.register_optimizer(opt)
  order = order + 1
  optimizers[opt] = order
end

function M.register_model(dm)
  if type(dm) ~= 'table' then
    core.raise('memory_kinds.register_model: expected a wrapped model, got ' .. core.kind(dm))
  end
  order = order + 1
  models[dm] = order
end

local function sorted(reg)
  local list = {}
  for x, k in pairs(reg) do list[#list + 1] = { x, k } end
  table.sort(list, function(a, b) return a[2] < b[2] end)
  for i, e in ipairs(list) do list[i] = e[1] end
  return list
end

function M.optimizers() return sorted(optimizers) end
function M.models() return sorted(models) end

-- The first registered model that reports its own memory (the sharded model).
local function reporting_model()
  for _, dm in ipairs(sorted(models)) do
    if type(dm.memory) == 'function' then return dm end
  end
end

-- The sharding mode of the registered wrapped model: 'plain' without one.
function M.mode()
  for _, dm in ipairs(sorted(models)) do
    if dm.shard_mode then return dm.shard_mode end
  end
  return 'plain'
end

-- -- Counting storages -----------------------------------------------------------------

local function device_of(h) return core.device_name(tonumber(C.em_tensor_device(h))) end

local function storage_key(h)
  return tostring(ffi.cast('uintptr_t', C.em_tensor_storage_id(h)))
end

-- Adds handle h's storage to devices[dev][kind] unless `seen` has it.
local function count(devices, seen, kind, h)
  local key = storage_key(h)
  if seen[key] then return end
  seen[key] = true
  local dev = device_of(h)
  local d = devices[dev]
  if not d then
    d = { parameters = 0, gradients = 0, optimizer = 0 }
    devices[dev] = d
  end
  d[kind] = d[kind] + tonumber(C.em_tensor_storage_nbytes(h))
end

local function each_param(opt, fn)
  local i = 0
  for _, g in ipairs(opt.param_groups or {}) do
    for _, p in ipairs(g.params or {}) do
      i = i + 1
      fn(i, p)
    end
  end
end

-- {[device] = {parameters, gradients, optimizer}} in bytes, from the optimizers.
local function from_optimizers()
  local devices, seen = {}, {}
  local opts = sorted(optimizers)
  for _, opt in ipairs(opts) do
    each_param(opt, function(_, p) count(devices, seen, 'parameters', p._h) end)
  end
  for _, opt in ipairs(opts) do
    each_param(opt, function(_, p)
      local gh = C.em_tensor_grad(p._h)
      if gh ~= nil then
        count(devices, seen, 'gradients', gh)
        C.em_tensor_release(gh)
      end
    end)
  end
  for _, opt in ipairs(opts) do
    for _, st in pairs(opt.state or {}) do
      if type(st) == 'table' then
        for _, v in pairs(st) do
          if istype(box_t, v) then count(devices, seen, 'optimizer', v._h) end
        end
      end
    end
  end
  return devices
end

-- Bytes of the storages of a list of tensors (each storage once).
function M.bytes(tensors)
  local seen, n = {}, 0
  for _, t in ipairs(tensors) do
    local key = storage_key(t._h)
    if not seen[key] then
      seen[key] = true
      n = n + tonumber(C.em_tensor_storage_nbytes(t._h))
    end
  end
  return n
end

-- Bytes of the state the registered optimizers keep for the given parameters
-- (a list of tensors; each storage once): what a wrapped model reports as its
-- optimizer memory.
function M.optimizer_bytes(params)
  local mine, seen, n = {}, {}, 0
  for _, p in ipairs(params) do mine[p] = true end
  for _, opt in ipairs(sorted(optimizers)) do
    each_param(opt, function(i, p)
      local st = mine[p] and opt.state and opt.state[i]
      if type(st) ~= 'table' then return end
      for _, v in pairs(st) do
        if istype(box_t, v) then
          local key = storage_key(v._h)
          if not seen[key] then
            seen[key] = true
            n = n + tonumber(C.em_tensor_storage_nbytes(v._h))
          end
        end
      end
    end)
  end
  return n
end

-- The device a model's parameters live on ('cpu' when it has none).
local function model_device(dm)
  local ok, params = pcall(dm.parameters, dm)
  if ok and type(params) == 'table' then
    for _, p in ipairs(params) do
      if istype(box_t, p) then return device_of(p._h) end
    end
  end
  return 'cpu'
end

-- Bytes by kind and device right now: {[device] = {parameters, gradients,
-- optimizer[, activations]}}; activations only where a model reported them.
function M.measure()
  local dm = reporting_model()
  if not dm then return from_optimizers() end
  local m = dm:memory()
  return { [model_device(dm)] = { parameters = m.parameters or 0, gradients = m.gradients or 0,
                                  optimizer = m.optimizer or 0, activations = m.activations } }
end

-- -- Sizes of the whole model, for the projection ---------------------------------------

local function bytes_of(h)
  return tonumber(C.em_tensor_numel(h)) * tonumber(C.em_dtype_size(C.em_tensor_dtype(h)))
end

-- The unsharded model as the projection needs it: param_bytes (every trained
-- parameter, full), state_ratio (bytes of optimizer state per byte of a parameter
-- that has state: 2 for Adam, 1 for SGD with momentum, 0 for plain SGD or before
-- the first step), mode and world_size of the registered wrapped model.
function M.sizes()
  local out = { param_bytes = 0, state_ratio = 0, mode = M.mode() }
  local with_state, state = 0, 0
  for _, opt in ipairs(sorted(optimizers)) do
    each_param(opt, function(i, p)
      local st = opt.state and opt.state[i]
      local sb = 0
      if type(st) == 'table' then
        for _, v in pairs(st) do
          if istype(box_t, v) then sb = sb + bytes_of(v._h) end
        end
      end
      if sb > 0 then with_state = with_state + bytes_of(p._h); state = state + sb end
      out.param_bytes = out.param_bytes + bytes_of(p._h)
    end)
  end
  if with_state > 0 then out.state_ratio = state / with_state end
  for _, dm in ipairs(sorted(models)) do
    if type(dm.shard_layout) == 'function' then
      -- the optimizers hold shards: the full sizes are the layout's
      local lay = dm:shard_layout()
      local total = 0
      for _, p in ipairs(lay.params or {}) do
        local dt = ffi.new('em_dtype[1]')
        local size = 4
        if p.dtype and C.em_dtype_from_name(S, p.dtype, dt) == 0 then
          size = tonumber(C.em_dtype_size(dt[0]))
        end
        total = total + (p.numel or 0) * size
      end
      out.param_bytes = total
      out.world_size = lay.world_size
      break
    end
  end
  return out
end

-- -- Peaks per step -------------------------------------------------------------------------

local function memory_stats(dev)
  local em = require 'ember'
  return em.memory_stats(dev)
end

local function reset_peak(dev)
  require('ember').reset_peak_memory_stats(dev)
end

-- The devices worth watching: every device a counted storage is on, cpu when none.
local function devices_of(kinds)
  local list = {}
  for dev in pairs(kinds) do list[#list + 1] = dev end
  if #list == 0 then list[1] = 'cpu' end
  table.sort(list)
  return list
end

local Tracker = {}
Tracker.__index = Tracker

-- A new tracker; the peaks of the devices in use start over now.
function M.tracker()
  collectgarbage('collect')    -- optimizers no longer referenced leave the registry
  local t = setmetatable({ best = {}, first = {}, steps = 0, base = {} }, Tracker)
  local kinds = M.measure()
  t.watch = devices_of(kinds)
  for _, dev in ipairs({ 'cpu', unpack(t.watch) }) do t:restart(dev, kinds[dev]) end
  return t
end

local function state_of(k)
  return k and (k.parameters + k.gradients + k.optimizer) or 0
end

-- A device's peak starts over. base: what the device holds now beyond the
-- parameters, gradients and optimizer state (k: those, measured now) -- a dataset
-- kept in memory, a fixed batch: the step's "other" memory, not its activations.
function Tracker:restart(dev, k)
  reset_peak(dev)
  self.base[dev] = math.max(0, memory_stats(dev).allocated - state_of(k))
end

-- The end of a step: each device's peak during it against the kinds now; the peaks
-- start over for the next step.
-- skip: the step is no training step (no backward ran: an evaluation batch);
-- its peak starts over and is not reported.
function Tracker:step(skip)
  if skip then
    local kinds = M.measure()
    for dev in pairs(self.base) do self:restart(dev, kinds[dev]) end
    return
  end
  local kinds = M.measure()
  local watch = devices_of(kinds)
  for _, dev in ipairs(watch) do
    local k = kinds[dev] or { parameters = 0, gradients = 0, optimizer = 0 }
    local peak = memory_stats(dev).peak
    local held = k.parameters + k.gradients + k.optimizer
    local other = k.activations and 0 or math.min(self.base[dev] or 0, math.max(0, peak - held))
    local act = k.activations or math.max(0, peak - held - other)
    -- The first step also holds what ran before it (a dataset read and
    -- converted, the model built): it counts only if no other step comes.
    local into = self.steps == 0 and self.first or self.best
    local best = into[dev]
    if not best or peak > best.peak then
      into[dev] = { parameters = k.parameters, gradients = k.gradients,
                    optimizer = k.optimizer, activations = act, other = other, peak = peak }
    end
    self:restart(dev, kinds[dev])
  end
  self.steps = self.steps + 1
end

-- {parameters, gradients, optimizer, activations, other, peak} summed over devices, and
-- devices = the same per device. Without a step seen, the recording is one step.
function Tracker:result()
  if self.steps == 0 then self:step() end
  local sum = { parameters = 0, gradients = 0, optimizer = 0, activations = 0, other = 0,
                peak = 0, devices = {} }
  for dev, b in pairs(self.steps == 1 and self.first or self.best) do
    sum.devices[dev] = b
    for k in pairs(b) do sum[k] = sum[k] + b[k] end
  end
  return sum
end

return M

--[[
ember.distribute.plan.memory -- what one training step of a model holds, measured
on the meta device (tensors with shapes and no data: every op runs its shape
logic and its allocation is counted, nothing is computed), for the planner.

The model is measured in place: its parameters and buffers are swapped for meta
copies for the measurement and put back after, so the user's model is never
copied nor changed.

Two measurements:

  M.step(model, o) -- the whole step (forward, loss, backward) at one batch size,
  with gradient hooks that drop each parameter's gradient the moment it is final.
  Each hook closes a segment of the backward: the segment's peak (bytes above the
  parameters) and how many gradient bytes had arrived before it. A layout then
  puts back what it holds of those gradients (all of them for plain data
  parallel; a 1/N share and a few flat buffers in flight for ZeRO) on top of each
  segment's peak: the step's peak for that layout, exactly, without running the
  layout.

  plan/children.lua -- each child of a Sequential alone, for the pipeline
  replay, with the helpers below (to_meta, without_collector, input).

Besides, the model's sizes the layouts need (M.sizes: its trainable bytes, its
largest unit) and the units ZeRO shards it into (M.units, M.shard_units).

Peaks include the garbage a step leaves for Lua's collector (the same garbage
the real step leaves, since the ops are the same): what em.memory_stats reports.
]]
local ffi = require 'ffi'
local em = require 'ember'
local core = require 'ember.ffi'
local C, S = core.C, core.S
local release = core.handles.release

local M = {}

local function nbytes(t) return t:numel() * t:element_size() end

-- -- Swapping a model onto meta and back ---------------------------------------------------
-- Every module's own parameters and buffers, by name, as they are; model:to('meta')
-- then replaces them; the returned function puts the originals back.
function M.to_meta(model)
  local saved = {}
  for _, m in ipairs(model:modules()) do
    local own = m:named_parameters { recurse = false }
    for _, nb in ipairs(m:named_buffers { recurse = false }) do own[#own + 1] = nb end
    saved[#saved + 1] = { m = m, own = own }
  end
  model:to('meta')
  return function()
    -- (assigning a registered name puts the tensor back in its place)
    for _, s in ipairs(saved) do
      for _, kv in ipairs(s.own) do s.m[kv[1]] = kv[2] end
    end
  end
end

-- Each direct child's forward runs under em.nn.checkpoint (keeping only its
-- inputs); returns the function that undoes it. Parameter names stay as they are.
-- Nothing else is imitated: em.nn.checkpoint's own tidy-up (a collection once
-- a forward or a recompute leaves more than its threshold of garbage) reads the
-- state's total count, which meta tensors enter as CPU tensors do, so the meta
-- step collects exactly where the real one does -- and nowhere else: a
-- collection the real step does not make would hide garbage it holds.
function M.checkpoint_children(model)
  local undo = {}
  for _, c in ipairs(model:children()) do
    local own = rawget(c, 'forward')
    local inner = own or getmetatable(c).forward
    rawset(c, 'forward', function(self, ...)
      return em.nn.checkpoint(function(...) return inner(self, ...) end, ...)
    end)
    undo[#undo + 1] = function() rawset(c, 'forward', own) end
  end
  return function() for _, f in ipairs(undo) do f() end end
end

-- -- Lua's collector, held off -----------------------------------------------------------------
-- Garbage tensors are freed when Lua's collector finishes a cycle, and when
-- it does depends on the Lua heap and on everything the process did before:
-- a real step may finish none where the meta step finishes one, and then hold
-- garbage the measurement saw freed (a checkpointed GPT held a third more).
-- So the measurement assumes the worst: no cycle finishes on its own. While fn
-- runs the collector is stopped, and the small steps ember.handles takes every
-- few thousand tensors (collectgarbage 'step', a global it looks up at each
-- call) do nothing; full collections -- em.nn.checkpoint's tidy-up, a
-- pipeline's, em.collect -- still run, as they do in the real step, and stop
-- the collector again.
local function quiet(real)
  return function(what, ...)
    if what == 'step' then return false end
    local r = real(what, ...)
    if what == nil or what == 'collect' or what == 'restart' then real('stop') end
    return r
  end
end

local function without_collector(fn, ...)
  local real = collectgarbage
  _G.collectgarbage = quiet(real)
  real('stop')
  local ok, res = pcall(fn, ...)
  _G.collectgarbage = real
  real('restart')
  if not ok then error(res, 0) end
  return res
end
M.without_collector = without_collector

-- The modules ZeRO 3 (s:wrap{shard = 'parameters'}) makes units of: those that
-- own trainable parameters directly (a weight two modules share belongs to
-- the first), in the order shard.lua takes them.
-- Each {module, bytes (its weights), idx (their positions among the model's
-- parameters that require grad, the order of M.step's segments' param)}.
function M.units(model)
  local index_of, n = {}, 0
  for _, p in ipairs(model:parameters()) do
    if p.requires_grad then n = n + 1; index_of[p] = n end
  end
  local list, taken = {}, {}
  for _, m in ipairs(em.nn.Module.modules(model)) do
    local own, idx = 0, {}
    for _, p in ipairs(em.nn.Module.parameters(m, { recurse = false })) do
      local i = index_of[p]
      if i and not taken[i] then taken[i] = true; own = own + nbytes(p); idx[#idx + 1] = i end
    end
    if own > 0 then list[#list + 1] = { module = m, bytes = own, idx = idx } end
  end
  return list
end

-- The model's trainable bytes W, its largest module's own (ZeRO 3's unit) and,
-- under checkpointing, its largest child's: a child's recompute gathers the
-- units inside it and its backward keeps them until its gradients come out, all
-- at once, so ZeRO 3 holds a whole child's weights (a child that is a unit
-- itself gathers outside its checkpoint, one unit).
function M.sizes(model)
  local W, unit = 0, 0
  for _, m in ipairs(model:modules()) do
    local own = 0
    for _, p in ipairs(em.nn.Module.parameters(m, { recurse = false })) do
      if p.requires_grad then W, own = W + nbytes(p), own + nbytes(p) end
    end
    unit = math.max(unit, own)
  end
  local ckpt_unit = unit
  for _, c in ipairs(model:children()) do
    local b = 0
    for _, p in ipairs(c:parameters()) do
      if p.requires_grad then b = b + nbytes(p) end
    end
    ckpt_unit = math.max(ckpt_unit, b)
  end
  if W == 0 then core.raise('plan: the model has no parameter that requires grad') end
  return W, unit, ckpt_unit
end

-- ZeRO 3's units in the order their gradients complete (backward order), and
-- ZeRO 1 and 2's: shard.lua's buckets of the trainable parameters.
function M.shard_units(model)
  local units = {}
  local owners = M.units(model)
  for k = #owners, 1, -1 do units[#units + 1] = owners[k] end
  local buckets, sizes, keys = {}, {}, {}
  for _, p in ipairs(model:parameters()) do
    if p.requires_grad then
      sizes[#sizes + 1] = nbytes(p)
      keys[#sizes] = p.dtype .. '@' .. p.device
    end
  end
  for _, idx in ipairs(require('ember.distribute.shard.layout').shard_buckets(sizes, keys)) do
    local b = 0
    for _, i in ipairs(idx) do b = b + sizes[i] end
    buckets[#buckets + 1] = { bytes = b, idx = idx }
  end
  return units, buckets
end

-- What ZeRO 3 holds gathered while a parameter's gradient is made, by the
-- parameter's position (as M.units and the meta step's segments number them):
-- {plain = its unit's weights, checkpoint = its child's under checkpointing,
-- whose recompute gathers all of the child's units}.
function M.gathered(model)
  local g = { plain = {}, checkpoint = {} }
  local position, n = {}, 0
  for _, p in ipairs(model:parameters()) do
    if p.requires_grad then n = n + 1; position[p] = n end
  end
  for _, u in ipairs(M.units(model)) do
    for _, i in ipairs(u.idx) do g.plain[i], g.checkpoint[i] = u.bytes, u.bytes end
  end
  for _, c in ipairs(model:children()) do
    local b, idx = 0, {}
    for _, p in ipairs(c:parameters()) do
      if position[p] then b = b + nbytes(p); idx[#idx + 1] = position[p] end
    end
    for _, i in ipairs(idx) do g.checkpoint[i] = math.max(g.checkpoint[i] or 0, b) end
  end
  return g
end

-- A meta tensor of the given shape and dtype; integer inputs (token ids) are
-- ones, a valid id for any 1-based index.
function M.input(shape, dtype, device)
  return em.ones(shape, { dtype = dtype or 'float32', device = device or 'meta' })
end

-- -- Gradient hooks --------------------------------------------------------------------------
-- One ffi callback for all measurements (LuaJIT has few callback slots); ud is
-- the parameter's index in the running measurement, whose state is the plain
-- table `running` (no closure made per measurement: a compiled trace may keep
-- what the callback reaches alive).
local running

local function peak() return em.memory_stats('meta').peak end
local function allocated() return em.memory_stats('meta').allocated end
M.peak, M.allocated = peak, allocated

-- A parameter's gradient is final: close the backward's segment, drop the gradient.
local function on_grad(i)
  local r = running
  local p = r.params[i]
  local g = p.grad
  r.segs[#r.segs + 1] = { peak = peak() - r.base, arrived = r.arrived, param = i,
                          bytes = g and nbytes(g) or 0, ending = allocated() - r.base }
  if g then
    r.arrived = r.arrived + nbytes(g)
    p.grad = nil
    release(g)
  end
  em.reset_peak_memory_stats('meta')
end

local hook = ffi.cast('em_grad_hook_fn', function(_, _, ud)
  if not running then return 0 end
  local ok, err = pcall(on_grad, tonumber(ffi.cast('intptr_t', ud)))
  if ok then return 0 end
  return C.em_set_error(S, C.EM_ERR_INTERNAL, tostring(err))
end)

local function forward_backward(o)
  local x = M.input(o.input.shape, o.input.dtype)
  local y = o.target and M.input(o.target.shape, o.target.dtype)
  local out = o.model(x)
  local loss = o.loss(out, y)
  loss:backward()
end

-- One step on meta of a model already on meta: segments {peak, arrived, bytes,
-- ending} (bytes above `base`, the parameters: the segment's peak, the
-- gradients before the one that ends it, that one's, and what is allocated as
-- it arrives), `after` (allocated once backward returned).
local function run_step(model, params, o)
  em.collect()
  local base = allocated()
  em.reset_peak_memory_stats('meta')
  for i, p in ipairs(params) do
    core.check(C.em_tensor_add_grad_hook(S, p._h, hook, ffi.cast('void *', ffi.cast('intptr_t', i))))
  end
  running = { params = params, segs = {}, arrived = 0, base = base }
  o.model = model
  local ok, err = pcall(forward_backward, o)
  o.model = nil
  local r = running
  running = nil
  for i, p in ipairs(params) do
    C.em_tensor_remove_grad_hook(p._h, hook, ffi.cast('void *', ffi.cast('intptr_t', i)))
  end
  if not ok then error(err, 0) end
  r.segs[#r.segs + 1] = { peak = peak() - base, arrived = r.arrived }
  local after = allocated() - base
  return { segments = r.segs, after = after, grad_bytes = r.arrived }
end

-- A run's key in M.step's results: 'batch/checkpoint' (checkpoint 0 or 1).
function M.key(run)
  return ('%d/%d'):format(run.batch, run.checkpoint and 1 or 0)
end

-- The step measured for each batch size and checkpointing choice asked for:
-- o = {input = {shape, dtype}, target = {shape, dtype}?, loss, runs = {{batch,
-- checkpoint}, ...}}; the batch replaces shape[1] of input and target.
-- Returns results keyed by M.key(run).
function M.step(model, o)
  local restore = M.to_meta(model)
  local results = {}
  local memlimit = require 'ember.memlimit'
  memlimit.meta_capacity = o.memory
  local ok, err = pcall(without_collector, function()
    local params = {}
    for _, p in ipairs(model:parameters()) do
      if p.requires_grad then params[#params + 1] = p end
    end
    for _, run in ipairs(o.runs) do
      local key = M.key(run)
      if not results[key] then
        local undo = run.checkpoint and M.checkpoint_children(model)
        local function shaped(t)
          if not t then return nil end
          local sh = { unpack(t.shape) }
          sh[1] = t.shape[1] * run.batch / o.input.shape[1]   -- (a target may be flattened)
          return { shape = sh, dtype = t.dtype }
        end
        local ok2, res = pcall(run_step, model, params,
          { input = shaped(o.input), target = shaped(o.target), loss = o.loss,
            checkpoint = run.checkpoint })
        if undo then undo() end
        if not ok2 then error(res, 0) end
        results[key] = res
      end
    end
  end)
  memlimit.meta_capacity = nil
  restore()
  em.collect()
  if not ok then error(err, 0) end
  return results
end

return M

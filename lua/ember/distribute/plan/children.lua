--[[
ember.distribute.plan.children -- each child of a Sequential measured alone on
the meta device (its input a meta tensor), for the planner's pipeline replay
(plan/pipeline.lua): what its forward keeps for backward apart from the garbage
it leaves, its forward and backward peaks (the backward over gradients an
earlier micro-batch made), what the backward leaves, its weights' sizes. A
pipeline stage holds several micro-batches of those. Identical children (same
class, parameter shapes and input shape) are measured once. The model is
swapped onto meta and back as plan/memory.lua does for the whole step.
]]
local em = require 'ember'
local core = require 'ember.ffi'
local memory = require 'ember.distribute.plan.memory'

local M = {}

local peak, allocated = memory.peak, memory.allocated
local without_collector = memory.without_collector
local function nbytes(t) return t:numel() * t:element_size() end

local function child_key(c, shape, dtype, ckpt)
  local parts = { tostring(c.__name), table.concat(shape, 'x'), dtype, ckpt and 'c' or '' }
  for _, np in ipairs(c:named_parameters()) do
    parts[#parts + 1] = np[1] .. ':' .. table.concat(np[2].shape, 'x') .. np[2].dtype
  end
  return table.concat(parts, ';')
end

-- One child alone: {held (bytes its forward keeps, its output included),
-- garbage (what its forward left dead beside that, for the collector),
-- recomputed (what its backward left dead: a checkpointed child's recomputed
-- forward), recompute_peak (checkpointed: its recompute's top, above its
-- input), fwd_peak, bwd_peak (above its input, the output's gradient
-- included, beside its weights' gradients made by an earlier micro-batch; the
-- backward's without the forward's garbage), bwd_first (the backward's peak
-- where it makes those gradients, them included), out
-- = {shape, dtype}, params (its trainable weights' bytes), sizes (each one's,
-- in order), units and unit_sizes (how many modules own trainable weights, and
-- their bytes: ZeRO 3's units)}.
local function measure_child(c, shape, dtype, ckpt)
  em.collect()
  local x = memory.input(shape, dtype)
  local floating = x:is_floating_point()
  if floating then x:requires_grad_() end
  local base = allocated()
  local fn = function(t) return c(t) end
  -- a checkpointed child's recompute is its plain forward, run inside its
  -- backward: its top, where Lua's collector may still run (the engine's
  -- kernels after it allocate from C, where it cannot)
  local recompute_peak
  if ckpt then
    em.reset_peak_memory_stats('meta')
    local plain = fn(x)
    recompute_peak = peak() - base
    plain = nil
    em.collect()
  end
  em.reset_peak_memory_stats('meta')
  local out = ckpt and em.nn.checkpoint(fn, x) or fn(x)
  local fwd_peak = peak() - base
  local left = allocated() - base
  -- what the forward keeps apart from what it merely left for the collector
  -- (a checkpointed forward's intermediates, made under no_grad)
  em.collect()
  local held = allocated() - base
  -- A step's first backward finds no gradients: each is made where it is
  -- kept, with no sum's temporary (its peak counts them). The forward runs
  -- again for the backward below.
  local g = em.ones(out.shape, { dtype = out.dtype, device = 'meta' })
  em.reset_peak_memory_stats('meta')
  out:backward(g)
  local bwd_first = peak() - base
  out, g, x.grad = nil, nil, nil
  for _, p in ipairs(c:parameters()) do p.grad = nil end
  em.collect()
  out = ckpt and em.nn.checkpoint(fn, x) or fn(x)
  em.collect()
  -- A pipeline's micro-batches accumulate: in all but a step's first backward
  -- the child's gradients are there already and each new one is added into
  -- them. So the backward runs over gradients made beforehand, and its peak
  -- counts what it needs beside them.
  local given, sizes = 0, {}
  for _, p in ipairs(c:parameters()) do
    if p.requires_grad then
      sizes[#sizes + 1] = nbytes(p)
      p.grad = em.zeros(p.shape, { dtype = p.dtype, device = 'meta' })
      given = given + nbytes(p)
    end
  end
  g = em.ones(out.shape, { dtype = out.dtype, device = 'meta' })
  local before_bwd = allocated()
  em.reset_peak_memory_stats('meta')
  out:backward(g)
  local bwd_peak = peak() - base - given
  local made = allocated() - before_bwd - (x.grad and nbytes(x.grad) or 0)
  for _, p in ipairs(c:parameters()) do p.grad = nil end
  -- the modules that own weights: ZeRO 3's units
  local units, unit_sizes = 0, {}
  for _, m in ipairs(c:modules()) do
    local own = 0
    for _, p in ipairs(em.nn.Module.parameters(m, { recurse = false })) do
      if p.requires_grad then own = own + nbytes(p) end
    end
    if own > 0 then units = units + 1; unit_sizes[units] = own end
  end
  return { held = held, garbage = left - held, recomputed = math.max(0, made),
           fwd_peak = fwd_peak, bwd_peak = bwd_peak, bwd_first = bwd_first,
           recompute_peak = recompute_peak,
           params = given, sizes = sizes,
           units = units, unit_sizes = unit_sizes,
           out = { shape = out.shape, dtype = out.dtype }, out_bytes = nbytes(out) }
end

-- The loss alone on the last child's output (a meta tensor that requires
-- grad): what it keeps for backward, its forward and backward peaks.
local function measure_loss(loss, shape, dtype, target)
  em.collect()
  local x = memory.input(shape, dtype):requires_grad_()
  local y = target and memory.input(target.shape, target.dtype)
  local base = allocated()
  em.reset_peak_memory_stats('meta')
  local l = loss(x, y)
  local fwd_peak = peak() - base
  local held = allocated() - base
  em.reset_peak_memory_stats('meta')
  l:backward()
  return { held = held, fwd_peak = fwd_peak, bwd_peak = peak() - base }
end

-- Every child's footprint at the given input (o.input with shape[1] = batch),
-- with or without checkpointing; o.cache (a table) keeps them across calls.
-- With o.loss (and o.target, scaled to the batch as the input is), also the
-- loss's footprint on the last child's output: the list's .loss.
function M.children(model, o)
  local cache = o.cache or {}
  local restore = memory.to_meta(model)
  local list = {}
  -- (a pipeline's backwards make no collections of their own: pipeline/run.lua)
  local was = core.handles.step_collects(false)
  local ok, err = pcall(without_collector, function()
    local shape, dtype = { unpack(o.input.shape) }, o.input.dtype or 'float32'
    shape[1] = o.batch
    for i, c in ipairs(model:children()) do
      local key = child_key(c, shape, dtype, o.checkpoint)
      local m = cache[key]
      if not m then
        m = measure_child(c, shape, dtype, o.checkpoint)
        cache[key] = m
      end
      list[i] = m
      shape, dtype = m.out.shape, m.out.dtype
    end
    if o.loss then
      local t
      if o.target then
        t = { shape = { unpack(o.target.shape) }, dtype = o.target.dtype }
        t.shape[1] = o.target.shape[1] * o.batch / o.input.shape[1]
      end
      local key = 'loss;' .. table.concat(shape, 'x') .. ';' .. tostring(o.batch)
      cache[key] = cache[key] or measure_loss(o.loss, shape, dtype, t)
      list.loss = cache[key]
    end
  end)
  core.handles.step_collects(was)
  restore()
  em.collect()
  if not ok then error(err, 0) end
  return list
end

return M

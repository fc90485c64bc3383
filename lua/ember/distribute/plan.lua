--[[
ember.distribute.plan -- em.distribute.plan(model, o): before anything trains,
whether a model trains in the given memory per device, and how.

  local plan = em.distribute.plan(model, {
    input = {shape = {64, 128}, dtype = 'int64'},      -- the global batch
    target = {shape = {64 * 128}, dtype = 'int64'},    -- optional
    loss = function(out, y) return F.cross_entropy(out:view(-1, V), y) end,
    optimizer = 'adam' | 'sgd', devices = 4,
    memory = 512 * 2^20,     -- one device's bytes; default: its capacity (a
                             -- --memory-limit cap on the cpu, a GPU's memory)
    strategy = s,            -- optional: measures the link (a collective)
    pipeline = true,         -- consider pipeline layouts (when em.distribute.pipeline exists)
    schedule = '1f1b' | 'gpipe', time = true,     -- time = false: no timing runs
    dtype = 'float32' | 'bfloat16' | 'float16' })   -- a half dtype: the step runs
                                                    -- under em.amp.autocast(dtype)
  plan.fits, plan.layout, plan.peak_bytes, plan.step_s, plan.candidates, plan.why
  plan:print(); local dm = plan:apply(s)

input.shape[1] is the global batch of one step; a layout with D data replicas
gives each B/D rows (and a pipeline splits those into M micro-batches). A step
is: zero_grad, forward, loss, backward, optimizer step.

How: plan/memory.lua measures the step on the meta device at each per-replica batch
(with and without checkpointing); plan/time.lua times each child on the real
device and the link; plan/layouts.lua turns those into each layout's peak and step
time and picks the fastest that fits; plan/print.lua prints the table. Measurements
of identical children are shared, so a deep stack of equal blocks costs one
block's measurement.
]]
local em = require 'ember'
local core = require 'ember.ffi'
local memory = require 'ember.distribute.plan.memory'
local plan_children = require 'ember.distribute.plan.children'
local timing = require 'ember.distribute.plan.time'
local layouts = require 'ember.distribute.plan.layouts'
local raise = core.raise

local M = {}
local Plan = {}
Plan.__index = Plan
M.Plan = Plan

local GiB = 2 ^ 30
local function gib(n)
  if n >= GiB then return ('%.2f GiB'):format(n / GiB) end
  return ('%.1f MiB'):format(n / 2 ^ 20)
end
M.gib = gib

-- -- Options ---------------------------------------------------------------------------------
local KNOWN = { input = true, target = true, loss = true, optimizer = true, devices = true,
                memory = true, dtype = true, strategy = true, pipeline = true, schedule = true,
                time = true, momentum = true }

local function check_shape(name, v)
  if type(v) ~= 'table' or type(v.shape) ~= 'table' or #v.shape < 1 then
    raise(('plan: %s must be {shape = {batch, ...}, dtype = ...}, got %s'):format(name, core.kind(v)))
  end
  for i, d in ipairs(v.shape) do
    if type(d) ~= 'number' or d < 1 or d % 1 ~= 0 then
      raise(('plan: %s.shape[%d] must be a positive integer, got %s'):format(name, i, tostring(d)))
    end
  end
end

local function check(model, o)
  if type(model) ~= 'table' or not model.named_parameters then
    raise('plan: expected an em.nn.Module, got ' .. core.kind(model))
  end
  if type(o) ~= 'table' then raise('plan: expected an options table, got ' .. core.kind(o)) end
  for k in pairs(o) do
    if not KNOWN[k] then
      raise(("plan: unknown option '%s' (input, target, loss, optimizer, devices, memory, " ..
        "dtype, strategy, pipeline, schedule, time)"):format(tostring(k)))
    end
  end
  check_shape('input', o.input)
  if o.target ~= nil then check_shape('target', o.target) end
  if o.loss ~= nil and type(o.loss) ~= 'function' then
    raise('plan: loss must be a function(output, target) returning the loss, got ' .. core.kind(o.loss))
  end
  local opt = o.optimizer or 'adam'
  if opt ~= 'adam' and opt ~= 'adamw' and opt ~= 'sgd' then
    raise(("plan: optimizer must be 'adam' or 'sgd', got %s"):format(tostring(o.optimizer)))
  end
  local N = o.devices or (o.strategy and o.strategy.world_size) or 1
  if type(N) ~= 'number' or N < 1 or N % 1 ~= 0 then
    raise('plan: devices must be a positive integer, got ' .. tostring(o.devices))
  end
  local mem = o.memory
  if mem == nil then
    -- by default one device's capacity: the cap of --memory-limit (or
    -- em.set_memory_limit) on the cpu, a GPU's memory
    local dev = o.strategy and o.strategy.device or 'cpu'
    local ok, st = pcall(em.memory_stats, dev)
    if ok and st.capacity > 0 then mem = st.capacity end
  end
  if type(mem) == 'string' then
    local n, why = require('ember.memlimit').parse_size(mem)
    if not n then raise('plan: memory: ' .. why) end
    mem = n
  end
  if type(mem) ~= 'number' or not (mem > 0) then
    raise('plan: memory must be the bytes of one device (a number > 0 or a size like 512M), got ' ..
      tostring(o.memory) .. (o.memory == nil and
        ' (it defaults to the device\'s capacity: a --memory-limit cap on the cpu, a GPU\'s memory)'
        or ''))
  end
  if o.schedule ~= nil and o.schedule ~= '1f1b' and o.schedule ~= 'gpipe' then
    raise(("plan: schedule must be '1f1b' or 'gpipe', got %s"):format(tostring(o.schedule)))
  end
  if o.input.shape[1] % 1 ~= 0 then raise('plan: input.shape[1] (the batch) must be an integer') end
  if o.dtype ~= nil and o.dtype ~= 'float32' and o.dtype ~= 'bfloat16' and o.dtype ~= 'float16' then
    raise(("plan: dtype must be 'float32', or 'bfloat16' or 'float16' for a step under " ..
      'em.amp.autocast, got %s'):format(type(o.dtype) == 'string' and "'" .. o.dtype .. "'" or
      core.kind(o.dtype)))
  end
  return N, mem, opt
end

local function default_loss(out) return out:sum() end

local function is_sequential(model)
  return getmetatable(model) == em.nn.Sequential or
    (type(model.__name) == 'string' and model.__name == 'Sequential')
end

local function has_pipeline()
  local ok, mod = pcall(require, 'ember.distribute.pipeline')
  return ok and mod
end

-- -- Planning --------------------------------------------------------------------------------
-- -- Planning, phase by phase ---------------------------------------------------------------

-- Why each layout that does not fit does not: setting it up, or its peak against
-- the memory with its parts (and, for a pipeline, the stages past it).
local function reasons(candidates, skipped, mem)
  local why = {}
  for name, reason in pairs(skipped) do why[name] = reason end
  for _, c in ipairs(candidates) do
    if not c.fits and c.setup and c.setup > mem then
      why[c.name] = ('%s: setting it up holds %s > %s (the model as built%s)'):format(c.name,
        gib(c.setup), gib(mem), c.layout.shard == 'parameters' and ', its shards and a unit' or '')
    elseif not c.fits then
      local p = c.parts
      why[c.name] = ('%s: %s > %s (parameters %s, gradients %s, optimizer %s, ' ..
        'activations %s; with a margin of %d%% and %d KiB)'):format(c.name, gib(c.peak), gib(mem),
        gib(p.parameters), gib(p.gradients), gib(p.optimizer), gib(p.activations),
        math.floor(layouts.safety(c.layout) * 100 + 0.5), layouts.SAFETY_BYTES / 1024)
      -- a pipeline: which stage does not fit (the children it holds)
      if c.stage_peaks then
        local first, over = 1, {}
        for k, sp in ipairs(c.stage_peaks) do
          local n = c.layout.stages[k]
          if layouts.margin(sp, c.layout) > mem then
            over[#over + 1] = ('stage %d (children %d-%d) needs %s'):format(k - 1, first,
              first + n - 1, gib(sp))
          end
          first = first + n
        end
        why[c.name] = why[c.name] .. '; ' .. table.concat(over, ', ')
      end
    end
  end
  return why
end

function M.plan(model, o)
  local N, mem, optname = check(model, o)
  local B = o.input.shape[1]
  local loss = o.loss or default_loss
  local seq = is_sequential(model)
  local children = seq and model:children() or { model }
  local pipeline_ok = o.pipeline ~= false and seq and has_pipeline() and true or false

  local W, unit, ckpt_unit = memory.sizes(model)
  local gathered = memory.gathered(model)
  local state_factor = optname == 'sgd' and (o.momentum == 0 and 0 or 1) or 2
  local units, buckets = memory.shard_units(model)

  local list, skipped = layouts.enumerate{ devices = N, batch = B,
    children = seq and #children or nil, pipeline = pipeline_ok }
  if #list == 0 then
    raise(('plan: no layout splits the batch of %d over %d devices (make it a multiple of %d)')
      :format(B, N, N))
  end

  -- memory: one meta step per data-parallel batch and checkpointing
  local function run_of(l)
    return { batch = B / l.data, checkpoint = l.checkpoint }
  end
  local runs = {}
  for _, l in ipairs(list) do
    if l.pipeline == 1 then runs[#runs + 1] = run_of(l) end
  end
  local steps = memory.step(model, { input = o.input, target = o.target, loss = loss, runs = runs,
                                     memory = mem })
  local times, time_how, bw, bw_how = timing.for_layouts(children, list, B, o, N)

  -- Every replica of a pipeline holds the global batch it passes to pp:step.
  local function spec_bytes(v)
    if not v then return 0 end
    local n = em.empty(v.shape, { dtype = v.dtype or 'float32', device = 'meta' })
    return n:numel() * n:element_size()
  end
  local batch_bytes = spec_bytes(o.input) + spec_bytes(o.target)
  -- each layout weighed: its peak (per stage in a pipeline), step time and set-up
  local candidates, child_cache = {}, {}
  for _, l in ipairs(list) do
    local c = { layout = l, name = layouts.name(l) }
    if l.pipeline == 1 then
      local b = B / l.data
      local m = { weights = W, state = W * state_factor, units = units, buckets = buckets,
                  unit = l.checkpoint and ckpt_unit or unit,
                  gathered = l.checkpoint and gathered.checkpoint or gathered.plain,
                  step = steps[memory.key(run_of(l))] }
      c.peak, c.parts = layouts.data_memory(l, m)
      c.step_s = layouts.data_time(l, times[b], W, b, #units)
      -- setting up: the model as built, and ZeRO 3's shards and one unit beside it
      c.setup = W + (l.shard == 'parameters' and math.ceil(W / l.data) + unit or 0)
    else
      local mb = B / (l.data * l.chunks)
      local kids = plan_children.children(model, { input = o.input, target = o.target, loss = loss,
        batch = mb, checkpoint = l.checkpoint, cache = child_cache })
      local costs = {}
      for i, k in ipairs(kids) do
        costs[i] = k.params * (1 + 1 + state_factor) + k.held * math.min(l.pipeline, l.chunks)
      end
      local counts = layouts.cut(costs, l.pipeline)
      l.stages = counts
      c.peak, c.parts, c.stage_peaks = layouts.pipeline_memory(l,
        { state_factor = state_factor, loss = kids.loss, memory = mem, batch = batch_bytes },
        kids, counts,
        o.schedule or '1f1b')
      c.step_s = layouts.pipeline_time(l, times[mb], kids, counts, mb)
      c.setup = W      -- the model as built, before the other stages' children go
    end
    candidates[#candidates + 1] = c
  end
  local best = layouts.choose(candidates, mem)
  local why = reasons(candidates, skipped, mem)
  local smallest = candidates[1]
  for _, c in ipairs(candidates) do if c.peak < smallest.peak then smallest = c end end
  local chosen = best or smallest
  return setmetatable({
    fits = best ~= nil, layout = chosen.layout, peak_bytes = chosen.peak, step_s = chosen.step_s,
    candidates = candidates, why = why, memory = mem, devices = N, bandwidth = bw,
    bandwidth_how = bw_how, time_how = time_how, weights = W, optimizer = optname, sequential = seq,
    schedule = o.schedule or '1f1b', batch = B, dtype = o.dtype or 'float32',
  }, Plan)
end

-- -- The plan -------------------------------------------------------------------------------------
function Plan:print(out)
  return require('ember.distribute.plan.print').print(self, out)
end

function Plan.__tostring(self) return require('ember.distribute.plan.print').format(self) end

-- The model as the layout runs it: s:wrap (data parallel, sharded or not) or a
-- pipeline; with layout.checkpoint each child's forward runs under
-- em.nn.checkpoint. Every replica calls it.
function Plan:apply(s, model)
  if type(s) ~= 'table' or not s.wrap then
    raise('plan:apply: expected the strategy (em.distribute.mirrored{}), got ' .. core.kind(s))
  end
  model = model or self.model
  if not self.fits then
    raise(('plan:apply: no layout fits %s per device on %d devices; the smallest, %s, needs %s ' ..
      '(see plan.why)'):format(gib(self.memory), self.devices, layouts.name(self.layout),
      gib(self.peak_bytes)))
  end
  if s.world_size ~= self.devices then
    raise(('plan:apply: the plan is for %d devices, the strategy has %d replicas')
      :format(self.devices, s.world_size))
  end
  local l = self.layout
  if l.checkpoint then memory.checkpoint_children(model) end
  local shard = l.shard ~= 'none' and l.shard or nil
  local chosen
  for _, c in ipairs(self.candidates) do if c.layout == l then chosen = c end end
  -- the profiler's report shows each replica's measured peak beside this
  local function expect(stage)
    local peaks = chosen and chosen.stage_peaks
    require('ember.profile').expect { peak_bytes = peaks and peaks[stage + 1] or self.peak_bytes }
  end
  if l.pipeline == 1 then
    expect(0)
    return s:wrap(model, { shard = shard })
  end
  local pipeline = has_pipeline()
  if not pipeline then
    raise('plan:apply: the layout is a pipeline, and em.distribute.pipeline is not available ' ..
      'in this build (plan with pipeline = false)')
  end
  local pp = em.distribute.pipeline(model, { stages = l.pipeline, chunks = l.chunks,
    schedule = self.schedule, balance = l.stages, shard = shard, strategy = s })
  expect(pp.stage)
  return pp
end

-- The planner's probes draw random inputs; the caller's generator is left as it
-- was, so that a run planned first draws what an unplanned one draws. With
-- dtype = 'bfloat16' or 'float16' every probe -- the meta steps and the
-- timings -- runs under em.amp.autocast(dtype), as the step it plans for does:
-- weights, gradients and optimizer state stay float32, the activations the
-- autocast ops make are half.
return function(model, o)
  local rng = em.get_rng_state()
  local half = type(o) == 'table' and (o.dtype == 'bfloat16' or o.dtype == 'float16') and o.dtype
  local ok, p
  if half then ok, p = pcall(em.amp.autocast, half, M.plan, model, o)
  else ok, p = pcall(M.plan, model, o) end
  em.set_rng_state(rng)
  if not ok then error(p, 0) end
  rawset(p, 'model', model)
  return p
end

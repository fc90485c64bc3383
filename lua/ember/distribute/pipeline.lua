--[[
ember.distribute.pipeline -- pipeline parallelism (API.md, "Models larger than
one device", Pipeline): a Sequential cut into P stages of consecutive children,
micro-batches streaming through them.

  local pp = em.distribute.pipeline(model, {stages = P, chunks = M,
    schedule = '1f1b' | 'gpipe' | 'interleaved', virtual = V, balance = 'time' | 'memory' | {n1, ...},
    sample = x1, shard = ..., strategy = s, batch = 'global' | 'share'})  -- or s:pipeline(model, opts)
  local loss = pp:step(x, y, loss_fn)    -- a 0-d tensor (CPU), the same on every replica
  local loss = pp:step(x, y, loss_fn, scaler)   -- with an em.amp.GradScaler (pipeline/run.lua)
  opt:step()                             -- opt built on pp:parameters()

Layout. Replica r runs stage r % P on data index floor(r / P); its neighbours
are r - 1 and r + 1. With world size P x D the D replicas of a stage form a
group (s:group{stage, stage + P, ...}) that wraps the stage (g:wrap, with
`shard`): forwards run without averaging (no_sync) and the group is armed
just before the stage's last backward of the step, so the gradients --
accumulated over the micro-batches by then -- are averaged once.

A step. Every replica passes the batch (x, y): the first stage reads x, the
last y, the others only the shape of x (it names the shapes that travel, see
pipeline/wire.lua). With D data replicas that is the global batch, of which data
replica d takes rows d B/D + 1 .. (d + 1) B/D, so a script is the same whatever
layout the planner picks; batch = 'share' says each replica passes its own
share instead (a loader sharded by pp.data_index). The batch is split along dim 0 into M micro-batches; each stage
runs pipeline/schedule.lua's op list: a forward receives its input from the previous
stage (or slices x) and sends its output on; the last stage computes
loss_fn(out, y_i) / M and runs backward from it; the others run backward from
the gradient the next stage sends back, and send their input's gradient to the
previous stage. A micro-batch's tensors are dropped after its backward, so its
activations go then. The returned loss is the sum of the M terms -- the mean
over micro-batches of loss_fn's value -- averaged over data replicas, shared by
one allreduce.

Interleaving (schedule = 'interleaved', virtual = V, default 2). The
Sequential is cut into P x V pieces; rank r holds pieces r % P, r % P + P, ...
(its model chunks 1..V, pp.parts), so a micro-batch goes round the ranks V
times and the bubble falls to (p-1)/(v m + p-1). Rank r's neighbours are still
r - 1 and r + 1, wrapping round: the last rank feeds chunk c + 1 of the first.
Names: pp.module is then a Sequential of the chunks ("c.j.rest"), mapped to the
full model's names piece by piece. Data replicas wrap each chunk on its own,
because a wrapped model averages in one backward and a chunk's last backward
of the step is not the others'.

Memory. Every replica built the whole model (so that every one draws the same
initial weights as one device would); the pipeline moves the other stages'
children to the meta device, so a replica's memory is its stage's alone.

The bubble. Every blocking wait on a neighbour (receives, the sends' ends, the
closing allreduce) is timed; pp:stats().bubble is their share of the step.

Errors. Everything that can be wrong with the settings is checked before the
first communication, and from values every replica shares (the options, the
model, the batch's shape), so every replica raises the same error and none
waits for another.
]]
local em = require 'ember'
local core = require 'ember.ffi'
local dist = require 'ember.distribute'
local schedule = require 'ember.distribute.pipeline.schedule'
local cut = require 'ember.distribute.pipeline.cut'
local wire = require 'ember.distribute.pipeline.wire'
local handles = require 'ember.handles'
local raise, kind = core.raise, core.kind
local fmt = string.format

local M = {}

local Pipeline = {}
Pipeline.__index = Pipeline
M.Pipeline = Pipeline

local KNOWN = { stages = true, chunks = true, schedule = true, balance = true, shard = true,
                strategy = true, sample = true, virtual = true, batch = true }

local function is_int(v, least) return type(v) == 'number' and v % 1 == 0 and v >= least end

-- The other stages' children move to the meta device: their shapes stay (full
-- names, checkpoints), their memory goes, so that a replica holds its stage
-- only, as the planner counts it. LuaJIT's compiled traces may still reference
-- the old weights; flushing them lets the collection free those now.
-- A stage parameter -> {strategy, data_size} of its pipeline (weak keys; the value
-- holds no parameter, so it keeps none alive).
local of_param = setmetatable({}, { __mode = 'k' })
function M.of_parameter(p) return of_param[p] end

local function drop_others(children, keep)
  local moved = false
  for i, c in ipairs(children) do
    if not keep[i] and #c:parameters() + #c:buffers() > 0 then
      c:to('meta')
      moved = true
    end
  end
  if moved then
    jit.flush()
    handles.collect()
  end
end

-- The child counts per piece (P stages, or P x V with interleaving), checked
-- or computed.
local function stage_counts(s, children, o, P, what)
  local n = #children
  local b = o.balance
  if b == nil then
    local counts, q, rem = {}, math.floor(n / P), n % P
    for k = 1, P do counts[k] = q + (k <= rem and 1 or 0) end
    return counts
  end
  if type(b) == 'table' then
    if #b ~= P then
      raise(fmt('pipeline: balance lists %d stage sizes, %s', #b, what))
    end
    local sum = 0
    for k, c in ipairs(b) do
      if not is_int(c, 1) then
        raise(fmt('pipeline: balance[%d] must be a child count >= 1, got %s', k, tostring(c)))
      end
      sum = sum + c
    end
    if sum ~= n then
      raise(fmt('pipeline: balance {%s} sums to %d, the Sequential has %d children',
        table.concat(b, ', '), sum, n))
    end
    return b
  end
  if b ~= 'time' and b ~= 'memory' then
    raise(fmt("pipeline: balance must be 'time', 'memory' or a list of child counts, got %s",
      type(b) == 'string' and "'" .. b .. "'" or kind(b)))
  end
  local x = o.sample
  if not (type(x) == 'cdata' and pcall(function() return x.shape end)) then
    raise(fmt("pipeline: balance = '%s' measures the children on a sample micro-batch: pass " ..
      'sample = <an input tensor>', b))
  end
  local costs
  if b == 'time' then
    costs = cut.time_costs(children, x)
    -- replicas time differently: replica 0's costs decide everywhere
    local t = em.tensor(costs, { dtype = 'float64' }):to(s.device)
    costs = s:broadcast(t, 0):to('cpu'):totable()
  else
    costs = cut.memory_costs(children, x, math.min(o.chunks or o.stages, o.stages))
  end
  return cut.partition(costs, P), costs
end

function M.pipeline(model, o, s)
  if type(o) ~= 'table' then raise('pipeline: expected an options table, got ' .. kind(o)) end
  for k in pairs(o) do
    if not KNOWN[k] then
      raise(fmt("pipeline: unknown option '%s' (stages, chunks, schedule, virtual, balance, " ..
        'sample, shard, strategy, batch)', tostring(k)))
    end
  end
  s = s or o.strategy or dist.mirrored{}
  local nn = em.nn
  if type(model) ~= 'table' or not nn.Module.is_module(model) or model.__name ~= 'Sequential' then
    raise('pipeline: model must be an em.nn.Sequential (its children become stages), got ' ..
      (type(model) == 'table' and model.__name or kind(model)))
  end
  local children = {}
  for i = 1, rawget(model, 'n') do children[i] = model[i] end
  local P = o.stages
  if not is_int(P, 1) then raise('pipeline: stages must be an integer >= 1, got ' .. tostring(P)) end
  if P > #children then
    raise(fmt('pipeline: stages = %d, but the Sequential has only %s (each stage needs at least one child)',
      P, #children == 1 and '1 child' or (#children .. ' children')))
  end
  if s.world_size % P ~= 0 then
    raise(fmt('pipeline: the world size %d is not divisible by stages = %d (replicas run ' ..
      'stage rank %% %d; world = stages x data replicas)', s.world_size, P, P))
  end
  local batch = o.batch or 'global'
  if batch ~= 'global' and batch ~= 'share' then
    raise(fmt("pipeline: batch must be 'global' (every replica passes the whole batch) or " ..
      "'share' (each passes its data replica's rows), got %s",
      type(batch) == 'string' and "'" .. batch .. "'" or kind(batch)))
  end
  local chunks = o.chunks or P
  if not is_int(chunks, 1) then
    raise('pipeline: chunks must be an integer >= 1, got ' .. tostring(o.chunks))
  end
  local sched = o.schedule or '1f1b'
  if not schedule.NAMES[sched] then
    raise(fmt("pipeline: unknown schedule %s (expected '1f1b', 'gpipe' or 'interleaved')",
      type(sched) == 'string' and "'" .. sched .. "'" or kind(sched)))
  end
  local nested = sched == 'interleaved'
  local V = o.virtual
  if nested then
    V = V or 2
    if not is_int(V, 1) then
      raise('pipeline: virtual must be an integer >= 1 (model chunks per replica), got ' .. tostring(V))
    end
    if chunks % P ~= 0 then
      raise(fmt('pipeline: the interleaved schedule needs chunks a multiple of stages: ' ..
        'chunks = %d, stages = %d', chunks, P))
    end
  elseif V ~= nil and V ~= 1 then
    raise(fmt("pipeline: virtual = %s needs schedule = 'interleaved' (schedule is '%s')",
      tostring(V), sched))
  else
    V = 1
  end
  local pieces = P * V
  if pieces > #children then
    raise(fmt('pipeline: stages x virtual = %d x %d = %d pieces, but the Sequential ' ..
      'has only %s', P, V, pieces, #children == 1 and '1 child' or (#children .. ' children')))
  end
  local counts, costs = stage_counts(s, children, o, pieces,
    nested and fmt('stages x virtual = %d', pieces) or fmt('stages = %d', P))

  local stage, data = s.rank % P, math.floor(s.rank / P)
  -- piece k (0-based) starts at child starts[k + 1]
  local starts, at = {}, 1
  for k = 1, pieces do starts[k] = at; at = at + counts[k] end
  local parts, firsts, keep = {}, {}, {}
  for c = 1, V do
    local k = (c - 1) * P + stage + 1
    local mine = {}
    for j = 1, counts[k] do mine[j] = children[starts[k] + j - 1]; keep[starts[k] + j - 1] = true end
    parts[c], firsts[c] = nn.Sequential(mine), starts[k]
    if s.device ~= 'cpu' then parts[c]:to(s.device) end
  end
  local module = nested and nn.Sequential(parts) or parts[1]
  drop_others(children, keep)

  local pp = setmetatable({
    strategy = s, module = module, parts = parts, stage = stage, stages = P, chunks = chunks,
    virtual = V, nested = nested, schedule = sched, data_index = data, batch = batch,
    data_size = s.world_size / P, counts = counts, costs = costs, first_child = firsts[1],
    firsts = firsts, starts = starts, model_children = #children, _full = model,
    _stats = { bubble = 0, step_s = 0, peak_bytes = 0 },
  }, Pipeline)
  pp.shard_mode = 'pipeline'
  if pp.data_size > 1 then
    if type(s.group) ~= 'function' then
      raise('pipeline: data replicas of a stage (world size > stages) need s:group')
    end
    local ranks = {}
    for d = 0, pp.data_size - 1 do ranks[#ranks + 1] = d * P + stage end
    pp.group = s:group(ranks)
    pp.wrapped_parts = {}
    for c = 1, V do pp.wrapped_parts[c] = pp.group:wrap(parts[c], { shard = o.shard }) end
    if not nested then pp.wrapped = pp.wrapped_parts[1] end
  end
  -- its parameters know their pipeline (clip_grad_norm sums across its stages)
  local info = { strategy = s, data_size = pp.data_size }
  for _, p in ipairs(pp:parameters()) do of_param[p] = info end
  local prof = require 'ember.profile'
  pp._wait_s = 0
  pp._wire = wire.new(s, s.device, function(name, fn)
    local t0 = em.clock()
    prof.hooks.wait(name, fn)
    pp._wait_s = pp._wait_s + (em.clock() - t0)
  end)
  return pp
end

-- -- Methods --------------------------------------------------------------------------------
-- Running (step, forward) and naming (parameters, state, checkpoints) live in
-- files of their own.
for _, part in ipairs({ 'pipeline.run', 'pipeline.state' }) do
  for k, f in pairs(require('ember.distribute.' .. part)) do Pipeline[k] = f end
end
Pipeline.__call = Pipeline.forward

function Pipeline:zero_grad()
  for c, part in ipairs(self.parts) do
    local dm = self.wrapped_parts and self.wrapped_parts[c]
    ;(dm or part):zero_grad()
  end
end

function Pipeline:train(flag) self.module:train(flag); return self end
function Pipeline:eval() self.module:eval(); return self end

function Pipeline:stats()
  local s = self._stats
  return { bubble = s.bubble, step_s = s.step_s, peak_bytes = s.peak_bytes }
end

function Pipeline:__tostring()
  local held = {}
  for c, part in ipairs(self.parts) do
    held[c] = fmt('%d..%d', self.firsts[c], self.firsts[c] + rawget(part, 'n') - 1)
  end
  return fmt('pipeline stage %d of %d (children %s of %d, %s, %d chunks, data %d of %d)',
    self.stage, self.stages, table.concat(held, ', '), self.model_children, self.schedule,
    self.chunks, self.data_index, self.data_size)
end

return M

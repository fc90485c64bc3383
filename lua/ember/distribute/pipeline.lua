--[[
ember.distribute.pipeline -- pipeline parallelism (API.md, "Models larger than
one device", Pipeline): a Sequential cut into P stages of consecutive children,
micro-batches streaming through them.

  local pp = em.distribute.pipeline(model, {stages = P, chunks = M,
    schedule = '1f1b' | 'gpipe', balance = 'time' | 'memory' | {n1, ...},
    sample = x1, shard = ..., strategy = s})           -- or s:pipeline(model, opts)
  local loss = pp:step(x, y, loss_fn)    -- a 0-d tensor (CPU), the same on every replica
  opt:step()                             -- opt built on pp:parameters()

Layout. Replica r runs stage r % P on data index floor(r / P); its neighbours
are r - 1 and r + 1. With world size P x D the D replicas of a stage form a
group (s:group{stage, stage + P, ...}) that wraps the stage (g:wrap, with
`shard`): forwards run without averaging (no_sync) and the group is armed
just before the stage's last backward of the step, so the gradients --
accumulated over the micro-batches by then -- are averaged once.

A step. Every replica passes the batch (x, y): the first stage reads x, the
last y, the others only the shape of x (it names the shapes that travel, see
pipeline_wire). The batch is split along dim 0 into M micro-batches; each stage
runs pipeline_schedule's op list: a forward receives its input from the previous
stage (or slices x) and sends its output on; the last stage computes
loss_fn(out, y_i) / M and runs backward from it; the others run backward from
the gradient the next stage sends back, and send their input's gradient to the
previous stage. A micro-batch's tensors are dropped after its backward, so its
activations go then. The returned loss is the sum of the M terms -- the mean
over micro-batches of loss_fn's value -- averaged over data replicas, shared by
one allreduce.

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
local schedule = require 'ember.distribute.pipeline_schedule'
local cut = require 'ember.distribute.pipeline_cut'
local wire = require 'ember.distribute.pipeline_wire'
local handles = require 'ember.handles'
local raise, kind = core.raise, core.kind
local fmt = string.format

local M = {}

local Pipeline = {}
Pipeline.__index = Pipeline
M.Pipeline = Pipeline

local COLLECT_BYTES = 1024 * 1024

local KNOWN = { stages = true, chunks = true, schedule = true, balance = true, shard = true,
                strategy = true, sample = true }

local function is_int(v, least) return type(v) == 'number' and v % 1 == 0 and v >= least end

local function profiler()
  local ok, prof = pcall(require, 'ember.profile')
  return ok and type(prof) == 'table' and prof or {}
end

-- The other stages' children move to the meta device: their shapes stay (full
-- names, checkpoints), their memory goes, so that a replica holds its stage
-- only, as the planner counts it. LuaJIT's compiled traces may still reference
-- the old weights; flushing them lets the collection free those now.
local function drop_others(children, first, last)
  local moved = false
  for i, c in ipairs(children) do
    if (i < first or i > last) and #c:parameters() + #c:buffers() > 0 then
      c:to('meta')
      moved = true
    end
  end
  if moved then
    jit.flush()
    handles.collect()
  end
end

-- The child counts per stage, checked or computed.
local function stage_counts(s, children, o)
  local n, P = #children, o.stages
  local b = o.balance
  if b == nil then
    local counts, q, rem = {}, math.floor(n / P), n % P
    for k = 1, P do counts[k] = q + (k <= rem and 1 or 0) end
    return counts
  end
  if type(b) == 'table' then
    if #b ~= P then
      raise(fmt('pipeline: balance lists %d stage sizes, stages = %d', #b, P))
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
    costs = cut.memory_costs(children, x, math.min(o.chunks or P, P))
  end
  return cut.partition(costs, P), costs
end

function M.pipeline(model, o, s)
  if type(o) ~= 'table' then raise('pipeline: expected an options table, got ' .. kind(o)) end
  for k in pairs(o) do
    if not KNOWN[k] then
      raise(fmt("pipeline: unknown option '%s' (stages, chunks, schedule, balance, sample, " ..
        'shard, strategy)', tostring(k)))
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
    raise(fmt('pipeline: stages = %d, but the Sequential has only %d children', P, #children))
  end
  if s.world_size % P ~= 0 then
    raise(fmt('pipeline: the world size %d is not divisible by stages = %d (replicas run ' ..
      'stage rank %% %d; world = stages x data replicas)', s.world_size, P, P))
  end
  local chunks = o.chunks or P
  if not is_int(chunks, 1) then
    raise('pipeline: chunks must be an integer >= 1, got ' .. tostring(o.chunks))
  end
  local sched = o.schedule or '1f1b'
  if not schedule.NAMES[sched] then
    raise(fmt("pipeline: unknown schedule %s (expected '1f1b' or 'gpipe')",
      type(sched) == 'string' and "'" .. sched .. "'" or kind(sched)))
  end
  local counts, costs = stage_counts(s, children, o)

  local stage, data = s.rank % P, math.floor(s.rank / P)
  local first = 1
  for k = 1, stage do first = first + counts[k] end
  local mine = {}
  for j = 1, counts[stage + 1] do mine[j] = children[first + j - 1] end
  local module = nn.Sequential(mine)
  if s.device ~= 'cpu' then module:to(s.device) end
  drop_others(children, first, first + counts[stage + 1] - 1)

  local pp = setmetatable({
    strategy = s, module = module, stage = stage, stages = P, chunks = chunks,
    schedule = sched, data_index = data, data_size = s.world_size / P, counts = counts,
    costs = costs, first_child = first, model_children = #children, _full = model,
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
    pp.wrapped = pp.group:wrap(module, { shard = o.shard })
  end
  local prof = profiler()
  pp._wait_s = 0
  pp._wire = wire.new(s, s.device, function(name, fn)
    local t0 = em.clock()
    if prof._bubble then prof._bubble(name, fn) else fn() end
    pp._wait_s = pp._wait_s + (em.clock() - t0)
  end)
  return pp
end

-- -- Names ------------------------------------------------------------------------------------
-- A stage name "j.rest" is the full model's "(first + j - 1).rest".
function Pipeline:_full_name(name)
  local j, rest = name:match('^(%d+)(.*)$')
  return tostring(self.first_child + tonumber(j) - 1) .. rest
end

function Pipeline:_stage_name(name)
  local i, rest = name:match('^(%d+)(.*)$')
  i = tonumber(i)
  if not i or i < self.first_child or i >= self.first_child + self.counts[self.stage + 1] then
    return nil
  end
  return tostring(i - self.first_child + 1) .. rest
end

-- -- Running ----------------------------------------------------------------------------------
local function shape_key(t, rows)
  local sh = {}
  for i, d in ipairs(t.shape) do sh[i] = i == 1 and rows or d end
  return table.concat(sh, 'x') .. ':' .. tostring(t.dtype)
end

local function batch_rows(x, y, what)
  local t = x or y
  if not (type(t) == 'cdata' and pcall(function() return t.shape end)) then
    raise(fmt('pipeline: %s: expected the batch x (a tensor) on every replica, got %s', what,
      kind(x)))
  end
  if #t.shape == 0 then raise(fmt('pipeline: %s: the batch must have a first dimension', what)) end
  return t.shape[1]
end

function Pipeline:_run(inp)
  local dm = self.wrapped
  if dm then return dm:no_sync(function() return dm(inp) end) end
  return self.module(inp)
end

function Pipeline:step(x, y, loss_fn)
  if type(loss_fn) ~= 'function' and not (type(loss_fn) == 'table' and getmetatable(loss_fn)
      and getmetatable(loss_fn).__call) then
    raise('pipeline: step(x, y, loss_fn): loss_fn must be a function, got ' .. kind(loss_fn))
  end
  local rows = batch_rows(x, y, 'step')
  local Mc, P, st = self.chunks, self.stages, self.stage
  if Mc > rows then
    raise(fmt('pipeline: step: chunks = %d, but the batch has only %d rows (one micro-batch ' ..
      'needs at least one)', Mc, rows))
  end
  local last, firsts = st == P - 1, st == 0
  if last and y == nil then raise('pipeline: step: the last stage needs y') end
  local s, w, dev = self.strategy, self._wire, self.strategy.device
  local prev, nxt = s.rank - 1, s.rank + 1
  -- micro-batch i: rows [lo_i, lo_i + n_i) (1-based lo)
  local lo, n = {}, {}
  local q, rem, at = math.floor(rows / Mc), rows % Mc, 1
  for i = 1, Mc do
    n[i] = q + (i <= rem and 1 or 0)
    lo[i] = at
    at = at + n[i]
  end
  local prof = profiler()
  em.reset_peak_memory_stats(dev)
  self._wait_s = 0
  local base = em.memory_stats(dev).allocated
  local t0 = em.clock()
  local ops = schedule.ops(self.schedule, P, Mc, st)
  local live, total = {}, 0
  local last_b = ops[#ops][2]
  for _, op in ipairs(ops) do
    local i = op[2]
    local key = shape_key(x or y, n[i])
    if op[1] == 'F' then
      local inp
      if firsts then
        inp = x:narrow(1, lo[i], n[i]):to(dev)
      else
        inp = w:recv('act', key, prev):requires_grad_(true)
      end
      local out = self:_run(inp)
      local rec = { inp = inp, out = out }
      if last then
        local yi = y:narrow(1, lo[i], n[i]):to(dev)
        rec.loss = loss_fn(out, yi) / Mc
        rec.out = nil
      else
        w:send('act', key, out:detach(), nxt)
      end
      live[i] = rec
    else
      local rec = live[i]
      if self.wrapped and i == last_b then self.wrapped:arm() end
      if last then
        total = total + rec.loss:detach():to('cpu'):double():item()
        rec.loss:backward()
      else
        local g = w:recv_into(em.zeros(rec.out.shape, { dtype = rec.out.dtype, device = dev }), nxt)
        rec.out:backward(g)
      end
      if not firsts then
        local g = rec.inp.grad or em.zeros(rec.inp.shape, { dtype = rec.inp.dtype, device = dev })
        w:send(nil, nil, g, prev)
      end
      -- The micro-batch's activations go now: the tensors of its forward are
      -- garbage, whose memory Lua would hand back only at its next collection
      -- (a collection costs a millisecond or so: only when there is memory
      -- worth it to hand back).
      live[i] = nil
      rec = nil
      if em.memory_stats(dev).allocated - base > COLLECT_BYTES then handles.collect() end
    end
  end
  w:flush()
  local lt = em.tensor({ last and total / self.data_size or 0 }, { dtype = 'float32' }):to(dev)
  w.wait('pipeline.loss', function() s:allreduce(lt, 'sum') end)
  local step_s = em.clock() - t0
  local st_ = self._stats
  st_.step_s, st_.bubble = step_s, step_s > 0 and self._wait_s / step_s or 0
  st_.peak_bytes = em.memory_stats(dev).peak
  if prof._pipeline then
    prof._pipeline { stage = st, stages = P, chunks = Mc, schedule = self.schedule,
                     bubble = st_.bubble, step_s = step_s }
  end
  return lt:to('cpu'):reshape({})
end

-- The last stage's output for x, on every replica of this pipeline (no
-- autograd; x whole, one pass).
function Pipeline:forward(x)
  local rows = batch_rows(x, nil, 'forward')
  local s, w, dev, P, st = self.strategy, self._wire, self.strategy.device, self.stages, self.stage
  local key = shape_key(x, rows)
  local out = em.no_grad(function()
    local inp = st == 0 and x:to(dev) or w:recv('eval', key, s.rank - 1)
    return self.wrapped and self.wrapped:no_sync(function() return self.wrapped(inp) end)
      or self.module(inp)
  end)
  local base = s.rank - st
  if st < P - 1 then
    w:send('eval', key, out, s.rank + 1)
    out = w:recv('result', key, base + P - 1)
  else
    for k = 0, P - 2 do w:send('result', key, out, base + k) end
  end
  w:flush()
  return out
end
Pipeline.__call = Pipeline.forward

function Pipeline:parameters()
  return (self.wrapped or self.module):parameters()
end

function Pipeline:named_parameters()
  local list = {}
  for i, np in ipairs(self.module:named_parameters()) do list[i] = { self:_full_name(np[1]), np[2] } end
  return list
end

function Pipeline:zero_grad()
  return (self.wrapped or self.module):zero_grad()
end

function Pipeline:train(flag) self.module:train(flag); return self end
function Pipeline:eval() self.module:eval(); return self end

function Pipeline:state_dict()
  local sd = {}
  for k, v in pairs((self.wrapped or self.module):state_dict()) do sd[self:_full_name(k)] = v end
  return sd
end

-- sd holds full-model names; this stage takes its own (all of them) and
-- ignores the other stages'.
function Pipeline:load_state_dict(sd)
  if type(sd) ~= 'table' then raise('pipeline: load_state_dict: expected a table, got ' .. kind(sd)) end
  local own = {}
  for k, v in pairs(sd) do
    local name = self:_stage_name(k)
    if name then own[name] = v end
  end
  return (self.wrapped or self.module):load_state_dict(own)
end

-- What a sharded checkpoint saves and loads (the interface of
-- ember.checkpoint.target): every parameter and buffer of the whole model, in
-- its order and under its names; the other stages' parameters are empty
-- ranges. A stage whose data replicas shard it (shard = ...) holds, of each of
-- its parameters, the range [lo, hi) its group's sharded model gives this
-- replica, and every replica writes its own. Otherwise a stage's parameters are
-- held whole here ([0, numel)) and written by its replica of data index 0 only
-- (write = false on the others, which load them all the same).
-- optimizer_index[k] is the entry of pp:parameters()[k]. A buffer is written by
-- the replica that holds it on data index 0 (rank = its stage).
function Pipeline:shard_layout()
  local s, dev = self.strategy, self.strategy.device
  local writes = self.data_index == 0
  local own = {}                -- full name -> {t, lo, hi, pos, write}
  local dm = self.wrapped
  if dm and dm.shard_mode then
    local inner = dm:shard_layout()
    if inner.world_size ~= self.data_size or inner.rank ~= self.data_index then
      raise(fmt('pipeline: the stage\'s sharded model is replica %d of %d, the pipeline says ' ..
        'data index %d of %d', inner.rank, inner.world_size, self.data_index, self.data_size))
    end
    for k, p in ipairs(inner.params) do
      own[self:_full_name(p.name)] = { t = p.shard, lo = p.lo, hi = p.hi, pos = k, write = true }
    end
  end
  -- whole tensors: an unsharded stage's parameters, and those a sharded model
  -- leaves out (frozen ones), which its optimizer does not hold either
  for k, np in ipairs(self:named_parameters()) do
    if not own[np[1]] then
      own[np[1]] = { t = np[2], lo = 0, hi = np[2]:numel(),
                     pos = not (dm and dm.shard_mode) and k or nil, write = writes }
    end
  end
  local empty = em.zeros({ 0 }, { device = dev })
  local params, index = {}, {}
  for i, np in ipairs(self._full:named_parameters()) do
    local t, o = np[2], own[np[1]]
    local shape = {}
    for d, v in ipairs(t.shape) do shape[d] = v end
    params[i] = { name = np[1], shape = shape, dtype = t.dtype, numel = t:numel(),
                  lo = o and o.lo or 0, hi = o and o.hi or 0, shard = o and o.t or empty,
                  write = o ~= nil and o.write }
    if o and o.pos then index[o.pos] = i end
  end
  local bufs, mine = {}, {}
  for _, nb in ipairs(self.module:named_buffers()) do mine[self:_full_name(nb[1])] = nb[2] end
  for i, nb in ipairs(self._full:named_buffers()) do
    local j = tonumber(nb[1]:match('^(%d+)'))
    local owner = 0
    for k = 1, self.stages do
      local first = 1
      for q = 1, k - 1 do first = first + self.counts[q] end
      if j >= first and j < first + self.counts[k] then owner = k - 1 end
    end
    bufs[i] = { name = nb[1], tensor = mine[nb[1]], shape = nb[2].shape, dtype = nb[2].dtype,
                rank = owner, write = mine[nb[1]] ~= nil and writes }
  end
  return { mode = 'pipeline', world_size = s.world_size, rank = s.rank, params = params,
           buffers = bufs, optimizer_index = index }
end

-- A loader wrote new values into the shards: the stage's sharded model
-- gathers its weights from them before it next runs.
function Pipeline:invalidate()
  local dm = self.wrapped
  if dm and dm.invalidate then dm:invalidate() end
end

function Pipeline:stats()
  local s = self._stats
  return { bubble = s.bubble, step_s = s.step_s, peak_bytes = s.peak_bytes }
end

function Pipeline:__tostring()
  return fmt('pipeline stage %d of %d (children %d..%d of %d, %s, %d chunks, data %d of %d)',
    self.stage, self.stages, self.first_child, self.first_child + self.counts[self.stage + 1] - 1,
    self.model_children, self.schedule, self.chunks, self.data_index, self.data_size)
end

return M

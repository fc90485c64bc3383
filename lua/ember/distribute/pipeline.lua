--[[
ember.distribute.pipeline -- pipeline parallelism (API.md, "Models larger than
one device", Pipeline): a Sequential cut into P stages of consecutive children,
micro-batches streaming through them.

  local pp = em.distribute.pipeline(model, {stages = P, chunks = M,
    schedule = '1f1b' | 'gpipe' | 'interleaved', virtual = V, balance = 'time' | 'memory' | {n1, ...},
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
                strategy = true, sample = true, virtual = true }

local function is_int(v, least) return type(v) == 'number' and v % 1 == 0 and v >= least end

local function profiler()
  local ok, prof = pcall(require, 'ember.profile')
  return ok and type(prof) == 'table' and prof or {}
end

-- The other stages' children move to the meta device: their shapes stay (full
-- names, checkpoints), their memory goes, so that a replica holds its stage
-- only, as the planner counts it. LuaJIT's compiled traces may still reference
-- the old weights; flushing them lets the collection free those now.
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
        'sample, shard, strategy)', tostring(k)))
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
      'has only %d children', P, V, pieces, #children))
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
    virtual = V, nested = nested, schedule = sched, data_index = data,
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
-- Interleaved, a name "c.j.rest" is chunk c's: (firsts[c] + j - 1).rest.
function Pipeline:_full_name(name)
  if self.nested then
    local c, j, rest = name:match('^(%d+)%.(%d+)(.*)$')
    return tostring(self.firsts[tonumber(c)] + tonumber(j) - 1) .. rest
  end
  local j, rest = name:match('^(%d+)(.*)$')
  return tostring(self.first_child + tonumber(j) - 1) .. rest
end

-- The piece (0-based) that holds child i of the full model.
function Pipeline:_piece_of(i)
  for k = #self.starts, 1, -1 do
    if i >= self.starts[k] then return k - 1 end
  end
end

function Pipeline:_stage_name(name)
  local i, rest = name:match('^(%d+)(.*)$')
  i = tonumber(i)
  if not i or i < 1 or i > self.model_children then return nil end
  local k = self:_piece_of(i)
  if k % self.stages ~= self.stage then return nil end
  local c = math.floor(k / self.stages) + 1
  local j = tostring(i - self.firsts[c] + 1) .. rest
  return self.nested and tostring(c) .. '.' .. j or j
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

function Pipeline:_run(inp, c)
  local dm = self.wrapped_parts and self.wrapped_parts[c]
  if dm then return dm:no_sync(function() return dm(inp) end) end
  return self.parts[c](inp)
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
  local V = self.virtual
  local top = P * V - 1
  if st == P - 1 and y == nil then raise('pipeline: step: the last stage needs y') end
  local s, w, dev = self.strategy, self._wire, self.strategy.device
  local base = s.rank - st
  local prev, nxt = base + (st - 1) % P, base + (st + 1) % P
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
  local ops = schedule.ops(self.schedule, P, Mc, st, V)
  local live, total = {}, 0
  -- each chunk's last backward of the step: where its data replicas average
  local last_b = {}
  for k, op in ipairs(ops) do if op[1] == 'B' then last_b[op[3] or 1] = k end end
  for k, op in ipairs(ops) do
    local i, c = op[2], op[3] or 1
    local v = (c - 1) * P + st
    local firsts, last = v == 0, v == top
    local slot = (c - 1) * Mc + i
    local key = shape_key(x or y, n[i])
    if op[1] == 'F' then
      local inp
      if firsts then
        inp = x:narrow(1, lo[i], n[i]):to(dev)
      else
        inp = w:recv('act' .. v, key, prev):requires_grad_(true)
      end
      local out = self:_run(inp, c)
      local rec = { inp = inp, out = out }
      if last then
        local yi = y:narrow(1, lo[i], n[i]):to(dev)
        rec.loss = loss_fn(out, yi) / Mc
        rec.out = nil
      else
        w:send('act' .. (v + 1), key, out:detach(), nxt)
      end
      live[slot] = rec
    else
      local rec = live[slot]
      local dm = self.wrapped_parts and self.wrapped_parts[c]
      if dm and k == last_b[c] then dm:arm() end
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
      live[slot] = nil
      rec = nil
      if em.memory_stats(dev).allocated - base > COLLECT_BYTES then handles.collect() end
    end
  end
  w:flush()
  local lt = em.tensor({ st == P - 1 and total / self.data_size or 0 }, { dtype = 'float32' }):to(dev)
  w.wait('pipeline.loss', function() s:allreduce(lt, 'sum') end)
  local step_s = em.clock() - t0
  local st_ = self._stats
  st_.step_s, st_.bubble = step_s, step_s > 0 and self._wait_s / step_s or 0
  st_.peak_bytes = em.memory_stats(dev).peak
  if prof._pipeline then
    prof._pipeline { stage = st, stages = P, chunks = Mc, schedule = self.schedule,
                     virtual = V, bubble = st_.bubble, step_s = step_s }
  end
  return lt:to('cpu'):reshape({})
end

-- The last stage's output for x, on every replica of this pipeline (no
-- autograd; x whole, one pass).
function Pipeline:forward(x)
  local rows = batch_rows(x, nil, 'forward')
  local s, w, dev, P, st = self.strategy, self._wire, self.strategy.device, self.stages, self.stage
  local key = shape_key(x, rows)
  local base = s.rank - st
  local prev, nxt, top = base + (st - 1) % P, base + (st + 1) % P, P * self.virtual - 1
  local out
  for c = 1, self.virtual do
    local v = (c - 1) * P + st
    out = em.no_grad(function()
      local inp = v == 0 and x:to(dev) or w:recv('eval' .. v, key, prev)
      return self:_run(inp, c)
    end)
    if v < top then w:send('eval' .. (v + 1), key, out, nxt) end
  end
  if st < P - 1 then
    out = w:recv('result', key, base + P - 1)
  else
    for k = 0, P - 2 do w:send('result', key, out, base + k) end
  end
  w:flush()
  return out
end
Pipeline.__call = Pipeline.forward

-- The chunks' in order (a wrapped chunk's are what its optimizer updates).
function Pipeline:parameters()
  if not self.wrapped_parts then return self.module:parameters() end
  local list = {}
  for _, dm in ipairs(self.wrapped_parts) do
    for _, p in ipairs(dm:parameters()) do list[#list + 1] = p end
  end
  return list
end

function Pipeline:named_parameters()
  local list = {}
  for i, np in ipairs(self.module:named_parameters()) do list[i] = { self:_full_name(np[1]), np[2] } end
  return list
end

function Pipeline:zero_grad()
  for c, part in ipairs(self.parts) do
    local dm = self.wrapped_parts and self.wrapped_parts[c]
    ;(dm or part):zero_grad()
  end
end

function Pipeline:train(flag) self.module:train(flag); return self end
function Pipeline:eval() self.module:eval(); return self end

-- Each chunk's state under the full model's names.
function Pipeline:state_dict()
  local sd = {}
  for c, part in ipairs(self.parts) do
    local dm = self.wrapped_parts and self.wrapped_parts[c]
    local pre = self.nested and c .. '.' or ''
    for k, v in pairs((dm or part):state_dict()) do sd[self:_full_name(pre .. k)] = v end
  end
  return sd
end

-- sd holds full-model names; this stage takes its own (all of them) and
-- ignores the other stages'.
function Pipeline:load_state_dict(sd)
  if type(sd) ~= 'table' then raise('pipeline: load_state_dict: expected a table, got ' .. kind(sd)) end
  local own = {}
  for c = 1, #self.parts do own[c] = {} end
  for k, v in pairs(sd) do
    local name = self:_stage_name(k)
    if name then
      local c, rest = 1, name
      if self.nested then c, rest = name:match('^(%d+)%.(.*)$'); c = tonumber(c) end
      own[c][rest] = v
    end
  end
  for c, part in ipairs(self.parts) do
    local dm = self.wrapped_parts and self.wrapped_parts[c]
    ;(dm or part):load_state_dict(own[c])
  end
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
  local sharded = self.wrapped_parts and self.wrapped_parts[1].shard_mode
  if sharded then
    -- each piece's sharded model, its names "j.rest" counted from the piece's
    -- first child; positions run on through the pieces, as pp:parameters() does
    local pos = 0
    for c, dm in ipairs(self.wrapped_parts) do
      local inner = dm:shard_layout()
      if inner.world_size ~= self.data_size or inner.rank ~= self.data_index then
        raise(fmt('pipeline: the stage\'s sharded model is replica %d of %d, the pipeline ' ..
          'says data index %d of %d', inner.rank, inner.world_size, self.data_index,
          self.data_size))
      end
      for k, p in ipairs(inner.params) do
        local j, rest = p.name:match('^(%d+)(.*)$')
        own[tostring(self.firsts[c] + tonumber(j) - 1) .. rest] =
          { t = p.shard, lo = p.lo, hi = p.hi, pos = pos + k, write = true }
      end
      pos = pos + #inner.params
    end
  end
  -- whole tensors: an unsharded stage's parameters, and those a sharded model
  -- leaves out (frozen ones), which its optimizer does not hold either
  for k, np in ipairs(self:named_parameters()) do
    if not own[np[1]] then
      own[np[1]] = { t = np[2], lo = 0, hi = np[2]:numel(),
                     pos = not sharded and k or nil, write = writes }
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
    local owner = self:_piece_of(tonumber(nb[1]:match('^(%d+)'))) % self.stages
    bufs[i] = { name = nb[1], tensor = mine[nb[1]], shape = nb[2].shape, dtype = nb[2].dtype,
                rank = owner, write = mine[nb[1]] ~= nil and writes }
  end
  return { mode = 'pipeline', world_size = s.world_size, rank = s.rank, params = params,
           buffers = bufs, optimizer_index = index }
end

-- A loader wrote new values into the shards: the stage's sharded model
-- gathers its weights from them before it next runs.
function Pipeline:invalidate()
  for _, dm in ipairs(self.wrapped_parts or {}) do
    if dm.invalidate then dm:invalidate() end
  end
end

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

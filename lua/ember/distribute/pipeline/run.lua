--[[
ember.distribute.pipeline.run -- a pipeline's step and forward (the methods
pipeline.lua gives its objects): each stage runs its op list from
pipeline/schedule.lua, receiving and sending through pipeline/wire.lua; the essay atop
pipeline.lua says what a step is.
]]
local em = require 'ember'
local core = require 'ember.ffi'
local schedule = require 'ember.distribute.pipeline.schedule'
local handles = require 'ember.handles'
local prof = require 'ember.profile'
local raise, kind = core.raise, core.kind
local fmt = string.format

local Pipeline = {}

-- A step's micro-batches leave garbage; a collection hands their memory back
-- once there is this much of it (a collection costs a millisecond or so), or
-- less under a small cap (memlimit.garbage_worth). The planner's replay
-- (plan/pipeline.lua) assumes the same rule for the memory it plans.
Pipeline.COLLECT_BYTES = 1024 * 1024
function Pipeline.collect_bytes(capacity)
  return require('ember.memlimit').garbage_worth(capacity, Pipeline.COLLECT_BYTES)
end

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

-- -- A step, phase by phase ---------------------------------------------------------------

-- step's loss_fn and scaler, checked.
local function check_step(loss_fn, scaler)
  if type(loss_fn) ~= 'function' and not (type(loss_fn) == 'table' and getmetatable(loss_fn)
      and getmetatable(loss_fn).__call) then
    raise('pipeline: step(x, y, loss_fn): loss_fn must be a function, got ' .. kind(loss_fn))
  end
  if scaler ~= nil and not (type(scaler) == 'table' and type(scaler.scale) == 'function') then
    raise('pipeline: step(x, y, loss_fn, scaler): scaler must be an em.amp.GradScaler, got ' ..
      kind(scaler))
  end
end

-- The rows this replica's pipeline runs: under batch = 'global' with D data
-- replicas, its share of the global batch. Returns x, y and their row count.
local function own_rows(self, x, y)
  local rows = batch_rows(x, y, 'step')
  local D = self.data_size
  if D > 1 and self.batch == 'global' then
    if rows % D ~= 0 then
      raise(fmt('pipeline: step: the global batch has %d rows, which %d data replicas cannot ' ..
        "share evenly (pass a multiple of %d rows, or build the pipeline with batch = 'share' " ..
        'and pass each data replica its own rows)', rows, D, D))
    end
    rows = rows / D
    local at = self.data_index * rows + 1
    if x ~= nil then x = x:narrow(1, at, rows) end
    if y ~= nil then y = y:narrow(1, at, rows) end
  end
  if self.chunks > rows then
    raise(fmt('pipeline: step: chunks = %d, but the batch has only %d rows (one micro-batch ' ..
      'needs at least one)', self.chunks, rows))
  end
  if self.stage == self.stages - 1 and y == nil then raise('pipeline: step: the last stage needs y') end
  return x, y, rows
end

-- Micro-batch i: rows [lo[i], lo[i] + n[i]) (1-based lo), as even as they split.
local function micro_batches(rows, Mc)
  local lo, n = {}, {}
  local q, rem, at = math.floor(rows / Mc), rows % Mc, 1
  for i = 1, Mc do
    n[i] = q + (i <= rem and 1 or 0)
    lo[i] = at
    at = at + n[i]
  end
  return lo, n
end

-- The stage's op list over the micro-batches (b: {x, y, lo, n, loss_fn, scaler,
-- mem0, collect_at}). Returns the sum of the last stage's loss terms (0 elsewhere).
local function run_ops(self, b)
  local Mc, P, st, V = self.chunks, self.stages, self.stage, self.virtual
  local top = P * V - 1
  local s, w, dev = self.strategy, self._wire, self.strategy.device
  local base = s.rank - st
  local prev, nxt = base + (st - 1) % P, base + (st + 1) % P
  local x, y, lo, n = b.x, b.y, b.lo, b.n
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
        rec.loss = b.loss_fn(out, yi) / Mc
        rec.out = nil
      else
        rec.sent = w:send('act' .. (v + 1), key, out:detach(), nxt)
      end
      live[slot] = rec
    else
      local rec = live[slot]
      local dm = self.wrapped_parts and self.wrapped_parts[c]
      if dm and k == last_b[c] then dm:arm() end
      if last then
        total = total + rec.loss:detach():to('cpu'):double():item()
        ;(b.scaler and b.scaler:scale(rec.loss) or rec.loss):backward()
      else
        local g = w:recv_into(em.zeros(rec.out.shape, { dtype = rec.out.dtype, device = dev }), nxt)
        -- its gradient came back: the activation it answers was received
        w:settle(rec.sent)
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
      if em.memory_stats(dev).allocated - b.mem0 > b.collect_at then handles.collect() end
    end
  end
  w:flush()
  return total
end

-- After the op list: the loss on every stage (the last stage's sum, averaged
-- over the data replicas), the step's garbage collected, its stats kept and
-- given to the profiler. Returns the loss (a 0-D cpu tensor).
local function close_step(self, total, t0, mem0)
  local P, st, dev = self.stages, self.stage, self.strategy.device
  local lt = em.tensor({ st == P - 1 and total / self.data_size or 0 }, { dtype = 'float32' }):to(dev)
  self._wire.wait('pipeline.loss', function() self.strategy:allreduce(lt, 'sum') end)
  local step_s = em.clock() - t0
  -- What the step left dead (the garbage under collect_at, the sends' buffers)
  -- goes now: the next step starts from the same memory, as the planner's replay
  -- of a step assumes.
  if em.memory_stats(dev).allocated > mem0 then collectgarbage() end
  local stats = self._stats
  stats.step_s, stats.bubble = step_s, step_s > 0 and self._wait_s / step_s or 0
  stats.peak_bytes = em.memory_stats(dev).peak
  prof.hooks.pipeline_step { stage = st, stages = P, chunks = self.chunks,
    schedule = self.schedule, virtual = self.virtual, bubble = stats.bubble, step_s = step_s }
  return lt:to('cpu'):reshape({})
end

-- scaler (optional, an em.amp.GradScaler): the last stage runs backward from
-- scaler:scale(loss term), so every stage's gradients arrive scaled; the loss
-- returned is the unscaled one. Every stage then calls scaler:step(opt) and
-- scaler:update(), which agree on skipping across all stages.
local function step(self, x, y, loss_fn, scaler)
  check_step(loss_fn, scaler)
  local rows
  x, y, rows = own_rows(self, x, y)
  local lo, n = micro_batches(rows, self.chunks)
  local dev = self.strategy.device
  em.reset_peak_memory_stats(dev)
  self._wait_s = 0
  local ms0 = em.memory_stats(dev)
  local t0 = em.clock()
  local total = run_ops(self, { x = x, y = y, lo = lo, n = n, loss_fn = loss_fn, scaler = scaler,
    mem0 = ms0.allocated, collect_at = Pipeline.collect_bytes(ms0.capacity) })
  return close_step(self, total, t0, ms0.allocated)
end

-- The micro-batches' backwards leave their tensors to the pipeline, which
-- collects once they are dropped and worth it (above): no collection at each
-- backward's end (ember.handles), whose timing the planner's replay assumes.
function Pipeline:step(...)
  local was = handles.step_collects(false)
  local res = { pcall(step, self, ...) }
  handles.step_collects(was)
  if not res[1] then error(res[2], 0) end
  return unpack(res, 2, table.maxn(res))
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

return Pipeline

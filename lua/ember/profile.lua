--[[
ember.profile -- the profiler's Lua face (API.md, "em.profile"):

  em.profile.start{trace = 'trace.json', html = 'profile.html'}
  ... em.profile.step() at the end of each training step ...
  em.profile.range('augment', fn, ...)     -- fn as a named span, its results returned
  local r = em.profile.stop()              -- writes the files, returns the report
  r:print(); r:project{replicas = 8, gbps = 370}; em.profile.project{...}

Recording is core/profile/ (one buffer per thread, events at the dispatch point,
in autograd, the loader and the communicators). Here: stopping, joining the
replicas (join.lua), and handing the numbers to summary.lua (per replica),
report.lua (the breakdown and diagnosis), trace.lua and page.lua (the files).

Replicas. Under a strategy (ember --replicas N, or mpirun) every replica records
its own profile and calls stop() (as every replica runs the same script). stop()
then measures the communicator with a calibration allreduce, and one allgather
of text gives every replica every summary, timeline and trace part: threads and
MPI processes alike. Only replica 0 writes the files and ember --profile prints
only there.

Pipelines. em.distribute.pipeline wraps each blocking wait on a neighbour
stage in hooks.wait (a span of kind BUBBLE: the timeline shows it and the
breakdown gives it a share of its own) and reports each pp:step through
hooks.pipeline_step (stage, stages, chunks, schedule, its measured bubble, step time),
which the report sets against the formula (p-1)/(m+p-1) for the
'pipeline-bubble' diagnosis. M.expect{peak_bytes = n} (the planner's
prediction for this device) puts the prediction beside the measured peak.

Memory by kind (memory_kinds.lua): start() resets the devices' peaks and each
step() reads the step's peak against the parameters, gradients and optimizer
state then held, so that what is left is the activations; every replica's
figures travel with its summary.
]]
local ffi = require 'ffi'
local core = require 'ember.ffi'
local summary = require 'ember.profile.summary'
local report = require 'ember.profile.report'
local trace = require 'ember.profile.trace'
local join = require 'ember.profile.join'
local memory_kinds = require 'ember.memory_kinds'
local C, S = core.C, core.S

local M = {}

-- em.profile.hooks: how code that runs or schedules work reports it to the
-- profiler -- ember's modules, optimizers, loaders and pipelines call these, and
-- so may a user's own loop or scheduler. Each is a plain call (or nothing) while
-- nothing records.
local hooks = {}
M.hooks = hooks

local active          -- the options of the recording in progress
local last            -- the last report
local expected        -- the predicted peak bytes of this replica's device (expect{})

local function check(st) if st ~= 0 then core.fail() end end
local function pack(...) return { n = select('#', ...), ... } end

function M.start(o)
  o = o or {}
  if type(o) ~= 'table' then core.raise('profile.start: expected an options table, got ' .. type(o)) end
  for k in pairs(o) do
    if k ~= 'trace' and k ~= 'html' and k ~= 'auto_step' then
      core.raise("profile.start: unknown option '" .. tostring(k) ..
        "' (trace, html, auto_step)")
    end
  end
  for _, k in ipairs({ 'trace', 'html' }) do
    if o[k] ~= nil and type(o[k]) ~= 'string' then
      core.raise('profile.start: ' .. k .. ' must be a file path, got ' .. type(o[k]))
    end
  end
  local cfg = ffi.new('em_profile_config')
  cfg.auto_step = o.auto_step and 1 or 0
  check(C.em_profile_start(S, cfg))
  active = { trace = o.trace, html = o.html, auto = o.auto_step and true or false,
             t_start = C.em_profile_clock(), memory = memory_kinds.tracker(), notes = {} }
end

function M.active() return active ~= nil end

-- em.profile.note(name, fields): an instant event in the trace, kept with the
-- report (r.notes) and read by the diagnosis ('amp.scaler' notes: {scale = s,
-- found_inf = bool}). fields hold numbers, strings and booleans. A no-op when
-- not recording.
function M.note(name, fields)
  if type(name) ~= 'string' then
    core.raise('profile.note: name must be a string, got ' .. type(name))
  end
  if fields ~= nil and type(fields) ~= 'table' then
    core.raise('profile.note: fields must be a table, got ' .. type(fields))
  end
  if not active then return end
  local f = {}
  for k, v in pairs(fields or {}) do
    local t = type(v)
    if type(k) == 'string' and (t == 'number' or t == 'string' or t == 'boolean') then f[k] = v end
  end
  local n = active.notes
  n[#n + 1] = { name = name, t = C.em_profile_clock(), fields = f }
end

-- A module's forward as a span of its class name (nn.Module's __call while recording).
function hooks.module_forward(m, ...)
  if not active then return m:forward(...) end
  check(C.em_profile_range_push(S, 'module ' .. tostring(m.__name or 'Module'), C.EM_PROF_RANGE))
  local res = pack(pcall(m.forward, m, ...))
  C.em_profile_range_pop(S)
  if not res[1] then error(res[2], 0) end
  return unpack(res, 2, res.n)
end

function M.step()
  check(C.em_profile_step(S))
  if active then
    active.explicit = true
    active.counted_by = 'counted at em.profile.step()'
    active.memory:step()   -- the step's peak by kind; a new peak begins
  end
end

-- The loader handed out a batch: under auto_step (and no explicit steps) the
-- step mark the core makes there; the memory tracker's step too, counted only
-- if a backward ran since the last one (a training step, not an evaluation).
local handles = require 'ember.handles'
local function auto_memory_step(a)
  local n = handles.backwards
  a.memory:step(n == a.backwards_seen)
  a.backwards_seen = n
end
function hooks.batch_out()
  local a = active
  if not (a and a.auto) or a.explicit or a.by_optimizer then return end
  a.by_loader, a.counted_by = true, 'counted at each batch a loader handed out'
  auto_memory_step(a)
end

-- An optimizer's step ended: under auto_step, where no loader hands out batches
-- (a loop over tensors, pipeline steps), each optimizer step ends a step.
local function optimizer_step_end()
  local a = active
  if not (a and a.auto) or a.explicit or a.by_loader then return end
  a.by_optimizer, a.counted_by = true, 'counted at each optimizer step (no loader handed out a batch)'
  check(C.em_profile_step(S))   -- (the core then takes no loader's mark as a step)
  auto_memory_step(a)
end

function M.range(name, fn, ...)
  if type(name) ~= 'string' then core.raise('profile.range: name must be a string') end
  if type(fn) ~= 'function' then core.raise('profile.range: expected a function after the name') end
  if not active then return fn(...) end
  check(C.em_profile_range_push(S, name, C.EM_PROF_RANGE))
  local res = pack(pcall(fn, ...))
  C.em_profile_range_pop(S)
  if not res[1] then error(res[2], 0) end
  return unpack(res, 2, res.n)
end

-- For the optimizers: their step() as a span of its own kind, its result returned.
-- They pass their method and themselves rather than a closure over themselves: a
-- compiled trace keeps the closure it was recorded with alive, and with it the
-- optimizer, its parameters and its state.
function hooks.optimizer_step(name, fn, ...)
  if not active then return fn(...) end
  check(C.em_profile_range_push(S, name, C.EM_PROF_OPTIMIZER))
  local ok, res = pcall(fn, ...)
  C.em_profile_range_pop(S)
  if not ok then error(res, 0) end
  optimizer_step_end()
  return res
end

-- A pipeline stage blocked on a neighbour stage: fn as a bubble span, its results
-- returned; a plain call when not recording.
function hooks.wait(name, fn, ...)
  if not active then return fn(...) end
  check(C.em_profile_range_push(S, name, C.EM_PROF_BUBBLE))
  local res = pack(pcall(fn, ...))
  C.em_profile_range_pop(S)
  if not res[1] then error(res[2], 0) end
  return unpack(res, 2, res.n)
end

-- One pp:step of a pipeline stage: {stage, stages, chunks, schedule, virtual
-- (model chunks per stage, 1 unless interleaved), bubble (the measured share of
-- the step), step_s}. The recording keeps the layout and the
-- sums, for the mean bubble of the steps recorded.
function hooks.pipeline_step(o)
  if not active then return end
  if type(o) ~= 'table' or type(o.stages) ~= 'number' or type(o.chunks) ~= 'number' then
    core.raise('profile.hooks.pipeline_step: expected {stage, stages, chunks, schedule, bubble, ' ..
      'step_s}, got ' .. (type(o) == 'table' and 'a table without stages or chunks' or type(o)))
  end
  local p = active.pipeline
  if not p then p = { calls = 0, bubble_sum = 0, step_sum = 0 }; active.pipeline = p end
  p.stage, p.stages, p.chunks = o.stage or 0, o.stages, o.chunks
  p.schedule = tostring(o.schedule or '1f1b')
  p.virtual = tonumber(o.virtual) or 1
  p.calls = p.calls + 1
  if tonumber(o.bubble) then p.given = true end
  p.bubble_sum = p.bubble_sum + (tonumber(o.bubble) or 0)
  p.step_sum = p.step_sum + (tonumber(o.step_s) or 0)
end

-- em.profile.expect{peak_bytes = n}: the peak memory predicted for this replica's
-- device (the planner's plan.peak_bytes), shown beside the measured peak in the
-- report. It holds for every later recording; expect{} forgets it.
function M.expect(o)
  if type(o) ~= 'table' then
    core.raise('profile.expect: expected {peak_bytes = n}, got ' .. type(o))
  end
  for k in pairs(o) do
    if k ~= 'peak_bytes' then
      core.raise("profile.expect: unknown option '" .. tostring(k) .. "' (peak_bytes)")
    end
  end
  local n = o.peak_bytes
  if n ~= nil and (type(n) ~= 'number' or n < 0 or n ~= n) then
    core.raise('profile.expect: peak_bytes must be a number of bytes >= 0, got ' .. tostring(n))
  end
  expected = n
end

-- The pipeline figures of a recording, for the summary: the layout, the mean
-- bubble and step time, and the formula's bubble (p-1)/(v m+p-1) (v = 1 unless
-- interleaved). A pipeline that
-- gave no bubble of its own gets the breakdown's (its spans' share of the step).
local function pipeline_summary(p, breakdown)
  if not p or p.calls == 0 then return nil end
  local P, m, v = p.stages, p.chunks, p.virtual or 1
  return { stage = p.stage, stages = P, chunks = m, schedule = p.schedule, virtual = v,
           steps = p.calls, bubble = p.given and p.bubble_sum / p.calls or breakdown.bubble or 0,
           step_s = p.step_sum / p.calls, expected = (P - 1) / (v * m + P - 1) }
end

-- -- Stopping (joining the replicas is join.lua's) ---------------------------------------

local function write_file(path, text)
  local f, err = io.open(path, 'wb')
  if not f then core.raise('profile.stop: cannot write ' .. path .. ': ' .. tostring(err)) end
  local ok, werr = f:write(text)
  f:close()
  if not ok then core.raise('profile.stop: writing ' .. path .. ' failed: ' .. tostring(werr)) end
end

-- The timeline shown on the page: TIMELINE_STEPS steps from the middle of the run.
local TIMELINE_STEPS, TIMELINE_EVENTS = join.TIMELINE_STEPS, join.TIMELINE_EVENTS

-- local_only: skip the join (the script failed; the other replicas may be gone).
function M.stop(local_only)
  if not active then core.raise('profile.stop: not recording (call em.profile.start first)') end
  local o = active
  active = nil
  check(C.em_profile_stop(S))
  local p = summary.read(S)
  p.notes = {}                 -- on the profile's clock, as the events are
  for i, x in ipairs(o.notes) do
    p.notes[i] = { name = x.name, t = x.t - p.origin, fields = x.fields }
  end
  local stop_t = C.em_profile_clock() - p.origin
  local world = local_only and 1 or join.world_size()
  local strategy, rank = nil, 0
  if world > 1 then
    strategy = require('ember.distribute').mirrored {}
    rank = strategy.rank
  end
  local mine = summary.summarize(p, stop_t, o.auto, rank)
  mine.memory = o.memory:result()
  mine.sizes = memory_kinds.sizes()
  mine.pipeline = pipeline_summary(o.pipeline, mine.breakdown)
  mine.expected_peak = expected
  local first = math.max(1, math.floor(mine.steps / 2))
  local tl = summary.timeline(p, stop_t, o.auto, first, TIMELINE_STEPS, TIMELINE_EVENTS)
  local peak = { cpu = mine.peak_cpu }
  local reps, tls, parts, cal = { mine }, { tl }, nil, nil
  if strategy then
    cal = join.calibrate(strategy)
    local op_table = mine.op_table
    mine.op_table = nil
    local all = join.gather_strings(strategy, join.serialize { summary = mine, timeline = tl,
      origin = p.origin, trace = o.trace and trace.part(p, rank, 0) or '' })
    mine.op_table = op_table
    reps, tls, parts = {}, {}, {}
    for r, s in ipairs(all) do
      local x = join.deserialize(s)
      reps[r], tls[r], parts[r] = x.summary, x.timeline, x.trace
      peak[r == 1 and 'cpu' or ('cpu (rank ' .. (r - 1) .. ')')] = x.summary.peak_cpu
    end
    reps[rank + 1] = mine
  end
  local r = report.build(reps, cal, summary.top_ops(mine.op_table, 15), peak,
                         { world_size = world, rank = rank })
  -- how the steps were told apart, said with the count
  r.steps_counted = o.counted_by or 'the whole recording is one step: no em.profile.step(), ' ..
    (o.auto and 'loader batch or optimizer step' or 'and auto_step is off')
  r.timeline = join.merge_timelines(tls)
  if rank == 0 then
    if o.trace then
      local text
      if parts then text = trace.document(parts)     -- µs on the shared clock
      else text = trace.document({ trace.part(p, 0, p.origin) }) end
      write_file(o.trace, text)
      r.trace = o.trace
    end
    if o.html then
      write_file(o.html, require('ember.profile.page').render(r, r.timeline))
      r.html = o.html
    end
  end
  last = r
  return r
end

-- The scaling projection from the last report (or opts.report).
function M.project(opts)
  opts = opts or {}
  local r = opts.report or last
  if not r then core.raise('profile.project: no profile yet (em.profile.stop() makes one)') end
  return r:project(opts)
end

function M.last() return last end

-- -- ember --profile ------------------------------------------------------------------------
function M._host_start()
  M.start { trace = 'ember-trace.json', html = 'ember-profile.html', auto_step = true }
end

function M._host_stop(failed)
  if not active then return end
  local r = M.stop(failed)
  if r.rank == 0 then io.stdout:write('\n'); r:print() end
end

return M

--[[
ember.profile.summary -- what one replica's events say, in numbers: the steps,
where each step's time went, the ops, the collectives and the loader. The
report (report.lua) joins one summary per replica and diagnoses.

How a step's time is split. Only the step thread's track ("main") counts, over
the step intervals (between step marks):
  input          time blocked in the loader (DATA_WAIT),
  compute        time inside op kernels, forward and backward (OP: ops never
                 nest, so their durations add up without double counting),
  communication  time blocked on collectives (COMM_WAIT): the part not hidden
                 under compute; `peer_wait` is the share of it spent waiting
                 for slower replicas rather than moving bytes,
  bubble         time a pipeline stage sat blocked on a neighbour stage (BUBBLE
                 spans, em.distribute.pipeline's waits): whatever is recorded
                 inside a bubble (the receive's wait on the communicator, say)
                 counts as bubble, not as communication or compute, so that
                 the shares still add up to 1,
  host           the rest: Lua, dispatch, allocation, autograd bookkeeping.
Events are attributed to the step their start falls in.

Steps. With explicit em.profile.step() calls, step k runs from the previous
mark (or start) to mark k. With auto steps (ember --profile: each batch the
loader hands out ends a step) the interval before the first batch is set-up and
is left out, and so are intervals without a backward when others have one
(evaluation batches between training epochs are not training steps). Without
any mark the whole recording is one step.
]]
local ffi = require 'ffi'
local core = require 'ember.ffi'
local C = core.C

local M = {}

-- The ops that copy a tensor (to another layout, dtype or memory): the copy
-- diagnosis adds up their time and names who made them.
M.COPY_OPS = { clone = true, copy_ = true, contiguous = true, convert_layout = true,
               to = true, cast = true }

local K = {
  OP = C.EM_PROF_OP, BACKWARD = C.EM_PROF_BACKWARD, DATA_WAIT = C.EM_PROF_DATA_WAIT,
  LOADER_WORK = C.EM_PROF_LOADER_WORK, COLLECTIVE = C.EM_PROF_COLLECTIVE,
  COMM_WAIT = C.EM_PROF_COMM_WAIT, BUCKET_READY = C.EM_PROF_BUCKET_READY,
  GRAD = C.EM_PROF_GRAD, RANGE = C.EM_PROF_RANGE, OPTIMIZER = C.EM_PROF_OPTIMIZER,
  STEP = C.EM_PROF_STEP, COPY = C.EM_PROF_COPY, BUBBLE = C.EM_PROF_BUBBLE,
}
M.KIND = K

-- The category each kind shows as in the trace and on the page.
M.CATEGORY = {
  [K.OP] = 'op', [K.BACKWARD] = 'backward', [K.DATA_WAIT] = 'data',
  [K.LOADER_WORK] = 'loader', [K.COLLECTIVE] = 'collective', [K.COMM_WAIT] = 'comm-wait',
  [K.BUCKET_READY] = 'bucket', [K.GRAD] = 'grad', [K.RANGE] = 'range',
  [K.OPTIMIZER] = 'optimizer', [K.STEP] = 'step', [K.COPY] = 'copy', [K.BUBBLE] = 'bubble',
}

-- The finished profile of this state as a plain view: events (cdata array, 0-based),
-- n, tracks (1-based names), main (the step thread's track number, 0-based).
function M.read(S)
  local ev, n = ffi.new('const em_profile_event*[1]'), ffi.new('int64_t[1]')
  if C.em_profile_events(S, ev, n) ~= 0 then core.fail() end
  local tracks, main = {}, 0
  for t = 0, C.em_profile_num_tracks(S) - 1 do
    tracks[t + 1] = ffi.string(C.em_profile_track_name(S, t))
    if tracks[t + 1] == 'main' then main = t end
  end
  return { events = ev[0], n = tonumber(n[0]), tracks = tracks, main = main,
           origin = C.em_profile_origin(S), dropped = tonumber(C.em_profile_dropped(S)),
           peak_cpu = tonumber(C.em_profile_peak_bytes(S, -1)) }
end

-- Step boundaries on the main track: a list b[1..k+1] with step i = [b[i], b[i+1]).
local function step_bounds(p, stop_t, auto)
  local ev, marks = p.events, {}
  for i = 0, p.n - 1 do
    local e = ev[i]
    if e.kind == K.STEP and e.track == p.main then marks[#marks + 1] = e.t0 end
  end
  if #marks == 0 then return { 0, stop_t } end
  local b = {}
  if not auto then b[1] = 0 end
  for _, t in ipairs(marks) do b[#b + 1] = t end
  if #b < 2 then return { 0, stop_t } end
  return b
end

-- The steps: bounds b (step i = [b[i], b[i+1])), which of them count (keep[i]),
-- how many count (n) and their total time (span).
local function steps_of(p, stop_t, auto)
  local b = step_bounds(p, stop_t, auto)
  local keep = {}
  for i = 1, #b - 1 do keep[i] = true end
  if auto then
    local trained, any = {}, false
    local ev, lo = p.events, 1
    for i = 0, p.n - 1 do
      local e = ev[i]
      if e.kind == K.BACKWARD and e.track == p.main then
        while lo < #b and b[lo + 1] <= e.t0 do lo = lo + 1 end  -- events come sorted
        if lo < #b and e.t0 >= b[lo] then trained[lo] = true; any = true end
      end
    end
    if any then keep = trained end
  end
  local n, span = 0, 0
  for i = 1, #b - 1 do
    if keep[i] then n = n + 1; span = span + (b[i + 1] - b[i]) end
  end
  return { b = b, keep = keep, n = n, span = span }
end

-- Index of the counted step containing t, by binary search; nil outside them.
local function step_of(st, t)
  local b = st.b
  if t < b[1] or t >= b[#b] then return nil end
  local lo, hi = 1, #b - 1
  while lo < hi do
    local mid = math.floor((lo + hi + 1) / 2)
    if b[mid] <= t then lo = mid else hi = mid - 1 end
  end
  return st.keep[lo] and lo or nil
end

-- The bubbles on the main track, merged where they overlap (they may nest), as
-- a sorted list of {t0, t1}.
local function bubbles_of(p)
  local list, ev = {}, p.events
  for i = 0, p.n - 1 do
    local e = ev[i]
    if e.kind == K.BUBBLE and e.track == p.main then
      local last = list[#list]
      if last and e.t0 <= last[2] then last[2] = math.max(last[2], e.t1)
      else list[#list + 1] = { e.t0, e.t1 } end
    end
  end
  return list
end

-- The summary of one replica's profile p (from M.read). stop_t: the recording's
-- end on its clock; auto: steps were marked by the loader.
function M.summarize(p, stop_t, auto, rank)
  local b = steps_of(p, stop_t, auto)
  local nsteps = math.max(b.n, 1)
  local span = b.span
  local s = {
    rank = rank or 0, steps = nsteps, span_s = span, step_s = span / nsteps,
    input_s = 0, compute_s = 0, comm_s = 0, peer_wait_s = 0, backward_s = 0, bubble_s = 0,
    ops = 0, op_s = 0, grad_bytes = 0, coll_count = 0, coll_bytes = 0,
    coll_transfer_s = 0, coll_wait_s = 0, buckets = 0, bucket_bytes = 0,
    loader_workers = nil, loader_prefetch = nil, loader_busy_s = 0, loader_span_s = span,
    peak_cpu = p.peak_cpu, dropped = p.dropped, op_table = {},
    dtype_s = {}, copies = {}, copy_s = 0, layout_conversions = 0, layout_s = 0, notes = p.notes or {},
  }
  local ev, main = p.events, p.main
  local bw_end = -1          -- end of the enclosing backward node (they nest)
  local bub, bi = bubbles_of(p), 1
  for _, x in ipairs(bub) do
    if step_of(b, x[1]) then s.bubble_s = s.bubble_s + (x[2] - x[1]) end
  end
  -- whether a main-track event starting at t lies inside a bubble (events come
  -- sorted by their start, so one cursor walks the bubbles)
  local function in_bubble(t)
    while bub[bi] and bub[bi][2] < t do bi = bi + 1 end
    return bub[bi] ~= nil and bub[bi][1] <= t
  end
  -- The spans open on the main track (backward nodes, module forwards, user
  -- ranges), innermost last: what a copy ran inside of is who made it.
  local open = {}
  local function creator(t)
    while open[#open] and open[#open].t1 <= t do open[#open] = nil end
    local x = open[#open]
    if not x then return 'the step outside any module or backward node' end
    return x.kind == K.BACKWARD and ('backward of ' .. x.name) or x.name
  end
  for i = 0, p.n - 1 do
    local e = ev[i]
    local k, d = e.kind, e.t1 - e.t0
    if e.track == main and (k == K.BACKWARD or k == K.RANGE) then
      while open[#open] and open[#open].t1 <= e.t0 do open[#open] = nil end
      open[#open + 1] = { kind = k, name = ffi.string(e.name), t1 = e.t1 }
    end
    -- inside a bubble the stage waits on a neighbour: the time is the bubble's
    -- (counted above), though its ops still count as ops
    local inb = e.track == main and (k == K.OP or k == K.DATA_WAIT or k == K.COMM_WAIT) and
      in_bubble(e.t0)
    if inb and k ~= K.OP then
      -- nothing more to count
    elseif k == K.COLLECTIVE then
      if step_of(b, e.t0) then
        s.coll_count = s.coll_count + 1
        s.coll_bytes = s.coll_bytes + tonumber(e.bytes)
        s.coll_transfer_s = s.coll_transfer_s + (d - e.wait)
        s.coll_wait_s = s.coll_wait_s + e.wait
      end
    elseif k == K.LOADER_WORK then
      s.loader_busy_s = s.loader_busy_s + d
    elseif e.track == main and step_of(b, e.t0) then
      if k == K.OP then
        if not inb then s.compute_s = s.compute_s + d end
        s.ops = s.ops + 1
        local name = ffi.string(e.name)
        local o = s.op_table[name]
        if not o then o = { calls = 0, total_s = 0 }; s.op_table[name] = o end
        o.calls = o.calls + 1
        o.total_s = o.total_s + d
        if C.em_dtype_is_floating(e.dtype) ~= 0 then   -- a mask's bool is not a compute dtype
          local dt = ffi.string(C.em_dtype_name(e.dtype))
          s.dtype_s[dt] = (s.dtype_s[dt] or 0) + d
        end
        if M.COPY_OPS[name] then
          s.copy_s = s.copy_s + d
          if name == 'convert_layout' then
            s.layout_conversions, s.layout_s = s.layout_conversions + 1, s.layout_s + d
          end
          local by = creator(e.t0)
          local c = s.copies[by]
          if not c then c = { calls = 0, total_s = 0, ops = {} }; s.copies[by] = c end
          c.calls, c.total_s = c.calls + 1, c.total_s + d
          c.ops[name] = (c.ops[name] or 0) + 1
        end
      elseif k == K.DATA_WAIT then
        s.input_s = s.input_s + d
        s.loader_workers, s.loader_prefetch = tonumber(e.arg0), tonumber(e.arg1)
      elseif k == K.COMM_WAIT then
        s.comm_s = s.comm_s + d
        s.peer_wait_s = s.peer_wait_s + e.wait
      elseif k == K.BACKWARD then
        if e.t0 >= bw_end then s.backward_s = s.backward_s + d; bw_end = e.t1 end
      elseif k == K.GRAD then
        s.grad_bytes = s.grad_bytes + tonumber(e.bytes)
      elseif k == K.BUCKET_READY then
        s.buckets = s.buckets + 1
        s.bucket_bytes = s.bucket_bytes + tonumber(e.bytes)
      end
    end
  end
  -- per step
  for _, f in ipairs({ 'input_s', 'compute_s', 'comm_s', 'peer_wait_s', 'backward_s',
                       'bubble_s',
                       'grad_bytes', 'coll_count', 'coll_bytes', 'coll_transfer_s',
                       'coll_wait_s', 'buckets', 'bucket_bytes' }) do
    s[f] = s[f] / nsteps
  end
  s.copy_s, s.layout_conversions = s.copy_s / nsteps, s.layout_conversions / nsteps
  s.layout_s = s.layout_s / nsteps
  for dt, x in pairs(s.dtype_s) do s.dtype_s[dt] = x / nsteps end
  for _, c in pairs(s.copies) do c.calls, c.total_s = c.calls / nsteps, c.total_s / nsteps end
  s.ops_per_step = s.ops / nsteps
  s.mean_op_us = s.ops > 0 and s.compute_s * nsteps / s.ops * 1e6 or 0
  local host = s.step_s - s.input_s - s.compute_s - s.comm_s - s.bubble_s
  if host < 0 then host = 0 end
  s.host_s = host
  local total = s.input_s + s.compute_s + s.comm_s + s.bubble_s + host
  if total <= 0 then total = 1 end
  s.breakdown = { input = s.input_s / total, compute = s.compute_s / total,
                  communication = s.comm_s / total, host = host / total }
  -- only a pipeline stage has the share, so that other reports read as before
  if #bub > 0 then s.breakdown.bubble = s.bubble_s / total end
  return s
end

-- The summary's ops as {name, calls, total_s, mean_us}, largest total first.
function M.top_ops(op_table, limit)
  local list = {}
  for name, o in pairs(op_table) do
    list[#list + 1] = { name = name, calls = o.calls, total_s = o.total_s,
                        mean_us = o.total_s / o.calls * 1e6 }
  end
  table.sort(list, function(a, b) return a.total_s > b.total_s end)
  for i = #list, (limit or 15) + 1, -1 do list[i] = nil end
  return list
end

-- A few steps of this replica's events for the page: the window starts at step
-- `first` (clamped) and spans `count` steps; times in µs from the window's start
-- on the shared clock (origin_abs is where that start is, so replicas line up).
function M.timeline(p, stop_t, auto, first, count, max_events)
  local st = steps_of(p, stop_t, auto)
  local b = st.b
  local nsteps = #b - 1
  local kept = {}
  for i = 1, nsteps do if st.keep[i] then kept[#kept + 1] = i end end
  first = kept[math.max(1, math.min(first, #kept))] or 1
  local last = math.min(nsteps, first + count - 1)
  local t_lo, t_hi = b[first], b[last + 1]
  local out = { tracks = p.tracks, start_abs = p.origin + t_lo, steps = {}, events = {} }
  for i = first, last + 1 do out.steps[#out.steps + 1] = (b[i] - t_lo) * 1e6 end
  local ev = p.events
  for i = 0, p.n - 1 do
    local e = ev[i]
    if e.t1 >= t_lo and e.t0 <= t_hi and e.kind ~= K.STEP and e.kind ~= K.GRAD then
      if #out.events >= (max_events or 20000) then out.truncated = true; break end
      out.events[#out.events + 1] = {
        track = e.track + 1, name = ffi.string(e.name), cat = M.CATEGORY[e.kind],
        ts = (e.t0 - t_lo) * 1e6, dur = (e.t1 - e.t0) * 1e6,
      }
    end
  end
  return out
end

return M

--[[
ember.profile.report -- from one summary per replica (summary.lua) to the report
API.md describes: step time, breakdown, top ops, replicas, peak memory, the
diagnosis and a scaling projection, and r:print().

The diagnosis rules (the README lists them with these thresholds). Shares are of
the step time of the slowest-looking replica's view (replica 0 when alone):
  replica-skew         (2+ replicas) one replica's busy time per step (step minus
                       its data wait minus its wait for peers) exceeds the
                       fastest's by >= SKEW_SHARE of the step, and the others
                       spend >= half that difference waiting for peers inside
                       collectives. Names the slow replica and its extra time.
  communication-bound  exposed communication, less the wait for peers, is
                       >= COMM_SHARE of the step. The measured transfer time is
                       set against gradient bytes / the bandwidth a calibration
                       allreduce measured on this communicator, to tell
                       latency (many small allreduces), missing overlap
                       (exposed ~ all of it while backward would have hidden it)
                       and bandwidth apart.
  input-bound          data wait >= INPUT_SHARE of the step. Says whether to
                       add workers, raise prefetch, or lighten per-sample work.
  launch-bound         host >= HOST_SHARE of the step with >= MIN_OPS ops per
                       step averaging <= SMALL_OP_US µs.
  pipeline-bubble      (pipeline stages) a stage's measured bubble, the mean
                       share of pp:step it sat blocked on a neighbour stage,
                       exceeds the formula (p-1)/(v m+p-1) for p stages, m
                       chunks and v model chunks per stage (1 for GPipe and
                       1F1B, `virtual` when interleaved) by more than
                       BUBBLE_MARGIN of the step. The margin is the tolerance
                       the pipeline meets on stages of equal, known cost, so
                       what passes it is lost time: too few chunks for the
                       per-chunk costs, or uneven stages. Names the stage,
                       a chunk count (max(2m, 4p)) and what the formula gives
                       for it, interleaving (when not interleaved yet), and the slowest stage when the
                       stages' compute differs by STAGE_SKEW or more.
  balanced             none of the above.
A slow replica makes the others' collectives long: the waiting-for-peers part
of each collective tells skew from slow communication, and communication is
judged without it. Several kinds may hold at once; they are listed by the share
of the step each explains (skew: the others' wait for peers; communication: the
exposed transfer; input: the data wait; launch: the host time). The local
communicator records when every replica had arrived; MPI does not say, and
there each replica's wait for peers is estimated from the joined summaries as
its exposed communication less the smallest any replica had (the last replica
to arrive waits for nobody, so its wait is the transfer alone).

The scaling projection (r.projection, r:project) is projection.lua's; the text
(r:lines(), r:print(), tostring(r)) is report_text.lua's.
]]
local projection = require 'ember.profile.projection'
local diagnosis = require 'ember.profile.diagnosis'

local M = {}

M.INPUT_SHARE, M.HOST_SHARE, M.COMM_SHARE, M.SKEW_SHARE = 0.20, 0.35, 0.20, 0.10
M.MIN_OPS, M.SMALL_OP_US = 50, 50
M.BUBBLE_MARGIN, M.STAGE_SKEW = 0.05, 1.25
-- The projection's: communication figures assumed when none was measured, the
-- sharded modes, and project() itself (r:project).
M.DEFAULT_LATENCY_S, M.ASSUMED_GBPS = projection.DEFAULT_LATENCY_S, projection.ASSUMED_GBPS
M.MODES, M.MODE_LABEL = projection.MODES, projection.MODE_LABEL
M.traffic, M.memory, M.project = projection.traffic, projection.memory, projection.project

local function ms(s) return string.format('%.2f ms', s * 1e3) end
local function pct(x) return string.format('%.0f%%', x * 100) end
local function mb(b) return string.format('%.2f MB', b / 1e6) end

-- -- Diagnosis -----------------------------------------------------------------------------

local function diagnose_skew(reps)
  if #reps < 2 then return nil end
  local busy, slow, fast = {}, 1, 1
  for i, r in ipairs(reps) do
    busy[i] = r.step_s - r.input_s - r.peer_wait_s - (r.bubble_s or 0)
    if busy[i] > busy[slow] then slow = i end
    if busy[i] < busy[fast] then fast = i end
  end
  local extra = busy[slow] - busy[fast]
  local step = reps[slow].step_s
  if extra < M.SKEW_SHARE * step then return nil end
  local wait, others = 0, 0
  for i, r in ipairs(reps) do
    if i ~= slow then wait = wait + r.peer_wait_s; others = others + 1 end
  end
  wait = wait / others
  if wait < 0.5 * extra then return nil end
  return { kind = 'replica-skew', message = string.format(
    'Replica %d is slower: it is busy %s more per step than replica %d (%s against %s), ' ..
    'and the other replicas wait %s per step for it inside their collectives (%s of the ' ..
    'step). Look at what differs on replica %d: its data shard (larger or harder ' ..
    'samples), other work on its cores or device, or a slower device.',
    reps[slow].rank, ms(extra), reps[fast].rank, ms(busy[slow]), ms(busy[fast]), ms(wait),
    pct(wait / step), reps[slow].rank),
    slow_rank = reps[slow].rank, extra_s = extra, share = wait / step }
end

local function diagnose_comm(s, world, cal)
  local exposed = s.comm_s - s.peer_wait_s
  if world < 2 or exposed < M.COMM_SHARE * s.step_s then return nil end
  local bw = cal and cal.gbps and cal.gbps * 1e9 or M.ASSUMED_GBPS * 1e9
  local lat = cal and cal.latency_s or M.DEFAULT_LATENCY_S
  local factor = 2 * (world - 1) / world
  local expected = s.coll_count * lat + factor * s.coll_bytes / bw
  local head = string.format('Communication is exposed for %s of the step (%s of a %s step): ' ..
    '%d allreduce%s per step move %s in %s, against %s expected from %s at %.2f GB/s ' ..
    '(%s) and %.0f µs latency each.', pct(exposed / s.step_s), ms(exposed), ms(s.step_s),
    math.floor(s.coll_count + 0.5), s.coll_count >= 1.5 and 's' or '', mb(s.coll_bytes),
    ms(s.coll_transfer_s), ms(expected), 'gradient bytes / bandwidth', bw / 1e9,
    cal and cal.gbps and 'measured by a calibration allreduce on this communicator'
      or 'assumed', lat * 1e6)
  local cause
  local per = s.coll_count > 0 and s.coll_bytes / s.coll_count or 0
  if s.coll_count >= 8 and per < 1e6 and s.coll_count * lat >= 0.3 * s.coll_transfer_s then
    cause = string.format(' Latency: too many small allreduces (%.0f KB each); raise ' ..
      'bucket_mb in wrap{} so fewer, larger buckets go out.', per / 1e3)
  elseif exposed >= 0.7 * s.coll_transfer_s and s.backward_s >= 0.5 * s.coll_transfer_s then
    cause = ' Missing overlap: nearly all of it waits after backward although backward ' ..
      'lasts long enough to hide it; average gradients with DistributedModel (buckets go ' ..
      'out during backward) and keep bucket_mb small enough that the first bucket closes early.'
  else
    cause = ' Bandwidth: the link is the limit. Send fewer bytes (bfloat16 gradients, or ' ..
      'no_sync() to accumulate several steps per allreduce), or use a faster interconnect; ' ..
      'em.profile.project{} shows what more replicas would cost.'
  end
  return { kind = 'communication-bound', message = head .. cause,
           expected_s = expected, measured_s = s.coll_transfer_s, share = exposed / s.step_s }
end

local function cores() return require('ember.ffi').cpu_count() end

local function diagnose_input(s)
  if s.breakdown.input < M.INPUT_SHARE then return nil end
  local msg = string.format('Input-bound: the step waits for data %s of the time (%s per ' ..
    'step). ', pct(s.breakdown.input), ms(s.input_s))
  local w, p = s.loader_workers or 0, s.loader_prefetch or 0
  if w == 0 then
    msg = msg .. string.format('The loader has no workers, so the training thread makes ' ..
      'every batch itself: pass workers = %d (this machine has %d cores) to loader{}.',
      math.max(2, cores() - 1), cores())
  else
    local busy = s.loader_span_s > 0 and s.loader_busy_s / (w * s.loader_span_s) or 1
    if busy >= 0.8 then
      msg = msg .. string.format('Its %d workers are busy %s of the time: per-sample ' ..
        'work (map, transforms, decoding) is too heavy for them. Raise workers (this ' ..
        'machine has %d cores), or make each sample cheaper: decode or resize once ' ..
        'ahead of training, batch before map, and keep maps in C transforms.', w,
        pct(math.min(busy, 1)), cores())
    else
      msg = msg .. string.format('Its %d workers are idle %s of the time while the step ' ..
        'waits, so batches are not requested early enough: raise prefetch (now %d).', w,
        pct(1 - busy), p)
    end
  end
  return { kind = 'input-bound', message = msg, share = s.breakdown.input }
end

local function diagnose_launch(s)
  if s.breakdown.host < M.HOST_SHARE or s.ops_per_step < M.MIN_OPS or
     s.mean_op_us > M.SMALL_OP_US then return nil end
  return { kind = 'launch-bound', message = string.format('Launch-bound: per-op overhead ' ..
    'dominates. Each step runs %d ops averaging %.1f µs, and %s of the step is spent ' ..
    'outside kernels (Lua, dispatch, allocation, autograd). Run the step through ' ..
    'em.compile (its kernels replayed with nothing between them: step:explain() says ' ..
    'whether it replays), or give each op more work: larger batches, fused ops (nn layers ' ..
    'and functional ops instead of chains of small element-wise ones), fewer per-element ' ..
    'Lua loops.', math.floor(s.ops_per_step + 0.5), s.mean_op_us, pct(s.breakdown.host)),
    share = s.breakdown.host }
end

-- The formula's bubble share for p stages, m chunks and v model chunks per
-- stage (interleaved; 1 otherwise).
function M.bubble_formula(p, m, v) return (p - 1) / ((v or 1) * m + p - 1) end

local function diagnose_bubble(reps)
  local worst, excess
  for _, r in ipairs(reps) do
    local pl = r.pipeline
    if pl and pl.stages > 1 then
      local x = pl.bubble - pl.expected
      if not excess or x > excess then worst, excess = r, x end
    end
  end
  if not worst or excess <= M.BUBBLE_MARGIN then return nil end
  local pl = worst.pipeline
  local p, m, v = pl.stages, pl.chunks, pl.virtual or 1
  local more = math.max(2 * m, 4 * p)
  local formula = v > 1 and string.format('(p-1)/(v m+p-1) gives for p = %d stages, m = %d ' ..
    'chunks and v = %d model chunks per stage (interleaved)', p, m, v) or
    string.format('(p-1)/(m+p-1) gives for p = %d stages and m = %d chunks (GPipe and 1F1B ' ..
    'alike)', p, m)
  local msg = string.format('Pipeline bubble: stage %d of %d sits idle %s of each ' ..
    'pp:step (%s of %s), against %s that the schedule\'s formula %s. ', pl.stage, p,
    pct(pl.bubble), ms(pl.bubble * pl.step_s), ms(pl.step_s), pct(pl.expected), formula)
  -- uneven stages keep the others waiting whatever the chunk count
  local slow, fast
  for _, r in ipairs(reps) do
    if r.pipeline then
      if not slow or r.compute_s > slow.compute_s then slow = r end
      if not fast or r.compute_s < fast.compute_s then fast = r end
    end
  end
  if slow and slow ~= fast and
     slow.compute_s >= M.STAGE_SKEW * math.max(fast.compute_s, 1e-12) then
    msg = msg .. string.format('The stages are uneven: stage %d computes %s per step against ' ..
      '%s on stage %d, and the others wait for it; cut the model by measured time ' ..
      '(balance = \'time\') or move children off stage %d. ', slow.pipeline.stage,
      ms(slow.compute_s), ms(fast.compute_s), fast.pipeline.stage, slow.pipeline.stage)
  end
  msg = msg .. string.format('Raise chunks to %d (the formula then gives %s; each ' ..
    'micro-batch has 1/%d of the batch, so keep it large enough to keep the kernels busy)',
    more, pct(M.bubble_formula(p, more, v)), more)
  if v > 1 then
    msg = msg .. '.'
  else
    msg = msg .. string.format(", or interleave (schedule = 'interleaved', virtual = 2: two " ..
      'smaller stages per device, which halves the bubble; the formula then gives %s).',
      pct(M.bubble_formula(p, m, 2)))
  end
  return { kind = 'pipeline-bubble', message = msg, stage = pl.stage, rank = worst.rank,
           bubble = pl.bubble, expected = pl.expected, chunks_advised = more,
           share = pl.bubble }
end

-- Without a measured arrival time (MPI), a replica's wait for peers is what it
-- spent blocked on collectives beyond the least any replica spent.
local function estimate_peer_waits(reps)
  if #reps < 2 then return end
  for _, r in ipairs(reps) do
    if r.coll_wait_s > 0 or r.peer_wait_s > 0 then return end   -- measured
  end
  local least = math.huge
  for _, r in ipairs(reps) do least = math.min(least, r.comm_s) end
  for _, r in ipairs(reps) do
    r.peer_wait_s = r.comm_s - least
    r.peer_wait_estimated = true
  end
end

function M.diagnose(reps, cal)
  estimate_peer_waits(reps)
  local out = {}
  local skew = diagnose_skew(reps)
  if skew then out[#out + 1] = skew end
  local bubble = diagnose_bubble(reps)
  if bubble then out[#out + 1] = bubble end
  local worst = reps[1]
  for _, r in ipairs(reps) do
    if r.comm_s - r.peer_wait_s > worst.comm_s - worst.peer_wait_s then worst = r end
  end
  local c = diagnose_comm(worst, #reps, cal)    -- the wait for peers is not counted
  if c then out[#out + 1] = c end
  local d = diagnose_input(reps[1])
  if d then out[#out + 1] = d end
  d = diagnose_launch(reps[1])
  if d then out[#out + 1] = d end
  for _, x in ipairs(diagnosis.all(reps[1])) do out[#out + 1] = x end  -- copies, amp, layout
  -- several may hold: the one that explains most of the step comes first
  table.sort(out, function(x, y) return x.share > y.share end)
  if #out == 0 then
    local s = reps[1]
    out[1] = { kind = 'balanced', message = string.format('Balanced: no bottleneck stands ' ..
      'out. Of a %s step, compute takes %s, host %s, input %s and communication %s; ' ..
      'to go faster, make the kernels themselves faster (larger or better-shaped ops) ' ..
      'or add replicas (see the projection).', ms(s.step_s), pct(s.breakdown.compute),
      pct(s.breakdown.host), pct(s.breakdown.input), pct(s.breakdown.communication)) }
  end
  return out
end

-- -- The report ------------------------------------------------------------------------------

local Report = {}
Report.__index = Report

-- reps: summaries ordered by rank (reps[1] is this process's view when alone);
-- cal: {gbps, latency_s} or nil; top_ops from rank 0.
function M.build(reps, cal, top_ops, peak_bytes, extra)
  estimate_peer_waits(reps)
  local s = reps[1]
  local r = setmetatable({
    steps = s.steps, step_s = s.step_s, breakdown = s.breakdown, top_ops = top_ops,
    replicas = {}, peak_bytes = peak_bytes, ops_per_step = s.ops_per_step,
    mean_op_us = s.mean_op_us, dropped = s.dropped,
    dtype_share = diagnosis.dtype_share(s), notes = s.notes or {},
  }, Report)
  if #reps > 1 then
    local worst = 0
    for i, x in ipairs(reps) do
      r.replicas[i] = { rank = x.rank, step_s = x.step_s, breakdown = x.breakdown,
                        wait_s = x.peer_wait_s, memory = x.memory, pipeline = x.pipeline,
                        peak_bytes = x.memory and x.memory.peak or x.peak_cpu,
                        expected_peak_bytes = x.expected_peak }
      worst = math.max(worst, x.step_s)
    end
    r.step_s = worst          -- replicas move in lockstep: the slowest sets the pace
  end
  r.diagnosis = M.diagnose(reps, cal)
  local mine = reps[(extra and extra.rank or 0) + 1] or s
  r.memory = mine.memory
  r.pipeline = mine.pipeline
  r.expected_peak_bytes = mine.expected_peak
  r.measured_peak_bytes = mine.memory and mine.memory.peak or mine.peak_cpu
  local sizes = mine.sizes or {}
  local exposed = s.comm_s
  local G = s.bucket_bytes > 0 and s.bucket_bytes or s.grad_bytes
  local P = sizes.param_bytes or 0
  -- a sharded run's gradients are the whole model's, whatever its buckets carried
  if (sizes.mode or 'plain') ~= 'plain' and P > 0 then G = P end
  if G == 0 then G = P end
  r._base = { compute_s = math.max(s.step_s - exposed, 1e-9), backward_s = s.backward_s,
              grad_bytes = G, param_bytes = P > 0 and P or G,
              state_ratio = sizes.state_ratio or 0,
              -- (what a replica holds besides its model: the same at any count)
              activations = mine.memory and (mine.memory.activations + (mine.memory.other or 0)) or 0,
              mode = sizes.mode or 'plain',
              buckets = s.buckets > 0 and s.buckets or 1,
              gbps = cal and cal.gbps, latency_s = cal and cal.latency_s }
  r.projection = M.project(r._base, {})
  for k, v in pairs(extra or {}) do r[k] = v end
  return r
end

function Report:project(o) return M.project(self._base, o) end

-- r:lines(): report_text.lua.
Report.lines = require('ember.profile.report_text').lines

function Report:print() print(table.concat(self:lines(), '\n')) end
Report.__tostring = function(self) return table.concat(self:lines(), '\n') end

M.Report = Report
return M

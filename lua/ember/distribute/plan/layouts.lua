--[[
ember.distribute.plan.layouts -- the planner's arithmetic, pure functions of the
measurements (no tensors): which layouts there are for N devices, what each one
holds per device and how long its step takes, which one wins, and how a
pipeline cuts a Sequential into stages.

A layout is {data = D, pipeline = P, shard = 'none' | 'optimizer' | 'gradients'
| 'parameters', checkpoint = bool, chunks = M} with D x P = N.

Memory of data parallel (P = 1), per device. From the meta step at the
per-replica batch (plan_memory.step): each backward segment's peak, plus the
gradients the layout holds at that point, plus what is resident all along:

  shard        weights      gradients during backward              optimizer
  none         W            W (wrap's buckets, from wrap time)     S
  optimizer    W            flat buckets made so far (they stay)   S/N
  gradients    W            flat buckets in flight, slices /N      S/N
  parameters   W/N + U      flat units alive, replayed; slices /N   S/N

(W weights, S optimizer state: 2W for Adam, W for SGD's momentum; U the largest
module's weights, gathered for its forward and backward -- under checkpointing
the largest child's, whose recompute gathers all of its modules; shard.lua reduces at
most MAX_IN_FLIGHT units at once, plus the one filling. ZeRO 3's flat buffers
are replayed unit by unit over the backward's segments, as ZeRO 1 and 2's
buckets are: flat_grads.) After
backward the optimizer step holds weights, final gradients (W, or W/N), state and what the
backward left (its garbage included, as the meta step measured it). ZeRO 1 and
2 gather every unit's weights at the next forward: W more, for a moment.

Pipelines (P > 1): each stage's memory is a replay of its schedule
(plan/pipeline.lua, which says what a stage holds).

Time: the forward and backward seconds of the children, measured at the
layout's own per-replica batch or micro-batch (replica 0 timing alone), times
the slowdown of all replicas computing at once on shared CPU cores (t.share);
checkpointing adds a forward; gradients cost 2(D-1)/D of their bytes over the
link (ring allreduce), ZeRO 2 and 3 a reduce-scatter and allgathers of (D-1)/D
each, and every collective a measured latency (ZeRO 3: two allgathers and a
reduce-scatter per unit); a pipeline's step is (M + P - 1) micro-batch slots of
its slowest stage (the bubble is (P - 1)/(M + P - 1) of it), each with its two
point-to-point messages (bytes and latency). Communication is counted as not
overlapping computation: an upper bound.

A margin is added to every predicted peak, so that a layout said to fit does
not run out of memory through what the model leaves out (the data loader's
tensors, Lua's collector running late, the communicators' small buffers): a
SAFETY share of it and SAFETY_BYTES more, the largest under-prediction the
planner's grid measured on its smallest models (tests/bench/bench_plan_grid.lua),
where such fixed costs are a large share of the peak; checkpointed pipelines
take a larger share (SAFETY_RECOMPUTED), measured the same way.
]]
local M = {}

M.SAFETY = 0.05
M.SAFETY_BYTES = 64 * 1024
-- A checkpointed pipeline stage's replay knows its recomputes' garbage least
-- (when Lua's collector frees it): its share is the largest under-prediction
-- the grid measured for such layouts (8.9 %), rounded up.
M.SAFETY_RECOMPUTED = 0.10
-- The margin's share for layout l (nil: the common one).
function M.safety(l)
  return (l and l.pipeline > 1 and l.checkpoint) and M.SAFETY_RECOMPUTED or M.SAFETY
end
-- A predicted peak with its margin for layout l: what must be within the
-- device's memory.
function M.margin(peak, l) return peak * (1 + M.safety(l)) + M.SAFETY_BYTES end
local shard_layout = require 'ember.distribute.shard.layout'
M.SHARD_BUCKET = shard_layout.BUCKET_MB * 2 ^ 20   -- 'optimizer' and 'gradients' units
M.MAX_IN_FLIGHT = shard_layout.MAX_IN_FLIGHT       -- units reduced at once
M.SHARDS = { 'none', 'optimizer', 'gradients', 'parameters' }

-- -- Enumerating -------------------------------------------------------------------------------
-- Every layout for N devices: o = {devices, batch, children (count; nil when the
-- model is no Sequential), pipeline (false: no pipeline layouts)}. Returns the
-- layouts and, for those impossible, why (layout name -> reason).
function M.enumerate(o)
  local list, skipped = {}, {}
  local N, B = o.devices, o.batch
  for P = 1, N do
    if N % P == 0 and (P == 1 or (o.pipeline ~= false and o.children and P <= o.children)) then
      local D = N / P
      local chunks = P == 1 and { 1 } or { P, 2 * P, 4 * P }
      for _, shard in ipairs(M.SHARDS) do
        if shard == 'none' or D > 1 then
          for _, ckpt in ipairs({ false, true }) do
            for _, Mc in ipairs(chunks) do
              local l = { data = D, pipeline = P, shard = shard, checkpoint = ckpt, chunks = Mc }
              if B % (D * Mc) ~= 0 then
                skipped[M.name(l)] = ('the batch %d does not split into %d x %d micro-batches')
                  :format(B, D, Mc)
              else
                list[#list + 1] = l
              end
            end
          end
        end
      end
    end
  end
  return list, skipped
end

function M.name(l)
  local s = ('data=%d'):format(l.data)
  if l.pipeline > 1 then s = s .. (' pipeline=%d chunks=%d'):format(l.pipeline, l.chunks) end
  s = s .. ' shard=' .. l.shard
  if l.checkpoint then s = s .. ' checkpoint' end
  return s
end

-- -- Memory: data parallel -----------------------------------------------------------------------
-- A sharded model's gradient bytes besides the step's own, at each segment of
-- the meta step's backward (segment k ends when parameter segs[k].param's
-- gradient is final): a replay of shard/grads.lua over the units (each {bytes,
-- idx}, in backward order: shard.lua's buckets for ZeRO 1 and 2, a module's
-- own weights for ZeRO 3). A unit's flat buffer (its full size) exists from
-- its first gradient, which moves into it; units launch in unit order once
-- complete, and after each launch the oldest are applied while more than
-- MAX_IN_FLIGHT are under way. ZeRO 2 and 3: a launched unit's reduce-scatter
-- has its result (1/N of it) beside its flat buffer, and an applied unit
-- leaves that slice as the shards' gradients; ZeRO 1's allreduce works in
-- place and its flats stay, the shards' gradients being views of them. Returns
-- two lists parallel to segs: the bytes held through each segment, and the flat
-- buffer made as its gradient arrives (the unit's first gradient: the buffer is
-- made and the gradient copied into it while still held, at the segment's end).
function M.flat_grads(segs, units, N, mode)
  local unit_of = {}
  for k, u in ipairs(units) do for _, i in ipairs(u.idx) do unit_of[i] = k end end
  local got, ready, flat = {}, {}, {}
  local live, sliced, nxt, applied = 0, 0, 1, 0
  local scatter = mode ~= 'optimizer'
  local out, made = {}, {}
  for s, seg in ipairs(segs) do
    local k = seg.param and unit_of[seg.param]
    made[s] = (k and not flat[k]) and units[k].bytes or 0
    out[s] = live + sliced
    if k then
      if not flat[k] then flat[k] = true; live = live + units[k].bytes end
      got[k] = (got[k] or 0) + 1
      if got[k] == #units[k].idx then ready[k] = true end
      while nxt <= #units and ready[nxt] do
        if scatter then live = live + math.ceil(units[nxt].bytes / N) end  -- its result
        nxt = nxt + 1
        while scatter and nxt - 1 - applied > M.MAX_IN_FLIGHT do
          applied = applied + 1
          live = live - units[applied].bytes - math.ceil(units[applied].bytes / N)
          sliced = sliced + math.ceil(units[applied].bytes / N)
        end
      end
    end
  end
  return out, made
end

-- m = {weights W, state S, unit U (largest module's weights), units
-- (ZeRO 3's) and buckets (ZeRO 1 and 2's; see flat_grads), gathered (ZeRO 3's
-- bytes gathered per parameter: plan_memory.gathered), step
-- (plan_memory.step's result at this layout's batch and checkpointing)}. Returns the peak and its parts
-- {parameters, gradients, optimizer, activations}.
function M.data_memory(l, m)
  local N, mode = l.data, l.shard
  local W, S = m.weights, m.state
  local sharded = mode ~= 'none'
  -- (ZeRO 3's shards; what it gathers is added per segment: gathered_at)
  local params = mode == 'parameters' and math.ceil(W / N) or W
  local state = sharded and math.ceil(S / N) or S
  local flats, made
  if sharded then
    flats, made = M.flat_grads(m.step.segments, mode == 'parameters' and m.units or m.buckets, N, mode)
  end
  -- ZeRO 3 holds one unit gathered at a time (under checkpointing, one child's
  -- units): the largest during the forward (the first segment's peak holds
  -- it), then in backward the one whose gradients the segment ends with
  -- (shard.lua gathers it again as backward reaches it and frees it once its
  -- gradients are in). m.gathered maps a parameter to those bytes.
  local function gathered_at(s, seg)
    if mode ~= 'parameters' then return 0 end
    local own = seg.param and m.gathered[seg.param] or 0
    return s == 1 and math.max(own, m.unit) or own
  end
  local fb, fb_grads, fb_act, fb_gathered = 0, 0, 0, 0
  for s, seg in ipairs(m.step.segments) do
    local held = gathered_at(s, seg)
    local g, act
    if not sharded then
      g = N > 1 and W or seg.arrived
      -- (a segment's peak holds the gradient that ends it; plain wrap's backward
      -- writes it into its bucket, counted in g -- but a checkpointed child's
      -- recomputed backward makes it first, then adds it there)
      act = (N > 1 and not l.checkpoint) and seg.peak - (seg.bytes or 0) or seg.peak
    else
      -- the segment's own peak, or its end with a new flat buffer beside the
      -- gradient being copied into it, whichever is more
      g, act = flats[s], seg.peak
      local at_end = (seg.ending or seg.peak) + made[s]
      if at_end > act then g, act = g + made[s], seg.ending or seg.peak end
    end
    if act + g + held > fb then fb, fb_grads, fb_act, fb_gathered = act + g + held, g, act, held end
  end
  fb = fb + params + state
  local final = (mode == 'gradients' or mode == 'parameters') and math.ceil(W / N) or W
  local opt = (mode == 'parameters' and math.ceil(W / N) or W) + state + final + m.step.after
  local gather = (mode == 'optimizer' or mode == 'gradients') and
    (W + state + W + math.ceil(W / N)) or 0
  local peak = math.max(fb, opt, gather)
  local parts = { parameters = params, optimizer = state }
  if peak == fb then
    parts.gradients, parts.activations = fb_grads, fb_act
    parts.parameters = params + fb_gathered
  elseif peak == opt then
    parts.gradients, parts.activations = final, m.step.after
  else
    parts.gradients, parts.activations, parts.parameters = 0, 0, 2 * W + math.ceil(W / N)
  end
  return peak, parts
end

-- -- Memory: pipelines -----------------------------------------------------------------------
-- plan/pipeline.lua: each stage's replayed peak, and the collection rule it replays.
local pipeline = require 'ember.distribute.plan.pipeline'
M.PIPELINE_COLLECT = pipeline.PIPELINE_COLLECT
M.pipeline_memory = pipeline.pipeline_memory

-- -- Cutting a Sequential into stages -------------------------------------------------------------
-- costs[i] >= 0 per child; the counts of P consecutive groups (each at least one
-- child) that make the largest group's total smallest: pipeline/cut.lua's partition,
-- the one the pipeline cuts with, so that plan:apply's balance is what the
-- planner measured.
function M.cut(costs, P)
  local n = #costs
  if P < 1 or P > n then
    error(('cut: %d stages for %d children'):format(P, n), 2)
  end
  return require('ember.distribute.pipeline.cut').partition(costs, P)
end

-- -- Time ------------------------------------------------------------------------------------------
-- t = {fwd, bwd (seconds of the whole model at batch t.batch), fwd_i, bwd_i (per
-- child), bandwidth (bytes/s), latency (s per collective or message), share
-- (compute slowdown with every replica running)}; W weights' bytes; b the
-- per-replica batch; units: ZeRO 3's unit count.
M.WRAP_BUCKET = 25 * 2 ^ 20     -- wrap.lua's bucket for plain data parallel

-- Seconds of the collectives of one step of data parallel over D replicas
-- (bytes over the bandwidth, and a latency per collective).
local function comm_time(shard, D, t, W, units)
  if D < 2 then return 0 end
  local ring = (D - 1) / D
  local buckets = math.max(1, math.ceil(W / M.WRAP_BUCKET))
  local flat = math.max(1, math.ceil(W / M.SHARD_BUCKET))
  local bytes, msgs
  if shard == 'none' then bytes, msgs = 2 * ring * W, buckets
  elseif shard == 'optimizer' then bytes, msgs = 3 * ring * W, 2 * flat       -- allreduce, allgather
  elseif shard == 'gradients' then bytes, msgs = 2 * ring * W, 2 * flat       -- reduce-scatter, allgather
  else bytes, msgs = 3 * ring * W, 3 * (units or flat) end  -- two allgathers (forward, backward), a reduce-scatter
  return bytes / t.bandwidth + msgs * (t.latency or 0)
end

function M.data_time(l, t, W, b, units)
  local scale = b / t.batch
  local compute = (t.fwd * (l.checkpoint and 2 or 1) + t.bwd) * scale * (t.share or 1)
  return compute + comm_time(l.shard, l.data, t, W, units)
end

function M.pipeline_time(l, t, children, counts, mb)
  local scale = mb / t.batch
  local slowest, first, p2p, Wmax, umax = 0, 1, 0, 0, 0
  for s = 1, l.pipeline do
    local f, b, W, u = 0, 0, 0, 0
    for i = first, first + counts[s] - 1 do
      f, b, W = f + t.fwd_i[i], b + t.bwd_i[i], W + children[i].params
      u = u + (children[i].units or 1)
    end
    first = first + counts[s]
    slowest = math.max(slowest, (f * (l.checkpoint and 2 or 1) + b) * scale * (t.share or 1))
    if s < l.pipeline then
      -- an activation forward and its gradient back, each a message
      p2p = math.max(p2p, 2 * (children[first - 1].out_bytes / t.bandwidth + (t.latency or 0)))
    end
    Wmax, umax = math.max(Wmax, W), math.max(umax, u)
  end
  local slots = l.chunks + l.pipeline - 1
  -- (ZeRO 3 stages gather each unit for every micro-batch's forward and backward)
  local gathers = 0
  if l.shard == 'parameters' and l.data > 1 then
    gathers = 2 * l.chunks * umax * ((l.data - 1) / l.data * Wmax / umax / t.bandwidth + (t.latency or 0))
  end
  return slots * (slowest + p2p) + comm_time(l.shard, l.data, t, Wmax, umax) + gathers
end

-- -- Choosing ----------------------------------------------------------------------------------------
-- candidates: {layout, peak, step_s, ...}; memory: bytes per device. Marks each
-- fits (peak with its margin within memory, and c.setup -- what applying
-- the layout holds for a moment -- too) and returns the fastest that
-- fits (ties: the smaller peak, then the simpler layout), or nil.
function M.choose(candidates, memory)
  local best
  for _, c in ipairs(candidates) do
    c.fits = M.margin(c.peak, c.layout) <= memory and (c.setup or 0) <= memory
    if c.fits then
      if not best or c.step_s < best.step_s or
         (c.step_s == best.step_s and (c.peak < best.peak or
           (c.peak == best.peak and M.complexity(c.layout) < M.complexity(best.layout)))) then
        best = c
      end
    end
  end
  return best
end

local SHARD_RANK = { none = 0, optimizer = 1, gradients = 2, parameters = 3 }
function M.complexity(l)
  return (l.pipeline - 1) * 100 + SHARD_RANK[l.shard] * 10 + (l.checkpoint and 1 or 0) + l.chunks * 0.01
end

return M

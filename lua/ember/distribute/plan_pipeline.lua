--[[
ember.distribute.plan_pipeline -- the planner's memory arithmetic for pipeline
layouts (P > 1), a pure function of the measurements (no tensors): each stage's
peak per device, from a replay of its schedule's ops. plan_layouts.lua
re-exports it with the rest of the planner's arithmetic.

Pipelines (P > 1): stage s holds its children's weights, gradients and state
and, under 1F1B, min(P - s, M) micro-batches of its children's saved
activations (GPipe: M), the worst child's transient, and a received input and a
sent output. With D > 1 replicas per stage the micro-batches' backwards run
unsynchronised, so the full gradients W accumulate whatever the sharding; the
state is S/D when sharded; plain wrap's buckets hold those gradients (nothing more);
ZeRO 1/2 add the last backward's flat units and the first forward's gather;
ZeRO 3 keeps W/D and, at worst, all of the weights its backwards gathered.
]]
local shard_layout = require 'ember.distribute.shard_layout'

local M = {}

-- (the same figures as plan_layouts.lua's)
M.SHARD_BUCKET = shard_layout.BUCKET_MB * 2 ^ 20   -- 'optimizer' and 'gradients' units
M.MAX_IN_FLIGHT = shard_layout.MAX_IN_FLIGHT       -- units reduced at once

-- children: plan_memory.children's list at the micro-batch (each {held,
-- fwd_peak, bwd_peak, params, out_bytes}; loss: the loss's own footprint on the
-- last child's output, or nil); counts: children per stage; m.state_factor:
-- state bytes per weight byte; m.memory: the device's bytes the plan is for;
-- m.batch: the bytes of the global batch (x and y) each replica holds. The worst stage's peak, its parts, and each
-- stage's peak.
--
-- A stage's activations are not a formula but a replay of its op list
-- (pipeline_schedule) against what pipeline.lua does with memory:
--   F  receives its input (in bytes, stages > 0) and keeps held bytes until
--      its B; the forward's transient rises above that for a moment;
--   B  runs over the micro-batch's activations with the stage's gradients
--      present (they appear at the first B: zero_grad leaves none); after it
--      the micro-batch's tensors (activations, received input and gradient)
--      are Lua garbage until a
--      collection, which the pipeline runs once allocated memory exceeds the
--      step's start by its collect_bytes for the device's memory (or, the
--      worst case, as much of it as stays under that);
--   the optimizer step then finds the gradients and that garbage.
-- the pipeline's rule: a collection once a step's garbage passes
-- collect_bytes(memory) (1 MiB, less under a small memory)
local collect_bytes = require('ember.distribute.pipeline_run').collect_bytes
M.PIPELINE_COLLECT = collect_bytes()

local schedule_ops = function(name, P, Mc, s)
  return require('ember.distribute.pipeline_schedule').ops(name, P, Mc, s)
end

-- One stage's activation peak above its parameters and state.
local function replay(ops, st, grads, collect, slack)
  local inflight, pending, garbage, on = 0, 0, 0, false
  local peak = 0
  local function live() return (on and grads or 0) + inflight + pending + garbage end
  -- the backward's worst moment over what is live: its recomputed garbage
  -- adds to the garbage there, up to the slack that forces a collection
  local function over(list)
    local top = 0             -- (never below the held activations)
    for _, e in ipairs(list) do
      top = math.max(top, e[1] + math.min(e[2], math.max(0, slack - garbage)))
    end
    return top
  end
  local last_b = 0
  for k, op in ipairs(ops) do if op[1] == 'B' then last_b = k end end
  for k, op in ipairs(ops) do
    if op[1] == 'F' then
      inflight = inflight + st.held + st.inb
      peak = math.max(peak, live() + st.fwd)
    else
      on = true
      peak = math.max(peak, live() + over(st.bwds))
      if k == last_b then peak = math.max(peak, live() + over(st.rests) + st.last_extra) end
      inflight = inflight - st.held - st.inb
      -- (an activation's send is let go as its gradient comes back; the
      -- gradient this B sends back stays in its send until the step's end)
      pending = pending + st.inb
      garbage = math.min(slack, garbage + st.held + st.inb + st.recomputed)
      -- Past COLLECT the pipeline collects; below it the garbage stays. Lua's own
      -- collector may free part of it first, at moments that vary from run to
      -- run, which can keep the pipeline from collecting: the worst case keeps
      -- as much garbage as stays under COLLECT.
      if live() > collect then
        garbage = math.max(0, math.min(garbage, collect - (live() - garbage)))
      end
    end
  end
  -- the sends are waited for at the step's end: their buffers join the garbage
  return math.max(peak, grads + pending + garbage)
end

function M.pipeline_memory(l, m, children, counts, schedule)
  local D, P, Mc = l.data, l.pipeline, l.chunks
  local collect = collect_bytes(m.memory)
  -- garbage past this forces a collection whatever the pipeline does: the
  -- collector's pacing under a cap of the planned memory (ember.handles)
  local slack = m.memory and require('ember.handles').cap_slack(m.memory) or math.huge
  local worst, worst_parts, per = 0, nil, {}
  local first = 1
  for s = 0, P - 1 do
    local W, U, pmax, held, fwd, bwd = 0, 0, 0, 0, 0, 0
    local last_i = first + counts[s + 1] - 1
    local before = {}
    for i = first, last_i do
      local c = children[i]
      W = W + c.params
      U = math.max(U, c.unit or c.params)
      pmax = math.max(pmax, c.param_max or c.params)
      -- a child's transients ride on the activations of the children before it
      fwd = math.max(fwd, held + c.fwd_peak)
      before[i] = held
      held = held + c.held
    end
    -- The backward runs the children in reverse; a checkpointed child's
    -- recomputed activations are garbage once its backward is done, and stay
    -- under the backwards of the children before it. Each moment of it:
    -- {bytes above the stage's held activations, recomputed garbage beside
    -- them} (that garbage shares the collector's slack with the step's: replay).
    local after = 0
    local bwds, rests = {}, {}
    if s == P - 1 and m.loss then
      fwd = math.max(fwd, held + m.loss.fwd_peak)
      bwds[1] = { held + m.loss.bwd_peak, 0 }
      held = held + m.loss.held
    end
    -- (rests: from the moment the stage's last child has its gradients on, when
    -- a sharded stage's first flat unit exists: the children before it)
    rests[1] = { before[last_i], 0 }
    for i = last_i, first, -1 do
      local c = children[i]
      -- (a child's measured backward made its weights' gradients; the replay
      -- counts the stage's gradients apart, from its first B on: here only the
      -- new one being added to the accumulated ones, at worst the largest --
      -- a checkpointed child's recomputed backward makes all of its own first)
      local b = l.checkpoint and c.bwd_peak or c.bwd_peak - c.params + (c.param_max or c.params)
      bwds[#bwds + 1] = { before[i] + b, after }
      if i < last_i then rests[#rests + 1] = { before[i] + b, after } end
      if l.checkpoint then after = after + math.max(0, c.bwd_peak - c.held - c.params) end
    end
    for _, list in ipairs({ bwds, rests }) do
      for _, e in ipairs(list) do e[1] = e[1] - held end
    end
    local st = { held = held, fwd = math.max(0, fwd - held), bwds = bwds, rests = rests,
                 inb = s > 0 and children[first - 1].out_bytes or 0,
                 outb = s < P - 1 and children[last_i].out_bytes or 0,
                 recomputed = math.min(slack, after), last_extra = 0 }
    first = last_i + 1
    local sharded = l.shard ~= 'none'
    -- (ZeRO 3: a no_sync backward gathers each module's weights and keeps them
    -- until the synchronised one reduces their gradients: all of them, at worst)
    local params = l.shard == 'parameters' and math.ceil(W / D) + W or W
    local state = math.ceil(W * m.state_factor / (sharded and D or 1))
    -- The micro-batches' backwards run unsynchronised (no_sync): full gradients
    -- accumulate from the first B whatever the sharding. Under plain wrap they
    -- are the buckets themselves (the first B writes each gradient into its
    -- bucket view), so D > 1 adds nothing there; a sharded stage's last B fills
    -- its flat units (at most MAX_IN_FLIGHT + 1 under way, the stage's W at most)
    -- while the full gradients are still there.
    local grads = W
    if D > 1 and sharded then
      local unit = l.shard == 'parameters' and U or math.min(math.max(M.SHARD_BUCKET, pmax), W)
      local flats = math.min(W, (M.MAX_IN_FLIGHT + 1) * unit)
      st.last_extra = flats
      -- ZeRO 1/2: a unit's flat buffer exists from its first gradient of the
      -- last B -- the last child's bias, before its weight's gradient arrives
      -- to be added to the accumulated one -- so over that whole backward
      if l.shard ~= 'parameters' then st.rests = st.bwds end
    end
    local act = replay(schedule_ops(schedule, P, Mc, s), st, grads, collect, slack) - grads
    local peak = params + state + grads + act
    -- ZeRO 1 and 2 gather the stage's weights at the step's first forward: a
    -- flat W and this replica's segment, before any activation or gradient
    if D > 1 and (l.shard == 'optimizer' or l.shard == 'gradients') then
      peak = math.max(peak, params + state + W + math.ceil(W / D))
    end
    -- the global batch every replica passes (pipeline_run cuts its rows)
    peak = peak + (m.batch or 0)
    per[s + 1] = peak
    if peak > worst then
      worst = peak
      worst_parts = { parameters = params, gradients = grads, optimizer = state,
                      activations = act }
    end
  end
  return worst, worst_parts, per
end

return M

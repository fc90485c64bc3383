--[[
ember.distribute.plan.pipeline -- the planner's memory arithmetic for pipeline
layouts (P > 1), a pure function of the measurements (no tensors): each stage's
peak per device, from a replay of its schedule's ops. plan/layouts.lua
re-exports it with the rest of the planner's arithmetic.

Pipelines (P > 1): stage s holds its children's weights, gradients and state
and, under 1F1B, min(P - s, M) micro-batches of its children's saved
activations (GPipe: M), the worst child's transient, and a received input and a
sent output. With D > 1 replicas per stage the micro-batches' backwards run
unsynchronised, so the full gradients W accumulate whatever the sharding; the
state is S/D when sharded; plain wrap's buckets hold those gradients (nothing
more); ZeRO 1/2/3 move them into flat units during the last backward, replayed
unit by unit (plan/flat_units.lua); ZeRO 1/2 gather W at the first forward; ZeRO 3
keeps W/D and, at worst, all of the weights its backwards gathered.
]]
local flat_units = require 'ember.distribute.plan.flat_units'

local M = {}

-- children: plan/children.lua's list at the micro-batch (each {held,
-- garbage, recomputed, fwd_peak, bwd_peak, params, sizes, unit_sizes,
-- out_bytes}); m.loss: the loss's own footprint on the last child's output,
-- or nil; counts: children per stage; m.state_factor: state bytes per weight
-- byte; m.memory: the device's bytes the plan is for; m.batch: the bytes of
-- the global batch (x and y) each replica holds. Returns the worst stage's
-- peak, its parts, and each stage's peak.
--
-- A stage's activations are not a formula but a replay of its op list
-- (pipeline/schedule.lua) against what pipeline.lua does with memory:
--   F  receives its input (in bytes, stages > 0), keeps held bytes until its
--      B and leaves its garbage; the forward's transient rises above that for
--      a moment;
--   B  runs over the micro-batch's activations with the stage's gradients
--      present (zero_grad leaves none, unless plain wrap's buckets hold them:
--      the first B makes them child by child, with no sum's temporary, and
--      the later ones add into them); after it the micro-batch's tensors
--      (activations, received input and gradient) are garbage until a
--      collection, which the pipeline runs once allocated memory exceeds the
--      step's start by its collect_bytes for the device's memory (or, the
--      worst case, as much of it as stays under that);
--   the optimizer step then finds the gradients and that garbage.
local collect_bytes = require('ember.distribute.pipeline.run').collect_bytes
M.PIPELINE_COLLECT = collect_bytes()

local schedule_ops = function(name, P, Mc, s)
  return require('ember.distribute.pipeline.schedule').ops(name, P, Mc, s)
end

-- One stage's activation peak above its parameters and state.
--
-- Garbage is freed by collections: the pipeline's own (above) and the
-- collector's pacing (ember.handles): a collection once allocated memory
-- passes its limit, what was allocated when the collector last swept plus the
-- slack for that (slack(bytes): bytes are the stage's activations, gradients
-- and garbage; the function adds what else the device holds). The step
-- starts under the limit the last step's closing collection set, with the
-- gradients present (zero_grad dropped them since). A sweep may
-- come at any moment (Lua's own cycles end one), and so at a backward's top,
-- where the recomputed tensors are live: the worst case raises the limit to
-- that top plus the slack. The last step's batch is garbage at the start.
--
-- ZeRO 3 (st.gathered > 0): a forward gathers one unit's weights at a time
-- (st.unit at most) and frees each after its forward -- also those a backward
-- kept. An unsynchronised backward gathers each child's units as it reaches
-- it and keeps them (a moment's e.g: the bytes gathered by then), so after it
-- all of them are there until the next forward; the last, synchronised,
-- backward frees them. Returns the peak and the gathered weights at it.
local function replay(ops, st, grads, collect, slack)
  local inflight, pending, garbage, on = 0, 0, st.prev, st.buckets
  local gathered = 0
  local peak, peak_gathered = 0, 0
  local top_gathered = 0    -- (the gathered bytes at over's top)
  local function top(v, g)
    if v > peak then peak, peak_gathered = v, g or gathered end
  end
  local limit = grads + slack(grads)
  local sweeps, swept_at = 0, {}   -- (collections so far; their count at each F)
  local function live() return (on and grads or 0) + gathered + inflight + pending + garbage end
  local function collected() garbage = 0; sweeps = sweeps + 1; limit = live() + slack(live()) end
  -- garbage added: past the limit, the pacing collects (having reached the
  -- limit), and what is made after that sweep stays garbage
  local function add(bytes)
    local room = limit - live()
    garbage = garbage + bytes
    if live() > limit then
      top(limit); collected()
      garbage = bytes - math.max(0, room)
    end
  end
  -- the backward's worst moment, each {bytes above what is live, recomputed
  -- garbage beside them, bytes beside the gradients (a sharded stage's flat
  -- units), where the collector's pacing can run}: past the limit it frees the
  -- garbage, but only in a Lua op -- e[4] is nil where the backward runs Lua
  -- ops all along (ZeRO 3's nodes, a sharded stage's hooks), false where it
  -- runs in C alone (the engine's kernels allocate there, unseen by the
  -- pacing), or the top of a checkpointed child's recompute above what is live
  -- (its Lua ops; the kernels after them are C's). pinned: no collection came
  -- since the micro-batch's F, whose garbage (Lua's handles of its tensors)
  -- then keeps the activations of the children whose backward is done (e.pin)
  -- until one comes. The stage's output stays whatever comes (e.keep): the
  -- pipeline holds it until the micro-batch's backward ends.
  local function over(list, pinned)
    local top, hi, gone = live(), 0, 0
    local base = gathered
    top_gathered = base
    for _, e in ipairs(list) do
      -- (the units this backward has gathered by now, beyond those there before)
      gathered = math.max(base, e.g or 0)
      local extra, beside = e[3] or 0, e[2] - gone
      local keep = e.keep or 0
      local pin = pinned and math.max(e.pin or 0, keep) or keep
      local t = live() + extra + e[1] + beside + pin
      if t > limit and e[4] ~= false and (not e[4] or live() + extra + e[4] + beside + pin > limit) then
        garbage, gone, pinned, sweeps = 0, e[2], false, sweeps + 1
        t = math.max(limit, live() + extra + e[1] + keep)
      end
      if t > top then top, top_gathered = t, gathered end
      hi = math.max(hi, live() - garbage + extra + e[1] + keep)
      if e.collects then
        garbage, gone, pinned, sweeps = 0, 0, false, sweeps + 1
        limit = live() + extra + slack(live() + extra)
      end
    end
    limit = math.max(limit, hi + slack(hi))
    gathered = base
    return top
  end
  local last_b = 0
  for k, op in ipairs(ops) do if op[1] == 'B' then last_b = k end end
  -- (what the step starts with: the pipeline's collections count from there)
  local start = live()
  for k, op in ipairs(ops) do
    local mb = op[2] .. ':' .. (op[3] or 1)
    if op[1] == 'F' then
      swept_at[mb] = sweeps
      if st.tidied then
        -- (its checkpoints' collections: the forward's top before them, then
        -- no garbage)
        top(live() + st.inb + st.fwd_pre + (gathered > 0 and 0 or st.unit))
        inflight = inflight + st.held + st.inb
        garbage = 0
        collected()
      else
        inflight = inflight + st.held + st.inb
      end
      add(st.garbage)
      if gathered > 0 and st.fwd_kept then top(live() - gathered + st.fwd_kept)
      else top(live() + st.fwd + (gathered > 0 and 0 or st.unit)) end
      gathered = 0
    else
      -- (the step's first B makes the gradients, unless it is also its last:
      -- that one's rests count every gradient)
      local list = not on and st.firsts and k ~= last_b and st.firsts or st.bwds
      local pinned = swept_at[mb] == sweeps
      on = true
      top(over(list, pinned), top_gathered)
      if k == last_b then top(over(st.rests, swept_at[mb] == sweeps), top_gathered); gathered = 0
      else gathered = st.gathered end
      inflight = inflight - st.held - st.inb
      -- (an activation's send is let go as its gradient comes back; the
      -- gradient this B sends back stays in its send until the step's end)
      pending = pending + st.inb
      add(st.held + st.inb + st.outb + st.recomputed)
      -- Past COLLECT above the step's start the pipeline collects; below it
      -- the garbage stays. Lua's own collector may free part of it first, at
      -- moments that vary from run to run, which can keep the pipeline from
      -- collecting: the worst case keeps as much garbage as stays under it.
      if live() - start > collect then
        garbage = math.max(0, math.min(garbage, start + collect - (live() - garbage)))
        if garbage == 0 then collected() end
      end
    end
  end
  -- the sends are waited for at the step's end: their buffers join the garbage
  top(grads + pending + garbage)
  return peak, peak_gathered
end

function M.pipeline_memory(l, m, children, counts, schedule)
  local D, P, Mc = l.data, l.pipeline, l.chunks
  local collect = collect_bytes(m.memory)
  -- garbage a checkpoint collects at once (em.nn.checkpoint), or nil
  local tidy = l.checkpoint and require('ember').nn._checkpoint_tidy_bytes(m.memory)
  local cap_slack = require('ember.memlimit').cap_slack
  local worst, worst_parts, per = 0, nil, {}
  local first = 1
  for s = 0, P - 1 do
    local W, held, dead, fwd, fwd_pre, tidied = 0, 0, 0, 0, 0, false
    -- (ZeRO 3, a forward that finds every unit gathered: the top less the
    -- weights of the children before, each freed after its forward)
    local fwd_kept = 0
    local last_i = first + counts[s + 1] - 1
    local before = {}
    for i = first, last_i do
      local c = children[i]
      -- a child's transients ride on the activations of the children before
      -- it, and on the garbage their forwards left
      fwd = math.max(fwd, held + dead + c.fwd_peak)
      fwd_kept = math.max(fwd_kept, held + dead + c.fwd_peak - W)
      W = W + c.params
      before[i] = held
      held = held + c.held
      dead = dead + (c.garbage or 0)
      -- a checkpoint that leaves garbage worth it collects (em.nn.checkpoint):
      -- all garbage goes, the earlier micro-batches' too
      if tidy and (c.garbage or 0) > tidy then
        tidied, fwd_pre, fwd, dead = true, math.max(fwd_pre, fwd), 0, 0
      end
    end
    -- The backward runs the children in reverse; a checkpointed child's
    -- recomputed activations are garbage once its backward is done, and stay
    -- under the backwards of the children before it. Each moment of it:
    -- {bytes above the stage's held activations, recomputed garbage beside
    -- them} (that garbage shares the collector's slack with the step's: replay).
    local after = 0
    local bwds, rests = {}, {}
    -- (firsts: the step's first B, which makes the gradients where no earlier
    -- micro-batch did; each moment counts those made by then, as an offset
    -- from all of them, which the replay counts from that B on. Plain wrap's
    -- buckets hold them from the start, and the lists above serve every B.)
    local firsts = (D == 1 or l.shard ~= 'none') and {} or nil
    local made = 0
    -- ZeRO 3's nodes run Lua ops all through a backward; otherwise a plain
    -- child's backward is the engine's alone (false: no pacing there)
    local gathers = D > 1 and l.shard == 'parameters'
    local zero3 = false
    if gathers then zero3 = nil end
    local gath = 0    -- (ZeRO 3: the children's weights a backward has gathered)
    local flats = D > 1 and l.shard ~= 'none'
    local extras, own_later = {}, {}
    if flats then
      extras, own_later = flat_units.extras(children, first, last_i, D, l.shard)
    end
    -- (the children's activations: those of a child whose backward is done
    -- stay while the forward's garbage pins them, replay's e.pin)
    local kids_held = held
    if s == P - 1 and m.loss then
      fwd = math.max(fwd, held + dead + m.loss.fwd_peak)
      fwd_kept = math.max(fwd_kept, held + dead + m.loss.fwd_peak - W)
      bwds[1] = { held + m.loss.bwd_peak, 0, 0, zero3 }
      if firsts then firsts[1] = { bwds[1][1] - W, 0, 0, zero3 } end
      held = held + m.loss.held
    end
    -- (the gradient a stage before the last receives for its output: the last
    -- child's backward was measured with it, the others run beside it -- and
    -- beside the output, which the pipeline holds as long: e.keep)
    local outb = s < P - 1 and children[last_i].out_bytes or 0
    -- (rests: the moments of the step's last B from the one the stage's last
    -- child has its gradients on; a sharded stage's with the bytes its flat
    -- units add beside the gradients at each child)
    rests[1] = { before[last_i] + outb, 0, 0, zero3, g = gathers and children[last_i].params or nil,
                 pin = kids_held - before[last_i], keep = outb }
    if flats then rests[1][4] = nil end
    for i = last_i, first, -1 do
      local c = children[i]
      local counts_before = { #bwds, #rests, firsts and #firsts }
      -- (a child's backward was measured beside its weights' gradients, which
      -- the replay counts apart, from the stage's first B on)
      local out_g = i < last_i and outb or 0
      local b = before[i] + c.bwd_peak + out_g
      -- (where the pacing runs: e[4] in replay's over)
      local sweep = c.recompute_peak and before[i] + c.recompute_peak or zero3
      if gathers then gath = gath + c.params end
      bwds[#bwds + 1] = { b, after, 0, sweep, g = gath }
      if firsts then
        local early = made - W
        firsts[#firsts + 1] = { before[i] + c.bwd_first + out_g + early, after, 0,
          c.recompute_peak and sweep + early or sweep, g = gath }
        made = made + c.params
      end
      local g = gathers and gath or nil
      if flats and l.checkpoint then
        -- (its backward's peak before its flats, their making after it, when
        -- its recomputed tensors are garbage)
        rests[#rests + 1] = { b, after, own_later[i], sweep, g = g }
        rests[#rests + 1] = { before[i], after + (c.recomputed or 0), extras[i], g = g }
      elseif flats then rests[#rests + 1] = { b, after, extras[i], c.recompute_peak and sweep, g = g }
      elseif i < last_i then rests[#rests + 1] = { b, after, 0, sweep, g = g } end
      for k, list in ipairs({ bwds, rests, firsts }) do
        for j = counts_before[k] + 1, #list do
          list[j].pin = kids_held - before[i] - c.held
          list[j].keep = i < last_i and outb or 0
        end
      end
      after = after + (c.recomputed or 0)
      -- (a recompute that leaves garbage worth it collects as it returns)
      if tidy and (c.recomputed or 0) > tidy then
        after = 0
        bwds[#bwds].collects = true
        if firsts then firsts[#firsts].collects = true end
        if #rests > 0 then rests[#rests].collects = true end
      end
    end
    for _, list in ipairs({ bwds, rests, firsts }) do
      for _, e in ipairs(list) do
        e[1] = e[1] - held
        if e[4] then e[4] = e[4] - held end
      end
    end
    local sharded = l.shard ~= 'none'
    -- (ZeRO 3 keeps shards; what it gathers the replay adds: the largest unit
    -- in a forward, the children's units as a backward reaches them)
    local params = gathers and math.ceil(W / D) or W
    local unit = 0
    if gathers then
      for i = first, last_i do
        for _, b in ipairs(children[i].unit_sizes or { children[i].params }) do
          unit = math.max(unit, b)
        end
      end
    end
    local state = math.ceil(W * m.state_factor / (sharded and D or 1))
    -- garbage past the slack forces a collection whatever the pipeline does:
    -- the collector's pacing under a cap of the planned memory (ember.handles),
    -- whose slack grows with what the device holds besides `bytes`
    local function slack(bytes)
      if not m.memory then return math.huge end
      return cap_slack(m.memory, params + state + (m.batch or 0) + bytes)
    end
    local st = { held = held, garbage = dead, fwd = math.max(0, fwd - held - dead),
                 fwd_kept = not tidied and math.max(0, fwd_kept + W - held - dead) or nil,
                 tidied = tidied, fwd_pre = fwd_pre,
                 bwds = bwds, rests = rests, firsts = firsts,
                 inb = s > 0 and children[first - 1].out_bytes or 0,
                 outb = outb,
                 recomputed = math.min(slack(held), after),
                 -- (plain wrap's buckets are the gradients, there from wrap time on)
                 buckets = D > 1 and not sharded,
                 -- (the last step's batch: garbage since the loop's next one came,
                 -- until the step's first collection)
                 prev = m.batch or 0,
                 gathered = gathers and W or 0, unit = unit }
    first = last_i + 1
    -- The micro-batches' backwards run unsynchronised (no_sync): full gradients
    -- accumulate from the first B whatever the sharding. Under plain wrap they
    -- are the buckets themselves (the first B writes each gradient into its
    -- bucket view), so D > 1 adds nothing there; a sharded stage's last B moves
    -- them into its flat units (the rests' extras).
    local grads = W
    local top, gathered = replay(schedule_ops(schedule, P, Mc, s), st, grads, collect, slack)
    local act = top - grads - gathered
    local peak = params + gathered + state + grads + act
    -- ZeRO 1 and 2 gather the stage's weights at the step's first forward: a
    -- flat W and this replica's segment, before any activation or gradient
    if D > 1 and (l.shard == 'optimizer' or l.shard == 'gradients') then
      peak = math.max(peak, params + state + W + math.ceil(W / D))
    end
    -- the global batch every replica passes (pipeline/run.lua cuts its rows)
    peak = peak + (m.batch or 0)
    per[s + 1] = peak
    if peak > worst then
      worst = peak
      worst_parts = { parameters = params + gathered, gradients = grads, optimizer = state,
                      activations = act }
    end
  end
  return worst, worst_parts, per
end

return M

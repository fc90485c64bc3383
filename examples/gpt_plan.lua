--[[
gpt_plan.lua -- examples/gpt.lua --plan: asks em.distribute.plan how the model
trains on world_size devices of a given memory, prints the answer on replica 0
and wraps the model the way it says. Loaded with dofile by gpt.lua:

  local dmodel, pp, rows, index = dofile('examples/gpt_plan.lua').apply(model, s,
    {batch = global batch, context = T, loss = fn(logits, y), device = 'cpu',
     memory = nil | bytes | '2M'})

dmodel is the model as this replica runs it (a wrapped model, or the pipeline);
pp the pipeline when the layout is one (train with pp:step), else nil; rows and
index say which rows of the global batch this replica passes: rows
[index * rows, (index + 1) * rows), its data replica's share.

The memory is the cap of `ember --memory-limit SIZE` (em.memory_stats' capacity)
unless given. The plan is the same on every replica (the meta step and the
layouts are functions of the model and the options; replica 0's timings are
broadcast by the strategy), so every replica applies the same layout.

A pipeline stage runs only its own children, yet every replica built the whole
model (to draw the same initial weights as one device does). The other stages'
parameters move to the meta device after the pipeline is made: their shapes
stay (the pipeline's names and checkpoints read them), their memory goes, so
a replica holds what the planner counted for its stage.
]]
local em = require 'ember'
local handles = require 'ember.handles'   -- collect(): frees dead tensors now

local M = {}

local function fail(msg) error(msg, 0) end

-- Frees every dead tensor now. LuaJIT's compiled traces can hold on to
-- tensors they saw (the weights before they moved to meta, some of the time):
-- flushing them first lets the collection find those dead too.
local function release()
  jit.flush()
  handles.collect()
end

function M.apply(model, s, o)
  local mem = o.memory or em.memory_stats(o.device).capacity
  if not mem or mem == 0 then
    fail('--plan plans for the memory of one device: run under ember --memory-limit SIZE ' ..
      '(or pass --memory SIZE)')
  end
  -- The planner's probes (each child timed on the device, a 4 MiB allreduce
  -- for the link) run beside the whole model's weights, which at a cap of a
  -- third of the training state leave too little room: the cap is lifted
  -- while it plans, and is back for the training.
  local cap = em.memory_stats(o.device).capacity
  if o.device == 'cpu' and cap > 0 then em.set_memory_limit(0) end
  -- the probes draw random inputs: the windows then are those one device draws
  local rng = em.get_rng_state()
  local ok, plan = pcall(em.distribute.plan, model, {
    input = { shape = { o.batch, o.context }, dtype = 'int64' },
    target = { shape = { o.batch, o.context }, dtype = 'int64' },
    loss = o.loss, optimizer = 'adam', devices = s.world_size, memory = mem, strategy = s })
  em.set_rng_state(rng)
  release()                                -- the probes' tensors go before the cap is back
  if o.device == 'cpu' and cap > 0 then em.set_memory_limit(cap) end
  if not ok then error(plan, 0) end
  -- Replicas time the children apart, so two layouts of near-equal time may
  -- come out in another order on another replica: every replica takes
  -- replica 0's choice.
  local pick = 0
  for i, c in ipairs(plan.candidates) do
    if c.layout == plan.layout then pick = i end
  end
  pick = s:broadcast(em.tensor({ pick }, { dtype = 'float64' }), 0):item()
  local c = plan.candidates[pick]
  if c then plan.layout, plan.peak_bytes, plan.step_s, plan.fits = c.layout, c.peak, c.step_s, c.fits end
  if s:is_main() then
    plan:print()
    -- plain data parallel, the layout without --plan: why it is not the one
    local plain = ('data=%d shard=none'):format(s.world_size)
    if plan.why[plain] then print('  why not ' .. plan.why[plain]) end
  end
  if not plan.fits then
    fail(('--plan: no layout trains this model in %s per device on %d devices (the smallest ' ..
      'needs %.1f MiB); use more replicas or a smaller model'):format(
      type(mem) == 'number' and ('%.1f MiB'):format(mem / 2 ^ 20) or tostring(mem),
      s.world_size, plan.peak_bytes / 2 ^ 20))
  end
  local l = plan.layout
  local wrapped = plan:apply(s)
  local rows = o.batch / l.data
  if l.pipeline == 1 then return wrapped, nil, rows, s.rank end

  -- a pipeline: drop the other stages' parameters (see the header)
  local first, last = wrapped.first_child, wrapped.first_child + wrapped.counts[wrapped.stage + 1] - 1
  local children = model:children()
  for i, c in ipairs(children) do
    if i < first or i > last then c:to('meta') end
  end
  release()
  return wrapped, wrapped, rows, wrapped.data_index
end

return M

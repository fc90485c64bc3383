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
[index * rows, (index + 1) * rows) -- its share under data parallelism, the
whole global batch to a pipeline (which gives each data replica its share).

The memory is the cap of `ember --memory-limit SIZE` (em.memory_stats' capacity)
unless given. The plan is the same on every replica: the meta step and the
layouts are functions of the model and the options, and the planner shares
replica 0's timings. A pipeline keeps only its own stage's weights.
]]
local em = require 'ember'

local M = {}

local function fail(msg) error(msg, 0) end

function M.apply(model, s, o)
  local mem = o.memory or em.memory_stats(o.device).capacity
  if not mem or mem == 0 then
    fail('--plan plans for the memory of one device: run under ember --memory-limit SIZE ' ..
      '(or pass --memory SIZE)')
  end
  local plan = em.distribute.plan(model, {
    input = { shape = { o.batch, o.context }, dtype = 'int64' },
    target = { shape = { o.batch, o.context }, dtype = 'int64' },
    loss = o.loss, optimizer = 'adam', devices = s.world_size, memory = mem, strategy = s })
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
  -- data parallel: each replica passes its own rows; a pipeline takes the
  -- global batch on every replica and gives each data replica its share
  if l.pipeline == 1 then return wrapped, nil, o.batch / l.data, s.rank end
  return wrapped, wrapped, o.batch, 0
end

return M

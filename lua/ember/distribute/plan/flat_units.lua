--[[
ember.distribute.plan.flat_units -- a sharded pipeline stage's flat units in its
step's last backward, for the planner's replay (plan/pipeline.lua): which units
shard.lua makes of the stage's weights, and the bytes they add beside the
stage's gradients as the backward reaches each child.
]]
local shard_layout = require 'ember.distribute.shard.layout'

local M = {}

M.MAX_IN_FLIGHT = shard_layout.MAX_IN_FLIGHT       -- units reduced at once

-- A sharded stage's last B (shard/grads.lua): each gradient, once final, moves
-- into its unit's flat buffer -- made whole at the unit's first gradient -- and
-- the full gradient goes. Units launch in order once complete. ZeRO 1's
-- allreduced flats stay as the shards' gradients (their views); ZeRO 2 and 3's
-- reduce-scatter results sit beside their flats until more than MAX_IN_FLIGHT
-- are under way, then the oldest flat goes and its 1/D slice stays. ZeRO 3
-- also lets a unit's gathered weights go once its gradients are complete.
-- units: in backward order, each {bytes, parts = {{child, bytes}, ...}}.
-- Returns, per child of the stage, the bytes beside the stage's full gradients
-- (and ZeRO 3's gathered weights) while its backward runs, with its own units'
-- flats made (a plain backward finishes a bias before it adds up its weight's
-- gradient, whose flat then exists), and without them (a checkpointed child's
-- gradients arrive together once its backward is done: its weight's first).
local function flat_extras(units, first, last, D, mode)
  local extras, before, made, got = {}, {}, {}, {}
  local alive, moved, sliced, freed, launched, applied = 0, 0, 0, 0, 0, 0
  for i = last, first, -1 do
    local new = 0
    for u, unit in ipairs(units) do
      for _, part in ipairs(unit.parts) do
        if part[1] == i and not made[u] then made[u] = true; new = new + unit.bytes end
      end
    end
    before[i] = alive + sliced - moved - freed
    extras[i] = before[i] + new
    alive = alive + new
    for u, unit in ipairs(units) do
      for _, part in ipairs(unit.parts) do
        if part[1] == i then got[u] = (got[u] or 0) + 1; moved = moved + part[2] end
      end
    end
    while launched < #units and got[launched + 1] == #units[launched + 1].parts do
      launched = launched + 1
      local b = units[launched].bytes
      if mode == 'parameters' then freed = freed + b end
      if mode ~= 'optimizer' then
        alive = alive + math.ceil(b / D)
        while launched - applied > M.MAX_IN_FLIGHT do
          applied = applied + 1
          local a = units[applied].bytes
          alive = alive - a - math.ceil(a / D)
          sliced = sliced + math.ceil(a / D)
        end
      end
    end
  end
  return extras, before
end

-- A stage's units, as shard.lua makes them: ZeRO 1 and 2 bucket its
-- parameters (shard_layout.shard_buckets: the last first); ZeRO 3
-- makes one of each module that owns parameters.
local function stage_units(children, first, last, mode)
  local units = {}
  if mode == 'parameters' then
    for i = last, first, -1 do
      local sizes = children[i].unit_sizes or { children[i].params }
      for k = #sizes, 1, -1 do
        units[#units + 1] = { bytes = sizes[k], parts = { { i, sizes[k] } } }
      end
    end
    return units
  end
  local sizes, owner, keys = {}, {}, {}
  for i = first, last do
    for _, b in ipairs(children[i].sizes or { children[i].params }) do
      sizes[#sizes + 1] = b
      owner[#sizes], keys[#sizes] = i, 1
    end
  end
  for _, idx in ipairs(shard_layout.shard_buckets(sizes, keys)) do
    local u = { bytes = 0, parts = {} }
    for _, k in ipairs(idx) do
      u.bytes = u.bytes + sizes[k]
      u.parts[#u.parts + 1] = { owner[k], sizes[k] }
    end
    units[#units + 1] = u
  end
  return units
end

-- The bytes beside the gradients, per child of the stage first..last (of
-- children: plan/children.lua's list) with D replicas sharding `mode`: with the
-- child's own units' flats made, and without them (flat_extras).
function M.extras(children, first, last, D, mode)
  return flat_extras(stage_units(children, first, last, mode), first, last, D, mode)
end

return M

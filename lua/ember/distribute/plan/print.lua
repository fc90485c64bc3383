--[[
ember.distribute.plan.print -- plan:print(): the planner's verdict and a compact
table of the candidate layouts, fastest first (those that fit before those
that do not), the best PER_KIND of each kind and the chosen one (marked * after it),
with its predicted peak per device, step time and whether it fits.
]]
local layouts = require 'ember.distribute.plan.layouts'

local M = {}

local MiB = 2 ^ 20
M.PER_KIND = 2      -- candidates shown per kind (pipeline degree x sharding)

function M.format(plan)
  local lines = {}
  local function add(...) lines[#lines + 1] = string.format(...) end
  add('plan: %d devices x %.0f MiB, %s, batch %d%s, weights %.1f MiB, link %.2f GB/s (%s), ' ..
    'layer times %s',
    plan.devices, plan.memory / MiB, plan.optimizer, plan.batch,
    (plan.dtype and plan.dtype ~= 'float32') and ', ' .. plan.dtype .. ' autocast' or '',
    plan.weights / MiB, plan.bandwidth / 1e9, plan.bandwidth_how, plan.time_how or 'measured')
  if plan.fits then
    add('  fits: %s -- peak %.1f MiB per device, step %.3f s', layouts.name(plan.layout),
      plan.peak_bytes / MiB, plan.step_s)
  else
    add('  does not fit: the smallest layout, %s, needs %.1f MiB per device',
      layouts.name(plan.layout), plan.peak_bytes / MiB)
  end
  local sorted = {}
  for i, c in ipairs(plan.candidates) do sorted[i] = c end
  table.sort(sorted, function(a, b)
    if a.fits ~= b.fits then return a.fits end
    if a.step_s ~= b.step_s then return a.step_s < b.step_s end
    return a.peak < b.peak
  end)
  -- the best PER_KIND of each kind (pipeline degree and sharding), and the
  -- chosen one wherever it falls: a 4-device plan has dozens of candidates
  local shown, per, hidden = {}, {}, 0
  for _, c in ipairs(sorted) do
    local l = c.layout
    local kind = l.pipeline .. '/' .. l.shard
    per[kind] = (per[kind] or 0) + 1
    if per[kind] <= M.PER_KIND or l == plan.layout then shown[#shown + 1] = c
    else hidden = hidden + 1 end
  end
  add('  %-54s %10s %10s  %s', 'layout', 'peak MiB', 'step s', 'fits')
  for _, c in ipairs(shown) do
    -- (the mark goes last: each row starts with its layout's name)
    add('  %-54s %10.1f %10.4f  %s%s', c.name, c.peak / MiB, c.step_s, c.fits and 'yes' or 'no',
      c.layout == plan.layout and '  *' or '')
  end
  if hidden > 0 then
    add('  (%d more, slower of their kind: plan.candidates; why each does not fit: plan.why)',
      hidden)
  end
  return table.concat(lines, '\n')
end

function M.print(plan, out)
  local s = M.format(plan)
  if out then out:write(s, '\n') else print(s) end
  return plan
end

return M

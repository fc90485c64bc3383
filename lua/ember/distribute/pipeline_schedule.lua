--[[
ember.distribute.pipeline_schedule -- the order in which one pipeline stage runs
the forwards and backwards of a step's micro-batches: pure data, the same on
every replica, testable without running anything.

  local ops = schedule.ops('1f1b' | 'gpipe', stages, chunks, stage)
  -- { {'F', 1}, {'F', 2}, {'B', 1}, ... }   micro-batches 1-based, stage 0-based

GPipe runs every forward, then every backward (in the same order, so that a
stage receives gradients in the order its successor sends them). It holds all
`chunks` micro-batches' activations at its peak.

1F1B (PipeDream-flush): stage s first runs min(stages - 1 - s, chunks) forwards
(the warm-up that fills the pipe below it), then alternates one forward and one
backward, and ends with the backwards left (the cool-down). A stage holds at
most stages - s micro-batches at once. Both schedules idle each stage for
(stages - 1) forward+backward slots of the (chunks + stages - 1) the step lasts:
the bubble (p - 1) / (m + p - 1).

Every stage's sends meet its neighbour's receives in order: stage s's forwards
run in micro-batch order and so do stage s + 1's; the same holds for the
backwards. Point-to-point sends pair in the order they are issued, so this is
what keeps the stages from waiting on each other forever.
]]
local M = {}

M.NAMES = { gpipe = true, ['1f1b'] = true }

function M.ops(name, stages, chunks, stage)
  local ops = {}
  if name == 'gpipe' then
    for i = 1, chunks do ops[#ops + 1] = { 'F', i } end
    for i = 1, chunks do ops[#ops + 1] = { 'B', i } end
  elseif name == '1f1b' then
    local warm = math.min(stages - 1 - stage, chunks)
    local f, b = 0, 0
    for _ = 1, warm do f = f + 1; ops[#ops + 1] = { 'F', f } end
    while f < chunks do
      f = f + 1; ops[#ops + 1] = { 'F', f }
      b = b + 1; ops[#ops + 1] = { 'B', b }
    end
    while b < chunks do b = b + 1; ops[#ops + 1] = { 'B', b } end
  else
    error(("pipeline: unknown schedule '%s'"):format(tostring(name)), 2)
  end
  return ops
end

-- The most micro-batches whose activations a stage holds at once under ops.
function M.max_in_flight(ops)
  local live, most = 0, 0
  for _, op in ipairs(ops) do
    live = live + (op[1] == 'F' and 1 or -1)
    if live > most then most = live end
  end
  return most
end

return M

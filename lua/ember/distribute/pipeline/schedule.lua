--[[
ember.distribute.pipeline.schedule -- the order in which one pipeline stage runs
the forwards and backwards of a step's micro-batches: pure data, the same on
every replica, testable without running anything.

  local ops = schedule.ops('1f1b' | 'gpipe', stages, chunks, stage)
  -- { {'F', 1}, {'F', 2}, {'B', 1}, ... }   micro-batches 1-based, stage 0-based
  local ops = schedule.ops('interleaved', stages, chunks, stage, virtual)
  -- { {'F', 1, 1}, {'F', 2, 1}, {'F', 1, 2}, ... }  op[3]: the rank's model chunk
  schedule.check(name, stages, chunks, virtual) -- every rank's list run together

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

Interleaved 1F1B (Narayanan et al. 2021, "virtual pipeline"): the model is cut
into stages x virtual pieces and rank r holds pieces r, r + P, r + 2P, ... (its
model chunks 1..V, op[3]), so a micro-batch goes round the ranks V times. A
rank's forwards run in rounds of P micro-batches: micro-batches 1..P through
chunk 1, then 1..P through chunk 2, ..., then P+1..2P through chunk 1, and so
on; backwards the same, chunks in reverse. The warm-up is (P - 1 - r) x 2 +
(V - 1) x P forwards, then one forward and one backward alternate. Each rank
still idles (P - 1) slots, but a slot is now one chunk's forward+backward, a
V-th of a stage's: the bubble is (p - 1) / (v m + p - 1). The rounds are why m
must be a multiple of p: a round's P micro-batches leave chunk k of the last
rank just as chunk k + 1 of the first needs them.

Two ranks may now exchange activations and gradients over the same pair (with
P = 2 both go both ways), and sends pair with receives in the order issued,
whatever they carry: so M.check runs the op lists of every rank together --
sends never block, a receive waits for the next message its sender has issued
to it -- and checks that every receive meets the message it expects and that
no rank waits forever. The tests run it over many (P, M, V), and over the
plain schedules too.
]]
local M = {}

M.NAMES = { gpipe = true, ['1f1b'] = true, interleaved = true }

-- Megatron's order: the k-th forward (0-based) of a rank is micro-batch
-- floor(k / (P V)) P + k % P + 1 through chunk floor(k % (P V) / P) + 1; the
-- k-th backward the same, chunks in reverse.
local function interleaved(P, Mc, r, V)
  local total = Mc * V
  local function at(k, backward)
    local within = k % (P * V)
    local c = math.floor(within / P)
    if backward then c = V - 1 - c end
    return math.floor(k / (P * V)) * P + k % P + 1, c + 1
  end
  local warm = math.min((P - 1 - r) * 2 + (V - 1) * P, total)
  local ops, f, b = {}, 0, 0
  local function fwd() local i, c = at(f, false); f = f + 1; ops[#ops + 1] = { 'F', i, c } end
  local function bwd() local i, c = at(b, true); b = b + 1; ops[#ops + 1] = { 'B', i, c } end
  for _ = 1, warm do fwd() end
  while f < total do fwd(); bwd() end
  while b < total do bwd() end
  return ops
end

function M.ops(name, stages, chunks, stage, virtual)
  local ops = {}
  if name == 'interleaved' then
    virtual = virtual or 2
    if chunks % stages ~= 0 then
      error(('pipeline: the interleaved schedule needs chunks a multiple of stages: ' ..
        'chunks = %d, stages = %d'):format(chunks, stages), 2)
    end
    return interleaved(stages, chunks, stage, virtual)
  elseif name == 'gpipe' then
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

-- The pipeline stage (0-based, of stages x virtual) an op of `stage` runs.
function M.piece(op, stages, stage) return ((op[3] or 1) - 1) * stages + stage end

-- Runs every rank's op list together, as pipeline.lua exchanges tensors: a
-- forward of piece v receives an activation from the rank of piece v - 1
-- (unless v = 0) and sends its output to that of v + 1 (unless v is the last);
-- a backward receives from v + 1 and sends to v - 1. Returns true, or false and
-- what went wrong: a receive that meets another message than it expects, or
-- ranks that all wait (a deadlock). With it, every rank's idle share of the
-- step when each op costs the same and messages take no time: the schedule's
-- own bubble, which the formula names.
function M.check(name, P, Mc, V)
  V = name == 'interleaved' and (V or 2) or 1
  local last = P * V - 1
  local lists, at, queue, clock = {}, {}, {}, {}
  for r = 0, P - 1 do lists[r], at[r], clock[r] = M.ops(name, P, Mc, r, V), 1, 0 end
  local function chan(a, b) local k = a .. '>' .. b; queue[k] = queue[k] or { head = 1 }; return queue[k] end
  local function send(from, v, msg)
    local q = chan(from, v % P)
    q[#q + 1] = msg
  end
  local left = 0
  for r = 0, P - 1 do left = left + #lists[r] end
  while left > 0 do
    local moved = false
    for r = 0, P - 1 do
      local op = lists[r][at[r]]
      while op do
        local v, i = M.piece(op, P, r), op[2]
        local src = op[1] == 'F' and v - 1 or v + 1
        if src >= 0 and src <= last then
          local q = chan(src % P, r)
          local msg = q[q.head]
          if not msg then break end
          q.head = q.head + 1
          clock[r] = math.max(clock[r], msg.at)
          msg = msg.what
          local want = (op[1] == 'F' and 'act ' or 'grad ') .. i .. ' to ' .. v
          if msg ~= want then
            return false, ('%s P=%d M=%d V=%d: rank %d receives "%s" from rank %d, expects "%s"')
              :format(name, P, Mc, V, r, msg, src % P, want)
          end
        end
        clock[r] = clock[r] + 1
        local dst = op[1] == 'F' and v + 1 or v - 1
        if dst >= 0 and dst <= last then
          send(r, dst, { what = (op[1] == 'F' and 'act ' or 'grad ') .. i .. ' to ' .. dst,
                         at = clock[r] })
        end
        at[r] = at[r] + 1
        left = left - 1
        moved = true
        op = lists[r][at[r]]
      end
    end
    if not moved then
      local where = {}
      for r = 0, P - 1 do
        local op = lists[r][at[r]]
        if op then where[#where + 1] = ('rank %d at %s %d chunk %d'):format(r, op[1], op[2], op[3] or 1) end
      end
      return false, ('%s P=%d M=%d V=%d: deadlock, %s'):format(name, P, Mc, V, table.concat(where, ', '))
    end
  end
  for k, q in pairs(queue) do
    if q[q.head] then
      return false, ('%s P=%d M=%d V=%d: %s never received on %s'):format(name, P, Mc, V,
        q[q.head].what, k)
    end
  end
  local span, idle = 0, {}
  for r = 0, P - 1 do span = math.max(span, clock[r]) end
  for r = 0, P - 1 do idle[r + 1] = (span - #lists[r]) / span end
  return true, nil, idle
end

return M

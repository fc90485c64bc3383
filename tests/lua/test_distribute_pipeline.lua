--[[
test_distribute_pipeline.lua -- em.distribute.pipeline: schedules, cuts, and
stages on 2 and 4 replicas (tests/lua/dist/pipeline.lua).

In this process: the schedules' op lists (every micro-batch forward then
backward once, the warm-up of 1F1B, at most P micro-batches in flight), the cut
(the partition against brute force, time and memory costs that find the
expensive child). Through `ember --replicas N` and mpirun: loss, every gradient
and the parameters after 3 Adam steps against one model on the whole batch, for
both schedules, P = 2 and 4, and P = 2 x D = 2; the bubble the profiler
recorded with stages that sleep a known time (the schedule's ops and waits,
the pipeline's own figure against the spans, the stages overlapping); the
interleaved schedule (its op lists run on all ranks together, its
equivalence, bubble and checkpoints against the plain layouts); 1F1B's peak
memory against GPipe's, micro-batch by micro-batch; every bad setting raising
the same error on every replica; checkpoints saved under P = 2 loaded into
P = 2, P = 4, one stage and a plain model; emulated GPU replicas. Stages whose
D = 2 replicas shard them ('optimizer', 'gradients', 'parameters') against one
model, and their checkpoints (and those of P = 2 x D = 2 unsharded) loaded
into the same layout, P = 4, P = 2 x D = 2 sharded otherwise or not, one and
two stages, a plain model and a data-parallel ZeRO-2 model, a step after each
compared with a model never saved.
]]
local dir = (arg and arg[0] and arg[0]:match('^(.*/)')) or
            ((os.getenv('EMBER_TESTS') or 'tests') .. '/lua/')
local H = dofile(dir .. 'harness.lua')
local em = require 'ember'
local nn = em.nn
local ember = arg[-1] or 'ember'
local L = dofile(dir .. 'dist/launch.lua')(dir, ember)
local schedule = require 'ember.distribute.pipeline.schedule'
local cut = require 'ember.distribute.pipeline.cut'

-- -- In this process ----------------------------------------------------------------------------

H.test('schedules: every micro-batch forward then backward once, in order', function()
  for _, P in ipairs({ 1, 2, 4 }) do
    for _, M in ipairs({ 1, P, 4 * P }) do
      for _, name in ipairs({ 'gpipe', '1f1b' }) do
        for st = 0, P - 1 do
          local ops = schedule.ops(name, P, M, st)
          H.eq(#ops, 2 * M, name .. ' op count')
          local f, b, fwd_done = 0, 0, {}
          local ok = true
          for _, op in ipairs(ops) do
            if op[1] == 'F' then
              f = f + 1; ok = ok and op[2] == f; fwd_done[op[2]] = true
            else
              b = b + 1; ok = ok and op[2] == b and fwd_done[op[2]] == true
            end
          end
          H.check(ok, ('%s P=%d M=%d stage %d: forwards and backwards in order, each after its ' ..
            'forward'):format(name, P, M, st))
          local most = schedule.max_in_flight(ops)
          if name == 'gpipe' then
            H.eq(most, M, 'gpipe holds every micro-batch')
          else
            H.eq(most, math.min(P - st, M), ('1f1b P=%d M=%d stage %d holds at most P - stage')
              :format(P, M, st))
            -- warm-up: P - 1 - stage forwards before the first backward
            local first_b
            for k, op in ipairs(ops) do if op[1] == 'B' then first_b = k; break end end
            H.eq(first_b - 1, math.min(P - st, M), '1f1b: forwards before the first backward')
          end
        end
      end
    end
  end
  H.eq(schedule.ops('1f1b', 2, 3, 0),
    { { 'F', 1 }, { 'F', 2 }, { 'B', 1 }, { 'F', 3 }, { 'B', 2 }, { 'B', 3 } })
  H.eq(schedule.ops('gpipe', 2, 2, 1), { { 'F', 1 }, { 'F', 2 }, { 'B', 1 }, { 'B', 2 } })
  H.raises(function() schedule.ops('zigzag', 2, 2, 0) end, "unknown schedule 'zigzag'")
end)

H.test('interleaved: every (micro-batch, chunk) forward then backward once, chunks in order', function()
  for _, P in ipairs({ 1, 2, 3, 4 }) do
    for _, M in ipairs({ P, 2 * P, 4 * P }) do
      for _, V in ipairs({ 1, 2, 3 }) do
        for st = 0, P - 1 do
          local ops = schedule.ops('interleaved', P, M, st, V)
          H.eq(#ops, 2 * M * V, 'op count')
          local pos, ok = {}, true
          for k, op in ipairs(ops) do
            local key = op[1] .. op[2] .. ':' .. op[3]
            ok = ok and pos[key] == nil and op[3] >= 1 and op[3] <= V and op[2] >= 1 and op[2] <= M
            pos[key] = k
          end
          for i = 1, M do
            for c = 1, V do
              local f, b = pos['F' .. i .. ':' .. c], pos['B' .. i .. ':' .. c]
              ok = ok and f and b and f < b
              -- a micro-batch's chunks: forwards in order, backwards in reverse
              if c > 1 then
                ok = ok and f > pos['F' .. i .. ':' .. (c - 1)] and b < pos['B' .. i .. ':' .. (c - 1)]
              end
            end
          end
          H.check(ok, ('interleaved P=%d M=%d V=%d stage %d: each op once, forward before ' ..
            'backward, chunk order'):format(P, M, V, st))
        end
      end
    end
  end
  -- Megatron's order for P = 2, M = 2, V = 2 on rank 1: warm-up (V - 1) P = 2
  H.eq(schedule.ops('interleaved', 2, 2, 1, 2), { { 'F', 1, 1 }, { 'F', 2, 1 }, { 'F', 1, 2 },
    { 'B', 1, 2 }, { 'F', 2, 2 }, { 'B', 2, 2 }, { 'B', 1, 1 }, { 'B', 2, 1 } })
  H.raises(function() schedule.ops('interleaved', 4, 6, 0, 2) end,
    'needs chunks a multiple of stages: chunks = 6, stages = 4')
end)

H.test('every schedule run on all ranks together: each receive meets its send, no deadlock, ' ..
       'the bubble of the formula', function()
  local n = 0
  for _, P in ipairs({ 1, 2, 3, 4, 8 }) do
    for _, M in ipairs({ 1, 2, 3, P, 2 * P, 4 * P }) do
      for _, name in ipairs({ 'gpipe', '1f1b', 'interleaved' }) do
        for _, V in ipairs(name == 'interleaved' and { 1, 2, 3, 4 } or { 1 }) do
          if name ~= 'interleaved' or M % P == 0 then
            local ok, why, idle = schedule.check(name, P, M, V)
            H.check(ok, why)
            if ok then
              -- unit-cost ops: every rank idles exactly the formula's share
              local want = (P - 1) / (V * M + P - 1)
              for r, b in ipairs(idle) do
                H.close(b, want, 1e-12, ('%s P=%d M=%d V=%d rank %d: ideal bubble'):format(
                  name, P, M, V, r - 1))
              end
            end
            n = n + 1
          end
        end
      end
    end
  end
  H.eq(n, 140, 'cases run')
  -- the checker catches what it is there for: sends out of the order of receives
  local real = schedule.ops
  schedule.ops = function(name, P, M, st, V)
    local ops = real(name, P, M, st, V)
    if st == 0 then ops[1], ops[2] = ops[2], ops[1] end
    return ops
  end
  local ok, why = schedule.check('1f1b', 2, 4)
  schedule.ops = real
  H.check(not ok and why:find('rank 1 receives "act 2 to 1" from rank 0, expects "act 1 to 1"', 1, true), tostring(why))
  schedule.ops = function(name, P, M, st, V)
    if st == 0 then return { { 'B', 1 }, { 'F', 1 } } end
    return real(name, P, 1, st, V)
  end
  ok, why = schedule.check('gpipe', 2, 1)
  schedule.ops = real
  H.check(not ok and why:find('deadlock', 1, true), tostring(why))
end)

-- The least largest stage cost, by trying every cut.
local function brute(costs, P)
  local n, best = #costs, math.huge
  local function go(start, k, worst)
    if k == P then
      local s = 0
      for i = start, n do s = s + costs[i] end
      best = math.min(best, math.max(worst, s))
      return
    end
    local s = 0
    for e = start, n - (P - k) do
      s = s + costs[e]
      go(e + 1, k + 1, math.max(worst, s))
    end
  end
  go(1, 1, 0)
  return best
end

H.test('the partition minimises the largest stage (against brute force)', function()
  em.manual_seed(3)
  for trial = 1, 30 do
    local n = 2 + trial % 7
    local costs = {}
    for i = 1, n do costs[i] = math.floor(em.rand(1):item() * 100) + 1 end
    for P = 1, math.min(n, 4) do
      local counts = cut.partition(costs, P)
      H.eq(#counts, P)
      local at, worst, total = 1, 0, 0
      for _, c in ipairs(counts) do
        H.check(c >= 1, 'a stage has a child')
        local s = 0
        for i = at, at + c - 1 do s = s + costs[i] end
        at, worst, total = at + c, math.max(worst, s), total + c
      end
      H.eq(total, n, 'every child in a stage')
      H.eq(worst, brute(costs, P), 'the least largest stage')
    end
  end
  H.eq(cut.partition({ 1, 1, 1, 9 }, 2), { 3, 1 })
end)

H.test('time and memory costs find the expensive child', function()
  local ffi = require 'ffi'
  pcall(ffi.cdef, 'int usleep(unsigned int usec);')
  local Slow = nn.Module:extend('Slow')
  function Slow:forward(x) ffi.C.usleep(20000); return x * 1 end
  local kids = { nn.Linear(4, 4), Slow(), nn.Tanh(), nn.Linear(4, 4) }
  local t = cut.time_costs(kids, em.randn(2, 4), 2)
  for i = 1, 4 do
    if i ~= 2 then H.check(t[2] > 5 * t[i], ('the sleeping child costs most (%g vs %g)'):format(t[2], t[i])) end
  end
  H.eq(cut.partition(t, 3), { 1, 1, 2 })
  local big = { nn.Linear(8, 8), nn.Linear(8, 512), nn.Tanh(), nn.Linear(512, 8) }
  local m = cut.memory_costs(big, em.randn(64, 8), 2)
  -- parameters x4 (+ grads and Adam's moments) and the activations kept for backward
  H.check(m[1] >= 4 * (64 + 8) * 4, 'parameters counted')
  H.check(m[3] >= 2 * 64 * 512 * 4, ('Tanh keeps its 64 x 512 output per micro-batch: %d'):format(m[3]))
  H.check(m[2] > m[1] and m[4] > m[1], 'the wide layers cost more')
end)

H.test('a world of one runs one stage, as the model does', function()
  local s = em.distribute.mirrored{}
  em.manual_seed(4)
  local ref = nn.Sequential(nn.Linear(3, 5), nn.Tanh(), nn.Linear(5, 2))
  em.manual_seed(4)
  local pp = s:pipeline(nn.Sequential(nn.Linear(3, 5), nn.Tanh(), nn.Linear(5, 2)),
    { stages = 1, chunks = 3, schedule = 'gpipe' })
  H.eq({ pp.stage, pp.stages, pp.chunks }, { 0, 1, 3 })
  local x, y = em.randn(6, 3), em.randn(6, 2)
  local loss = pp:step(x, y, nn.F.mse_loss)
  local rl = nn.F.mse_loss(ref(x), y)
  rl:backward()
  H.close(loss:item(), rl:item(), 1e-6, 'the loss')
  local g = pp:parameters()
  for i, p in ipairs(ref:parameters()) do H.close(H.flat(g[i].grad), H.flat(p.grad), 1e-6, 'grad ' .. i) end
  local sd = pp:state_dict()
  H.check(sd['3.bias'] ~= nil and sd['1.weight'] ~= nil, 'full-model names')
  local st = pp:stats()
  H.check(st.step_s > 0 and st.bubble >= 0 and st.bubble < 1 and st.peak_bytes > 0, 'stats')
  H.close(H.flat(pp:forward(x)), H.flat(ref(x):detach()), 1e-6, 'forward')
  H.raises(function() pp:step(x, y, 'mse') end, 'loss_fn must be a function')
  H.raises(function() em.distribute.pipeline(nn.Linear(2, 2), { stages = 1 }) end, 'Sequential')
end)

-- -- On N replicas ------------------------------------------------------------------------------

local function rows(out, key)
  local list = {}
  for line in out:gmatch('[^\n]+') do
    local r = line:match('rank (%d+) ' .. key)
    if r then list[#list + 1] = line end
  end
  return list
end

local function equal_to_one_model(out, rc, n, what, tol)
  tol = tol or 1e-5
  H.eq(rc, 0, what .. ': exit status\n' .. out)
  local lines = rows(out, 'stage')
  H.eq(#lines, n, what .. ': every replica reports\n' .. out)
  for _, line in ipairs(lines) do
    for _, k in ipairs({ 'lossdiff', 'graddiff', 'maxdiff', 'forward' }) do
      local v = tonumber(line:match(k .. ' (%S+)'))
      H.check(v and v <= tol, ('%s: %s %s'):format(what, k, line))
    end
    -- the global batch went in; this replica's data replica read only its share
    local seen, share = line:match('rows (%d+) share (%d+)')
    if line:find('counts', 1, true) then
      H.check(seen and seen == share, ('%s: rows read in a step: %s'):format(what, line))
    end
  end
  return lines
end

H.test('both schedules equal one model on the batch, on 2 and 4 replicas', function()
  for _, sched in ipairs({ 'gpipe', '1f1b' }) do
    for _, c in ipairs({ { 2, 2, 1 }, { 2, 2, 4 }, { 4, 4, 4 }, { 4, 4, 16 } }) do
      local n, P, M = c[1], c[2], c[3]
      local out, rc = L.replicas(n, 'pipeline.lua', ('equiv %s %d %d'):format(sched, P, M))
      equal_to_one_model(out, rc, n, ('%s P=%d M=%d'):format(sched, P, M))
    end
    local out, rc = L.replicas(4, 'pipeline.lua', ('equiv %s 2 4'):format(sched))
    equal_to_one_model(out, rc, 4, sched .. ' P=2 D=2')
  end
end)

H.test('interleaved (virtual = 2) equals one model, P = 2 and 4, and P = 2 x D = 2', function()
  for _, c in ipairs({ { 2, 2, 2 }, { 2, 2, 4 }, { 4, 4, 4 }, { 4, 4, 8 } }) do
    local n, P, M = c[1], c[2], c[3]
    local out, rc = L.replicas(n, 'pipeline.lua', ('equiv interleaved2 %d %d'):format(P, M))
    local lines = equal_to_one_model(out, rc, n, ('interleaved P=%d M=%d'):format(P, M))
    -- the model is cut into P x 2 pieces
    local counts = lines[1] and lines[1]:match('counts (%S+)')
    H.eq(counts and select(2, counts:gsub('%d+', '')), 2 * P, 'P x V pieces\n' .. out)
  end
  local out, rc = L.replicas(4, 'pipeline.lua', 'equiv interleaved2 2 4')
  equal_to_one_model(out, rc, 4, 'interleaved P=2 D=2')
end)

H.test('balance by counts, time and memory', function()
  local out, rc = L.replicas(4, 'pipeline.lua', 'equiv 1f1b 4 4 1,1,3,4')
  local lines = equal_to_one_model(out, rc, 4, 'counts')
  H.check(lines[1] and lines[1]:find('counts 1,1,3,4', 1, true), 'the given counts\n' .. out)
  for _, b in ipairs({ 'time', 'memory' }) do
    out, rc = L.replicas(2, 'pipeline.lua', 'equiv gpipe 2 4 ' .. b)
    lines = equal_to_one_model(out, rc, 2, b)
    -- every replica cuts the same way
    local c1 = lines[1] and lines[1]:match('counts (%S+)')
    H.check(c1 and lines[2] and lines[2]:match('counts (%S+)') == c1, b .. ': one cut\n' .. out)
  end
end)

H.test('under mpirun', function()
  if not L.have_mpirun() then H.skip(L.no_mpirun_why) return end
  for _, sched in ipairs({ 'gpipe', '1f1b' }) do
    local out, rc = L.mpirun(2, 'pipeline.lua', 'equiv ' .. sched .. ' 2 4')
    equal_to_one_model(out, rc, 2, 'mpirun ' .. sched .. ' P=2')
  end
  local out, rc = L.mpirun(4, 'pipeline.lua', 'equiv 1f1b 4 8')
  equal_to_one_model(out, rc, 4, 'mpirun 1f1b P=4')
  out, rc = L.mpirun(2, 'pipeline.lua', 'equiv interleaved2 2 4')
  equal_to_one_model(out, rc, 2, 'mpirun interleaved P=2')
  out, rc = L.mpirun(4, 'pipeline.lua', 'equiv interleaved2 4 4')
  equal_to_one_model(out, rc, 4, 'mpirun interleaved P=4')
end)

H.test('on emulated GPU replicas', function()
  local env = 'EMBER_CUDA_EMULATE=2:64'
  local out, rc = L.run(('%s %s --replicas 2 --devices cuda:0,cuda:1 %sdist/pipeline.lua equiv ' ..
    '1f1b 2 4'):format(env, ember, dir))
  local lines = equal_to_one_model(out, rc, 2, 'GPU 1f1b')
  for _, line in ipairs(lines) do H.check(line:find('device cuda:', 1, true), 'on a GPU: ' .. line) end
  out, rc = L.run(('%s %s --replicas 2 --devices cuda:0,cuda:1 %sdist/pipeline.lua equiv ' ..
    'gpipe 2 2'):format(env, ember, dir))
  equal_to_one_model(out, rc, 2, 'GPU gpipe')
end)

-- `bubble SCHED P M`: P (x V) pieces that sleep 10 ms in each forward and
-- backward, one step profiled. What the profiler recorded there, per stage:
-- the forwards and backwards in the schedule's order (whose bubble in op units
-- is the formula's: the schedule checks above), one bubble span per blocking
-- wait (each receive, each send's end, the loss's allreduce, and the
-- activations' headers, received and sent once per piece in a first step),
-- and the stage's own figure (pp:stats().bubble of that step) enclosing those
-- spans and no more than the step less its sleeps (and in a next step that
-- sleeps nowhere, a share of that step alone). And the stages ran together: the
-- sleeps of all stages overlap, against one stage at a time, by at least half
-- of what the formula's bubble leaves (P (1 - bubble)) -- a sleep needs no
-- core, so a loaded machine delays the ops around the sleeps but leaves them
-- overlapping; only the spans' union counts, not the wall clock's gaps. The
-- measured share itself against the formula, a matter of the machine's load,
-- is tests/bench/bench_pipeline.lua's.
local decode = require 'ember.checkpoint.json'
local tmp = H.tmpdir()

-- the kinds of ops ('F'/'B') in order, and the blocking waits of a first step
local function want_ops(name, p, m, st, v)
  local kinds, waits = {}, 1                      -- (1: the loss's allreduce)
  local top = p * v - 1
  local told = {}                                 -- pieces whose activation has had its header
  for _, op in ipairs(schedule.ops(name, p, m, st, v)) do
    kinds[#kinds + 1] = op[1]
    local piece = schedule.piece(op, p, st)
    local from, to = piece - 1, piece + 1         -- a forward's neighbours
    if op[1] == 'B' then from, to = piece + 1, piece - 1 end
    local n = 1
    if op[1] == 'F' and not told[piece] then n = 2; told[piece] = true end
    if from >= 0 and from <= top then waits = waits + n end     -- its receives
    if to >= 0 and to <= top then waits = waits + n end         -- its sends' ends
  end
  return table.concat(kinds), waits
end

-- the length of the union of intervals {t0, t1}
local function union(list)
  table.sort(list, function(a, b) return a[1] < b[1] end)
  local total, lo, hi = 0, nil, nil
  for _, x in ipairs(list) do
    if hi and x[1] <= hi then hi = math.max(hi, x[2])
    else
      if hi then total = total + (hi - lo) end
      lo, hi = x[1], x[2]
    end
  end
  return total + (hi and hi - lo or 0)
end

local function check_bubble(sched, p, m, concurrency)
  -- 'interleaved2': the interleaved schedule, virtual = 2
  local v = tonumber(sched:match('^interleaved(%d+)$'))
  local name = v and 'interleaved' or sched
  v = v or 1
  local what = ('%s p=%d m=%d'):format(sched, p, m)
  local trace = tmp .. '/bubble.json'
  os.remove(trace)
  local out, rc = L.replicas(p, 'pipeline.lua', ('bubble %s %d %d %s'):format(sched, p, m, trace))
  H.eq(rc, 0, what .. '\n' .. out)
  local doc = decode(H.read(trace) or '{"traceEvents":[]}', 64)
  local main = {}
  for _, e in ipairs(doc.traceEvents) do
    if e.ph == 'M' and e.name == 'thread_name' and e.args.name == 'main' then main[e.pid] = e.tid end
  end
  local sleeps_all, sleep_total = {}, 0
  for st = 0, p - 1 do
    local ops, sleeps, waits, waited = {}, 0, 0, 0
    local list = {}
    for _, e in ipairs(doc.traceEvents) do
      if e.ph == 'X' and e.pid == st and e.tid == main[st] then list[#list + 1] = e end
    end
    table.sort(list, function(a, b) return a.ts < b.ts end)
    for _, e in ipairs(list) do
      local kind = (e.name == 'module Sleep' and e.cat == 'range') and 'F' or
                   (e.name == 'sleep' and e.cat == 'backward') and 'B' or nil
      if kind then
        ops[#ops + 1] = kind
        sleeps = sleeps + e.dur * 1e-6
        sleeps_all[#sleeps_all + 1] = { e.ts, e.ts + e.dur }
      elseif e.cat == 'bubble' then
        waits, waited = waits + 1, waited + e.dur * 1e-6
      end
    end
    sleep_total = sleep_total + sleeps
    local kinds, nwaits = want_ops(name, p, m, st, v)
    H.eq(table.concat(ops), kinds, ('%s stage %d: forwards and backwards in the schedule\'s ' ..
      'order'):format(what, st))
    H.eq(waits, nwaits, ('%s stage %d: a bubble span per blocking wait'):format(what, st))
    local b, step, next_b = out:match('rank ' .. st .. ' bubble (%S+) step_s (%S+) next (%S+)')
    b, step, next_b = tonumber(b), tonumber(step), tonumber(next_b)
    H.check(next_b and next_b >= 0 and next_b < 1, ('%s stage %d: the next step\'s bubble %s ' ..
      'is a share of its own'):format(what, st, tostring(next_b)))
    -- (the trace keeps nanoseconds: a span's figure is within 1e-9 s of its own)
    local slack = 1e-9 * (waits + #ops + 1)
    H.check(b and b * step >= waited - slack and b * step + sleeps <= step + slack,
      ('%s stage %d: pp:stats() waited %s of %s s; the spans: waits %.6f s, sleeps %.6f s')
      :format(what, st, b and ('%.6f'):format(b * step) or '?', tostring(step), waited, sleeps))
  end
  if concurrency then
    local ideal = p * (1 - (p - 1) / (v * m + p - 1))
    local got = sleep_total / math.max(union(sleeps_all) * 1e-6, 1e-9)
    H.check(got >= 1 + (ideal - 1) / 2, ('%s: the stages\' sleeps overlap %.2f-fold, the ' ..
      'formula\'s schedule %.2f-fold'):format(what, got, ideal))
  end
end

-- ThreadSanitizer runs the smallest case alone, without the overlap (its
-- slower ops leave the sleeps a smaller share of the step)
local tsan = H.tsan()
H.test('the recorded bubble: the schedule\'s ops and waits, the stages together', function()
  for _, p in ipairs({ 2, 4 }) do
    for _, m in ipairs({ p, 4 * p }) do
      for _, sched in ipairs({ 'gpipe', '1f1b' }) do
        if not tsan or (p == 2 and m == 2) then check_bubble(sched, p, m, not tsan) end
      end
    end
  end
  if tsan then H.skip('the overlap of the stages under ThreadSanitizer (every op far slower)') end
end)

H.test('the recorded interleaved bubble: the schedule\'s ops and waits, the stages together', function()
  for _, p in ipairs({ 2, 4 }) do
    for _, m in ipairs({ p, 2 * p }) do
      if not tsan or (p == 2 and m == 2) then check_bubble('interleaved2', p, m, not tsan) end
    end
  end
end)

-- P = 2, M = 8: GPipe holds all 8 micro-batches' activations at once, 1F1B at
-- most P - stage of them (2 on stage 0, 1 on the last). A micro-batch holds a
-- layer input per layer of the stage (the last stage its received input as
-- well), so the peaks differ by the micro-batches 1F1B does not hold, and past
-- them both hold the same: a backward's temporaries, garbage under the
-- pipeline's collection, and the sends, waited for at the step's end.
H.test('1F1B holds P - stage micro-batches\' activations, GPipe all of them', function()
  local act, depth, tensor = {}, nil, nil
  for _, sched in ipairs({ 'gpipe', '1f1b' }) do
    local out, rc = L.replicas(2, 'pipeline.lua', 'memory ' .. sched .. ' 2 8')
    H.eq(rc, 0, out)
    act[sched] = {}
    for r, a, d, t in out:gmatch('rank (%d+) peak %d+ activations (%d+) depth (%d+) tensor (%d+)') do
      act[sched][tonumber(r)] = tonumber(a)
      depth, tensor = tonumber(d), tonumber(t)
    end
  end
  for st = 0, 1 do
    local g, f = act.gpipe[st], act['1f1b'][st]
    local want = depth and (8 - (2 - st)) * (depth + st) * tensor
    H.check(g and f and want and math.abs((g - f) - want) <= 0.1 * want, ('stage %d: gpipe %s, ' ..
      '1f1b %s bytes over the step\'s start; %s micro-batches of %s bytes apart'):format(st,
      tostring(g), tostring(f), tostring(8 - (2 - st)), tostring(depth and (depth + st) * tensor)))
  end
  -- stage 0: 8 micro-batches against 2, less what both hold
  local g, f = act.gpipe[0], act['1f1b'][0]
  H.check(g and f and g >= 3 * f and g <= 4.4 * f, ('stage 0: gpipe %s, 1f1b %s: %.2f-fold')
    :format(tostring(g), tostring(f), g and f and g / f or 0))
end)

H.test('bad settings: the same clear error on every replica', function()
  local out, rc = L.replicas(2, 'pipeline.lua', 'errors 2')
  H.eq(rc, 0, out)
  local want = {
    chunks = 'chunks = 5, but the batch has only 4 rows',
    stages = 'stages = 10, but the Sequential has only 9 children',
    divisible = 'world size 2 is not divisible by stages = 3',
    balance = 'sums to 7, the Sequential has 9 children',
    balance_len = 'balance lists 1 stage sizes, stages = 2',
    schedule = "unknown schedule 'zigzag'",
    option = "unknown option 'chunk'",
    sequential = 'must be an em.nn.Sequential',
    sample = 'pass sample =',
    multiple = 'interleaved schedule needs chunks a multiple of stages: chunks = 3, stages = 2',
    virtual = "virtual = 2 needs schedule = 'interleaved'",
    virtual_int = 'virtual must be an integer >= 1',
    pieces = 'stages x virtual = 2 x 5 = 10 pieces, but the Sequential has only 9 children',
    balance_pieces = 'balance lists 2 stage sizes, stages x virtual = 4',
    batch = "batch must be 'global' (every replica passes the whole batch) or 'share'",
    uneven = 'the global batch has 5 rows, which 2 data replicas cannot share evenly',
  }
  for name, text in pairs(want) do
    for r = 0, 1 do
      local line = out:match('rank ' .. r .. ' case ' .. name .. ': ([^\n]*)')
      H.check(line and line:find(text, 1, true), ('rank %d %s: %s'):format(r, name, tostring(line)))
    end
  end
  H.eq(select(2, out:gsub('after errors loss true', '')), 2, 'a pipeline works after\n' .. out)
end)

-- A checkpoint of tests/lua/dist/pipeline.lua's model after 2 Adam steps, loaded
-- into a plain model (as the script builds it) and its optimizer: a third step
-- equals three steps of a model never saved.
local function load_plain(ck, what)
  what = what and what .. ': ' or ''
  local function build(scale)
    em.manual_seed(7)
    local Scale = nn.Module:extend('Scale')
    function Scale:init(n) self:register_buffer('scale', em.ones(n)) end
    function Scale:forward(x) return x * self.scale end
    local m = nn.Sequential(nn.Linear(5, 8), nn.Tanh(), nn.Linear(8, 8), nn.ReLU(),
      nn.Linear(8, 8), nn.Tanh(), nn.Linear(8, 8), nn.Linear(8, 3), Scale(3))
    m[9].scale:copy_(em.tensor({ 1, scale, 0.5 }))
    return m
  end
  local function mse(o, y) return ((o - y) ^ 2):mean() end
  local function batch(step) em.manual_seed(100 + step); return em.randn(16, 5), em.randn(16, 3) end
  local ref, plain = build(2), build(3)
  local ropt = em.optim.Adam(ref:parameters(), { lr = 1e-2 })
  local popt = em.optim.Adam(plain:parameters(), { lr = 1e-2 })
  em.checkpoint.load(ck, { model = plain, optimizer = popt })
  H.eq(plain[9].scale:totable(), { 1, 2, 0.5 }, what .. 'the buffer from the last stage\'s file')
  for step = 1, 3 do
    local x, y = batch(step)
    ropt:zero_grad(); mse(ref(x), y):backward(); ropt:step()
    if step == 3 then popt:zero_grad(); mse(plain(x), y):backward(); popt:step() end
  end
  local rp = ref:parameters()
  for i, p in ipairs(plain:parameters()) do
    H.close(H.flat(p), H.flat(rp[i]), 1e-5, what .. 'param ' .. i)
  end
end

H.test('checkpoints across pipeline and data layouts', function()
  local ck = os.tmpname()
  os.remove(ck)
  local out, rc = L.replicas(2, 'pipeline.lua', 'save ' .. ck)
  H.eq(rc, 0, out)
  for _, c in ipairs({ { 2, 2 }, { 4, 4 }, { 1, 1 } }) do
    out, rc = L.replicas(c[2], 'pipeline.lua', ('load %s %d'):format(ck, c[1]))
    equal_to_one_model(out, rc, c[2], ('saved at P=2, loaded at P=%d'):format(c[1]))
  end
  out, rc = L.replicas(4, 'pipeline.lua', ('load %s 2'):format(ck))
  equal_to_one_model(out, rc, 4, 'loaded at P=2 x D=2')
  load_plain(ck)
  os.execute('rm -rf ' .. ck)
end)

H.test('checkpoints across interleaved and plain 1F1B layouts', function()
  local ck, ck2 = os.tmpname(), os.tmpname()
  os.remove(ck); os.remove(ck2)
  local out, rc = L.replicas(2, 'pipeline.lua', 'save ' .. ck2 .. ' 2 none interleaved2')
  H.eq(rc, 0, out)
  out, rc = L.replicas(2, 'pipeline.lua', ('load %s 2 none 1f1b'):format(ck2))
  equal_to_one_model(out, rc, 2, 'saved interleaved P=2, loaded 1f1b P=2')
  out, rc = L.replicas(4, 'pipeline.lua', ('load %s 4 none interleaved2'):format(ck2))
  equal_to_one_model(out, rc, 4, 'saved interleaved P=2, loaded interleaved P=4')
  out, rc = L.replicas(2, 'pipeline.lua', 'save ' .. ck)
  H.eq(rc, 0, out)
  for _, c in ipairs({ { 2, 2 }, { 4, 4 } }) do
    out, rc = L.replicas(c[2], 'pipeline.lua', ('load %s %d none interleaved2'):format(ck, c[1]))
    equal_to_one_model(out, rc, c[2], ('saved 1f1b P=2, loaded interleaved P=%d'):format(c[1]))
  end
  os.execute('rm -rf ' .. ck .. ' ' .. ck2)
end)

H.test('stages sharded across their data replicas equal one model (P = 2 x D = 2)', function()
  for _, shard in ipairs({ 'optimizer', 'gradients', 'parameters' }) do
    for _, sched in ipairs({ 'gpipe', '1f1b' }) do
      local out, rc = L.replicas(4, 'pipeline.lua', ('equiv %s 2 4 - %s'):format(sched, shard))
      equal_to_one_model(out, rc, 4, ('%s shard=%s'):format(sched, shard))
    end
  end
end)

-- Saved under P = 2 x D = 2 (stages sharded with `shard`, or not: 'none'), then
-- loaded into each layout of `loads` ({replicas, stages, shard}), the plain
-- model and a ZeRO-2 data-parallel model on 2 replicas.
local function across_layouts(shard, loads)
  local ck = os.tmpname()
  os.remove(ck)
  local out, rc = L.replicas(4, 'pipeline.lua', 'save ' .. ck .. ' 2 ' .. shard)
  H.eq(rc, 0, 'save shard=' .. shard .. '\n' .. out)
  local f = io.open(ck .. '/index.json')
  local index = f and f:read('*a') or ''
  if f then f:close() end
  H.check(index:find('"world_size":4', 1, true), 'the index says world size 4\n' .. index)
  if shard ~= 'none' then
    -- stage 0's second weight: pieces in the files of replicas 0 and 2
    local r = index:match('"name":"3.weight".-"ranges":(%b[])')
    H.check(r and r:find('[0,', 1, true) and r:find('[2,', 1, true),
      'a stage\'s parameter in both of its replicas\' files: ' .. tostring(r))
  end
  for _, c in ipairs(loads) do
    local n, P, sh = c[1], c[2], c[3] or 'none'
    out, rc = L.replicas(n, 'pipeline.lua', ('load %s %d %s'):format(ck, P, sh))
    equal_to_one_model(out, rc, n, ('saved at P=2 x D=2 shard=%s, loaded at P=%d x D=%d ' ..
      'shard=%s'):format(shard, P, n / P, sh))
  end
  load_plain(ck, 'shard=' .. shard .. ', into a plain model')
  out, rc = L.replicas(2, 'pipeline.lua', 'zero ' .. ck .. ' gradients')
  equal_to_one_model(out, rc, 2, ('saved at P=2 x D=2 shard=%s, loaded into ZeRO-2 on 2 ' ..
    'replicas'):format(shard))
  os.execute('rm -rf ' .. ck)
end

H.test('checkpoints of sharded stages across pipeline, data and shard layouts', function()
  for _, shard in ipairs({ 'gradients', 'parameters' }) do
    across_layouts(shard, { { 4, 2, shard }, { 4, 4 }, { 4, 2 }, { 4, 2, 'optimizer' } })
  end
end)

H.test('checkpoints of P = 2 x D = 2 stages (not sharded) across layouts', function()
  across_layouts('none', { { 4, 2 }, { 4, 2, 'parameters' }, { 2, 2 }, { 1, 1 } })
end)

H.test('clip_grad_norm on a pipeline: the whole model\'s norm, clipped as one model', function()
  for _, c in ipairs({ { 2, '1f1b 2 4' }, { 4, '1f1b 2 4' }, { 4, 'gpipe 4 4' },
                       { 4, '1f1b 2 4 gradients' }, { 4, '1f1b 2 4 parameters' },
                       { 4, 'interleaved2 2 4' } }) do
    local n, args = c[1], c[2]
    local out, rc = L.replicas(n, 'pipeline.lua', 'clip ' .. args)
    H.eq(rc, 0, args .. ': ' .. out:sub(-400))
    local seen = 0
    for r, rn, pn, gd in out:gmatch('rank (%d+) clip (%S+) (%S+) graddiff (%S+)') do
      seen = seen + 1
      rn, pn, gd = tonumber(rn), tonumber(pn), tonumber(gd)
      H.check(math.abs(pn - rn) <= 1e-6 * rn,
        ('%s on %d, rank %s: norm %.10g, one model %.10g'):format(args, n, r, pn, rn))
      H.check(gd <= 1e-6, ('%s on %d, rank %s: clipped gradients differ by %g'):format(args, n, r, gd))
    end
    H.eq(seen, n, args .. ': every rank reported\n' .. out)
  end
end)

os.execute('rm -rf ' .. tmp)
H.done()

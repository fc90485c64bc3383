--[[
test_profile_pipeline.lua -- what the profiler knows of pipelines: the bubble
spans pipelines record (prof.hooks.wait) on the timeline and in the breakdown, the
per-step reports (prof.hooks.pipeline_step) against the formula (p-1)/(m+p-1), the
'pipeline-bubble' diagnosis, and the predicted peak (em.profile.expect) beside
the measured one, in the report, r:print() and the page.

One replica: synthetic steps of ops outside and inside bubbles of known
length; the bubble's share is checked against the recorded spans (the trace's,
which hold the ops of the bubble and none of the step's others), never under the
clock readings inside them, with the host share over the spins between them
(accounting, not speed: no band of wall-clock time), and the ops inside a
bubble against the compute share. Several replicas:
tests/lua/dist/profile_pipeline.lua, a hand-made pipeline whose waits on
neighbour stages are real point-to-point receives inside bubbles, each
replica's bubble against its trace spans and its own clock readings the same
way.
The diagnosis threshold itself is checked on synthetic summaries.
]]
local dir = (arg and arg[0] and arg[0]:match('^(.*/)')) or
            ((os.getenv('EMBER_TESTS') or 'tests') .. '/lua/')
local H = dofile(dir .. 'harness.lua')
local em = require 'ember'
local prof = require 'ember.profile'
local report = require 'ember.profile.report'
local decode = require 'ember.checkpoint.json'
local ember = arg[-1] or 'ember'
if ember:find('/') and not ember:match('^/') then
  local p = io.popen('pwd'); ember = p:read('*l') .. '/' .. ember; p:close()
end
local L = dofile(dir .. 'dist/launch.lua')(dir, ember)

local tmp = H.tmpdir()
local read = H.read

local function spin(seconds)
  local t0 = em.clock()
  while em.clock() - t0 < seconds do end
end

H.test('_bubble and _pipeline are plain calls when not recording', function()
  local a, b, c = prof.hooks.wait('x', function(x, y) return x + y, nil, 'z' end, 1, 2)
  H.check(a == 3 and b == nil and c == 'z', 'the results, a nil among them')
  H.eq(select('#', prof.hooks.wait('x', function() return nil, nil end)), 2)
  prof.hooks.pipeline_step { stage = 0, stages = 2, chunks = 4, bubble = 0.5, step_s = 1 }   -- no-op
  H.raises(function() prof.hooks.wait('x', function() error('stage failed') end) end,
           'stage failed')
end)

H.test('one replica: bubbles in the breakdown, ops inside them not compute', function()
  local a = em.randn(96, 96)
  local v = em.randn(1000)
  em.matmul(a, a); em.exp(v)                            -- warm up
  local trace, html = tmp .. '/one.json', tmp .. '/one.html'
  em.profile.expect { peak_bytes = 12345678 }
  em.profile.start { trace = trace, html = html }
  local waited, nb = 0, 0
  for _ = 1, 4 do
    for _ = 1, 3 do em.matmul(a, a) end
    prof.hooks.wait('recv activation', function()
      local t0 = em.clock()                              -- timed inside the span
      em.exp(v)                                          -- inside: the bubble's time
      spin(0.004)
      waited = waited + (em.clock() - t0)
    end)
    nb = nb + 1
    spin(0.002)
    prof.hooks.pipeline_step { stage = 0, stages = 2, chunks = 8, schedule = '1f1b',
                     bubble = 0.12, step_s = 0.01 }
    em.profile.step()
  end
  -- an error inside a bubble leaves the profiler recording
  H.raises(function() prof.hooks.wait('x', function() error('neighbour died') end) end,
           'neighbour died')
  local r = em.profile.stop()
  em.profile.expect {}
  H.eq(r.steps, 4)
  local b = r.breakdown
  local total = r.step_s * r.steps
  -- host time is what no op and no bubble covers: at least the spins between
  -- the bubbles (2 ms each by their own clock), so a bubble grown over them
  -- leaves too little
  H.check(b.host * total >= 4 * 0.002, ('host %.6f s of %.6f s, the spins outside the ' ..
    'bubbles 0.008 s'):format(b.host * total, total))
  H.check(b.bubble, 'a bubble share')
  -- the spans enclose this loop's own clock readings inside them: never less
  local bubble_s = (b.bubble or 0) * total
  H.check(bubble_s >= waited - 1e-7, ('bubble time %.9f s, read inside the spans %.9f s')
    :format(bubble_s, waited))
  H.eq(b.communication, 0)
  -- compute is the matmuls alone: the exp ran inside a bubble
  local mm, ex
  for _, o in ipairs(r.top_ops) do
    if o.name == 'matmul' then mm = o elseif o.name == 'exp' then ex = o end
  end
  H.check(mm and ex and mm.calls == 12 and ex.calls == 4, 'both ops listed')
  if mm then H.close(b.compute * r.step_s * r.steps, mm.total_s, 1e-6 * mm.total_s + 1e-12) end
  -- the pipeline's own figures, the formula, no diagnosis at the formula's share
  local pl = r.pipeline
  H.eq({ pl.stage, pl.stages, pl.chunks, pl.schedule, pl.steps }, { 0, 2, 8, '1f1b', 4 })
  H.close(pl.bubble, 0.12, 1e-12)
  H.close(pl.expected, 1 / 9, 1e-12)
  for _, d in ipairs(r.diagnosis) do H.check(d.kind ~= 'pipeline-bubble', d.message) end
  -- the trace: one bubble span per call on the main track, as long as the loop saw
  local doc = decode(read(trace), 64)
  local main_tid
  for _, e in ipairs(doc.traceEvents) do
    if e.ph == 'M' and e.name == 'thread_name' and e.args.name == 'main' then main_tid = e.tid end
  end
  local spans, us, recv, ops = 0, 0, {}, {}
  for _, e in ipairs(doc.traceEvents) do
    if e.cat == 'bubble' and e.ph == 'X' then
      spans = spans + 1
      H.eq(e.tid, main_tid, 'on the replica\'s main track')
      if e.name == 'recv activation' then us = us + e.dur; recv[#recv + 1] = e end
    elseif e.cat == 'op' and e.ph == 'X' then
      ops[#ops + 1] = e
    end
  end
  H.eq(spans, nb + 1, 'every bubble, the failed one included')
  -- the breakdown's bubble is the spans' time, and each span holds the exp of
  -- its call and no matmul: it starts after the step's matmuls, ends before
  -- the next step's
  H.check(math.abs(us * 1e-6 - bubble_s) <= 1e-8, ('the trace\'s bubble spans %.9f s, the ' ..
    'breakdown\'s %.9f s'):format(us * 1e-6, bubble_s))
  for k, sp in ipairs(recv) do
    local inside = {}
    for _, o in ipairs(ops) do
      if o.ts < sp.ts + sp.dur and o.ts + o.dur > sp.ts then inside[#inside + 1] = o.name end
    end
    H.eq(inside, { 'exp' }, 'the ops inside bubble ' .. k)
  end
  -- print and page: the share, the pipeline line, the predicted peak
  local text = tostring(r)
  H.check(text:find('bubble %d+%%'), text)
  H.check(text:find('pipeline: stage 0 of 2, 8 chunks, 1f1b: bubble 12%', 1, true), text)
  H.check(text:find('predicted', 1, true) and text:find('12.3 MB predicted', 1, true), text)
  H.eq(r.expected_peak_bytes, 12345678)
  H.check(r.measured_peak_bytes and r.measured_peak_bytes > 0, 'a measured peak')
  local page = read(html)
  H.check(page:find('id="pipeline"', 1, true), 'the page has the pipeline table')
  H.check(page:find('>bubble<', 1, true), 'the page\'s breakdown has a bubble column')
  H.check(page:find('predicted peak', 1, true), 'the page shows the predicted peak')
end)

H.test('a pipeline that gives no bubble gets the share its spans measured', function()
  em.profile.start {}
  for _ = 1, 3 do
    prof.hooks.wait('recv', spin, 0.002)
    spin(0.002)
    prof.hooks.pipeline_step { stage = 1, stages = 4, chunks = 4, schedule = 'gpipe' }
    em.profile.step()
  end
  local r = em.profile.stop()
  H.check(r.breakdown.bubble and r.breakdown.bubble > 0, 'a bubble share')
  H.eq(r.pipeline.bubble, r.breakdown.bubble)
  H.close(r.pipeline.expected, 3 / 7, 1e-15)
  H.eq(r.pipeline.step_s, 0)
end)

H.test('an interleaved pipeline: the formula counts its model chunks', function()
  em.profile.start {}
  for _ = 1, 2 do
    prof.hooks.wait('recv', spin, 0.001)
    prof.hooks.pipeline_step { stage = 1, stages = 4, chunks = 4, schedule = 'interleaved', virtual = 2,
                     bubble = 0.3, step_s = 0.01 }
    em.profile.step()
  end
  local r = em.profile.stop()
  H.eq({ r.pipeline.schedule, r.pipeline.virtual }, { 'interleaved', 2 })
  H.close(r.pipeline.expected, 3 / 11, 1e-15, '(p-1)/(v m+p-1)')
  local text = table.concat(r:lines(), '\n')
  H.check(text:find('interleaved x2: bubble 30%', 1, true) and
          text:find('(p-1)/(v m+p-1): 27%', 1, true), text)
end)

H.test('expect{} and _pipeline reject bad input', function()
  H.raises(function() em.profile.expect { peak_bytes = -1 } end, 'profile.expect', 'peak_bytes')
  H.raises(function() em.profile.expect { peak = 1 } end, "unknown option 'peak'")
  H.raises(function() em.profile.expect(5) end, 'profile.expect')
  em.profile.start {}
  H.raises(function() prof.hooks.pipeline_step { stage = 0 } end, 'profile.hooks.pipeline_step')
  em.profile.stop()
end)

-- A summary as summary.lua makes it, with a pipeline's figures.
local function rep(rank, stages, chunks, bubble, compute_s)
  return { rank = rank, steps = 1, step_s = 0.1, span_s = 0.1, input_s = 0, compute_s = compute_s,
           comm_s = 0, peer_wait_s = 0, backward_s = 0, bubble_s = bubble * 0.1, ops = 0,
           ops_per_step = 0, mean_op_us = 0, coll_count = 0, coll_bytes = 0, coll_transfer_s = 0,
           coll_wait_s = 0, buckets = 0, bucket_bytes = 0, grad_bytes = 0, loader_busy_s = 0,
           loader_span_s = 0.1, host_s = 0.1 - compute_s - bubble * 0.1,
           breakdown = { input = 0, compute = compute_s / 0.1, communication = 0, bubble = bubble,
                         host = 1 - compute_s / 0.1 - bubble },
           pipeline = { stage = rank, stages = stages, chunks = chunks, schedule = '1f1b',
                        steps = 1, step_s = 0.1, bubble = bubble,
                        expected = (stages - 1) / (chunks + stages - 1) } }
end

local function kinds_of(d)
  local k = {}
  for _, x in ipairs(d) do k[x.kind] = x end
  return k
end

H.test('pipeline-bubble: the margin over (p-1)/(m+p-1)', function()
  H.close(report.bubble_formula(4, 4), 3 / 7, 1e-15)
  H.close(report.bubble_formula(2, 8), 1 / 9, 1e-15)
  H.eq(report.BUBBLE_MARGIN, 0.05)
  local f = 3 / 7                                       -- p = 4, m = 4
  local function diag(bubbles, computes)
    local reps = {}
    for i, b in ipairs(bubbles) do
      reps[i] = rep(i - 1, 4, 4, b, computes and computes[i] or 0.05)
    end
    return kinds_of(report.diagnose(reps, nil))
  end
  H.close(report.bubble_formula(4, 4, 2), 3 / 11, 1e-15)
  H.close(report.bubble_formula(2, 8, 1), 1 / 9, 1e-15)
  H.check(not diag({ f, f, f, f })['pipeline-bubble'], 'at the formula')
  H.check(not diag({ f + 0.04, f, f + 0.045, f })['pipeline-bubble'], 'within the margin')
  local k = diag({ f, f + 0.2, f, f })
  local d = k['pipeline-bubble']
  H.check(d, 'past the margin')
  if d then
    H.eq(d.stage, 1, 'the stage with the largest excess')
    H.eq(d.chunks_advised, 16, 'max(2m, 4p) chunks')
    H.check(d.message:find('stage 1 of 4', 1, true) and d.message:find('43%', 1, true) and
            d.message:find('Raise chunks to 16', 1, true) and d.message:find('16%', 1, true) and
            d.message:find('interleave', 1, true), d.message)
    H.check(not d.message:find('uneven', 1, true), 'equal stages are not called uneven')
  end
  -- uneven stages: named, the slowest first
  d = diag({ 0.8, 0.7, 0.6, f }, { 0.01, 0.01, 0.01, 0.06 })['pipeline-bubble']
  H.check(d and d.message:find('stage 3 computes 60.00 ms', 1, true) and
          d.message:find("balance = 'time'", 1, true), d and d.message)
  -- interleaved: the formula with v, no advice to interleave; plain: the
  -- interleaved formula's share in the advice
  local fi = 3 / 11
  local reps = {}
  for i = 1, 4 do
    reps[i] = rep(i - 1, 4, 4, i == 2 and fi + 0.2 or fi, 0.05)
    reps[i].pipeline.virtual, reps[i].pipeline.schedule = 2, 'interleaved'
    reps[i].pipeline.expected = fi
  end
  local di = kinds_of(report.diagnose(reps, nil))['pipeline-bubble']
  H.check(di and di.message:find('(p-1)/(v m+p-1)', 1, true) and
          di.message:find('v = 2 model chunks', 1, true) and di.message:find('27%', 1, true) and
          not di.message:find('interleave (', 1, true), di and di.message)
  H.check(not kinds_of(report.diagnose({ reps[1], reps[3], reps[4] }, nil))['pipeline-bubble'],
    'at the interleaved formula: no diagnosis')
  local dp = diag({ f, f + 0.2, f, f })['pipeline-bubble']
  H.check(dp and dp.message:find("interleave (schedule = 'interleaved', virtual = 2", 1, true) and
          dp.message:find('the formula then gives 27%', 1, true), dp and dp.message)
  -- a single stage is no pipeline
  H.check(not kinds_of(report.diagnose({ rep(0, 1, 4, 0.5, 0.05) }, nil))['pipeline-bubble'])
end)

local function run_replicas(n, mode)
  local out = tmp .. '/' .. mode .. n
  os.execute('mkdir -p ' .. out)
  local text, rc = L.replicas(n, 'profile_pipeline.lua', mode .. ' ' .. out)
  local f = {}
  for k, v in text:gmatch('([%w_]+)=([^\n]*)') do f[k] = v end
  return f, text, rc, out
end

-- REPk: the breakdown's bubble share, communication share and bubble seconds,
-- the seconds the stage's own clock read inside its bubbles, its stage, the
-- pipeline's bubble in the report, the predicted peak, and the mean of the
-- shares the stage reported.
local function rep_fields(f, rank)
  local x = {}
  for k, v in (f['REP' .. rank] or ''):gmatch('([%w_]+):(%S+)') do x[k] = tonumber(v) end
  return x
end

-- The bubble spans' seconds per replica in a trace.
local function trace_bubbles(path)
  local per, n = {}, {}
  local doc = decode(read(path) or '{"traceEvents":[]}', 64)
  for _, e in ipairs(doc.traceEvents) do
    if e.cat == 'bubble' and e.ph == 'X' then
      per[e.pid] = (per[e.pid] or 0) + e.dur * 1e-6
      n[e.pid] = (n[e.pid] or 0) + 1
    end
  end
  return per, n
end

-- A replica's breakdown against its spans: its bubble is the trace's bubble
-- spans, which enclose the stage's own clock readings inside them (so never
-- less), and none of it is communication (the receives waited inside bubbles).
local function check_replica(x, spans, what)
  H.check(x.bubble and x.bubble > 0, what .. ' has a bubble share')
  H.eq(x.communication, 0, what .. ' communication')
  H.check(x.bubble_s and spans and math.abs(x.bubble_s - spans) <= 1e-7,
    ('%s: the breakdown\'s bubble %s s, the trace\'s spans %s s'):format(what,
    tostring(x.bubble_s), tostring(spans)))
  H.check(x.bubble_s and x.waited and x.bubble_s >= x.waited - 1e-6,
    ('%s: the breakdown\'s bubble %s s, read inside the spans %s s'):format(what,
    tostring(x.bubble_s), tostring(x.waited)))
end

for _, n in ipairs({ 2, 3 }) do
  H.test(n .. ' replicas: every stage\'s bubble, in the breakdown, the trace and the page',
    function()
    local f, text, rc, out = run_replicas(n, 'even')
    H.eq(rc, 0, text)
    H.eq(tonumber(f.REPLICAS), n, text)
    local spans, per = trace_bubbles(out .. '/trace.json')
    for rank = 0, n - 1 do
      local x = rep_fields(f, rank)
      check_replica(x, spans[rank], 'rank ' .. rank)
      H.eq(x.stage, rank)
      -- the report's pipeline bubble: the mean of the shares the stage reported
      H.check(x.pipeline_bubble and x.mean and math.abs(x.pipeline_bubble - x.mean) <= 1e-6,
        'the pipeline\'s reported bubble: ' .. tostring(f['REP' .. rank]))
      H.eq(x.predicted, (rank + 1) * 1e6, 'rank ' .. rank .. ' predicted peak')
    end
    H.eq(tonumber(f.PRINT_PIPELINE), n, 'r:print() has a pipeline line per replica')
    H.eq(tonumber(f.PRINT_PREDICTED), n, 'r:print() has a predicted peak per replica')
    -- per step: the first stage waits for done and its sends; the middle ones for
    -- M activations, done, their sends and their send of done; the last for M
    -- activations, the sends (none) and its send of done
    local M = 2
    for rank = 0, n - 1 do
      local want = rank == 0 and 2 or rank == n - 1 and M + 2 or M + 3
      H.eq(per[rank], 5 * want, 'bubble spans of rank ' .. rank)
    end
    local page = read(out .. '/page.html')
    H.check(page and page:find('id="pipeline"', 1, true), 'the page has the pipeline table')
  end)
end

H.test('under mpirun: each process\'s bubbles and pipeline figures reach the report',
  function()
  if not L.have_mpirun() then H.skip(L.no_mpirun_why); return end
  local out = tmp .. '/mpi'
  os.execute('mkdir -p ' .. out)
  local text, rc = L.mpirun(2, 'profile_pipeline.lua', 'even ' .. out)
  local f = {}
  for k, v in text:gmatch('([%w_]+)=([^\n]*)') do f[k] = v end
  H.eq(rc, 0, text)
  H.eq(tonumber(f.REPLICAS), 2, text)
  local spans = trace_bubbles(out .. '/trace.json')
  for rank = 0, 1 do
    local x = rep_fields(f, rank)
    check_replica(x, spans[rank], 'mpirun rank ' .. rank)
    H.eq(x.stage, rank)
    H.eq(x.predicted, (rank + 1) * 1e6)
  end
end)

H.test('2 replicas, uneven stages: pipeline-bubble names them', function()
  local f, text, rc = run_replicas(2, 'uneven')
  H.eq(rc, 0, text)
  H.check(f.KINDS and f.KINDS:find('pipeline-bubble', 1, true), text)
  local m = f.BUBBLEMSG or ''
  H.check(m:find('stage 0 of 2', 1, true), m)
  H.check(m:find('stages are uneven: stage 1 computes', 1, true), m)
  H.check(m:find('Raise chunks to 8', 1, true), m)
end)

os.execute('rm -rf ' .. tmp)
H.done()

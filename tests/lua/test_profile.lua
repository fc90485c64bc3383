--[[
test_profile.lua -- em.profile: recording, the report, its diagnosis, the trace
and ember --profile.

Staged scenarios, each of which must get its diagnosis:
  - an input-bound loop (a slow map, no loader workers),
  - thousands of tiny ops per step (launch-bound),
  - a compute-bound step of large matmuls (neither input- nor launch-bound),
  - 2 replicas where one is slower (replica-skew naming it),
  - 2 replicas whose communicator is slowed by the test-only bandwidth cap
    EMBER_TEST_COMM_GBPS (communication-bound).
Plus: the breakdown sums to 1; op counts are exact; backward nodes, ranges and
optimizer steps are recorded; the trace parses as JSON with the fields Perfetto
needs (and flow arrows under a strategy); errors for misuse; ember --profile on a
script prints a report and writes both files.
]]
local dir = (arg and arg[0] and arg[0]:match('^(.*/)')) or
            ((os.getenv('EMBER_TESTS') or 'tests') .. '/lua/')
local H = dofile(dir .. 'harness.lua')
local em = require 'ember'
local decode = require 'ember.checkpoint.json'
local ember = arg[-1] or 'ember'
if ember:find('/') and not ember:match('^/') then   -- the CLI test runs elsewhere
  local p = io.popen('pwd'); ember = p:read('*l') .. '/' .. ember; p:close()
end

local tmp = os.tmpname()
os.remove(tmp)
os.execute('mkdir -p ' .. tmp)

local function read(path)
  local f = io.open(path, 'rb')
  if not f then return nil end
  local s = f:read('*a')
  f:close()
  return s
end

local function sum_breakdown(b)
  local s = 0
  for _, v in pairs(b) do s = s + v end
  return s
end

local function spin(seconds)
  local t0 = em.clock()
  while em.clock() - t0 < seconds do end
end

H.test('an input-bound loop: a slow map and no workers', function()
  local x, y = em.randn(48, 8), em.randn(48, 2)
  local ds = em.data.tensors(x, y):map(function(a, b)
    local t0 = em.clock()
    while em.clock() - t0 < 0.002 do end       -- heavy per-sample work
    return a, b
  end):batch(4)
  local lin = em.nn.Linear(8, 2)
  local loader = ds:loader { workers = 0 }
  em.profile.start {}
  local n = 0
  for xb, yb in loader:epoch() do
    em.nn.functional.mse_loss(lin(xb), yb):backward()
    em.profile.step()
    n = n + 1
  end
  local r = em.profile.stop()
  H.eq(r.steps, n)
  H.eq(n, 12)
  H.eq(r.diagnosis[1].kind, 'input-bound')
  H.check(r.diagnosis[1].message:find('no workers'), r.diagnosis[1].message)
  H.check(r.breakdown.input > 0.6, 'input share ' .. r.breakdown.input)
  H.close(sum_breakdown(r.breakdown), 1, 1e-9)
  H.check(r.step_s >= 4 * 0.002, 'four samples of 2 ms each at least: ' .. r.step_s)
end)

H.test('thousands of tiny ops per step: launch-bound', function()
  local a, b = em.ones(4), em.ones(4)
  em.profile.start {}
  for _ = 1, 5 do
    local c = a
    for _ = 1, 2000 do c = c + b end
    em.profile.step()
  end
  local r = em.profile.stop()
  H.eq(r.steps, 5)
  H.eq(r.ops_per_step, 2000)                 -- exact: one dispatch per add
  H.eq(r.top_ops[1].name, 'add')
  H.eq(r.top_ops[1].calls, 10000)
  local kinds = {}
  for _, d in ipairs(r.diagnosis) do kinds[d.kind] = d.message end
  H.check(kinds['launch-bound'], 'diagnosis: ' .. r.diagnosis[1].kind)
  H.check(kinds['launch-bound'] and kinds['launch-bound']:find('2000 ops'), kinds['launch-bound'])
  H.check(not kinds['input-bound'])
  H.close(sum_breakdown(r.breakdown), 1, 1e-9)
end)

H.test('a compute-bound step: large matmuls are neither input- nor launch-bound', function()
  local a = em.randn(384, 384)
  em.profile.start {}
  for _ = 1, 4 do
    for _ = 1, 6 do em.matmul(a, a) end
    em.profile.step()
  end
  local r = em.profile.stop()
  H.eq(r.diagnosis[1].kind, 'balanced')
  H.eq(#r.diagnosis, 1)
  H.check(r.breakdown.compute > 0.8, 'compute share ' .. r.breakdown.compute)
  H.eq(r.top_ops[1].name, 'matmul')
  H.eq(r.top_ops[1].calls, 24)
  H.check(r.diagnosis[1].message:find('compute'))
end)

H.test('backward nodes, ranges, optimizer steps and gradient bytes are recorded', function()
  local lin = em.nn.Linear(16, 4)
  local opt = em.optim.SGD(lin:parameters(), { lr = 0.1 })
  local x = em.randn(8, 16)
  local tr = tmp .. '/unit.json'
  em.profile.start { trace = tr }
  for _ = 1, 3 do
    opt:zero_grad()
    local y = em.profile.range('forward', function(v) return lin(v):sum() end, x)
    y:backward()
    opt:step()
    em.profile.step()
  end
  local r = em.profile.stop()
  H.eq(r.trace, tr)
  local doc = decode(read(tr), 64)
  local names, cats, tids = {}, {}, {}
  for _, e in ipairs(doc.traceEvents) do
    names[e.name] = (names[e.name] or 0) + 1
    if e.cat then cats[e.cat] = true end
    if e.ph == 'X' then
      H.check(type(e.ts) == 'number' and type(e.dur) == 'number' and e.dur >= 0 and
              type(e.pid) == 'number' and type(e.tid) == 'number', 'complete event fields')
    end
  end
  H.eq(names.forward, 3)
  H.check(cats.backward, 'backward nodes in the trace')
  H.check(cats.optimizer, 'optimizer steps in the trace')
  H.check(cats.op, 'ops in the trace')
  H.eq(names.step, 3)
  -- gradient bytes per step: weight 16x4 + bias 4, float32
  H.eq(r.projection.grad_bytes, (16 * 4 + 4) * 4)
  H.check(r.peak_bytes.cpu > 0)
  -- the ranges' results come back and errors pass through
  em.profile.start {}
  local p, q = em.profile.range('two', function() return 1, 2 end)
  H.eq(p, 1); H.eq(q, 2)
  H.raises(function() em.profile.range('bad', function() error('boom') end) end, 'boom')
  em.profile.stop()
end)

H.test('misuse gets clear errors', function()
  H.raises(function() em.profile.stop() end, 'not recording')
  em.profile.start {}
  H.raises(function() em.profile.start {} end, 'already recording')
  em.profile.stop()
  H.raises(function() em.profile.start { tracefile = 'x' } end, "unknown option 'tracefile'")
  H.raises(function() em.profile.start { trace = 5 } end, 'must be a file path')
  H.raises(function() em.profile.range(5, print) end, 'name must be a string')
  H.raises(function() em.profile.project { replicas = 2.5 } end, 'whole numbers')
end)

H.test('the projection: more replicas cost communication, overlap hides some', function()
  local r = em.profile.project { replicas = { 1, 2, 8 }, gbps = 10 }
  H.eq(#r.rows, 3)
  H.close(r.rows[1].efficiency, 1, 1e-12)           -- one replica: nothing to exchange
  H.check(r.rows[3].step_s_no_overlap >= r.rows[2].step_s_no_overlap)
  H.check(r.rows[3].step_s <= r.rows[3].step_s_no_overlap)
  H.eq(r.measured, false)
  local one = em.profile.project { replicas = 8, gbps = 370 }
  H.eq(one.replicas, 8)
  H.check(one.efficiency > 0 and one.efficiency <= 1)
end)

-- -- Replicas -------------------------------------------------------------------------------
-- EMBER_TEST_NO_MPI: the ThreadSanitizer pass (Open MPI is not instrumented).
local no_mpi = os.getenv('EMBER_TEST_NO_MPI')
local have_mpirun = not no_mpi and os.execute('command -v mpirun >/dev/null 2>&1') == 0
local MPIRUN = 'OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 timeout 120 mpirun ' ..
  '-x EMBER_TEST_COMM_GBPS --oversubscribe --bind-to none --mca btl self,vader,tcp ' ..
  '--mca btl_tcp_if_include lo --mca oob_tcp_if_include lo -np 2 '

-- launcher: nil for `ember --replicas 2`, 'mpi' for mpirun -np 2.
local function run_replicas(mode, env, launcher)
  local out = tmp .. '/' .. mode .. (launcher or '')
  os.execute('mkdir -p ' .. out)
  local cmd = launcher == 'mpi'
    and ('EMBER_TEST_COMM_GBPS=%s %s %s %sdist/profile_replicas.lua %s %s 2>&1; echo "exit=$?"')
      :format(env and env:match('=(.*)') or '', MPIRUN, ember, dir, mode, out)
    or ('%s %s --replicas 2 %sdist/profile_replicas.lua %s %s 2>&1; echo "exit=$?"')
      :format(env or '', ember, dir, mode, out)
  local p = io.popen(cmd)
  local text = p:read('*a')
  p:close()
  local f = {}
  for k, v in text:gmatch('([%w]+)=([^\n]*)') do f[k] = v end
  return f, text, out
end

H.test('2 replicas, one slower: replica-skew names it', function()
  local f, text, out = run_replicas('skew')
  H.eq(f.exit, '0', text)
  H.eq(f.REPLICAS, '2', text)
  H.eq(f.KIND, 'replica-skew', text)
  H.check(f.MSG and f.MSG:find('Replica 1 is slower'), f.MSG)
  local w0 = tonumber((f.REP0 or ''):match(' (%S+)$'))
  local w1 = tonumber((f.REP1 or ''):match(' (%S+)$'))
  H.check(w0 and w1 and w0 > 0.015 and w0 > 5 * w1, 'replica 0 waits for replica 1: ' ..
    tostring(f.REP0) .. ' / ' .. tostring(f.REP1))
  -- the joined trace: both replicas, their comm threads, flow arrows
  local doc = decode(read(out .. '/trace.json'), 64)
  local pids, flows, colls = {}, { s = 0, f = 0 }, 0
  for _, e in ipairs(doc.traceEvents) do
    pids[e.pid] = true
    if e.ph == 's' or e.ph == 'f' then flows[e.ph] = flows[e.ph] + 1 end
    if e.cat == 'collective' then colls = colls + 1 end
  end
  H.check(pids[0] and pids[1], 'a process per replica')
  H.check(flows.s > 0 and flows.s == flows.f, 'flow arrows from buckets to allreduces')
  -- each arrow leaves a bucket's launch slice and lands on its allreduce, later
  local starts, bound = {}, 0
  for _, e in ipairs(doc.traceEvents) do if e.ph == 's' then starts[e.id] = e end end
  for _, e in ipairs(doc.traceEvents) do
    if e.ph == 'f' then
      local st = starts[e.id]
      local from, to = false, false
      for _, x in ipairs(doc.traceEvents) do
        if x.ph == 'X' and st and x.pid == st.pid and x.tid == st.tid and x.cat == 'bucket' and
           x.ts <= st.ts and st.ts <= x.ts + x.dur then from = true end
        if x.ph == 'X' and x.pid == e.pid and x.tid == e.tid and x.cat == 'collective' and
           x.ts == e.ts then to = true end
      end
      if st and from and to and e.ts >= st.ts and st.pid == e.pid then bound = bound + 1 end
    end
  end
  H.eq(bound, flows.f, 'every arrow bound at both ends, in time order')
  H.check(colls >= 20, 'collectives of both replicas: ' .. colls)
  local html = read(out .. '/page.html')
  H.check(html and html:find('Replica 1 is slower', 1, true), 'the page shows the diagnosis')
end)

H.test('2 replicas on a slow link: communication-bound', function()
  local f, text = run_replicas('comm', 'EMBER_TEST_COMM_GBPS=0.25')
  H.eq(f.exit, '0', text)
  H.eq(f.KIND, 'communication-bound', text)
  H.check(f.MSG and f.MSG:find('GB/s'), f.MSG)
  H.eq(f.MEASURED, 'true')
  -- the calibration allreduce measured the cap: 0.25 Gbit/s = 0.031 GB/s of bus
  -- bandwidth (which counts 2(n-1)/n = 1 of the bytes for 2 replicas). The cap is low
  -- enough that communication dominates even a sanitizer build's slow steps.
  local gbps = tonumber(f.GBPS)
  H.check(gbps and gbps > 0.003 and gbps < 0.05, 'measured ' .. tostring(f.GBPS))  -- never above the cap
end)

H.test('under mpirun: skew told from slow communication without arrival times', function()
  if not have_mpirun then
    H.skip(no_mpi and ('mpirun runs skipped: ' .. no_mpi) or 'mpirun not found (Debian: openmpi-bin)')
    return
  end
  local f, text = run_replicas('skew', nil, 'mpi')
  H.eq(f.exit, '0', text)
  H.eq(f.KIND, 'replica-skew', text)
  H.check(f.MSG and f.MSG:find('Replica 1 is slower'), f.MSG)
  local w0 = tonumber((f.REP0 or ''):match(' (%S+)$'))
  H.check(w0 and w0 > 0.015, 'replica 0 waits for replica 1 (estimated): ' .. tostring(f.REP0))
  f, text = run_replicas('comm', 'EMBER_TEST_COMM_GBPS=0.25', 'mpi')
  H.eq(f.exit, '0', text)
  H.eq(f.KIND, 'communication-bound', text)
end)

-- -- ember --profile ------------------------------------------------------------------------
H.test('ember --profile runs a script and writes the report, trace and page', function()
  local work = tmp .. '/cli'
  os.execute('mkdir -p ' .. work)
  local script = work .. '/train.lua'
  local f = io.open(script, 'w')
  f:write([[
local em = require 'ember'
local x, y = em.randn(64, 8), em.randn(64, 1)
local lin = em.nn.Linear(8, 1)
local opt = em.optim.SGD(lin:parameters(), { lr = 0.01 })
for xb, yb in em.data.tensors(x, y):batch(8):loader { workers = 1 }:epoch() do
  opt:zero_grad()
  em.nn.functional.mse_loss(lin(xb), yb):backward()
  opt:step()
end
]])
  f:close()
  local p = io.popen(('cd %s && %s --profile train.lua 2>&1; echo "exit=$?"'):format(work, ember))
  local text = p:read('*a')
  p:close()
  H.check(text:find('exit=0'), text)
  H.check(text:find('ember profile: 7 steps'), text)   -- 8 batches: the first starts step 1
  H.check(text:find('diagnosis:'), text)
  H.check(read(work .. '/ember-trace.json'), 'trace written')
  H.check(read(work .. '/ember-profile.html'), 'page written')
  local ok = pcall(decode, read(work .. '/ember-trace.json') or '', 64)
  H.check(ok, 'the trace is valid JSON')
end)

os.execute('rm -rf ' .. tmp)
H.done()

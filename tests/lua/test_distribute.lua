--[[
test_distribute.lua -- em.distribute: the mirrored strategy on 1 to 4 replicas.

In this process (one replica): the strategy's fields, collectives of a world of
one, and the error messages. Through `ember --replicas N` (threads joined by the
local communicator), running the scripts of tests/lua/dist/: every collective
for every dtype on 1-4 replicas; wrapped training on N replicas against one
replica on the global batch (SGD with momentum and Adam, several buckets per
step), bit-identical across runs; no_sync, find_unused, buffers; and failure:
an error in one replica and a replica that hangs each end the run with the
message, within the timeout, with a non-zero exit status.
]]
local dir = (arg and arg[0] and arg[0]:match('^(.*/)')) or
            ((os.getenv('EMBER_TESTS') or 'tests') .. '/lua/')
local H = dofile(dir .. 'harness.lua')
local em = require 'ember'
local ember = arg[-1] or 'ember'

local L = dofile(dir .. 'dist/launch.lua')(dir, ember)
local replicas, mpirun, have_mpirun, no_mpirun_why = L.replicas, L.mpirun, L.have_mpirun,
  L.no_mpirun_why

H.test('a plain script is one replica', function()
  local s = em.distribute.mirrored{}
  H.eq(s.rank, 0)
  H.eq(s.world_size, 1)
  H.eq(s.device, 'cpu')
  H.check(s:is_main())
  H.eq(s.backend, 'local')
  local t = em.tensor({ 1.5, 2, 3 })
  H.eq(s:allreduce(t, 'mean'):totable(), { 1.5, 2, 3 })
  H.eq(s:allgather(em.tensor({ { 1, 2 } })):totable(), { { 1, 2 } })
  H.eq(s:reduce_scatter(em.tensor({ 4, 5 })):totable(), { 4, 5 })
  H.eq(s:broadcast(em.tensor({ 7 })):totable(), { 7 })
  s:barrier()
  local w = s:allreduce(em.ones(3), 'max', { async = true })
  H.eq(w:wait():totable(), { 1, 1, 1 })
  H.check(w:done())
  H.eq(#s:shard(em.data.synthetic{ shape = { 2 }, size = 10 }), 10)
  H.check(em.distribute.mirrored{}.world_size == 1, 'a second strategy shares the communicator')
end)

H.test('errors name the op and the problem', function()
  local s = em.distribute.mirrored{}
  H.raises(function() s:allreduce(em.ones(2), 'avg') end, "unknown reduction 'avg'")
  H.raises(function() s:allreduce(em.ones(2):int(), 'mean') end, "'mean' needs a floating dtype", 'int32')
  H.raises(function() s:allreduce(em.ones(2):byte()) end, 'dtype uint8 is not supported')
  H.raises(function() s:allreduce({}) end, 'allreduce')
  H.raises(function() s:broadcast(em.ones(2), 3) end, 'root 3 is not a rank')
  H.raises(function() em.distribute.mirrored{ backend = 'gloo' } end, "unknown backend 'gloo'")
  H.raises(function() em.distribute.mirrored{ backend = 'nccl' } end, 'needs GPU replicas')
  H.raises(function() em.distribute.mirrored{ timeot = 3 } end, "unknown option 'timeot'")
  H.raises(function() em.distribute.mirrored{ timeout = -1 } end, 'timeout must be')
  H.raises(function() s:wrap(em.nn.Linear(2, 2), { bucket_mb = 0 }) end, 'bucket_mb must be')
  H.raises(function() s:wrap(em.nn.Linear(2, 2), { buckets = 2 }) end, "unknown option 'buckets'")
  H.raises(function() s:wrap(42) end, 'expected an em.nn.Module')
end)

H.test('wrap on one replica: gradients untouched, unused parameters named', function()
  local s = em.distribute.mirrored{}
  em.manual_seed(1)
  local m = em.nn.Linear(3, 2)
  local dm = s:wrap(m)
  H.check(dm.module == m)
  H.eq(#dm:parameters(), 2)
  local x = em.randn(4, 3)
  dm(x):sum():backward()
  local g1 = m.weight.grad:clone()
  m:zero_grad()
  m(x):sum():backward()
  H.eq(m.weight.grad:totable(), g1:totable())
  local Net = em.nn.Module:extend('TwoHeads')
  function Net:init() self.a = em.nn.Linear(2, 2); self.b = em.nn.Linear(2, 2) end
  function Net:forward(x) return self.a(x) end
  local d2 = s:wrap(Net())
  H.raises(function() d2(em.ones(1, 2)):sum():backward() end, 'b.weight, b.bias', 'find_unused')
  local d3 = s:wrap(Net(), { find_unused = true })
  d3(em.ones(1, 2)):sum():backward()
  H.check(d3.module.a.weight.grad ~= nil)
end)

H.test('every collective, every dtype, 1 to 4 replicas', function()
  for n = 1, 4 do
    local out, rc = replicas(n, 'collectives.lua')
    H.eq(rc, 0, 'exit status with ' .. n .. ' replicas')
    local ranks = 0
    for r, p, f in out:gmatch('rank (%d+) checks (%d+) failed (%d+)') do
      ranks = ranks + 1
      H.check(tonumber(p) > 100 and tonumber(f) == 0, ('replica %s of %d: %s passed, %s failed'):format(r, n, p, f))
    end
    H.eq(ranks, n, 'every replica reported')
    for line in out:gmatch('FAILED[^\n]*') do H.check(false, line) end
  end
end)

-- {optimizer, replicas}
local EQUIV = {}
for _, opt in ipairs({ 'sgd', 'adam' }) do
  for n = 2, 4 do EQUIV[#EQUIV + 1] = { opt, n } end
end
H.test('N replicas train as one replica on the global batch', function()
  for _, c in ipairs(H.tsan_pick(EQUIV, { 3, 5 })) do
    local opt, n = unpack(c)
    local out, rc = replicas(n, 'equivalence.lua', opt .. ' 4 0.002')
    H.eq(rc, 0, opt .. ' on ' .. n .. ' replicas exits 0')
    local sums, count = {}, 0
    for r, b, d, c, agree in out:gmatch('rank (%d+) buckets (%d+) maxdiff (%S+) checksum (%S+) replicas_agree (%a+)') do
      count = count + 1
      H.check(tonumber(b) >= 3, 'several buckets per step: ' .. b)
      H.check(tonumber(d) < 1e-5, ('%s, %d replicas, replica %s: max difference %s'):format(opt, n, r, d))
      H.eq(agree, 'true', 'check_replicas')
      sums[#sums + 1] = c
    end
    H.eq(count, n)
    for i = 2, #sums do H.eq(sums[i], sums[1], 'replicas hold the same parameters') end
    if n == 3 then      -- a second run gives the same bits
      local again = replicas(n, 'equivalence.lua', opt .. ' 4 0.002')
      H.eq(again:match('checksum (%S+)'), sums[1], opt .. ': identical across runs')
    end
  end
end)

H.test('no_sync, find_unused and buffers across replicas', function()
  local out, rc = replicas(3, 'cases.lua', 'nosync')
  H.eq(rc, 0)
  local k = 0
  for d, differs in out:gmatch('nosync maxdiff (%S+) local_differs (%a+)') do
    k = k + 1
    H.check(tonumber(d) < 1e-5, 'accumulated with no_sync = global batch: ' .. d)
    H.eq(differs, 'true', 'no_sync kept the local gradient')
  end
  H.eq(k, 3)
  out, rc = replicas(3, 'cases.lua', 'unused_ok')
  H.eq(rc, 0)
  k = 0
  for got, want in out:gmatch('spare grad (%S+) want (%S+)') do
    k = k + 1
    H.close(tonumber(got), tonumber(want), 1e-5)
  end
  H.eq(k, 3)
  out, rc = replicas(2, 'cases.lua', 'unused')
  H.eq(rc, 1)
  H.check(out:find('spare.weight, spare.bias', 1, true), 'the unused parameters are named')
  H.check(out:find('replica 0 failed', 1, true), 'the other replica hears of it')
  out, rc = replicas(3, 'cases.lua', 'buffers')
  H.eq(rc, 0)
  k = 0
  for a, b, c in out:gmatch('params_agree (%a+) buffers_differ (%a+) after_broadcast (%a+)') do
    k = k + 1
    H.eq({ a, b, c }, { 'true', 'true', 'true' })
  end
  H.eq(k, 3)
end)

H.test('output of replicas > 0 carries [rank k]', function()
  local out, rc = replicas(2, 'cases.lua', 'nosync')
  H.eq(rc, 0)
  H.check(out:find('\n%[rank 1%] nosync') or out:find('^%[rank 1%] nosync'), 'prefixed line')
  H.check(out:find('\nnosync') or out:find('^nosync'), 'rank 0 is not prefixed')
end)

H.test('a failing replica ends the run with its message', function()
  local out, rc, secs = replicas(3, 'cases.lua', 'error')
  H.eq(rc, 1, 'exit status')
  H.check(secs < 20, 'ended promptly: ' .. secs .. ' s')
  H.check(out:find('ember: replica 1 failed: [^\n]*boom in replica one'), 'the summary names replica 1')
  local told = select(2, out:gsub('replica 1 failed: [^\n]*boom', ''))
  H.check(told >= 3, 'the other replicas failed with the message too')
  H.check(not out:find('not reached', 1, true), 'no replica went on')
end)

H.test('a hanging replica is reported after the timeout', function()
  local out, rc, secs = replicas(3, 'cases.lua', 'hang', 'EMBER_REPLICA_GRACE=2')
  H.eq(rc, 1, 'exit status')
  H.check(secs < 15, 'ended within timeout + grace: ' .. secs .. ' s')
  H.check(out:find('timed out after 2 s: replica 1 %(at collective #1%) did not arrive'),
    'names the replica and the collective')
  H.check(out:find('replica 1 did not stop', 1, true), 'the stuck replica is named at exit')
end)

H.test('under mpirun: collectives, training equivalence, a failing process', function()
  if not have_mpirun() then H.skip(no_mpirun_why) return end
  local out, rc = mpirun(3, 'collectives.lua')
  H.eq(rc, 0, 'collectives exit status')
  local ranks = 0
  for _, p, f in out:gmatch('rank (%d+) checks (%d+) failed (%d+)') do
    ranks = ranks + 1
    H.check(tonumber(p) > 100 and f == '0', 'checks ' .. p .. ' failed ' .. f)
  end
  H.eq(ranks, 3)
  out, rc = mpirun(2, 'equivalence.lua', 'adam 4 0.002')
  H.eq(rc, 0, 'equivalence exit status')
  local k = 0
  for d, agree in out:gmatch('maxdiff (%S+) checksum %S+ replicas_agree (%a+)') do
    k = k + 1
    H.check(tonumber(d) < 1e-5, 'max difference ' .. d)
    H.eq(agree, 'true')
  end
  H.eq(k, 2)
  local secs
  out, rc, secs = mpirun(3, 'cases.lua', 'error')
  H.check(rc ~= 0, 'the job exits non-zero')
  H.check(secs < 60, 'and ends: ' .. secs .. ' s')
  H.check(out:find('replica 1 failed: [^\n]*boom in replica one'), 'the others hear of it')
  H.check(not out:find('not reached', 1, true), 'no process went on')
end)

-- The example trains under all three launches (a small slice of the data).
local function fashion_mnist_here()
  local f = io.open('/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz') or
    io.open((os.getenv('EMBER_DATA') or '/nonexistent') .. '/train-images-idx3-ubyte.gz')
  if f then f:close() return true end
end
H.test('examples/fashion_mnist.lua on 1 and 2 replicas, and --resume', function()
  if not fashion_mnist_here() then H.skip('Fashion-MNIST not installed (make deps-run)') return end
  local example = dir .. '../../examples/fashion_mnist.lua'
  local ckpt = os.tmpname()
  -- (under ThreadSanitizer a quarter of the samples: the same code, fewer steps)
  local args = (' --epochs 1 --limit %d --batch 64 --checkpoint '):format(H.tsan() and 256 or 1024)
    .. ckpt
  local function run(prefix, extra)
    local p = io.popen(prefix .. ' ' .. example .. args .. (extra or '') .. ' 2>&1; echo "exit=$?"')
    local out = p:read('*a')
    p:close()
    return out, tonumber(out:match('exit=(%d+)%s*$'))
  end
  local out, rc = run(ember)
  H.eq(rc, 0, out)
  H.check(out:find('test accuracy: %d+%.%d%d%%'), 'one replica prints its accuracy')
  out, rc = run(ember .. ' --replicas 2')
  H.eq(rc, 0, out)
  H.eq(select(2, out:gsub('test accuracy:', '')), 1, 'only replica 0 evaluates')
  H.check(out:find('replica 0 of 2'), 'the strategy is shown')
  H.check(not out:find('%[rank 1%] epoch'), 'replica 1 prints no epoch lines')
  out, rc = run(ember .. ' --replicas 2', ' --resume --epochs 2')
  H.eq(rc, 0, out)
  H.check(out:find('resumed from .* after epoch 1'), 'resumed')
  H.check(out:find('epoch 2/2'), 'went on with epoch 2')
  if have_mpirun() then
    out, rc = run(('OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 timeout 120 ' ..
      'mpirun --oversubscribe --bind-to none -np 2 %s'):format(ember))
    H.eq(rc, 0, out)
    H.eq(select(2, out:gsub('test accuracy:', '')), 1, 'mpirun: only replica 0 evaluates')
    H.check(out:find('replica 0 of 2 %(mpi'), 'mpirun: the mpi backend')
  else
    H.skip(no_mpirun_why)
  end
  os.remove(ckpt)
end)

H.done()

--[[
test_cuda_distribute.lua -- em.distribute with GPU replicas on emulated devices
(EMBER_CUDA_EMULATE=2:64): `ember --replicas N --devices cuda:0,cuda:1` puts replica
k on cuda:(k mod 2), 'auto' picks the nccl communicator (here the local group or
MPI standing in for NCCL, device buffers staged through host memory in the order
NCCL would see them). A representative part of test_distribute.lua runs again
on GPU replicas: wrapped training equals one replica on the global batch
(tests/lua/dist/gpu.lua: Linear/ReLU, a hand-written MSE and SGD with momentum,
so that it needs none of the cuDNN, loss and fused-optimizer kernels still being
written), unused parameters, and failure -- a replica that errors or stops never
hangs the others, who fail within the timeout naming it. Under mpirun: one
emulated GPU per process from --devices and the local rank. Either way each
replica opens its own GPU and no other.
]]
local dir = (arg and arg[0] and arg[0]:match('^(.*/)')) or
            ((os.getenv('EMBER_TESTS') or 'tests') .. '/lua/')
local H, em = dofile(dir .. 'cuda_emulated.lua')('2:64')
local ember = arg[-1] or 'ember'
local DEV = '--devices cuda:0,cuda:1'

local function sh(cmd)
  local t0 = em.clock()
  local p = io.popen(cmd .. ' 2>&1; echo "exit=$?"')
  local out = p:read('*a')
  p:close()
  return out, tonumber(out:match('exit=(%d+)%s*$')), em.clock() - t0
end
local function replicas(n, script, args, env)
  return sh(('%s%s --replicas %d %s %s %s'):format(env and env .. ' ' or '', ember, n, DEV,
    dir .. 'dist/' .. script, args or ''))
end

H.test('GPU replicas train as one replica on the global batch', function()
  for n = 1, 3 do
    local out, rc = replicas(n, 'gpu.lua', 'equiv 3 0.0003')
    H.check(rc == 0, ('%d replicas: exit %s\n%s'):format(n, tostring(rc), out))
    local seen = 0
    for r, dev, backend, buckets, d, agree in out:gmatch(
        'rank (%d+) device (%S+) backend (%S+) buckets (%d+) maxdiff (%S+) replicas_agree (%S+)') do
      seen = seen + 1
      H.eq(dev, 'cuda:' .. (tonumber(r) % 2), 'replica k is on cuda:(k mod 2)')
      H.eq(backend, 'nccl')
      H.check(tonumber(buckets) >= 3, 'several buckets: ' .. buckets)
      H.check(tonumber(d) < 1e-5, ('%d replicas, rank %s: maxdiff %s'):format(n, r, d))
      H.eq(agree, 'true')
    end
    H.eq(seen, n, out)
  end
end)

-- The same with em.optim's fused SGD / Adam and F.mse_loss on the device.
-- The strategy's own CNN test (conv, pooling on the device) with GPU replicas.
H.test('the CNN of equivalence.lua on GPU replicas', function()
  for _, opt in ipairs { 'sgd', 'adam' } do
    local out, rc = replicas(2, 'equivalence.lua', opt .. ' 3 0.002')
    H.check(rc == 0, out)
    local seen = 0
    for d, agree in out:gmatch('maxdiff (%S+) checksum %S+ replicas_agree (%a+)') do
      seen = seen + 1
      H.check(tonumber(d) < 1e-5, opt .. ': maxdiff ' .. d)
      H.eq(agree, 'true')
    end
    H.eq(seen, 2, out)
  end
end)

H.test('GPU replicas with em.optim and F.mse_loss on the device', function()
  for _, opt in ipairs { 'sgd', 'adam' } do
    local out, rc = replicas(2, 'gpu.lua', 'equiv 3 0.0003 ' .. opt)
    H.check(rc == 0, out)
    local seen = 0
    for d in out:gmatch('maxdiff (%S+) replicas_agree true') do
      seen = seen + 1
      H.check(tonumber(d) < 1e-5, opt .. ': maxdiff ' .. d)
    end
    H.eq(seen, 2, out)
  end
end)

H.test('collectives on device tensors, and CPU tensors beside them', function()
  local f = os.tmpname()
  local fh = io.open(f, 'w')
  fh:write([[
local s = em.distribute.mirrored{ timeout = 30 }
local t = (em.ones(5) * (s.rank + 1)):to(s.device)
s:allreduce(t, 'mean')
local g = s:allgather(em.tensor({ { s.rank, 10 } }):to(s.device))
local rs = s:reduce_scatter(em.arange(0, 4):to(s.device))
local b = (em.ones(3) * s.rank):to(s.device)
s:broadcast(b, 1)
local w = s:allreduce(em.ones(2):to(s.device), 'sum', { async = true })
local c = s:allreduce(em.ones(2), 'sum')
s:barrier()
print(('rank %d %s %g %s %g %g %g %g %g'):format(s.rank, tostring(s), t:totable()[1], g.device,
  g:totable()[2][1], rs:totable()[1], b:totable()[1], w:wait():totable()[2], c:totable()[1]))
]])
  fh:close()
  local out, rc = sh(('%s --replicas 2 %s %s'):format(ember, DEV, f))
  os.remove(f)
  H.check(rc == 0, out)
  H.check(out:find('rank 0 mirrored strategy: replica 0 of 2 (nccl, cuda:0) 1.5 cuda:0 1 0 1 2 2', 1, true), out)
  H.check(out:find('rank 1 mirrored strategy: replica 1 of 2 (nccl, cuda:1) 1.5 cuda:1 1 4 1 2 2', 1, true), out)
end)

H.test('unused parameters on GPU replicas', function()
  local out, rc = replicas(2, 'cases.lua', 'unused_ok')
  H.check(rc == 0, out)
  local n = 0
  for g, want in out:gmatch('spare grad (%S+) want (%S+)') do n = n + 1; H.eq(g, want) end
  H.eq(n, 2, out)
  out, rc = replicas(2, 'cases.lua', 'unused')
  H.check(rc ~= 0 and out:find('spare.weight', 1, true) and out:find('find_unused', 1, true), out)
end)

H.test('a GPU replica that fails ends the others with its message', function()
  for _, script in ipairs { { 'cases.lua', 'error', 'boom in replica one' },
                            { 'gpu.lua', 'error', 'boom on the GPU replica' } } do
    local out, rc, secs = replicas(3, script[1], script[2])
    H.check(rc ~= 0, out)
    H.check(out:find('replica 1 failed: [^\n]*' .. script[3]), out)
    H.check(not out:find('not reached', 1, true), out)
    H.check(secs < 30, 'took ' .. secs .. ' s')
  end
end)

H.test('a GPU replica that stops is reported after the timeout, never a hang', function()
  for _, script in ipairs { { 'cases.lua', 'hang' }, { 'gpu.lua', 'hang' } } do
    local out, rc, secs = replicas(3, script[1], script[2], 'EMBER_REPLICA_GRACE=2')
    H.check(rc ~= 0, out)
    H.check(out:find('timed out after 2 s', 1, true) and out:find('replica 1 ', 1, true), out)
    H.check(secs < 30, 'took ' .. secs .. ' s')
  end
end)

H.test('--devices and EMBER_DEVICES', function()
  -- replica k takes entry k mod the count: two replicas may share a device
  local out, rc = sh(('%s --replicas 2 --devices cuda:1 -e %q'):format(ember,
    "local s = em.distribute.mirrored{} print('dev ' .. s.rank .. ' ' .. s.device .. ' ' .. s.backend)"))
  H.check(rc == 0 and out:find('dev 0 cuda:1 nccl', 1, true) and out:find('dev 1 cuda:1 nccl', 1, true), out)
  out, rc = sh(('EMBER_DEVICES=cuda:7x %s -e %q'):format(ember, "em.distribute.mirrored{}"))
  H.check(rc ~= 0 and out:find("'cuda:7x' is not a device", 1, true), out)
  out, rc = sh(('%s --devices cuda:1 -e %q'):format(ember,
    "local s = em.distribute.mirrored{} print(s.device, s.backend, s.world_size)"))
  H.check(rc == 0 and out:find('cuda:1\tnccl\t1', 1, true), out)
  out, rc = sh(('%s -e %q'):format(ember,
    "print(pcall(em.distribute.mirrored, { backend = 'nccl' }))"))
  H.check(out:find("backend 'nccl' needs GPU replicas", 1, true), out)
end)

H.test("'cuda' is the current device: the replica's own GPU", function()
  -- in this process: 'cuda', t:cuda() and :to('cuda') follow set_device
  H.eq(em.cuda.current_device(), 0)
  em.cuda.set_device(1)
  H.eq(em.zeros(2, { device = 'cuda' }).device, 'cuda:1')
  H.eq(em.ones(2):cuda().device, 'cuda:1')
  H.eq(em.ones(2):to('cuda').device, 'cuda:1')
  H.eq(em.ones(2):cuda(0).device, 'cuda:0', 'a number still names its device')
  em.cuda.set_device('cuda:0')
  H.eq(em.cuda.current_device(), 0)
  H.eq(em.zeros(2, { device = 'cuda' }).device, 'cuda:0')
  local ok, err = pcall(em.cuda.set_device, 99)
  H.check(not ok and err:find('cuda.set_device: device 99', 1, true), err)
  ok, err = pcall(em.cuda.set_device, 'cpu')
  H.check(not ok and err:find("'cpu' is not a CUDA device", 1, true), err)
  H.eq(em.cuda.current_device(), 0, 'a refused device leaves the current one')
  -- replicas: 'cuda' in a script means each replica's GPU, so an embedding's
  -- weights (moved with :to(s.device)) meet the ids the script made on 'cuda'
  local out, rc = sh(('%s --replicas 2 %s -e %q'):format(ember, DEV, table.concat({
    "local s = em.distribute.mirrored{}",
    "local emb = em.nn.Embedding(10, 4):to(s.device)",
    "local ids = em.tensor({ 1, 3 }, { dtype = 'int64', device = 'cuda' })",
    "local y = emb(ids)",
    "print(('rank %d %s %s %s %d'):format(s.rank, s.device, ids.device, y.device, em.cuda.current_device()))",
  }, '; ')))
  H.check(rc == 0 and out:find('rank 0 cuda:0 cuda:0 cuda:0 0', 1, true) and
    out:find('rank 1 cuda:1 cuda:1 cuda:1 1', 1, true), out)
end)

-- Each replica's state opens its own GPU and no other (kernels/cuda.c opens a
-- device at its first use), as threads of one process and as mpirun's processes:
-- on real GPUs every device a state opens is a CUDA
-- context, memory on that GPU and, in EXCLUSIVE_PROCESS mode, the GPU itself. The
-- emulator records the devices it would have made a context on; the replica
-- reads its record from the loaded libember_cuda.so (emk_cuda_contexts).
H.test('each GPU replica opens its own device only', function()
  local lib = (ember:match('^(.*/)') or '') .. 'libember_cuda.so'
  local f = os.tmpname()
  local fh = io.open(f, 'w')
  fh:write(([[
local ffi = require 'ffi'
ffi.cdef 'unsigned emk_cuda_contexts(void *S);'
local s = em.distribute.mirrored{ timeout = 30 }
local t = em.ones(4):to(s.device)
s:allreduce(t, 'sum')
local pinned = em.ones(8):pin_memory()
local y = (pinned:to('cuda') * 2):sum():item()
em.cuda.synchronize()
local _ = em.cuda.memory_stats(1 - s.rank), em.cuda.get_device_properties(1 - s.rank)
local mask = ffi.load(%q).emk_cuda_contexts(require('ember.ffi').S)
print(('contexts rank %%d %%s mask %%d sum %%g y %%g'):format(s.rank, s.device, mask,
  t:totable()[1], y))
]]):format(lib))
  fh:close()
  local runs = { ('%s --replicas 2 %s %s'):format(ember, DEV, f) }
  if not os.getenv('EMBER_TEST_NO_MPI') and os.execute('command -v mpirun >/dev/null 2>&1') == 0 then
    runs[2] = ('OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 timeout 120 mpirun ' ..
      '--oversubscribe --bind-to none --mca btl self,vader,tcp --mca btl_tcp_if_include lo ' ..
      '--mca oob_tcp_if_include lo -np 2 %s %s %s'):format(ember, DEV, f)   -- a process each
  end
  for _, cmd in ipairs(runs) do
    local out, rc = sh(cmd)
    H.check(rc == 0, out)
    H.check(out:find('contexts rank 0 cuda:0 mask 1 sum 2 y 16', 1, true), out)
    H.check(out:find('contexts rank 1 cuda:1 mask 2 sum 2 y 16', 1, true), out)
  end
  os.remove(f)
end)

local no_mpi = os.getenv('EMBER_TEST_NO_MPI')
H.test('under mpirun: one emulated GPU per process from its local rank', function()
  if no_mpi or os.execute('command -v mpirun >/dev/null 2>&1') ~= 0 then
    print('  (mpirun runs skipped)')
    return
  end
  local out, rc = sh(('OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 timeout 120 ' ..
    'mpirun --oversubscribe --bind-to none --mca btl self,vader,tcp --mca btl_tcp_if_include lo ' ..
    '--mca oob_tcp_if_include lo -np 2 %s %s %s equiv 3 0.0003'):format(ember, DEV, dir .. 'dist/gpu.lua'))
  H.check(rc == 0, out)
  for r = 0, 1 do
    H.check(out:find(('rank %d device cuda:%d backend nccl buckets %%d+ maxdiff [^ ]+ replicas_agree true'):format(r, r)), out)
  end
  for d in out:gmatch('maxdiff (%S+)') do H.check(tonumber(d) < 1e-5, out) end
end)

H.done()

--[[
test_cuda_nccl_emu.lua -- GPU replicas over the stand-in NCCL of emulated
devices (kernels/emu/nccl_emu.c, EMBER_NCCL_EMULATE=1 under
EMBER_CUDA_EMULATE=2:64): the nccl communicator takes its real path
(core/dist/nccl.c: one NCCL group per collective on the communicator's own
stream, sends and recvs on a second NCCL communicator, the abort at the
failure) with no host staging, the stand-in reading and writing the emulated
device memory from the stream. Checked: dist/gpu.lua trains as one replica on
the global batch and its replicas agree; the collectives of device tensors
give the host's values; two replicas on one device under 'nccl' are refused
naming the device, and 'auto' runs them as threads; and a replica that fails still ends the
others with its message (the abort goes through the stand-in).
]]
local dir = (arg and arg[0] and arg[0]:match('^(.*/)')) or
            ((os.getenv('EMBER_TESTS') or 'tests') .. '/lua/')
local H, em = dofile(dir .. 'cuda_emulated.lua')('2:64')
local ember = arg[-1] or 'ember'
local ENV = 'EMBER_NCCL_EMULATE=1'

local function sh(cmd)
  local t0 = em.clock()
  local p = io.popen(cmd .. ' 2>&1; echo "exit=$?"')
  local out = p:read('*a')
  p:close()
  return out, tonumber(out:match('exit=(%d+)%s*$')), em.clock() - t0
end

local function replicas(devices, script, args)
  return sh(('%s %s --replicas 2 --devices %s %s %s'):format(ENV, ember, devices,
    dir .. 'dist/' .. script, args or ''))
end

H.test('GPU replicas over the stand-in NCCL train as one replica on the global batch', function()
  local out, rc = replicas('cuda:0,cuda:1', 'gpu.lua', 'equiv 3 0.0003')
  H.check(rc == 0, out)
  local seen = 0
  for r, dev, backend, d, agree in out:gmatch(
      'rank (%d+) device (%S+) backend (%S+) buckets %d+ maxdiff (%S+) replicas_agree (%S+)') do
    seen = seen + 1
    H.eq(dev, 'cuda:' .. r)
    H.eq(backend, 'nccl')
    H.check(tonumber(d) < 1e-5, ('rank %s: maxdiff %s'):format(r, d))
    H.eq(agree, 'true')
  end
  H.eq(seen, 2, out)
end)

H.test('collectives and sends of device tensors over the stand-in', function()
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
local m = (em.ones(2) * s.rank):to(s.device)
s:allreduce(m, 'max')
print(('rank %d %s %g %g %g %g %g'):format(s.rank, s.backend, t:totable()[1],
  g:totable()[2][1], rs:totable()[1], b:totable()[1], m:totable()[2]))
]])
  fh:close()
  local out, rc = sh(('%s %s --replicas 2 --devices cuda:0,cuda:1 %s'):format(ENV, ember, f))
  os.remove(f)
  H.check(rc == 0, out)
  H.check(out:find('rank 0 nccl 1.5 1 0 1 1', 1, true), out)
  H.check(out:find('rank 1 nccl 1.5 1 4 1 1', 1, true), out)
end)

-- As on real GPUs: 'nccl' with a device twice is refused before NCCL sees it
-- (NCCL's own duplicate-GPU error is test_nccl_emu.c's), and 'auto' takes the
-- threads, staged through host memory.
H.test("two replicas on one device: 'nccl' refused naming it, 'auto' takes threads", function()
  local out, rc, secs = sh(('%s EMBER_DIST_BACKEND=nccl %s --replicas 2 --devices cuda:0,cuda:0 %s')
    :format(ENV, ember, dir .. 'dist/gpu.lua equiv 1 0.0003'))
  H.check(rc ~= 0, out)
  H.check(out:find('NCCL refuses two replicas on one GPU (cuda:0 twice)', 1, true), out)
  H.check(secs < 30, 'took ' .. secs .. ' s')
  out, rc = replicas('cuda:0,cuda:0', 'gpu.lua', 'equiv 3 0.0003')
  H.check(rc == 0, out)
  local seen = 0
  local pattern = 'device (%S+) backend (%S+) buckets %d+ maxdiff %S+ replicas_agree (%S+)'
  for dev, backend, agree in out:gmatch(pattern) do
    seen = seen + 1
    H.eq({ dev, backend, agree }, { 'cuda:0', 'local', 'true' })
  end
  H.eq(seen, 2, out)
end)

H.test('a replica that fails ends the other with its message', function()
  local out, rc, secs = replicas('cuda:0,cuda:1', 'gpu.lua', 'error')
  H.check(rc ~= 0, out)
  H.check(out:find('replica 1 failed: [^\n]*boom on the GPU replica'), out)
  H.check(secs < 30, 'took ' .. secs .. ' s')
end)

H.done()

--[[
test_cuda_shared_gpu.lua -- several GPU replicas on one GPU: `ember --replicas 2
--devices cuda:0,cuda:0`. NCCL refuses two ranks on one device, so there the
replicas average through the host communicator ('local': threads), each device
buffer staged through pinned host memory on the device's communication stream
(core/dist/staged.c). Checked: the backend 'auto' and an explicit 'nccl' pick
(a shared real GPU takes the host communicator; 'nccl' is refused, naming the
device); the strategy keeps its replicas on the GPU with a communicator that is
not device-native; and each layout equals one replica on the global batch --
the CNN of dist/equivalence.lua wrapped (buckets averaged during backward), a
sharded wrap (gradients), groups of such replicas, a 2-stage 1F1B pipeline
whose wire asks the communicator how tensors travel, and (under mpirun) two
processes on one GPU over 'mpi'.

On the emulator (the header below) the replicas name backend = 'local'
(EMBER_DIST_BACKEND), since 'auto' keeps the emulated 'nccl', which may share a
device; with EMBER_TEST_REAL_CUDA (tests/bench/gpu_run.sh on a single-GPU
machine) the same runs leave the choice to 'auto', on real streams.
]]
local dir = (arg and arg[0] and arg[0]:match('^(.*/)')) or
            ((os.getenv('EMBER_TESTS') or 'tests') .. '/lua/')
local H, em = dofile(dir .. 'cuda_emulated.lua')('2:64')
local ember = arg[-1] or 'ember'
local L = dofile(dir .. 'dist/launch.lua')(dir, ember)
local real = os.getenv('EMBER_TEST_REAL_CUDA') ~= nil
-- real GPUs: 'auto' must find the shared device itself; the emulator names 'local'
local ENV = real and 'EMBER_DIST_BACKEND=' or 'EMBER_DIST_BACKEND=local'
local DEV = '--devices cuda:0,cuda:0'
-- the replicas' sums differ from one replica's in float rounding only; cuDNN and
-- cuBLAS on a real GPU pick their own orders
local TOL = real and 1e-4 or 1e-5

local function shared(n, script, args)
  return L.run(('%s %s --replicas %d %s %s %s'):format(ENV, ember, n, DEV,
    script:match('^%-e') and script or dir .. 'dist/' .. script, args or ''))
end
-- lines of out that carry `rank R <key>`
local function rows(out, key)
  local list = {}
  for line in out:gmatch('[^\n]+') do
    if line:match('rank %d+ ' .. key) then list[#list + 1] = line end
  end
  return list
end

H.test("the backend: 'auto' leaves a shared real GPU to the host, 'nccl' is refused", function()
  local choose = em.distribute._choose_backend
  H.eq(choose('auto', 'cuda:0', 'cuda:0', true), 'local', 'a shared real GPU')
  H.eq(choose('auto', 'cuda:0', nil, true), 'nccl', 'one replica per GPU')
  H.eq(choose('auto', 'cuda:0', 'cuda:0', false), 'nccl', 'emulated devices share under nccl')
  H.eq(choose('auto', 'cpu', nil, true), 'local', 'CPU replicas')
  H.eq(choose('local', 'cuda:0', 'cuda:0', true), 'local')
  H.raises(function() choose('nccl', 'cuda:0', 'cuda:0', true) end,
    "NCCL refuses two replicas on one GPU (cuda:0 twice); use backend = 'local'")
  H.eq(choose('nccl', 'cuda:1', nil, true), 'nccl')
  if real then   -- the whole way, on this machine's one GPU
    local out = L.run(('%s --replicas 2 %s -e %q'):format(ember, DEV,
      "print(pcall(em.distribute.mirrored, { backend = 'nccl' }))"))
    H.check(out:find("NCCL refuses two replicas on one GPU (cuda:0 twice); use backend = 'local'",
      1, true), out)
  end
end)

H.test('the replicas stay on the GPU over a communicator that stages', function()
  local out, rc = shared(2, '-e', ('%q'):format(table.concat({
    "local s = em.distribute.mirrored{}",
    "local native = require('ember.ffi').C.em_comm_device_native(s._box._h)",
    "local t = em.full({ 5 }, s.rank + 1, { dtype = 'float32', device = s.device })",
    "local m = s:allreduce(t, 'mean'):to('cpu'):totable()[1]",
    "local g = s:allgather(em.full({ 1, 2 }, s.rank, { dtype = 'float32', device = 'cuda' }))",
    "print(('rank %d %s %s native %d mean %g gathered %s %s'):format(s.rank, s.backend, " ..
      "s.device, native, m, g.device, table.concat(g:to('cpu'):flatten():totable(), ',')))",
  }, ' ')))
  H.eq(rc, 0, out)
  for r = 0, 1 do
    H.check(out:find(('rank %d local cuda:0 native 0 mean 1.5 gathered cuda:0 0,0,1,1'):format(r),
      1, true), out)
  end
end)

H.test('the CNN wrapped on two replicas of one GPU equals one replica', function()
  for _, opt in ipairs({ 'sgd', 'adam' }) do
    local out, rc = shared(2, 'equivalence.lua', opt .. ' 3 0.002')
    H.eq(rc, 0, out)
    local seen = 0
    for b, d, agree in out:gmatch('buckets (%d+) maxdiff (%S+) checksum %S+ replicas_agree (%a+)') do
      seen = seen + 1
      H.check(tonumber(b) >= 2, opt .. ': several buckets, averaged during backward: ' .. b)
      H.check(tonumber(d) < TOL, opt .. ': maxdiff ' .. d)
      H.eq(agree, 'true')
    end
    H.eq(seen, 2, out)
  end
end)

H.test('sharded gradients on two replicas of one GPU equal one model', function()
  local out, rc = shared(2, 'shard_train.lua', 'train gradients adam cuda')
  H.eq(rc, 0, out)
  local lines = rows(out, 'maxdiff')
  H.eq(#lines, 2, out)
  for _, line in ipairs(lines) do
    H.check(tonumber(line:match('maxdiff (%S+)')) <= (real and TOL or 2e-6), line)
  end
end)

H.test('groups of replicas on one GPU', function()
  -- every collective and send of two groups at once, through the host
  local out, rc = shared(4, 'group.lua', 'collectives')
  H.eq(rc, 0, out)
  local lines = rows(out, 'group')
  H.eq(#lines, 4, out)
  for _, line in ipairs(lines) do
    H.check(line:find('backend group(local)', 1, true) and line:find('failed 0$'), line)
  end
  out, rc = shared(4, 'group.lua', 'train gradients')
  H.eq(rc, 0, out)
  lines = rows(out, 'maxdiff')
  H.eq(#lines, 4, out)
  for _, line in ipairs(lines) do H.check(tonumber(line:match('maxdiff (%S+)')) < TOL, line) end
end)

H.test('a 2-stage pipeline on one GPU equals one model', function()
  local out, rc = shared(2, 'pipeline.lua', 'equiv 1f1b 2 4')
  H.eq(rc, 0, out)
  local lines = rows(out, 'stage')
  H.eq(#lines, 2, out)
  for _, line in ipairs(lines) do
    H.check(line:find('device cuda:0', 1, true), 'on the GPU: ' .. line)
    for _, k in ipairs({ 'lossdiff', 'graddiff', 'maxdiff', 'forward' }) do
      local v = tonumber(line:match(k .. ' (%S+)'))
      H.check(v and v <= TOL, k .. ': ' .. line)
    end
  end
end)

H.test("under mpirun: backend 'mpi' keeps two processes on one GPU", function()
  if not L.have_mpirun() then H.skip(L.no_mpirun_why) return end
  local out, rc = L.mpirun(2, 'gpu.lua', 'equiv 3 0.0003', (real and 'EMBER_DIST_BACKEND=' or
    'EMBER_DIST_BACKEND=mpi') .. ' EMBER_DEVICES=cuda:0,cuda:0')
  H.eq(rc, 0, out)
  local lines = rows(out, 'device')
  H.eq(#lines, 2, out)
  for _, line in ipairs(lines) do
    H.check(line:find('device cuda:0 backend mpi', 1, true) and line:find('replicas_agree true', 1, true),
      line)
    H.check(tonumber(line:match('maxdiff (%S+)')) < TOL, line)
  end
end)

H.done()

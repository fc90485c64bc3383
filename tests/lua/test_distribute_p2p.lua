--[[
test_distribute_p2p.lua -- point-to-point of em.distribute (s:send, s:recv):
tests/lua/dist/p2p.lua on 2 and 3 replicas as threads (`ember --replicas N`),
as MPI processes (mpirun) and as GPU replicas on emulated devices
(EMBER_CUDA_EMULATE=2:64, `--devices cuda:0,cuda:1`: the nccl communicator,
device tensors staged through host memory): every dtype from a strided source
into contiguous and strided destinations (float32 .. int64, uint8, bool), sync
and async, a ring, a receive posted before its send; a size mismatch. A peer
that exits, errors or stays silent (never receives, never sends) fails the
others' pending recv or send with a message naming it, within the timeout, on
threads and under mpirun. In this
process (one replica): the argument errors.
]]
local dir = (arg and arg[0] and arg[0]:match('^(.*/)')) or
            ((os.getenv('EMBER_TESTS') or 'tests') .. '/lua/')
local H = dofile(dir .. 'harness.lua')
local em = require 'ember'
local ember = arg[-1] or 'ember'
local L = dofile(dir .. 'dist/launch.lua')(dir, ember)

local function pingpong_ok(out, rc, n, what, device, backend)
  H.eq(rc, 0, what .. ' exit status\n' .. out)
  local seen = 0
  for r, dev, be, p, f in out:gmatch('rank (%d+) device (%S+) backend (%S+) checks (%d+) failed (%d+)') do
    seen = seen + 1
    H.check(tonumber(p) >= 36 and f == '0', ('%s, rank %s: %s passed, %s failed'):format(what, r, p, f))
    H.eq(be, backend, what .. ' backend')
    H.check(dev:find(device, 1, true) == 1, what .. ' device ' .. dev)
  end
  H.eq(seen, n, what .. ': every replica reported\n' .. out)
  H.check(not out:find('FAILED', 1, true), what .. ': no failed check\n' .. out)
end

H.test('one replica: send and recv check their arguments', function()
  local s = em.distribute.mirrored{}
  H.raises(function() s:send(em.ones(3), 0) end, 'send: rank must be another replica of this job (0..0, this one is 0), got 0')
  H.raises(function() s:recv(em.ones(3), 1) end, 'recv: rank must be another replica')
  H.raises(function() s:send('x', 1) end, 'send: expected a tensor as argument 1, got string')
  H.raises(function() s:recv(em.ones(2), 1, 'async') end, 'recv: expected an options table')
end)

H.test('ping-pong, ring and async order on replicas (threads)', function()
  for n = 2, 3 do
    local out, rc = L.replicas(n, 'p2p.lua', 'pingpong')
    pingpong_ok(out, rc, n, n .. ' replicas', 'cpu', 'local')
  end
end)

H.test('ping-pong on GPU replicas (emulated)', function()
  for n = 2, 3 do
    local out, rc = L.replicas(n, 'p2p.lua', 'pingpong',
      'EMBER_CUDA_EMULATE=2:64 EMBER_DEVICES=cuda:0,cuda:1')
    pingpong_ok(out, rc, n, n .. ' GPU replicas', 'cuda:', 'nccl')
  end
end)

local want = {
  exit = 'recv #1 from replica 1 %(float32 x 35%): replica 1 exited',
  error = 'recv #1 from replica 1 %(float32 x 35%): replica 1 failed: [^\n]*boom in replica one',
  silent = 'recv #1 from replica 1 %(float32 x 35%) timed out after 2 s: replica 1 did not send',
  silent_send = 'send #1 to replica 1 %(int64 x 35%) timed out after 2 s: replica 1 did not ' ..
    'receive it',
}

H.test('a peer that exits, errors or is silent fails the others naming it (threads)', function()
  for _, mode in ipairs({ 'exit', 'error', 'silent', 'silent_send' }) do
    local out, rc = L.replicas(3, 'p2p.lua', mode)
    H.eq(rc, mode == 'error' and 1 or 0, mode .. ': exit status')
    for _, r in ipairs({ 0, 2 }) do
      H.check(out:find('rank ' .. r .. ' caught: [^\n]*' .. want[mode]),
        ('%s: rank %d names replica 1\n%s'):format(mode, r, out))
    end
  end
end)

local function mismatch_ok(out, what)
  for r = 0, 1 do
    H.check(out:find(('rank %d caught: [^\n]*%s #1[^\n]*: replica 0 sent float32 %%[3, 4%%] ' ..
      '%%(48 bytes%%) but replica 1 receives into float32 %%[5%%] %%(20 bytes%%)'):format(r,
      r == 0 and 'send' or 'recv')), ('%s: rank %d names both sides\n%s'):format(what, r, out))
    H.check(out:find(('rank %d then got 252'):format(r), 1, true), what .. ': the next pair goes through')
  end
end

H.test('a size mismatch fails both sides naming both (threads, GPU replicas)', function()
  local out, rc = L.replicas(2, 'p2p.lua', 'mismatch')
  H.eq(rc, 0, 'exit status\n' .. out)
  mismatch_ok(out, 'threads')
  out, rc = L.replicas(2, 'p2p.lua', 'mismatch', 'EMBER_CUDA_EMULATE=2:64 EMBER_DEVICES=cuda:0,cuda:1')
  H.eq(rc, 0, 'exit status\n' .. out)
  mismatch_ok(out, 'GPU replicas')
end)

-- The joined trace of a profiled run: each send and recv once as a collective
-- on the replica's comm thread and once as the step thread's wait, named after
-- the pair's numbering, with its bytes.
local function profile_ok(trace, what)
  local f = io.open(trace)
  local doc = f and f:read('*a') or ''
  if f then f:close() end
  local want = {
    { 0, 'send #1 to 1', 140 }, { 0, 'send #2 to 1', 140 }, { 0, 'recv #1 from 1', 280 },
    { 1, 'recv #1 from 0', 140 }, { 1, 'recv #2 from 0', 140 }, { 1, 'send #1 to 0', 280 },
  }
  for _, w in ipairs(want) do
    for _, cat in ipairs({ 'collective', 'comm-wait' }) do
      local n = 0
      for pid, bytes in doc:gmatch('"name":"' .. w[2]:gsub('#', '%%#') .. '","cat":"' ..
          cat:gsub('%-', '%%-') .. '","pid":(%d+),[^\n]-"bytes":(%d+)') do
        n = n + 1
        H.eq(tonumber(pid), w[1], what .. ': ' .. w[2] .. ' on replica ' .. w[1])
        H.eq(tonumber(bytes), w[3], what .. ': ' .. w[2] .. ' bytes')
      end
      H.eq(n, 1, ('%s: %s once as %s'):format(what, w[2], cat))
    end
  end
end

H.test('the profile shows sends and recvs as communication (threads, mpirun)', function()
  local trace = os.tmpname()
  local out, rc = L.replicas(2, 'p2p.lua', 'profile ' .. trace)
  H.eq(rc, 0, 'exit status\n' .. out)
  profile_ok(trace, 'threads')
  if L.have_mpirun() then
    os.remove(trace)
    out, rc = L.mpirun(2, 'p2p.lua', 'profile ' .. trace)
    H.eq(rc, 0, 'mpirun exit status\n' .. out)
    profile_ok(trace, 'mpirun')
  end
  os.remove(trace)
end)

H.test('mpirun: ping-pong, a size mismatch, and a peer that exits, errors or is silent', function()
  if not L.have_mpirun() then return H.skip(L.no_mpirun_why) end
  for n = 2, 3 do
    local out, rc = L.mpirun(n, 'p2p.lua', 'pingpong')
    pingpong_ok(out, rc, n, n .. ' MPI processes', 'cpu', 'mpi')
  end
  local out, rc = L.mpirun(2, 'p2p.lua', 'mismatch')
  H.eq(rc, 0, 'mismatch exit status\n' .. out)
  mismatch_ok(out, 'mpirun')
  for _, mode in ipairs({ 'exit', 'error', 'silent', 'silent_send' }) do
    local out, rc = L.mpirun(2, 'p2p.lua', mode)
    H.check((rc == 0) == (mode ~= 'error'), mode .. ': exit status ' .. tostring(rc))
    H.check(out:find('rank 0 caught: [^\n]*' .. want[mode]), mode .. ': rank 0 names replica 1\n' .. out)
  end
end)

H.done()

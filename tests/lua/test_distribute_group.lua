--[[
test_distribute_group.lua -- groups of a mirrored strategy (s:group, s:split):
tests/lua/dist/group.lua on 4 replicas, stage p of a 2 x 2 pipeline being ranks
{p, p + 2}, as threads (`ember --replicas 4`), as MPI processes (mpirun -np 4)
and as GPU replicas on emulated devices (EMBER_CUDA_EMULATE, the nccl
communicator): every collective and dtype of the group against values computed
in the script, world and group sends between the same replicas interleaved with
the group's collectives; g:wrap(model) and g:wrap(model, {shard = 'gradients'})
train equal to one model on the group's combined batch; a member that raises
fails its partner's collective naming it in both numberings. In this process
(one replica): the argument errors.
]]
local dir = (arg and arg[0] and arg[0]:match('^(.*/)')) or
            ((os.getenv('EMBER_TESTS') or 'tests') .. '/lua/')
local H = dofile(dir .. 'harness.lua')
local em = require 'ember'
local ember = arg[-1] or 'ember'
local L = dofile(dir .. 'dist/launch.lua')(dir, ember)

local GPU = 'EMBER_CUDA_EMULATE=4:64 EMBER_DEVICES=cuda:0,cuda:1,cuda:2,cuda:3'

local function collectives_ok(out, rc, what, device_backend)
  H.eq(rc, 0, what .. ' exit status\n' .. out)
  local seen = 0
  for r, gr, n, be, p, f in out:gmatch('rank (%d+) group (%d+) of (%d+) backend (%S+) checks (%d+) failed (%d+)') do
    seen = seen + 1
    H.eq(tonumber(gr), math.floor(tonumber(r) / 2), what .. ': group rank of ' .. r)
    H.eq(tonumber(n), 2, what .. ': group size')
    H.eq(be, 'group(' .. device_backend .. ')', what .. ': backend')
    H.check(tonumber(p) >= 80 and f == '0', ('%s, rank %s: %s passed, %s failed'):format(what, r, p, f))
  end
  H.eq(seen, 4, what .. ': every replica reported\n' .. out)
  H.check(not out:find('FAILED', 1, true), what .. ': no failed check\n' .. out)
end

local function train_ok(out, rc, what)
  H.eq(rc, 0, what .. ' exit status\n' .. out)
  local seen = 0
  for r, d in out:gmatch('rank (%d+) maxdiff (%S+)') do
    seen = seen + 1
    H.check(tonumber(d) < 1e-5, ('%s, rank %s: parameters differ from one model by %s'):format(what, r, d))
  end
  H.eq(seen, 4, what .. ': every replica reported\n' .. out)
end

H.test('one replica: group checks its arguments', function()
  local s = em.distribute.mirrored{}
  H.raises(function() s:group(3) end, 'group: expected a list of ranks, got number')
  H.raises(function() s:group{ 0.5 } end, 'group: ranks[1] must be a rank (0-based integer), got 0.5')
  H.raises(function() s:group{ 1 } end, 'comm_group: rank 1 (ranks[0]) is not a rank of the parent communicator (0..0)')
  H.raises(function() s:group{} end, 'comm_group: a group of 0 replicas')
  H.raises(function() s:split('a') end, 'split: color must be an integer')
  local g = s:group{ 0 }
  H.eq(g.rank, 0, 'rank')
  H.eq(g.world_size, 1, 'size')
  H.eq(g.backend, 'group(local)', 'backend')
  H.check(g.parent == s, 'parent')
  H.check(tostring(g):find('group strategy: replica 0 of 1 (ranks 0 of the parent', 1, true), tostring(g))
  H.eq(g:allreduce(em.tensor({ 1, 2 })):totable(), { 1, 2 }, 'allreduce of one')
  H.eq(g:allgather(em.tensor({ 3 })):totable(), { 3 }, 'allgather of one')
  g:barrier()
  local h = s:split(7)
  H.eq(h.world_size, 1, 'split of one')
end)

H.test('every collective of two groups at once (threads)', function()
  local out, rc = L.replicas(4, 'group.lua', 'collectives')
  collectives_ok(out, rc, 'threads', 'local')
end)

H.test('g:wrap trains equal to one model on the group batch (threads)', function()
  for _, mode in ipairs({ 'none', 'gradients', 'parameters' }) do
    local out, rc = L.replicas(4, 'group.lua', 'train ' .. mode)
    train_ok(out, rc, 'shard ' .. mode)
  end
end)

H.test('groups of GPU replicas (emulated)', function()
  local out, rc = L.replicas(4, 'group.lua', 'collectives', GPU)
  collectives_ok(out, rc, 'GPU replicas', 'nccl')
  out, rc = L.replicas(4, 'group.lua', 'train gradients', GPU)
  train_ok(out, rc, 'GPU replicas, shard gradients')
end)

H.test('a member that fails is named in both numberings (threads)', function()
  local out, rc = L.replicas(4, 'group.lua', 'error')
  H.eq(rc, 1, 'exit status\n' .. out)
  H.check(out:find('rank 1 caught: [^\n]*allreduce #1 %(float32 x 8%)[^\n]*replica 1 %(world 3%) ' ..
    'failed: [^\n]*boom in stage one'), 'rank 1 names its partner\n' .. out)
end)

H.test('mpirun: every collective, and g:wrap with shard = gradients', function()
  if not L.have_mpirun() then return H.skip(L.no_mpirun_why) end
  local out, rc = L.mpirun(4, 'group.lua', 'collectives')
  collectives_ok(out, rc, 'MPI processes', 'mpi')
  out, rc = L.mpirun(4, 'group.lua', 'train gradients')
  train_ok(out, rc, 'MPI processes, shard gradients')
end)

H.done()

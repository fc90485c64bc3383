--[[
bench_allreduce.lua -- allreduce algorithm bandwidth of em.distribute on 2
replicas: float32 tensors of 1, 4, 16 and 64 MB (MiB), summed in place.

  local   ember --replicas 2 (threads of one process, shared memory)
  mpi     mpirun -np 2 ember (2 processes, the MPI communicator)

Algorithm bandwidth = bytes of the tensor / seconds per allreduce: each
iteration starts after a barrier, the slower replica's time counts, and the
figure is the median over ITERS iterations after WARM. The PyTorch twin,
bench_allreduce.py, times torch.distributed's gloo backend (2 processes on
127.0.0.1) the same way, and prints its figure under both names, so that run.sh's
ratios are local/gloo (the target: >= 4 x) and mpi/gloo. See
dist_common.lua for the driver/worker split.
]]
local dir = debug.getinfo(1, 'S').source:sub(2):match('(.*/)')
local D = dofile(dir .. 'dist_common.lua')
local em = D.B.em

local SIZES = { 1, 4, 16, 64 }
local WARM = 3
local function iters(mb) return mb <= 4 and 30 or (mb <= 16 and 15 or 8) end

local w = D.worker_args()
if w then
  -- Worker: one replica of 2.
  local s = em.distribute.mirrored{}
  for _, mb in ipairs(SIZES) do
    local n = mb * 1024 * 1024 / 4
    local t = em.ones(n)
    for _ = 1, WARM do s:allreduce(t) end
    local ts = {}
    for i = 1, iters(mb) do
      t:fill_(1)
      s:barrier()
      local t0 = em.clock()
      s:allreduce(t)
      ts[i] = em.clock() - t0
    end
    assert(t[1] == s.world_size, 'allreduce gave a wrong sum')
    -- the slower replica's time, per iteration
    local tt = s:allreduce(em.tensor(ts, { dtype = 'float64' }), 'max'):totable()
    D.data(s, 'allreduce_' .. mb .. 'MB', mb * 1024 * 1024 / D.B.median(tt) / 1e9)
  end
  return
end

-- Driver.
local runs, why = {}, {}
for _, how in ipairs({ 'local', 'mpi' }) do
  runs[how], why[how] = D.launch(how, 2, 1)
end
local peer, peer_why = D.peer(dir .. 'bench_allreduce.py')

print(('allreduce algorithm bandwidth, 2 replicas, float32 (GB/s = 1e9 bytes/s)%s')
  :format(peer and '' or ('; gloo: n/a (' .. peer_why .. ')')))
print(('%-8s %10s %10s %10s %12s %10s'):format('size', 'local', 'mpi', 'gloo', 'local/gloo', 'mpi/gloo'))
for _, mb in ipairs(SIZES) do
  local k = 'allreduce_' .. mb .. 'MB'
  local l = runs['local'] and runs['local'][k]
  local m = runs.mpi and runs.mpi[k]
  local g = peer and peer['allreduce_local_' .. mb .. 'MB']
  print(('%-8s %10s %10s %10s %12s %10s'):format(mb .. ' MB', D.fmt(l, '%.3f'), D.fmt(m, '%.3f'),
    D.fmt(g, '%.3f'), D.fmt(l and g and l / g, '%.2f x'), D.fmt(m and g and m / g, '%.2f x')))
end
for _, how in ipairs({ 'local', 'mpi' }) do
  if not runs[how] then print(('%s: n/a (%s)'):format(how, why[how])) end
end
for _, how in ipairs({ 'local', 'mpi' }) do
  if runs[how] then
    for _, mb in ipairs(SIZES) do
      local v = runs[how]['allreduce_' .. mb .. 'MB']
      if v then
        D.B.result(('allreduce_%s_%dMB'):format(how, mb), v, 'GB/s', 'higher',
                   how == 'local' and 'ratio >= 4' or '-')
      end
    end
  else
    D.skip('allreduce_' .. how, why[how])
  end
end

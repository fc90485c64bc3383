-- sweep_groups.lua -- run by test_memory_sweep.lua as `ember --replicas 4`: a
-- pipeline of 2 stages with 2 data replicas each (its stage groups: a
-- communicator and a thread per replica) built, trained 2 steps with an async
-- collective left unwaited, and dropped, 8 times. Prints "rank R threads T2 T8
-- memory M2 M8": the process's threads and this replica's tensor memory after
-- rounds 2 and 8, which a dropped group must not raise.
local nn, F = em.nn, em.nn.F
local s = em.distribute.mirrored{ timeout = 60 }

local function threads()
  for line in io.lines('/proc/self/status') do
    local n = line:match('^Threads:%s+(%d+)')
    if n then return tonumber(n) end
  end
end
local function build()
  return nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU(),
                       nn.Linear(32, 4))
end

em.manual_seed(1)
local t, m = {}, {}
for round = 1, 8 do
  local pp = s:pipeline(build(), { stages = 2, chunks = 2, sample = em.randn(2, 16) })
  local opt = em.optim.Adam(pp:parameters(), { lr = 1e-3 })
  for _ = 1, 2 do
    local x, y = em.randn(8, 16), em.randn(8, 4)
    opt:zero_grad(); pp:step(x, y, F.mse_loss); opt:step()
  end
  local w = s:allreduce(em.randn(8), 'sum', { async = true })
  assert(w)
  pp, opt, w = nil, nil, nil
  em.collect()
  s:barrier()               -- every replica has collected: the thread count is settled
  t[round], m[round] = threads(), em.memory_stats('cpu').allocated
  s:barrier()
end
print(('rank %d threads %d %d memory %d %d'):format(s.rank, t[2], t[8], m[2], m[8]))

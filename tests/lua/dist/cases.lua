-- cases.lua -- small replica scripts run by test_distribute.lua, one per mode:
--   error      replica 1 raises an error after the first collective
--   hang       replica 1 stops answering (a busy loop), timeout 2 s
--   unused     a parameter gets no gradient (an error naming it)
--   unused_ok  the same with find_unused = true: runs, gradients still averaged
--   nosync     gradient accumulation with dm:no_sync equals one big batch
--   buffers    BatchNorm running stats are broadcast from replica 0 before forward
local mode = arg[1]
local s = em.distribute.mirrored{ timeout = mode == 'hang' and 2 or 60 }
local nn, F = em.nn, em.nn.F

if mode == 'error' or mode == 'hang' then
  local t = em.ones(4)
  s:allreduce(t)
  if s.rank == 1 then
    if mode == 'error' then error('boom in replica one') end
    dofile((arg[0]:match('^(.*/)') or './') .. 'idle.lua')(600)
  end
  s:allreduce(t)
  s:allreduce(t)
  print('not reached')
elseif mode == 'unused' or mode == 'unused_ok' then
  local Net = nn.Module:extend('Net')
  function Net:init() self.used = nn.Linear(4, 2); self.spare = nn.Linear(4, 2) end
  -- replica 0 uses only `used`; the others use both (find_unused must cope)
  function Net:forward(x)
    if s.rank == 0 then return self.used(x) end
    return self.used(x) + self.spare(x)
  end
  em.manual_seed(1)
  local dm = s:wrap(Net(), { find_unused = mode == 'unused_ok' })
  local x = (em.ones(3, 4) * (s.rank + 1)):to(s.device)   -- GPU replicas too
  dm(x):sum():backward()
  local g = dm.module.spare.weight.grad
  -- averaged: replica 0 contributes zeros, replica r>0 contributes 3*(r+1)
  local want = 0
  for r = 1, s.world_size - 1 do want = want + 3 * (r + 1) end
  want = want / s.world_size
  print(('spare grad %.6g want %.6g'):format(g[1][1], want))
elseif mode == 'nosync' then
  em.manual_seed(3)
  local model = nn.Linear(6, 3)
  local ref = nn.Linear(6, 3)
  ref:load_state_dict(model:state_dict())
  local dm = s:wrap(model)
  em.manual_seed(9)
  local x, y = em.randn(8 * s.world_size, 6), em.randn(8 * s.world_size, 3)
  -- reference: the whole global batch at once
  F.mse_loss(ref(x), y):backward()
  -- wrapped: this replica's 8 rows in two micro-batches of 4, the first without sync
  local mine = x:narrow(1, s.rank * 8 + 1, 8)
  local ys = y:narrow(1, s.rank * 8 + 1, 8)
  dm:no_sync(function()
    (F.mse_loss(dm(mine:narrow(1, 1, 4)), ys:narrow(1, 1, 4)) * 0.5):backward()
  end)
  local after_nosync = dm.module.weight.grad:clone()
  ;(F.mse_loss(dm(mine:narrow(1, 5, 4)), ys:narrow(1, 5, 4)) * 0.5):backward()
  local d = (dm.module.weight.grad - ref.weight.grad):abs():max():item()
  local local_only = (after_nosync - ref.weight.grad):abs():max():item()
  print(('nosync maxdiff %.3g local_differs %s'):format(d, tostring(local_only > 1e-6 or s.world_size == 1)))
elseif mode == 'buffers' then
  em.manual_seed(5)
  local model = nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4))
  local dm = s:wrap(model)
  for _ = 1, 3 do
    local x = em.randn(6, 4) + s.rank          -- each replica sees other data
    dm(x):sum():backward()
  end
  -- each forward started from replica 0's buffers, then updated them with local
  -- data: buffers differ now (check_replicas sees it), parameters agree
  local params_ok = s:check_replicas(dm.module[1])
  local all_ok, msg = s:check_replicas(dm)
  dm:eval()
  em.no_grad(function() dm(em.zeros(2, 4)) end)   -- broadcast again, no update in eval
  local after_ok = s:check_replicas(dm)
  print(('params_agree %s buffers_differ %s after_broadcast %s'):format(tostring(params_ok),
    tostring(s.world_size == 1 or (not all_ok and msg:find('running_mean') ~= nil)), tostring(after_ok)))
end

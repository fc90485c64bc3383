-- amp_scaler.lua -- run by test_amp.lua with `ember --replicas 2`: both replicas
-- train one wrapped Linear under a GradScaler; on step 2 only replica 1 sets one of
-- its gradients to inf after the backward. Both must skip that step (the flag is
-- allreduced), keep their weights bit for bit and halve the scale together.
local em = require 'ember'
local s = em.distribute.mirrored{}
em.manual_seed(1)
local m = em.nn.Linear(4, 2)
local dm = s:wrap(m)
local opt = em.optim.SGD(m:parameters(), { lr = 0.1 })
local sc = em.amp.GradScaler{ init_scale = 256, strategy = s }
em.manual_seed(10 + s.rank)
local x = em.randn(6, 4)
for step = 1, 3 do
  opt:zero_grad()
  local loss = dm(x):pow(2):mean()
  sc:scale(loss):backward()
  if step == 2 and s.rank == 1 then m.weight.grad:view(-1)[1] = math.huge end
  local w = m.weight:clone()
  local stepped = sc:step(opt)
  sc:update()
  local same = m.weight:eq(w):all():item()
  print(('rank %d step %d stepped=%s scale=%g unchanged=%s'):format(s.rank, step,
    tostring(stepped), sc:get_scale(), tostring(same)))
end

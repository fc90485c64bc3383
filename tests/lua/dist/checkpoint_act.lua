-- checkpoint_act.lua -- run by test_checkpoint_act.lua as `ember --replicas N`:
-- a wrapped model whose blocks are em.nn.Checkpoint, each replica fed its 1/N of
-- a global batch, against the same model without checkpointing wrapped the same
-- way (gradients must be identical: checkpointing changes no sum) and against
-- one unwrapped model on the whole batch (equal up to rounding). float64, a
-- dropout inside the checkpointed blocks (masks replayed), two steps of SGD.
-- prints, per replica: "rank R same_as_plain_wrap D vs_global G"
local s = em.distribute.mirrored{ timeout = 60 }
local nn, F = em.nn, em.nn.F

local function block(ckpt)
  local b = nn.Sequential(nn.Linear(6, 6), nn.Tanh(), nn.Dropout(0.3), nn.Linear(6, 6))
  return ckpt and nn.Checkpoint(b) or b
end
local function build(ckpt)
  em.manual_seed(3)
  return nn.Sequential(block(ckpt), nn.ReLU(), block(ckpt), nn.Linear(6, 2)):to('float64')
end

local B = 8
local per = B / s.world_size
local function batch(step)
  em.manual_seed(50 + step)
  local x, y = em.randn(B, 6):to('float64'), em.randn(B, 2):to('float64')
  local lo = s.rank * per + 1
  return x, y, x:narrow(1, lo, per), y:narrow(1, lo, per)
end
local function maxdiff(pa, pb)
  local d = 0
  for i = 1, #pa do d = math.max(d, (pa[i].grad - pb[i].grad):abs():max():item()) end
  return d
end

-- training mode, dropout on: against the plain model wrapped the same way
local dplain = s:wrap(build(false), { bucket_mb = 0.0002 })
local dck = s:wrap(build(true), { bucket_mb = 0.0002 })
local oplain = em.optim.SGD(dplain:parameters(), { lr = 0.1 })
local ock = em.optim.SGD(dck:parameters(), { lr = 0.1 })
local same = 0
for step = 1, 2 do
  local _, _, xs, ys = batch(step)
  oplain:zero_grad(); ock:zero_grad()
  local seed = 900 + step * 10 + s.rank   -- each replica draws its own masks
  em.manual_seed(seed)
  F.mse_loss(dplain(xs), ys):backward()
  em.manual_seed(seed)
  F.mse_loss(dck(xs), ys):backward()
  same = math.max(same, maxdiff(dplain:parameters(), dck:parameters()))
  oplain:step(); ock:step()
end

-- eval mode (no dropout): against one unwrapped model on the whole batch
local ref, dck2 = build(false), s:wrap(build(true):eval(), { bucket_mb = 0.0002 })
ref:eval()
local oref, ock2 = em.optim.SGD(ref:parameters(), { lr = 0.1 }), em.optim.SGD(dck2:parameters(), { lr = 0.1 })
local global = 0
for step = 1, 2 do
  local x, y, xs, ys = batch(step)
  oref:zero_grad(); ock2:zero_grad()
  F.mse_loss(ref(x), y):backward()
  F.mse_loss(dck2(xs), ys):backward()
  global = math.max(global, maxdiff(ref:parameters(), dck2:parameters()))
  oref:step(); ock2:step()
end
print(('rank %d same_as_plain_wrap %.17g vs_global %.3g'):format(s.rank, same, global))

-- gpu.lua -- run by test_cuda_distribute.lua as `ember --replicas N --devices
-- cuda:0,cuda:1 ...` on emulated devices: GPU replicas (the nccl communicator)
-- training a Linear/ReLU model with a hand-written mean squared error and SGD
-- with momentum written in tensor ops, so that it needs no cuDNN, no fused loss
-- and no fused optimizer kernel.
--   equiv  steps bucket_mb [optim]   N GPU replicas, each fed its 1/N of a global batch,
--                            against one replica trained on the whole batch on
--                            the CPU; prints "rank R device D backend B buckets K
--                            maxdiff X replicas_agree true"; optim 'hand' (the
--                            default), or 'sgd' / 'adam': em.optim's fused kernels
--                            and F.mse_loss on the device, where they exist
--   error                    replica 1 raises an error in its second step
--   hang                     replica 1 stops answering in its second step (timeout 2 s)
local mode = arg[1] or 'equiv'
local s = em.distribute.mirrored{ timeout = mode == 'hang' and 2 or 60 }
local nn = em.nn
local steps, bucket_mb = tonumber(arg[2] or 3), tonumber(arg[3] or 0.001)
local kind = arg[4] or 'hand'

local function build()
  em.manual_seed(11)
  return nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 16), nn.ReLU(),
    nn.Linear(16, 3))
end
local function mse(out, y)
  if kind ~= 'hand' then return nn.F.mse_loss(out, y) end
  return ((out - y) ^ 2):mean()
end

-- SGD with momentum in tensor ops (in place: gradients stay the reducer's views)
local function sgd(params)
  if kind == 'sgd' then return em.optim.SGD(params, { lr = 0.05, momentum = 0.9 }) end
  if kind == 'adam' then return em.optim.Adam(params, { lr = 1e-2 }) end
  local bufs = {}
  return {
    zero_grad = function(_)
      for _, p in ipairs(params) do if p.grad then p.grad:zero_() end end
    end,
    step = function(_)
      em.no_grad(function()
        for i, p in ipairs(params) do
          bufs[i] = bufs[i] and bufs[i]:mul_(0.9):add_(p.grad) or p.grad:clone()
          p:add_(bufs[i] * -0.05)
        end
      end)
    end,
  }
end

local ref, model = build(), build()
-- replicas > 0 perturb their copy: wrap must broadcast replica 0's parameters
if s.rank > 0 then em.no_grad(function() for _, p in ipairs(model:parameters()) do p:add_(1) end end) end
local dm = s:wrap(model, { bucket_mb = bucket_mb, first_bucket_mb = bucket_mb / 2 })
local opt_ref, opt = sgd(ref:parameters()), sgd(dm:parameters())

local B = 12
local per = B / s.world_size
for step = 1, steps do
  em.manual_seed(100 + step)               -- the same global batch on every replica
  local x, y = em.randn(B, 6), em.randn(B, 3)
  local lo = s.rank * per + 1
  local xs, ys = x:narrow(1, lo, per):to(s.device), y:narrow(1, lo, per):to(s.device)
  opt_ref:zero_grad()
  mse(ref(x), y):backward()
  opt_ref:step()
  if step == 2 and s.rank == 1 and mode == 'error' then error('boom on the GPU replica') end
  if step == 2 and s.rank == 1 and mode == 'hang' then
    dofile((arg[0]:match('^(.*/)') or './') .. 'idle.lua')(600)
  end
  opt:zero_grad()
  mse(dm(xs), ys):backward()
  opt:step()
end

local maxdiff = 0
local rp = ref:parameters()
for i, p in ipairs(dm:parameters()) do
  maxdiff = math.max(maxdiff, (p:to('cpu') - rp[i]):abs():max():item())
end
local ok, msg = s:check_replicas(dm)
print(('rank %d device %s backend %s buckets %d maxdiff %.3g replicas_agree %s'):format(s.rank,
  dm.module[1].weight.device, s.backend, dm:num_buckets(), maxdiff, tostring(ok)))
if not ok then print(msg) end

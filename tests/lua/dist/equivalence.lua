-- equivalence.lua -- run by test_distribute.lua as `ember --replicas N` (or under
-- mpirun): a model wrapped on N replicas, each fed its 1/N of a global batch,
-- against the same model trained unwrapped on the whole batch in this same
-- replica. Averaged gradients make the two identical up to float rounding.
-- With GPU replicas (--devices) both models and the batches live on s.device.
--   args: optimizer ('sgd' | 'adam'), steps, bucket_mb
-- prints, per replica: "rank R buckets B maxdiff D checksum C"
local s = em.distribute.mirrored{ timeout = 60 }
local kind, steps, bucket_mb = arg[1] or 'sgd', tonumber(arg[2] or 4), tonumber(arg[3] or 0.002)
local nn, F = em.nn, em.nn.F

local function build()
  em.manual_seed(7)     -- the same start on every replica; wrap broadcasts anyway
  return nn.Sequential(nn.Conv2d(1, 4, 3, { padding = 1 }), nn.ReLU(), nn.MaxPool2d(2),
    nn.Flatten(), nn.Linear(4 * 4 * 4, 32), nn.ReLU(), nn.Linear(32, 10))
end
local function optim(params)
  if kind == 'adam' then return em.optim.Adam(params, { lr = 1e-2 }) end
  return em.optim.SGD(params, { lr = 0.1, momentum = 0.9 })
end

local dev = s.device or 'cpu'
local ref, model = build():to(dev), build()
-- replicas > 0 perturb their copy: wrap must broadcast replica 0's parameters
if s.rank > 0 then em.no_grad(function() for _, p in ipairs(model:parameters()) do p:add_(1) end end) end
local dm = s:wrap(model, { bucket_mb = bucket_mb, first_bucket_mb = bucket_mb / 2 })
local opt_ref, opt = optim(ref:parameters()), optim(dm:parameters())

local B = 24
local per = B / s.world_size
for step = 1, steps do
  em.manual_seed(100 + step)               -- the same global batch on every replica
  local x, y = em.randn(B, 1, 8, 8):to(dev), em.randint(1, 11, { B }):to(dev)
  local lo = s.rank * per + 1
  local xs, ys = x:narrow(1, lo, per), y:narrow(1, lo, per)
  opt_ref:zero_grad()
  F.cross_entropy(ref(x), y):backward()
  opt_ref:step()
  opt:zero_grad()
  F.cross_entropy(dm(xs), ys):backward()
  opt:step()
end

local maxdiff, checksum = 0, 0
local rp = ref:parameters()
for i, p in ipairs(dm:parameters()) do
  maxdiff = math.max(maxdiff, (p - rp[i]):abs():max():item())
  checksum = checksum + p:double():sum():item() * i
end
local ok, msg = s:check_replicas(dm)
print(('rank %d buckets %d maxdiff %.3g checksum %.17g replicas_agree %s'):format(s.rank,
  dm:num_buckets(), maxdiff, checksum, tostring(ok)))
if not ok then print(msg) end

-- grad_dest.lua -- run by test_wrap_grad_dest.lua as `ember --replicas N`: a
-- wrapped model's gradients are written straight into the reducer's buckets.
-- The model has a conv (weight and bias), Linear layers (a weight behind a
-- transpose, a broadcast bias), and one Linear used twice (its weight gets two
-- contributions: the first lands in the bucket, the second is added there).
-- Against the same model unwrapped on this replica's batch, its gradients
-- averaged by hand (s:allreduce mean): the wrapped gradients must be the same
-- bits. The copies of each wrapped step (every kind, by em.copy_count()) less
-- those of the same step unwrapped (an op's own converted temporaries, such as
-- relu's mask) are the wrap's: none. A .grad kept from the step before is the bucket view:
-- the next backward writes into it.
-- prints, per replica: "rank R maxdiff D copies C kept_is_new K user_grad U user_copies N"
local s = em.distribute.mirrored{ timeout = 60 }
local nn, F = em.nn, em.nn.F

local Net = nn.Module:extend('GradDestNet')
function Net:init()
  self.conv = nn.Conv2d(1, 4, 3, { padding = 1 })
  self.fc1 = nn.Linear(4 * 4 * 4, 16)
  self.mid = nn.Linear(16, 16)
  self.out = nn.Linear(16, 10)
end
function Net:forward(x)
  local h = F.max_pool2d(F.relu(self.conv(x)), 2):flatten(2)
  h = F.relu(self.fc1(h))
  h = F.relu(self.mid(F.relu(self.mid(h))))   -- one weight, two uses
  return self.out(h)
end

local function build()
  em.manual_seed(7)
  local m = Net()
  m:to('float64')
  return m
end
local ref, model = build(), build()
local dm = s:wrap(model, { bucket_mb = 0.002, first_bucket_mb = 0.001 })
local opt_ref = em.optim.SGD(ref:parameters(), { lr = 0.1, momentum = 0.9 })
local opt = em.optim.SGD(dm:parameters(), { lr = 0.1, momentum = 0.9 })
local function same(a, b) return (a - b):abs():max():item() == 0 end

local maxdiff, copies, plain = 0, 0, 0
local kept, kept_is_new = nil, true
for step = 1, 4 do
  em.manual_seed(100 + 10 * step + s.rank)     -- each replica its own batch
  local x, y = em.randn(6, 1, 8, 8):double(), em.randint(1, 11, { 6 })
  opt_ref:zero_grad()
  local r0 = em.copy_count()
  F.cross_entropy(ref(x), y):backward()
  plain = em.copy_count() - r0
  opt:zero_grad()
  local c0 = em.copy_count()
  F.cross_entropy(dm(x), y):backward()
  if step >= 3 then copies = copies + (em.copy_count() - c0 - plain) end
  local rp, mp = ref:parameters(), model:parameters()
  for i = 1, #rp do
    local want = s:allreduce(rp[i].grad:clone(), 'mean')
    local d = (mp[i].grad - want):abs():max():item()
    if d > maxdiff then maxdiff = d end
  end
  -- last step's .grad, kept: it now holds this step's gradient
  if kept then kept_is_new = kept_is_new and same(kept, model.fc1.weight.grad) end
  kept = model.fc1.weight.grad
  em.no_grad(function()              -- both models take the averaged gradients' step
    for i = 1, #rp do rp[i].grad:copy_(mp[i].grad) end
  end)
  opt_ref:step()
  opt:step()
end

-- a .grad the user assigned is accumulated into, then averaged in the bucket: the
-- user's tensor keeps this replica's own gradient
local mine = em.zeros(10):double()
model.out.bias.grad = mine
em.manual_seed(500 + s.rank)
local x, y = em.randn(6, 1, 8, 8):double(), em.randint(1, 11, { 6 })
for _, p in ipairs(model:parameters()) do if p ~= model.out.bias then p.grad = nil end end
local c0 = em.copy_count()
F.cross_entropy(dm(x), y):backward()
-- the one copy left: the user's tensor into the bucket
local user_copies = em.copy_count() - c0 - plain
local avg = s:allreduce(mine:clone(), 'mean')
local user_ok = same(model.out.bias.grad, avg) and not same(mine, avg)
print(('rank %d maxdiff %g copies %d kept_is_new %s user_grad %s user_copies %d'):format(
  s.rank, maxdiff, copies, tostring(kept_is_new), tostring(user_ok), user_copies))

--[[
bench_ddp_overhead.lua -- the mirrored strategy's own cost (em.distribute):
one process, one replica, all (2) threads, the Fashion-MNIST CNN of
train_common.lua, Adam 1e-3, batch 128 from the first Fashion-MNIST samples held
in memory (no loader, so only the wrapper differs): training steps of the model
wrapped by em.distribute.mirrored{}:wrap against the same model unwrapped. The
two alternate step by step, PAIRS steps each (which goes first changes every
pair), and each side's figure is the median of its step times: single steps vary
by +-20 % on this 2-core machine, and a median over many steps, taken
alternately, is what keeps the comparison within a percent. Reported:

  ddp_step_unwrapped   ms per step (median), plain model
  ddp_step_wrapped     ms per step (median), s:wrap(model)
  ddp_wrap_cost        wrapped / unwrapped (the target: <= 1.03, at most 3 % slower)

No PyTorch twin: the ratio is ember against itself.
]]
local dir = debug.getinfo(1, 'S').source:sub(2):match('(.*/)')
local B = dofile(dir .. 'common.lua')
local TC = dofile(dir .. 'train_common.lua')
local em = B.em
local F = em.nn.F

local PAIRS, BATCH, N = 200, 128, 40

local ok, ds = pcall(em.data.fashion_mnist, { split = 'train' })
if not ok then
  print('SKIP ddp_overhead: ' .. tostring(ds))
  return
end
local x = (ds.images:narrow(1, 1, BATCH * N):float() / 255 - 0.2860) / 0.3530
local y = ds.labels:narrow(1, 1, BATCH * N)
ds = nil

-- One model and one optimizer serve both sides, so that they run on the same
-- memory: `model(x)` is the plain step, `dm(x)` the wrapped one (the wrapper's
-- gradient hooks act only in a backward that follows dm's forward; on the plain
-- side they are still registered and return at once, a call per parameter).
-- Two separately built models differ by more than the wrapper: in a trial,
-- plain against plain measured 6 % apart.
local s = em.distribute.mirrored{}
em.manual_seed(0)
local model = TC.model('cnn')
local dm = s:wrap(model)
local opt = em.optim.Adam(model:parameters(), { lr = 1e-3 })
local i = 0
local function side(m)
  return function(n)
    for _ = 1, n do
      local b = (i % N) * BATCH + 1
      i = i + 1
      local loss = F.cross_entropy(m(x:narrow(1, b, BATCH)), y:narrow(1, b, BATCH))
      opt:zero_grad()
      loss:backward()
      opt:step()
    end
  end
end
local plain, wrapped = side(model), side(dm)
plain(5)     -- warm-up
wrapped(5)

local times = { {}, {} }
for r = 1, PAIRS do
  for k = 1, 2 do
    local which = (r + k) % 2 + 1           -- 1 plain, 2 wrapped; the order alternates
    local t0 = B.now()
    ;(which == 1 and plain or wrapped)(1)
    times[which][r] = B.now() - t0
  end
end
local best = { B.median(times[1]), B.median(times[2]) }
local cost = best[2] / best[1]
print(('1 replica, %d threads, batch %d: unwrapped %.2f ms/step, wrapped %.2f ms/step, %+.1f %%')
  :format(em.get_num_threads(), BATCH, 1000 * best[1], 1000 * best[2],
          100 * (cost - 1)))
B.result('ddp_step_unwrapped', 1000 * best[1], 'ms', 'lower', '-')
B.result('ddp_step_wrapped', 1000 * best[2], 'ms', 'lower', '-')
B.result('ddp_wrap_cost', cost, 'x', 'lower', '<= 1.03 x')

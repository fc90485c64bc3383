-- amp_strategies.lua -- run by test_amp_strategies.lua on 2 replicas (`ember
-- --replicas 2` or mpirun): float16 autocast + GradScaler under one strategy,
-- KIND = arg[1]: 'wrap' (s:wrap), 'optimizer' | 'gradients' | 'parameters'
-- (s:wrap with that shard), 'pipeline' (2 stages, pp:step(x, y, loss_fn, scaler)).
--   skip:  3 steps; on step 2 only replica 1 sets one of the gradients it holds
--          (its shard, its stage's) to inf after backward. Prints
--          "rank R step K stepped=B scale=S unchanged=B" (unchanged: the
--          parameters the optimizer holds, bit for bit).
--   match: 4 steps with the scaler (growth_interval 2: the scale grows) and 4
--          without, same init and data; prints "rank R match maxdiff X" (the
--          largest difference between the two runs' parameters).
local kind = arg[1] or 'wrap'
local s = em.distribute.mirrored{ timeout = 60 }
local R = s.rank
local nn, F = em.nn, em.nn.F

local function build()
  em.manual_seed(3)
  return nn.Sequential(nn.Linear(5, 8), nn.Tanh(), nn.Linear(8, 8), nn.Tanh(), nn.Linear(8, 3))
end
local function batch(step)
  em.manual_seed(50 + step * 7 + R)      -- each replica its own data
  return em.randn(6, 5), em.randn(6, 3)
end
local function mse(out, y) return F.mse_loss(out, y) end

-- A model under the strategy: {params = what the optimizer takes, run(x, y, scaler)
-- = forward + (scaled) backward under float16 autocast, zero_grad}.
local function setup()
  local m = build()
  if kind == 'pipeline' then
    local pp = s:pipeline(m, { stages = 2, chunks = 2 })
    return { params = pp:parameters(), zero_grad = function() pp:zero_grad() end,
      run = function(x, y, sc)
        em.manual_seed(9); x, y = em.randn(6, 5), em.randn(6, 3)
        return em.amp.autocast('float16', function() return pp:step(x, y, mse, sc) end)
      end }
  end
  local dm = s:wrap(m, kind ~= 'wrap' and { shard = kind } or nil)
  return { params = dm:parameters(), zero_grad = function() dm:zero_grad() end,
    run = function(x, y, sc)
      local loss = em.amp.autocast('float16', function() return mse(dm(x), y) end)
      ;(sc and sc:scale(loss) or loss):backward()
      return loss
    end }
end

local function snapshot(ps)
  local t = {}
  for i, p in ipairs(ps) do t[i] = p:detach():clone() end
  return t
end
local function same(ps, old)
  for i, p in ipairs(ps) do
    if p:numel() > 0 and not p:eq(old[i]):all():item() then return false end
  end
  return true
end

-- skip
do
  local M = setup()
  local opt = em.optim.SGD(M.params, { lr = 0.1, momentum = 0.9 })
  local sc = em.amp.GradScaler{ init_scale = 256, strategy = s }
  for step = 1, 3 do
    M.zero_grad()
    local x, y = batch(step)
    M.run(x, y, sc)
    if step == 2 and R == 1 then
      -- the first gradient this replica holds an element of
      for _, p in ipairs(M.params) do
        if p.grad ~= nil and p.grad:numel() > 0 then p.grad:view(-1)[1] = math.huge; break end
      end
    end
    local w = snapshot(M.params)
    local stepped = sc:step(opt)
    sc:update()
    print(('rank %d step %d stepped=%s scale=%g unchanged=%s'):format(R, step,
      tostring(stepped), sc:get_scale(), tostring(same(M.params, w))))
  end
end

-- match
do
  local function train(with)
    local M = setup()
    local opt = em.optim.SGD(M.params, { lr = 0.05, momentum = 0.9 })
    local sc = nil
    if with then sc = em.amp.GradScaler{ init_scale = 1024, growth_interval = 2, strategy = s } end
    for step = 1, 4 do
      M.zero_grad()
      local x, y = batch(step)
      M.run(x, y, sc)
      if sc then
        assert(sc:step(opt), 'a clean step stepped'); sc:update()
      else opt:step() end
    end
    if sc then assert(sc:get_scale() == 4096, 'grown twice: ' .. sc:get_scale()) end
    return M.params
  end
  local a, b = train(true), train(false)
  local d = 0
  for i = 1, #a do
    if a[i]:numel() > 0 then
      d = math.max(d, (a[i]:detach() - b[i]:detach()):abs():max():item())
    end
  end
  print(('rank %d match maxdiff %g params %d'):format(R, d, #a))
end

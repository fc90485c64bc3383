-- founding.lua -- run by test_memory_sweep.lua as `ember --replicas 4
-- --memory-limit 10M`: the planner's founding case in one process. Plain data
-- parallel of a model whose training state is more than the cap runs out of
-- memory (caught: at 5M the wrap itself would fail building its buckets, leaving
-- no dead wrapped model to free); then em.distribute.plan and plan:apply(s) train the
-- same model in the same process, which needs the dead wrapped model's memory
-- back. Prints per replica "rank R plain oom|ok MESSAGE" then
-- "rank R planned LAYOUT loss L" (or "rank R planned error MESSAGE").
-- Arguments LAYERS DIM CONTEXT ROWS give another model and batch: the README's
-- planner example is `ember --replicas 4 --memory-limit 96M founding.lua 12 256 64 8`.
local dir = arg[0]:match('^(.*/)') or './'
local GPT = dofile(dir .. '../../../examples/gpt_model.lua')
local F = em.nn.F
local s = em.distribute.mirrored{ timeout = 60 }
local R, N = s.rank, s.world_size
local V = 40
local LAYERS, DIM = tonumber(arg[1]) or 8, tonumber(arg[2]) or 96
local T, ROWS = tonumber(arg[3]) or 8, tonumber(arg[4]) or 1   -- ROWS windows per replica

em.manual_seed(1)
-- by default 8 blocks of dim 96: 0.9M parameters, 13.9 MiB of weights, gradients
-- and Adam moments against the 10 MiB cap
local model = GPT.build { vocab = V, layers = LAYERS, dim = DIM, heads = 4, context = T }
local function loss_fn(out, y) return F.cross_entropy(out:view(-1, V), y:view(-1)) end
local function batch(rows)
  return em.randint(1, V + 1, { rows, T }, { dtype = 'int64' }),
         em.randint(1, V + 1, { rows, T }, { dtype = 'int64' })
end

local ok, err = pcall(function()
  local dm = s:wrap(model)
  local opt = em.optim.Adam(dm:parameters(), { lr = 1e-3 })
  local x, y = batch(ROWS)
  opt:zero_grad()
  loss_fn(dm(x), y):backward()
  opt:step()
end)
print(('rank %d plain %s %s'):format(R, ok and 'ok' or 'oom', tostring(err):gsub('\n', ' ')))
model:zero_grad()

local ok2, err2 = pcall(function()
  local plan = em.distribute.plan(model, { input = { shape = { ROWS * N, T }, dtype = 'int64' },
    target = { shape = { ROWS * N, T }, dtype = 'int64' }, loss = loss_fn, optimizer = 'adam',
    devices = N, memory = em.memory_stats('cpu').capacity, strategy = s, time = false })
  local m = plan:apply(s)
  local opt = em.optim.Adam(m:parameters(), { lr = 1e-3 })
  local l = plan.layout
  local loss
  for _ = 1, 2 do
    local x, y = batch(ROWS * N)
    opt:zero_grad()
    if l.pipeline > 1 then
      loss = m:step(x, y, loss_fn)     -- the global batch: each data replica takes its share
    else
      local at = R * ROWS + 1
      loss = loss_fn(m(x:narrow(1, at, ROWS)), y:narrow(1, at, ROWS))
      loss:backward()
    end
    opt:step()
  end
  return ('%s loss %s'):format(require('ember.distribute.plan.layouts').name(l),
    loss and ('%.4f'):format(loss:item()) or '-')
end)
print(('rank %d planned %s'):format(R, ok2 and err2 or 'error ' .. tostring(err2):gsub('\n', ' ')))

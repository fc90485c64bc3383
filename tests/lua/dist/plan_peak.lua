-- plan_peak.lua -- one layout of the planner trained for three steps on N
-- replicas (run by test_distribute_plan.lua): prints 'rank R predicted P
-- measured M' -- the planner's peak for the layout against em.memory_stats'
-- peak of the last step (from a collected start, as the planner assumes).
--   ember --replicas N plan_peak.lua SHARD CKPT [LAYERS DIM]
-- SHARD: none | optimizer | gradients | parameters; CKPT: 0 | 1.
local dir = arg[0]:match('^(.*/)') or './'
local GPT = dofile(dir .. '../../../examples/gpt_model.lua')
local F = em.nn.F
local shard, ckpt = arg[1], arg[2] == '1'
local layers, dim = tonumber(arg[3] or 3), tonumber(arg[4] or 96)
local s = em.distribute.mirrored{ timeout = 60 }
local N, r = s.world_size, s.rank
local V, T, B = 40, 32, 8 * N
em.manual_seed(1)
local model = GPT.build{ vocab = V, layers = layers, dim = dim, heads = 4, context = T }
local function loss_fn(out, y) return F.cross_entropy(out:view(-1, V), y) end
local plan = em.distribute.plan(model, { input = { shape = { B, T }, dtype = 'int64' },
  target = { shape = { B * T }, dtype = 'int64' }, loss = loss_fn, devices = N,
  memory = 2 ^ 40, optimizer = 'adam', time = false })
local predicted
for _, c in ipairs(plan.candidates) do
  local l = c.layout
  if l.pipeline == 1 and l.shard == shard and l.checkpoint == ckpt then predicted = c.peak end
end
assert(predicted, 'no such candidate')
if ckpt then require('ember.distribute.plan.memory').checkpoint_children(model) end
local dm = s:wrap(model, { shard = shard ~= 'none' and shard or nil })
local opt = em.optim.Adam(dm:parameters(), { lr = 1e-3 })
local peak
for step = 1, 3 do
  local x = em.randint(1, V + 1, { B / N, T }, { dtype = 'int64' })
  local y = em.randint(1, V + 1, { B / N * T }, { dtype = 'int64' })
  opt:zero_grad()
  em.collect()
  em.reset_peak_memory_stats()
  local loss = loss_fn(dm(x), y)
  loss:backward()
  opt:step()
  peak = em.memory_stats().peak
end
print(('rank %d predicted %d measured %d'):format(r, predicted, peak))

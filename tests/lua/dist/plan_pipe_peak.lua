-- plan_pipe_peak.lua -- one pipeline layout of the planner trained for four
-- steps on P x D replicas (run by test_distribute_plan.lua): prints 'rank R
-- predicted P measured M stages a,b,... planned a,b,...' -- the planner's peak
-- for this rank's stage against em.memory_stats' largest peak of steps 2..4
-- (zero_grad, pp:step, opt:step, from a collected start) -- the pipeline moved
-- the other stages' weights to the meta device, so that is this stage's memory
-- alone, as the planner counts it -- and the stage counts the pipeline was
-- built with. With D = world / P > 1 each stage's D replicas average (SHARD =
-- none) or shard ('optimizer', 'gradients', 'parameters') its gradients, and
-- every replica passes the global batch B (each data replica reads its B / D rows).
--   ember --replicas N plan_pipe_peak.lua CHUNKS SCHEDULE CKPT [STAGES SHARD LAYERS DIM]
-- SCHEDULE: 1f1b | gpipe; CKPT: 0 | 1; STAGES defaults to N, SHARD to none.
local dir = arg[0]:match('^(.*/)') or './'
local GPT = dofile(dir .. '../../../examples/gpt_model.lua')
local F = em.nn.F
local chunks, sched, ckpt = tonumber(arg[1]), arg[2], arg[3] == '1'
local s = em.distribute.mirrored{ timeout = 60 }
local N, r = s.world_size, s.rank
local P, shard = tonumber(arg[4] or N), arg[5] or 'none'
local layers, dim = tonumber(arg[6] or 4), tonumber(arg[7] or 192)
local D = N / P
local V, T, B = 40, 32, 16 * D
em.manual_seed(1)
local model = GPT.build{ vocab = V, layers = layers, dim = dim, heads = 4, context = T }
local function loss_fn(out, y) return F.cross_entropy(out:view(-1, V), y:reshape({ -1 })) end
local plan = em.distribute.plan(model, { input = { shape = { B, T }, dtype = 'int64' },
  target = { shape = { B, T }, dtype = 'int64' }, loss = loss_fn, devices = N,
  memory = 2 ^ 40, optimizer = 'adam', time = false, schedule = sched })
local cand
for _, c in ipairs(plan.candidates) do
  local l = c.layout
  if l.pipeline == P and l.data == D and l.chunks == chunks and l.checkpoint == ckpt and
     l.shard == shard then cand = c end
end
assert(cand, 'no such candidate')
-- the plan applied as it is: this candidate made the chosen one
plan.fits, plan.layout, plan.peak_bytes = true, cand.layout, cand.peak
local pp = plan:apply(s, model)
local stage = pp.stage
local opt = em.optim.Adam(pp:parameters(), { lr = 1e-3 })
local peak = 0
for step = 1, 4 do
  local x = em.randint(1, V + 1, { B, T }, { dtype = 'int64' })   -- the global batch
  local y = em.randint(1, V + 1, { B, T }, { dtype = 'int64' })
  opt:zero_grad()
  em.collect()
  em.reset_peak_memory_stats()
  pp:step(x, y, loss_fn)
  opt:step()
  -- the largest of steps 2..4 (the first one creates Adam's state): Lua's
  -- collector, paced by the Lua heap, frees garbage at moments that vary with
  -- the waits on other replicas, and the prediction counts none of that luck
  if step > 1 then peak = math.max(peak, em.memory_stats().peak) end
end
print(('rank %d predicted %d measured %d stages %s planned %s'):format(r,
  cand.stage_peaks[stage + 1], peak, table.concat(pp.counts, ','),
  table.concat(cand.layout.stages, ',')))

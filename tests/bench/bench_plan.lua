--[[
bench_plan.lua -- the planner: its own time for a 100-layer model (a Sequential
of 100 identical blocks, measured once thanks to the per-child cache; 4
devices), and its predictions against what the layouts then measure, on a
small GPT (examples/gpt_model.lua) under `ember --replicas 2` and 4: data
parallel, ZeRO 2, ZeRO 3 and a pipeline of P = 2 stages x 4 chunks (D = N / 2
data replicas), each with and without checkpointing. Per layout: the predicted
and measured step seconds (the mean of a few steps after a warm-up, the slowest
replica's) and their ratio, and the predicted and measured peak per device
(the replica whose prediction is furthest from its measurement).

  ember tests/bench/bench_plan.lua [--steps N] [--world 2,4]

It is the driver and (with --worker) the replicas, as dist_common.lua says.
No RESULT line for the predictions: they are a table to read, not a speed.
]]
local dir = debug.getinfo(1, 'S').source:sub(2):match('(.*/)') or './'
local D = dofile(dir .. 'dist_common.lua')
local B = dofile(dir .. 'common.lua')
local em = B.em
local nn = em.nn

local KINDS = { 'data', 'zero2', 'zero3', 'pipe' }
local SHARD = { data = 'none', zero2 = 'gradients', zero3 = 'parameters', pipe = 'none' }

-- -- A replica: plan, apply the asked layout, train, report -------------------------------------
local w = D.worker_args()
if w then
  local F = nn.F
  local GPT = dofile(dir .. '../../examples/gpt_model.lua')
  local s = em.distribute.mirrored{ timeout = 300 }
  local N = s.world_size
  local V, T, Bg = 64, 32, 8 * N
  em.manual_seed(1)
  local model = GPT.build{ vocab = V, layers = 4, dim = 128, heads = 4, context = T }
  local function loss_fn(out, y) return F.cross_entropy(out:view(-1, V), y:reshape({ -1 })) end
  local plan = em.distribute.plan(model, { input = { shape = { Bg, T }, dtype = 'int64' },
    target = { shape = { Bg, T }, dtype = 'int64' }, loss = loss_fn, devices = N,
    memory = 2 ^ 40, optimizer = 'adam', strategy = s })
  local kind, ckpt = w.kind, w.ckpt == 1
  local cand
  for _, c in ipairs(plan.candidates) do
    local l = c.layout
    local want_p = kind == 'pipe' and 2 or 1
    if l.pipeline == want_p and l.shard == SHARD[kind] and l.checkpoint == ckpt and
       (want_p == 1 or l.chunks == 4) then cand = c end
  end
  assert(cand, 'no candidate for ' .. kind)
  plan.fits, plan.layout, plan.peak_bytes, plan.step_s = true, cand.layout, cand.peak, cand.step_s
  local dm = plan:apply(s, model)
  local pipe = cand.layout.pipeline > 1
  -- (a pipeline's step takes the global batch and gives each data replica its
  -- share; data parallel replicas pass their own rows)
  local rows = pipe and Bg or Bg / cand.layout.data
  local opt = em.optim.Adam(dm:parameters(), { lr = 1e-3 })
  local function sync()
    s:allreduce(em.zeros(1), 'sum')
  end
  local total, peak = 0, 0
  local warm = 2
  for step = 1, warm + w.steps do
    local x = em.randint(1, V + 1, { rows, T }, { dtype = 'int64' })
    local y = em.randint(1, V + 1, { rows, T }, { dtype = 'int64' })
    opt:zero_grad()
    em.collect()
    sync()
    em.reset_peak_memory_stats()
    local t0 = em.clock()
    if pipe then dm:step(x, y, loss_fn)
    else loss_fn(dm(x), y):backward() end
    opt:step()
    sync()
    if step > warm then
      total = total + (em.clock() - t0)
      peak = math.max(peak, em.memory_stats().peak)
    end
  end
  local predicted = cand.stage_peaks and cand.stage_peaks[dm.stage + 1] or cand.peak
  local err = (predicted - peak) / peak
  local function red(v, op) return s:allreduce(em.tensor({ v }, { dtype = 'float64' }), op):item() end
  D.data(s, 'pred_step', cand.step_s)
  D.data(s, 'step', red(total / w.steps, 'max'))
  -- the replica furthest from its prediction
  local worst = red(math.abs(err), 'max')
  local mine = math.abs(err) == worst and s.rank or N
  local who = red(mine, 'min')
  local function from(v) return red(s.rank == who and v or 0, 'sum') end
  D.data(s, 'pred_peak', from(predicted))
  D.data(s, 'peak', from(peak))
  D.data(s, 'rank', who)
  return
end

-- -- The driver ---------------------------------------------------------------------------------
local o = { steps = 4, world = '2,4' }
local i = 1
while arg and arg[i] do
  local k, v = arg[i]:match('^%-%-(%a+)$'), arg[i + 1]
  if o[k] == nil or v == nil then
    error('usage: ember bench_plan.lua [--steps N] [--world 2,4]', 0)
  end
  o[k] = tonumber(v) or v
  i = i + 2
end

-- The planner's own time.
local blocks = {}
for j = 1, 100 do
  blocks[j] = nn.Sequential(nn.Linear(256, 256), nn.GELU(), nn.LayerNorm(256))
end
local big = nn.Sequential(unpack(blocks))
local po = { input = { shape = { 64, 256 } }, devices = 4, memory = '64M', optimizer = 'adam' }
local t0 = em.clock()
local plan = em.distribute.plan(big, po)
local t1 = em.clock()
plan:print()
print(('planner: 100 layers, %d candidates, %.3f s (timing runs included)')
  :format(#plan.candidates, t1 - t0))
B.result('plan_100_layers', t1 - t0, 's', 'lower', '< 1 s')
po.time = false
t0 = em.clock()
em.distribute.plan(big, po)
print(('planner without timing runs: %.3f s'):format(em.clock() - t0))
print()

-- Predicted against measured.
local rows = {}
for N in tostring(o.world):gmatch('%d+') do
  N = tonumber(N)
  for _, kind in ipairs(KINDS) do
    for _, ck in ipairs({ 0, 1 }) do
      local r, why = D.launch('local', N, 1, { '--kind', kind, '--ckpt', ck, '--steps', o.steps })
      local name = ('N=%d %s%s'):format(N, kind == 'pipe' and ('pipe P=2 D=' .. N / 2 .. ' M=4')
        or kind, ck == 1 and ' ckpt' or '')
      rows[#rows + 1] = { name = name, r = r, why = why }
    end
  end
end
local MiB = 2 ^ 20
print(('small GPT (4 blocks, dim 128, batch 8 per replica x 32 tokens), Adam, replicas x 1 ' ..
  'thread, %d steps after 2'):format(o.steps))
print(('%-26s %10s %10s %6s   %9s %9s %7s'):format('layout', 'pred s', 'meas s', 'ratio',
  'pred MiB', 'meas MiB', 'err'))
for _, row in ipairs(rows) do
  local r = row.r
  if r then
    print(('%-26s %10.4f %10.4f %6.2f   %9.2f %9.2f %+6.1f%%  (rank %d)'):format(row.name,
      r.pred_step, r.step, r.pred_step / r.step, r.pred_peak / MiB, r.peak / MiB,
      100 * (r.pred_peak - r.peak) / r.peak, r.rank))
  else
    print(('%-26s n/a (%s)'):format(row.name, row.why))
  end
end

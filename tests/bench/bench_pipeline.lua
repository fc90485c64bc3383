--[[
bench_pipeline.lua -- pipeline parallelism (em.distribute.pipeline) against
PyTorch 2's torch.distributed.pipelining on the CPU:

  ember    em.distribute.pipeline(model, {stages = P, chunks = M, schedule = S,
           balance = {16/P, ...}}) on `ember --replicas P` (threads, the local
           communicator, 1 intra-op thread each); pp:step(x, y, loss_fn) and
           opt:step()
  PyTorch  PipelineStage + ScheduleGPipe / Schedule1F1B, P gloo processes x 1
           thread (bench_pipeline.py)

for P = 2 and 4 stages (one replica each), M = 4 and 8 micro-batches, schedules
'gpipe', '1f1b' and 'interleaved' (virtual = 2 pieces per replica; PyTorch's
ScheduleInterleaved1F1B with two PipelineStages per process). Model: 8 blocks of Linear(1024, 1024) + ReLU (16 children,
cut into P stages of 16/P children, the same cut on both sides), float32, MSE
loss against a random target, SGD lr 1e-3, batch 64 rows per step, synthetic
data, `steps` timed steps after 3.

Per configuration: samples/s (64 * steps / the slowest replica's seconds) and
the measured bubble: pp:stats().bubble (the share of pp:step a stage sat idle)
averaged over the timed steps and the replicas; PyTorch's is the share of
schedule.step() spent in the schedule's waits on point-to-point work. Beside
them, the formula (p-1)/(m+p-1) ((p-1)/(2m+p-1) interleaved).

  ember tests/bench/bench_pipeline.lua [--steps N] [--world 2,4] [--chunks 4,8]
        [--schedules gpipe,1f1b,interleaved]

(steps default 20, or EMBER_BENCH_PIPE_STEPS.) RESULT lines, the same names as
the twin's, so that run.sh's ratio is ember/PyTorch for samples/s:
  pipe_<schedule>_p<P>_m<M>          samples/s (target: >= PyTorch's)
  pipe_<schedule>_p<P>_m<M>_bubble   the measured bubble (target: within 0.05 of the
                                     formula)
Standalone, the driver runs the twin itself and prints both in one table.
]]
local dir = debug.getinfo(1, 'S').source:sub(2):match('(.*/)')
local D = dofile(dir .. 'dist_common.lua')
local em = D.B.em
local nn, F = em.nn, em.nn.F

local BATCH, WIDTH, BLOCKS, WARM, VIRTUAL = 64, 1024, 8, 3, 2
local STEPS = tonumber(os.getenv('EMBER_BENCH_PIPE_STEPS') or '') or 20

-- -- The worker: one replica, one stage ----------------------------------------------------
local function train(o)
  local P, M, schedule = o.stages, o.chunks, o.schedule
  local steps = o.steps or STEPS
  local s = em.distribute.mirrored {}
  em.manual_seed(0)
  local layers = {}
  for _ = 1, BLOCKS do
    layers[#layers + 1] = nn.Linear(WIDTH, WIDTH)
    layers[#layers + 1] = nn.ReLU()
  end
  local model = nn.Sequential(unpack(layers))
  -- 'interleaved': V = 2 pieces per replica, each half a stage
  local V = schedule == 'interleaved' and VIRTUAL or nil
  local balance = {}
  for i = 1, P * (V or 1) do balance[i] = #layers / (P * (V or 1)) end
  local pp = em.distribute.pipeline(model, { stages = P, chunks = M, schedule = schedule,
                                              virtual = V, balance = balance })
  local opt = em.optim.SGD(pp:parameters(), { lr = 1e-3 })
  em.manual_seed(1)
  local x, y = em.randn(BATCH, WIDTH), em.randn(BATCH, WIDTH)
  local function loss_fn(out, target) return F.mse_loss(out, target) end
  local bubble = 0
  local function step(_, timed)
    opt:zero_grad()
    pp:step(x, y, loss_fn)
    opt:step()
    if timed then bubble = bubble + pp:stats().bubble end
  end

  local slowest = D.timed(s, WARM, steps, step)
  local mean = s:allreduce(em.tensor({ bubble / steps }, { dtype = 'float64' }), 'mean'):item()
  D.data(s, 'samples_s', steps * BATCH / slowest)
  D.data(s, 'bubble', mean)
end

local w = D.worker_args()
if w then return train(w) end

-- -- The driver ----------------------------------------------------------------------------
local split = D.split
local o = D.options({ steps = STEPS, world = '2,4', chunks = '4,8',
                     schedules = 'gpipe,1f1b,interleaved' },
  ('usage: ember %s [--steps N] [--world 2,4] [--chunks 4,8] ' ..
   '[--schedules gpipe,1f1b,interleaved]'):format(arg and arg[0] or 'bench_pipeline.lua'))
local runs, why = {}, {}
for _, P in ipairs(split(o.world)) do
  for _, sched in ipairs(split(o.schedules)) do
    for _, M in ipairs(split(o.chunks)) do
      local c = { name = ('pipe_%s_p%s_m%s'):format(sched, P, M), P = tonumber(P),
                  M = tonumber(M), sched = sched }
      runs[#runs + 1] = c
      c.r, why[c.name] = D.launch('local', c.P, 1, { '--stages', P, '--chunks', M,
        '--schedule', sched, '--steps', o.steps })
    end
  end
end
local pr, peer_why = D.peer(dir .. 'bench_pipeline.py', { '--steps', o.steps, '--world',
  o.world, '--chunks', o.chunks, '--schedules', o.schedules })

print(('pipeline parallelism, 8 x Linear(%d, %d) + ReLU, batch %d, %d steps after %d, ' ..
  'one stage per replica x 1 thread; bubble: the share of the step a stage sat idle')
  :format(WIDTH, WIDTH, BATCH, o.steps, WARM))
print(('%-11s %2s %2s %10s %10s %6s %8s %8s %8s'):format('sched', 'P', 'M', 'samples/s',
  'PyTorch', 'ratio', 'bubble', 'PyTorch', 'formula'))
for _, c in ipairs(runs) do
  local r = c.r
  local ts, tb = pr and pr[c.name], pr and pr[c.name .. '_bubble']
  local v = c.sched == 'interleaved' and VIRTUAL or 1
  local formula = (c.P - 1) / (v * c.M + c.P - 1)
  if r then
    print(('%-11s %2d %2d %10.1f %10s %6s %8.3f %8s %8.3f'):format(c.sched, c.P, c.M,
      r.samples_s, D.fmt(ts, '%.1f'), D.fmt(ts and r.samples_s / ts, '%.2f'), r.bubble,
      D.fmt(tb, '%.3f'), formula))
  else
    print(('%-11s %2d %2d n/a (%s)'):format(c.sched, c.P, c.M, why[c.name]))
  end
end
if not pr then print(('PyTorch: n/a (%s)'):format(peer_why)) end

for _, c in ipairs(runs) do
  local r = c.r
  if r then
    local v = c.sched == 'interleaved' and VIRTUAL or 1
  local formula = (c.P - 1) / (v * c.M + c.P - 1)
    D.B.result(c.name, r.samples_s, 'samples/s', 'higher', 'ratio >= 1')
    D.B.result(c.name .. '_bubble', r.bubble, 'share', 'lower',
               ('<= %.3f'):format(formula + 0.05))
  else
    D.skip(c.name, why[c.name])
  end
end

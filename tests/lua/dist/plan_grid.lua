--[[
plan_grid.lua -- one case of the planner's grid (tests/lua/dist/plan_grid_run.lua
lists the cases and reads what this prints), run as a user runs the planner:

  ember plan_grid.lua weights MODEL BATCH
  ember --replicas N --memory-limit CAP plan_grid.lua plan MODEL BATCH
  ember --replicas N --memory-limit CAP plan_grid.lua run MODEL BATCH LAYOUT

MODEL names a model and its sizes: gpt:LAYERS:DIM:CONTEXT (the shipped
example's GPT), mlp:DEPTH:WIDTH, cnn:CHANNELS. BATCH is the global batch.

weights: `weights BYTES`, the model's parameters' bytes.

plan: em.distribute.plan with the memory left to default (the cap), and on
replica 0 `plan fits yes|no layout NAME`, then `accepted NAME PEAK` for every
layout the planner accepts, and `candidate NAME PEAK` for every layout it
weighed (what a change to the planner's arithmetic predicts, without training).

run: the same plan, then LAYOUT applied (plan:apply, as if the planner had
chosen it), and ten steps of zero_grad / forward /
backward / opt:step with no collection of the script's own: the global batch
drawn alike on every replica; data replicas pass their rows, a pipeline takes
the global batch. Each replica prints `rank R predicted P margin G measured M`: the
planner's peak for it (its stage's, in a pipeline), that peak with the
layout's margin, and the largest peak
em.memory_stats measured in steps 2-10 (the first makes Adam's state). Out of
memory, the replica fails with the error, and ember exits non-zero.
]]
local dir = arg[0]:match('^(.*/)') or './'
local GPT = dofile(dir .. '../../../examples/gpt_model.lua')
local layouts = require 'ember.distribute.plan.layouts'
local nn, F = em.nn, em.nn.F
local mode, model_arg, B, want = arg[1], arg[2], tonumber(arg[3]), arg[4]
local STEPS = 10

-- -- The models: spec(fields) -> {build, input, target, batch, loss} ----------------------------
local V = 40
local MODELS = {}
function MODELS.gpt(layers, dim, T)
  return {
    build = function() return GPT.build{ vocab = V, layers = layers, dim = dim, heads = 4, context = T } end,
    input = { shape = { B, T }, dtype = 'int64' }, target = { shape = { B, T }, dtype = 'int64' },
    batch = function()
      return em.randint(1, V + 1, { B, T }, { dtype = 'int64' }),
             em.randint(1, V + 1, { B, T }, { dtype = 'int64' })
    end,
    loss = function(out, y) return F.cross_entropy(out:view(-1, V), y:reshape({ -1 })) end,
  }
end

function MODELS.mlp(depth, width)
  local IN, OUT = 64, 10
  return {
    build = function()
      local layers, at = {}, IN
      for _ = 1, depth do
        layers[#layers + 1] = nn.Linear(at, width)
        layers[#layers + 1] = nn.ReLU()
        at = width
      end
      layers[#layers + 1] = nn.Linear(at, OUT)
      return nn.Sequential(layers)
    end,
    input = { shape = { B, IN } }, target = { shape = { B, OUT } },
    batch = function() return em.randn(B, IN), em.randn(B, OUT) end,
    loss = F.mse_loss,
  }
end

function MODELS.cnn(C)
  local HW, K = 16, 10
  return {
    build = function()
      return nn.Sequential {
        nn.Conv2d(3, C, 3, { padding = 1 }), nn.ReLU(),
        nn.Conv2d(C, C, 3, { padding = 1 }), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(C, 2 * C, 3, { padding = 1 }), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(2 * C * (HW / 4) ^ 2, K),
      }
    end,
    input = { shape = { B, 3, HW, HW } }, target = { shape = { B }, dtype = 'int64' },
    batch = function()
      return em.randn(B, 3, HW, HW), em.randint(1, K + 1, { B }, { dtype = 'int64' })
    end,
    loss = F.cross_entropy,
  }
end

local kind, rest = model_arg:match('^(%a+):?(.*)$')
local sizes = {}
for v in rest:gmatch('%d+') do sizes[#sizes + 1] = tonumber(v) end
local spec = assert(MODELS[kind], 'MODEL: gpt:L:D:T | mlp:DEPTH:WIDTH | cnn:C')(unpack(sizes))

if mode == 'weights' then          -- the bytes of the model's parameters (caps are multiples)
  em.manual_seed(1)
  local n = 0
  for _, p in ipairs(spec.build():parameters()) do n = n + p:numel() * p:element_size() end
  print(('weights %d'):format(n))
  return
end

local s = em.distribute.mirrored{ timeout = 120 }
local N, R = s.world_size, s.rank

em.manual_seed(1)
local model = spec.build()
local plan = em.distribute.plan(model, { input = spec.input, target = spec.target,
  loss = spec.loss, optimizer = 'adam', devices = N, strategy = s, time = false })

if mode == 'plan' then
  if R == 0 then
    print(('plan fits %s layout %s'):format(plan.fits and 'yes' or 'no', layouts.name(plan.layout)))
    for _, c in ipairs(plan.candidates) do
      if c.fits then print(('accepted %s %d'):format(c.name, c.peak)) end
      print(('candidate %s %d'):format(c.name, c.peak))
    end
  end
  return
end

assert(mode == 'run', 'mode: plan | run')
local cand
for _, c in ipairs(plan.candidates) do if c.name == want then cand = c end end
assert(cand, 'no layout named ' .. tostring(want))
-- the layout applied as if the planner had chosen it
plan.fits, plan.layout, plan.peak_bytes = true, cand.layout, cand.peak
local m = plan:apply(s)
local l = cand.layout
local predicted = cand.stage_peaks and cand.stage_peaks[m.stage + 1] or cand.peak
local opt = em.optim.Adam(m:parameters(), { lr = 1e-3 })
for step = 1, STEPS do
  local x, y = spec.batch()
  if step == 2 then em.reset_peak_memory_stats() end
  opt:zero_grad()
  if l.pipeline > 1 then
    m:step(x, y, spec.loss)
  else
    local rows = B / l.data
    local at = R * rows + 1
    spec.loss(m(x:narrow(1, at, rows)), y:narrow(1, at, rows)):backward()
  end
  opt:step()
end
local measured = em.memory_stats().peak
print(('rank %d predicted %d margin %d measured %d'):format(R, predicted,
  math.floor(layouts.margin(predicted, l)), measured))

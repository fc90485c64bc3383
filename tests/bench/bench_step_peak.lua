--[[
bench_step_peak.lua -- a training step's peak tensor memory, step after step, against
what the step must hold. For the Fashion-MNIST CNN (batch 128, Adam), the seed's
ResNet-18 for 32x32 inputs (batch 32, SGD with momentum) and the GPT example (2
layers, dim 64, context 64, batch 16, Adam), on the CPU with synthetic data:

  peak       em.memory_stats('cpu').peak of each step, with em.reset_peak_memory_stats
             before it (the first two steps are warm-up: the optimizer state is born);
  between    the tensor memory held between steps;
  needs      the peak of one more step run with handles.eager(true): every dead
             tensor freed at once, as under reference counting -- the parameters,
             gradients, optimizer state, the activations autograd saves and the largest
             transient, and nothing else;
  state      parameters + gradients + optimizer state, and saved: what a full
             collection right after the forward leaves, less the state and the batch.

RESULT lines: step_peak_<model>_spread (the largest peak over the smallest, less 1, in
percent; goal <= 1) and step_peak_<model>_vs_needs (the largest peak / needs; goal
<= 1.2). With --device cuda (or cuda:N) the same on the GPU, and beside it PyTorch's
torch.cuda.max_memory_allocated for the same steps (the twin, bench_step_peak.py, run
by this driver unless EMBER_BENCH_PEER=0): step_peak_<model>_vs_torch (ember's
largest peak / PyTorch's). The CPU has no such counter in PyTorch: no twin there.

  build/ember tests/bench/bench_step_peak.lua [--models cnn,resnet,gpt] [--steps N]
                                              [--device cpu|cuda|cuda:N]
]]
local dir = arg[0]:match('^(.*/)') or './'
local B = dofile(dir .. 'common.lua')
local R = dofile(dir .. 'resnet_common.lua')
local em = B.em
local nn, F = em.nn, em.nn.F
local handles = require 'ember.handles'
local kinds = require 'ember.memory_kinds'

local only, steps, dev = 'cnn,resnet,gpt', 6, 'cpu'
do
  local i = 1
  while arg[i] do
    if arg[i] == '--models' and arg[i + 1] then only = arg[i + 1]; i = i + 2
    elseif arg[i] == '--device' and arg[i + 1] then dev = arg[i + 1]; i = i + 2
    elseif arg[i] == '--steps' and tonumber(arg[i + 1] or '') then
      steps = tonumber(arg[i + 1]); i = i + 2
    else error(('unknown argument %s (see the header of %s)'):format(arg[i], arg[0]), 0) end
  end
end

local MB = 2 ^ 20
local function allocated() return em.memory_stats(dev).allocated end
local function peak() return em.memory_stats(dev).peak end
local function reset() em.reset_peak_memory_stats(dev) end
local function on_dev(...)
  local res = { ... }
  for i, t in ipairs(res) do res[i] = t:to(dev) end
  return unpack(res)
end

-- -- The three workloads: each returns {model, opt, batch(i) -> x, y, loss(model, x, y)} --------
local WORK = {}

function WORK.cnn()
  local model = nn.Sequential(
    nn.Conv2d(1, 32, 3, { padding = 1 }), nn.ReLU(), nn.MaxPool2d(2),
    nn.Conv2d(32, 64, 3, { padding = 1 }), nn.ReLU(), nn.MaxPool2d(2),
    nn.Flatten(), nn.Linear(3136, 128), nn.ReLU(), nn.Linear(128, 10))
  local x, y = on_dev(em.randn(128, 1, 28, 28), em.randint(1, 11, { 128 }))
  return { model = model:to(dev), opt = em.optim.Adam(model:parameters(), { lr = 1e-3 }),
           batch = function() return x, y end,
           loss = function(m, xb, yb) return F.cross_entropy(m(xb), yb) end }
end

function WORK.resnet()
  local model = R.resnet18():to(dev)
  local x, y = on_dev(em.randn(32, 3, 32, 32), em.randint(1, 11, { 32 }))
  return { model = model, opt = R.sgd(model), batch = function() return x, y end,
           loss = function(m, xb, yb) return F.cross_entropy(m(xb), yb) end }
end

function WORK.gpt()
  local G = dofile(dir .. '../../examples/gpt_model.lua')
  local cfg = { vocab = 96, layers = 2, dim = 64, heads = 4, context = 64 }
  local model = G.build(cfg):to(dev)
  local x, y = on_dev(em.randint(1, cfg.vocab + 1, { 16, cfg.context }),
                      em.randint(1, cfg.vocab + 1, { 16, cfg.context }))
  return { model = model, opt = em.optim.Adam(model:parameters(), { lr = 1e-3 }),
           batch = function() return x, y end,
           loss = function(m, xb, yb)
             local logits = m(xb)
             return F.cross_entropy(logits:reshape(-1, cfg.vocab), yb:reshape(-1))
           end }
end

local function step(w)
  local x, y = w.batch()
  local loss = w.loss(w.model, x, y)
  w.opt:zero_grad()
  loss:backward()
  w.opt:step()
end

-- -- One workload ------------------------------------------------------------------------------
local function measure(name)
  em.manual_seed(0)
  local w = WORK[name]()
  step(w); step(w)                                    -- warm-up: Adam's state is born
  local peaks, between = {}, {}
  for i = 1, steps do
    between[i] = allocated()
    reset()
    step(w)
    peaks[i] = peak()
  end

  -- What the step must hold: the same step with every dead tensor freed at once.
  handles.collect()
  handles.eager(true)
  reset()
  local ok, err = pcall(step, w)
  handles.eager(false)
  if not ok then error(err, 0) end
  local needs = peak()

  -- Its parts: the state, and what the forward saves (a full collection right after it).
  local state = 0
  for _, b in pairs(kinds.measure()[dev == 'cuda' and 'cuda:0' or dev] or {}) do state = state + b end
  handles.collect()
  local before = allocated()
  local x, y = w.batch()
  local loss = w.loss(w.model, x, y)
  handles.collect()
  local saved = allocated() - before
  loss = nil
  handles.collect()

  local lo, hi = math.huge, 0
  for _, p in ipairs(peaks) do lo = math.min(lo, p); hi = math.max(hi, p) end
  local row = {}
  for i = 1, steps do row[i] = ('%.1f'):format(peaks[i] / MB) end
  local brow = {}
  for i = 1, steps do brow[i] = ('%.1f'):format(between[i] / MB) end
  print(('%-7s peak per step (MB): %s'):format(name, table.concat(row, ' ')))
  print(('%-7s held between steps (MB): %s'):format(name, table.concat(brow, ' ')))
  print(('%-7s needs %.1f MB (state %.1f MB, saved by the forward %.1f MB)')
        :format(name, needs / MB, state / MB, saved / MB))
  B.result('step_peak_' .. name .. '_spread', (hi / lo - 1) * 100, '%', 'lower', '<= 1')
  B.result('step_peak_' .. name .. '_vs_needs', hi / needs, 'x', 'lower', '<= 1.2')
  return hi
end

local ours = {}
for name in only:gmatch('[^,]+') do
  if not WORK[name] then error('unknown model ' .. name .. ' (cnn, resnet, gpt)', 0) end
  ours[name] = measure(name)
  collectgarbage()
end

-- On a GPU: PyTorch's peaks for the same steps, and the ratios.
if dev ~= 'cpu' and os.getenv('EMBER_BENCH_PEER') ~= '0' then
  local cmd = ('%q %q --models %s --steps %d 2>&1'):format(B.python(),
    dir .. 'bench_step_peak.py', only, steps)
  local p = io.popen(cmd)
  local out = p:read('*a')
  p:close()
  io.write(out)
  for name, mb in out:gmatch('RESULT step_peak_(%w+)_torch ([%d.e+-]+) MB') do
    if ours[name] then
      B.result('step_peak_' .. name .. '_vs_torch', ours[name] / MB / tonumber(mb), 'x', 'lower',
        'ember / PyTorch max_memory_allocated')
    end
  end
end

--[[
test_memory_collect.lua -- memory comes back when Lua's collector says it is dead
(ember.handles): one `collectgarbage()` releases every dead tensor, young, old
(survived many sweeps before dying) and small queued ones alike, so that
em.memory_stats then counts live tensors only; other collectgarbage options are
Lua's own. And a training step's memory: the same between steps and the same
peak every step, at most 1.2x what the step must hold (the peak with every dead
tensor freed at once: handles.eager), with the collections at a backward pass's
start and end, and none where a pipeline turns them off.
]]
local dir = (arg and arg[0] and arg[0]:match('^(.*/)')) or
            ((os.getenv('EMBER_TESTS') or 'tests') .. '/lua/')
local H = dofile(dir .. 'harness.lua')
local em = require 'ember'
local handles = require 'ember.handles'
local nn, F = em.nn, em.nn.F
local MiB = 2 ^ 20

local function allocated() return em.memory_stats('cpu').allocated end

H.test('one collectgarbage() releases every dead tensor: young, old and small', function()
  em.collect()
  local base = allocated()
  -- old: tensors that survive many sweeps (moved to the old list), then die
  local old = {}
  for i = 1, 300 do old[i] = em.zeros(64) end
  for _ = 1, 40 do
    collectgarbage('step', 1000)
    local t = em.ones(8) + 1               -- a wrap: the sweep runs
    t = nil
  end
  -- big and small young ones, dead at once
  local big = em.zeros(2 * MiB / 4)
  local small = {}
  for i = 1, 200 do small[i] = em.rand(16) * 2 end
  H.check(allocated() - base >= 2 * MiB, 'the tensors are counted while they live')
  old, big, small = nil, nil, nil
  collectgarbage()
  H.eq(allocated(), base, 'after one full collection only the live tensors are counted')
  collectgarbage('collect')
  H.eq(allocated(), base, "collectgarbage('collect') too")
end)

H.test('collectgarbage keeps Lua\'s other options', function()
  H.check(type(collectgarbage('count')) == 'number', 'count is a number')
  collectgarbage('stop')
  local t = em.zeros(1000); t = nil
  collectgarbage('restart')
  H.check(type(collectgarbage('step', 10)) == 'boolean', 'step returns whether a cycle ended')
  H.eq(collectgarbage('setpause', 200) ~= nil, true, 'setpause returns the previous value')
  -- a live tensor survives any of them
  local keep = em.full({ 4 }, 3)
  collectgarbage(); collectgarbage()
  H.eq(keep:totable(), { 3, 3, 3, 3 })
end)

-- The Fashion-MNIST CNN's step (batch 64, Adam) on one fixed batch.
local function cnn_step()
  em.manual_seed(0)
  local model = nn.Sequential(
    nn.Conv2d(1, 16, 3, { padding = 1 }), nn.ReLU(), nn.MaxPool2d(2),
    nn.Conv2d(16, 32, 3, { padding = 1 }), nn.ReLU(), nn.MaxPool2d(2),
    nn.Flatten(), nn.Linear(32 * 49, 64), nn.ReLU(), nn.Linear(64, 10))
  local opt = em.optim.Adam(model:parameters(), { lr = 1e-3 })
  local x, y = em.randn(64, 1, 28, 28), em.randint(1, 11, { 64 })
  return function()
    local loss = F.cross_entropy(model(x), y)
    opt:zero_grad()
    loss:backward()
    opt:step()
  end
end

H.test('a training step: the same memory between steps, the same peak, <= 1.2x its needs', function()
  local step = cnn_step()
  step(); step()                              -- Adam's state is born
  local between, peaks = {}, {}
  for i = 1, 5 do
    between[i] = allocated()
    em.reset_peak_memory_stats('cpu')
    step()
    peaks[i] = em.memory_stats('cpu').peak
  end
  for i = 2, 5 do
    H.eq(between[i], between[1], 'held between steps, step ' .. i)
    H.check(math.abs(peaks[i] / peaks[1] - 1) <= 0.01,
      ('peak of step %d %d against step 1 %d'):format(i, peaks[i], peaks[1]))
  end
  handles.collect()
  handles.eager(true)
  em.reset_peak_memory_stats('cpu')
  local ok, err = pcall(step)
  handles.eager(false)
  H.check(ok, tostring(err))
  local needs = em.memory_stats('cpu').peak
  H.check(peaks[1] <= 1.2 * needs and peaks[1] >= needs,
    ('peak %.2f MiB against needs %.2f MiB (<= 1.2x)'):format(peaks[1] / MiB, needs / MiB))
end)

H.test('backward begins and ends with a collection; step_collects(false) turns them off', function()
  local model = nn.Sequential(nn.Linear(256, 1024), nn.ReLU(), nn.Linear(1024, 256))
  local x = em.randn(2048, 256)
  em.collect()
  local base = allocated()
  local loss = model(x):pow(2):mean()
  loss:backward()
  -- the forward's outputs (2048 x 1024 floats, 8 MiB each) are all gone; what is
  -- left is the gradients (1 MiB each) and the loss
  local held = allocated() - base
  H.check(held < 2.2 * MiB, ('after backward %.2f MiB held beyond the start'):format(held / MiB))
  for _, p in ipairs(model:parameters()) do p.grad = nil end
  em.collect()
  local was = handles.step_collects(false)
  H.eq(was, true, 'on by default')
  collectgarbage('stop')
  loss = model(x):pow(2):mean()
  loss:backward()
  held = allocated() - base
  collectgarbage('restart')
  H.check(held > 16 * MiB, ('with step_collects(false) the forward\'s outputs stay: %.2f MiB')
    :format(held / MiB))
  H.eq(handles.step_collects(was), false)
  loss = nil
  for _, p in ipairs(model:parameters()) do p.grad = nil end
  collectgarbage()
  H.eq(allocated(), base, 'and go at the next full collection')
end)

H.test('the profiler under auto_step: a step per loader batch, evaluation batches not counted', function()
  local model = nn.Sequential(nn.Linear(64, 512), nn.ReLU(), nn.Linear(512, 4))
  local opt = em.optim.SGD(model:parameters(), { lr = 0.01 })
  local train = em.data.tensors(em.randn(256, 64), em.randint(1, 5, { 256 }))
  local test = em.data.tensors(em.randn(8192, 64))     -- evaluation: 16 MiB of hidden units
  collectgarbage()
  em.profile.start { auto_step = true }
  for x, y in train:batch(64):loader{ workers = 1, progress = false }:epoch() do
    local loss = F.cross_entropy(model(x), y)
    opt:zero_grad(); loss:backward(); opt:step()
  end
  em.no_grad(function()
    for x in test:batch(4096):loader{ workers = 1, progress = false }:epoch() do
      local e = model(x); e = nil
    end
  end)
  local r = em.profile.stop()
  local act = r.memory.activations
  H.check(act > 0 and act < 6 * MiB,
    ('a training step of 64 rows: activations %.2f MiB, the evaluation batches left out'):format(act / MiB))
end)

H.done()

--[[
train_common.lua -- the ember side of the training benchmarks (bench_train_mlp,
bench_train_cnn): one recipe for both peers (Adam 1e-3, batch 128, cross-entropy) on the
first samples of Fashion-MNIST, timed over whole steps (forward, backward,
update) after a warm-up, and the process's peak RSS (VmHWM) after the float32 run.
The CNN also runs in bfloat16 autocast with channels-last (train_cnn_bf16: the model
converted once, each batch at its entry), where this build has em.amp and
to_channels_last. The PyTorch twin is train_common.py; both read the same files.
]]
local B = dofile(debug.getinfo(1, 'S').source:sub(2):match('(.*/)') .. 'common.lua')
local nn, F = em.nn, em.nn.F

local T = {}

local function peak_rss_mb()
  for line in io.lines('/proc/self/status') do
    local kb = line:match('^VmHWM:%s+(%d+)')
    if kb then return tonumber(kb) / 1024 end
  end
end

function T.model(kind)
  if kind == 'mlp' then
    return nn.Sequential(nn.Flatten(), nn.Linear(784, 512), nn.ReLU(), nn.Linear(512, 256),
                         nn.ReLU(), nn.Linear(256, 10))
  end
  return nn.Sequential(
    nn.Conv2d(1, 32, 3, { padding = 1 }), nn.ReLU(), nn.MaxPool2d(2),
    nn.Conv2d(32, 64, 3, { padding = 1 }), nn.ReLU(), nn.MaxPool2d(2),
    nn.Flatten(), nn.Linear(3136, 128), nn.ReLU(), nn.Linear(128, 10))
end

-- The model, its data and one training step: step(i) trains on batch i (of 40).
-- low = true: bfloat16 autocast and channels-last; compiled = true: the step
-- (forward, backward, update) through em.compile, fed each batch.
function T.setup(kind, low, compiled)
  em.manual_seed(0)
  local batch = 128
  local ds = em.data.fashion_mnist{ split = 'train' }
  local n = batch * 40
  local x = (ds.images:narrow(1, 1, n):float() / 255 - 0.2860) / 0.3530
  local y = ds.labels:narrow(1, 1, n)
  ds = nil
  local model = T.model(kind)
  if low then model:to{ memory_format = 'channels_last' } end
  local opt = em.optim.Adam(model:parameters(), { lr = 1e-3 })
  local function train(xb, yb)
    local loss
    if low then
      xb = xb:to_channels_last()
      loss = em.amp.autocast('bfloat16', function() return F.cross_entropy(model(xb), yb) end)
    else
      loss = F.cross_entropy(model(xb), yb)
    end
    opt:zero_grad()
    loss:backward()
    opt:step()
    return loss
  end
  local run = compiled and em.compile(train) or train
  local function step(i)
    local s = ((i - 1) % 40) * batch + 1
    return run(x:narrow(1, s, batch), y:narrow(1, s, batch))
  end
  return step, batch
end

-- samples/s of `steps` steps after 5 warm-up steps.
local function rate(step, batch, steps)
  for i = 1, 5 do step(i) end
  local t0 = B.now()
  for i = 1, steps do step(i) end
  return steps * batch / (B.now() - t0)
end

-- Whether this build has em.amp and channels-last (other work adds them).
local function missing_low()
  local ok, amp = pcall(function() return em.amp end)
  if not (ok and type(amp) == 'table' and type(amp.autocast) == 'function') then
    return 'em.amp not built'
  end
  local okc, f = pcall(function() return em.zeros({ 1, 1, 1, 1 }).to_channels_last end)
  if not (okc and f) then return 'channels-last (to_channels_last) not built' end
end

function T.run(kind, steps)
  local step, batch = T.setup(kind)
  B.result('train_' .. kind, rate(step, batch, steps), 'samples/s', 'higher',
           kind == 'mlp' and 'ratio >= 1.5' or 'ratio >= 1.2')
  B.result('rss_' .. kind, peak_rss_mb(), 'MB', 'lower', 'ratio >= 1')
  if kind ~= 'cnn' then return end
  step = T.setup(kind, false, true)
  B.result('train_cnn_compiled', rate(step, batch, steps), 'samples/s', 'higher', 'ratio >= 1.5')
  local why = missing_low()
  if why then print('skipped: train_cnn_bf16: ' .. why); return end
  step = T.setup(kind, true)
  B.result('train_cnn_bf16', rate(step, batch, steps), 'samples/s', 'higher', 'ratio >= 1.3')
end

return T

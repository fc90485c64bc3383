--[[
train_common.lua -- the ember side of the training benchmarks (bench_train_mlp,
bench_train_cnn): one recipe for both peers (Adam 1e-3, batch 128, cross-entropy) on the
first samples of Fashion-MNIST, timed over whole steps (forward, backward,
update) after a warm-up, and the process's peak RSS (VmHWM) at the end. The
PyTorch twin is train_common.py; both read the same files.
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
function T.setup(kind)
  em.manual_seed(0)
  local batch = 128
  local ds = em.data.fashion_mnist{ split = 'train' }
  local n = batch * 40
  local x = (ds.images:narrow(1, 1, n):float() / 255 - 0.2860) / 0.3530
  local y = ds.labels:narrow(1, 1, n)
  ds = nil
  local model = T.model(kind)
  local opt = em.optim.Adam(model:parameters(), { lr = 1e-3 })
  local function step(i)
    local s = ((i - 1) % 40) * batch + 1
    local loss = F.cross_entropy(model(x:narrow(1, s, batch)), y:narrow(1, s, batch))
    opt:zero_grad()
    loss:backward()
    opt:step()
    return loss
  end
  return step, batch
end

function T.run(kind, steps)
  local step, batch = T.setup(kind)
  for i = 1, 5 do step(i) end
  local t0 = B.now()
  for i = 1, steps do step(i) end
  local rate = steps * batch / (B.now() - t0)
  B.result('train_' .. kind, rate, 'samples/s', 'higher',
           kind == 'mlp' and 'ratio >= 1.5' or 'ratio >= 1.2')
  B.result('rss_' .. kind, peak_rss_mb(), 'MB', 'lower', 'ratio >= 1')
end

return T

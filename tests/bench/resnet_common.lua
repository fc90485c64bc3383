--[[
resnet_common.lua -- the seed's 18-layer residual network for 32x32 inputs, shared by
bench_train_resnet.lua (CPU) and bench_cuda_train.lua (GPU): a 3x3 stem of 16
filters with batch norm, four stages of two basic blocks with 16, 32, 64 and 128
filters (stride 2 from the second stage on; a 1x1 projection with batch norm where
the shape changes), global average pooling and a 10-way linear layer. Its twin is
resnet_common.py. (Not a bench_*.lua file: run.sh runs only those.)
]]
local em = require 'ember'
local nn = em.nn

local R = {}

-- A basic block: two 3x3 convolutions with batch norm, and the shortcut.
local Block = nn.Module:extend('ResNetBlock')
function Block:init(cin, cout, stride)
  self.conv1 = nn.Conv2d(cin, cout, 3, { stride = stride, padding = 1, bias = false })
  self.bn1 = nn.BatchNorm2d(cout)
  self.conv2 = nn.Conv2d(cout, cout, 3, { padding = 1, bias = false })
  self.bn2 = nn.BatchNorm2d(cout)
  if stride ~= 1 or cin ~= cout then
    self.short = nn.Sequential(nn.Conv2d(cin, cout, 1, { stride = stride, bias = false }),
                               nn.BatchNorm2d(cout))
  end
end
function Block:forward(x)
  local y = self.bn1(self.conv1(x)):relu()
  y = self.bn2(self.conv2(y))
  return (y + (self.short and self.short(x) or x)):relu()
end

function R.resnet18()
  local layers = { nn.Conv2d(3, 16, 3, { padding = 1, bias = false }), nn.BatchNorm2d(16),
                   nn.ReLU() }
  local cin = 16
  for stage, cout in ipairs({ 16, 32, 64, 128 }) do
    for b = 1, 2 do
      layers[#layers + 1] = Block(cin, cout, (stage > 1 and b == 1) and 2 or 1)
      cin = cout
    end
  end
  layers[#layers + 1] = nn.AdaptiveAvgPool2d(1)
  layers[#layers + 1] = nn.Flatten()
  layers[#layers + 1] = nn.Linear(128, 10)
  return nn.Sequential((table.unpack or unpack)(layers))
end

-- The SGD of the seed's runs: momentum 0.9, weight decay 5e-4.
function R.sgd(model)
  return em.optim.SGD(model:parameters(), { lr = 0.1, momentum = 0.9, weight_decay = 5e-4 })
end

-- Whether this build has em.amp and channels-last (other work adds them; a bench
-- prints "skipped: ..." for the rows that need what is missing).
function R.has_amp()
  local ok, amp = pcall(function() return em.amp end)
  return ok and type(amp) == 'table' and type(amp.autocast) == 'function'
end
function R.has_channels_last()
  local ok, f = pcall(function() return em.zeros({ 1, 1, 1, 1 }).to_channels_last end)
  return ok and f ~= nil
end

return R

--[[
nhwc_cases.lua -- what the channels-last tests share (test_channels_last.lua on the
CPU, test_cuda_bn_nhwc.lua and test_cuda_channels_last.lua on cuda): comparing
tensors of any device, dtype and layout; leaves; and a small residual CNN trained
side by side, NCHW on the CPU (the reference) and channels last on a device,
counting the layout conversions of each step.
  local N = dofile(dir .. 'nhwc_cases.lua')
  local a, b = N.cnn_pair(3)                   -- b has a's weights
  local la, lb, conversions = N.step(a, opta, b, optb, x, t, xb, tb)
]]
local em = require 'ember'
local F, nn = em.nn.F, em.nn

local N = {}

-- The largest absolute difference of two tensors, whatever their device and layout.
function N.diff(a, b) return (a:cpu():double() - b:cpu():double()):abs():max():item() end
-- The same relative to a's largest magnitude (plus one, so that values near zero
-- compare absolutely).
function N.rel(a, b) return N.diff(a, b) / (a:cpu():double():abs():max():item() + 1) end
function N.cl(t) return t:to_channels_last() end
function N.leaf(t) return t:detach():requires_grad_(true) end
function N.half(dt) return dt == 'float16' or dt == 'bfloat16' end
function N.strides(t)
  local s = {}
  for d = 1, t:dim() do s[d] = t:stride(d) end
  return s
end

-- conv-BN-relu-pool-conv-BN-relu (+ residual) -adaptive pool-flatten-linear: every
-- op that must keep NHWC, and the flatten that must leave it.
function N.cnn()
  local m = {
    c1 = nn.Conv2d(3, 8, 3, { padding = 1 }), b1 = nn.BatchNorm2d(8),
    c2 = nn.Conv2d(8, 8, 3, { padding = 1 }), b2 = nn.BatchNorm2d(8),
    fc = nn.Linear(8 * 2 * 2, 5),
  }
  m.all = nn.Sequential(m.c1, m.b1, m.c2, m.b2, m.fc)
  function m.forward(x)
    local h = F.max_pool2d(m.b1(m.c1(x)):relu(), 2)
    local r = m.b2(m.c2(h)):relu() + h
    return m.fc(F.adaptive_avg_pool2d(r, { 2, 2 }):flatten(2))
  end
  return m
end

-- Two CNNs with the same weights (drawn after manual_seed(seed)): the caller moves
-- the second to its device and layout.
function N.cnn_pair(seed)
  em.manual_seed(seed)
  local a, b = N.cnn(), N.cnn()
  b.all:load_state_dict(a.all:state_dict())
  return a, b
end

-- One SGD step of each CNN on one batch: a on x (NCHW), b on xb converted to
-- channels last at its entry. Returns both losses and the layout conversions b's
-- step made (the entry's included).
function N.step(a, opta, b, optb, x, t, xb, tb)
  opta:zero_grad()
  local la = F.cross_entropy(a.forward(x), t)
  la:backward()
  opta:step()
  optb:zero_grad()
  local n0 = em.layout_conversions()
  local lb = F.cross_entropy(b.forward(N.cl(xb)), tb)
  lb:backward()
  optb:step()
  return la:item(), lb:item(), em.layout_conversions() - n0
end

return N

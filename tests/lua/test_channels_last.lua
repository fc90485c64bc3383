--[[
test_channels_last.lua -- channels-last (NHWC) tensors on the CPU: to_channels_last,
is_contiguous('channels_last'), contiguous(), Module:to{memory_format=}; conv,
pooling, batch norm and the element-wise ops keep an NHWC input's layout and agree
with the NCHW computation, forward and backward (gradients in the layout of the
tensor they are for); float64 finite differences through the NHWC conv path; and
the count of layout conversions in a training step of a small residual CNN.
]]
local dir = (arg and arg[0] and arg[0]:match('^(.*/)')) or
            ((os.getenv('EMBER_TESTS') or 'tests') .. '/lua/')
local H = dofile(dir .. 'harness.lua')
local em = require 'ember'
local F = em.nn.F
local N = dofile(dir .. 'nhwc_cases.lua')
local strides, diff, cl, leaf = N.strides, N.diff, N.cl, N.leaf

H.test('to_channels_last: strides, values, identity, is_contiguous', function()
  local x = em.randn(2, 3, 4, 5)
  local y = cl(x)
  H.eq(strides(y), { 60, 1, 15, 3 }, 'NHWC strides')
  H.eq(y.shape, { 2, 3, 4, 5 }, 'shape')
  H.eq(diff(x, y), 0, 'values')
  H.check(y:is_contiguous('channels_last') and not y:is_contiguous(), 'y is NHWC only')
  H.check(x:is_contiguous('contiguous_format') and not x:is_contiguous('channels_last'),
    'x is NCHW only')
  H.check(rawequal(cl(y), y), 'to_channels_last of an NHWC tensor is itself')
  local z = y:contiguous()
  H.eq(strides(z), { 60, 20, 5, 1 }, 'contiguous() of NHWC is NCHW')
  H.eq(diff(z, x), 0, 'contiguous values')
  -- a channel of one: strides as torch's (HW, 1, W, 1), still both layouts
  local o = cl(em.randn(2, 1, 3, 3))
  H.eq(strides(o), { 9, 1, 3, 1 }, 'C=1 NHWC strides')
  H.check(o:is_contiguous() and o:is_contiguous('channels_last'), 'C=1 is both')
  -- a strided (sliced) input converts as well
  local s = em.randn(2, 3, 8, 5):narrow(3, 2, 4)
  H.eq(diff(cl(s), s), 0, 'strided input values')
  local t = x:to{ memory_format = 'channels_last' }
  H.check(t:is_contiguous('channels_last'), 'to{memory_format=channels_last}')
  H.check(t:to{ memory_format = 'contiguous_format' }:is_contiguous(), 'to{contiguous_format}')
  H.check(x:to{ dtype = 'float64', memory_format = 'channels_last' }:is_contiguous('channels_last'),
    'to{dtype=, memory_format=}')
  H.raises(function() x:is_contiguous('nhwc') end, 'is_contiguous', 'nhwc')
  H.raises(function() em.randn(3, 4):to_channels_last() end, 'to_channels_last', '4 dims')
end)

-- f(x) on NCHW and on NHWC x (and gradients for a random grad_out); the NHWC
-- result and input gradient must be NHWC and agree with NCHW's.
local function same(name, f, x, tol, out_cl)
  tol = tol or 1e-5
  local a, b = leaf(x), leaf(cl(x))
  local ya, yb = f(a), f(b)
  H.check(yb:is_contiguous('channels_last') == (out_cl ~= false), name .. ': output layout')
  H.close(diff(ya, yb), 0, tol, name .. ': forward')
  local g = em.randn(unpack(ya.shape)):to(ya.dtype)
  ya:backward(g)
  yb:backward(cl(g))
  H.check(b.grad:is_contiguous('channels_last'), name .. ': grad layout')
  H.close(diff(a.grad, b.grad), 0, tol, name .. ': backward')
end

H.test('element-wise ops keep NHWC', function()
  local x = em.randn(2, 4, 5, 3)
  local bias = em.randn(4, 1, 1)
  same('relu', function(t) return t:relu() end, x)
  same('tanh', function(t) return t:tanh() end, x)
  same('exp', function(t) return t:exp() end, x)
  same('mul scalar', function(t) return t * 3 - 1 end, x)
  same('add (C,1,1)', function(t) return t + bias end, x)
  same('(C,1,1) first', function(t) return bias * t end, x)
  same('residual add', function(t) return t:relu() + t:sigmoid() end, x)
  same('gelu', function(t) return F.gelu(t) end, x)
  same('silu', function(t) return F.silu(t) end, x)
  -- a broadcast (1,C,1,1) bias gets its gradient summed correctly
  local bb = leaf(em.randn(1, 4, 1, 1))
  local bb2 = leaf(bb:detach())
  local xa = em.randn(2, 4, 5, 3)
  local la = ((xa + bb) * (xa + bb)):sum()
  la:backward()
  local lb = ((cl(xa) + bb2) * (cl(xa) + bb2)):sum()
  lb:backward()
  H.close(diff(bb.grad, bb2.grad), 0, 1e-5, 'broadcast operand gradient')
  -- dropout: the same mask pattern cannot be compared, but the layout and the
  -- zero/scaled values can
  local d = F.dropout(cl(em.ones(2, 4, 5, 3)), 0.5, true)
  H.check(d:is_contiguous('channels_last'), 'dropout keeps NHWC')
  local okv = true
  for _, v in ipairs(H.flat(d)) do okv = okv and (v == 0 or math.abs(v - 2) < 1e-6) end
  H.check(okv, 'dropout values are 0 or 1/(1-p)')
end)

H.test('pooling keeps NHWC', function()
  local x = em.randn(2, 5, 9, 8)
  same('max_pool2d 2', function(t) return F.max_pool2d(t, 2) end, x)
  same('max_pool2d 3 s2 p1 d2', function(t) return F.max_pool2d(t, 3, 2, 1, 2) end, x)
  same('max_pool2d ceil', function(t) return F.max_pool2d(t, 3, 2, 1, 1, true) end, x)
  same('avg_pool2d 3 s2 p1', function(t) return F.avg_pool2d(t, 3, 2, 1) end, x)
  same('avg_pool2d no pad count', function(t) return F.avg_pool2d(t, 3, 2, 1, false, false) end, x)
  same('adaptive 3x2', function(t) return F.adaptive_avg_pool2d(t, { 3, 2 }) end, x)
  same('adaptive 1x1', function(t) return F.adaptive_avg_pool2d(t, { 1, 1 }) end, x, nil, true)
  same('max_pool2d f64', function(t) return F.max_pool2d(t, 2) end, x:double(), 1e-12)
  -- an NCHW grad_out (as a flatten's backward gives) into an NHWC input's backward
  for _, f in ipairs({ function(t) return F.max_pool2d(t, 2) end,
                       function(t) return F.avg_pool2d(t, 3, 2, 1) end,
                       function(t) return F.adaptive_avg_pool2d(t, { 2, 3 }) end }) do
    local a, b = leaf(x), leaf(cl(x))
    local ya, yb = f(a), f(b)
    local g = em.randn(unpack(ya.shape))
    ya:backward(g)
    yb:backward(g)
    H.check(b.grad:is_contiguous('channels_last'), 'NCHW grad_out: NHWC gradient')
    H.close(diff(a.grad, b.grad), 0, 1e-5, 'NCHW grad_out: values')
  end
  -- a strided NHWC input (a slice of channels) works too
  local s = cl(em.randn(2, 8, 6, 6)):narrow(2, 2, 5)
  H.close(diff(F.max_pool2d(s, 2), F.max_pool2d(s:contiguous(), 2)), 0, 1e-6, 'strided input')
end)

H.test('batch norm keeps NHWC', function()
  local x = em.randn(3, 6, 5, 4) * 2 + 1
  local w, b = em.randn(6), em.randn(6)
  same('batch_norm train', function(t)
    return F.batch_norm(t, em.zeros(6), em.ones(6), w, b, true) end, x, 1e-4)
  local rm, rv = em.randn(6), em.rand(6) + 0.5
  same('batch_norm eval', function(t)
    return F.batch_norm(t, rm, rv, w, b, false) end, x, 1e-5)
  same('batch_norm f64 train', function(t)
    return F.batch_norm(t, nil, nil, w:double(), b:double(), true) end, x:double(), 1e-10)
  -- running statistics move the same way
  local rm1, rv1, rm2, rv2 = em.zeros(6), em.ones(6), em.zeros(6), em.ones(6)
  F.batch_norm(x, rm1, rv1, nil, nil, true)
  F.batch_norm(cl(x), rm2, rv2, nil, nil, true)
  H.close(diff(rm1, rm2) + diff(rv1, rv2), 0, 1e-5, 'running statistics')
  -- weight and bias gradients
  local wa, ba, wb, bb = leaf(w), leaf(b), leaf(w), leaf(b)
  F.batch_norm(x, nil, nil, wa, ba, true):pow(2):sum():backward()
  F.batch_norm(cl(x), nil, nil, wb, bb, true):pow(2):sum():backward()
  H.close(diff(wa.grad, wb.grad) + diff(ba.grad, bb.grad), 0, 1e-3, 'weight/bias grads')
end)

-- Shapes whose channels-last reductions split the rows among several tasks (and
-- C = 130: several 64-channel slices per row), against NCHW's per-channel loops.
H.test('batch norm NHWC, rows split among tasks: NCHW values, same bits each run', function()
  for _, shape in ipairs({ { 16, 40, 12, 12 }, { 4, 130, 9, 9 }, { 64, 16, 8, 8 } }) do
    em.manual_seed(shape[2])
    local C = shape[2]
    for _, dt in ipairs({ 'float64', 'float32' }) do
      local tol = dt == 'float64' and 1e-10 or 1e-4
      local x = (em.randn(unpack(shape)) * 3 + 2):to(dt)
      local w, b, gy = em.randn(C):to(dt), em.randn(C):to(dt), em.randn(unpack(shape)):to(dt)
      local function run(t)
        local xi, wi, bi = leaf(t), leaf(w), leaf(b)
        local rm, rv = em.zeros(C):to(dt), em.ones(C):to(dt)
        local y = F.batch_norm(xi, rm, rv, wi, bi, true, 0.1, 1e-5)
        y:backward(gy)
        return y, xi.grad, wi.grad, bi.grad, rm, rv
      end
      local ref, got, again = { run(x) }, { run(cl(x)) }, { run(cl(x)) }
      local what = table.concat(shape, ',') .. ' ' .. dt
      H.check(got[1]:is_contiguous('channels_last'), what .. ': output NHWC')
      local names = { 'y', 'gx', 'gw', 'gb', 'running_mean', 'running_var' }
      for i = 1, 6 do
        local scale = ref[i]:double():abs():max():item() + 1
        H.close(diff(got[i], ref[i]) / scale, 0, tol, what .. ': ' .. names[i])
        H.eq(diff(got[i], again[i]), 0, what .. ': ' .. names[i] .. ' same bits run to run')
      end
    end
  end
end)

local conv_cases = {
  { 'plain 3x3', 4, 6, 3, {} },
  { 'stride 2 pad 1', 4, 6, 3, { 2, 1, 1, 1 } },
  { 'dilation 2 pad 2', 3, 5, 3, { 1, 2, 2, 1 } },
  { 'groups 2', 4, 6, 3, { 1, 1, 1, 2 } },
  { 'depthwise', 4, 4, 3, { 1, 1, 1, 4 } },
  { '1x1', 5, 7, 1, {} },
  { '1x1 groups', 4, 6, 1, { 1, 0, 1, 2 } },
  { 'one input channel', 1, 4, 3, { 1, 1, 1, 1 } },
  { '5x5 stride 3', 3, 4, 5, { 3, 2, 1, 1 } },
}

H.test('conv2d keeps NHWC (input, weight, bias gradients)', function()
  for _, c in ipairs(conv_cases) do
    local name, Ci, O, k, o = c[1], c[2], c[3], c[4], c[5]
    local s, p, d, g = o[1] or 1, o[2] or 0, o[3] or 1, o[4] or 1
    for _, dt in ipairs({ 'float32', 'float64' }) do
      local tol = dt == 'float32' and 1e-4 or 1e-11
      local x = em.randn(3, Ci, 9, 8):to(dt)
      local w, b = em.randn(O, Ci / g, k, k):to(dt), em.randn(O):to(dt)
      local xa, wa, ba = leaf(x), leaf(w), leaf(b)
      local xb, wb, bb = leaf(cl(x)), leaf(cl(w)), leaf(b)
      local ya = F.conv2d(xa, wa, ba, s, p, d, g)
      local yb = F.conv2d(xb, wb, bb, s, p, d, g)
      local nm = name .. ' ' .. dt
      H.check(yb:is_contiguous('channels_last'), nm .. ': output NHWC')
      H.close(diff(ya, yb), 0, tol, nm .. ': forward')
      local gy = em.randn(unpack(ya.shape)):to(dt)
      ya:backward(gy)
      yb:backward(cl(gy))
      H.close(diff(xa.grad, xb.grad), 0, tol, nm .. ': grad input')
      H.close(diff(wa.grad, wb.grad), 0, tol * 10, nm .. ': grad weight')
      H.close(diff(ba.grad, bb.grad), 0, tol * 10, nm .. ': grad bias')
      H.check(xb.grad:is_contiguous('channels_last') and wb.grad:is_contiguous('channels_last'),
        nm .. ': gradients NHWC')
    end
  end
  -- NHWC input with an NCHW weight: NHWC output, the weight's gradient in NCHW
  local x, w = em.randn(2, 4, 6, 6), leaf(em.randn(5, 4, 3, 3))
  local y = F.conv2d(cl(x), w, nil, 1, 1)
  H.check(y:is_contiguous('channels_last'), 'NHWC input, NCHW weight: NHWC output')
  H.close(diff(y, F.conv2d(x, w:detach(), nil, 1, 1)), 0, 1e-4, 'mixed layouts forward')
  y:sum():backward()
  H.check(w.grad:is_contiguous() and not w.grad:is_contiguous('channels_last'),
    'the weight gradient in the weight layout')
  -- a strided (sliced) NHWC input
  local xs = cl(em.randn(2, 6, 7, 7)):narrow(2, 2, 4)
  H.close(diff(F.conv2d(xs, w:detach(), nil, 1, 1), F.conv2d(xs:contiguous(), w:detach(), nil, 1, 1)),
    0, 1e-4, 'strided NHWC input')
end)

H.test('conv2d NHWC float64 finite differences', function()
  local cases = { { 1, 1, 1, 1 }, { 2, 1, 2, 1 }, { 1, 2, 1, 2 } }
  for _, o in ipairs(cases) do
    local s, p, d, g = o[1], o[2], o[3], o[4]
    local x = leaf(cl(em.randn(2, 4, 5, 5):double()))
    local w = leaf(cl(em.randn(4, 4 / g, 3, 3):double()))
    local b = leaf(em.randn(4):double())
    local ok = em.autograd.gradcheck(function(a, ww, bb)
      local y = F.conv2d(a, ww, bb, s, p, d, g)
      assert(y:is_contiguous('channels_last'))
      return y
    end, { x, w, b })
    H.check(ok, ('gradcheck stride %d pad %d dil %d groups %d'):format(s, p, d, g))
  end
end)

H.test('Module:to{memory_format} and conversions per training step', function()
  local a, b = N.cnn_pair(3)
  local pa = b.all:parameters()
  local w1 = b.c1.weight
  local opt = em.optim.SGD(b.all:parameters(), { lr = 0.1, momentum = 0.9 })
  local opta = em.optim.SGD(a.all:parameters(), { lr = 0.1, momentum = 0.9 })
  b.all:to{ memory_format = 'channels_last' }
  H.check(rawequal(b.c1.weight, w1), 'parameters keep their identity')
  H.check(b.c1.weight:is_contiguous('channels_last'), 'conv weight is NHWC')
  H.check(b.fc.weight:is_contiguous(), 'linear weight unchanged')
  H.eq(#b.all:parameters(), #pa, 'same parameters')
  local x, t = em.randn(4, 3, 8, 8), em.tensor({ 1, 2, 3, 4 }):long()
  for step = 1, 2 do
    local la, lb, n = N.step(a, opta, b, opt, x, t, x, t)
    H.check(n <= 2, ('step %d: %d layout conversions (at most entry + flatten)'):format(step, n))
    H.close(la, lb, 1e-4, 'step ' .. step .. ' loss')
  end
  H.close(diff(a.c1.weight, b.c1.weight), 0, 1e-4, 'weights after two steps')
  H.check(b.c1.weight:is_contiguous('channels_last'), 'weights stay NHWC through SGD')
end)

H.test('profiler names conversions convert_layout', function()
  if not em.profile or not em.profile.start then return H.skip('no profiler') end
  em.profile.start{}
  local x = em.randn(2, 3, 4, 4)
  local y = cl(x):contiguous()
  local r = em.profile.stop()
  local found = false
  for _, row in ipairs(r.ops or {}) do
    if row.name == 'convert_layout' or row.op == 'convert_layout' then found = true end
  end
  H.check(found or tostring(r):find('convert_layout') ~= nil, 'convert_layout in the report')
  -- the profiled conversions ran: NHWC and back gives the NCHW input's values
  H.check(y:is_contiguous(), 'converted back to NCHW')
  H.eq(diff(y, x), 0, 'values after NHWC and back')
end)

H.done()

--[[
test_cuda_channels_last.lua -- channels-last tensors on the CUDA backend (the
emulated runtime, EMBER_CUDA_EMULATE=2:64; the test runs itself again with it
otherwise): conv, pooling, batch norm and element-wise ops on NHWC cuda tensors
keep the layout and agree with the CPU, forward and backward. Conv (cuDNN's NHWC
descriptors; the CPU's NHWC conv on the emulator) and pooling (k_pool.cu) run
channels last natively in every floating dtype: em.layout_conversions() does not
move inside them, forward or backward (batch norm likewise: test_cuda_bn_nhwc.lua).
]]
local dir = (arg and arg[0] and arg[0]:match('^(.*/)')) or
            ((os.getenv('EMBER_TESTS') or 'tests') .. '/lua/')
local H, em = dofile(dir .. 'cuda_emulated.lua')('2:64')
local F = em.nn.F
local N = dofile(dir .. 'nhwc_cases.lua')
local diff, cl, leaf = N.diff, N.cl, N.leaf

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

local dtypes = {
  { 'float32', 1e-4 }, { 'float64', 1e-10 }, { 'float16', 3e-2 }, { 'bfloat16', 2e-1 },
}

-- f on the CPU (NCHW, float64 reference in dt's values) and on cuda (NHWC, dt):
-- close values, NHWC results and gradients, and no layout conversion inside f or
-- its backward. xs: the inputs (NCHW CPU tensors); gy_nchw: hand cuda an NCHW
-- output gradient (as a flatten's backward does).
local function native(name, f, xs, dt, tol, gy_nchw)
  local a, b = {}, {}
  for i, x in ipairs(xs) do
    local v = x:to(dt):double()            -- the values dt can hold, on both sides
    a[i] = leaf(v)
    b[i] = leaf(cl(v:cuda():to(dt)))
  end
  local ya = f(unpack(a))
  local g = em.randn(unpack(ya.shape)):to(dt):double()
  local gb = gy_nchw and g:cuda():to(dt) or cl(g:cuda():to(dt))
  local c0 = em.layout_conversions()
  local yb = f(unpack(b))
  yb:backward(gb)
  H.eq(em.layout_conversions() - c0, 0, name .. ': no conversion inside, forward or backward')
  H.check(yb:is_contiguous('channels_last') and yb.dtype == dt, name .. ': output NHWC ' .. dt)
  ya:backward(g)
  local scale = ya:abs():max():item() + 1
  H.close(diff(ya, yb) / scale, 0, tol, name .. ': forward')
  for i = 1, #xs do
    H.check(b[i].grad:is_contiguous('channels_last'), name .. ': grad ' .. i .. ' NHWC')
    local gs = a[i].grad:abs():max():item() + 1
    H.close(diff(a[i].grad, b[i].grad) / gs, 0, tol, name .. ': grad ' .. i)
  end
end

H.test('conv2d on cuda runs NHWC natively, every dtype', function()
  local cases = {   -- C, O, k, stride, padding, dilation, groups
    { 4, 6, 3, 1, 1, 1, 1 }, { 4, 6, 3, 2, 0, 2, 1 }, { 4, 6, 3, { 2, 1 }, { 1, 0 }, 1, 2 },
    { 6, 6, 1, 1, 0, 1, 3 },
  }
  for _, d in ipairs(dtypes) do
    for _, c in ipairs(cases) do
      local x, w = em.randn(2, c[1], 9, 7), em.randn(c[2], c[1] / c[7], c[3], c[3])
      local name = ('conv2d C%d O%d k%d g%d %s'):format(c[1], c[2], c[3], c[7], d[1])
      native(name, function(t, k) return F.conv2d(t, k, nil, c[4], c[5], c[6], c[7]) end,
             { x, w }, d[1], d[2])
    end
    -- with a bias (its gradient is a plain vector)
    local x, w, bias = em.randn(2, 4, 6, 6), em.randn(5, 4, 3, 3), em.randn(5)
    local ba, bb = leaf(bias:to(d[1]):double()), leaf(bias:cuda():to(d[1]))
    native('conv2d bias ' .. d[1], function(t, k)
      return F.conv2d(t, k, t.is_cuda and bb or ba, 1, 1) end, { x, w }, d[1], d[2])
    H.close(diff(ba.grad, bb.grad) / (ba.grad:abs():max():item() + 1), 0, d[2],
            'conv2d bias grad ' .. d[1])
  end
end)

H.test('pooling on cuda runs NHWC natively, every dtype', function()
  for _, d in ipairs(dtypes) do
    local x = em.randn(2, 5, 9, 8)
    local ops = {
      { 'max_pool2d 2', function(t) return F.max_pool2d(t, 2) end },
      { 'max_pool2d 3/2 pad 1 ceil', function(t) return F.max_pool2d(t, 3, 2, 1, 1, true) end },
      { 'max_pool2d dilated', function(t) return F.max_pool2d(t, 2, 1, 0, 2) end },
      { 'avg_pool2d 3/2 pad 1', function(t) return F.avg_pool2d(t, 3, 2, 1) end },
      { 'avg_pool2d ceil no pad count', function(t)
          return F.avg_pool2d(t, 3, 2, 1, true, false) end },
      { 'avg_pool2d {2,3}/{1,2}', function(t) return F.avg_pool2d(t, { 2, 3 }, { 1, 2 }) end },
      { 'adaptive 3x5', function(t) return F.adaptive_avg_pool2d(t, { 3, 5 }) end },
      { 'adaptive 1x1', function(t) return F.adaptive_avg_pool2d(t, { 1, 1 }) end },
      { 'adaptive 4x3', function(t) return F.adaptive_avg_pool2d(t, { 4, 3 }) end },
    }
    for _, o in ipairs(ops) do
      native(o[1] .. ' ' .. d[1], o[2], { x }, d[1], d[2])
      native(o[1] .. ' NCHW grad ' .. d[1], o[2], { x }, d[1], d[2], true)
    end
  end
end)

H.test('pooling on cuda: NHWC bit for bit as NCHW', function()
  -- the same kernels' two layouts sum in the same order: identical values
  for _, dt in ipairs({ 'float32', 'float16', 'bfloat16' }) do
    local x = em.randn(3, 4, 7, 9):cuda():to(dt)
    local fs = {
      function(t) return F.max_pool2d(t, 3, 2, 1) end,
      function(t) return F.avg_pool2d(t, 3, 1, 1) end,
      function(t) return F.adaptive_avg_pool2d(t, { 3, 4 }) end,
    }
    for i, f in ipairs(fs) do
      local a, b = leaf(x), leaf(cl(x))
      local ya, yb = f(a), f(b)
      local g = em.randn(unpack(ya.shape)):cuda():to(dt)
      ya:backward(g)
      yb:backward(cl(g))
      H.eq(diff(ya, yb), 0, 'pool ' .. i .. ' ' .. dt .. ': forward')
      H.eq(diff(a.grad, b.grad), 0, 'pool ' .. i .. ' ' .. dt .. ': backward')
    end
  end
end)

H.done()

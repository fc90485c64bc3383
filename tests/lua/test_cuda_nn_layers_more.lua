--[[
test_cuda_nn_layers_more.lua -- the layers of test_nn_layers_more.lua on `cuda`
(the emulated runtime, EMBER_CUDA_EMULATE=2:64; the test runs itself again with it
otherwise) against the CPU: scaled_dot_product_attention (the composed path on
cuda, the fused kernel on the CPU) with masks and causal, MultiheadAttention,
RMSNorm, GroupNorm, Conv1d and F.pad, forward and the gradients of every leaf.
]]
local dir = (arg and arg[0] and arg[0]:match('^(.*/)')) or
            ((os.getenv('EMBER_TESTS') or 'tests') .. '/lua/')
local H, em = dofile(dir .. 'cuda_emulated.lua')('2:64')
local nn, F = em.nn, em.nn.F

-- fn(inputs...) on cpu and on cuda from the same float64 leaves; outputs and the
-- leaves' gradients compared.
local function check(what, fn, inputs, tol)
  tol = tol or 1e-10
  local res = {}
  for d, dev in ipairs({ 'cpu', 'cuda' }) do
    local leaves = {}
    for i, x in ipairs(inputs) do leaves[i] = x:detach():to(dev):requires_grad_() end
    local y = fn(dev, unpack(leaves))
    em.manual_seed(1)
    local w = em.randn(y.shape, { dtype = 'float64' }):to(dev)
    local loss = (y * w):sum()
    loss:backward()
    res[d] = { y = y:cpu(), g = {} }
    for i, l in ipairs(leaves) do res[d].g[i] = l.grad and l.grad:cpu() end
  end
  H.check(H.maxrel(res[2].y, res[1].y) < tol, what .. ': output ' .. H.maxrel(res[2].y, res[1].y))
  for i = 1, #inputs do
    if res[1].g[i] then
      local e = H.maxrel(res[2].g[i], res[1].g[i])
      H.check(e < tol, what .. ': grad ' .. i .. ' ' .. e)
    end
  end
end

local D = { dtype = 'float64' }
em.manual_seed(3)

H.test('scaled_dot_product_attention on cuda equals the CPU kernel', function()
  local q, k, v = em.randn({ 2, 3, 70, 8 }, D), em.randn({ 2, 3, 66, 8 }, D), em.randn({ 2, 3, 66, 5 }, D)
  check('plain', function(_, a, b, c) return F.scaled_dot_product_attention(a, b, c) end, { q, k, v })
  check('causal', function(_, a, b, c)
    return F.scaled_dot_product_attention(a, b, c, { causal = true, scale = 0.4 }) end, { q, k, v })
  local m = em.rand({ 70, 66 }):gt(0.3)
  m:narrow(2, 1, 1):fill_(1)
  check('bool mask', function(dev, a, b, c)
    return F.scaled_dot_product_attention(a, b, c, { mask = m:to(dev) }) end, { q, k, v })
  check('strided q', function(_, a, b, c)
    return F.scaled_dot_product_attention(a:transpose(3, 4):contiguous():transpose(3, 4), b, c) end, { q, k, v })
end)

H.test('MultiheadAttention, RMSNorm, GroupNorm, Conv1d, pad on cuda', function()
  local mha = nn.MultiheadAttention(8, 2, { dtype = 'float64' })
  local sd = mha:state_dict()
  local cuda_mha = nn.MultiheadAttention(8, 2, { dtype = 'float64' }):to('cuda')
  cuda_mha:load_state_dict(sd)
  check('mha', function(dev, x)
    local m = dev == 'cpu' and mha or cuda_mha
    return (m(x, x, x)) end, { em.randn({ 5, 2, 8 }, D) })
  check('rms_norm', function(_, x, w) return F.rms_norm(x, { 6 }, w) end, { em.randn({ 3, 6 }, D), em.randn({ 6 }, D) })
  check('group_norm', function(_, x, w, b) return F.group_norm(x, 2, w, b) end,
    { em.randn({ 2, 4, 5 }, D), em.randn({ 4 }, D), em.randn({ 4 }, D) })
  check('conv1d', function(_, x, w, b) return F.conv1d(x, w, b, 2, 1, 2, 2) end,
    { em.randn({ 2, 4, 11 }, D), em.randn({ 6, 2, 3 }, D), em.randn({ 6 }, D) })
  for _, mode in ipairs({ 'constant', 'reflect', 'replicate', 'circular' }) do
    check('pad ' .. mode, function(_, x) return F.pad(x, { 2, 1, 1, 2 }, { mode = mode, value = 0.5 }) end,
      { em.randn({ 2, 3, 4 }, D) })
  end
end)

H.done()

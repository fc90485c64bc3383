--[[
test_checkpoint_act.lua -- custom autograd functions (em.autograd.apply) and
activation checkpointing (em.nn.checkpoint, em.nn.Checkpoint): the same
gradients as without checkpointing (bitwise on the CPU, dropout masks
replayed), parameters reached when no input requires grad, several results,
nesting, gradcheck through a checkpoint, the errors, lower peak memory on a deep
MLP, on an emulated cuda device, and inside a model wrapped on 2 replicas.
]]
local dir = (arg and arg[0] and arg[0]:match('^(.*/)')) or
            ((os.getenv('EMBER_TESTS') or 'tests') .. '/lua/')
local H = dofile(dir .. 'harness.lua')
local em = require 'ember'
local nn, F = em.nn, em.nn.F
local ember = arg[-1] or 'ember'

-- Equal shapes and values (exactly: no tolerance).
local function equal(a, b)
  local sa, sb = a.shape, b.shape
  if #sa ~= #sb then return false end
  for d = 1, #sa do if sa[d] ~= sb[d] then return false end end
  return a:numel() == 0 or (a:double() - b:double()):abs():max():item() == 0
end
local function grads(params)
  local g = {}
  for i, p in ipairs(params) do g[i] = p.grad and p.grad:clone() or false end
  return g
end
local function zero(params) for _, p in ipairs(params) do p.grad = nil end end

H.test('autograd.apply: a custom backward, nil gradients, errors with their message', function()
  local x = em.tensor({ 1, 2, 3 }, { dtype = 'float64' }):requires_grad_()
  local c = em.tensor({ 4, 5, 6 }, { dtype = 'float64' })
  local h = x * 2                               -- a non-leaf input
  local v = em.no_grad(function() return x * h end)
  local y = em.autograd.apply('prod', v, { x, h, c }, function(g)
    return { g * h:detach(), g * x:detach(), nil }
  end)
  H.check(y.requires_grad and not y.is_leaf)
  H.check(equal(y, v), 'the value')
  y:sum():backward()
  H.eq(x.grad:totable(), { 4, 8, 12 })         -- d(2x^2)/dx
  H.check(c.grad == nil)
  -- a single tensor may stand for a one-element table
  x.grad = nil
  em.autograd.apply('sq', v, { x }, function(g) return g * 4 * x:detach() end):sum():backward()
  H.eq(x.grad:totable(), { 4, 8, 12 })
  -- no input requiring grad, or grad mode off: a plain result
  H.check(not em.autograd.apply('f', v, { c }, function() end).requires_grad)
  em.no_grad(function()
    H.check(not em.autograd.apply('f', v, { x }, function() end).requires_grad)
  end)
  local z = em.autograd.apply('boom', v, { x }, function() error('custom failure 42') end)
  H.raises(function() z:sum():backward() end, 'custom failure 42')
  z = em.autograd.apply('wrong', v, { x }, function() return 'no' end)
  H.raises(function() z:sum():backward() end, 'wrong', 'table of gradients', 'string')
  z = em.autograd.apply('shape', v, { x }, function() return { em.ones(2, 2):double() } end)
  H.raises(function() z:sum():backward() end, 'shape', '[2,2]', '[3]')
  H.raises(function() em.autograd.apply('f', v, { 3 }, function() end) end, 'input 1', 'number')
  H.raises(function() em.autograd.apply('f', 'v', { x }, function() end) end, 'value')
  -- a failed backward leaves leaf counts balanced: the next one is whole
  x.grad = nil
  y = em.autograd.apply('prod', v, { x, h }, function(g) return { g * h:detach(), g * x:detach() } end)
  y:sum():backward()
  H.eq(x.grad:totable(), { 4, 8, 12 })
  -- many functions: their records are freed with the nodes (swept), nothing breaks
  for _ = 1, 3000 do
    em.autograd.apply('loop', v, { x }, function(g) return { g } end)
  end
  collectgarbage(); collectgarbage()
  x.grad = nil
  em.autograd.apply('last', v, { x }, function(g) return { g * 3 } end):sum():backward()
  H.eq(x.grad:totable(), { 3, 3, 3 })
end)

H.test('backward_capture returns gradients instead of accumulating them', function()
  local x = em.tensor({ 1, 2 }, { dtype = 'float64' }):requires_grad_()
  local w = em.tensor({ 3, 5 }, { dtype = 'float64' }):requires_grad_()
  local g = em.autograd.backward_capture((x * w):sum(), nil, { x })
  H.eq(g[1]:totable(), { 3, 5 })
  H.check(x.grad == nil, 'x untouched')
  H.eq(w.grad:totable(), { 1, 2 })
end)

-- An MLP block with dropout; training mode.
local function block(w)
  return nn.Sequential(nn.Linear(w, w), nn.GELU(), nn.Dropout(0.2), nn.Linear(w, w), nn.Tanh())
end

H.test('em.nn.Checkpoint keeps parameter names: a state_dict loads both ways', function()
  em.manual_seed(5)
  local plain = nn.Sequential(nn.Linear(4, 8), nn.Sequential(nn.Linear(8, 8), nn.ReLU()),
                              nn.Linear(8, 2))
  local ck = nn.Sequential(nn.Linear(4, 8), nn.Checkpoint(nn.Sequential(nn.Linear(8, 8),
                           nn.ReLU())), nn.Linear(8, 2))
  local a, b = {}, {}
  for _, np in ipairs(plain:named_parameters()) do a[#a + 1] = np[1] end
  for _, np in ipairs(ck:named_parameters()) do b[#b + 1] = np[1] end
  H.eq(table.concat(b, ' '), table.concat(a, ' '), 'the same names')
  ck:load_state_dict(plain:state_dict())
  local x = em.randn(3, 4)
  H.eq(ck(x):totable(), plain(x):totable(), 'the plain weights loaded into the checkpointed model')
  em.manual_seed(6)
  local other = nn.Sequential(nn.Linear(4, 8), nn.Checkpoint(nn.Sequential(nn.Linear(8, 8),
                              nn.ReLU())), nn.Linear(8, 2))
  plain:load_state_dict(other:state_dict())
  H.eq(plain(x):totable(), other(x):totable(), 'and the checkpointed weights into the plain one')
end)

H.test('checkpoint: bitwise the same outputs, gradients and RNG stream (dropout replayed)', function()
  em.manual_seed(1)
  local plain = nn.Sequential(block(8), block(8), nn.Linear(8, 3))
  em.manual_seed(1)
  local b1, b2 = block(8), block(8)
  local ck = nn.Sequential(nn.Checkpoint(b1), nn.Checkpoint(b2), nn.Linear(8, 3))
  local x = em.randn(5, 8)
  -- strided input requiring grad
  local xs = em.randn(8, 5):t():requires_grad_()
  for _, input in ipairs({ x, xs }) do
    zero(plain:parameters()); zero(ck:parameters())
    if input.requires_grad then input.grad = nil end
    em.manual_seed(42)
    local a = plain(input)
    a:pow(2):sum():backward()
    local after_plain = em.rand(3)
    local ga = grads(plain:parameters())
    local gin = input.grad and input.grad:clone()
    if input.requires_grad then input.grad = nil end
    em.manual_seed(42)
    local b = ck(input)
    b:pow(2):sum():backward()
    local after_ck = em.rand(3)
    H.check(equal(a, b), 'outputs')
    local gb = grads(ck:parameters())
    H.eq(#gb, #ga)
    for i = 1, #ga do H.check(ga[i] and gb[i] and equal(ga[i], gb[i]), 'grad of parameter ' .. i) end
    if gin then H.check(equal(gin, input.grad), 'input grad') end
    H.check(equal(after_plain, after_ck), 'the RNG goes on as without checkpointing')
  end
end)

H.test('checkpoint: parameters get gradients when no input requires grad; results pass through', function()
  local lin = nn.Linear(4, 4)
  local x = em.randn(3, 4)
  local function f(t, k)
    local y = lin(t)
    return y:relu(), k, y:sum(1), em.argmax(y, 2)
  end
  local r1, k, r3, idx = nn.checkpoint(f, x, 'kept')
  H.eq(k, 'kept')
  H.check(r1.requires_grad and r3.requires_grad and not idx.requires_grad)
  H.eq(r1.shape, { 3, 4 }); H.eq(r3.shape, { 4 })
  ;(r1:sum() + r3:pow(2):sum()):backward()
  local gw, gb = lin.weight.grad:clone(), lin.bias.grad:clone()
  zero(lin:parameters())
  local p1, _, p3 = f(x, 'kept')
  ;(p1:sum() + p3:pow(2):sum()):backward()
  H.check(equal(gw, lin.weight.grad) and equal(gb, lin.bias.grad), 'same gradients')
  -- grad mode off: just fn
  em.no_grad(function()
    local y = nn.checkpoint(f, x, 1)
    H.check(not y.requires_grad)
  end)
end)

H.test('checkpoint: nested, and gradcheck through it (float64)', function()
  local w1 = em.randn(3, 3, { dtype = 'float64' }):requires_grad_()
  local w2 = em.randn(3, 3, { dtype = 'float64' }):requires_grad_()
  local function inner(t) return (t:matmul(w2)):sin() end
  local function outer(t) return nn.checkpoint(inner, (t:matmul(w1)):tanh()) * t end
  local x = em.randn(2, 3, { dtype = 'float64' }):requires_grad_()
  outer(x):sum():backward()
  local g = grads({ x, w1, w2 })
  zero({ x, w1, w2 })
  nn.checkpoint(outer, x):sum():backward()
  local h = grads({ x, w1, w2 })
  for i = 1, 3 do H.check(equal(g[i], h[i]), 'nested: gradient ' .. i) end
  H.check(em.autograd.gradcheck(function(a, b) return nn.checkpoint(outer, a) + b end,
    { x, em.randn(2, 3, { dtype = 'float64' }):requires_grad_() }))
  -- parameters reached only through the probe are checked too: a function of w1
  H.check(em.autograd.gradcheck(function(w)
    return nn.checkpoint(function(t) return t:matmul(w):exp() end, x:detach())
  end, { w1 }))
end)

H.test('checkpoint: errors', function()
  local x = em.randn(2, 2):requires_grad_()
  local hidden = x * 3       -- a non-leaf the function reads without taking it
  H.raises(function() nn.checkpoint(function(t) return t + hidden end, x) end,
    'checkpoint', 'not a leaf', 'pass it to checkpoint as an argument')
  H.raises(function() nn.checkpoint(42) end, 'checkpoint', 'expected a function')
  H.raises(function() nn.checkpoint(function() error('inside fn') end, x) end, 'inside fn')
  H.check(em.is_grad_enabled(), 'grad mode restored after an error')
  local n = 0
  local y = nn.checkpoint(function(t) n = n + 1; return t:narrow(1, 1, n) end, x)
  H.raises(function() y:sum():backward() end, 'recomputed forward')
  H.raises(function() nn.Checkpoint(3) end, 'Checkpoint', 'expected a module')
  -- its inputs go with the first backward, as saved tensors do
  y = nn.checkpoint(function(t) return t * 2 end, x)
  local loss = y:sum() * 1
  y:sum():backward()
  H.raises(function() loss:backward() end, 'second time')
end)

H.test('checkpoint: a 16-layer MLP peaks lower', function()
  local W, B = 64, 16384            -- 4 MiB activations, small weights
  em.manual_seed(0)
  local layers = {}
  for i = 1, 16 do layers[i] = nn.Sequential(nn.Linear(W, W), nn.ReLU()) end
  local x = em.randn(B, W)
  local function run(ckpt)
    for _, l in ipairs(layers) do zero(l:parameters()) end
    collectgarbage(); collectgarbage()
    em.reset_peak_memory_stats()
    local base = em.memory_stats('cpu').allocated
    local h = x
    for i = 1, 16, 2 do      -- blocks of two layers
      local a, b = layers[i], layers[i + 1]
      local f = function(t) return b(a(t)) end
      if ckpt then h = nn.checkpoint(f, h) else h = f(h) end
    end
    h:mean():backward()
    return em.memory_stats('cpu').peak - base, grads(layers[1]:parameters())
  end
  local plain, g1 = run(false)
  local ck, g2 = run(true)
  H.check(equal(g1[1], g2[1]), 'same first-layer gradient')
  H.check(ck < 0.6 * plain, ('peak %.1f MiB with checkpointing vs %.1f MiB without')
    :format(ck / 2 ^ 20, plain / 2 ^ 20))
end)

-- The gradients a checkpoint's backward makes go to the core, which adds them
-- into .grad and frees them: none is left for Lua's collector. So a backward
-- that accumulates through three checkpointed 4 MiB layers holds, beyond the
-- weights and their gradients, the new gradient and the transients of one layer
-- (about 1 weight's bytes alone, 2.2 after this file's other tests); left to the
-- collector, every layer's gradient stays (3 more).
H.test('checkpoint: its gradients leave no garbage behind', function()
  em.manual_seed(3)
  local m = nn.Sequential { nn.Checkpoint(nn.Linear(1024, 1024)),
    nn.Checkpoint(nn.Linear(1024, 1024)), nn.Checkpoint(nn.Linear(1024, 1024)) }
  local x = em.randn(4, 1024)
  m:zero_grad()
  m(x):sum():backward()
  em.collect()
  em.reset_peak_memory_stats()
  m(x):sum():backward()                        -- accumulates into .grad
  local W, one = 3 * (1024 * 1024 + 1024) * 4, 1024 * 1024 * 4
  local over = (em.memory_stats().peak - 2 * W) / one
  H.check(over <= 3, ('the accumulating backward held %.2f weights\' gradients beyond the ' ..
    'weights and their gradients'):format(over))
end)

H.test('checkpoint on a cuda device (emulated)', function()
  local p = io.popen(('EMBER_CUDA_EMULATE=1:256 %s %sdist/checkpoint_cuda.lua 2>&1'):format(ember, dir))
  local out = p:read('*a')
  p:close()
  local d, n, dev = out:match('cuda maxdiff (%S+) params (%d+) device (%S+)')
  H.check(d ~= nil, 'output: ' .. out)
  H.eq(tonumber(d), 0)
  H.eq(tonumber(n), 4)
  H.eq(dev, 'cuda:0')
end)

H.test('checkpoint inside a model wrapped on 2 replicas', function()
  local p = io.popen(('%s --replicas 2 %sdist/checkpoint_act.lua 2>&1; echo "exit=$?"')
    :format(ember, dir))
  local out = p:read('*a')
  p:close()
  H.check(out:match('exit=0'), 'exit status: ' .. out)
  local ranks = 0
  for r, same_d, glob in out:gmatch('rank (%d) same_as_plain_wrap (%S+) vs_global (%S+)') do
    ranks = ranks + 1
    H.eq(tonumber(same_d), 0, 'rank ' .. r .. ': as the plain wrapped model')
    H.check(tonumber(glob) < 1e-12, 'rank ' .. r .. ': as one model on the global batch: ' .. glob)
  end
  H.eq(ranks, 2)
end)

H.done()

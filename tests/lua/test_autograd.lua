--[[
test_autograd.lua -- autograd from Lua: gradcheck (float64 central differences vs
the analytic Jacobian) for every differentiable op with contiguous, strided
(transposed / narrowed) and broadcast inputs; accumulation, no_grad, detach,
t.grad assignment, and the error cases.
]]
local dir = (arg and arg[0] and arg[0]:match('^(.*/)')) or
            ((os.getenv('EMBER_TESTS') or 'tests') .. '/lua/')
local H = dofile(dir .. 'harness.lua')
local em = require 'ember'
local gc = em.autograd.gradcheck

em.manual_seed(7)
local F64 = { dtype = 'float64' }
local function leaf(t) return t:requires_grad_() end
local function randn(...) return leaf(em.randn({ ... }, F64)) end
-- values in (0.1, 0.9): inside every domain (log, sqrt, asin, ...)
local function unit(...) return leaf(em.rand({ ... }, F64) * 0.8 + 0.1) end
local function unit_t(a, b) return leaf((em.rand(b, a, F64) * 0.8 + 0.1):t()) end
local function randn_t(a, b) return leaf(em.randn(b, a, F64):t()) end

local function ok(name, fn, inputs, opts)
  local good, err = pcall(gc, fn, inputs, opts)
  H.check(good, name .. ': ' .. tostring(err), 2)
end

H.test('unary ops (contiguous and transposed inputs)', function()
  local ops = { 'neg', 'abs', 'exp', 'sin', 'cos', 'tanh', 'sigmoid', 'relu', 'gelu', 'silu',
    'square', 'expm1', 'atan', 'sinh', 'cosh', 'erf', 'floor', 'ceil', 'round', 'trunc', 'sign' }
  local pos = { 'log', 'sqrt', 'rsqrt', 'reciprocal', 'log1p', 'log2', 'log10', 'tan', 'asin', 'acos' }
  for _, op in ipairs(ops) do
    ok(op, function(a) return a[op](a) end, { randn(3, 4) })
    ok(op .. ' strided', function(a) return a[op](a) end, { randn_t(3, 4) })
  end
  for _, op in ipairs(pos) do
    ok(op, function(a) return a[op](a) end, { unit(3, 4) })
    ok(op .. ' strided', function(a) return a[op](a) end, { unit_t(3, 4) })
  end
  ok('gelu tanh', function(a) return a:gelu('tanh') end, { randn(5) })
end)

H.test('binary ops with broadcasting and strides', function()
  for _, op in ipairs({ 'add', 'sub', 'mul', 'div', 'maximum', 'minimum', 'atan2' }) do
    ok(op, function(a, b) return a[op](a, b) end, { randn(3, 4), unit(4) })
    ok(op .. ' strided', function(a, b) return a[op](a, b) end, { randn_t(3, 4), unit(3, 1) })
  end
  ok('pow', function(a, b) return a:pow(b) end, { unit(3, 4), randn(4) })
  ok('remainder', function(a, b) return a:remainder(b) end,
    { leaf(em.rand({ 3, 4 }, F64) * 2.4 + 0.3), leaf(em.rand(4, F64) * 0.5 + 0.6) })
  ok('operators', function(a, b) return (a + b) * a - b / (a * a + 1) end, { randn(2, 3), randn(3) })
end)

H.test('tensor op number', function()
  local x = unit(3, 4)
  ok('add/sub/mul/div', function(a) return (a + 2) * 3 - a / 4 end, { x })
  ok('reversed', function(a) return 2 - a, 3 / a, 2 ^ a end, { x })
  ok('pow', function(a) return a ^ 3, a ^ 0.5 end, { x })
  ok('max/min', function(a) return em.maximum(a, 0.5), em.minimum(a, 0.5) end, { x })
  ok('remainder', function(a) return a:remainder(0.3) end, { x })
end)

H.test('add alpha, clamp, where', function()
  ok('add alpha', function(a, b) return a:add(b, 2.5) end, { randn(3, 4), randn(4) })
  ok('clamp', function(a) return a:clamp(-0.5, 0.5) end, { randn(4, 5) })
  ok('where', function(a, b) return em.where(a:gt(0), a, b) end, { randn(3, 4), randn(4) })
end)

H.test('views and copies', function()
  local x = randn(3, 4)
  ok('view/reshape', function(a) return a:view(4, 3), a:t():reshape(12) end, { x })
  ok('transpose/permute', function(a) return a:transpose(1, 2), a:view(3, 2, 2):permute(3, 1, 2) end, { x })
  ok('narrow/select', function(a) return a:narrow(2, 2, 2), a:select(1, 2) end, { x })
  ok('squeeze/unsqueeze/expand', function(a) return a:unsqueeze(1):expand(2, 3, 4), a:view(3, 1, 4):squeeze() end, { x })
  ok('clone/contiguous/to', function(a) return a:t():contiguous(), a:clone() * 2 end, { x })
  ok('strided input', function(a) return a:narrow(1, 1, 2):t() * 2 end, { randn_t(3, 4) })
  ok('to float32 and back', function(a) return a:to('float32'):to('float64') end, { x },
    { eps = 1e-3, atol = 1e-3, rtol = 1e-3 })
end)

H.test('reductions', function()
  local x = randn(3, 4)
  ok('sum', function(a) return a:sum(), a:sum(2), a:sum(1, true) end, { x })
  ok('mean', function(a) return a:mean(), a:mean({ 1, 2 }), a:mean(2, true) end, { randn_t(3, 4) })
  ok('prod', function(a) return a:prod(2) end, { unit(3, 4) })
  ok('amax/amin', function(a) return a:amax(2), a:amin(1) end, { x })
  ok('logsumexp', function(a) return a:logsumexp(2) end, { x })
  ok('var/std', function(a) return a:var(2), a:std(1), a:var() end, { x })
  ok('norm', function(a) return a:norm(), a:norm(2, 2), a:norm(1, 1), a:norm(3, 2), a:norm(math.huge, 2) end, { x })
  ok('max/min dim', function(a) return (a:max(2)), (a:min(1, true)) end, { x })
  ok('softmax', function(a) return a:softmax(2), a:log_softmax(1) end, { x })
end)

H.test('matmul, cat, stack, index_select, gather', function()
  ok('matmul 2-D', function(a, b) return em.matmul(a, b) end, { randn(3, 4), randn_t(4, 2) })
  ok('matmul 1-D', function(a, b) return em.matmul(a, b), em.matmul(b, a) end, { randn(4), randn(4, 4) })
  ok('matmul batched broadcast', function(a, b) return em.matmul(a, b) end, { randn(2, 3, 4), randn(4, 5) })
  ok('vector dot', function(a, b) return em.matmul(a, b) end, { randn(4), randn(4) })
  ok('cat', function(a, b) return em.cat({ a, b }, 1), em.cat({ b, a }, 1) end, { randn(2, 3), randn_t(4, 3) })
  ok('stack', function(a, b) return em.stack({ a, b }, 2) end, { randn(2, 3), randn(2, 3) })
  local idx = em.tensor({ 3, 1, 3 }, { dtype = 'int64' })
  ok('index_select', function(a) return a:index_select(2, idx) end, { randn(2, 4) })
  local gi = em.tensor({ { 1, 2 }, { 3, 3 } }, { dtype = 'int64' })
  ok('gather', function(a) return a:gather(2, gi) end, { randn(3, 4) })
end)

H.test('accumulation, grad field, no_grad, detach', function()
  local x = em.tensor({ 1, 2, 3 }, F64):requires_grad_()
  H.eq(x.requires_grad, true)
  H.eq(x.is_leaf, true)
  H.eq(x.grad, nil)
  local y = (x * x):sum()
  H.eq(y.is_leaf, false)
  y:backward()
  H.eq(x.grad:totable(), { 2, 4, 6 })
  ;(x * 3):sum():backward()
  H.eq(x.grad:totable(), { 5, 7, 9 })
  x.grad = nil
  H.eq(x.grad, nil)
  x.grad = em.zeros(3, F64)
  ;(x * 2):sum():backward()
  H.eq(x.grad:totable(), { 2, 2, 2 })
  local r1, r2 = em.no_grad(function(a) return a * 2, 'extra' end, x)
  H.eq(r1.requires_grad, false)
  H.eq(r2, 'extra')
  H.eq(em.is_grad_enabled(), true)
  H.raises(function() em.no_grad(function() error('boom') end) end, 'boom')
  H.eq(em.is_grad_enabled(), true)
  em.no_grad(function() x:add_(1) end)
  H.eq(x:totable(), { 2, 3, 4 })
  local d = x:detach()
  H.eq(d.requires_grad, false)
  H.eq(d:same_storage(x), true)
  local z = em.no_grad(function() return em.enable_grad(function() return x * 2 end) end)
  H.eq(z.requires_grad, true)
end)

H.test('errors', function()
  local x = em.tensor({ 1, 2 }, F64):requires_grad_()
  local y = (x * x):sum()
  y:backward()
  H.raises(function() y:backward() end, 'second time')
  H.raises(function() (x * 2):backward() end, 'scalar outputs')
  -- nodes that saved nothing (add, mul by a number, sum, views) can run again
  local s = (x * 2 + 1):t():sum()
  x.grad = nil
  s:backward()
  s:backward()
  H.eq(x.grad:totable(), { 4, 4 })
  H.raises(function() x:add_(1) end, 'leaf', 'in-place')
  local a = x:exp()
  local b = a:sin()
  em.no_grad(function() a:detach():fill_(0) end)
  H.raises(function() b:sum():backward() end, 'modified by an inplace operation')
  H.raises(function() em.tensor({ 1, 2 }):long():requires_grad_() end, 'floating')
  H.raises(function() em.ones(2):backward() end, 'does not require grad')
  H.raises(function() gc(function(t) return t * t + t:floor():detach() * 0 end, { em.ones(2):requires_grad_() }) end, 'float64')
  -- a wrong gradient is reported with the input and element
  H.raises(function()
    gc(function(t) return t:sign() * t * t end, { em.tensor({ 1, -2 }, F64):requires_grad_() },
      { atol = 1e-12, rtol = 0 })
  end, 'gradcheck')
end)

-- Composite graphs against PyTorch (tests/fixtures/gen_autograd.py writes the values;
-- the graphs are the same there and here).
local graphs = {
  mlp = function(x, w1, b1, w2)
    local h = (em.matmul(x, w1) + b1):tanh()
    local logp = em.matmul(h, w2):log_softmax(2)
    local target = em.tensor({ { 1 }, { 3 }, { 2 }, { 3 } }, { dtype = 'int64' })
    return -logp:gather(2, target):mean()
  end,
  attention = function(q, k, v)
    local a = (em.matmul(q, k:transpose(2, 3)) / 2):softmax(3)
    return (em.matmul(a, v) ^ 2):sum()
  end,
  layer_norm = function(x, g, b)
    local mu = x:mean(2, true)
    local var = x:var(2, { correction = 0, keepdim = true })
    local y = (x - mu) / (var + 1e-5):sqrt() * g + b
    return (y * y:sigmoid()):sum()
  end,
  mixed = function(x, y)
    local z = em.where(x:gt(0), x * y:t(), x:clamp(-0.5, 0.5))
    local m = em.maximum(z, y:t():narrow(1, 1, 1)):max(2)
    return m:sum() + x:logsumexp(1):sum() + x:narrow(2, 2, 2):norm()
  end,
}

H.test('composite graphs match PyTorch', function()
  local cases = dofile(dir .. '../fixtures/autograd.lua')
  for _, case in ipairs(cases) do
    local xs = {}
    for i, inp in ipairs(case.inputs) do
      xs[i] = em.tensor(inp.values, F64):reshape(inp.shape):requires_grad_()
    end
    local loss = graphs[case.name](unpack(xs))
    H.close(loss:item(), case.loss, 1e-10, case.name .. ' loss')
    loss:backward()
    for i, inp in ipairs(case.inputs) do
      H.close(H.flat(xs[i].grad), inp.grad, 1e-9, case.name .. ' grad of input ' .. i)
    end
  end
end)

-- t[i] = v writes like fill_ on every shape: the 1-D fast path (a CPU vector
-- written from Lua directly) refuses and bumps the version as the ops do.
H.test('t[i] = v: refused on tensors autograd tracks, seen by saved tensors', function()
  local function msg(fn)
    return (H.raises(fn, 'fill_', 'in-place'):gsub('^[^:]*:%d+: ', ''))
  end
  local w = em.tensor({ 1, 2, 3 }, F64):requires_grad_()
  local m = em.tensor({ { 1, 2 }, { 3, 4 } }, F64):requires_grad_()
  H.eq(msg(function() w[1] = 0 end), msg(function() m[1] = 0 end),
    'a vector and a matrix refuse with one message')
  H.raises(function() w[2] = true end, 'fill_')
  H.eq(w:totable(), { 1, 2, 3 }, 'refused writes leave the leaf alone')
  em.no_grad(function() w[1] = 5 end)
  H.eq(w:totable(), { 5, 2, 3 }, 'under no_grad the write is made')
  for _, dt in ipairs({ 'float64', 'float32', 'float16', 'int64' }) do
    local x = em.tensor({ 1, 2, 3 }, F64):requires_grad_()
    local a = x:exp()
    local b = a:sin()                         -- saves a
    local v = a:detach():to(dt)
    if dt == 'float64' then
      v[2] = 0                                -- through a's storage, by the fast path
      H.raises(function() b:sum():backward() end, 'modified by an inplace operation')
    else                                      -- another storage: nothing to see
      v[2] = 0
      b:sum():backward()
      H.eq(v:totable()[2], 0, dt .. ' element written')
    end
  end
  -- a view of a vector that a node saved
  local y = em.tensor({ 1, 2, 3, 4 }, F64):requires_grad_()
  local p = y * 1
  local q = p:pow(2)                          -- saves p
  local pv = p:detach():narrow(1, 2, 2)
  pv[1] = 7
  H.raises(function() q:sum():backward() end, 'modified by an inplace operation')
end)

-- In-place writes made by the nn and optimizer kernels bump the storage version
-- like the element-wise ops: a graph that saved the tensor refuses to run.
H.test('optimizer steps and batch norm statistics bump versions', function()
  local w = em.tensor({ 1, 2 }, F64):requires_grad_()
  local x = em.tensor({ 3, 4 }, F64):requires_grad_()
  local opt = em.optim.SGD({ w }, { lr = 0.1 })
  ;(w * x):sum():backward()                   -- w.grad = x
  local y = x * w                              -- saves w
  opt:step()
  H.close(w:totable(), { 0.7, 1.6 }, 1e-12, 'the step moved w')
  H.raises(function() y:sum():backward() end, 'modified by an inplace operation', 'version')
  local adam = em.optim.Adam({ w }, { lr = 0.1 })
  y = x * w
  adam:step()
  H.close(w:totable(), { 0.6, 1.5 }, 1e-6, 'an Adam step moves w by lr')
  H.raises(function() y:sum():backward() end, 'modified by an inplace operation')
  -- batch norm's running mean, saved by a product
  local F32 = { dtype = 'float32' }
  local bn = em.nn.BatchNorm1d(2)
  local z = em.tensor({ 1, 2 }, F32):requires_grad_()
  local rm = bn.running_mean
  local u = z * rm:clone()
  local keep = z * rm                          -- saves the running mean itself
  bn(em.tensor({ { 1, 2 }, { 3, 6 } }, F32))
  H.close(rm:totable(), { 0.2, 0.4 }, 1e-6, 'running mean moved by momentum 0.1')
  u:sum():backward()                           -- a copy: unaffected
  H.raises(function() keep:sum():backward() end, 'modified by an inplace operation')
end)

-- x @ w^T (a Linear layer) hands w a gradient in w's own layout, contiguous
-- (a transposed one makes every accumulation into .grad read across rows), from
-- 2-D and batched inputs alike, with the values of the per-row sum; a second
-- backward accumulates into it.
H.test('a weight behind a transpose gets a contiguous gradient of the right values', function()
  local x2 = em.randn(5, 3, F64)
  local x3 = em.randn(2, 4, 3, F64)
  for _, x in ipairs({ x2, x3 }) do
    local w = em.randn(6, 3, F64):requires_grad_()
    local gshape = { unpack(x.shape) }
    gshape[#gshape] = 6
    local g = em.randn(gshape, F64)
    -- the gradient as backward hands it over (before .grad could copy it)
    local raw = em.autograd.backward_capture(em.nn.F.linear(x, w), g, { w })[1]
    H.check(raw:is_contiguous(), ('%d-D input: the gradient comes contiguous (strides %s)')
      :format(#x.shape, table.concat(raw:stride(), ',')))
    em.nn.F.linear(x, w):backward(g)
    -- the reference: the sum over rows of g_r^T x_r, element by element
    local xr, gr = x:reshape({ -1, 3 }):totable(), g:reshape({ -1, 6 }):totable()
    local want = {}
    for o = 1, 6 do
      want[o] = {}
      for i = 1, 3 do
        local acc = 0
        for r = 1, #xr do acc = acc + gr[r][o] * xr[r][i] end
        want[o][i] = acc
      end
    end
    H.close(H.flat(raw), H.flat(em.tensor(want, F64)), 1e-12, 'the captured values')
    H.close(H.flat(w.grad), H.flat(em.tensor(want, F64)), 1e-12,
      ('%d-D input: the values'):format(#x.shape))
    em.nn.F.linear(x, w):backward(g)
    H.check(w.grad:is_contiguous(), 'accumulated: still contiguous')
    H.close(H.flat(w.grad), H.flat(em.tensor(want, F64) * 2), 1e-12, 'accumulated: twice')
  end
end)

H.done()

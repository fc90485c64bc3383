--[[
test_nn.lua -- em.nn: module outputs and gradients against PyTorch 1.13
(tests/fixtures/nn_modules.lua from gen_nn_modules.py, same weights loaded via
load_state_dict), losses, gradcheck of the layers in float64, registration,
state_dict round trips and load_state_dict errors, train/eval behaviour
(dropout, batchnorm running stats), default init bounds, printing, and a short
MLP training run with em.optim.Adam whose loss must fall.
]]
local dir = (arg and arg[0] and arg[0]:match('^(.*/)')) or
            ((os.getenv('EMBER_TESTS') or 'tests') .. '/lua/')
local H = dofile(dir .. 'harness.lua')
local em = require 'ember'
local nn = em.nn
local flat = H.flat
local fx = dofile(dir .. '../fixtures/nn_modules.lua')

local function T(f, dtype)
  local t = em.tensor(f.data, { dtype = dtype or 'float32' })
  if #f.shape == 0 then return t:reshape({}) end
  return t:reshape(f.shape)
end

local function build(ctor)
  local f = assert(loadstring('return ' .. ctor))
  setfenv(f, nn)
  return f()
end

-- -- Modules against PyTorch -------------------------------------------------------------
for _, c in ipairs(fx.modules) do
  H.test('module ' .. c.name .. ' matches PyTorch', function()
    local m = build(c.ctor)
    local sd = {}
    local own = m:state_dict()
    -- PyTorch numbers Sequential children from 0, ember from 1
    local function key(k)
      if not c.ctor:match('^Sequential') then return k end
      return (k:gsub('^(%d+)%.', function(n) return (tonumber(n) + 1) .. '.' end))
    end
    for k, v in pairs(c.state) do sd[key(k)] = T(v, own[key(k)] and own[key(k)].dtype or 'float32') end
    m:load_state_dict(sd)
    m:train(c.train)
    local x
    if c.index then
      x = T(c.index, 'int64')
    else
      x = T(c.input):requires_grad_()
    end
    local y = m(x)
    H.eq(y.shape, c.output.shape, 'output shape')
    H.close(flat(y), c.output.data, 1e-4, 'output')
    y:backward(T(c.grad_output))
    if not c.index then H.close(flat(x.grad), c.grad_input.data, 1e-4, 'grad input') end
    for _, np in ipairs(m:named_parameters()) do
      local want
      for k, v in pairs(c.grads) do if key(k) == np[1] then want = v end end
      H.check(want ~= nil, 'fixture has a gradient for ' .. np[1])
      if want then H.close(flat(np[2].grad), want.data, 1e-4, 'grad ' .. np[1]) end
    end
    local after = m:state_dict()
    for k, v in pairs(c.state_after) do H.close(flat(after[key(k)]), v.data, 1e-5, 'state ' .. k) end
    if c.eval_output then
      m:eval()
      local ye = em.no_grad(function() return m(x) end)
      H.close(flat(ye), c.eval_output.data, 1e-4, 'eval output')
    end
  end)
end

for _, c in ipairs(fx.losses) do
  H.test('loss ' .. c.name .. ' matches PyTorch', function()
    local l = build(c.ctor)
    local x = T(c.input):requires_grad_()
    local t = c.int_target and T(c.target, 'int64') or T(c.target)
    local y = l(x, t)
    H.close(flat(y), c.output.data, 1e-5, 'loss')
    y:backward(T(c.grad_output))
    H.close(flat(x.grad), c.grad_input.data, 1e-5, 'grad input')
  end)
end

-- -- gradcheck in float64 ------------------------------------------------------------------
local function gc(name, fn, inputs)
  local ok, err = pcall(em.autograd.gradcheck, fn, inputs)
  H.check(ok, name .. ': ' .. tostring(err))
end

H.test('gradcheck of the layers in float64', function()
  em.manual_seed(1)
  local d = { dtype = 'float64' }
  local x = em.randn({ 3, 4 }, d):requires_grad_()
  local w = em.randn({ 2, 4 }, d):requires_grad_()
  local b = em.randn({ 2 }, d):requires_grad_()
  gc('linear', nn.F.linear, { x, w, b })
  local xi = em.randn({ 2, 2, 5, 5 }, d):requires_grad_()
  local cw = em.randn({ 3, 2, 3, 3 }, d):requires_grad_()
  local cb = em.randn({ 3 }, d):requires_grad_()
  gc('conv2d', function(a, k, c) return nn.F.conv2d(a, k, c, 2, 1) end, { xi, cw, cb })
  -- 1x1, one input channel per group: the input gradient's GEMM has A of one row
  gc('conv2d 1x1 from one channel', function(a, k) return nn.F.conv2d(a, k) end,
    { em.randn({ 2, 1, 3, 4 }, d):requires_grad_(), em.randn({ 4, 1, 1, 1 }, d):requires_grad_() })
  gc('conv2d 1x1 depthwise', function(a, k) return nn.F.conv2d(a, k, nil, 1, 0, 1, 2) end,
    { em.randn({ 2, 2, 3, 3 }, d):requires_grad_(), em.randn({ 4, 1, 1, 1 }, d):requires_grad_() })
  gc('max_pool2d', function(a) return nn.F.max_pool2d(a, 2) end, { xi })
  gc('avg_pool2d', function(a) return nn.F.avg_pool2d(a, 3, 2, 1) end, { xi })
  gc('adaptive_avg_pool2d', function(a) return nn.F.adaptive_avg_pool2d(a, { 2, 3 }) end, { xi })
  local g = em.randn({ 2 }, d):requires_grad_()
  local bb = em.randn({ 2 }, d):requires_grad_()
  gc('batch_norm', function(a, ww, bias) return nn.F.batch_norm(a, nil, nil, ww, bias, true) end,
    { xi, g, bb })
  local lw = em.randn({ 5 }, d):requires_grad_()
  local lb = em.randn({ 5 }, d):requires_grad_()
  gc('layer_norm', function(a, ww, bias) return nn.F.layer_norm(a, 5, ww, bias) end, { xi, lw, lb })
  local t = em.tensor({ 1, 2, 2 }):to('int64')
  gc('cross_entropy', function(a) return nn.F.cross_entropy(a, t, { label_smoothing = 0.2 }) end,
    { em.randn({ 3, 2 }, d):requires_grad_() })
  local tm = em.randn({ 3, 4 }, d)
  gc('mse_loss', nn.F.mse_loss, { x, tm:clone():requires_grad_() })
  local tb = em.rand({ 3, 4 }, d)
  gc('bce_with_logits', function(a) return nn.F.binary_cross_entropy_with_logits(a, tb) end, { x })
end)

-- -- Registration and state ---------------------------------------------------------------------
local Net = nn.Module:extend('Net')
function Net:init(n)
  self.fc1 = nn.Linear(n, 6)
  self.scale = nn.Parameter(em.ones({ 1 }))
  self.bn = nn.BatchNorm1d(6)
  self.fc2 = nn.Linear(6, 2)
  self.not_registered = em.zeros({ 3 })
end
function Net:forward(x) return self.fc2(self.bn(self.fc1(x):relu() * self.scale)) end

H.test('registration in order, dotted names, buffers, children', function()
  local m = Net(4)
  local names = {}
  for i, np in ipairs(m:named_parameters()) do names[i] = np[1] end
  H.eq(names, { 'scale', 'fc1.weight', 'fc1.bias', 'bn.weight', 'bn.bias', 'fc2.weight', 'fc2.bias' })
  H.eq(#m:parameters(), 7)
  H.eq(#m:buffers(), 3)
  -- recurse = false: the module's own alone
  local own = {}
  for i, np in ipairs(m:named_parameters{ recurse = false }) do own[i] = np[1] end
  H.eq(own, { 'scale' }, 'own parameters')
  H.eq(#m.fc1:parameters{ recurse = false }, 2, "a child's own")
  H.eq({ #m:buffers{ recurse = false }, #m.bn:named_buffers{ recurse = false } }, { 0, 3 }, 'own buffers')
  H.eq(#m:parameters{ recurse = true }, 7, 'recurse = true')
  H.raises(function() m:parameters(false) end, 'parameters', 'options table', 'boolean')
  H.raises(function() m:named_buffers{ recurse = 'no' } end, 'named_buffers', 'recurse = string')
  H.eq(#m:children(), 3)
  H.eq(m:num_parameters(), 4 * 6 + 6 + 1 + 12 + 12 + 2)
  local sd = m:state_dict()
  H.check(sd['bn.running_mean'] ~= nil and sd['bn.num_batches_tracked'] ~= nil, 'buffers in state_dict')
  H.check(sd['not_registered'] == nil, 'plain tensors are not registered')
  H.eq(sd['fc1.weight'].shape, { 6, 4 })
  local y = m(em.randn(5, 4))
  H.eq(y.shape, { 5, 2 })
  local s = tostring(m)
  H.check(s:find('(fc1): Linear(in_features=4, out_features=6, bias=true)', 1, true), s)
  H.check(s:find('weight [6,4]', 1, true) and s:find('57 parameters', 1, true), s)
  local seen = 0
  m:apply(function() seen = seen + 1 end)
  H.eq(seen, 4)
end)

H.test('state_dict round trip and load_state_dict errors', function()
  local a, b = Net(4), Net(4)
  em.no_grad(function() a.bn.running_mean:fill_(0.5) end)
  b:load_state_dict(a:state_dict())
  local x = em.randn(3, 4)
  a:eval(); b:eval()
  H.close(flat(b(x)), flat(a(x)), 1e-6, 'same outputs after loading')
  H.check(b.fc1.weight.requires_grad and b.fc1.weight.is_leaf, 'parameters stay leaves')
  local sd = a:state_dict()
  sd['fc1.weight'] = nil
  H.raises(function() b:load_state_dict(sd) end, 'missing keys', 'fc1.weight')
  local r = b:load_state_dict(sd, false)
  H.eq(r.missing_keys, { 'fc1.weight' })
  sd = a:state_dict()
  sd['extra.thing'] = em.zeros(1)
  H.raises(function() b:load_state_dict(sd) end, 'unexpected keys', 'extra.thing')
  sd = a:state_dict()
  sd['fc2.bias'] = em.zeros(3)
  H.raises(function() b:load_state_dict(sd) end, 'shape mismatch', 'fc2.bias', '[2]', '[3]')
  -- through em.save / em.load
  local path = os.tmpname()
  em.save(path, a:state_dict())
  local c = Net(4)
  c:load_state_dict((em.load(path)))
  os.remove(path)
  c:eval()
  H.close(flat(c(x)), flat(a(x)), 1e-6, 'after save/load')
end)

H.test('zero_grad, to, train/eval flags', function()
  local m = Net(4)
  m(em.randn(4, 4)):sum():backward()
  H.check(m.fc1.weight.grad ~= nil, 'grad after backward')
  m:zero_grad()
  H.check(m.fc1.weight.grad == nil, 'zero_grad clears')
  m:eval()
  H.check(not m.training and not m.fc1.training and not m.bn.training, 'eval is recursive')
  m:train()
  H.check(m.bn.training, 'train is recursive')
  m:to('float64')
  H.eq(m.fc1.weight.dtype, 'float64')
  H.check(m.fc1.weight.requires_grad, 'still a parameter')
  H.eq(m.bn.num_batches_tracked.dtype, 'int64')
  H.eq(m(em.randn({ 3, 4 }, { dtype = 'float64' })).dtype, 'float64')
end)

-- -- Train / eval behaviour -----------------------------------------------------------------
H.test('dropout: train scales, eval is the identity', function()
  local d = nn.Dropout(0.25)
  local x = em.ones(200, 50)
  local y = d(x)
  local v = flat(y)
  local zeros, scaled = 0, 0
  for i = 1, #v do
    if v[i] == 0 then zeros = zeros + 1 elseif math.abs(v[i] - 1 / 0.75) < 1e-6 then scaled = scaled + 1 end
  end
  H.eq(zeros + scaled, #v, 'every element is 0 or 1/(1-p)')
  H.check(math.abs(zeros / #v - 0.25) < 0.02, 'about p are dropped: ' .. zeros / #v)
  d:eval()
  H.close(flat(d(x)), flat(x), 0, 'eval')
  H.raises(function() nn.Dropout(1.5)(x) end, 'dropout', 'p')
end)

H.test('batchnorm running stats and num_batches_tracked', function()
  local bn = nn.BatchNorm1d(3)
  local x = em.tensor({ { 1, 2, 3 }, { 3, 6, 9 }, { 5, 10, 15 } }, { dtype = 'float32' })
  bn(x)
  H.close(flat(bn.running_mean), { 0.3, 0.6, 0.9 }, 1e-6, 'running_mean')
  H.close(flat(bn.running_var), { 0.9 + 0.4, 0.9 + 1.6, 0.9 + 3.6 }, 1e-6, 'running_var (unbiased)')
  H.eq(bn.num_batches_tracked:item(), 1)
  bn:eval()
  local y = bn(x)
  H.close(flat(y)[1], (1 - 0.3) / math.sqrt(1.3 + 1e-5), 1e-5, 'eval uses running stats')
  H.raises(function() nn.BatchNorm2d(3)(em.zeros(2, 3)) end, 'BatchNorm2d', '4-D')
end)

-- -- Default initialisation ---------------------------------------------------------------------
H.test('default initialisation bounds (PyTorch rules)', function()
  em.manual_seed(3)
  local function range(t)
    local v, lo, hi = flat(t), math.huge, -math.huge
    for i = 1, #v do lo = math.min(lo, v[i]); hi = math.max(hi, v[i]) end
    return lo, hi
  end
  local l = nn.Linear(100, 300)
  local lo, hi = range(l.weight)
  local bound = 1 / math.sqrt(100)   -- kaiming_uniform(a=sqrt 5): sqrt(6/6/fan_in)
  H.check(lo >= -bound and hi <= bound and hi > 0.95 * bound and lo < -0.95 * bound,
    ('linear weight in +-%g: %g %g'):format(bound, lo, hi))
  lo, hi = range(l.bias)
  H.check(lo >= -bound and hi <= bound, 'linear bias')
  local c = nn.Conv2d(8, 16, 3)
  bound = 1 / math.sqrt(8 * 9)
  lo, hi = range(c.weight)
  H.check(lo >= -bound and hi <= bound and hi > 0.9 * bound, 'conv weight')
  lo, hi = range(c.bias)
  H.check(lo >= -bound and hi <= bound, 'conv bias')
  local e = flat(nn.Embedding(100, 100).weight)
  local s, s2 = 0, 0
  for i = 1, #e do s = s + e[i]; s2 = s2 + e[i] * e[i] end
  H.check(math.abs(s / #e) < 0.05 and math.abs(s2 / #e - 1) < 0.05, 'embedding N(0,1)')
  local ln = nn.LayerNorm(4)
  H.eq(flat(ln.weight), { 1, 1, 1, 1 }); H.eq(flat(ln.bias), { 0, 0, 0, 0 })
  H.eq(nn.Linear(3, 2, false).bias, nil)
end)

-- -- Training -----------------------------------------------------------------------------------
H.test('an MLP trained with Adam fits synthetic data', function()
  em.manual_seed(7)
  local x = em.randn(128, 10)
  local w = em.randn(10, 3)
  local y = x:matmul(w):argmax(2)
  local m = nn.Sequential(nn.Linear(10, 32), nn.ReLU(), nn.Linear(32, 3))
  local opt = em.optim.Adam(m:parameters(), { lr = 0.01 })
  local lossf = nn.CrossEntropyLoss()
  local first, last
  for step = 1, 60 do
    opt:zero_grad()
    local loss = lossf(m(x), y)
    loss:backward()
    nn.utils.clip_grad_norm(m:parameters(), 10)
    opt:step()
    if step == 1 then first = loss:item() end
    last = loss:item()
  end
  H.eq(#m, 3); H.check(m[1] == m:children()[1], 'seq[i] is child i')
  H.check(last < first * 0.5, ('loss fell from %g to %g'):format(first, last))
end)

H.done()

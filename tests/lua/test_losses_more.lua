--[[
test_losses_more.lua -- F.cross_entropy with class weights, ignore_index, label
smoothing, probability targets and K-dimensional inputs, and F.l1_loss,
F.smooth_l1_loss, F.huber_loss: loss values and input gradients against
PyTorch (tests/fixtures/gen_losses_sched_rnn.py) in float64 and float32, on the
CPU, on (emulated) CUDA and with strided and broadcast inputs; shapes on meta;
gradcheck in float64; the module forms; the errors.
]]
local dir = (arg and arg[0] and arg[0]:match('^(.*/)')) or
            ((os.getenv('EMBER_TESTS') or 'tests') .. '/lua/')
local H, em = dofile(dir .. 'cuda_emulated.lua')('1:64')
local F, nn = em.nn.F, em.nn
local fixtures = dofile(dir .. '../fixtures/losses_more.lua')

local function tensor(fx, dtype, device)
  local t
  if #fx.shape == 0 then t = em.tensor(fx.data[1], { dtype = dtype })
  else t = em.tensor(fx.data, { dtype = dtype }):reshape(fx.shape) end
  return device and t:to(device) or t
end

local function is_int_target(case) return case.fn == 'cross_entropy' and case.target.data[1] % 1 == 0
  and #case.target.shape ~= #case.input.shape end

local function target_of(case, dtype, device)
  if is_int_target(case) then return tensor(case.target, 'int64', device) end
  return tensor(case.target, dtype, device)
end

local function opts_of(case, dtype, device)
  local o = {}
  for k, v in pairs(case.opts) do o[k] = v end
  if o.weight then o.weight = tensor(o.weight, dtype, device) end
  return o
end

local maxdiff = H.maxdiff

-- x as a strided view: the columns of a wider leaf (or the leaf itself).
local function input_of(case, dtype, device, strided)
  local x = tensor(case.input, dtype, device)
  if not strided or x:dim() < 2 then
    local leaf = x:requires_grad_()
    return leaf, leaf
  end
  local nd = x:dim()
  local leaf = em.cat({ x, x * 3 }, nd):requires_grad_()
  return leaf:narrow(nd, 1, x.shape[nd]), leaf
end

local function run(case, dtype, device, strided)
  local x, leaf = input_of(case, dtype, device, strided)
  local y = F[case.fn](x, target_of(case, dtype, device), opts_of(case, dtype, device))
  if y:dim() == 0 then y:backward() else y:backward(tensor(case.grad_output, dtype, device)) end
  local g = leaf.grad
  if leaf ~= x then g = g:narrow(x:dim(), 1, x.shape[x:dim()]) end
  return y:cpu(), g:cpu()
end

for _, case in ipairs(fixtures) do
  H.test(case.name .. ': PyTorch\'s values and gradients', function()
    for _, cfg in ipairs({ { 'float64', 'cpu', false, 1e-12 }, { 'float64', 'cpu', true, 1e-12 },
                           { 'float32', 'cpu', false, 2e-5 }, { 'float64', 'cuda', false, 1e-12 },
                           { 'float32', 'cuda', true, 2e-5 } }) do
      local dt, dev, strided, tol = cfg[1], cfg[2], cfg[3], cfg[4]
      local what = ('%s %s%s'):format(dt, dev, strided and ' strided' or '')
      local y, g = run(case, dt, dev, strided)
      H.eq(y.shape, case.output.shape, what .. ' loss shape')
      local dy, dg = maxdiff(y, case.output), maxdiff(g, case.grad_input)
      H.check(dy <= tol, ('%s: loss off by %g'):format(what, dy))
      H.check(dg <= tol, ('%s: input gradient off by %g'):format(what, dg))
    end
    -- meta: shapes only
    local x = em.empty(case.input.shape, { dtype = 'float32', device = 'meta' })
    local t
    if is_int_target(case) then t = em.empty(case.target.shape, { dtype = 'int64', device = 'meta' })
    else t = em.empty(case.target.shape, { dtype = 'float32', device = 'meta' }) end
    local y = F[case.fn](x, t, opts_of(case, 'float32', 'meta'))
    H.eq(y.shape, case.output.shape, 'meta loss shape')
    H.eq(y.device, 'meta', 'meta loss device')
  end)
end

H.test('broadcast targets (stride 0) give the same loss as contiguous ones', function()
  local a = em.randn(3, 4, { dtype = 'float64' })
  local row = em.randn(1, 4, { dtype = 'float64' })
  for _, fn in ipairs({ 'l1_loss', 'smooth_l1_loss', 'huber_loss' }) do
    local b = F[fn](a, row:expand(3, 4), { reduction = 'none' })
    local c = F[fn](a, row:expand(3, 4):contiguous(), { reduction = 'none' })
    H.close(H.flat(b), H.flat(c), 1e-15, fn .. ' broadcast')
    H.close(F[fn](a, row):item(), F[fn](a, row:expand(3, 4):contiguous()):item(), 1e-15,
      fn .. ' implicit broadcast')
  end
  -- A transposed input for cross_entropy's K-dim path.
  local x = em.randn(2, 5, 3, { dtype = 'float64' })
  local xt = x:transpose(1, 3):contiguous():transpose(1, 3)
  local t = em.randint(1, 6, { 2, 3 })
  H.close(F.cross_entropy(xt, t):item(), F.cross_entropy(x, t):item(), 1e-14, 'transposed K-dim')
end)

H.test('gradcheck in float64', function()
  local function gc(name, fn, inputs)
    local ok, err = pcall(em.autograd.gradcheck, fn, inputs)
    H.check(ok and err ~= false, name .. ': ' .. tostring(err))
  end
  local w = em.tensor({ 0.5, 1.5, 1.0, 2.0 }, { dtype = 'float64' })
  local t = em.tensor({ 1, 4, -100, 2, 3, 4 }, { dtype = 'int64' })
  for _, r in ipairs({ 'mean', 'sum', 'none' }) do
    gc('cross_entropy weight+ignore+smoothing ' .. r, function(x)
      return F.cross_entropy(x, t, { weight = w, ignore_index = -100, label_smoothing = 0.2,
        reduction = r })
    end, { em.randn(6, 4, { dtype = 'float64' }):requires_grad_() })
  end
  local tk = em.tensor({ { 1, 2, 3 }, { 4, -100, 1 } }, { dtype = 'int64' })
  gc('cross_entropy K-dim weight+ignore+smoothing', function(x)
    return F.cross_entropy(x, tk, { weight = w, label_smoothing = 0.1 })
  end, { em.randn(2, 4, 3, { dtype = 'float64' }):requires_grad_() })
  local p = em.randn(3, 4, { dtype = 'float64' }):softmax(2)
  gc('cross_entropy probabilities', function(x)
    return F.cross_entropy(x, p, { weight = w, label_smoothing = 0.3 })
  end, { em.randn(3, 4, { dtype = 'float64' }):requires_grad_() })
  local b = em.randn(3, 5, { dtype = 'float64' })
  for _, fn in ipairs({ 'l1_loss', 'smooth_l1_loss', 'huber_loss' }) do
    gc(fn, function(a, c) return F[fn](a, c, { beta = 0.6, delta = 0.8 }) end,
      { (b + em.randn(3, 5, { dtype = 'float64' })):requires_grad_(),
        b:clone():add(0.3):requires_grad_() })
  end
end)

H.test('the module forms pass their options on', function()
  local x = em.randn(5, 3, { dtype = 'float64' })
  local t = em.tensor({ 1, 2, 3, 3, -1 }, { dtype = 'int64' })
  local w = em.tensor({ 1, 2, 3 }, { dtype = 'float64' })
  local o = { weight = w, ignore_index = -1, label_smoothing = 0.1, reduction = 'sum' }
  H.close(nn.CrossEntropyLoss(o)(x, t):item(), F.cross_entropy(x, t, o):item(), 1e-15,
    'CrossEntropyLoss')
  local crit = nn.CrossEntropyLoss({ weight = w, label_smoothing = 0.2, ignore_index = -1 })
  H.eq(crit:state_dict().weight:totable(), { 1, 2, 3 }, 'the weight is a buffer in the state_dict')
  crit:to('cuda')
  H.eq(crit.weight.device, 'cuda:0', ':to moves the weight')
  H.close(crit(x:cuda(), t:cuda()):item(), F.cross_entropy(x, t, { weight = w, ignore_index = -1,
    label_smoothing = 0.2 }):item(), 1e-12, 'CrossEntropyLoss on cuda with its weight moved')
  local a, b = em.randn(4, { dtype = 'float64' }), em.randn(4, { dtype = 'float64' })
  H.close(nn.L1Loss()(a, b):item(), (a - b):abs():mean():item(), 1e-15, 'L1Loss')
  H.close(nn.L1Loss({ reduction = 'sum' })(a, b):item(), (a - b):abs():sum():item(), 1e-15,
    'L1Loss sum')
  H.close(nn.SmoothL1Loss({ beta = 0.5 })(a, b):item(), F.smooth_l1_loss(a, b, { beta = 0.5 }):item(),
    1e-15, 'SmoothL1Loss')
  H.close(nn.HuberLoss({ delta = 2 })(a, b):item(), F.huber_loss(a, b, { delta = 2 }):item(),
    1e-15, 'HuberLoss')
  H.eq(nn.HuberLoss({ reduction = 'none' })(a, b).shape, { 4 }, 'HuberLoss none')
  H.check(tostring(nn.SmoothL1Loss()):find('SmoothL1Loss') ~= nil, 'printable')
end)

H.test('errors name cross_entropy and say the fix', function()
  local x = em.randn(2, 3)
  local err = H.raises(function() F.cross_entropy(x, em.tensor({ 0, 1 }, { dtype = 'int64' })) end,
    'cross_entropy', 'target 0 is out of range for 3 classes', 'labels count from 1',
    'run 1..3', 'add 1 to 0-based labels')
  H.check(not err:find('%(index_base 1%)'), 'the message speaks of labels, not index_base: ' .. err)
  H.raises(function() F.cross_entropy(x, em.tensor({ 1, 4 }, { dtype = 'int64' })) end,
    'cross_entropy', 'target 4 is out of range for 3 classes')
  H.raises(function() F.cross_entropy(x, em.tensor({ 1, 0 }, { dtype = 'int64' }),
      { weight = em.ones(3) })
  end, 'cross_entropy', 'target 0 is out of range', 'count from 1')
  H.raises(function() F.cross_entropy(x, em.tensor({ 1, 2 }, { dtype = 'int64' }),
      { weight = em.ones(4) })
  end, 'cross_entropy', 'weight [4]', 'one value per class (3)')
  H.raises(function() F.cross_entropy(x, em.tensor({ 1, 2 }, { dtype = 'int64' }),
      { weight = em.ones(3, { dtype = 'float64' }) })
  end, 'cross_entropy', 'weight is float64', 'input is float32')
  H.raises(function() F.cross_entropy(x, em.rand(2, 4)) end, 'cross_entropy',
    'probabilities', '[2,3]', '[2,4]')
  H.raises(function() F.cross_entropy(x, em.tensor({ 1, 2, 3 }, { dtype = 'int64' })) end,
    'cross_entropy', 'target [3] must be [2]')
  H.raises(function() F.cross_entropy(em.randn(2, 3, 4), em.tensor({ 1, 2 }, { dtype = 'int64' })) end,
    'cross_entropy', 'target [2] must be [2,4]')
  H.raises(function() F.cross_entropy(x, em.tensor({ 1, 2 }, { dtype = 'int64' }),
    { label_smoothing = 2 }) end, 'cross_entropy', 'label_smoothing')
  H.raises(function() F.cross_entropy(x, em.tensor({ 1, 2 }, { dtype = 'int64' }),
    { reduction = 'avg' }) end, 'cross_entropy', 'reduction')
  H.raises(function() F.smooth_l1_loss(x, x, { beta = -1 }) end, 'smooth_l1_loss', 'beta')
  H.raises(function() F.huber_loss(x, x, { delta = 'a' }) end, 'huber_loss', 'delta')
  H.raises(function() F.l1_loss(x, 3) end, 'l1_loss', 'argument 2')
  H.raises(function() F.l1_loss(x, x, { reduction = 'x' }) end, 'l1_loss', 'reduction')
end)

H.done()

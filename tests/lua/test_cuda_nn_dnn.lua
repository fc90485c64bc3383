--[[
test_cuda_nn_dnn.lua -- the CUDA backend's convolution, pooling and batch norm
(kernels/k_dnn.c) through the nn modules and autograd, on the emulated runtime
(EMBER_CUDA_EMULATE=2:64; the test runs itself again with it otherwise): a small
CNN (conv -> batch norm -> relu -> pool -> linear) trained a few steps on cuda and
on the CPU from the same weights; the losses, every parameter's gradient and the
batch norm's running statistics must agree, then eval mode's outputs.
]]
local dir = (arg and arg[0] and arg[0]:match('^(.*/)')) or
            ((os.getenv('EMBER_TESTS') or 'tests') .. '/lua/')
local H, em = dofile(dir .. 'cuda_emulated.lua')('2:64')
local T = assert(loadfile(dir .. 'test_cuda_ops.lua'))('--helpers', H)
local compare = T.compare
local nn, F = em.nn, em.nn.F

local function model(dt, pool)
  return nn.Sequential(
    nn.Conv2d(3, 6, 3, { padding = 1, dtype = dt }),
    nn.BatchNorm2d(6, { dtype = dt }),
    nn.ReLU(),
    pool,
    nn.Conv2d(6, 4, 3, { stride = 2, padding = 1, dilation = 1, groups = 2, dtype = dt }),
    nn.AdaptiveAvgPool2d({ 2, 2 }),
    nn.Flatten(),
    nn.Linear(16, 5, { dtype = dt }))
end

-- The same model on both devices: the cuda one gets copies of the CPU weights.
local function pair(dt, pool_c, pool_d)
  em.manual_seed(7)
  local mc = model(dt, pool_c)
  em.manual_seed(7)
  local md = model(dt, pool_d):to('cuda')
  return mc, md
end

local function check_model(dt, name, pool_c, pool_d, k)
  local mc, md = pair(dt, pool_c, pool_d)
  local pc, pd = mc:parameters(), md:parameters()
  for step = 1, 3 do
    local x = em.randn({ 4, 3, 9, 10 }, { dtype = dt })
    local y = em.randint(1, 6, { 4 })
    -- a strided cuda input: the same values through a transposed copy
    local xd = x:transpose(3, 4):contiguous():cuda():transpose(3, 4)
    local lc = F.cross_entropy(mc:forward(x), y)
    local ld = F.cross_entropy(md:forward(xd), y:cuda())
    compare(lc, ld, ('%s %s step %d: loss'):format(name, dt, step), k)
    for _, p in ipairs(pc) do p.grad = nil end
    for _, p in ipairs(pd) do p.grad = nil end
    lc:backward()
    ld:backward()
    for i = 1, #pc do
      if H.check(pd[i].grad ~= nil, ('%s: parameter %d has no grad on cuda'):format(name, i)) then
        compare(pc[i].grad, pd[i].grad, ('%s %s step %d: grad of parameter %d'):format(name, dt, step, i), k)
      end
    end
    em.no_grad(function()     -- a plain SGD step on both, so the next step differs
      for i = 1, #pc do
        pc[i]:add_(pc[i].grad * -0.1)
        pd[i]:add_(pd[i].grad * -0.1)
      end
    end)
  end
  local bc, bd = mc[2], md[2]
  compare(bc.running_mean, bd.running_mean, name .. ' running_mean after 3 steps', k)
  compare(bc.running_var, bd.running_var, name .. ' running_var after 3 steps', k)
  mc:eval(); md:eval()
  local x = em.randn({ 2, 3, 9, 10 }, { dtype = dt })
  compare(mc:forward(x), md:forward(x:cuda()), name .. ' eval output', k)
end

H.test('a small CNN on cuda: losses, gradients, running statistics, eval', function()
  for _, dt in ipairs({ 'float32', 'float64' }) do
    check_model(dt, 'maxpool', nn.MaxPool2d(2), nn.MaxPool2d(2), 50)
    check_model(dt, 'avgpool', nn.AvgPool2d(3, { stride = 2, padding = 1 }),
                nn.AvgPool2d(3, { stride = 2, padding = 1 }), 50)
  end
end)

H.test('nn.functional on cuda: conv2d and pooling match the CPU', function()
  for _, dt in ipairs({ 'float32', 'float64' }) do
    local x, w = em.randn({ 2, 4, 7, 8 }, { dtype = dt }), em.randn({ 6, 2, 3, 2 }, { dtype = dt })
    compare(F.conv2d(x, w, nil, { 2, 1 }, { 1, 0 }, { 2, 1 }, 2),
            F.conv2d(x:cuda(), w:cuda(), nil, { 2, 1 }, { 1, 0 }, { 2, 1 }, 2), 'conv2d ' .. dt, 10)
    compare(F.max_pool2d(x, 3, 2, 1, 1, true), F.max_pool2d(x:cuda(), 3, 2, 1, 1, true),
            'max_pool2d ' .. dt)
    compare(F.adaptive_avg_pool2d(x, { 3, 5 }), F.adaptive_avg_pool2d(x:cuda(), { 3, 5 }),
            'adaptive_avg_pool2d ' .. dt)
  end
end)

H.done()

--[[
bn_mixed_cases.lua -- batch norm on a float16/bfloat16 input with float32 weight,
bias and running statistics, shared by test_bn_mixed.lua (CPU) and
test_cuda_bn_mixed.lua (emulated GPU): forward and backward, training and
evaluation, NCHW and channels-last, against the float32 computation on the
widened input (the half result is that, rounded once); running statistics moved
in float32; strided inputs; the dtype errors; and an autocast CNN step whose
batch norms add no copy (no cast, no conversion of any kind: em.copy_count())
and which trains as float32 does.
  dofile(dir .. 'bn_mixed_cases.lua').run(H, em, device)
]]
local A = {}

-- the output and grad_input are float32 results rounded once into the low dtype
local tol = { bfloat16 = 8e-3, float16 = 1e-3 }

function A.run(H, em, dev)
  local maxrel = H.maxrel
  local F = em.nn.F
  local function on(t) return dev == 'cpu' and t or t:to(dev) end

  -- F.batch_norm on xl (the low-dtype input, any layout) and on its float32 widening,
  -- both with fresh float32 parameters; forward, backward with the same gy, stats.
  local function compare(name, xl, dt, training, nhwc)
    em.manual_seed(7)
    local C = xl.shape[2]
    local w0, b0 = on(em.randn(C)), on(em.randn(C))
    local rm0, rv0 = on(em.randn(C):mul(0.1)), on(em.rand(C):add(0.5))
    local function run(x)
      local w, b = w0:clone():requires_grad_(), b0:clone():requires_grad_()
      local rm, rv = rm0:clone(), rv0:clone()
      local xi = x:detach():requires_grad_()
      local y = F.batch_norm(xi, rm, rv, w, b, training, 0.2, 1e-5)
      return y, xi, w, b, rm, rv
    end
    local xr = xl:float()                              -- widened, same values and layout
    local y, x, w, b, rm, rv = run(xl)
    local yr, xr_, wr, br, rmr, rvr = run(xr)
    local what = ('%s %s %s %s'):format(name, dt, training and 'train' or 'eval',
      nhwc and 'nhwc' or 'nchw')
    H.eq(y.dtype, dt, what .. ': output keeps the input dtype')
    H.eq(y.device, dev == 'cpu' and 'cpu' or 'cuda:0', what .. ': device')
    if nhwc then H.check(y:is_contiguous('channels_last'), what .. ': output stays channels-last') end
    H.check(maxrel(y, yr) <= tol[dt], ('%s: output rel error %g'):format(what, maxrel(y, yr)))
    -- the half output is the float32 one rounded: no element further than one rounding
    H.check(maxrel(y, yr:to(dt)) <= tol[dt] / 4, what .. ': output is the float32 result rounded')
    H.eq(rm.dtype, 'float32', what .. ': running_mean stays float32')
    H.check(maxrel(rm, rmr) <= 1e-6 and maxrel(rv, rvr) <= 1e-6,
      ('%s: running stats rel error %g %g'):format(what, maxrel(rm, rmr), maxrel(rv, rvr)))
    if not training then
      H.check(maxrel(rm, rm0) == 0 and maxrel(rv, rv0) == 0, what .. ': eval leaves the stats')
    else
      H.check(maxrel(rm, rm0) > 0, what .. ': training moved running_mean')
    end
    em.manual_seed(8)
    local gy = on(em.randn(unpack(y.shape))):to(dt)
    y:backward(gy)
    yr:backward(gy:float())
    H.eq(x.grad.dtype, dt, what .. ': grad_input in the input dtype')
    H.eq(w.grad.dtype, 'float32', what .. ': grad_weight float32')
    H.eq(b.grad.dtype, 'float32', what .. ': grad_bias float32')
    H.check(maxrel(x.grad, xr_.grad) <= tol[dt],
      ('%s: grad_input rel error %g'):format(what, maxrel(x.grad, xr_.grad)))
    H.check(maxrel(w.grad, wr.grad) <= 1e-4 and maxrel(b.grad, br.grad) <= 1e-5,
      ('%s: grad_weight/bias rel error %g %g'):format(what, maxrel(w.grad, wr.grad),
        maxrel(b.grad, br.grad)))
  end

  for _, dt in ipairs({ 'bfloat16', 'float16' }) do
    H.test(('batch norm, %s input with float32 parameters on %s: NCHW and NHWC, train and eval')
        :format(dt, dev), function()
      -- the last two: channels-last reductions split among row tasks; C > 2048
      -- (bn_half.c's run buffer) converts one slice of a row at a time
      for _, shape in ipairs({ { 4, 6, 5, 5 }, { 2, 70, 3, 3 }, { 3, 5, 100 },
                               { 16, 40, 12, 12 }, { 2, 2100, 3, 3 } }) do
        em.manual_seed(#shape * 10 + shape[2])
        local x = on(em.randn(unpack(shape)))
                    :mul(2):add(0.5):to(dt)
        for _, training in ipairs({ true, false }) do
          compare('[' .. table.concat(shape, ',') .. ']', x, dt, training, false)
          if #shape == 4 then
            compare('[' .. table.concat(shape, ',') .. ']', x:to_channels_last(), dt, training, true)
          end
        end
      end
    end)

    H.test(('batch norm, %s on %s: strided inputs'):format(dt, dev), function()
      em.manual_seed(4)
      -- a transposed view (C and N swapped) and a narrowed one
      local t = on(em.randn(6, 4, 5, 5)):to(dt):transpose(1, 2)
      local n = on(em.randn(4, 6, 5, 9)):to(dt):narrow(4, 3, 5)
      H.check(not t:is_contiguous() and not n:is_contiguous(), 'inputs are strided')
      for _, training in ipairs({ true, false }) do
        compare('transposed', t, dt, training, false)
        compare('narrowed', n, dt, training, false)
      end
    end)
  end

  H.test('batch norm dtype mixes on ' .. dev .. ': clear errors, nothing moved', function()
    local x = on(em.randn(2, 3, 4, 4))
    local rm, rv, w = on(em.zeros(3)), on(em.ones(3)), on(em.ones(3))
    H.raises(function() F.batch_norm(x:bfloat16(), rm, rv, w:bfloat16(), nil, true) end,
      'batch_norm', 'weight', 'bfloat16', 'float32')
    H.raises(function() F.batch_norm(x:half(), rm:half(), rv, nil, nil, true) end,
      'batch_norm', 'running_mean', 'float16', 'float32')
    H.check(rm:eq(0):all():item() and rv:eq(1):all():item(), 'running stats untouched')
    H.raises(function() F.batch_norm(x, rm, rv, w:bfloat16(), nil, true) end,
      'batch_norm', 'weight', 'bfloat16')
    H.raises(function() F.batch_norm(x:long(), rm, rv, nil, nil, true) end, 'batch_norm', 'int64')
    H.raises(function() F.batch_norm(x:float():double(), rm, rv, nil, nil, true) end,
      'batch_norm', 'running_mean', 'float32', 'float64')
  end)

  -- The copies (casts and every other kind) of one autocast step, forward and backward.
  local function copies_in_step(m, x, t, dt)
    local n0 = em.copy_count()
    local loss = em.amp.autocast(dt, function() return F.cross_entropy(m(x), t) end)
    loss:backward()
    return em.copy_count() - n0, loss
  end

  H.test('autocast CNN on ' .. dev .. ': batch norm adds no copies and trains as float32', function()
    local nn = em.nn
    local function net(bn)
      em.manual_seed(31)
      local l = { nn.Conv2d(3, 8, 3, { padding = 1 }) }
      if bn then l[#l + 1] = nn.BatchNorm2d(8) end
      l[#l + 1] = nn.ReLU()
      l[#l + 1] = nn.Conv2d(8, 8, 3, { padding = 1 })
      if bn then l[#l + 1] = nn.BatchNorm2d(8) end
      l[#l + 1] = nn.ReLU()
      l[#l + 1] = nn.MaxPool2d(2)
      l[#l + 1] = nn.Flatten()
      l[#l + 1] = nn.Linear(8 * 4 * 4, 4)
      local m = nn.Sequential(unpack(l))
      if dev ~= 'cpu' then m:to(dev) end
      return m
    end
    em.manual_seed(32)
    local x, t = on(em.randn(16, 3, 8, 8)), on(em.randint(1, 5, { 16 }):long())
    for _, dt in ipairs({ 'bfloat16', 'float16' }) do
      local plain = copies_in_step(net(false), x, t, dt)
      local with_bn = copies_in_step(net(true), x, t, dt)
      H.check(plain > 0, dt .. ': the counter counts the conv casts')
      H.eq(with_bn, plain, dt .. ': copies with two batch norms = copies without')
    end
    -- a few SGD steps with batch norm: bf16 autocast against float32, same init and data
    local function train(dt)
      local m = net(true)
      local opt = em.optim.SGD(m:parameters(), { lr = 0.05, momentum = 0.9 })
      local losses = {}
      for i = 1, 12 do
        opt:zero_grad()
        local loss = dt and em.amp.autocast(dt, function() return F.cross_entropy(m(x), t) end)
                     or F.cross_entropy(m(x), t)
        loss:backward()
        opt:step()
        losses[i] = loss:item()
      end
      for _, mod in ipairs(m:modules()) do
        if mod.running_mean then
          H.eq(mod.running_mean.dtype, 'float32', 'running stats float32 after training')
        end
      end
      return losses
    end
    local ref, low = train(nil), train('bfloat16')
    H.check(ref[12] < 0.5 * ref[1], ('float32 trains: %g -> %g'):format(ref[1], ref[12]))
    H.check(low[12] < 0.5 * low[1], ('bf16 trains: %g -> %g'):format(low[1], low[12]))
    for i = 1, 12 do
      H.check(math.abs(low[i] - ref[i]) <= 0.05 + 0.05 * ref[i],
        ('step %d loss bf16 %g vs float32 %g'):format(i, low[i], ref[i]))
    end
  end)
end

return A

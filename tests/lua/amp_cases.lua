--[[
amp_cases.lua -- autocast checks shared by test_amp.lua (CPU) and
test_cuda_amp.lua (emulated GPU): the dtype table of every listed op (output
dtype; values of the ops autocast runs in the low dtype against the float32
computation on the same rounded inputs, within a few of that dtype's ulps; the
ops it keeps in float32 against plain float32, to float32's own precision),
parameter gradients float32 and within a few low-dtype ulps of float32
training, and the GradScaler's inf-skip trace.
  local A = dofile(dir .. 'amp_cases.lua')
  A.run(H, em, device)
]]
local A = {}

-- relative tolerance of one op's result in a low dtype: about 4 ulps (bfloat16's
-- ulp at 1 is 2^-7, float16's 2^-10)
local tol = { bfloat16 = 3e-2, float16 = 4e-3 }
-- an op autocast keeps in float32 runs the float32 computation itself: it may
-- differ from plain float32 by rounding alone
local F32_TOL = 1e-6

function A.run(H, em, dev)
  local maxrel = H.maxrel
  local F = em.nn.F
  local amp = em.amp
  local function on(t) return dev == 'cpu' and t or t:to(dev) end

  -- op -> {inputs maker, fn, policy}; 'low' ops out in the low dtype, 'f32' in float32,
  -- 'keep' in their input's dtype
  local function cases()
    em.manual_seed(3)
    local x2 = on(em.randn(6, 8))
    local x2t = on(em.randn(6, 8)):t()        -- strided, 8x6
    local x3 = on(em.randn(2, 6, 8))
    local y3 = on(em.randn(2, 8, 5))
    local img = on(em.randn(2, 3, 7, 7))
    local wc = on(em.randn(4, 3, 3, 3)):mul(0.3)
    local bc = on(em.randn(4))
    local wl, bl = on(em.randn(5, 8)):mul(0.3), on(em.randn(5))
    local pos = on(em.rand(6, 8)):add(0.5)
    local tgt = on(em.tensor({ 1, 2, 3, 4, 5, 1 }):long())
    local rm, rv = on(em.zeros(3)), on(em.ones(3))
    local wn, bn = on(em.randn(8)), on(em.randn(8))
    local w1 = on(em.randn(3, 6, 3)):mul(0.3)
    return {
      { 'matmul', 'low', function(c) return c(x2):matmul(c(x2t)) end },
      { 'mm', 'low', function(c) return em.mm(c(x2), c(x2t)) end },
      { 'bmm', 'low', function(c) return c(x3):bmm(c(y3)) end },
      { 'mv', 'low', function(c) return c(x2):mv(c(x2t):select(2, 1)) end },
      { 'linear', 'low', function(c) return F.linear(c(x2), c(wl), c(bl)) end },
      { 'conv2d', 'low', function(c) return F.conv2d(c(img), c(wc), c(bc), 1, 1) end },
      { 'softmax', 'f32', function(c) return c(x2):softmax(-1) end },
      { 'log_softmax', 'f32', function(c) return F.log_softmax(c(x2), 2) end },
      { 'layer_norm', 'f32', function(c) return F.layer_norm(c(x2), { 8 }, c(wn), c(bn)) end },
      -- batch_norm keeps its input's dtype with float32 statistics ('keep')
      { 'batch_norm', 'keep', function(c) return F.batch_norm(c(img), rm:clone(), rv:clone(), wn:narrow(1, 1, 3), bn:narrow(1, 1, 3), true) end },
      { 'cross_entropy', 'f32', function(c) return F.cross_entropy(c(x2), tgt) end },
      { 'nll_loss', 'f32', function(c) return F.nll_loss(c(x2):log_softmax(-1), tgt) end },
      { 'mse_loss', 'f32', function(c) return F.mse_loss(c(x2), c(pos)) end },
      { 'bce_with_logits', 'f32', function(c) return F.binary_cross_entropy_with_logits(c(x2), c(pos):mul(0.5)) end },
      { 'sum', 'f32', function(c) return c(x2):sum(2) end },
      { 'mean', 'f32', function(c) return c(x2):mean() end },
      { 'var', 'f32', function(c) return c(x2):var(1) end },
      { 'std', 'f32', function(c) return c(x2):std() end },
      { 'norm', 'f32', function(c) return c(x2):norm() end },
      { 'logsumexp', 'f32', function(c) return c(x2):logsumexp(2) end },
      { 'exp', 'f32', function(c) return c(x2):exp() end },
      { 'log', 'f32', function(c) return c(pos):log() end },
      { 'pow', 'f32', function(c) return c(pos):pow(c(x2)) end },
      { 'tensor ^ tensor', 'f32', function(c) return c(pos) ^ c(x2) end },
      { 'tensor ^ number', 'f32', function(c) return c(x2t) ^ 3 end },
      { 'number ^ tensor', 'f32', function(c) return 2 ^ c(x2) end },
      { 'em.exp', 'f32', function(c) return em.exp(c(x2)) end },
      { 'cumsum', 'f32', function(c) return c(x2t):cumsum(2) end },
      { 'conv1d', 'low', function(c) return F.conv1d(c(x3), c(w1), c(bc):narrow(1, 1, 3), 1, 1) end },
      { 'sdpa', 'low', function(c) return F.scaled_dot_product_attention(c(x3), c(x3), c(x3), { causal = true }) end },
      { 'group_norm', 'f32', function(c) return F.group_norm(c(img), 3, c(wn):narrow(1, 1, 3), c(bn):narrow(1, 1, 3)) end },
      { 'rms_norm', 'f32', function(c) return F.rms_norm(c(x2), { 8 }, c(wn)) end },
      { 'l1_loss', 'f32', function(c) return F.l1_loss(c(x2), c(pos)) end },
      { 'smooth_l1_loss', 'f32', function(c) return F.smooth_l1_loss(c(x2), c(pos)) end },
      { 'huber_loss', 'f32', function(c) return F.huber_loss(c(x2), c(pos)) end },
    }
  end

  for _, dt in ipairs({ 'bfloat16', 'float16' }) do
    H.test(('autocast %s on %s: every listed op, dtype and values'):format(dt, dev), function()
      local low = function(t) return t:to(dt) end
      for _, case in ipairs(cases()) do
        local name, policy, fn = case[1], case[2], case[3]
        -- float32 inputs under autocast
        local got = amp.autocast(dt, fn, function(t) return t end)
        local want_dt = policy == 'low' and dt or 'float32'
        H.eq(got.dtype, want_dt, name .. ' dtype (float32 inputs)')
        H.eq(got.device, dev == 'cpu' and 'cpu' or 'cuda:0', name .. ' device')
        -- reference: float32 on the inputs rounded to dt (what autocast computes on
        -- for 'low' ops), or on the float32 inputs themselves ('f32' ops)
        local ref = fn(policy == 'low' and function(t) return low(t):float() end
                                       or function(t) return t end)
        local t = policy == 'low' and tol[dt] or F32_TOL
        H.check(maxrel(got, ref) <= t, ('%s: max rel error %g > %g'):format(name,
          maxrel(got, ref), t))
        -- low-dtype inputs: 'f32' ops cast them up (and agree with float32 on them)
        local got2 = amp.autocast(dt, fn, low)
        H.eq(got2.dtype, policy == 'keep' and dt or want_dt, name .. ' dtype (low inputs)')
        if policy == 'keep' then   -- float32 math on the low inputs, rounded once
          local ref2 = fn(function(t) return low(t):float() end)
          H.check(maxrel(got2, ref2) <= tol[dt], ('%s: low inputs, max rel error %g > %g')
            :format(name, maxrel(got2, ref2), tol[dt]))
        elseif policy == 'f32' then
          local ref2 = fn(function(t) return low(t):float() end)
          H.check(maxrel(got2, ref2) <= F32_TOL, ('%s: low inputs cast up exactly: max rel '
            .. 'error %g'):format(name, maxrel(got2, ref2)))
        end
      end
      -- outside autocast nothing changes
      local x = on(em.randn(3, 4))
      H.eq(x:matmul(x:t()).dtype, 'float32', 'matmul outside')
      H.eq(x:bfloat16():sum().dtype, 'bfloat16', 'sum outside keeps the dtype')
    end)
  end

  H.test('autocast on ' .. dev .. ': parameter gradients are float32 and match float32', function()
    em.manual_seed(11)
    local m = em.nn.Sequential(em.nn.Conv2d(3, 4, 3, { padding = 1 }), em.nn.ReLU(),
      em.nn.MaxPool2d(2), em.nn.Flatten(), em.nn.Linear(36, 5))
    if dev ~= 'cpu' then m:to(dev) end
    local x, t = on(em.randn(4, 3, 6, 6)), on(em.tensor({ 1, 2, 3, 4 }):long())
    local function grads(dt)
      m:zero_grad()
      local loss
      if dt then
        loss = amp.autocast(dt, function() return F.cross_entropy(m(x), t) end)
      else loss = F.cross_entropy(m(x), t) end
      H.eq(loss.dtype, 'float32', 'loss dtype')
      loss:backward()
      local gs = {}
      for _, p in ipairs(m:parameters()) do
        H.eq(p.dtype, 'float32', 'parameter dtype')
        H.eq(p.grad.dtype, 'float32', 'gradient dtype')
        gs[#gs + 1] = p.grad:clone()
      end
      return gs
    end
    -- the low-dtype forward and backward round at every op; here that stays within
    -- about one ulp of the largest gradient (0.0044 bf16, 0.0011 fp16), so 4 ulps
    -- (tol) hold it. This seed keeps every max-pool winner and relu sign as in
    -- float32: one flipped by rounding would move a whole gradient entry.
    local ref = grads(nil)
    for _, dt in ipairs({ 'bfloat16', 'float16' }) do
      local g = grads(dt)
      for i = 1, #ref do
        H.check(maxrel(g[i], ref[i]) <= tol[dt], ('%s grad %d: rel error %g > %g'):format(dt, i,
          maxrel(g[i], ref[i]), tol[dt]))
      end
    end
  end)

  H.test('GradScaler on ' .. dev .. ': an injected inf skips the step bit for bit, halves the scale', function()
    em.manual_seed(5)
    local m = em.nn.Linear(4, 3)
    if dev ~= 'cpu' then m:to(dev) end
    local opt = em.optim.SGD(m:parameters(), { lr = 0.1, momentum = 0.9 })
    local sc = amp.GradScaler{ init_scale = 1024, growth_interval = 3 }
    local x = on(em.randn(8, 4))
    local function step(inject)
      opt:zero_grad()
      local loss = amp.autocast('float16', function() return m(x):pow(2):mean() end)
      sc:scale(loss):backward()
      if inject then m.weight.grad:view(-1)[inject] = inject == 1 and math.huge or 0 / 0 end
      local stepped = sc:step(opt)
      sc:update()
      return stepped
    end
    local before = m.weight:clone()
    H.eq(step(nil), true, 'a clean step steps')
    H.check(not m.weight:eq(before):all():item(), 'weights moved')
    local w0, b0 = m.weight:clone(), m.bias:clone()
    H.eq(sc:get_scale(), 1024, 'scale kept before growth_interval')
    H.eq(step(1), false, 'inf: skipped')
    H.eq(sc:get_scale(), 512, 'inf: scale halved')
    H.check(m.weight:eq(w0):all():item() and m.bias:eq(b0):all():item(), 'weights bit-for-bit unchanged')
    H.eq(step(2), false, 'NaN: skipped')
    H.eq(sc:get_scale(), 256, 'NaN: halved again')
    H.check(m.weight:eq(w0):all():item(), 'still unchanged')
    for i = 1, 3 do H.eq(step(nil), true, 'clean step ' .. i) end
    H.eq(sc:get_scale(), 512, 'grown after growth_interval clean steps')
  end)
end

return A

--[[
test_amp.lua -- em.amp on the CPU: autocast's dtype table for every listed op
(amp_cases.lua, shared with test_cuda_amp.lua), parameter gradients, nesting and
errors; differentiable casts (finite differences in float64); float16/bfloat16
conv and pooling against float32 (the widening fallback), forward and backward;
the GradScaler's traces (inf skip, back-off and growth, unscale_ before
clip_grad_norm_, state_dict round trip, a disabled scaler), two replicas where
only one sees an inf (both skip), and a short bf16 autocast training run against
float32 on a synthetic task.
]]
local dir = (arg and arg[0] and arg[0]:match('^(.*/)')) or
            ((os.getenv('EMBER_TESTS') or 'tests') .. '/lua/')
local H = dofile(dir .. 'harness.lua')
local em = require 'ember'
local ember = arg[-1] or 'ember'
local F, amp = em.nn.F, em.amp

dofile(dir .. 'amp_cases.lua').run(H, em, 'cpu')

H.test('autocast nests, returns results, restores its state on error', function()
  H.eq(amp.autocast_dtype(), nil, 'off outside')
  local a, b, c = amp.autocast('bfloat16', function(p, q)
    local inner = amp.autocast('float16', function() return amp.autocast_dtype() end)
    local off = amp.autocast(false, function() return em.ones(2, 2):matmul(em.ones(2, 2)).dtype end)
    return inner, off, amp.autocast_dtype() .. p .. q
  end, '!', '?')
  H.eq({ a, b, c }, { 'float16', 'float32', 'bfloat16!?' }, 'nested results')
  H.raises(function()
    amp.autocast('bfloat16', function() amp.autocast('float16', function() error('inner boom') end) end)
  end, 'inner boom')
  H.eq(amp.autocast_dtype(), nil, 'state restored after an error')
  H.raises(function() amp.autocast('float32', function() end) end, 'autocast', "'bfloat16' or 'float16'", "'float32'")
  H.raises(function() amp.autocast('bfloat16', 42) end, 'autocast', 'expected a function')
  H.eq(amp.autocast_dtype(), nil, 'still off')
end)

H.test('autocast casts a parameter once per region', function()
  em.manual_seed(4)
  local m = em.nn.Linear(3, 3)
  local x = em.randn(2, 3)
  -- the same weight used twice: one cached cast, gradients from both uses
  local n0 = em.copy_count()
  local y = amp.autocast('bfloat16', function() return m(m(x)) end)
  H.eq(em.copy_count() - n0, 3, 'casts in the region: the weight and the bias once each, and x')
  y:float():sum():backward()
  -- the same in float32 on the values autocast computes on: the parameters, the
  -- input and the first layer's output rounded to bfloat16
  local ref = em.nn.Linear(3, 3)
  em.no_grad(function()
    ref.weight:copy_(m.weight:bfloat16():float()); ref.bias:copy_(m.bias:bfloat16():float())
  end)
  ref(ref(x:bfloat16():float()):bfloat16():float()):sum():backward()
  H.eq(m.weight.grad.dtype, 'float32', 'grad dtype')
  -- what is left is bfloat16's rounding of the backward (about one ulp, 2^-7, of
  -- the largest gradient); a lost use would be off by a whole term
  local d = (m.weight.grad - ref.weight.grad):abs():max():item()
  local s = ref.weight.grad:abs():max():item()
  H.check(d <= 3e-2 * s, ('two uses accumulate: max diff %g, largest gradient %g'):format(d, s))
end)

H.test('casts are differentiable (finite differences in float64)', function()
  for _, chain in ipairs({
    { 'float32', 'float64' }, { 'float64', 'float32', 'float64' },
    { 'bfloat16', 'float64' }, { 'float16', 'float64' }, { 'float32', 'bfloat16', 'float64' } }) do
    local x = em.randn(3, 4):double():requires_grad_()
    local function f(t)
      for _, d in ipairs(chain) do t = t:to(d) end
      return (t * t):sum()
    end
    f(x):backward()
    H.eq(x.grad.dtype, 'float64', 'grad dtype follows the input')
    -- the function through a low cast is piecewise constant in the rounding, so the
    -- reference is the analytic grad of the rounded value: 2 * rounded(x)
    local r = x:detach()
    for _, d in ipairs(chain) do r = r:to(d) end
    local want = r:double() * 2
    if chain[1] == 'float32' and #chain == 2 then
      -- a float32 round trip is smooth enough to difference
      local eps, xd = 1e-3, x:detach()
      local e = em.zeros(3, 4):double(); e:view(-1)[5] = eps
      local fd = (f(xd + e):item() - f(xd - e):item()) / (2 * eps)
      H.close(H.num(x.grad:view(-1)[5]), fd, 1e-3, 'finite difference')
    end
    H.close(H.flat(x.grad), H.flat(want), 1e-6, table.concat(chain, '->'))
  end
  -- to() / float() / half() / bfloat16() / type() keep the graph
  local x = em.randn(2, 2):requires_grad_()
  x:to('bfloat16'):float():sum():backward()
  H.eq(H.flat(x.grad), { 1, 1, 1, 1 }, 'to(bfloat16):float()')
  x.grad = nil
  x:half():type('float64'):to{ dtype = 'float32' }:bfloat16():double():sum():backward()
  H.eq(H.flat(x.grad), { 1, 1, 1, 1 }, 'half/type/to{}/bfloat16/double chain')
end)

H.test('float16/bfloat16 conv2d and pooling on the CPU, forward and backward, against float32', function()
  em.manual_seed(2)
  local x0 = em.randn(2, 4, 9, 9)
  local w0 = em.randn(6, 2, 3, 3):mul(0.3)
  local b0 = em.randn(6)
  local xs = em.randn(2, 9, 9, 4):permute(1, 4, 2, 3)   -- strided input
  for _, dt in ipairs({ 'bfloat16', 'float16' }) do
    for _, xin in ipairs({ x0, xs }) do
      local function run(d)
        local x = xin:to(d):detach():requires_grad_()
        local w = w0:to(d):detach():requires_grad_()
        local b = b0:to(d):detach():requires_grad_()
        local y = F.conv2d(x, w, b, 2, 1, 1, 2)
        local p = F.max_pool2d(y, 2) + F.avg_pool2d(y, 2, 1):narrow(3, 1, 2):narrow(4, 1, 2)
          + F.adaptive_avg_pool2d(y, { 2, 2 })
        ;(p:float() * em.arange(1, p:numel() + 1):float():view(p.shape)):sum():backward()
        return { y, p, x.grad, w.grad, b.grad }
      end
      -- the reference computes in float32 on the same rounded inputs
      local lo = run(dt)
      local x32 = xin:to(dt):float()
      local function ref()
        local x = x32:detach():requires_grad_()
        local w = w0:to(dt):float():requires_grad_()
        local b = b0:to(dt):float():requires_grad_()
        local y = F.conv2d(x, w, b, 2, 1, 1, 2)
        local yr = y:to(dt):float()
        local p = F.max_pool2d(yr, 2) + F.avg_pool2d(yr, 2, 1):narrow(3, 1, 2):narrow(4, 1, 2)
          + F.adaptive_avg_pool2d(yr, { 2, 2 })
        ;(p * em.arange(1, p:numel() + 1):float():view(p.shape)):sum():backward()
        return { y, p, x.grad, w.grad, b.grad }
      end
      local hi = ref()
      local names = { 'conv out', 'pool out', 'grad x', 'grad w', 'grad b' }
      -- one ulp of the largest value (bfloat16 2^-7, float16 2^-10): each result is
      -- the float32 one rounded once (half an ulp), with room for the roundings
      -- between the conv and the pools
      local t = dt == 'bfloat16' and 2 ^ -7 or 2 ^ -10
      for i = 1, 5 do
        H.eq(lo[i].dtype, dt, names[i] .. ' dtype')
        local d = (lo[i]:float() - hi[i]):abs():max():item()
        local s = hi[i]:abs():max():item()
        H.check(d <= t * s, ('%s %s: max abs diff %g (scale %g)'):format(dt, names[i], d, s))
      end
    end
  end
  H.raises(function() F.conv2d(em.ones(1, 1, 3, 3):bfloat16(), em.ones(1, 1, 3, 3)) end,
    'conv2d', 'weight has dtype float32 but input is bfloat16')
end)

H.test('GradScaler: unscale_ then clip, state_dict round trip, options, disabled', function()
  local m = em.nn.Linear(3, 2)
  local opt = em.optim.SGD(m:parameters(), { lr = 0.5 })
  local sc = amp.GradScaler{ init_scale = 64, growth_factor = 4, backoff_factor = 0.25, growth_interval = 2 }
  local x = em.randn(5, 3)
  local loss = m(x):pow(2):sum()
  sc:scale(loss):backward()
  local g64 = m.weight.grad:clone()
  sc:unscale_(opt)
  H.close(H.flat(m.weight.grad), H.flat(g64 / 64), 1e-6, 'unscale_ divides by the scale')
  H.raises(function() sc:unscale_(opt) end, 'unscale_', 'already called')
  em.nn.utils.clip_grad_norm_(m:parameters(), 0.01)
  local clipped = m.weight.grad:clone()
  local w0 = m.weight:clone()
  H.eq(sc:step(opt), true, 'stepped')
  H.close(H.flat(m.weight), H.flat(w0 - clipped * 0.5), 1e-6, 'the step used the clipped unscaled grads')
  sc:update()
  local sd = sc:state_dict()
  H.eq({ sd.scale, sd._growth_tracker, sd.growth_factor, sd.backoff_factor, sd.growth_interval },
    { 64, 1, 4, 0.25, 2 }, 'state_dict')
  local sc2 = amp.GradScaler{}
  sc2:load_state_dict(sd)
  H.eq(sc2:state_dict(), sd, 'round trip')
  -- one more clean step grows both the same way
  for _, s in ipairs({ sc, sc2 }) do
    opt:zero_grad(); s:scale(m(x):pow(2):sum()):backward(); s:step(opt); s:update()
  end
  H.eq({ sc:get_scale(), sc2:get_scale() }, { 256, 256 }, 'growth by growth_factor after growth_interval')
  -- back-off by backoff_factor
  opt:zero_grad(); sc:scale(m(x):pow(2):sum()):backward()
  m.bias.grad:view(-1)[1] = -math.huge
  H.eq(sc:step(opt), false, 'skipped'); sc:update()
  H.eq(sc:get_scale(), 64, 'backoff_factor')
  H.raises(function() amp.GradScaler{ growth_factor = 0.5 } end, 'GradScaler', 'growth_factor')
  H.raises(function() amp.GradScaler{ init_scal = 2 } end, "unknown option 'init_scal'")
  local off = amp.GradScaler{ enabled = false }
  local l = m(x):sum()
  H.check(off:scale(l) == l, 'disabled: scale is the identity')
  opt:zero_grad(); l:backward()
  H.eq(off:step(opt), true, 'disabled: steps'); off:update()
  H.eq(off:get_scale(), 1, 'disabled scale')
end)

H.test('GradScaler notes the profiler', function()
  local prof = require 'ember.profile'
  H.eq(type(prof.note), 'function', 'em.profile.note')
  local seen = {}
  local orig = prof.note
  prof.note = function(name, f) seen[#seen + 1] = { name, f.scale, f.found_inf } end
  local ok, err = pcall(function()
    local m = em.nn.Linear(2, 2)
    local opt = em.optim.SGD(m:parameters(), { lr = 0.1 })
    local sc = amp.GradScaler{ init_scale = 8 }
    sc:scale(m(em.ones(1, 2)):sum()):backward(); sc:step(opt); sc:update()
  end)
  prof.note = orig
  H.check(ok, tostring(err))
  H.eq(seen, { { 'amp.scaler', 8, false } }, 'one note per update')
end)

H.test('two replicas, an inf on one: both skip together', function()
  local L = dofile(dir .. 'dist/launch.lua')(dir, ember)
  local out, rc = L.replicas(2, 'amp_scaler.lua')
  H.eq(rc, 0, 'exit status: ' .. out)
  for r = 0, 1 do
    H.check(out:find(('rank %d step 1 stepped=true scale=256 unchanged=false'):format(r), 1, true), out)
    H.check(out:find(('rank %d step 2 stepped=false scale=128 unchanged=true'):format(r), 1, true), out)
    H.check(out:find(('rank %d step 3 stepped=true scale=128 unchanged=false'):format(r), 1, true), out)
  end
end)

H.test('bf16 autocast training reaches float32 accuracy on a synthetic task', function()
  -- 4 gaussian classes in 16-d, a small MLP; the same data, init and steps
  em.manual_seed(21)
  local n, d, k = 512, 16, 4
  local centers = em.randn(k, d):mul(1.2)
  local y = em.randint(1, k + 1, { n }):long()
  local x = centers:index_select(1, y) + em.randn(n, d)
  local yt = em.randint(1, k + 1, { n }):long()
  local xt = centers:index_select(1, yt) + em.randn(n, d)
  local function train(dt)
    em.manual_seed(5)
    local m = em.nn.Sequential(em.nn.Linear(d, 64), em.nn.ReLU(), em.nn.Linear(64, k))
    local opt = em.optim.SGD(m:parameters(), { lr = 0.1, momentum = 0.9 })
    for epoch = 1, 15 do
      for i = 1, n, 64 do
        local xb, yb = x:narrow(1, i, 64), y:narrow(1, i, 64)
        opt:zero_grad()
        local loss = dt and amp.autocast(dt, function() return F.cross_entropy(m(xb), yb) end)
                        or F.cross_entropy(m(xb), yb)
        loss:backward()
        opt:step()
      end
    end
    local pred = em.no_grad(function() return m(xt):argmax(2) end)
    return pred:eq(yt):float():mean():item() * 100
  end
  local a32, a16 = train(nil), train('bfloat16')
  H.check(a32 > 80, 'float32 learns: ' .. a32)
  H.check(math.abs(a16 - a32) <= 0.3 + 100 / n, ('bf16 %.2f%% vs float32 %.2f%%'):format(a16, a32))
end)

H.done()

--[[
test_compile.lua -- em.compile on the CPU: a step captured once and replayed
gives the eager step's results bit for bit (losses, weights, gradients, batch
norm's running statistics) for an MLP with dropout and Adam, a CNN with batch
norm and SGD momentum, the GPT example's blocks with AdamW, AdamW under a
learning-rate schedule; on strided and
broadcast inputs; two replicas whose wrapped model's gradient averaging is
replayed (equal to eager, equal across replicas); the fused ReLU backward and
the fused conv + ReLU give the unfused calls' bits (zero signs, NaN) on every conv
path, and a conv whose output is read again stays unfused; batch norm fused with
the ReLU after it gives eager's bits on every batch-norm path; max pooling's backward
fused with the ReLU backward after it gives the unfused bits; element-wise chains
run tile by tile give eager's bits in every dtype, on strided and broadcast inputs,
in place, in training, and hold tile-sized temporaries; the memory plan keeps the compiled step under the eager
step's peak and leaves constants alone; a new signature captures again; reading a value inside the
step runs it eagerly and explain() says where; check = true names the first
call that differs; results are the caller's own; EMBER_COMPILE=0; errors.
]]
local dir = (arg and arg[0] and arg[0]:match('^(.*/)')) or
            ((os.getenv('EMBER_TESTS') or 'tests') .. '/lua/')
local H = dofile(dir .. 'harness.lua')
local em = require 'ember'
local nn, F = em.nn, em.nn.F

-- Two copies of one model and optimizer (same seed), a step for each.
local function twins(build, optimizer)
  local out = {}
  for k = 1, 2 do
    em.manual_seed(11)
    local m = build()
    out[k] = { m = m, opt = optimizer(m) }
  end
  return out[1], out[2]
end

local function train_step(t)
  return function(x, y)
    t.opt:zero_grad()
    local loss = F.cross_entropy(t.m(x), y)
    loss:backward()
    t.opt:step()
    return loss
  end
end

-- Runs eager and compiled over the batches from the same random state; checks
-- every loss, then every parameter, gradient and buffer, for exact equality.
local function same_training(name, a, b, batches, compiled, between)
  local eager = train_step(a)
  em.manual_seed(5)
  local le = {}
  for i, bt in ipairs(batches) do
    le[i] = eager(bt[1], bt[2]):item()
    if between then between(a, i) end
  end
  em.manual_seed(5)
  local lc = {}
  for i, bt in ipairs(batches) do
    lc[i] = compiled(bt[1], bt[2]):item()
    if between then between(b, i) end
  end
  H.eq(lc, le, name .. ': losses of each step')
  local pa, pb = a.m:parameters(), b.m:parameters()
  local worst, gworst = 0, 0
  for i = 1, #pa do
    worst = math.max(worst, (pa[i] - pb[i]):abs():max():item())
    gworst = math.max(gworst, (pa[i].grad - pb[i].grad):abs():max():item())
  end
  H.eq(worst, 0, name .. ': largest weight difference')
  H.eq(gworst, 0, name .. ': largest gradient difference')
  local ba, bb = a.m:buffers(), b.m:buffers()
  for i = 1, #ba do
    H.eq(H.flat(bb[i]), H.flat(ba[i]), name .. ': buffer ' .. i)
  end
end

-- Values, zero signs and NaN of t, for bit-for-bit comparisons.
local function exact(t)
  local out = {}
  for i, v in ipairs(t:double():contiguous():view(-1):totable()) do
    out[i] = v ~= v and 'nan' or (v == 0 and (1 / v < 0 and '-0' or '+0') or ('%.17g'):format(v))
  end
  return table.concat(out, ' ')
end

H.test('MLP with dropout and Adam: replays equal eager steps, strided inputs', function()
  local a, b = twins(function()
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Dropout(0.3), nn.Linear(16, 3))
  end, function(m) return em.optim.Adam(m:parameters(), { lr = 0.01 }) end)
  local batches = {}
  em.manual_seed(3)
  for i = 1, 6 do
    -- transposed views: the step sees strided inputs
    batches[i] = { em.randn(8, 4):t(), em.randint(1, 4, { 4 }, { dtype = 'int64' }) }
  end
  local step = em.compile(train_step(b))
  same_training('mlp', a, b, batches, step)
  local s = step:stats()
  H.eq({ s.captures, s.replays, s.breaks }, { 1, 5, 0 }, 'captures, replays, breaks')
  H.check(s.kernels > 10 and s.ops >= s.kernels, 'kernels counted: ' .. s.kernels)
  H.eq(s.fused, 1, 'the ReLU backward fused')
  H.check(s.peak_bytes > 0, 'held bytes reported')
  H.check(step:explain():find('replayed', 1, true), 'explain: ' .. step:explain())
  -- Adam's step count moved on with the replays
  H.eq(b.opt.state[1].step, 6, 'Adam step count after 6 calls')
end)

H.test('CNN with batch norm and SGD momentum: equal, running stats too, broadcast input', function()
  local a, b = twins(function()
    return nn.Sequential(nn.Conv2d(2, 4, 3, { padding = 1 }), nn.BatchNorm2d(4), nn.ReLU(),
                         nn.MaxPool2d(2), nn.Flatten(), nn.Linear(4 * 4 * 4, 5))
  end, function(m) return em.optim.SGD(m:parameters(), { lr = 0.05, momentum = 0.9 }) end)
  local batches = {}
  em.manual_seed(4)
  for i = 1, 5 do
    -- one image broadcast over the batch (a stride-0 input), or a sum over it
    local base = em.randn(1, 2, 8, 8):expand(6, 2, 8, 8)
    local x = i % 2 == 1 and base or base + em.randn(6, 1, 1, 1)
    batches[i] = { x, em.randint(1, 6, { 6 }, { dtype = 'int64' }) }
  end
  same_training('cnn', a, b, batches, em.compile(train_step(b)))
end)

H.test('channels-last CNN: equal, and a ReLU backward fused in that layout', function()
  local a, b = twins(function()
    local m = nn.Sequential(nn.Conv2d(3, 8, 3, { padding = 1 }), nn.ReLU(), nn.MaxPool2d(2),
                            nn.Conv2d(8, 8, 3, { padding = 1 }), nn.ReLU(), nn.Flatten(),
                            nn.Linear(8 * 4 * 4, 4))
    m:to{ memory_format = 'channels_last' }
    return m
  end, function(m) return em.optim.Adam(m:parameters(), { lr = 1e-2 }) end)
  local batches = {}
  em.manual_seed(6)
  for i = 1, 4 do
    batches[i] = { em.randn(5, 3, 8, 8):to_channels_last(),
                   em.randint(1, 4, { 5 }, { dtype = 'int64' }) }
  end
  local step = em.compile(train_step(b))
  same_training('channels-last cnn', a, b, batches, step)
  -- the first ReLU's gradient comes from max pooling, channels-last like its
  -- input: fused; the second's from flatten, in NCHW order against a
  -- channels-last input: left as it is (no flat pass covers both layouts)
  H.eq(step:stats().fusions, { relu_backward = 1, conv2d_relu = 2 },
       'the ReLU backward whose tensors share a layout, and both conv + ReLU, fused')
end)

H.test('GPT blocks (the example\'s model) with AdamW: replays equal eager steps', function()
  local GPT = dofile(dir .. '../../examples/gpt_model.lua')
  local function step_of(t)
    return function(x, y)
      t.opt:zero_grad()
      local loss = F.cross_entropy(t.m(x):reshape(-1, 32), y:reshape(-1))
      loss:backward()
      t.opt:step()
      return loss
    end
  end
  local a, b = twins(function()
    return GPT.build{ vocab = 32, layers = 2, dim = 32, heads = 4, context = 16 }
  end, function(m) return em.optim.AdamW(m:parameters(), { lr = 1e-3 }) end)
  em.manual_seed(5)
  local batches = {}
  for i = 1, 4 do
    batches[i] = { em.randint(1, 33, { 3, 16 }, { dtype = 'int64' }),
                   em.randint(1, 33, { 3, 16 }, { dtype = 'int64' }) }
  end
  local eager, compiled = step_of(a), em.compile(step_of(b))
  local le, lc = {}, {}
  for i, bt in ipairs(batches) do
    le[i] = eager(bt[1], bt[2]):item()
    lc[i] = compiled(bt[1], bt[2]):item()
  end
  H.eq(lc, le, 'losses of each step')
  local worst = 0
  local pa, pb = a.m:parameters(), b.m:parameters()
  for i = 1, #pa do worst = math.max(worst, (pa[i] - pb[i]):abs():max():item()) end
  H.eq(worst, 0, 'largest weight difference')
  H.eq(compiled:stats().replays, 3, 'replayed')
end)

H.test('AdamW under a StepLR schedule: the replays see each new rate', function()
  local a, b = twins(function() return nn.Sequential(nn.Linear(5, 7), nn.Tanh(), nn.Linear(7, 2)) end,
    function(m)
      local opt = em.optim.AdamW(m:parameters(), { lr = 0.05, weight_decay = 0.1 })
      return opt
    end)
  a.sched = em.optim.StepLR(a.opt, { step_size = 2, gamma = 0.5 })
  b.sched = em.optim.StepLR(b.opt, { step_size = 2, gamma = 0.5 })
  local batches = {}
  em.manual_seed(8)
  for i = 1, 6 do batches[i] = { em.randn(3, 5), em.randint(1, 2, { 3 }, { dtype = 'int64' }) } end
  same_training('adamw', a, b, batches, em.compile(train_step(b)),
                function(t) t.sched:step() end)
  H.close(b.opt.lr, 0.05 * 0.125, 1e-12, 'rate after the schedule')
end)

H.test('fused ReLU backward: the unfused calls\' values, signs of zero and NaN included', function()
  -- the gradient reaching relu: g = (relu(x) * c):sum() wrt relu's output is c,
  -- a tensor with negatives, infinities and NaN; x has negatives, zeros, NaN
  local xs = { -2, -0.0, 0, 1, 3, 0 / 0, -1, 2 }
  local cs = { -1.5, 2, -3, 0 / 0, 1 / 0, 4, -1 / 0, -0.0 }
  local function run(compiled, dtype)
    local x = em.tensor(xs, { dtype = dtype }):requires_grad_()
    local c = em.tensor(cs, { dtype = dtype })
    local f = function(xx, cc)
      x.grad = nil
      local y = (x:relu() * cc):sum()
      y:backward()
      return x.grad
    end
    if compiled then f = em.compile(f) end
    local g
    for _ = 1, 3 do g = f(x:detach(), c) end
    return g, compiled and f or nil
  end
  for _, dtype in ipairs({ 'float32', 'float64', 'bfloat16' }) do
    local want = run(false, dtype)
    local got, f = run(true, dtype)
    H.eq(exact(got:float()), exact(want:float()), dtype .. ': gradient values, zero signs and NaN')
    H.eq(f:stats().fused, 1, dtype .. ': one fused call')
    H.check(f:explain():find('(1 fused: 1 relu_backward)', 1, true), 'explain: ' .. f:explain())
  end
end)

H.test('fused conv + ReLU: eager bits on every conv path, NaN kept; not fused where the conv\'s output is read', function()
  -- with_nan: x carries a NaN, so some conv outputs are NaN, which ReLU keeps
  -- (the gradients are then NaN: they are compared without it); the ReLU
  -- backward asks the fused conv's output where the conv's was > 0
  local function run(compiled, c, uses_h, with_nan)
    em.manual_seed(7)
    local conv = nn.Conv2d(c.C, 8, 3, { padding = 1 })
    conv:to{ dtype = c.dtype }
    local x = em.randn(2, c.C, 5, 5, { dtype = c.dtype })
    local nan = em.zeros(x:numel(), { dtype = c.dtype })
    if with_nan then nan[3] = 0 / 0 end
    x = (x:view(-1) + nan):view(2, c.C, 5, 5)
    if c.cl then conv:to{ memory_format = 'channels_last' }; x = x:to_channels_last() end
    local f = function(xx)
      conv:zero_grad()
      local h = conv(xx)
      local y = h:relu()
      if uses_h then y = y + h end
      ;(y * y):sum():backward()
      return y
    end
    if compiled then f = em.compile(f) end
    local before = c.kernels and em.cpu_kernels(c.kernels)
    local y
    for _ = 1, 3 do y = f(x) end
    if before then em.cpu_kernels(before) end
    return y, conv.weight.grad, conv.bias.grad, compiled and f
  end
  local cases = {
    { dtype = 'float32', C = 1, name = 'float32 NCHW, im2col' },
    { dtype = 'float32', C = 8, name = 'float32 NCHW, C = 8 (no im2col where AVX-512 runs)' },
    { dtype = 'float64', C = 3, name = 'float64 NCHW' },
    { dtype = 'bfloat16', C = 8, name = 'bfloat16 NCHW (widened)' },
    { dtype = 'float32', C = 8, cl = true, name = 'float32 channels-last (oneDNN)' },
    { dtype = 'bfloat16', C = 8, cl = true, name = 'bfloat16 channels-last (oneDNN)' },
    { dtype = 'float32', C = 8, cl = true, kernels = 'ours', name = 'float32 channels-last, ours' },
  }
  for _, c in ipairs(cases) do
    local yn = run(false, c, false, true)
    local ync = run(true, c, false, true)
    H.eq(exact(ync), exact(yn), c.name .. ': output with NaN, zero signs')
    local ye, gwe, gbe = run(false, c)
    local yc, gwc, gbc, f = run(true, c)
    H.eq(exact(yc), exact(ye), c.name .. ': output')
    H.eq({ exact(gwc), exact(gbc) }, { exact(gwe), exact(gbe) }, c.name .. ': weight and bias gradients')
    H.check(f:explain():find('conv2d_relu', 1, true), c.name .. ': explain names the fusion: ' .. f:explain())
    H.check(f:stats().fusions.conv2d_relu == 1, c.name .. ': one conv2d_relu')
  end
  -- the conv's own output is read again: it has to exist, so no fusion
  local c = cases[2]
  local ye, gwe = run(false, c, true)
  local yc, gwc, _, f = run(true, c, true)
  H.eq({ exact(yc), exact(gwc) }, { exact(ye), exact(gwe) }, 'relu(h) + h: output and weight gradient')
  H.eq(f:stats().fusions.conv2d_relu, nil, 'relu(h) + h: the conv stays unfused')
end)

H.test('fused batch norm + ReLU: eager bits on every batch-norm path, running stats, NaN kept', function()
  local function run(compiled, c, with_nan)
    em.manual_seed(3)
    local m = nn.Sequential(nn.Conv2d(3, 6, 3, { padding = 1 }), nn.BatchNorm2d(6), nn.ReLU())
    if not c.amp then m:to{ dtype = c.dtype } end
    if c.cl then m:to{ memory_format = 'channels_last' } end
    if c.eval then m:eval() end
    local x = em.randn(4, 3, 6, 6, { dtype = c.dtype })
    local nan = em.zeros(x:numel(), { dtype = c.dtype })
    if with_nan then nan[7] = 0 / 0 end
    x = (x:view(-1) + nan):view(4, 3, 6, 6)
    if c.cl then x = x:to_channels_last() end
    local f = function(xx)
      m:zero_grad()
      local y = c.amp and em.amp.autocast('bfloat16', function() return m(xx) end) or m(xx)
      ;(y:float() * y:float()):sum():backward()
      return y
    end
    if compiled then f = em.compile(f) end
    local y
    for _ = 1, 3 do y = f(x) end
    local out = { exact(y) }
    for _, p in ipairs(m:parameters()) do out[#out + 1] = exact(p.grad) end
    for _, b in ipairs(m:buffers()) do out[#out + 1] = exact(b) end
    return out, compiled and f
  end
  for _, c in ipairs({
    { dtype = 'float32', name = 'float32 NCHW' }, { dtype = 'float64', name = 'float64 NCHW' },
    { dtype = 'float32', cl = true, name = 'float32 channels-last' },
    { dtype = 'float32', amp = true, name = 'bfloat16 autocast NCHW' },
    { dtype = 'float32', amp = true, cl = true, name = 'bfloat16 autocast channels-last' },
    { dtype = 'float32', eval = true, name = 'float32 NCHW, eval' },
  }) do
    local yn = run(false, c, true)
    local ync = run(true, c, true)
    H.eq(ync[1], yn[1], c.name .. ': output with NaN')
    local want = run(false, c)
    local got, f = run(true, c)
    H.eq(got, want, c.name .. ': output, gradients, running statistics')
    H.eq(f:stats().fusions.batch_norm_relu, 1, c.name .. ': batch_norm_relu fused')
  end
end)

H.test('fused max-pool backward + ReLU backward: eager bits, NaN and ties included', function()
  -- conv, ReLU, max pool, as in the CNNs: the pooled gradient and ReLU's backward
  -- become one pass. The input has a block of equal values (ties in the pooling
  -- windows, ReLU's zeros among them), and with_nan a NaN (then every gradient
  -- is NaN: the outputs are compared)
  local function run(compiled, dtype, C, with_nan)
    em.manual_seed(9)
    local m = nn.Sequential(nn.Conv2d(C, 4, 3, { padding = 1 }), nn.ReLU(), nn.MaxPool2d(2),
                            nn.Flatten(), nn.Linear(4 * 3 * 3, 3))
    m:to{ dtype = dtype }
    local x = em.randn(3, C, 6, 6, { dtype = dtype })
    local special = em.zeros(x:numel(), { dtype = dtype })
    if with_nan then special[5] = 0 / 0 end
    x = (x:view(-1) + special):view(3, C, 6, 6)
    x:narrow(1, 2, 1):fill_(-1)   -- sample 2: every conv output equals its bias
    local f = function(xx)
      m:zero_grad()
      local out = m(xx)
      ;(out * out):sum():backward()
      return out
    end
    if compiled then f = em.compile(f) end
    local out
    for _ = 1, 3 do out = f(x) end
    local g = {}
    for i, p in ipairs(m:parameters()) do g[i] = p.grad end
    return out, g, compiled and f
  end
  for _, c in ipairs({ { 'float32', 1 }, { 'float32', 3 }, { 'float64', 2 } }) do
    local name = c[1] .. ', C = ' .. c[2]
    H.eq(exact(run(true, c[1], c[2], true)), exact(run(false, c[1], c[2], true)),
         name .. ': output with NaN')
    local oe, ge = run(false, c[1], c[2])
    local oc, gc, f = run(true, c[1], c[2])
    H.eq(exact(oc), exact(oe), name .. ': output')
    for i = 1, #ge do H.eq(exact(gc[i]), exact(ge[i]), name .. ': gradient of parameter ' .. i) end
    H.eq(f:stats().fusions, { conv2d_relu = 1, max_pool2d_backward_relu = 1 }, name .. ': fusions')
  end
end)

H.test('element-wise chains run tile by tile: eager bits in every dtype, strided and broadcast inputs', function()
  local fns = {
    gelu = function(x, b)
      return 0.5 * x * (1 + ((x + 0.044715 * x * x * x) * 0.7978845608):tanh()) + b
    end,
    casts = function(x, b) return ((x * 2 + b):exp():clamp(0, 3) - x:sigmoid()):float() end,
    where = function(x, b) return em.where(x:gt(0), x * b, x:neg()):sqrt() end,
    in_place = function(x, b) local y = x * 2; y:add_(b); y:mul_(y); return y end,
    two_results = function(x, b) local h = x * b; return h, (h + 1):relu() end,
  }
  for _, dtype in ipairs({ 'float32', 'float64', 'bfloat16' }) do
    for _, name in ipairs({ 'gelu', 'casts', 'where', 'in_place', 'two_results' }) do
      em.manual_seed(1)
      -- x: a transposed view, which the tiles slice along its outer dimension in
      -- memory (35 of 64, then 29); b: 7 values broadcast over it. New values
      -- each call, so that an element a replay leaves unwritten shows
      local f = em.compile(fns[name])
      local x, b, g1, g2
      for _ = 1, 3 do
        x = em.randn(64, 33, 7, { dtype = dtype }):transpose(1, 2)
        b = em.randn(7, { dtype = dtype })
        g1, g2 = f(x, b)
      end
      local w1, w2 = fns[name](x, b)
      local what = dtype .. ' ' .. name
      H.eq(exact(g1), exact(w1), what .. ': bit for bit')
      if w2 then H.eq(exact(g2), exact(w2), what .. ': second result') end
      H.eq(f:stats().fusions, { elementwise_chain = 1 }, what .. ': one chain')
    end
  end
  -- the chain's temporaries shrink to tiles: a 10-call chain over 1 Mi floats
  -- holds its input copy, the broadcast vector and its result; explain() and the
  -- profiler name the ops inside
  local f = em.compile(fns.gelu)
  local x, b = em.randn(256, 4096), em.randn(4096)
  for _ = 1, 2 do f(x, b) end
  local ops = 'mul, mul, mul, mul, add, mul, tanh, add, mul, add'
  H.check(f:explain():find('fused elementwise_chain: ' .. ops, 1, true), 'explain: ' .. f:explain())
  em.profile.start {}
  f(x, b)
  em.profile.step()
  local names = {}
  for _, o in ipairs(em.profile.stop().top_ops) do names[o.name] = o.calls end
  H.eq(names['elementwise_chain(' .. ops .. ')'], 1, 'the profile names the fused region and its ops')
  local held = f:stats().peak_bytes
  H.check(held < 2.2 * x:numel() * 4, ('held %.1f MiB for two 4 MiB tensors'):format(held / 2 ^ 20))
  -- too small to pay (4095 elements), and slices too wide for a cache: unfused
  for _, shape in ipairs({ { 4095 }, { 2, 70000 } }) do
    local g = em.compile(fns.gelu)
    local xs, bs = em.randn(shape), em.randn(shape[#shape])
    H.eq(exact(g(xs, bs)), exact(fns.gelu(xs, bs)), 'shape ' .. shape[#shape] .. ': values')
    g(xs, bs)
    H.eq(g:stats().fused, 0, 'shape ' .. table.concat(shape, 'x') .. ': no chain')
  end
end)

H.test('element-wise chains in training: a GELU MLP with Adam equals eager, forward and backward chained', function()
  local Gelu = nn.Module:extend('TanhGelu')
  function Gelu:forward(x)
    return 0.5 * x * (1 + ((x + 0.044715 * x * x * x) * 0.7978845608):tanh())
  end
  local a, b = twins(function()
    return nn.Sequential(nn.Linear(24, 128), Gelu(), nn.Linear(128, 128), Gelu(), nn.Linear(128, 5))
  end, function(m) return em.optim.Adam(m:parameters(), { lr = 1e-2 }) end)
  local batches = {}
  em.manual_seed(8)
  for i = 1, 4 do
    batches[i] = { em.randn(24, 64):t(), em.randint(1, 5, { 64 }, { dtype = 'int64' }) }
  end
  local step = em.compile(train_step(b))
  same_training('gelu mlp', a, b, batches, step)
  local chains = step:stats().fusions.elementwise_chain or 0
  H.check(chains >= 4, 'the GELUs forward and backward chained: ' .. step:explain())
end)

H.test('memory plan: the compiled step holds less than the eager step\'s peak', function()
  local function measure(compiled)
    local _, b = twins(function()
      return nn.Sequential(nn.Conv2d(3, 16, 3, { padding = 1 }), nn.ReLU(), nn.Conv2d(16, 16, 3,
        { padding = 1 }), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(), nn.Linear(16 * 8 * 8, 10))
    end, function(m) return em.optim.Adam(m:parameters(), { lr = 1e-3 }) end)
    local step = train_step(b)
    if compiled then step = em.compile(step) end
    em.manual_seed(2)
    local x, y = em.randn(32, 3, 16, 16), em.randint(1, 10, { 32 }, { dtype = 'int64' })
    step(x, y); step(x, y)
    em.collect()
    em.reset_peak_memory_stats()
    for _ = 1, 3 do step(x, y) end
    return em.memory_stats().peak, compiled and step:stats() or nil
  end
  local eager = measure(false)
  local compiled, s = measure(true)
  H.check(compiled <= eager, ('compiled peak %d <= eager peak %d'):format(compiled, eager))
  H.check(s.replays == 4, 'replayed: ' .. s.replays)
  -- a constant made from Lua data inside the step is read, never overwritten
  local f = em.compile(function(x) return (x + em.tensor({ 1, 2, 3 })) * 2 end)
  for k = 1, 3 do
    H.eq(H.flat(f(em.ones(3) * k)), { 2 * (k + 1), 2 * (k + 2), 2 * (k + 3) }, 'call ' .. k)
  end
end)

H.test('a new signature captures again; results are the caller\'s own', function()
  local _, b = twins(function() return nn.Linear(4, 2) end,
    function(m) return em.optim.SGD(m:parameters(), { lr = 0.1 }) end)
  local step = em.compile(train_step(b))
  local y4 = em.tensor({ 1, 2, 1, 2 }, { dtype = 'int64' })
  local first = step(em.ones(4, 4), y4)
  local kept = first:item()
  step(em.ones(4, 4) * 3, y4)
  H.eq(first:item(), kept, 'a result kept from the first call is unchanged by a replay')
  step(em.ones(2, 4), em.tensor({ 1, 2 }, { dtype = 'int64' }))
  step(em.ones(2, 4), em.tensor({ 2, 1 }, { dtype = 'int64' }))
  local s = step:stats()
  H.eq({ s.captures, s.replays }, { 2, 2 }, 'two signatures: captures, replays')
  -- a number argument is part of the signature
  local scale = em.compile(function(x, k) return x * k end)
  H.eq(H.flat(scale(em.ones(2), 2)), { 2, 2 }, 'k = 2')
  H.eq(H.flat(scale(em.ones(2), 3)), { 3, 3 }, 'k = 3 captures anew')
  H.eq(H.flat(scale(em.ones(2) * 5, 3)), { 15, 15 }, 'replayed with new data')
  H.eq(scale:stats().captures, 2, 'captures')
end)

H.test('reading a value inside the step runs it eagerly, and explain says where', function()
  local a, b = twins(function() return nn.Linear(3, 2) end,
    function(m) return em.optim.SGD(m:parameters(), { lr = 0.1 }) end)
  local seen = {}
  local function reading(t)
    return function(x, y)
      t.opt:zero_grad()
      local loss = F.cross_entropy(t.m(x), y)
      seen[#seen + 1] = loss:item()   -- a value read: the rest depends on Lua
      loss:backward()
      t.opt:step()
      return loss
    end
  end
  local step = em.compile(reading(b))
  local eager = reading(a)
  local x, y = em.randn(4, 3), em.tensor({ 1, 2, 2, 1 }, { dtype = 'int64' })
  for _ = 1, 3 do eager(x, y) end
  local n0 = #seen
  for _ = 1, 3 do step(x, y) end
  H.eq({ seen[n0 + 1], seen[n0 + 2], seen[n0 + 3] }, { seen[1], seen[2], seen[3] },
       'eager and compiled losses (the compiled fn ran each time)')
  local s = step:stats()
  H.eq({ s.captures, s.breaks, s.eager, s.replays }, { 1, 1, 2, 0 }, 'captures, breaks, eager, replays')
  H.check(step:explain():find('reads a value: item', 1, true), 'explain: ' .. step:explain())
  H.check(step:explain():find('test_compile.lua', 1, true), 'explain names the line')
end)

H.test('gradients kept across calls: the eager step accumulates, so the call runs eagerly', function()
  local a, b = twins(function() return nn.Linear(3, 1) end,
    function(m) return em.optim.SGD(m:parameters(), { lr = 0.1 }) end)
  local function accumulate(t)
    return function(x) local l = t.m(x):sum(); l:backward(); return l end
  end
  local step = em.compile(accumulate(b))
  local eager = accumulate(a)
  local x = em.randn(2, 3)
  for _ = 1, 3 do eager(x); step(x) end
  H.eq(H.flat(b.m.weight.grad), H.flat(a.m.weight.grad), 'gradients summed over 3 calls')
  H.check(step:stats().eager == 2, 'calls 2 and 3 ran eagerly: ' .. step:stats().eager)
  -- zeroed between calls (outside the step), the replay serves
  b.opt:zero_grad(); a.opt:zero_grad()
  eager(x); step(x)
  H.eq(H.flat(b.m.weight.grad), H.flat(a.m.weight.grad), 'after zero_grad outside')
  H.eq(step:stats().replays, 1, 'replayed once')
end)

H.test('check = true names the first call that differs', function()
  local relu = true
  local f = em.compile(function(x)
    if relu then return (x * 2):relu() end
    return (x * 2):tanh()
  end, { check = true })
  local x = em.randn(5)
  f(x)
  f(x)   -- checked: same calls
  relu = false
  local err = H.raises(function() f(x) end, 'compile: check: call 2', 'captured unary')
  H.check(err:find('branches', 1, true), 'the message says why: ' .. err)
end)

H.test('two replicas: a wrapped model\'s gradient averaging replays, equal to eager', function()
  local out, rc = H.ember([[
    local em = require 'ember'
    local nn, F = em.nn, em.nn.F
    local s = em.distribute.mirrored{}
    local function make()
      em.manual_seed(3)
      local m = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 3))
      local dm = s:wrap(m)
      local opt = em.optim.SGD(dm:parameters(), { lr = 0.1, momentum = 0.9 })
      return m, function(x, y)
        opt:zero_grad()
        local loss = F.cross_entropy(dm(x), y)
        loss:backward()
        opt:step()
        return loss
      end
    end
    local m1, eager = make()
    local m2, step = make()
    local comp = em.compile(step)
    em.manual_seed(10 + s.rank)   -- each replica its own batches
    local xs, ys = {}, {}
    for i = 1, 5 do xs[i] = em.randn(4, 6); ys[i] = em.randint(1, 3, { 4 }, { dtype = 'int64' }) end
    for i = 1, 5 do eager(xs[i], ys[i]); comp(xs[i], ys[i]) end
    local d = 0
    local p1, p2 = m1:parameters(), m2:parameters()
    for i = 1, #p1 do d = math.max(d, (p1[i] - p2[i]):abs():max():item()) end
    print(('rank %d diff %g sum %.9g replays %d'):format(s.rank, d, p2[1]:sum():item(),
      comp:stats().replays))
  ]], { args = '--replicas 2' })
  H.eq(rc, 0, 'exit status: ' .. out)
  local sums = {}
  for r, d, sum, n in out:gmatch('rank (%d) diff (%S+) sum (%S+) replays (%d+)') do
    H.eq({ tonumber(d), tonumber(n) }, { 0, 4 }, 'rank ' .. r .. ': difference to eager, replays')
    sums[#sums + 1] = sum
  end
  H.eq(#sums, 2, 'both replicas reported: ' .. out)
  H.eq(sums[1], sums[2], 'the replicas hold the same weights')
end)

H.test('clip_grad_norm_ inside the step clips each replay by its own norm', function()
  -- the capture's norm is under max_norm (no scaling), later ones over it, and back
  local function run(compiled)
    em.manual_seed(4)
    local m = nn.Sequential(nn.Linear(4, 6), nn.Tanh(), nn.Linear(6, 2))
    local opt = em.optim.SGD(m:parameters(), { lr = 0.1 })
    local norms = {}
    local function step(x, y)
      opt:zero_grad()
      F.mse_loss(m(x), y):backward()
      em.nn.utils.clip_grad_norm_(m:parameters(), 1.0)
      norms[#norms + 1] = em.nn.utils.clip_grad_norm_(m:parameters(), 1e9)
      opt:step()
    end
    local f = compiled and em.compile(step) or step
    for i = 1, 6 do
      em.manual_seed(20 + i)
      local scale = (i == 1 or i == 5) and 0.01 or 10
      f(em.randn(3, 4), em.randn(3, 2) * scale)
    end
    local out = {}
    for _, p in ipairs(m:parameters()) do
      for _, v in ipairs(p:flatten():totable()) do out[#out + 1] = ('%.17g'):format(v) end
    end
    return table.concat(out, ' '), norms, compiled and f:stats()
  end
  local eager, norms = run(false)
  local comp, _, stats = run(true)
  H.check(norms[1] < 0.99 and norms[2] > 0.999, ('the norms cross max_norm: %g, %g'):format(norms[1],
    norms[2]))
  H.eq(stats.replays, 5, 'replays')
  H.eq(comp, eager, 'the weights equal the eager steps\' bit for bit')
end)

H.test('EMBER_COMPILE=0 runs eagerly; bad arguments are clear errors', function()
  local out, rc = H.ember([[
    local em = require 'ember'
    local f = em.compile(function(x) return x + 1 end)
    f(em.ones(2)); f(em.ones(2))
    print(f:stats().replays, f:explain():match('[^\n]+'))
  ]], { prefix = 'EMBER_COMPILE=0' })
  H.eq(rc, 0, 'exit status: ' .. out)
  H.check(out:find('0\tEMBER_COMPILE=0', 1, true), 'no replays: ' .. out)
  H.raises(function() em.compile(42) end, 'compile: expected a function, got number')
  H.raises(function() em.compile(function() end, { graph = false, fast = true }) end,
           "unknown option 'fast'")
  local needs = em.compile(function(x) return x * 2 end)
  local leaf = em.ones(2):requires_grad_()
  needs(leaf); needs(leaf)
  H.check(needs:explain():find('requires grad', 1, true), 'explain: ' .. needs:explain())
end)

H.done()

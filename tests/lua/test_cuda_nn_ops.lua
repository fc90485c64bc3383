--[[
test_cuda_nn_ops.lua -- the CUDA backend's nn kernels (kernels/k_loss.c, k_norm.c) and
the Lua compositions dropout and embedding, on `cuda` against the CPU backend, on the
emulated runtime (EMBER_CUDA_EMULATE=2:64; the test runs itself again with it
otherwise). Every loss and layer norm goes forward and, through autograd, backward from
leaves on both devices; the gradients are compared too. Inputs come contiguous and
strided (transposed, stepped), float32 and float64; sizes cover C = 1, N = 0 and rows
that take a warp or a whole block, and grids past one block. Bad targets must give the
CPU's message, forward and backward.
]]
local dir = (arg and arg[0] and arg[0]:match('^(.*/)')) or
            ((os.getenv('EMBER_TESTS') or 'tests') .. '/lua/')
local H, em = dofile(dir .. 'cuda_emulated.lua')('2:64')         -- the devices this test expects
local T = assert(loadfile(dir .. 'test_cuda_ops.lua'))('--helpers', H)
local compare = T.compare
local F = em.nn.F
local FL = { 'float32', 'float64' }
-- other data: EMBER_TEST_SEED=n (the tolerances must hold for any draw)
if os.getenv('EMBER_TEST_SEED') then em.manual_seed(tonumber(os.getenv('EMBER_TEST_SEED'))) end

-- -- Helpers ------------------------------------------------------------------------------

-- Runs fn(inputs...) on the CPU and on cuda and compares the outputs; then, when an
-- input is a float leaf spec, backward from (out * w):sum() on both and compares the
-- leaves' gradients. specs: { base = cpu tensor, view = function(leaf) -> input,
-- grad = true }, or a plain CPU tensor (targets). k scales the tolerance.
local function check(what, fn, specs, k)
  local cin, din, cleaves, dleaves = {}, {}, {}, {}
  for i, s in ipairs(specs) do
    if type(s) == 'table' and s.base then
      local lc, ld = s.base:clone(), s.base:cuda()
      if s.grad then lc:requires_grad_(); ld:requires_grad_() end
      cleaves[i], dleaves[i] = s.grad and lc or nil, s.grad and ld or nil
      local v = s.view or function(t) return t end
      cin[i], din[i] = v(lc), v(ld)
    else
      cin[i], din[i] = s, s ~= nil and s:cuda() or nil
    end
  end
  local n = #specs
  local okc, yc = pcall(fn, unpack(cin, 1, n))
  local okd, yd = pcall(fn, unpack(din, 1, n))
  if not H.check(okc, what .. ': cpu raised ' .. tostring(yc), 2) then return end
  if not H.check(okd, what .. ': cuda raised ' .. tostring(yd), 2) then return end
  compare(yc, yd, what, k)
  if next(cleaves) == nil then return end
  local w = em.randn(yc.shape, { dtype = yc.dtype })
  local bc, errc = pcall(function() (yc * w):sum():backward() end)
  local bd, errd = pcall(function() (yd * w:cuda()):sum():backward() end)
  if not H.check(bc and bd, ('%s: backward raised: cpu %s, cuda %s'):format(what, tostring(errc), tostring(errd)), 2) then return end
  for i = 1, n do
    local lc, ld = cleaves[i], dleaves[i]
    if lc then
      if lc.grad == nil then
        H.check(ld.grad == nil, ('%s: input %d has a grad on cuda only'):format(what, i), 2)
      elseif H.check(ld.grad ~= nil, ('%s: input %d has no grad on cuda'):format(what, i), 2) then
        compare(lc.grad, ld.grad, ('%s: grad of input %d'):format(what, i), k)
      end
    end
  end
end

-- Both devices raise, and the messages agree after the op name (the location prefix of a
-- Lua error is dropped).
local function same_error(what, fc, fd, want)
  local okc, ec = pcall(fc)
  local okd, ed = pcall(fd)
  ec, ed = tostring(ec), tostring(ed)
  local function body(e) return e:match(want .. '.*$') or e end
  H.check(not okc and not okd and body(ec) == body(ed) and body(ec):find(want, 1, true) == 1,
    ('%s: cpu %s "%s", cuda %s "%s"'):format(what, okc and 'ok' or 'raised', ec, okd and 'ok' or 'raised', ed), 2)
end

local function plain(base) return { base = base, grad = true } end
local function transposed(base) return { base = base, grad = true, view = function(t) return t:t() end } end
-- x's (r, c) values viewed with a step of 2 along the last dim
local function stepped(base) return { base = base, grad = true, view = function(t) return t:select(3, 2) end } end

-- 1-based class targets in [1, C] (some set to ign when given), int64 or int32
local function targets(N, C, dt, ign, every)
  if N == 0 then return em.empty({ 0 }, { dtype = dt }) end
  local t = em.randint(1, C + 1, { N }, { dtype = dt })
  if ign then
    local v = t:totable()
    for i = 1, N, every or 3 do v[i] = ign end
    t = em.tensor(v, { dtype = dt })
  end
  return t
end

-- -- Cross entropy -------------------------------------------------------------------------

local SHAPES = { { 0, 5 }, { 1, 1 }, { 6, 1 }, { 5, 33 }, { 37, 10 }, { 300, 3 }, { 3, 1500 } }

H.test('cross_entropy forward and backward vs cpu', function()
  for _, dt in ipairs(FL) do
    local k = dt == 'float32' and 20 or 4
    for _, s in ipairs(SHAPES) do
      local N, C = s[1], s[2]
      for _, red in ipairs({ 'none', 'mean', 'sum' }) do
        for _, ls in ipairs({ 0, 0.1, 1 }) do
          local tgt = targets(N, C, 'int64')
          local name = ('cross_entropy %s %dx%d %s ls=%g'):format(dt, N, C, red, ls)
          local o = { reduction = red, label_smoothing = ls }
          check(name, function(x, t) return F.cross_entropy(x, t, o) end,
                { plain(em.randn({ N, C }, { dtype = dt }) * 3), tgt }, k)
        end
      end
      -- transposed logits, int32 targets, some ignored (default and a class value)
      local x = transposed(em.randn({ C, N }, { dtype = dt }))
      check(('cross_entropy %s %dx%d transposed, ignored -100'):format(dt, N, C),
            function(x, t) return F.cross_entropy(x, t, { label_smoothing = 0.2 }) end,
            { x, targets(N, C, 'int32', -100) }, k)
      check(('cross_entropy %s %dx%d ignore_index=1 sum'):format(dt, N, C),
            function(x, t) return F.cross_entropy(x, t, { ignore_index = 1, reduction = 'sum' }) end,
            { plain(em.randn({ N, C }, { dtype = dt })), targets(N, C, 'int64') }, k)
    end
    -- every target ignored: the mean is 0/0 = NaN on both, gradients 0
    check('cross_entropy all ignored ' .. dt, function(x, t) return F.cross_entropy(x, t) end,
          { plain(em.randn({ 4, 3 }, { dtype = dt })), em.full({ 4 }, -100, { dtype = 'int64' }) })
    -- extreme rows (a huge logit each way), and a strided (stepped) target view
    local I64 = { dtype = 'int64' }
    local rows = em.tensor({ { 0, 0, 0 }, { 1e30, 0, -1e30 }, { -5, 2, 7 } }, { dtype = dt })
    check('cross_entropy extreme rows ' .. dt, function(x, t) return F.cross_entropy(x, t, { reduction = 'none' }) end,
          { plain(rows), em.tensor({ 1, 3, 2 }, I64) }, k)
    check('cross_entropy strided target view ' .. dt, function(x, t) return F.cross_entropy(x, t) end,
          { plain(em.randn({ 3, 4 }, { dtype = dt })), { base = em.tensor({ 2, 0, 4, 0, 1, 0 }, I64), view = function(t) return t:reshape(3, 2):select(2, 1) end } })
    check('nll_loss strided target view ' .. dt, function(x, t) return F.nll_loss(x, t, { reduction = 'none' }) end,
          { plain(em.randn({ 3, 4 }, { dtype = dt })), { base = em.tensor({ 2, 0, 4, 0, -100, 0 }, I64),
            view = function(t) return t:reshape(3, 2):select(2, 1) end } })
    compare(F.cross_entropy(em.full({ 2, 3 }, -math.huge, { dtype = dt }), em.tensor({ 1, 2 }, I64), { reduction = 'none' }),
            F.cross_entropy(em.full({ 2, 3 }, -math.huge, { dtype = dt, device = 'cuda' }), em.tensor({ 1, 2 }, I64):cuda(), { reduction = 'none' }),
            'cross_entropy rows of -inf ' .. dt)
  end
end)

H.test('reduction none: a broadcast grad_loss (stride 0) from sum()', function()
  for _, op in ipairs({ 'cross_entropy', 'nll_loss' }) do
    local base, t = em.randn(9, 5, { dtype = 'float64' }), targets(9, 5, 'int64', -100, 4)
    local lc, ld = base:clone():requires_grad_(), base:cuda():requires_grad_()
    F[op](lc, t, { reduction = 'none' }):sum():backward()
    F[op](ld, t:cuda(), { reduction = 'none' }):sum():backward()
    compare(lc.grad, ld.grad, op .. ' none, grad of sum()')
  end
end)

H.test('cross_entropy results are the same run to run', function()
  local x = em.randn({ 64, 2000 }):cuda()
  local t = targets(64, 2000, 'int64'):cuda()
  local a, b = F.cross_entropy(x, t), F.cross_entropy(x, t)
  H.eq(a:item(), b:item(), 'two runs of the same loss')
  local y = em.randn({ 5000 }):cuda()
  H.eq(F.mse_loss(y, y * 0.5, { reduction = 'sum' }):item(), F.mse_loss(y, y * 0.5, { reduction = 'sum' }):item(),
       'mse sum, two runs')
end)

-- -- nll_loss ---------------------------------------------------------------------------------

H.test('nll_loss forward and backward vs cpu, strided log-probabilities', function()
  for _, dt in ipairs(FL) do
    for _, s in ipairs(SHAPES) do
      local N, C = s[1], s[2]
      for _, red in ipairs({ 'none', 'mean', 'sum' }) do
        local o = { reduction = red }
        check(('nll_loss %s %dx%d %s'):format(dt, N, C, red), function(x, t) return F.nll_loss(x, t, o) end,
              { plain(em.randn({ N, C }, { dtype = dt })), targets(N, C, 'int64') })
        -- nll_loss reads logp with its strides: a transposed leaf and a stepped one
        check(('nll_loss %s %dx%d %s transposed, ignored'):format(dt, N, C, red),
              function(x, t) return F.nll_loss(x, t, o) end,
              { transposed(em.randn({ C, N }, { dtype = dt })), targets(N, C, 'int32', -100, 2) })
        check(('nll_loss %s %dx%d %s stepped, ignore_index=2'):format(dt, N, C, red),
              function(x, t) return F.nll_loss(x, t, { reduction = red, ignore_index = 2 }) end,
              { stepped(em.randn({ N, C, 2 }, { dtype = dt })), targets(N, C, 'int64') })
      end
    end
    -- log_softmax then nll is cross entropy, on both devices
    check('log_softmax + nll_loss ' .. dt, function(x, t) return F.nll_loss(F.log_softmax(x, 2), t) end,
          { plain(em.randn({ 9, 7 }, { dtype = dt })), targets(9, 7, 'int64') }, 10)
  end
  -- past one grid of 4096 blocks: the backward writes 70000 x 16 elements
  check('nll_loss 70000x16 sum', function(x, t) return F.nll_loss(x, t, { reduction = 'sum' }) end,
        { plain(em.randn({ 70000, 16 }, { dtype = 'float64' })), targets(70000, 16, 'int64') })
end)

-- -- Targets out of range ----------------------------------------------------------------------

H.test('bad targets give the cpu message, forward and backward', function()
  for _, bad in ipairs({ 0, 6, -1, 1000 }) do
    for _, tdt in ipairs({ 'int64', 'int32' }) do
      local x = em.randn({ 4, 5 })
      local t = em.tensor({ 1, 2, bad, 3 }, { dtype = tdt })
      same_error('cross_entropy target ' .. bad .. ' ' .. tdt,
                 function() return F.cross_entropy(x, t) end,
                 function() return F.cross_entropy(x:cuda(), t:cuda()) end, 'cross_entropy: target')
      same_error('nll_loss target ' .. bad .. ' ' .. tdt,
                 function() return F.nll_loss(x, t, { reduction = 'none' }) end,
                 function() return F.nll_loss(x:cuda(), t:cuda(), { reduction = 'none' }) end, 'nll_loss: target')
    end
  end
  -- the first bad target is the one named, ignored rows are skipped before the check
  same_error('cross_entropy first bad of two', function() return F.cross_entropy(em.randn(3, 2), em.tensor({ -100, 7, 9 }, { dtype = 'int64' })) end,
             function() return F.cross_entropy(em.randn(3, 2):cuda(), em.tensor({ -100, 7, 9 }, { dtype = 'int64' }):cuda()) end,
             'cross_entropy: target 7 ')
  -- the backward entries check the targets again (autograd's version counters keep a
  -- changed target from reaching them, so they are called through the C API here)
  local ffi, core = require 'ffi', require 'ember.ffi'
  local C, S, CH = core.C, core.S, core.H
  local out = ffi.new('em_tensor*[1]')
  local function call(f)
    if f() ~= 0 then error(ffi.string(C.em_errmsg(S)), 0) end
    core.wrap(out[0])
  end
  for _, red in ipairs({ 0, 1 }) do
    local x, t, g = em.randn(3, 4), em.tensor({ 1, 5, 2 }, { dtype = 'int32' }), em.ones(red == 0 and 3 or 1)
    local lse = em.zeros(3)
    local function ce(dev) local xd, td, gd, ld = x:to(dev), t:to(dev), g:to(dev), lse:to(dev)
      return call(function() return C.em_cross_entropy_backward(S, CH(gd), CH(xd), CH(td), CH(ld), 1, -100, 0.1, red, out) end) end
    local function nll(dev) local xd, td, gd = x:to(dev), t:to(dev), g:to(dev)
      return call(function() return C.em_nll_loss_backward(S, CH(gd), CH(xd), CH(td), 1, -100, red, out) end) end
    same_error('cross_entropy_backward bad target, reduction ' .. red, function() return ce('cpu') end,
               function() return ce('cuda') end, 'cross_entropy_backward: target 5 ')
    same_error('nll_loss_backward bad target, reduction ' .. red, function() return nll('cpu') end,
               function() return nll('cuda') end, 'nll_loss_backward: target 5 ')
  end
end)

-- -- Pointwise losses ----------------------------------------------------------------------------

H.test('mse_loss and bce_with_logits forward and backward vs cpu', function()
  local fns = { mse = F.mse_loss, bce = F.binary_cross_entropy_with_logits }
  for _, dt in ipairs(FL) do
    local k = dt == 'float32' and 10 or 4
    for name, fn in pairs(fns) do
      for _, shape in ipairs({ { 0 }, { 1 }, { 7, 33 }, { 3, 4, 5 }, { 1000 } }) do
        for _, red in ipairs({ 'none', 'mean', 'sum' }) do
          local o = { reduction = red }
          local y = name == 'bce' and em.rand(shape, { dtype = dt }) or em.randn(shape, { dtype = dt })
          check(('%s %s %s %s'):format(name, dt, H.show(shape), red), function(x, t) return fn(x, t, o) end,
                { plain(em.randn(shape, { dtype = dt }) * 4), plain(y) }, k)
        end
      end
      -- strided input and target (the ops layer gathers them; gradients flow back)
      check(('%s %s transposed'):format(name, dt), function(x, t) return fn(x, t, { reduction = 'sum' }) end,
            { transposed(em.randn({ 40, 9 }, { dtype = dt })), stepped(em.rand({ 9, 40, 2 }, { dtype = dt })) }, k)
    end
    -- extreme logits: the stable form on both
    local x = em.tensor({ -800, -30, 0, 30, 800 }, { dtype = dt })
    check('bce extremes ' .. dt, function(a, b) return F.binary_cross_entropy_with_logits(a, b, { reduction = 'none' }) end,
          { plain(x), plain(em.tensor({ 0, 1, 0.5, 0, 1 }, { dtype = dt })) })
  end
  -- many blocks of partial sums (1024 blocks, a grid-stride share each)
  check('mse 300000 mean', function(a, b) return F.mse_loss(a, b) end,
        { plain(em.randn({ 300000 }, { dtype = 'float64' })), em.randn({ 300000 }, { dtype = 'float64' }) })
end)

-- -- Layer norm --------------------------------------------------------------------------------

H.test('layer_norm forward and backward vs cpu', function()
  for _, dt in ipairs(FL) do
    local k = dt == 'float32' and 50 or 10
    local cases = { { { 4, 10 }, { 10 } }, { { 2, 3, 40 }, { 3, 40 } }, { { 5, 1 }, { 1 } },
                    { { 3, 1500 }, { 1500 } }, { { 2100, 3 }, { 3 } }, { { 0, 7 }, { 7 } },
                    { { 7 }, { 7 } } }
    for _, c in ipairs(cases) do
      local shape, ns = c[1], c[2]
      for _, affine in ipairs({ true, false }) do
        local name = ('layer_norm %s %s over %s%s'):format(dt, H.show(shape), H.show(ns), affine and ' affine' or '')
        local x = plain(em.randn(shape, { dtype = dt }) * 2 + 5)
        if affine then
          check(name, function(a, w, b) return F.layer_norm(a, ns, w, b) end,
                { x, plain(em.randn(ns, { dtype = dt })), plain(em.randn(ns, { dtype = dt })) }, k)
        else
          check(name, function(a) return F.layer_norm(a, ns, nil, nil, 0.1) end, { x }, k)
        end
      end
    end
    -- a transposed input, weight only
    check('layer_norm transposed ' .. dt, function(a, w) return F.layer_norm(a, 6, w) end,
          { transposed(em.randn({ 6, 50 }, { dtype = dt })), plain(em.rand({ 6 }, { dtype = dt })) }, k)
  end
  -- the module, moved to cuda with its parameters
  local mc = em.nn.LayerNorm({ 8 })
  local md = em.nn.LayerNorm({ 8 })
  md:load_state_dict(mc:state_dict())
  md:to('cuda')
  local x = em.randn(5, 8)
  compare(mc(x), md(x:cuda()), 'LayerNorm module', 20)
end)

-- -- Loss modules ----------------------------------------------------------------------------------

H.test('rows past one grid (4096 blocks of 8 rows), results the same run to run', function()
  local N = 33000
  check('cross_entropy 33000x2 none', function(x, t) return F.cross_entropy(x, t, { reduction = 'none', label_smoothing = 0.3 }) end,
        { plain(em.randn({ N, 2 }, { dtype = 'float64' })), targets(N, 2, 'int64', -100, 7) })
  check('layer_norm 33000x2', function(x, w, b) return F.layer_norm(x, 2, w, b) end,
        { plain(em.randn({ N, 2 }, { dtype = 'float64' })), plain(em.randn({ 2 }, { dtype = 'float64' })),
          plain(em.randn({ 2 }, { dtype = 'float64' })) }, 10)
  -- long rows (a block each) past 4096 blocks: forward only, to stay quick
  local xl, tl = em.randn(4100, 1025), targets(4100, 1025, 'int64')
  compare(F.cross_entropy(xl, tl, { reduction = 'none' }), F.cross_entropy(xl:cuda(), tl:cuda(), { reduction = 'none' }),
          'cross_entropy 4100x1025 none', 4)
  compare(F.layer_norm(xl, 1025), F.layer_norm(xl:cuda(), 1025), 'layer_norm 4100x1025', 20)
  -- gw, gb: chunked sums without atomics, bit-identical run to run
  local x, w = em.randn(3000, 40):cuda(), em.randn(40):cuda()
  local function gw()
    local l = w:clone():requires_grad_()
    F.layer_norm(x, 40, l):sum():backward()
    return l.grad:cpu()
  end
  H.check(gw():eq(gw()):all():item(), 'layer_norm weight grads, two runs')
end)

H.test('loss modules on cuda', function()
  local x, t = em.randn(6, 4), targets(6, 4, 'int64')
  compare(em.nn.CrossEntropyLoss({ label_smoothing = 0.1 })(x, t),
          em.nn.CrossEntropyLoss({ label_smoothing = 0.1 })(x:cuda(), t:cuda()), 'CrossEntropyLoss', 4)
  compare(em.nn.NLLLoss({ reduction = 'sum' })(x, t), em.nn.NLLLoss({ reduction = 'sum' })(x:cuda(), t:cuda()), 'NLLLoss')
  local y = em.rand(6, 4)
  compare(em.nn.MSELoss()(x, y), em.nn.MSELoss()(x:cuda(), y:cuda()), 'MSELoss', 4)
  compare(em.nn.BCEWithLogitsLoss()(x, y), em.nn.BCEWithLogitsLoss()(x:cuda(), y:cuda()), 'BCEWithLogitsLoss', 4)
end)

-- -- Dropout and embedding (compositions of core ops) --------------------------------------

H.test('dropout on cuda: the same seed gives the cpu mask', function()
  for _, dt in ipairs(FL) do
    for _, p in ipairs({ 0.3, 0.5 }) do
      local base = em.randn({ 33, 70 }, { dtype = dt })
      em.manual_seed(7)
      local lc = base:clone():requires_grad_()
      local yc = F.dropout(lc, p, true)
      em.manual_seed(7)
      local ld = base:cuda():requires_grad_()
      local yd = F.dropout(ld, p, true)
      compare(yc, yd, ('dropout %s p=%g'):format(dt, p))
      local zeros = yd:eq(0):sum():item()
      H.check(zeros > 0.5 * p * 33 * 70 and zeros < 1.5 * p * 33 * 70, 'dropout drops about p of the elements')
      yc:sum():backward(); yd:sum():backward()
      compare(lc.grad, ld.grad, ('dropout grad %s p=%g'):format(dt, p))
    end
    local x = em.randn(4, 5, { dtype = dt }):cuda()
    compare(x:cpu(), F.dropout(x, 0.5, false), 'dropout not training is the identity')
    compare(x:cpu() * 0, F.dropout(x, 1, true), 'dropout p = 1')
  end
  local m = em.nn.Dropout(0.5):to('cuda')
  m:eval()
  local x = em.randn(3, 3):cuda()
  compare(x:cpu(), m(x), 'Dropout module in eval mode')
end)

H.test('embedding on cuda: index_select forward, index_add backward', function()
  for _, dt in ipairs(FL) do
    for _, idt in ipairs({ 'int64', 'int32' }) do
      local idx = em.tensor({ { 1, 5, 5 }, { 10, 1, 3 } }, { dtype = idt })
      check(('embedding %s %s'):format(dt, idt), function(w, i) return F.embedding(i, w) end,
            { plain(em.randn({ 10, 4 }, { dtype = dt })), idx })
    end
    -- many rows hitting few entries: the repeated adds stay in the cpu's order
    check('embedding repeated ' .. dt, function(w, i) return F.embedding(i, w) end,
          { plain(em.randn({ 3, 33 }, { dtype = dt })), em.randint(1, 4, { 500 }) })
  end
  local mc = em.nn.Embedding(10, 3)
  local md = em.nn.Embedding(10, 3)
  md:load_state_dict(mc:state_dict())
  md:to('cuda')
  local i = em.tensor({ 2, 4, 2 }, { dtype = 'int64' })
  compare(mc(i), md(i:cuda()), 'Embedding module')
  same_error('embedding index out of range', function() return F.embedding(em.tensor({ 11 }, { dtype = 'int64' }), mc.weight) end,
             function() return F.embedding(em.tensor({ 11 }, { dtype = 'int64' }):cuda(), md.weight) end, 'embedding: index 11')
end)

H.done()

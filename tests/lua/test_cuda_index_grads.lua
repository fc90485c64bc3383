--[[
test_cuda_index_grads.lua -- the second half of test_cuda_ops.lua (whose helpers it loads):
joining, indexing, views, assignments, in-place ops, empty tensors, sizes past the
grid, edge values and the mixed-device errors on `cuda` against the CPU; then, for
every differentiable op of API.md "Tensors", backward from float64 leaves on cuda
against the same on the CPU. A leaf on the device keeps its gradient there.
]]
local dir = (arg and arg[0] and arg[0]:match('^(.*/)')) or
            ((os.getenv('EMBER_TESTS') or 'tests') .. '/lua/')
local H, em = dofile(dir .. 'cuda_emulated.lua')('2:64')         -- the devices this test expects
local T = assert(loadfile(dir .. 'test_cuda_ops.lua'))('--helpers', H)
local DTYPES, FLOATS, compare, rnd, positive, forms, same =
  T.DTYPES, T.FLOATS, T.compare, T.rnd, T.positive, T.forms, T.same

-- a number from a number, a boolean or a 0-D tensor (t[i][j] is one of them)
local function flat_num(v)
  if type(v) ~= 'number' and type(v) ~= 'boolean' then v = v:item() end
  return type(v) == 'boolean' and (v and 1 or 0) or tonumber(v)
end

H.test('joining, indexing and views', function()
  for _, dt in ipairs(DTYPES) do
    local F = forms(6, 5, dt)
    local idx = em.tensor({ 3, 1, 3, 5, 2 }, { dtype = 'int64' })
    for i, f in ipairs(F) do
      local g = F[(i % #F) + 1]
      local c, d = { f[2] }, { f[3] }
      local function t(name, fn) same(name .. ' ' .. dt .. ' ' .. f[1], fn, c, d) end
      t('index_select 1', function(x) return x:index_select(1, x.is_cuda and idx:cuda() or idx) end)
      t('index_select 2 (int32 index)', function(x) local j = idx:int(); return x:index_select(2, x.is_cuda and j:cuda() or j) end)
      t('index_select with a Lua list', function(x) return x:index_select(2, { 5, 1, 1 }) end)
      local gi, gj = em.randint(1, 6, { 6, 7 }), em.randint(1, 7, { 3, 5 })
      t('gather 2', function(x) return x:gather(2, x.is_cuda and gi:cuda() or gi) end)
      t('gather 1', function(x) return x:gather(1, x.is_cuda and gj:cuda() or gj) end)
      same('cat 1 ' .. dt, function(x, y) return em.cat({ x, y, x:narrow(1, 2, 3) }, 1) end, { f[2], g[2] }, { f[3], g[3] })
      same('cat 2 ' .. dt, function(x, y) return em.cat({ x, y:narrow(2, 1, 2) }, 2) end, { f[2], g[2] }, { f[3], g[3] })
      same('stack 1 ' .. dt, function(x, y) return em.stack({ x, y }) end, { f[2], g[2] }, { f[3], g[3] })
      same('stack 3 ' .. dt, function(x, y) return em.stack({ x, y, x }, 3) end, { f[2], g[2] }, { f[3], g[3] })
      t('narrow, view', function(x) return x:narrow(2, 2, 3):contiguous():view(3, 6) end)
      t('select', function(x) return x:select(2, 4) end)
      t('t[i]', function(x) return x[3] end)
      H.eq(flat_num(f[3][2][3]), flat_num(f[2][2][3]), 't[i][j] ' .. dt .. ' ' .. f[1])
      t('transpose', function(x) return x:transpose(1, 2) end)
      t('permute', function(x) return x:unsqueeze(2):permute(3, 1, 2) end)
      t('reshape', function(x) return x:reshape(3, 10) end)
      t('flatten', function(x) return x:flatten() end)
      t('squeeze/unsqueeze', function(x) return x:unsqueeze(1):unsqueeze(-1):squeeze(1) end)
      t('expand', function(x) return x:unsqueeze(1):expand(2, 6, 5) end)
      t('contiguous, clone', function(x) local y = x:contiguous(); H.check(y:is_contiguous()); return y:clone() end)
    end
  end
  for _, n in ipairs({ 1, 31, 1000 }) do
    local lab = em.randint(1, 11, { n })
    same('one_hot of ' .. n, em.one_hot, { lab, 10 }, { lab:cuda(), 10 })
    same('one_hot inferred n', em.one_hot, { lab }, { lab:cuda() })
  end
  local x, j = rnd({ 70000, 3 }, 'float32'), em.randint(1, 70001, { 1000 })
  same('index_select 1000 of 70000 rows', function(t, i) return t:index_select(1, i) end, { x, j }, { x:cuda(), j:cuda() })
  same('cat of 70000 rows', function(t) return em.cat({ t, t:narrow(1, 5, 33) }) end, { x }, { x:cuda() })
  same('stepped copy of 70000 rows', function(t) return t:t()[2]:contiguous() end, { x }, { x:cuda() })
end)

H.test('indexing assignments, copy_ and in-place ops', function()
  for _, dt in ipairs(DTYPES) do
    for _, f in ipairs(forms(4, 6, dt)) do
      if f[1] ~= 'expanded' then
        local c, d = f[2], f[3]
        local v = rnd({ 6 }, dt)
        for _, x in ipairs({ { c, v }, { d, v:cuda() } }) do
          x[1][2] = 1; x[1][3] = x[2]; x[1][4]:narrow(1, 2, 2):fill_(0)
          x[1][1]:copy_(x[2]:to('float64'))                       -- copy_ with a dtype change
          if dt ~= 'bool' then x[1]:add_(x[1]:select(1, 2)):mul_(2) end
          if dt ~= 'bool' and dt ~= 'uint8' then x[1]:sub_(1):clamp_(-30, 30) end
          if dt:find('float') then x[1]:div_(2):exp_():add_(x[2], 0.5):sub_(x[2], 2) end
        end
        compare(c, d, 'assignments and in-place ops into a ' .. f[1] .. ' ' .. dt .. ' view')
        c:zero_(); d:zero_()
        compare(c, d, 'zero_ ' .. f[1] .. ' ' .. dt)
      end
    end
  end
  -- every unary in-place form, and binary ones with broadcasting, into strided views
  for _, dt in ipairs({ 'float32', 'float16', 'int32' }) do
    for _, f in ipairs(forms(5, 7, dt)) do
      if f[1] ~= 'expanded' then
        for _, name in ipairs({ 'neg', 'abs', 'exp', 'sqrt', 'sin', 'tanh', 'sigmoid', 'relu', 'gelu', 'silu',
                                'floor', 'round', 'sign', 'reciprocal', 'square', 'expm1', 'erf' }) do
          same(('%s_ into a %s %s view'):format(name, f[1], dt), function(x) local y = x:clone():t(); return y[name .. '_'](y) end, { f[2] }, { f[3] })
        end
        local row, col = rnd({ 7 }, dt), rnd({ 5, 1 }, dt)
        same('mul_, add_, maximum... broadcast into a ' .. f[1] .. ' ' .. dt .. ' view', function(x, r, q)
          local y = x:clone():t():t(); y:mul_(r):add_(q):sub_(r, 2):clamp_(-9, 9); return y end,
          { f[2], row, col }, { f[3], row:cuda(), col:cuda() })
        same('eq_, lt_ ' .. f[1] .. ' ' .. dt, function(x, r) return x:clone():eq_(r) + x:clone():lt_(0) end, { f[2], row }, { f[3], row:cuda() })
      end
    end
  end
  local c, d = rnd({ 70000 }, 'float32'), em.zeros(70000, { device = 'cuda' })
  d:copy_(c)                                                       -- cpu -> cuda copy_
  compare(c, d, 'copy_ from the cpu')
  local h = em.zeros(70000):copy_(d:mul_(3))                       -- cuda -> cpu copy_
  H.close(H.flat(h:narrow(1, 69990, 5)), H.flat(c:narrow(1, 69990, 5) * 3), 1e-6, 'copy_ to the cpu')
  local v = d[7]
  H.eq(type(v), 'number', 't[i] of a 1-D cuda tensor is a number, as on the cpu')
  H.eq(flat_num(v), flat_num(c[7] * 3), 't[i] of a 1-D cuda tensor')
end)

H.test('empty tensors', function()
  for _, dt in ipairs({ 'float32', 'int64', 'bool' }) do
    local e, r = rnd({ 0, 3 }, dt), rnd({ 2, 3 }, dt)
    local c, d = { e, r }, { e:cuda(), r:cuda() }
    for name, fn in pairs({
      add = function(x) return x + x end, exp = function(x) return x:float():exp() end,
      sum = function(x) return x:sum() end, sum1 = function(x) return x:sum(1) end, sum2 = function(x) return x:sum(2) end,
      amax = function(x) return x:amax() end, amax1 = function(x) return x:amax(1) end, argmax = function(x) return x:argmax(2) end,
      mean = function(x) return x:double():mean(1) end, prod = function(x) return x:prod(1) end,
      cat = function(x, y) return em.cat({ x, y, x }) end, t = function(x) return x:t():contiguous() end,
      cast = function(x) return x:to('float16') end, softmax = function(x) return x:double():softmax(2) end,
      matmul = function(x) return em.matmul(x:double(), em.ones(3, 4, { dtype = 'float64', device = x.device })) end,
      matmul_k0 = function(x) return em.matmul(x:double():t(), em.ones(0, 4, { dtype = 'float64', device = x.device })) end,
      index_select = function(x) return x:index_select(2, em.zeros(0, { dtype = 'int64', device = x.device })) end,
    }) do
      same(name .. ' of an empty ' .. dt, fn, c, d)
    end
  end
  compare(em.randn(0), em.randn(0, { device = 'cuda' }), 'randn(0)'); compare(em.arange(0), em.arange(0, { device = 'cuda' }), 'arange(0)')
end)

H.test('sizes past the grid (4096 blocks of 256 threads)', function()
  local N = 2 ^ 20 + 3                 -- the kernels stride over what one grid can't cover
  for _, dt in ipairs({ 'float32', 'uint8' }) do
    em.cuda.empty_cache()              -- 64 MB devices: let Lua's garbage go first
    local x = rnd({ N }, dt); local d = x:cuda()
    same('add ' .. dt, function(a) return a + a end, { x }, { d })
    same('cast ' .. dt, function(a) return a:half() end, { x }, { d })
    same('sum ' .. dt, function(a) return a:double():sum() end, { x }, { d })
    same('argmax ' .. dt, function(a) return a:argmax() end, { x }, { d })
    same('stepped copy ' .. dt, function(a) return a:narrow(1, 2, N - 1):view(-1, 2):t():contiguous() end, { x }, { d })
    same('sum over rows of 2 ' .. dt, function(a) return a:narrow(1, 1, N - 1):view(-1, 2):sum(2) end, { x }, { d })
    same('amin over a strided dim ' .. dt, function(a) return a:narrow(1, 1, N - 1):view(-1, 2):amin(1) end, { x }, { d })
  end
  em.cuda.empty_cache()
  em.manual_seed(2); local c, c2 = em.randn(N), em.rand(N, { dtype = 'float64' })
  em.manual_seed(2); local d, d2 = em.randn(N, { device = 'cuda' }), em.rand(N, { dtype = 'float64', device = 'cuda' })
  compare(c, d, 'randn', 0); compare(c2, d2, 'rand float64', 0)
  local i = em.randint(1, N + 1, { N })
  same('gather', function(a, j) return a:gather(1, j) end, { c, i }, { d, i:cuda() })
  same('softmax of 5000 rows', function(a) return a:narrow(1, 1, 15000):view(-1, 3):softmax(2) end, { c }, { d })
end)

H.test('edge values: nan, inf, ties, corrections, extremes, 0-D, bad indices, cuda:1', function()
  local x = em.tensor({ { 1, 2, 3 }, { 0 / 0, 0 / 0, 0 / 0 }, { -math.huge, -math.huge, -math.huge },
                        { math.huge, 1, -math.huge }, { 5, 5, 5 } })
  for _, dt in ipairs(FLOATS) do
    local c, d = { x:to(dt) }, { x:to(dt):cuda() }
    for _, name in ipairs({ 'sum', 'mean', 'prod', 'amax', 'amin', 'logsumexp', 'var', 'std', 'argmax',
                            'argmin', 'softmax', 'log_softmax' }) do
      for d_ = 1, 2 do same(('%s(%d) of nan/inf rows %s'):format(name, d_, dt), function(a) return a[name](a, d_) end, c, d) end
    end
    same('max(2) indices with nan ' .. dt, function(a) return select(2, a:max(2)) end, c, d)
    same('min(1) indices with nan ' .. dt, function(a) return select(2, a:min(1)) end, c, d)
    for _, p in ipairs({ 0, 0.5, 1, 2, math.huge, -math.huge }) do
      same(('norm p=%g with nan/inf %s'):format(p, dt), function(a) return a:norm(p, 2) end, c, d)
    end
    for _, corr in ipairs({ 0, 0.5, 3, 5 }) do
      same(('var correction %g %s'):format(corr, dt), function(a) return a:var(2, { correction = corr }) end, c, d)
    end
    same('var of one element ' .. dt, function(a) return a:narrow(2, 1, 1):var(2) end, c, d)
    local big = (em.ones(5000) * 60000):to(dt)
    same('sum and mean near the top of float16 ' .. dt, function(a) return a:sum() + a:mean() end, { big }, { big:cuda() })
    -- the same rows 500 times over: K >= 2048 short rows take the one-thread-per-row kernels
    local many = x:to(dt):unsqueeze(1):expand(500, 5, 3):reshape(2500, 3)
    for _, name in ipairs({ 'argmax', 'argmin', 'softmax', 'log_softmax', 'logsumexp', 'amax', 'var' }) do
      same(name .. ' of 2500 short rows with nan/inf ' .. dt, function(a) return a[name](a, 2) end, { many }, { many:cuda() })
      same(name .. ' of 2500 short columns ' .. dt, function(a) return a:t():contiguous()[name](a:t():contiguous(), 1) end, { many }, { many:cuda() })
    end
  end
  local i64 = em.tensor({ 2 ^ 40, 3, -2 ^ 40 + 7 }, { dtype = 'int64' })
  same('int64 sum stays exact', function(a) return a:sum() + a:prod() end, { i64 }, { i64:cuda() })
  local i32 = em.full({ 40 }, 7, { dtype = 'int32' })
  same('int32 prod wraps as on the cpu', function(a) return a:prod() end, { i32 }, { i32:cuda() })
  for _, r in ipairs({ { -2 ^ 62, 2 ^ 62 }, { 0, 2 ^ 40 }, { -5, -4 }, { -2 ^ 31, 2 ^ 31 - 1 } }) do
    same(('randint [%g, %g)'):format(r[1], r[2]), function(dev)
      em.manual_seed(11); return em.randint(r[1], r[2], { 1001 }, { dtype = 'int64', device = dev }) end, { 'cpu' }, { 'cuda' }, 0)
  end
  for _, dt in ipairs(DTYPES) do
    for _, r in ipairs({ { 0, 1e-3 }, { -1, 1 }, { 100, 101 }, { 5, 5 }, { -2000, 2000 } }) do
      for _, f in ipairs({ 'uniform_', 'normal_', 'random_' }) do
        same(('%s(%g, %g) into a transposed %s view'):format(f, r[1], r[2], dt), function(dev)
          em.manual_seed(12)
          local t = em.zeros(33, 41, { dtype = dt, device = dev }):t()
          if f == 'random_' then return t:random_(r[1], r[2] + 1) end
          return t[f](t, r[1], f == 'normal_' and r[2] - r[1] or r[2])
        end, { 'cpu' }, { 'cuda' }, f == 'normal_' and T.normal_k(dt) or 0)
      end
    end
  end
  local z = em.tensor(3.5)
  same('0-D ops', function(a) return (a * 2 + a:exp()):sum() + a:softmax(1) + a:argmax() end, { z }, { z:cuda() })
  same('0-D expand, cast', function(a) return a:expand(3, 2):contiguous():half() end, { z }, { z:cuda() })
  local lab = em.tensor({ { 1, 2 }, { 4, 3 } })
  for _, dt in ipairs({ 'int64', 'int32' }) do
    same('one_hot of 2-D ' .. dt .. ' labels', function(a) return em.one_hot(a, 4) end, { lab:to(dt) }, { lab:to(dt):cuda() })
  end
  same('one_hot label past n', function(a) return em.one_hot(a, 3) end, { lab }, { lab:cuda() })
  for _, j in ipairs({ { 4 }, { 0 }, { -1 }, { 6 }, { { 2, 1 } } }) do
    same('index_select with index ' .. H.show(j), function(a) return a:index_select(1, em.tensor(j, { device = a.device })) end, { x }, { x:cuda() })
    same('gather with index ' .. H.show(j), function(a) return a:gather(2, em.tensor({ j }, { device = a.device }):view(1, -1)) end, { x }, { x:cuda() })
  end
  for _, dt in ipairs({ 'uint8', 'float32', 'bool' }) do
    same('index_select with a ' .. dt .. ' index', function(a) return a:index_select(1, em.tensor({ 2, 1 }, { dtype = dt, device = a.device })) end, { x }, { x:cuda() })
  end
  local a1 = rnd({ 33, 40 }, 'float32')
  if not H.two_devices() then return end
  same('ops on cuda:1', function(a) return em.matmul((a:exp() + a):softmax(1), a:t()):sum(2) end, { a1 }, { a1:cuda(1) }, 100)
  H.eq(em.matmul(a1:cuda(1), a1:cuda(1):t()).device, 'cuda:1')
end)

H.test('mixed devices: the error names both', function()
  if not H.two_devices() then return end
  local a, c, b = em.ones(3, { device = 'cuda' }), em.ones(3), em.ones(3, { device = 'cuda:1' })
  local m = em.ones(3, 3, { device = 'cuda' })
  for _, p in ipairs({ { c, 'cpu' }, { b, 'cuda:1' } }) do
    local o = p[1]
    H.raises(function() return a + o end, 'cuda:0', p[2])
    H.raises(function() return o * a end, 'cuda:0', p[2])
    H.raises(function() return a:maximum(o) end, 'cuda:0', p[2])
    H.raises(function() return em.matmul(m, o) end, 'matmul', 'cuda:0', p[2])
    H.raises(function() return em.where(a:gt(0), a, o) end, 'cuda:0', p[2])
    H.raises(function() return em.cat({ a, o }) end, 'cat', 'cuda:0', p[2])
    H.raises(function() return em.stack({ o, a }) end, 'stack', 'cuda:0', p[2])
    H.raises(function() return a:add_(o) end, 'cuda:0', p[2])
    H.raises(function() return m:gather(1, em.ones(1, 3, { dtype = 'int64', device = o.device })) end, 'cuda:0', p[2])
  end
end)

-- Backward of sum(fn(leaves...) * w), w random (so every gradient element differs),
-- from float64 leaves made of the same values on the cpu and on cuda; the forward
-- results and every leaf's gradient must match, the device leaves' staying on cuda.
local function grad(what, fn, inputs, k)
  local lc, ld = {}, {}
  for i, x in ipairs(inputs) do
    lc[i] = x:double():clone():requires_grad_()
    ld[i] = x:double():cuda():requires_grad_()
  end
  local okc, yc = pcall(fn, unpack(lc))
  local okd, yd = pcall(fn, unpack(ld))
  if not H.check(okc and okd, ('%s: %s'):format(what, tostring(okc and yd or yc)), 2) then return end
  local w = em.randn(yc.shape, { dtype = yc.dtype })
  local ok, err = pcall(function()
    (yc * w):sum():backward()
    ;(yd * w:cuda()):sum():backward()
  end)
  if not H.check(ok, what .. ': backward raised: ' .. tostring(err), 2) then return end
  compare(yc:detach(), yd:detach(), what .. ' (forward)', k)
  for i = 1, #lc do
    if H.check(ld[i].grad ~= nil and ld[i].grad.device == 'cuda:0',
        ('%s: the grad of input %d is %s'):format(what, i, ld[i].grad and ld[i].grad.device or 'nil'), 2) then
      compare(lc[i].grad, ld[i].grad, ('%s: grad of input %d'):format(what, i), k)
    end
  end
end

H.test('gradients of the element-wise ops', function()
  local U = { 'neg', 'abs', 'exp', 'log', 'sqrt', 'rsqrt', 'sin', 'cos', 'tanh', 'sigmoid', 'relu',
    'gelu', 'silu', 'reciprocal', 'square', 'log1p', 'expm1', 'log2', 'log10', 'tan', 'atan',
    'sinh', 'cosh', 'erf' }
  local x, p, u = rnd({ 4, 7 }, 'float64'), positive({ 4, 7 }, 'float64'), rnd({ 4, 7 }, 'float64'):tanh()
  for _, name in ipairs(U) do
    local v = (name:find('log') or name:find('sqrt')) and p or x
    grad(name .. ' of a transposed view', function(a) return a:t()[name](a:t()) end, { v })
  end
  grad('asin, acos', function(a) return a:asin() + a:acos() * 2 end, { u })
  grad('gelu tanh', function(a) return a:gelu('tanh') end, { x })
  local a, b, r, c = rnd({ 4, 3 }, 'float64'), rnd({ 4, 3 }, 'float64'), rnd({ 3 }, 'float64'), positive({ 4, 1 }, 'float64')
  for _, name in ipairs({ 'add', 'sub', 'mul', 'div', 'maximum', 'minimum', 'atan2' }) do
    grad(name, function(s, t) return s[name](s, t) end, { a, b })
    grad(name .. ' broadcast row', function(s, t) return s[name](s, t) end, { a, r })
    grad(name .. ' broadcast col x row', function(s, t) return s[name](t, s) end, { r, c })
    grad(name .. ' with a number', function(s) return s[name](s, 1.5) end, { a })
  end
  grad('pow', function(s, t) return s:pow(t) end, { positive({ 4, 3 }, 'float64'), b })
  grad('pow by a number, number by a tensor', function(s) return s ^ 3 + 2 ^ s end, { a })
  grad('unary minus, reversed scalar ops', function(s) return -s + 2 - s * 3 / (s:abs() + 1) end, { a })
  grad('add, sub with alpha', function(s, t) return s:add(t, 3):sub(t, 0.5) end, { a, b })
  grad('where', function(s, t) return em.where(s:gt(0), s, t) end, { a, b })
  grad('where broadcast', function(s, t) return em.where(s:gt(0), s, t) end, { a, r })
  grad('clamp', function(s) return s:clamp(-0.5, 0.5) + s:clamp(0) + s:clamp(nil, 0.2) end, { a })
  grad('expanded input', function(s) return s:expand(5, 3) * 2 end, { r:view(1, 3) })
  local n = rnd({ 70000 }, 'float64')
  grad('exp * sigmoid over 70000', function(s) return s:exp() * s:sigmoid() end, { n })
  grad('float32 in the middle', function(s) return s:float():exp():double() end, { a }, 1e5)
  grad('float16 in the middle', function(s) return s:half():sin():double() end, { a }, 1e10)
  grad('bfloat16 in the middle', function(s) return s:bfloat16():sin():double() end, { a }, 1e11)
end)

H.test('gradients of reductions and softmax', function()
  local x = rnd({ 5, 6 }, 'float64')
  for _, name in ipairs({ 'sum', 'mean', 'prod', 'amax', 'amin', 'logsumexp', 'var', 'std', 'norm' }) do
    grad(name .. '()', function(a) return a[name](a) end, { x })
    for _, dim in ipairs({ 1, 2 }) do
      grad(('%s(%d) of a transposed view'):format(name, dim), function(a) return a:t()[name](a:t(), dim) end, { x })
      grad(('%s(%d, keepdim)'):format(name, dim), function(a)
        if name == 'norm' then return a:norm(2, dim, true) end
        return a[name](a, dim, true)
      end, { x })
    end
  end
  grad('norm p=1, p=3, p=inf', function(a) return a:norm(1, 1) + a:norm(3, 1) + a:norm(math.huge, 1) end, { x })
  grad('var unbiased=false over {1, 2}', function(a) return a:var({ 1, 2 }, { unbiased = false }) end, { x })
  for _, name in ipairs({ 'max', 'min' }) do
    grad(name .. '()', function(a) return a[name](a) end, { x })
    grad(name .. '(dim) values', function(a) return (a[name](a, 2)) end, { x })
  end
  for _, dim in ipairs({ 1, 2 }) do
    grad('softmax ' .. dim, function(a) return a:softmax(dim) end, { x })
    grad('log_softmax ' .. dim, function(a) return a:narrow(2, 2, 4):log_softmax(dim) end, { x })
  end
  local long = rnd({ 3, 1000 }, 'float64')
  for _, name in ipairs({ 'sum', 'mean', 'var', 'logsumexp', 'amax', 'norm' }) do
    grad(name .. ' over 1000', function(a) return a[name](a, 2) end, { long }, 100)
    grad(name .. ' over a strided 1000', function(a) return a:t()[name](a:t(), 1) end, { long }, 100)
  end
  grad('softmax over 1000', function(a) return a:softmax(2) end, { long }, 100)
end)

H.test('gradients of matmul, indexing and joins', function()
  local cases = { { { 3, 4 }, { 4, 5 } }, { { 4 }, { 4, 5 } }, { { 3, 4 }, { 4 } }, { { 4 }, { 4 } },
    { { 2, 3, 4 }, { 2, 4, 5 } }, { { 2, 1, 3, 4 }, { 3, 4, 5 } }, { { 33, 40 }, { 40, 31 } } }
  for _, c in ipairs(cases) do
    local a, b = rnd(c[1], 'float64'), rnd(c[2], 'float64')
    grad(('matmul %s x %s'):format(H.show(c[1]), H.show(c[2])), em.matmul, { a, b }, 100)
  end
  local a, b = rnd({ 4, 3 }, 'float64'), rnd({ 5, 4 }, 'float64')
  grad('matmul of transposed views', function(s, t) return em.matmul(s:t(), t:t()) end, { a, b })
  grad('mm, dot, mv', function(s, t) return s:t():mm(t:t()):sum() + s[1]:dot(t[2]:narrow(1, 1, 3)) + s:t():mv(t[2]):sum() end,
    { a, b })
  local x, y = rnd({ 6, 5 }, 'float64'), rnd({ 3, 5 }, 'float64')
  local idx = em.tensor({ 3, 1, 3, 6, 3 }, { dtype = 'int64' })
  local gi = em.randint(1, 6, { 6, 8 })
  grad('index_select with repeats (index_add)', function(s) return s:index_select(1, s.is_cuda and idx:cuda() or idx) end, { x })
  grad('index_select dim 2 of a transposed view', function(s)
    local j = em.tensor({ 2, 2, 6 }); return s:t():index_select(2, s.is_cuda and j:cuda() or j) end, { x })
  grad('gather with repeats (scatter_add)', function(s) return s:gather(2, s.is_cuda and gi:cuda() or gi) end, { x })
  local gj = em.randint(1, 7, { 9, 5 })
  grad('gather dim 1', function(s) return s:gather(1, s.is_cuda and gj:cuda() or gj) end, { x })
  grad('cat', function(s, t) return em.cat({ s, t, s:narrow(1, 2, 2) }, 1) end, { x, y })
  grad('cat dim 2', function(s, t) return em.cat({ s:t(), t:t() }, 2) end, { x, y })
  grad('stack', function(s, t) return em.stack({ s:narrow(1, 1, 3), t }, 2) end, { x, y })
  grad('narrow, select, t[i]', function(s) return s:narrow(2, 2, 3):select(1, 4) + s[2]:narrow(1, 1, 3) end, { x })
  grad('transpose, permute, reshape, flatten', function(s)
    return s:unsqueeze(1):permute(3, 1, 2):reshape(10, 3):transpose(1, 2):flatten() end, { x })
  grad('expand, squeeze, contiguous', function(s) return s:unsqueeze(1):expand(4, 6, 5):contiguous():squeeze() end, { x })
  grad('one_hot times x', function(s)
    local l = em.tensor({ 1, 5, 2, 5, 3, 1 }); return em.one_hot(s.is_cuda and l:cuda() or l, 5):double() * s end, { x })
  local big = em.randint(1, 70001, { 300 })
  for _, dt in ipairs({ 'float16', 'bfloat16', 'float32' }) do   -- leaves of other dtypes, repeats summed
    local base, j = rnd({ 6, 5 }, dt), em.tensor({ 1, 1, 1, 1, 2, 2, 3, 1, 1, 1, 1, 1, 1, 1 })
    local lc, ld = base:clone():requires_grad_(), base:cuda():requires_grad_()
    ;(lc:index_select(1, j) * 1.1):sum():backward()
    ;(ld:index_select(1, j:cuda()) * 1.1):sum():backward()
    compare(lc.grad, ld.grad, 'index_select backward, ' .. dt .. ' leaf')
    lc, ld = base:clone():requires_grad_(), base:cuda():requires_grad_();
    (lc:t():gather(1, gi:t():narrow(1, 1, 5)) * 1.1):sum():backward()
    ;(ld:t():gather(1, gi:t():narrow(1, 1, 5):cuda()) * 1.1):sum():backward()
    compare(lc.grad, ld.grad, 'gather backward, ' .. dt .. ' leaf')
  end
  grad('index_select over 70000 rows', function(s) return s:index_select(1, s.is_cuda and big:cuda() or big) end,
    { rnd({ 70000, 2 }, 'float64') })
end)

H.test('gradients stay on the device and accumulate; a float32 leaf', function()
  local d = em.randn(4, 3):cuda():requires_grad_()
  local c = d:detach():cpu():requires_grad_()
  for _ = 1, 2 do
    (d:exp() * d):sum():backward()
    ;(c:exp() * c):sum():backward()
  end
  H.eq(d.grad.device, 'cuda:0')
  compare(c.grad, d.grad, 'accumulated float32 grad', 10)
  d.grad = nil
  ;(d:cpu() * em.ones(4, 3)):sum():backward()          -- through a copy to the cpu
  H.eq(d.grad and d.grad.device, 'cuda:0', 'grad through a device-to-host copy')
  compare(em.ones(4, 3), d.grad, 'grad through a device-to-host copy')
  if not H.two_devices() then return end
  local e = em.randn(4, 3, { device = 'cuda:1', dtype = 'float64' }):requires_grad_()
  e:sigmoid():sum():backward()
  H.eq(e.grad.device, 'cuda:1', 'a leaf on cuda:1')
end)

H.done()

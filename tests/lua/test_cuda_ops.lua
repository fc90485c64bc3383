--[[
test_cuda_ops.lua -- every tensor op of API.md "Tensors" on `cuda` against the CPU
backend, on the emulated runtime (EMBER_CUDA_EMULATE=2:64; the test runs itself again
with it otherwise): creation with device=, seeded random draws (same seed -> same
numbers on both), element-wise unary / binary / scalar ops, comparisons, where, clamp,
casts between all eight dtypes, reductions, softmax, matmul. Inputs are random and come
contiguous, transposed, narrowed, stepped and expanded; sizes cross the kernels' blocks
(256 threads). test_cuda_index_grads.lua has the rest: indexing, joins, views, in-place ops,
empty tensors, sizes past the grid, edge values, mixed devices and the gradients.
]]
local dir = (arg and arg[0] and arg[0]:match('^(.*/)')) or
            ((os.getenv('EMBER_TESTS') or 'tests') .. '/lua/')
-- test_cuda_index_grads.lua loads this file's helpers with its own harness: ('--helpers', H)
local helpers_only = (...) == '--helpers'
local H, em = dofile(dir .. 'cuda_emulated.lua')('2:64', helpers_only and select(2, ...) or nil)

local DTYPES = { 'float32', 'float64', 'float16', 'bfloat16', 'int32', 'int64', 'uint8', 'bool' }
local FLOATS = { 'float32', 'float64', 'float16', 'bfloat16' }
-- Relative tolerances, |cuda - cpu| <= tol * (1 + |cpu|). Both backends compute a
-- float16/bfloat16 op in float32 and round once, so a last-bit difference of the
-- float32 result may flip that rounding: one half ulp-step is 2^-10 (float16) and up to
-- 2^-7 (bfloat16) relative. float32: device and host libm may differ by an ulp or two
-- (2^-23 each). float64: a few ulps (2^-52). Integers and bools are exact. Ops that
-- add up many terms (reductions, matmul) scale the float32/float64 ones by k.
local TOL = { float32 = 1e-6, float64 = 1e-12, float16 = 2e-3, bfloat16 = 1e-2,
              int32 = 0, int64 = 0, uint8 = 0, bool = 0 }
-- Normal draws in float64 take the device's log, sin and cos: on a GPU those are CUDA's
-- (within an ulp or two of glibc's), so the draws match the CPU's to a few ulps, not bit
-- for bit (1e-14 relative, k = 0.01). The emulator runs glibc's and stays exact, as do
-- the float32 draws everywhere (ember's own formulas, k = 0).
local function normal_k(dt) return (dt == 'float64' and not em.cuda.emulated()) and 0.01 or 0 end

local function num(v) return type(v) == 'boolean' and (v and 1 or 0) or tonumber(v) end
local function flat(t)
  local r = t:dim() == 0 and { t:item() } or t:reshape(-1):totable()
  for i = 1, #r do r[i] = num(r[i]) end
  return r
end

-- One check: got (on a cuda device) has want's shape and dtype and every element
-- within the dtype's tolerance (times k); a failure names the op and the worst
-- element (its row-major position). NaN matches NaN and infinities themselves only.
local function compare(want, got, what, k)
  if not H.check(type(got) ~= 'number' and got.is_cuda, what .. ': result not on cuda', 2) then return end
  if not H.check(H.deep_eq(got.shape, want.shape) and got.dtype == want.dtype, ('%s: got %s %s, want %s %s')
      :format(what, got.dtype, H.show(got.shape), want.dtype, H.show(want.shape)), 2) then return end
  local tol, w, g = TOL[want.dtype], flat(want), flat(got:cpu())
  if k and (want.dtype == 'float32' or want.dtype == 'float64' or k == 0) then tol = tol * k end
  local worst, wi = -1, 0
  for i = 1, #w do
    local a, b, bad = g[i], w[i]
    if b ~= b or b == math.huge or b == -math.huge then bad = (a == b or (a ~= a and b ~= b)) and 0 or math.huge
    else bad = math.abs(a - b) / (1 + math.abs(b)) end
    if bad ~= bad then bad = math.huge end
    if bad > worst then worst, wi = bad, i end
  end
  H.check(worst <= tol, ('%s [%s]: element %d is %s, cpu %s (rel err %.3g > tol %g)'):format(
    what, want.dtype, wi, tostring(g[wi]), tostring(w[wi]), worst, tol), 2)
end

-- Random CPU tensors: normal floats, integers in [-20, 20) (uint8 [0, 200)), bools.
local function rnd(shape, dt)
  if dt == 'bool' then return em.randint(0, 2, shape):bool() end
  if dt == 'uint8' then return em.randint(0, 200, shape, { dtype = dt }) end
  if dt == 'int32' or dt == 'int64' then return em.randint(-20, 20, shape, { dtype = dt }) end
  return em.randn(shape, { dtype = 'float64' }):to(dt)
end
local function positive(shape, dt) return (rnd(shape, 'float64'):abs() + 0.1):to(dt) end
-- The forms of an r x c operand: { name, cpu view, the same view of the same values on cuda }.
local function forms(r, c, dt, gen)
  gen = gen or rnd
  local res = {}
  local function add(name, base, f) res[#res + 1] = { name, f(base), f(base:cuda()) } end
  add('contiguous', gen({ r, c }, dt), function(t) return t end)
  add('transposed', gen({ c, r }, dt), function(t) return t:t() end)
  add('narrowed', gen({ r + 2, c + 3 }, dt), function(t) return t:narrow(1, 2, r):narrow(2, 3, c) end)
  add('stepped', gen({ r, c, 2 }, dt), function(t) return t:select(3, 2) end)
  add('expanded', gen({ 1, c }, dt), function(t) return t:expand(r, c) end)
  return res
end

-- Runs fn on the cpu arguments and on the cuda ones: where the cpu raises, the
-- device must raise too, naming the same op; else the results must match.
local function same(what, fn, cargs, dargs, k)
  local okc, want = pcall(fn, unpack(cargs))
  local okd, got = pcall(fn, unpack(dargs))
  if not okc then
    local op = tostring(want):match(':%d+: ([%w_]+):') or tostring(want):match('^([%w_]+):') or ''
    return H.check(not okd and tostring(got):find(op, 1, true), ('%s: cpu raised "%s", cuda %s'):format(what,
      tostring(want), okd and 'did not' or ('"' .. tostring(got) .. '"')), 2)
  end
  if not H.check(okd, what .. ': cuda raised: ' .. tostring(got), 2) then return end
  if type(want) == 'number' or type(want) == 'boolean' then
    return H.check(want == got, ('%s: got %s, cpu %s'):format(what, tostring(got), tostring(want)), 2)
  end
  compare(want, got, what, k)
end

local SIZES = { 1, 31, 33, 257, 1000, 70000 }      -- across warps and blocks
if helpers_only then
  return { DTYPES = DTYPES, FLOATS = FLOATS, TOL = TOL, compare = compare, rnd = rnd, normal_k = normal_k,
           positive = positive, forms = forms, same = same, SIZES = SIZES }
end

H.test('creation with device=', function()
  for _, dt in ipairs(DTYPES) do
    local o = { dtype = dt, device = 'cuda' }
    compare(em.zeros({ 2, 3 }, { dtype = dt }), em.zeros({ 2, 3 }, o), 'zeros ' .. dt)
    compare(em.ones(33, { dtype = dt }), em.ones(33, o), 'ones ' .. dt)
    compare(em.full({ 3, 2 }, 1, { dtype = dt }), em.full({ 3, 2 }, 1, o), 'full ' .. dt); H.eq(em.empty({ 4, 5 }, o).device, 'cuda:0')
    compare(em.eye(5, { dtype = dt }), em.eye(5, o), 'eye ' .. dt)
    compare(em.tensor({ { 1, 0 }, { 3, 4 } }, { dtype = dt }), em.tensor({ { 1, 0 }, { 3, 4 } }, o), 'tensor ' .. dt)
    local x = rnd({ 3, 4 }, dt)
    compare(em.zeros_like(x), em.zeros_like(x:cuda()), 'zeros_like ' .. dt)
    compare(em.ones_like(x), em.ones_like(x:cuda()), 'ones_like ' .. dt)
  end
  compare(em.eye(3, 70), em.eye(3, 70, { device = 'cuda' }), 'eye 3x70')
  if H.two_devices() then
    compare(em.full(70000, -2.5), em.full(70000, -2.5, { device = 'cuda:1' }), 'full 70000 on cuda:1'); H.eq(em.zeros(3, { device = 'cuda:1' }).device, 'cuda:1')
  end
  for _, a in ipairs({ { 10 }, { 2, 70002, 7 }, { 5, -5, -1 }, { 0, 1, 0.1 }, { -1, 1, 0.25 } }) do
    for _, dt in ipairs({ false, 'float64', 'int32', 'float16' }) do   -- false: the default
      same('arange ' .. table.concat(a, ',') .. ' ' .. tostring(dt), function(dev)
        return em.arange(a[1], a[2], a[3], { dtype = dt or nil, device = dev })
      end, { 'cpu' }, { 'cuda' })
    end
  end
end)

H.test('random draws: the same seed gives the same numbers on cuda and cpu', function()
  for _, n in ipairs({ 1, 33, 1001, 70001 }) do
    for _, dt in ipairs(FLOATS) do
      for _, f in ipairs({ 'rand', 'randn' }) do
        em.manual_seed(n); local c1 = em[f](n, { dtype = dt }); local c2 = em[f](n, { dtype = dt })
        em.manual_seed(n); local d1 = em[f](n, { dtype = dt, device = 'cuda' }); local d2 = em[f](n, { dtype = dt, device = 'cuda' })
        local k = f == 'randn' and normal_k(dt) or 0
        compare(c1, d1, ('%s(%d)'):format(f, n), k); compare(c2, d2, ('%s(%d), second draw'):format(f, n), k)
      end
    end
    for _, dt in ipairs({ 'int64', 'int32', 'uint8', 'float32', 'bool' }) do
      local lo = (dt == 'uint8' or dt == 'bool') and 0 or -7
      em.manual_seed(3); local c, cr = em.randint(lo, 2, { n }, { dtype = dt }), em.zeros(n, { dtype = dt }):random_(0, 2)
      em.manual_seed(3); local d, dr = em.randint(lo, 2, { n }, { dtype = dt, device = 'cuda' }), em.zeros(n, { dtype = dt, device = 'cuda' }):random_(0, 2)
      compare(c, d, ('randint(%d) %s'):format(n, dt), 0); compare(cr, dr, ('random_ after randint(%d) %s'):format(n, dt), 0)
    end
  end
  -- in-place fills into strided views of the device, and the *_like creators
  for _, dt in ipairs(FLOATS) do
    for _, f in ipairs(forms(33, 40, dt)) do
      if f[1] ~= 'expanded' then
        em.manual_seed(5); f[2]:uniform_(-2, 3); f[2]:normal_(1, 0.5)
        em.manual_seed(5); f[3]:uniform_(-2, 3); f[3]:normal_(1, 0.5)
        compare(f[2], f[3], 'uniform_ then normal_ into a ' .. f[1] .. ' view', normal_k(dt))
      end
    end
    local x = rnd({ 4, 5 }, dt)
    em.manual_seed(9); local c = em.rand_like(x) + em.randn_like(x)
    em.manual_seed(9); local d = em.rand_like(x:cuda()) + em.randn_like(x:cuda())
    compare(c, d, 'rand_like + randn_like ' .. dt)
  end
end)

local UNARY = { 'neg', 'abs', 'exp', 'log', 'sqrt', 'rsqrt', 'sin', 'cos', 'tanh', 'sigmoid',
  'relu', 'gelu', 'silu', 'floor', 'ceil', 'round', 'trunc', 'sign', 'reciprocal', 'square',
  'log1p', 'expm1', 'log2', 'log10', 'tan', 'asin', 'acos', 'atan', 'sinh', 'cosh', 'erf',
  'logical_not' }
local DOMAIN = { log = positive, sqrt = positive, rsqrt = positive, log1p = positive, log2 = positive,
  log10 = positive, asin = function(s, dt) return rnd(s, 'float64'):tanh():to(dt) end }
DOMAIN.acos = DOMAIN.asin

H.test('unary ops, every dtype and view', function()
  for _, dt in ipairs(DTYPES) do
    for _, name in ipairs(UNARY) do
      for _, f in ipairs(forms(5, 7, dt, DOMAIN[name])) do
        same(('%s %s %s'):format(name, dt, f[1]), function(x) return x[name](x) end, { f[2] }, { f[3] })
      end
    end
    local f = forms(3, 4, dt)[2]
    same('gelu tanh, unary minus ' .. dt, function(x) return x:gelu('tanh') - x end, { f[2] }, { f[3] })
  end
  for _, n in ipairs(SIZES) do
    local x = rnd({ n }, 'float32')
    same('exp(' .. n .. ')', function(t) return t:exp() end, { x }, { x:cuda() })
    same('sigmoid(' .. n .. ') stepped', function(t) return t:view(-1, 1):expand(n, 2):t()[2]:sigmoid() end, { x }, { x:cuda() })
  end
  local s = em.tensor({ 0 / 0, math.huge, -math.huge, 0, -0.0, 88, -88, 1e-30 })
  for _, name in ipairs(UNARY) do
    same(name .. ' of nan/inf/0/extremes', function(x) return x[name](x) end, { s }, { s:cuda() })
  end
end)

local BINARY = { 'add', 'sub', 'mul', 'div', 'pow', 'maximum', 'minimum', 'eq', 'ne', 'lt', 'le',
  'gt', 'ge', 'remainder', 'atan2', 'logical_and', 'logical_or' }
-- divisors and exponents that every dtype can take (no integer division by zero)
local function small(shape, dt)
  return dt == 'bool' and em.ones(shape, { dtype = 'bool' }) or em.randint(1, 4, shape, { dtype = 'float64' }):to(dt)
end

H.test('binary ops: every dtype, views, broadcasting, scalars', function()
  for _, dt in ipairs(DTYPES) do
    local A = forms(6, 5, dt)
    for _, name in ipairs(BINARY) do
      local second = (name == 'div' or name == 'pow' or name == 'remainder') and small or rnd
      for i, f in ipairs(forms(6, 5, dt, second)) do
        local a = A[(i % #A) + 1]
        same(('%s %s %s,%s'):format(name, dt, a[1], f[1]), function(x, y) return x[name](x, y) end, { a[2], f[2] }, { a[3], f[3] })
      end
      local row, col = second({ 5 }, dt), second({ 6, 1 }, dt)
      same(('%s %s broadcast row'):format(name, dt), function(x, y) return x[name](x, y) end, { A[1][2], row }, { A[1][3], row:cuda() })
      same(('%s %s broadcast col x row'):format(name, dt), function(x, y) return x[name](y, x) end, { col, row }, { col:cuda(), row:cuda() })
      for _, s in ipairs({ 2, 0.5, -3 }) do
        same(('%s %s with scalar %g'):format(name, dt, s), function(x) return x[name](x, s) end, { A[2][2] }, { A[2][3] })
      end
    end
    local x = A[3]
    same('2 - x ' .. dt, function(t) return 2 - t end, { x[2] }, { x[3] })
    same('3 / x ' .. dt, function(t) return 3 / (t + 100) end, { x[2] }, { x[3] })
    same('2 ^ x ' .. dt, function(t) return 2 ^ t end, { x[2] }, { x[3] })
    same('add, sub with alpha ' .. dt, function(t, u) return t:add(u, 3):sub(u, 2) end, { x[2], A[2][2] }, { x[3], A[2][3] })
  end
  -- type promotion between dtypes
  for _, p in ipairs({ { 'int32', 'float32' }, { 'uint8', 'int64' }, { 'bool', 'float16' }, { 'float16', 'bfloat16' },
                       { 'int64', 'float64' }, { 'bool', 'int32' }, { 'uint8', 'bfloat16' }, { 'float32', 'float64' } }) do
    local a, b = rnd({ 4, 3 }, p[1]), rnd({ 3 }, p[2])
    for _, name in ipairs({ 'add', 'mul', 'sub', 'div', 'lt', 'maximum' }) do
      same(('%s %s,%s'):format(name, p[1], p[2]), function(x, y) return x[name](x, y) end, { a, b }, { a:cuda(), b:cuda() })
    end
  end
  for _, n in ipairs(SIZES) do
    local a, b = rnd({ n }, 'float32'), rnd({ n }, 'float32')
    same('a * b + a (' .. n .. ')', function(x, y) return x * y + x end, { a, b }, { a:cuda(), b:cuda() })
    same('a / b, b stepped (' .. n .. ')', function(x, y) return x / y:view(-1, 1):expand(n, 2):t()[1] end, { a, b }, { a:cuda(), b:cuda() })
  end
end)

H.test('where and clamp', function()
  for _, dt in ipairs(DTYPES) do
    local C, A, B = forms(6, 5, 'bool'), forms(6, 5, dt), forms(6, 5, dt)
    for i = 1, #A do
      local c, a, b = C[i], A[(i % #A) + 1], B[((i + 1) % #B) + 1]
      same(('where %s %s,%s,%s'):format(dt, c[1], a[1], b[1]), function(x, y, z) return em.where(x, y, z) end,
        { c[2], a[2], b[2] }, { c[3], a[3], b[3] })
      same(('where %s with scalars'):format(dt), function(x, y) return em.where(x, y, 1) end,
        { c[2], a[2] }, { c[3], a[3] })
      same(('where %s scalar first'):format(dt), function(x, y) return em.where(x, 0, y) end,
        { c[2], a[2] }, { c[3], a[3] })
      same(('clamp %s %s'):format(dt, a[1]), function(x) return x:clamp(-1, 1) end, { a[2] }, { a[3] })
      same(('clamp lo %s %s'):format(dt, a[1]), function(x) return x:clamp(0.5) end, { a[2] }, { a[3] })
      same(('clamp hi %s %s'):format(dt, a[1]), function(x) return x:clamp(nil, 3) end, { a[2] }, { a[3] })
    end
    local c, a = rnd({ 6, 1 }, 'bool'), rnd({ 5 }, dt)
    same('where broadcast ' .. dt, function(x, y, z) return em.where(x, y, z) end, { c, a, B[1][2] }, { c:cuda(), a:cuda(), B[1][3] })
  end
  local s = em.tensor({ 0 / 0, -math.huge, 2, -2 })
  same('clamp keeps nan', function(x) return x:clamp(-1, 1) end, { s }, { s:cuda() })
end)

H.test('casts between all eight dtypes', function()
  for _, from in ipairs(DTYPES) do
    for _, to in ipairs(DTYPES) do
      -- float -> uint8 of a negative value is undefined in C (and CUDA): stay >= 0 there
      local gen = function(s, dt)
        local v = em.randn(s, { dtype = 'float64' }) * 60
        if to == 'uint8' or from == 'uint8' then v = v:abs() end
        return (v * em.randint(0, 2, s, { dtype = 'float64' })):to(dt)  -- some zeros for bool
      end
      for _, f in ipairs(forms(5, 33, from, gen)) do
        same(('cast %s -> %s %s'):format(from, to, f[1]), function(x) return x:to(to) end, { f[2] }, { f[3] })
      end
    end
  end
  local x = em.randn(70000, { dtype = 'float64' }) * 1000
  for _, m in ipairs({ 'float', 'double', 'half', 'bfloat16', 'int', 'long', 'bool' }) do
    same(m .. '() of 70000', function(t) return t[m](t) end, { x }, { x:cuda() })
  end
  same('byte() of 70000', function(t) return t:abs():byte() end, { x }, { x:cuda() })
  local d = em.randn(3, 4):to({ device = 'cuda', dtype = 'float64' })
  H.eq({ d.device, d.dtype }, { 'cuda:0', 'float64' }, "to{device=, dtype=}")
end)

H.test('reductions: every op, dims, keepdim, long and short dims', function()
  local REDS = { 'sum', 'mean', 'prod', 'amax', 'amin', 'logsumexp', 'var', 'std', 'norm', 'any', 'all' }
  for _, dt in ipairs(DTYPES) do
    local gen = function(s, d) return rnd(s, 'float64'):mul(0.05):add(1):to(d) end  -- prod stays finite
    for _, f in ipairs(forms(7, 9, dt, (dt ~= 'bool' and dt ~= 'uint8' and not dt:find('int')) and gen or nil)) do
      for _, name in ipairs(REDS) do
        for _, dim in ipairs({ false, 1, 2, -1 }) do
          for _, keep in ipairs({ false, true }) do
            local fn = dim and function(x) return x[name](x, dim, keep) end or function(x) return x[name](x) end
            if name == 'norm' then fn = function(x) return x:norm(2, dim or nil, keep) end end
            same(('%s(%s%s) %s %s'):format(name, tostring(dim), keep and ', keepdim' or '', dt, f[1]), fn,
              { f[2] }, { f[3] }, 30)
          end
        end
      end
      for _, name in ipairs({ 'max', 'min', 'argmax', 'argmin' }) do
        same(('%s() %s %s'):format(name, dt, f[1]), function(x) return x[name](x) end, { f[2] }, { f[3] })
        for _, dim in ipairs({ 1, 2 }) do
          same(('%s(%d) %s %s'):format(name, dim, dt, f[1]), function(x) return x[name](x, dim) end, { f[2] }, { f[3] })
          same(('%s(%d) indices %s %s'):format(name, dim, dt, f[1]),
            function(x) return select(2, x[name](x, dim, true)) or x[name](x, dim, true) end, { f[2] }, { f[3] })
        end
      end
      same('sum {1,2} ' .. dt, function(x) return x:sum({ 1, 2 }) end, { f[2] }, { f[3] }, 30)
      same('var unbiased=false ' .. dt, function(x) return x:var(2, { unbiased = false }) end, { f[2] }, { f[3] }, 30)
      same('norm p=1 ' .. dt, function(x) return x:norm(1, 1) end, { f[2] }, { f[3] }, 30)
      same('norm p=inf ' .. dt, function(x) return x:norm(math.huge, 2) end, { f[2] }, { f[3] })
      same('norm p=3 ' .. dt, function(x) return x:norm(3) end, { f[2] }, { f[3] }, 30)
    end
  end
  -- long and short reduced dims, strided and not; k grows with the terms added.
  -- (Under ThreadSanitizer the long dim is 9001: past the 8192 elements from
  -- which the kernels split a slice across blocks, so the same code runs.)
  local long = H.tsan() and 9001 or 70000
  for _, s in ipairs({ { long, 1 }, { 1, long }, { 1000, 3 }, { 3, 1000 }, { 33, 257 }, { 2, 31 }, { 40, 2500 } }) do
    for _, dt in ipairs({ 'float32', 'float64', 'float16', 'int64' }) do
      for _, f in ipairs({ { 'rows', rnd(s, dt) }, { 'transposed', rnd({ s[2], s[1] }, dt):t() } }) do
        for _, name in ipairs({ 'sum', 'mean', 'amax', 'argmin', 'var', 'norm', 'logsumexp' }) do
          for _, dim in ipairs({ false, 1, 2 }) do
            local n = dim and s[dim] or s[1] * s[2]
            local fn = dim and function(x) return x[name](x, dim) end or function(x) return x[name](x) end
            if name == 'norm' then fn = function(x) return x:norm(2, dim or nil) end end
            same(('%s(%s) of %dx%d %s %s'):format(name, tostring(dim), s[1], s[2], f[1], dt), fn,
              { f[2] }, { f[2]:cuda() }, 10 * math.sqrt(n))
          end
        end
      end
    end
  end
  -- ties: the first index wins, as on the cpu
  local t = em.tensor({ { 1, 3, 3, 0 }, { 2, 2, 1, 2 } })
  for _, dt in ipairs(DTYPES) do
    for _, name in ipairs({ 'argmax', 'argmin' }) do
      same(name .. ' ties ' .. dt, function(x) return x[name](x, 2) end, { t:to(dt) }, { t:to(dt):cuda() })
      same(name .. ' ties all ' .. dt, function(x) return x[name](x) end, { t:to(dt) }, { t:to(dt):cuda() })
    end
  end
  local nan = em.tensor({ { 1, 0 / 0, 3 }, { -math.huge, 2, 1 } })
  for _, name in ipairs({ 'sum', 'amax', 'amin', 'argmax', 'argmin', 'logsumexp', 'max', 'min' }) do
    same(name .. ' with nan and -inf', function(x) return x[name](x, 2) end, { nan }, { nan:cuda() })
  end
end)

H.test('softmax and log_softmax', function()
  for _, dt in ipairs(FLOATS) do
    for _, f in ipairs(forms(9, 33, dt)) do
      for _, dim in ipairs({ 1, 2, -1 }) do
        for _, name in ipairs({ 'softmax', 'log_softmax' }) do
          same(('%s(%d) %s %s'):format(name, dim, dt, f[1]), function(x) return x[name](x, dim) end, { f[2] }, { f[3] }, 10)
        end
      end
    end
  end
  for _, s in ipairs({ { 2, 70000 }, { 1000, 3 }, { 4, 33, 3 }, { 1, 1 }, { 40, 2500 } }) do
    local x = rnd(s, 'float32') * 10
    for _, dim in ipairs({ 1, -1 }) do
      same(('softmax(%d) of %s'):format(dim, H.show(s)), function(t) return t:softmax(dim) end, { x }, { x:cuda() }, 10)
      same(('log_softmax(%d) of %s'):format(dim, H.show(s)), function(t) return t:log_softmax(dim) end, { x }, { x:cuda() }, 100)
    end
  end
  local inf = em.tensor({ { -math.huge, 0, 1 }, { -math.huge, -math.huge, 5 } })
  same('softmax with -inf', function(t) return t:softmax(2) end, { inf }, { inf:cuda() })
end)

H.test('matmul: batched, broadcast, transposed views, every dtype', function()
  local cases = { { { 3, 4 }, { 4, 5 } }, { { 4 }, { 4, 5 } }, { { 3, 4 }, { 4 } }, { { 4 }, { 4 } },
    { { 2, 3, 4 }, { 2, 4, 5 } }, { { 2, 1, 3, 4 }, { 3, 4, 5 } }, { { 3, 4 }, { 2, 4, 1 } },
    { { 33, 70 }, { 70, 31 } }, { { 1, 1 }, { 1, 1 } } }
  for _, dt in ipairs(DTYPES) do
    for _, c in ipairs(cases) do
      local a, b = rnd(c[1], dt), rnd(c[2], dt)
      local k = 10 * c[1][#c[1]]
      same(('matmul %s x %s %s'):format(H.show(c[1]), H.show(c[2]), dt), em.matmul, { a, b }, { a:cuda(), b:cuda() }, k)
      if #c[1] >= 2 and #c[2] >= 2 then        -- the same values through transposed views
        local at, bt = a:transpose(-1, -2):contiguous(), b:transpose(-1, -2):contiguous()
        same(('matmul of transposed views %s %s'):format(H.show(c[1]), dt),
          function(x, y) return em.matmul(x:transpose(-1, -2), y:transpose(-1, -2)) end,
          { at, bt }, { at:cuda(), bt:cuda() }, k)
      end
    end
    local a, b = forms(6, 5, dt), forms(5, 4, dt)
    for i = 1, #a do
      same(('mm %s,%s %s'):format(a[i][1], b[i][1], dt), em.mm, { a[i][2], b[i][2] }, { a[i][3], b[i][3] }, 50)
    end
    local x, y = rnd({ 2, 3, 4 }, dt), rnd({ 2, 4, 2 }, dt)
    same('bmm ' .. dt, em.bmm, { x, y }, { x:cuda(), y:cuda() }, 40)
    same('dot ' .. dt, em.dot, { x[1][1], y[1]:t()[1] }, { x:cuda()[1][1], y:cuda()[1]:t()[1] }, 40)
    same('mv ' .. dt, function(m, v) return m:mv(v) end, { x[1], y[1]:t()[2] }, { x:cuda()[1], y:cuda()[1]:t()[2] }, 40)
  end
end)

H.done()

--[[
test_tensor_ops_more.lua -- the tensor ops of API.md's "More of PyTorch's tensor ops"
(tril triu masked_fill cumsum cumprod sort argsort topk chunk split tile
repeat_interleave flip einsum multinomial): values against PyTorch's
(tests/fixtures/tensor_ops_more.lua, by gen_tensor_ops_more.py) on contiguous,
transposed, narrowed and broadcast inputs; the same calls on `cuda` (emulated,
EMBER_CUDA_EMULATE=2:64; the test runs itself again under it) against the CPU;
shapes on meta; gradients by gradcheck in float64; and the errors.
]]
local dir = (arg and arg[0] and arg[0]:match('^(.*/)')) or
            ((os.getenv('EMBER_TESTS') or 'tests') .. '/lua/')
local H, em = dofile(dir .. 'cuda_emulated.lua')('2:64')
local F = dofile(dir .. '../fixtures/tensor_ops_more.lua')

local function T(spec, dev)
  local data = spec.data
  local t = em.tensor(#data > 0 and data or { 0 }, { dtype = spec.dtype })
  if #data == 0 then t = t:narrow(1, 1, 0) end
  t = t:reshape(spec.shape)
  return dev and t:to(dev) or t
end

local TOL = { float32 = 1e-5, float64 = 1e-12 }
local function same(got, spec, what)
  local want = T(spec)
  if not H.eq(got.shape, want.shape, what .. ' shape') then return end
  H.eq(got.dtype, want.dtype, what .. ' dtype')
  H.close(H.flat(got:cpu()), H.flat(want), TOL[spec.dtype] or 0, what)
end

-- Each case's calls, as the generator's torch code makes them (dims 1-based here).
local CALLS = {
  tril = function(x) return { x:tril(), x:tril(1), x:tril(-2), x:t():tril(-1) } end,
  triu = function(x) return { x:triu(), x:triu(2), x:t():triu(-1), x:triu(9) } end,
  triu_batched = function(b) return { b:triu(1), b:transpose(2, 3):tril() } end,
  tril_int64 = function(x) return { x:tril(), em.triu(x, 1) } end,
  masked_fill = function(x, m_row, m_col)
    return { x:masked_fill(m_row, -1.5), x:t():masked_fill(m_col, 2.0),
             em.masked_fill(x, x:gt(0), 0) }
  end,
  masked_fill_int64 = function(x, m)
    return { x:masked_fill(m, 7), x:masked_fill(m, em.tensor(-2, { device = x.device })) }
  end,
  cumsum_f32 = function(x) return { x:cumsum(2), x:cumsum(1), x:t():cumsum(2),
                                    x:narrow(2, 2, 3):cumsum(2) } end,
  cumprod_f64 = function(x) return { x:cumprod(2), x:t():cumprod(1), em.cumprod(x, -2) } end,
  cumsum_int64 = function(x) return { x:cumsum(2), x:cumprod(2), x:t():cumsum(1) } end,
  sort_ties = function(x)
    local v, i = x:sort(-1)
    local vd, id = x:sort(-1, true)
    local vt, it = x:t():sort(1)
    local vn, inn = x:narrow(2, 2, 5):sort(2, true)
    return { v, i, vd, id, vt, it, vn, inn }
  end,
  sort_nan_f64 = function(x)
    local v, i = x:sort()
    local vd, id = em.sort(x, true)
    return { v, i, vd, id }
  end,
  sort_int64 = function(x)
    local v, i = x:sort(1)
    return { v, i, x:argsort(2, true) }
  end,
  topk = function(x)
    local v, i = x:topk(3)
    local vs, is = x:topk(2, 1, false)
    local vt, it = em.topk(x:t(), 4, 2)
    return { v, i, vs, is, vt, it }
  end,
  topk_long = function(x)
    local v, i = x:topk(5)
    local vs, is = x:topk(9, 2, false)
    local vt, it = x:t():topk(4, 1)
    local vn, inn = x:narrow(2, 11, 200):topk(50)
    return { v, i, vs, is, vt, it, vn, inn }
  end,
  chunk = function(x)
    local r = {}
    for _, l in ipairs({ x:chunk(3), x:t():chunk(2, 2), em.chunk(x, 4, 2) }) do
      for _, p in ipairs(l) do r[#r + 1] = p end
    end
    return r
  end,
  split = function(x)
    local r = {}
    for _, l in ipairs({ x:split(3), x:split({ 2, 5 }), x:t():split(2, 1) }) do
      for _, p in ipairs(l) do r[#r + 1] = p end
    end
    return r
  end,
  tile = function(x) return { x:tile(2, 1), x:tile({ 2, 2, 3 }), x:t():tile(3, 1), x:tile(1, 1) } end,
  tile_int64 = function(x) return { x:tile(2, 2) } end,
  repeat_interleave = function(x)
    local reps = em.tensor({ 1, 3 }, { dtype = 'int64', device = x.device })
    return { x:repeat_interleave(2), x:repeat_interleave(3, 2), x:t():repeat_interleave(2, 1),
             x:repeat_interleave(reps, 1) }
  end,
  flip = function(x) return { x:flip({ 1, 3 }), x:flip(2), x:transpose(1, 3):flip(1), em.flip(x, { -1 }) } end,
  einsum = function(a, bm, v3, v4, sq, ba, bb, q, k, t3, t4, e1, e2)
    local E = em.einsum
    return { E('ij,jk->ik', a, bm), E('bij,bjk->bik', ba, bb), E('i,j->ij', v3, v4),
             E('ii->i', sq), E('ii', sq), E('ij->ji', a), E('bhqd,bhkd->bhqk', q, k),
             E('ijk,ikl->jl', t3, t4), E('ij,ij->', a, a), E('ij,jk', { a, bm }),
             E('...ij->...ji', ba), E('ij,j->i', a:t():contiguous():t(), v4),
             E('ji,jk->ik', a:t(), bm), E('i,i,i->', v3, v3, v3), E('bij,jk->bik', ba, bm),
             E('...ij,...jk->...ik', e1, e2), E('bij,bkj->bik', ba, ba:narrow(2, 2, 2)) }
  end,
}
-- The inputs of each case, in the calls' order.
local ARGS = {
  masked_fill = { 'x', 'm_row', 'm_col' }, masked_fill_int64 = { 'x', 'm' },
  triu_batched = { 'b' },
  einsum = { 'a', 'bm', 'v3', 'v4', 'sq', 'ba', 'bb', 'q', 'k', 't3', 't4', 'e1', 'e2' },
}
local function inputs(name, dev)
  local r = {}
  for i, key in ipairs(ARGS[name] or { 'x' }) do r[i] = T(F[name].inputs[key], dev) end
  return r
end

H.test('values against PyTorch (cpu)', function()
  local names = {}
  for name in pairs(CALLS) do names[#names + 1] = name end
  table.sort(names)
  for _, name in ipairs(names) do
    H.check(F[name] ~= nil, 'fixture case ' .. name)
    local got = CALLS[name](unpack(inputs(name)))
    H.eq(#got, #F[name].outs, name .. ': number of results')
    for j, spec in ipairs(F[name].outs) do
      if got[j] then same(got[j], spec, ('%s result %d'):format(name, j)) end
    end
  end
end)

H.test('cuda (emulated) gives the cpu results', function()
  for name, call in pairs(CALLS) do
    local want, got = call(unpack(inputs(name))), call(unpack(inputs(name, 'cuda')))
    for j = 1, #want do
      H.eq(got[j].device, 'cuda:0', name .. ' device')
      H.eq(got[j].shape, want[j].shape, name .. ' shape')
      H.close(H.flat(got[j]:cpu()), H.flat(want[j]), 1e-6, ('%s result %d on cuda'):format(name, j))
    end
  end
  -- lines longer than a block, and many lines, through the kernels
  local x = em.randn(3, 700):to('cuda')
  local v, i = x:sort(2, true)
  local vc, ic = x:cpu():sort(2, true)
  H.close(H.flat(v:cpu()), H.flat(vc), 0, 'long sort values')
  H.close(H.flat(i:cpu()), H.flat(ic), 0, 'long sort indices')
  -- lines past the kernel's length sort on the host: ties keep their order there too
  local ties = em.randint(0, 50, { 2, 5000 }):float():to('cuda'):t()
  local tv, ti = ties:sort(1)
  local cv, ci = ties:cpu():sort(1)
  H.close(H.flat(tv:cpu()), H.flat(cv), 0, 'sort of 5000-long lines (values)')
  H.close(H.flat(ti:cpu()), H.flat(ci), 0, 'sort of 5000-long lines (stable indices)')
  H.eq(ti.device, 'cuda:0', 'long-line indices stay on the device')
  -- gradients through the cuda kernels and compositions match the cpu's
  local xg = em.tensor({ { 1.5, 0, 2, -0.5, 3 }, { 0.5, -1, 0, 0, 2 } }):double()
  local function grad_on(dev, f)
    local a = xg:clone():to(dev):requires_grad_()
    f(a):sum():backward()
    return a.grad:cpu()
  end
  local grads = {
    cumsum = function(a) return a:cumsum(2) * a end,
    cumprod = function(a) return a:t():cumprod(1) end,
    sort = function(a) return (a:sort(2, true)) * em.arange(5):double():to(a.device) end,
    topk = function(a) return (a:topk(2, 1)) * 3 end,
    einsum = function(a) return em.einsum('ij,kj->ik', a, a) end,
    masked_fill = function(a) return a:masked_fill(a:gt(1), 0) * a end,
  }
  for name, f in pairs(grads) do
    H.close(H.flat(grad_on('cuda', f)), H.flat(grad_on('cpu', f)), 1e-12, name .. ' gradient on cuda')
  end
  local base = em.randn(600, 5):double()
  local c = base:to('cuda'):t():cumprod(1)
  H.close(H.flat(c:cpu()), H.flat(base:t():cumprod(1)), 1e-12, 'cumprod of many lines')
end)

-- topk selects a line's first k without sorting the rest (k up to a quarter of
-- the line on the CPU; the kernel's ranks below k on cuda): it must give the
-- sort's head exactly, ties in their stable order and NaN where sort puts it.
H.test('topk is the sort\'s head (ties, NaN; cpu and cuda)', function()
  local ints = em.randint(0, 20, { 3, 1000 })
  local nan = em.randn(4, 600):double()
  nan = nan:masked_fill(nan:gt(1.2), 0 / 0)
  local long = em.randint(0, 50, { 2, 5000 }):float()
  local cases = {
    { 'int64 ties', ints, 7, 2, true }, { 'int64 ties, smallest', ints, 30, 2, false },
    { 'transposed', ints:t(), 5, 1, true }, { 'NaN first', nan, 60, 2, true },
    { 'NaN last', nan, 3, 2, false }, { 'k past a quarter', ints, 400, 2, true },
    { 'whole line', ints, 1000, 2, false }, { 'past the cuda kernel', long, 20, 2, true },
  }
  for _, dev in ipairs({ 'cpu', 'cuda' }) do
    for _, c in ipairs(cases) do
      local what, x, k, dim, largest = c[1] .. ' on ' .. dev, c[2]:to(dev), c[3], c[4], c[5]
      local v, i = x:topk(k, dim, largest)
      local _, si = x:sort(dim, largest)
      local want = si:narrow(dim, 1, k)
      H.eq(i.shape, want.shape, what .. ': shape')
      H.eq(H.flat(i:cpu()), H.flat(want:cpu()), what .. ': indices')
      -- (the values are the input's at those indices: NaN where NaN was picked)
      local g = x:gather(dim, i)
      H.eq(v:ne(g):logical_and(v:eq(v)):sum():item(), 0, what .. ': values at the indices')
    end
  end
end)

-- Lines of every dtype but float64 and int64 sort as 32-bit words on the CPU
-- (the value's bits, ordered, above the position); float64 lines sort (value,
-- position) pairs. The two ways must agree: -0 equal to 0, NaN above all, ties
-- stable, sorts and topk's selection alike.
H.test('sorts of 32-bit keys agree with float64\'s (every dtype, -0, NaN, ties)', function()
  local x = em.randint(-6, 7, { 3, 900 }):double() / 2
  x = x:masked_fill(x:eq(0):logical_and(em.rand(3, 900):gt(0.5)), -0.0)
  local with_nan = x:masked_fill(x:gt(2.5), 0 / 0)
  local cases = {
    { 'float32', with_nan:float() }, { 'bfloat16', with_nan:to('bfloat16') },
    { 'float16', with_nan:to('float16') }, { 'int32', (x * 2):to('int32') },
    { 'uint8', (x * 2 + 12):to('uint8') }, { 'bool', x:gt(0) },
    { 'float32 transposed', with_nan:float():t():contiguous():t() },
  }
  for _, c in ipairs(cases) do
    local what, t = c[1], c[2]
    for _, desc in ipairs({ false, true }) do
      local how = what .. (desc and ' descending' or ' ascending')
      local want = select(2, t:double():sort(2, desc))
      H.eq(H.flat(select(2, t:sort(2, desc))), H.flat(want), how .. ': sort')
      H.eq(H.flat(select(2, t:topk(40, 2, desc))), H.flat(want:narrow(2, 1, 40)), how .. ': topk')
    end
  end
end)

H.test('meta: shapes and dtypes', function()
  local x = em.empty({ 4, 6 }, { device = 'meta' })
  local v, i = x:sort(1)
  H.eq({ v.shape, i.shape, i.dtype, v.device }, { { 4, 6 }, { 4, 6 }, 'int64', 'meta' }, 'sort')
  v, i = x:topk(2)
  H.eq({ v.shape, i.shape }, { { 4, 2 }, { 4, 2 } }, 'topk')
  H.eq(x:argsort(2).shape, { 4, 6 }, 'argsort')
  H.eq({ x:cumsum(2).shape, x:cumprod(1).dtype }, { { 4, 6 }, 'float32' }, 'cumsum/cumprod')
  H.eq(em.empty({ 2, 3 }, { dtype = 'int32', device = 'meta' }):cumsum(1).dtype, 'int64', 'cumsum int32')
  H.eq({ x:tril().shape, x:triu(1).device }, { { 4, 6 }, 'meta' }, 'tril/triu')
  H.eq(x:masked_fill(em.empty({ 6 }, { dtype = 'bool', device = 'meta' }), 1).shape, { 4, 6 }, 'masked_fill')
  H.eq(#x:chunk(3, 2), 3, 'chunk')
  H.eq(x:split({ 1, 3 })[2].shape, { 3, 6 }, 'split')
  H.eq(x:tile(2, 1, 1).shape, { 2, 4, 6 }, 'tile')
  H.eq(x:repeat_interleave(2, 2).shape, { 4, 12 }, 'repeat_interleave')
  H.eq(x:flip(1).shape, { 4, 6 }, 'flip')
  H.eq(em.einsum('ij,kj->ik', x, em.empty({ 5, 6 }, { device = 'meta' })).shape, { 4, 5 }, 'einsum')
  H.eq(em.multinomial(x, 3).shape, { 4, 3 }, 'multinomial')
end)

H.test('0-D and empty inputs', function()
  local s = em.tensor(2.5)
  local v, i = s:sort()
  H.eq({ v:dim(), v:item(), i:item() }, { 0, 2.5, 1 }, 'sort of a 0-D tensor')
  H.eq({ s:cumsum(1):dim(), s:cumprod(-1):item() }, { 0, 2.5 }, 'scans of a 0-D tensor')
  local e = em.empty(0, 3)
  H.eq(e:sort(1).shape, { 0, 3 }, 'sort of an empty tensor')
  H.eq(e:cumsum(2).shape, { 0, 3 }, 'cumsum of an empty tensor')
  H.eq(em.ones(4):cumsum(1):totable(), { 1, 2, 3, 4 }, 'cumsum 1-D')
  H.eq(em.tensor({ true, false, true }):cumsum(1):totable(), { 1, 1, 2 }, 'cumsum of bool')
  H.eq(#em.arange(5):chunk(2), 2, 'chunk count')
end)

H.test('gradients (gradcheck, float64)', function()
  local g = em.autograd.gradcheck
  local function leaf(...) return em.randn(...):double():requires_grad_() end
  local x, y = leaf(4, 3), leaf(3, 5)
  H.check(g(function(a) return a:cumsum(2) end, { x }), 'cumsum')
  H.check(g(function(a) return a:t():cumsum(2) end, { x }), 'cumsum of a transpose')
  local p = (em.rand(3, 4):double() + 0.5):requires_grad_()
  H.check(g(function(a) return a:cumprod(2) end, { p }), 'cumprod')
  H.check(g(function(a) return a:t():cumprod(1) end, { p }), 'cumprod of a transpose')
  local z = em.tensor({ { 1.5, 0, 2, 0.5 }, { 0, 0, 3, 1 }, { 2, 1, -1, 0 } }):double():requires_grad_()
  H.check(g(function(a) return a:cumprod(2) end, { z }), 'cumprod through zeros')
  H.check(g(function(a) return a:t():cumprod(1) end, { z }), 'cumprod through zeros, transposed')
  H.check(g(function(a) return (a:sort(2)) end, { x }), 'sort values')
  H.check(g(function(a) return (a:sort(1, true)) end, { x }), 'sort values, descending')
  H.check(g(function(a) return (a:topk(2, 1)) end, { x }), 'topk values')
  local m = em.tensor({ true, false, true })
  H.check(g(function(a) return a:masked_fill(m, 3) end, { x }), 'masked_fill')
  H.check(g(function(a) return a:tril(-1) end, { x }), 'tril')
  H.check(g(function(a) return a:t():triu() end, { x }), 'triu of a transpose')
  H.check(g(function(a) return a:tile(2, 3) end, { x }), 'tile')
  H.check(g(function(a) return a:repeat_interleave(2, 1) end, { x }), 'repeat_interleave')
  H.check(g(function(a) return a:repeat_interleave({ 2, 0, 1 }, 2) end, { x }), 'repeat_interleave by list')
  H.check(g(function(a) return a:flip({ 1, 2 }) end, { x }), 'flip')
  H.check(g(function(a) return a:chunk(2) end, { x }), 'chunk')
  H.check(g(function(a) return a:split({ 1, 2 }, 2) end, { x }), 'split')
  H.check(g(function(a, b) return em.einsum('ij,jk->ik', a, b) end, { x, y }), 'einsum matmul')
  H.check(g(function(a) return em.einsum('ij,ij->j', a, a) end, { x }), 'einsum product sum')
  local sq = leaf(3, 3)
  H.check(g(function(a) return em.einsum('ii', a) end, { sq }), 'einsum trace')
  H.check(g(function(a, b) return em.einsum('ji,jk->ik', a, b) end, { x, leaf(4, 2) }), 'einsum transposed')
end)

H.test('multinomial', function()
  em.manual_seed(7)
  local probs = em.tensor({ { 0.1, 0, 0.6, 0.3 }, { 0, 0, 1, 0 } })
  local a = em.multinomial(probs, 2000, true)
  em.manual_seed(7)
  local b = em.multinomial(probs, 2000, true)
  H.eq({ a.shape, a.dtype }, { { 2, 2000 }, 'int64' }, 'shape and dtype')
  H.eq(H.flat(a), H.flat(b), 'reproducible from em.manual_seed')
  local counts = { 0, 0, 0, 0 }
  for _, c in ipairs(a[1]:totable()) do counts[c] = counts[c] + 1 end
  H.eq(counts[2], 0, 'a zero-probability class is never drawn')
  H.close(counts[3] / 2000, 0.6, 0.06, 'frequency of class 3')
  H.close(counts[1] / 2000, 0.1, 0.03, 'frequency of class 1')
  H.eq(a[2]:eq(3):all():item(), true, 'a one-hot row always gives its class')
  local w = em.multinomial(em.tensor({ 1, 2, 3, 4, 0 }):float(), 4)
  local seen = {}
  for _, c in ipairs(w:totable()) do seen[c] = (seen[c] or 0) + 1 end
  H.eq({ w.shape, seen[5] }, { { 4 }, nil }, 'without replacement: 4 of the 4 possible classes')
  H.eq({ seen[1], seen[2], seen[3], seen[4] }, { 1, 1, 1, 1 }, 'each drawn once')
  local top = 0
  for _ = 1, 300 do
    if em.multinomial(em.tensor({ 1, 1, 8 }):float(), 1):item() == 3 then top = top + 1 end
  end
  H.close(top / 300, 0.8, 0.1, 'first draw without replacement follows the weights')
  em.manual_seed(3)
  local c = em.multinomial(probs:to('cuda'), 50, true)
  em.manual_seed(3)
  H.eq(H.flat(c:cpu()), H.flat(em.multinomial(probs, 50, true)), 'cuda draws the cpu draws')
  H.eq(em.multinomial(probs:double(), 3, true):dim(), 2, 'float64 probs')
  -- many draws of many categories (past a million comparisons): the binary search
  -- counts what comparing every cumulative weight counts, zero-weight runs included
  em.manual_seed(11)
  local big = em.rand(3, 5000):double()
  local row = big[2]
  row:narrow(1, 100, 3000):zero_()
  em.manual_seed(12)
  local d = em.multinomial(big, 300, true)
  em.manual_seed(12)
  local u = em.empty({ 3, 300 }, { dtype = 'float64' }):uniform_()
  local cdf = big:cumsum(2)
  local want = cdf:unsqueeze(2):le((u * cdf:narrow(2, 5000, 1)):unsqueeze(3)):long():sum(3):add(1):clamp(1, 5000)
  H.eq(H.flat(d), H.flat(want), 'large draws: the counts of cumulative weights below each draw')
  H.eq(d[2]:ge(100):logical_and(d[2]:lt(3100)):any():item(), false, 'no draw from the zero-weight run')
  em.manual_seed(12)
  H.eq(H.flat(em.multinomial(big:to('cuda'), 300, true):cpu()), H.flat(d), 'large draws on cuda')
  -- the CPU's kernel against the composed path (the emulated GPU's), float32, a
  -- transposed (strided) weights tensor and bfloat16 weights
  local wt = em.rand(700, 4):t()
  for _, case in ipairs{ { wt, 'strided float32' }, { wt:bfloat16(), 'bfloat16' } } do
    em.manual_seed(13)
    local cpu = em.multinomial(case[1], 257, true)
    em.manual_seed(13)
    H.eq(H.flat(cpu), H.flat(em.multinomial(case[1]:to('cuda'), 257, true):cpu()),
         'cpu kernel equals the composed draws: ' .. case[2])
  end
end)

H.test('errors', function()
  local x = em.randn(3, 4)
  H.raises(function() x:topk(5) end, 'topk', 'k = 5', '[3,4]')
  H.raises(function() x:sort(3) end, 'sort', 'dimension 3 out of range')
  H.raises(function() x:cumsum(0) end, 'cumsum', 'dims are 1-based')
  H.raises(function() x:cumsum() end, 'cumsum', 'expected a dim')
  H.raises(function() x:masked_fill(em.tensor({ true, false }), 1) end, 'masked_fill', '[2]', '[3,4]')
  H.raises(function() x:masked_fill(em.tensor({ 1, 0, 1, 0 }), 1) end, 'masked_fill', 'bool', 'int64')
  H.raises(function() x:masked_fill(em.ones(3, 4):bool(), 'a') end, 'masked_fill', 'number')
  H.raises(function() em.ones(3):tril() end, 'tril', 'at least 2 dims')
  H.raises(function() x:chunk(0) end, 'chunk', 'positive integer')
  H.raises(function() x:split({ 1, 1 }) end, 'split', 'add up to 2', 'size 3')
  H.raises(function() x:tile(-1) end, 'tile', 'non-negative')
  H.raises(function() x:repeat_interleave({ 1, 2 }, 1) end, 'repeat_interleave', '2 repeats', 'size 3')
  H.raises(function() x:flip({ 1, 1 }) end, 'flip', 'more than once')
  H.raises(function() em.einsum('ij,jk->ik', x, em.ones(5, 2)) end, 'einsum', "'j'", '4', '5')
  H.raises(function() em.einsum('ij->i', x, x) end, 'einsum', '1 operands', '2 tensors')
  H.raises(function() em.einsum('ijk->i', x) end, 'einsum', '3 dims', '2')
  H.raises(function() em.einsum('ij->z', x) end, 'einsum', "'z'", 'no operand')
  H.raises(function() em.multinomial(em.tensor({ 0.5, -0.1 }), 1) end, 'multinomial', 'non-negative')
  H.raises(function() em.multinomial(em.tensor({ 0.5, 0.5 }), 3) end, 'multinomial', '3 samples', '2 categories')
  H.raises(function() em.multinomial(em.tensor({ 0.5, 0, 0 }), 2) end, 'multinomial', 'non-zero')
  H.raises(function() em.multinomial(em.tensor({ 1, 2 }, { dtype = 'int64' }), 1) end, 'multinomial', 'floating')
  H.raises(function() em.multinomial(em.zeros(2), 1, true) end, 'multinomial', 'positive sum')
  H.raises(function() em.multinomial(em.tensor({ { 1, 2 }, { 0, 0 } }):float(), 1, true) end,
           'multinomial', 'positive sum')
  H.raises(function() em.multinomial(em.tensor({ 0.5, -0.1 }), 1, true) end, 'multinomial',
           'non-negative', 'minimum of -0.1')
  H.raises(function() em.multinomial(em.tensor({ 0.5, 0 / 0 }), 1, true) end, 'multinomial', 'finite')
  H.raises(function() em.multinomial(em.tensor({ 0.5, math.huge }), 1, true) end, 'multinomial',
           'finite')
  H.raises(function() x:masked_fill(em.ones(4):bool():to('cuda'), 1) end, 'masked_fill', 'cuda')
  local keep = x:clone()
  pcall(function() x:masked_fill_(em.tensor({ true }), 'v') end)
  H.eq(H.flat(x), H.flat(keep), 'a failed masked_fill_ leaves the tensor intact')
  local y = x:clone()
  y:masked_fill_(em.tensor({ true, false, false, false }), 9)
  H.eq(H.flat(y:narrow(2, 1, 1)), { 9, 9, 9 }, 'masked_fill_ writes in place')
end)

H.done()

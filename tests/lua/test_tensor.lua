--[[
test_tensor.lua -- the Tensors section of API.md through ember's Lua API, beyond
what the PyTorch fixtures compare: creation functions and options tables,
inspection and printing, conversion, views that alias their base, t[i] get/set
and #t, operators with numbers on either side, in-place ops, random numbers
(reproducibility, ranges, statistics), error messages (they name the op and the
shapes) and failed ops leaving their inputs unchanged.
]]
local dir = (arg and arg[0] and arg[0]:match('^(.*/)')) or
            ((os.getenv('EMBER_TESTS') or 'tests') .. '/lua/')
local H = dofile(dir .. 'harness.lua')
local em = require 'ember'
local flat, num = H.flat, H.num

local function shape(t)
  local s = {}
  for i, v in ipairs(t.shape) do s[i] = tonumber(v) end
  return s
end

-- -- Creation ------------------------------------------------------------------------

H.test('creation functions', function()
  local z = em.zeros(2, 3)
  H.eq(shape(z), {2, 3}, 'zeros(2, 3) shape')
  H.eq(z.dtype, 'float32', 'default dtype')
  H.eq(flat(z), {0, 0, 0, 0, 0, 0}, 'zeros values')
  H.eq(shape(em.zeros({2, 3})), {2, 3}, 'shape as a table')
  H.eq(em.zeros({2, 3}, {dtype = 'float64'}).dtype, 'float64', 'options table')
  H.eq(em.zeros(4, {dtype = 'int64'}).dtype, 'int64', 'varargs then options')
  H.eq(flat(em.ones(3)), {1, 1, 1}, 'ones')
  H.eq(em.ones({2}, {dtype = 'bool'}).dtype, 'bool', 'ones bool')
  H.eq(shape(em.empty(2, 2)), {2, 2}, 'empty')
  local f = em.full({2, 2}, 7, {dtype = 'int32'})
  H.eq(f.dtype, 'int32', 'full dtype')
  H.eq(flat(f), {7, 7, 7, 7}, 'full values')
  H.eq(flat(em.full({3}, -1.5)), {-1.5, -1.5, -1.5}, 'full float')
  local s = em.tensor(3.5)
  H.eq(s:dim(), 0, 'tensor(number) is 0-d')
  H.eq(s:item(), 3.5, 'tensor(number) value')
  local m = em.tensor({{1, 2, 3}, {4, 5, 6}})
  H.eq(shape(m), {2, 3}, 'nested table shape')
  H.eq(flat(m), {1, 2, 3, 4, 5, 6}, 'nested table values')
  H.eq(em.tensor({1, 2}, {dtype = 'float64'}).dtype, 'float64', 'tensor with dtype')
  H.eq(em.tensor({1, 2}).dtype, 'int64', 'integers give int64 (as torch.tensor)')
  H.eq(em.tensor({1, 2.5}).dtype, 'float32', 'any fraction gives float32')
  H.eq(em.tensor({true, false}).dtype, 'bool', 'booleans give bool')
  H.eq(em.tensor({1.5, -2}, {dtype = 'float16'}):totable(), {1.5, -2}, 'float16 tensor')
  local e = em.eye(3)
  H.eq(flat(e), {1, 0, 0, 0, 1, 0, 0, 0, 1}, 'eye')
  H.eq(flat(em.arange(0, 5, 1, {dtype = 'int64'})), {0, 1, 2, 3, 4}, 'arange')
  H.close(flat(em.arange(1, 2, 0.25, {dtype = 'float64'})), {1, 1.25, 1.5, 1.75}, 1e-12,
          'arange with a step')
  H.eq(#flat(em.arange(0, 5)), 5, 'arange(0, 5) has 5 elements')
  local zl = em.zeros_like(f)
  H.eq({shape(zl), zl.dtype, flat(zl)}, {{2, 2}, 'int32', {0, 0, 0, 0}}, 'zeros_like')
  local ol = em.ones_like(m)
  H.eq({shape(ol), ol.dtype, flat(ol)[6]}, {{2, 3}, m.dtype, 1}, 'ones_like')
  local c = em.zeros({2}, {device = 'cpu'})
  H.eq(c.device, 'cpu', "device = 'cpu'")
  H.eq(shape(em.zeros(0, 3)), {0, 3}, 'zero-size tensor')
  H.raises(function() em.zeros(2, {dtype = 'float33'}) end, 'float33')
  H.raises(function() em.zeros(-1) end, '-1')
  local has_cuda = em.cuda and em.cuda.is_available and em.cuda.is_available()
  if not has_cuda then
    H.raises(function() em.zeros({2}, {device = 'cuda'}) end, 'cuda')
  end
end)

H.test('a bare dtype name after the shape is {dtype = name}', function()
  for _, f in ipairs({ 'zeros', 'ones', 'empty' }) do
    H.eq(em[f]({ 2, 3 }, 'int32').dtype, 'int32', f .. '({2, 3}, name)')
    H.eq(shape(em[f](2, 3, 'int64')), { 2, 3 }, f .. '(2, 3, name): the shape')
    H.eq(em[f](2, 3, 'int64').dtype, 'int64', f .. '(2, 3, name): the dtype')
  end
  H.eq(em.rand(2, 'float64').dtype, 'float64', 'rand(2, name)')
  H.eq(em.randn({ 2 }, 'bfloat16').dtype, 'bfloat16', 'randn({2}, name)')
  H.eq(flat(em.ones(2, 'int32')), { 1, 1 }, 'the values')
  H.raises(function() em.zeros(2, 'int77') end, 'zeros', 'int77')
  H.raises(function() em.zeros({ 2 }, 5) end, 'zeros', 'options table or a dtype name')
  H.raises(function() em.zeros(2, 'int32', 3) end, 'zeros')
  -- view/reshape take no options: a name there is a bad size
  H.raises(function() em.ones(4):view(2, 'int32') end, 'view', 'sizes')
end)

H.test('random creation', function()
  local r = em.rand(3, 4)
  H.eq(shape(r), {3, 4}, 'rand shape')
  H.eq(r.dtype, 'float32', 'rand dtype')
  H.eq(em.randn({2}, {dtype = 'float64'}).dtype, 'float64', 'randn with options')
  local ri = em.randint(0, 10, {100})
  H.eq(ri.dtype, 'int64', 'randint default dtype is int64 (as torch)')
  H.eq(em.randint(0, 10, {5}, {dtype = 'int32'}).dtype, 'int32', 'randint with options')
end)

-- -- Inspection ----------------------------------------------------------------------

H.test('inspection', function()
  local t = em.tensor({{1, 2, 3}, {4, 5, 6}}, {dtype = 'float32'})
  H.eq(shape(t), {2, 3}, 't.shape')
  H.eq(t:size(1), 2, 'size(1)')
  H.eq(t:size(2), 3, 'size(2)')
  H.eq(t:size(-1), 3, 'size(-1)')
  local sz = t:size()
  local st = {}
  for i = 1, 2 do st[i] = tonumber(sz[i]) end
  H.eq(st, {2, 3}, 'size() lists the sizes')
  H.eq(t:dim(), 2, 'dim')
  H.eq(t:numel(), 6, 'numel')
  H.eq(t.dtype, 'float32', 'dtype')
  H.eq(t.device, 'cpu', 'device')
  H.eq(t:is_contiguous(), true, 'is_contiguous')
  H.eq(t:t():is_contiguous(), false, 'transposed is not contiguous')
  H.eq(em.tensor({7}):item(), 7, 'item of one element')
  H.eq(type(em.tensor({7}):item()), 'number', 'item is a Lua number')
  H.eq(em.tensor({3}, {dtype = 'int64'}):item(), 3, 'int64 item')
  H.eq(t:totable(), {{1, 2, 3}, {4, 5, 6}}, 'totable')
  H.eq(t:t():totable(), {{1, 4}, {2, 5}, {3, 6}}, 'totable of a strided view')
  H.eq(em.tensor({1, 0}, {dtype = 'bool'}):totable()[2] == false or
       em.tensor({1, 0}, {dtype = 'bool'}):totable()[2] == 0, true, 'bool totable')
  H.raises(function() t:item() end, 'item', '[2,3]')
  local s = tostring(t)
  H.check(s:find('[float32 tensor of size 2x3 on cpu]', 1, true), 'tostring footer: ' .. s)
  H.check(s:find('5', 1, true) and s:find('6', 1, true), 'tostring shows values: ' .. s)
  local i = tostring(em.zeros({4}, {dtype = 'int64'}))
  H.check(i:find('[int64 tensor of size 4 on cpu]', 1, true), 'int64 footer: ' .. i)
  local big = tostring(em.zeros(1000, 1000))
  H.check(#big < 20000, 'printing a big tensor is abbreviated (' .. #big .. ' chars)')
  H.check(big:find('1000x1000', 1, true), 'big tensor footer')
end)

-- -- Conversion --------------------------------------------------------------------------

H.test('conversion', function()
  local t = em.tensor({{1.5, -2.7}, {3.2, 0}})
  H.eq(t:to('float64').dtype, 'float64', "to('float64')")
  H.eq(t:to({dtype = 'int32'}).dtype, 'int32', 'to{dtype}')
  H.eq(flat(t:to('int32')), {1, -2, 3, 0}, 'to int truncates')
  H.eq(t:to('cpu').device, 'cpu', "to('cpu')")
  local names = {float = 'float32', double = 'float64', half = 'float16',
                 bfloat16 = 'bfloat16', int = 'int32', long = 'int64', byte = 'uint8',
                 bool = 'bool'}
  for m, dt in pairs(names) do H.eq(em.tensor({1, 2})[m](em.tensor({1, 2})).dtype, dt, m .. '()') end
  H.eq(flat(t:bool()), {1, 1, 1, 0}, 'bool() is non-zero')
  H.eq(flat(em.tensor({65504, 70000}):half()), {65504, math.huge}, 'half overflows to inf')
  H.eq(t:cpu().device, 'cpu', 'cpu()')
  local c = t:clone()
  c:fill_(9)
  H.eq(flat(t), flat(em.tensor({{1.5, -2.7}, {3.2, 0}})), 'clone does not alias')
  local tc = t:t():contiguous()
  H.eq(tc:is_contiguous(), true, 'contiguous()')
  H.close(flat(tc), {1.5, 3.2, -2.7, 0}, 1e-6, 'contiguous values')
  local d = em.zeros(2, 2)
  d:copy_(em.tensor({5, 6}, {dtype = 'int64'}))
  H.eq(flat(d), {5, 6, 5, 6}, 'copy_ broadcasts and converts')
  H.eq(d.dtype, 'float32', 'copy_ keeps the destination dtype')
  local has_cuda = em.cuda and em.cuda.is_available and em.cuda.is_available()
  if not has_cuda then H.raises(function() t:cuda() end, 'cuda') end
end)

-- -- Views -------------------------------------------------------------------------------

H.test('views alias their base', function()
  local t = em.arange(0, 12, 1, {dtype = 'float32'}):view(3, 4)
  t:narrow(2, 2, 2):fill_(-1)
  H.eq(flat(t), {0, -1, -1, 3, 4, -1, -1, 7, 8, -1, -1, 11}, 'narrow(2, 2, 2):fill_ writes t')
  local tt = t:t()
  H.eq(shape(tt), {4, 3}, 't()')
  tt:select(1, 1):fill_(100)            -- first column of t
  H.eq(flat(t:select(2, 1)), {100, 100, 100}, 'select writes through a transpose')
  H.eq(shape(t:transpose(1, 2)), {4, 3}, 'transpose(1, 2)')
  H.eq(shape(t:view(2, 6)), {2, 6}, 'view(2, 6)')
  H.eq(shape(t:view(-1)), {12}, 'view(-1)')
  H.eq(shape(t:view({6, -1})), {6, 2}, 'view{6, -1}')
  H.eq(shape(t:reshape(4, 3)), {4, 3}, 'reshape')
  H.eq(shape(t:flatten()), {12}, 'flatten')
  H.eq(shape(em.zeros(2, 3, 4):flatten(2)), {2, 12}, 'flatten(2)')
  H.eq(shape(em.zeros(2, 3, 4, 5):flatten(2, 3)), {2, 12, 5}, 'flatten(2, 3)')
  H.eq(shape(em.zeros(2, 3, 4):permute(3, 1, 2)), {4, 2, 3}, 'permute')
  H.eq(shape(em.zeros(1, 3, 1):squeeze()), {3}, 'squeeze()')
  H.eq(shape(em.zeros(1, 3, 1):squeeze(1)), {3, 1}, 'squeeze(1)')
  H.eq(shape(t:unsqueeze(1)), {1, 3, 4}, 'unsqueeze(1)')
  H.eq(shape(t:unsqueeze(-1)), {3, 4, 1}, 'unsqueeze(-1)')
  local row = em.tensor({1, 2, 3}):view(1, 3)
  local e = row:expand(4, 3)
  H.eq(shape(e), {4, 3}, 'expand')
  row:fill_(7)
  H.eq(flat(e), {7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7}, 'expand aliases')
  local v = t:view(12)
  v:fill_(0)
  H.eq(flat(t), {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}, 'view aliases')
  local r = t:t():reshape(12)        -- must copy: writing it leaves t alone
  r:fill_(5)
  H.eq(flat(t)[1], 0, 'reshape of a transpose copies')
  H.raises(function() t:t():view(12) end, 'view')
end)

H.test('t[i] and #t', function()
  local t = em.tensor({{1, 2, 3}, {4, 5, 6}})
  H.eq(#t, 2, '#t is size(1)')
  H.eq(#em.zeros(5), 5, '#t of a vector')
  H.eq(flat(t[2]), {4, 5, 6}, 't[2] is the second row')
  H.eq(shape(t[1]), {3}, 't[1] is 1-D')
  H.eq(t[2][3], 6, 't[i][j] of a 1-D row is a number')
  H.eq(type(t[1][1]), 'number', 'a 1-D tensor indexes to numbers')
  t[1][2] = 20
  H.eq(flat(t), {1, 20, 3, 4, 5, 6}, 't[1][2] = v')
  t[2] = 0
  H.eq(flat(t), {1, 20, 3, 0, 0, 0}, 't[2] = number fills the row')
  t[1] = em.tensor({7, 8, 9})
  H.eq(flat(t), {7, 8, 9, 0, 0, 0}, 't[1] = tensor copies')
  t[2]:fill_(1)
  H.eq(flat(t), {7, 8, 9, 1, 1, 1}, 't[i] is a view')
  H.raises(function() return t[3] end, '3')
  H.raises(function() return t[0] end, '0')
  -- methods and fields still work beside numeric indexing
  H.eq(t:numel(), 6, 'methods beside t[i]')
end)

H.test('t[i] on vectors of every dtype converts as the ops do', function()
  local vals = { 0.1, -2.5, 65504, 1e-7, 3.3e38, 0 / 0 }
  for _, dt in ipairs({ 'float32', 'float64', 'float16', 'bfloat16' }) do
    local t = em.tensor(vals, { dtype = 'float64' }):to(dt)
    local ref = t:double():totable()              -- C's conversions
    for i = 1, #vals do
      local v, r = t[i], ref[i]
      H.check(v == r or (v ~= v and r ~= r), ('%s t[%d] = %s, C reads %s'):format(dt, i,
        tostring(v), tostring(r)))
    end
    local n = #vals - 1                            -- NaN aside (it equals nothing)
    local u = em.zeros(n, { dtype = dt })
    for i = 1, n do u[i] = vals[i] end             -- the fast path's writes
    local f = em.zeros(n, { dtype = dt })
    for i = 1, n do f:narrow(1, i, 1):fill_(vals[i]) end
    H.eq(u:double():totable(), f:double():totable(), dt .. ': t[i] = v writes what fill_ writes')
    u[1] = 0 / 0
    H.check(u[1] ~= u[1], dt .. ': NaN written')
  end
  local b = em.zeros(3, { dtype = 'bool' })
  b[1], b[2] = 2, true
  H.eq(b:totable(), { true, true, false }, 'bool vector')
  local n = em.zeros(2, { dtype = 'int32' })
  n[2] = -7
  H.eq(n:totable(), { 0, -7 }, 'int32 vector')
end)

H.test('messages count dims, positions and indices from 1', function()
  local a, b = em.zeros(2, 3), em.zeros(2, 4)
  H.raises(function() return em.cat({ a, b }, 1) end,
    'except in dimension 1', 'at position 1', 'at position 2')
  H.raises(function() return em.stack({ a, b }) end, 'position 1', 'position 2')
  H.raises(function() return em.stack({ a, a, b }) end, 'at position 3')
  H.raises(function() return a:gather(1, em.zeros(1, 4):long() + 1) end, 'in dimension 2')
  H.raises(function() return em.zeros(2, 0):amax(2) end, 'dimension 2 of size 0')
end)

-- -- Operators and in-place ops --------------------------------------------------------------

H.test('operators with numbers on either side', function()
  local a = em.tensor({1, 2, 4})
  H.eq(flat(a + 1), {2, 3, 5}, 'a + 1')
  H.eq(flat(1 + a), {2, 3, 5}, '1 + a')
  H.eq(flat(a - 1), {0, 1, 3}, 'a - 1')
  H.eq(flat(10 - a), {9, 8, 6}, '10 - a')
  H.eq(flat(a * 3), {3, 6, 12}, 'a * 3')
  H.eq(flat(3 * a), {3, 6, 12}, '3 * a')
  H.eq(flat(a / 2), {0.5, 1, 2}, 'a / 2')
  H.eq(flat(8 / a), {8, 4, 2}, '8 / a')
  H.eq(flat(a ^ 2), {1, 4, 16}, 'a ^ 2')
  H.eq(flat(2 ^ a), {2, 4, 16}, '2 ^ a')
  H.eq(flat(-a), {-1, -2, -4}, '-a')
  H.eq(flat(a + a * a), {2, 6, 20}, 'a + a * a')
  local b = em.tensor({{10}, {20}})
  H.eq(flat(a + b), {11, 12, 14, 21, 22, 24}, 'broadcasting a + b')
  local i = em.tensor({1, 2}, {dtype = 'int32'})
  H.eq((i + 1).dtype, 'int32', 'int + int number stays int')
  H.eq((i * 1.5).dtype, 'float32', 'int * float number is float32')
  H.eq((i / 2).dtype, 'float32', 'int / number is true division')
  H.eq((em.tensor({1}, {dtype = 'float16'}) + 1.5).dtype, 'float16', 'a number keeps float16')
  H.eq((em.tensor({1}, {dtype = 'float64'}) + em.tensor({1})).dtype, 'float64', 'promotion')
  H.eq(flat(a:add(a, 2)), {3, 6, 12}, 'add with alpha')
  H.eq(flat(a:lt(2)), {1, 0, 0}, 'comparisons give bool')
  H.eq(a:lt(2).dtype, 'bool', 'comparison dtype')
  H.eq(flat(em.where(a:gt(1), a, em.tensor(0))), {0, 2, 4}, 'em.where')
end)

H.test('in-place ops', function()
  local a = em.tensor({1, 2, 3}, {dtype = 'float32'})
  local r = a:add_(1)
  H.check(rawequal(r, a), 'add_ returns self')
  H.eq(flat(a), {2, 3, 4}, 'add_(number)')
  a:add_(em.tensor({1, 1, 1}), 2)
  H.eq(flat(a), {4, 5, 6}, 'add_(t, alpha)')
  a:mul_(2)
  H.eq(flat(a), {8, 10, 12}, 'mul_')
  a:mul_(em.tensor({0.5, 1, 2}))
  H.eq(flat(a), {4, 10, 24}, 'mul_(t)')
  a:clamp_(5, 20)
  H.eq(flat(a), {5, 10, 20}, 'clamp_')
  a:fill_(3)
  H.eq(flat(a), {3, 3, 3}, 'fill_')
  a:zero_()
  H.eq(flat(a), {0, 0, 0}, 'zero_')
  H.check(rawequal(a:zero_():fill_(1), a), 'in-place ops chain')
  local u = em.zeros(1000):uniform_(2, 3)
  local f = flat(u)
  local lo, hi = math.huge, -math.huge
  for _, v in ipairs(f) do lo, hi = math.min(lo, v), math.max(hi, v) end
  H.check(lo >= 2 and hi < 3, ('uniform_(2, 3) in [%g, %g]'):format(lo, hi))
  local n = em.zeros(20000):normal_(3, 0.5)
  H.close(num(n:mean()), 3, 0.01, 'normal_ mean')
  H.close(num(n:std()), 0.5, 0.02, 'normal_ std')
  -- in-place on an int tensor keeps its dtype
  local i = em.tensor({1, 2}, {dtype = 'int64'})
  i:add_(1)
  H.eq({i.dtype, flat(i)}, {'int64', {2, 3}}, 'int64 add_')
end)

H.test('reductions from Lua', function()
  local t = em.tensor({{1, 5, 2}, {7, -1, 7}}, {dtype = 'float32'})
  H.eq(num(t:sum()), 21, 'sum()')
  H.eq(flat(t:sum(1)), {8, 4, 9}, 'sum(1)')
  H.eq(shape(t:sum(2, true)), {2, 1}, 'sum(2, true) keeps the dim')
  H.eq(flat(t:sum(-1)), {8, 13}, 'sum(-1)')
  local v, i = t:max(2)
  H.eq(flat(v), {5, 7}, 'max(2) values')
  H.eq(flat(i), {2, 1}, 'max(2) indices are 1-based, first of ties')
  H.eq(i.dtype, 'int64', 'indices are int64')
  local mv, mi = t:min(1)
  H.eq({flat(mv), flat(mi)}, {{1, -1, 2}, {1, 2, 1}}, 'min(1)')
  H.eq(num(t:max()), 7, 'max()')
  H.eq(num(t:argmax()), 4, 'argmax() over the flattened tensor, 1-based')
  H.eq(flat(t:argmin(2)), {1, 2}, 'argmin(2)')
  H.close(num(t:mean()), 3.5, 1e-6, 'mean')
  H.close(flat(t:softmax(2):sum(2)), {1, 1}, 1e-6, 'softmax rows sum to 1')
end)

-- -- Random numbers ------------------------------------------------------------------------------

H.test('manual_seed reproducibility', function()
  em.manual_seed(42)
  local a, b, c = flat(em.rand(8)), flat(em.randn(8)), flat(em.randint(0, 100, {8}))
  em.manual_seed(42)
  H.eq(flat(em.rand(8)), a, 'rand replays')
  H.eq(flat(em.randn(8)), b, 'randn replays')
  H.eq(flat(em.randint(0, 100, {8})), c, 'randint replays')
  em.manual_seed(43)
  H.check(not H.deep_eq(flat(em.rand(8)), a), 'another seed, other numbers')
  em.manual_seed(42)
  local t = em.zeros(8)
  t:uniform_(0, 1)
  H.eq(flat(t), a, 'uniform_ draws as rand does')
end)

H.test('random ranges and statistics', function()
  em.manual_seed(1)
  local r = flat(em.randint(-3, 4, {10000}))
  local lo, hi, counts, ints = math.huge, -math.huge, {}, true
  for _, v in ipairs(r) do
    lo, hi = math.min(lo, v), math.max(hi, v)
    counts[v] = (counts[v] or 0) + 1
    if v ~= math.floor(v) then ints = false end
  end
  H.eq({lo, hi}, {-3, 3}, 'randint(-3, 4) spans [-3, 3]')
  H.check(ints, 'randint gives integers')
  for v = -3, 3 do H.check((counts[v] or 0) > 1200, ('value %d drawn %d times'):format(v, counts[v] or 0)) end
  local u = em.rand(100000)
  H.close(num(u:mean()), 0.5, 0.01, 'rand mean')
  H.close(num(u:var()), 1 / 12, 0.005, 'rand variance')
  H.check(num(u:min()) >= 0 and num(u:max()) < 1, 'rand in [0, 1)')
  local n = em.randn(100000)
  H.close(num(n:mean()), 0, 0.02, 'randn mean')
  H.close(num(n:std()), 1, 0.02, 'randn std')
  local tails = num((n:abs():gt(3)):sum())
  H.check(tails > 150 and tails < 400, ('randn beyond 3 sigma: %d of 100000 (expect ~270)'):format(tails))
end)

-- -- Errors ----------------------------------------------------------------------------------

H.test('error messages name the op and the shapes', function()
  local a, b = em.zeros(2, 3), em.zeros(4, 5)
  H.raises(function() return em.matmul(a, b) end, 'matmul', '[2,3]', '[4,5]')
  H.raises(function() return a:mm(b) end, '[2,3]', '[4,5]')
  H.raises(function() return a + em.zeros(4) end, '[2,3]', '[4]')
  H.raises(function() return a:mul(em.zeros(3, 2)) end, 'mul', '[2,3]', '[3,2]')
  H.raises(function() return em.cat({a, b}, 1) end, 'cat')
  H.raises(function() return em.stack({a, b}) end, 'stack')
  H.raises(function() return a:view(5, 5) end, 'view', '[2,3]')
  H.raises(function() return a:sum(3) end, 'sum')
  H.raises(function() return a:transpose(1, 3) end, 'transpose')
  H.raises(function() return a:narrow(2, 3, 2) end, 'narrow')
  H.raises(function() return a:index_select(1, em.tensor({3}, {dtype = 'int64'})) end,
           'index_select')
  H.raises(function() return a:index_select(1, em.tensor({0}, {dtype = 'int64'})) end,
           'index_select')
  H.raises(function() return a:gather(2, em.tensor({{4}}, {dtype = 'int64'})) end, 'gather')
  H.raises(function() return em.one_hot(em.tensor({5}, {dtype = 'int64'}), 3) end, 'one_hot')
  H.raises(function() return em.bmm(a, a) end, 'bmm')
  H.raises(function() return a:dot(a) end, 'dot')
  H.raises(function() return em.tensor('abc') end, 'tensor')
  H.raises(function() return a:to('float33') end, 'float33')
  H.raises(function() return em.arange(0, 5, 0) end, 'arange')
  H.raises(function() return em.randint(5, 5, {2}) end, 'randint')
end)

H.test('a failed op leaves its input unchanged', function()
  local a = em.tensor({{1, 2, 3}, {4, 5, 6}})
  local before = flat(a)
  H.raises(function() a:add_(em.ones(2, 3, 4)) end, 'add_')
  H.eq(flat(a), before, 'after add_ that cannot broadcast')
  H.raises(function() a:copy_(em.ones(4)) end, 'copy_')
  H.eq(flat(a), before, 'after copy_ of a wrong shape')
  H.raises(function() a:mul_(em.ones(5)) end, 'mul_')
  H.eq(flat(a), before, 'after mul_')
  H.eq(shape(a), {2, 3}, 'shape unchanged')
  H.raises(function() a[3] = 1 end, '3')
  H.eq(flat(a), before, 'after an out-of-range assignment')
end)

-- -- Memory ---------------------------------------------------------------------------------

H.test('garbage tensors are collected', function()
  local a, b = em.ones(16), em.ones(16)
  local c
  for _ = 1, 200000 do c = a + b end
  H.eq(flat(c)[16], 2, 'a + b after a long loop')
  local big
  for _ = 1, 50 do big = em.zeros(1000, 1000) end   -- 4 MB each: must not pile up
  H.eq(big:numel(), 1000000, 'big allocations in a loop')
end)

H.done()

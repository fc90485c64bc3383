--[[
test_nn_layers_more.lua -- em.nn's containers (ModuleList, ModuleDict, the plain
tables assigned to a module's field), RMSNorm, GroupNorm, Conv1d, F.pad,
F.scaled_dot_product_attention and MultiheadAttention: values and gradients (input
and parameters) against PyTorch (tests/fixtures/nn_layers_more.lua from
gen_nn_layers_more.py, some inputs fed as transposed views), gradcheck in float64,
the fused CPU attention against the composed one (block edges, masks, causal,
bfloat16), meta shapes and the errors on bad shapes.
]]
local dir = (arg and arg[0] and arg[0]:match('^(.*/)')) or
            ((os.getenv('EMBER_TESTS') or 'tests') .. '/lua/')
local H = dofile(dir .. 'harness.lua')
local em = require 'ember'
local nn, F = em.nn, em.nn.F
local fx = dofile(dir .. '../fixtures/nn_layers_more.lua')

local D64 = { dtype = 'float64' }
local function flat(t) return t:double():reshape(-1):totable() end

-- A fixture tensor; strided = true gives the same values as a transposed view.
local function T(f, strided)
  if f.bool then
    local v = {}
    for i, b in ipairs(f.data) do v[i] = b and 1 or 0 end
    return em.tensor(v, D64):reshape(f.shape):ne(0)
  end
  local t = em.tensor(f.data, D64):reshape(f.shape)
  if strided and #f.shape >= 2 then
    local n = #f.shape
    t = t:transpose(n - 1, n):contiguous():transpose(n - 1, n)
    assert(not t:is_contiguous())
  end
  return t
end

local function by_name(name)
  for _, c in ipairs(fx) do if c.name == name then return c end end
  error('no fixture ' .. name)
end

local function close_to(got, want, tol, msg)
  local ok = H.check(#got:reshape(-1):totable() == #want.data, msg .. ': size')
  if ok then H.close(flat(got), want.data, tol, msg) end
end

-- Runs case c: fn(inputs...) with the module m (its state loaded) or none, checks the
-- output, the inputs' and the parameters' gradients.
local function run_case(c, m, fn, strided)
  if m then m:load_state_dict((function()
    local sd = {}
    for k, v in pairs(c.state) do sd[k] = T(v) end
    return sd
  end)()) end
  local xs = {}
  for i, f in ipairs(c.inputs) do xs[i] = T(f, strided):requires_grad_() end
  local y, w = fn(unpack(xs))
  close_to(y, c.output, 1e-9, c.name .. ' output')
  if c.weights then close_to(w, c.weights, 1e-9, c.name .. ' weights') end
  y:backward(T(c.grad_output))
  for i, x in ipairs(xs) do close_to(x.grad, c.grad_inputs[i], 1e-9, c.name .. ' grad input ' .. i) end
  if m then
    for k, p in ipairs(m:named_parameters()) do
      local name = p[1]
      H.check(c.grads[name] ~= nil, c.name .. ': PyTorch has a parameter ' .. name)
      if c.grads[name] then close_to(p[2].grad, c.grads[name], 1e-9, c.name .. ' grad ' .. name) end
    end
    local n = 0
    for _ in pairs(c.grads) do n = n + 1 end
    H.eq(#m:named_parameters(), n, c.name .. ': parameter count as PyTorch')
  end
end

-- -- Containers ---------------------------------------------------------------------------
H.test('ModuleList: indexing, #, ipairs, append/extend/insert, names', function()
  local l = nn.ModuleList({ nn.Linear(2, 3), nn.Linear(3, 4) })
  H.eq(#l, 2, '#l')
  H.eq(l[2].out_features, 4, 'l[2]')
  l:append(nn.Linear(4, 5))
  l:extend({ nn.ReLU(), nn.Linear(5, 6) })
  l:insert(1, nn.Linear(1, 2))
  H.eq(#l, 6, '# after append, extend, insert')
  H.eq(l[1].in_features, 1, 'insert(1, m) puts m first')
  H.eq(l[2].in_features, 2, 'the old first moved to 2')
  local seen = 0
  for i, m in ipairs(l) do seen = seen + 1; H.check(m == l:get(i), 'ipairs entry ' .. i) end
  H.eq(seen, 6, 'ipairs sees every entry')
  local names = {}
  for _, np in ipairs(l:named_parameters()) do names[#names + 1] = np[1] end
  H.eq(names[1], '1.weight', 'first name')
  H.eq(names[#names], '6.bias', 'last name')
  H.eq(#names, 10, 'two parameters per Linear')
  -- table.insert goes around __newindex: the next walk registers it anyway
  table.insert(l, nn.Linear(6, 1))
  H.eq(#l:parameters(), 12, 'an entry put in with table.insert is registered')
  l[8] = nn.Linear(1, 1)
  H.eq(#l:parameters(), 14, 'l[#l + 1] = m registers')
  H.raises(function() l:append(3) end, 'ModuleList', 'must be a module', 'number')
  H.raises(function() l:insert(20, nn.ReLU()) end, 'ModuleList:insert', 'index 20', 'has 8 entries')
  H.raises(function() l:get(0) end, 'ModuleList:get', 'index 0', '1 to 8')
end)

H.test('ModuleDict: keys in order, items, pairs, pop, registered names', function()
  local d = nn.ModuleDict({ enc = nn.Linear(2, 3), dec = nn.Linear(3, 2) })
  H.eq(d:keys(), { 'dec', 'enc' }, 'a Lua table\'s keys, sorted')
  d.head = nn.Linear(2, 1)
  d['tail'] = nn.ReLU()
  H.eq(d:keys(), { 'dec', 'enc', 'head', 'tail' }, 'then insertion order')
  H.eq(d.enc.in_features, 2, 'd.enc')
  H.eq(d:len(), 4, 'len')
  local ks = {}
  for k, m in d:pairs() do ks[#ks + 1] = k; H.check(nn.Module.is_module(m), 'pairs value ' .. k) end
  H.eq(ks, { 'dec', 'enc', 'head', 'tail' }, 'pairs in order')
  local sd = d:state_dict()
  H.check(sd['enc.weight'] ~= nil and sd['head.bias'] ~= nil, 'state_dict names enc.weight, head.bias')
  d:pop('tail')
  H.eq(d:keys(), { 'dec', 'enc', 'head' }, 'pop removes')
  H.raises(function() d.x = 5 end, 'ModuleDict', 'must be a module', 'number')
  H.raises(function() nn.ModuleDict({ train = nn.ReLU() }) end, 'ModuleDict', 'train', 'methods')
end)

H.test('a plain table of modules or parameters on a field is registered', function()
  local Net = nn.Module:extend('Net')
  function Net:init()
    self.blocks = { nn.Linear(4, 4), nn.Linear(4, 4) }
    self.heads = { a = nn.Linear(4, 1), b = nn.Linear(4, 2) }
    self.scales = { nn.Parameter(em.ones({ 4 })), nn.Parameter(em.ones({ 4 })) }
    self.nested = { { nn.Linear(4, 4) }, { nn.Linear(4, 4) } }
    self.config = { 3, 3 }   -- no module inside: stays a plain table
  end
  function Net:forward(x)
    for _, b in ipairs(self.blocks) do x = b(x) end
    return self.heads.a(x * self.scales[1])
  end
  local m = Net()
  local names = {}
  for _, np in ipairs(m:named_parameters()) do names[np[1]] = true end
  for _, n in ipairs({ 'blocks.1.weight', 'blocks.2.bias', 'heads.a.weight', 'heads.b.bias',
    'scales.1', 'scales.2', 'nested.1.1.weight', 'nested.2.1.bias' }) do
    H.check(names[n], 'registered as ' .. n)
  end
  H.eq(#m:parameters(), 4 + 4 + 2 + 4, 'every parameter counted')
  H.eq(getmetatable(m.config), nil, 'a table of numbers stays plain')
  H.eq(m.blocks.__name, 'ModuleList', 'a list becomes a ModuleList')
  H.eq(m.heads.__name, 'ModuleDict', 'a keyed table a ModuleDict')
  H.eq(m.scales.__name, 'ParameterList', 'a list of parameters a ParameterList')
  m:eval()
  H.eq(m.blocks[2].training, false, 'eval() reaches the list\'s modules')
  m:to('float64')
  H.eq(m.blocks[1].weight.dtype, 'float64', 'to() reaches the list\'s modules')
  H.eq(m.scales[1].dtype, 'float64', 'to() reaches the list\'s parameters (and l[i] follows)')
  local y = m(em.randn({ 2, 4 }, D64))
  y:sum():backward()
  H.check(m.blocks[1].weight.grad ~= nil and m.scales[1].grad ~= nil, 'gradients reach them')
  local m2 = Net():to('float64')
  m2:load_state_dict(m:state_dict())
  H.close(flat(m2.blocks[2].weight), flat(m.blocks[2].weight), 0, 'state_dict round trip')
  -- mixed tables: a clear error, never a silent drop
  local Bad = nn.Module:extend('Bad')
  function Bad:init() self.parts = { nn.Linear(2, 2), 'relu' } end
  H.raises(function() Bad() end, 'Bad', 'parts', 'string', 'ModuleList')
  local Bad2 = nn.Module:extend('Bad2')
  function Bad2:init() self.parts = { nn.Linear(2, 2), nn.Parameter(em.ones({ 2 })) } end
  H.raises(function() Bad2() end, 'Bad2', 'parts', 'mixes modules and parameters')
end)

H.test('a table filled after it was assigned, and the caller\'s reference, are registered', function()
  local Net = nn.Module:extend('Net2')
  function Net:init(n)
    self.blocks = {}
    for i = 1, n do self.blocks[i] = nn.Linear(3, 3) end
    local heads = { x = nn.Linear(3, 1) }
    self.heads = heads
    heads.y = nn.Linear(3, 2)       -- the table the caller kept is the ModuleDict itself
  end
  local m = Net(3)
  local names = {}
  for _, np in ipairs(m:named_parameters()) do names[np[1]] = true end
  H.check(names['blocks.3.weight'], 'blocks filled after assignment: blocks.3.weight')
  H.check(names['heads.y.bias'], 'an entry added through the kept reference: heads.y.bias')
  H.eq(#m:parameters(), 6 + 4, 'every parameter counted')
  H.eq(m.blocks.__name, 'ModuleList', 'the filled table became a ModuleList')
end)

H.test('Sequential:get out of range says the index and the count', function()
  local s = nn.Sequential(nn.ReLU())
  H.raises(function() s:get(3) end, 'Sequential:get', 'index 3', 'it has 1 child', '1 to 1')
  local s2 = nn.Sequential(nn.ReLU(), nn.ReLU())
  H.raises(function() s2:get(5) end, 'has 2 children')
end)

-- -- Against PyTorch --------------------------------------------------------------------
local ctor = {
  rms_norm = function(o) return nn.RMSNorm(o.shape, { eps = o.eps, dtype = 'float64' }) end,
  rms_norm_2d_default_eps = function(o) return nn.RMSNorm(o.shape, { dtype = 'float64' }) end,
  group_norm = function(o) return nn.GroupNorm(o.groups, o.channels, { dtype = 'float64' }) end,
  group_norm_3d_noaffine = function(o)
    return nn.GroupNorm(o.groups, o.channels, { eps = o.eps, affine = o.affine, dtype = 'float64' })
  end,
}
for _, name in ipairs({ 'conv1d', 'conv1d_strided', 'conv1d_same' }) do
  ctor[name] = function(o)
    return nn.Conv1d(o.cin, o.cout, o.k, { stride = o.stride, padding = o.padding,
      dilation = o.dilation, groups = o.groups, dtype = 'float64' })
  end
end

for _, strided in ipairs({ false, true }) do
  local how = strided and ' (transposed views)' or ''
  for name, make in pairs(ctor) do
    H.test(name .. ' matches PyTorch' .. how, function()
      local c = by_name(name)
      local m = make(c.opts)
      run_case(c, m, function(x) return m(x) end, strided)
    end)
  end
  for _, name in ipairs({ 'pad_constant', 'pad_constant_crop', 'pad_reflect', 'pad_replicate', 'pad_circular' }) do
    H.test(name .. ' matches PyTorch' .. how, function()
      local c = by_name(name)
      run_case(c, nil, function(x) return F.pad(x, c.opts.pads, { mode = c.opts.mode, value = c.opts.value }) end, strided)
    end)
  end
  for _, path in ipairs({ 'fused', 'composed' }) do
    for _, name in ipairs({ 'sdpa_plain', 'sdpa_causal_scale', 'sdpa_bool_mask', 'sdpa_float_mask_broadcast' }) do
      H.test(name .. ' (' .. path .. ') matches PyTorch' .. how, function()
        local c = by_name(name)
        local o = { causal = c.opts.causal, scale = c.opts.scale, mask = c.opts.mask and T(c.opts.mask) }
        run_case(c, nil, function(q, k, v) return (F._sdpa(q, k, v, o, false, path)) end, strided)
      end)
    end
  end
  H.test('MultiheadAttention matches PyTorch (output, averaged weights, grads)' .. how, function()
    local c = by_name('mha')
    local m = nn.MultiheadAttention(8, 2, { dtype = 'float64' })
    run_case(c, m, function(q, k, v) return m(q, k, v) end, strided)
    local c2 = by_name('mha_batch_first_attn_mask')
    local m2 = nn.MultiheadAttention(6, 3, { batch_first = true, bias = false, dtype = 'float64' })
    run_case(c2, m2, function(q) return m2(q, q, q, { attn_mask = T(c2.opts.attn_mask) }) end, strided)
  end)
  H.test('MultiheadAttention kdim, vdim, add_bias_kv, add_zero_attn match PyTorch' .. how, function()
    local c = by_name('mha_kdim_vdim_bias_kv_zero_attn')
    local m = nn.MultiheadAttention(8, 2, { kdim = 5, vdim = 3, add_bias_kv = true,
      add_zero_attn = true, dtype = 'float64' })
    run_case(c, m, function(q, k, v)
      return m(q, k, v, { key_padding_mask = T(c.opts.key_padding_mask), attn_mask = T(c.opts.attn_mask) })
    end, strided)
    local c2 = by_name('mha_bias_kv_batch_first')
    local m2 = nn.MultiheadAttention(6, 3, { batch_first = true, add_bias_kv = true, dtype = 'float64' })
    run_case(c2, m2, function(q, kv) return m2(q, kv, kv) end, strided)
  end)
end

H.test('default initialisations follow PyTorch', function()
  em.manual_seed(3)
  local mha = nn.MultiheadAttention(16, 4)
  local bound = math.sqrt(6 / (16 + 48))    -- xavier_uniform_ on (3E, E)
  H.check(mha.in_proj_weight:abs():max():item() <= bound, 'in_proj_weight within xavier bound')
  H.check(mha.in_proj_weight:abs():max():item() > 0.8 * bound, 'in_proj_weight spans the bound')
  H.eq(mha.in_proj_bias:abs():sum():item(), 0, 'in_proj_bias zeros')
  H.eq(mha.out_proj.bias:abs():sum():item(), 0, 'out_proj.bias zeros')
  H.check(mha.out_proj.weight:abs():max():item() <= 1 / math.sqrt(16), 'out_proj.weight kaiming(a=sqrt 5)')
  local names = {}
  for _, np in ipairs(mha:named_parameters()) do names[#names + 1] = np[1] end
  H.eq(names, { 'in_proj_weight', 'in_proj_bias', 'out_proj.weight', 'out_proj.bias' }, 'PyTorch names')
  local c = nn.Conv1d(4, 6, 3)
  H.eq(c.weight.shape, { 6, 4, 3 }, 'Conv1d weight shape')
  H.check(c.weight:abs():max():item() <= 1 / math.sqrt(12), 'Conv1d weight bound')
  H.eq(nn.RMSNorm(5).weight:sum():item(), 5, 'RMSNorm weight ones')
  local g = nn.GroupNorm(2, 4)
  H.eq({ g.weight:sum():item(), g.bias:sum():item() }, { 4, 0 }, 'GroupNorm ones, zeros')
end)

-- -- gradcheck in float64 -------------------------------------------------------------------
local function gc(name, fn, inputs)
  local ok, err = pcall(em.autograd.gradcheck, fn, inputs)
  H.check(ok, name .. ': ' .. tostring(err))
end

H.test('gradcheck in float64: fused attention (mask, causal, scale), norms, pad, conv1d', function()
  em.manual_seed(7)
  local function r(...) return em.randn({ ... }, D64):requires_grad_() end
  local q, k, v = r(2, 5, 3), r(2, 6, 3), r(2, 6, 4)
  gc('sdpa', function(a, b, c) return F._sdpa(a, b, c, {}, false, 'fused') end, { q, k, v })
  gc('sdpa causal scale', function(a, b, c)
    return F._sdpa(a, b, c, { causal = true, scale = 0.7 }, false, 'fused') end, { q, k, v })
  local bm = em.rand({ 5, 6 }, D64):gt(0.3)
  bm:narrow(2, 1, 1):fill_(1)   -- every query sees a key
  gc('sdpa bool mask', function(a, b, c)
    return F._sdpa(a, b, c, { mask = bm }, false, 'fused') end, { q, k, v })
  local fm = em.randn({ 2, 1, 6 }, D64)
  gc('sdpa float mask', function(a, b, c)
    return F._sdpa(a, b, c, { mask = fm }, false, 'fused') end, { q, k, v })
  -- broadcast batch: k and v shared across q's batch
  gc('sdpa broadcast k, v', function(a, b, c)
    return F._sdpa(a, b, c, {}, false, 'fused') end, { r(2, 3, 4, 3), r(1, 3, 5, 3), r(3, 5, 2) })
  local mha = nn.MultiheadAttention(4, 2, { dtype = 'float64' })
  gc('MultiheadAttention (composed, weights)', function(x, kv) return (mha(x, kv, kv)) end,
    { r(3, 2, 4), r(5, 2, 4) })
  gc('MultiheadAttention (fused, causal)', function(x) return (mha(x, x, x, { need_weights = false,
    causal = true })) end, { r(3, 2, 4) })
  gc('rms_norm', function(x, w) return F.rms_norm(x, { 4 }, w, 1e-5) end, { r(3, 4), r(4) })
  gc('group_norm', function(x, w, b) return F.group_norm(x, 2, w, b) end, { r(2, 4, 3), r(4), r(4) })
  gc('pad reflect', function(x) return F.pad(x, { 2, 1, 1, 1 }, { mode = 'reflect' }) end, { r(2, 3, 4) })
  gc('conv1d', function(x, w, b) return F.conv1d(x, w, b, 2, 1, 1, 1) end, { r(2, 3, 7), r(4, 3, 3), r(4) })
end)

-- -- Fused against composed -----------------------------------------------------------
-- max |a - b| over (1 + max |b|): relative for large values, absolute near zero
-- (with one key, q's and k's gradients are zero up to rounding)
local function diff(a, b)
  local d = (a:double() - b:double()):abs():max():item()
  return d / (1 + b:double():abs():max():item())
end

H.test('fused CPU attention equals the composed one (block edges, masks, causal)', function()
  em.manual_seed(11)
  local shapes = { { 1, 1, 1, 1 }, { 2, 70, 70, 16 }, { 3, 130, 65, 8 }, { 1, 64, 128, 32 },
    { 2, 129, 200, 4 }, { 1, 5, 300, 64 }, { 6, 70, 90, 8 } }   -- B >= 2 threads x 2: one pass
  for _, s in ipairs(shapes) do
    local B, L, S, E = unpack(s)
    for _, dt in ipairs({ 'float32', 'float64' }) do
      local q = em.randn({ B, L, E }, { dtype = dt })
      local k = em.randn({ B, S, E }, { dtype = dt })
      local v = em.randn({ B, S, E + 3 }, { dtype = dt })
      local mask = em.rand({ L, S }):gt(0.2)
      mask:narrow(2, 1, 1):fill_(1)
      for _, o in ipairs({ {}, { causal = true }, { mask = mask, scale = 0.5 },
        { mask = em.randn({ B, 1, S }, { dtype = dt }) } }) do
        local tag = ('%s B%d L%d S%d E%d %s'):format(dt, B, L, S, E, o.causal and 'causal' or (o.mask and 'mask' or ''))
        local ins, outs, grads = {}, {}, {}
        for p, path in ipairs({ 'fused', 'composed' }) do
          ins[p] = { q:clone():requires_grad_(), k:clone():requires_grad_(), v:clone():requires_grad_() }
          outs[p] = F._sdpa(ins[p][1], ins[p][2], ins[p][3], o, false, path)
          outs[p]:backward(em.ones_like(outs[p]) * 0.1 + outs[p]:detach())
          grads[p] = { ins[p][1].grad, ins[p][2].grad, ins[p][3].grad }
        end
        local tol = dt == 'float32' and 2e-5 or 1e-12
        H.check(diff(outs[1], outs[2]) < tol, tag .. ': output ' .. diff(outs[1], outs[2]))
        for i = 1, 3 do
          local e = diff(grads[1][i], grads[2][i])
          H.check(e < tol * 10, tag .. ': grad ' .. i .. ' ' .. e)
        end
      end
    end
  end
end)

H.test('fused attention in bfloat16 accumulates in float32', function()
  em.manual_seed(5)
  local q, k, v = em.randn({ 2, 100, 32 }), em.randn({ 2, 90, 32 }), em.randn({ 2, 90, 32 })
  local ref = F._sdpa(q, k, v, { causal = true }, false, 'composed')
  local qb, kb, vb = q:bfloat16():requires_grad_(), k:bfloat16():requires_grad_(), v:bfloat16():requires_grad_()
  local y = F.scaled_dot_product_attention(qb, kb, vb, { causal = true })
  H.eq(y.dtype, 'bfloat16', 'output dtype')
  H.check(H.maxrel(y:float(), ref) < 2e-2, 'bf16 output near fp32: ' .. H.maxrel(y:float(), ref))
  y:float():sum():backward()
  H.eq(qb.grad.dtype, 'bfloat16', 'grad dtype')
  local q32 = q:clone():requires_grad_()
  F._sdpa(q32, k, v, { causal = true }, false, 'composed'):sum():backward()
  H.check(H.maxrel(qb.grad:float(), q32.grad) < 5e-2, 'bf16 grad near fp32: ' .. H.maxrel(qb.grad:float(), q32.grad))
end)

H.test('fused attention keeps no L x S matrix, and fully masked rows give zeros', function()
  em.manual_seed(9)
  local L, E = 2048, 8
  local q = em.randn({ 1, L, E }):requires_grad_()
  local k = em.randn({ 1, L, E }):requires_grad_()
  local v = em.randn({ 1, L, E }):requires_grad_()
  collectgarbage(); collectgarbage()
  em.reset_peak_memory_stats('cpu')
  local base = em.memory_stats('cpu').allocated
  local y = F.scaled_dot_product_attention(q, k, v, { causal = true })
  y:backward(em.ones_like(y))
  local grew = em.memory_stats('cpu').peak - base
  H.check(grew < L * L * 4 / 8, ('peak grew %d bytes; one L x L float32 matrix is %d'):format(grew, L * L * 4))
  H.check(q.grad ~= nil and k.grad ~= nil and v.grad ~= nil, 'gradients reach q, k, v')
  -- a query row that may attend to no key: zeros forward, zero gradients, no NaN
  local mask = em.ones({ 4, 6 }):gt(0)
  mask:narrow(1, 2, 1):fill_(0)
  local q2, k2, v2 = em.randn({ 4, 3 }, D64):requires_grad_(), em.randn({ 6, 3 }, D64):requires_grad_(),
    em.randn({ 6, 2 }, D64):requires_grad_()
  local y2 = F.scaled_dot_product_attention(q2, k2, v2, { mask = mask })
  H.eq(flat(y2:narrow(1, 2, 1)), { 0, 0 }, 'the masked row is zero')
  y2:sum():backward()
  H.eq(flat(q2.grad:narrow(1, 2, 1)), { 0, 0, 0 }, 'its gradient is zero')
  H.check(q2.grad:ne(q2.grad):sum():item() == 0 and k2.grad:ne(k2.grad):sum():item() == 0, 'no NaN')
end)

-- -- Meta -------------------------------------------------------------------------------------
H.test('meta shapes', function()
  local M = { device = 'meta' }
  local y = F.scaled_dot_product_attention(em.empty({ 2, 4, 10, 8 }, M), em.empty({ 2, 4, 12, 8 }, M),
    em.empty({ 2, 4, 12, 6 }, M), { causal = true })
  H.eq(y.shape, { 2, 4, 10, 6 }, 'sdpa')
  local mha = nn.MultiheadAttention(8, 2):to('meta')
  local o, w = mha(em.empty({ 5, 3, 8 }, M), em.empty({ 7, 3, 8 }, M), em.empty({ 7, 3, 8 }, M))
  H.eq(o.shape, { 5, 3, 8 }, 'mha output')
  H.eq(w.shape, { 3, 5, 7 }, 'mha weights')
  H.eq(nn.RMSNorm(8):to('meta')(em.empty({ 3, 8 }, M)).shape, { 3, 8 }, 'rms norm')
  H.eq(nn.GroupNorm(2, 4):to('meta')(em.empty({ 3, 4, 5 }, M)).shape, { 3, 4, 5 }, 'group norm')
  H.eq(nn.Conv1d(4, 6, 3, { stride = 2, padding = 1 }):to('meta')(em.empty({ 2, 4, 9 }, M)).shape,
    { 2, 6, 5 }, 'conv1d')
  H.eq(F.pad(em.empty({ 2, 3, 4 }, M), { 1, 2, 3, 4 }).shape, { 2, 10, 7 }, 'pad constant')
  H.eq(F.pad(em.empty({ 2, 3, 4 }, M), { 1, 2 }, { mode = 'reflect' }).shape, { 2, 3, 7 }, 'pad reflect')
end)

-- -- Errors -----------------------------------------------------------------------------------
H.test('clear errors on bad shapes', function()
  H.raises(function() nn.MultiheadAttention(10, 3) end, 'MultiheadAttention', 'dim 10', 'heads 3', 'divisible')
  H.raises(function() nn.MultiheadAttention(8, 2, { kdim = 0 }) end, 'MultiheadAttention', 'kdim', 'positive', '0')
  local kv = nn.MultiheadAttention(8, 2, { kdim = 5, vdim = 3 })
  H.raises(function() kv(em.randn(4, 2, 8), em.randn(6, 2, 8), em.randn(6, 2, 3)) end,
    'MultiheadAttention', 'k must be', 'embedding 5', '[6,2,8]')
  H.raises(function() nn.GroupNorm(3, 8) end, 'GroupNorm', 'channels 8', 'groups 3')
  H.raises(function() F.group_norm(em.randn({ 2, 6, 3 }), 4) end, 'group_norm', '6 channels', 'groups 4')
  H.raises(function() nn.GroupNorm(2, 4)(em.randn({ 2, 6, 3 })) end, 'GroupNorm', '(N, 4, ...)', '[2,6,3]')
  H.raises(function() F.pad(em.randn({ 3, 4 }), { 1, 1, 1, 1, 1, 1 }) end, 'pad', '6 pads', 'only 2')
  H.raises(function() F.pad(em.randn({ 3, 4 }), { 1 }) end, 'pad', 'even length')
  H.raises(function() F.pad(em.randn({ 3, 4 }), { 4, 0 }, { mode = 'reflect' }) end,
    'pad', 'reflect', 'smaller than its size 4')
  H.raises(function() F.pad(em.randn({ 3, 4 }), { 1, 1 }, { mode = 'mirror' }) end, 'pad', "'reflect'")
  H.raises(function() F.scaled_dot_product_attention(em.randn({ 2, 3, 4 }), em.randn({ 2, 5, 3 }),
    em.randn({ 2, 5, 4 })) end, 'scaled_dot_product_attention', '[2,3,4]', '[2,5,3]', 'last dim')
  H.raises(function() F.scaled_dot_product_attention(em.randn({ 2, 3, 4 }), em.randn({ 2, 5, 4 }),
    em.randn({ 2, 6, 4 })) end, 'scaled_dot_product_attention', 'number of keys')
  H.raises(function() F.scaled_dot_product_attention(em.randn({ 2, 3, 4 }), em.randn({ 3, 5, 4 }),
    em.randn({ 3, 5, 4 })) end, 'scaled_dot_product_attention', 'do not broadcast')
  H.raises(function() F.scaled_dot_product_attention(em.randn({ 2, 3, 4 }), em.randn({ 2, 5, 4 }),
    em.randn({ 2, 5, 4 }), { mask = em.ones({ 4, 5 }):gt(0) }) end, 'scaled_dot_product_attention',
    'mask of shape [4,5]', 'does not broadcast')
  H.raises(function() F.scaled_dot_product_attention(em.randn({ 3, 4 }), em.randn({ 5, 4 }):double(),
    em.randn({ 5, 4 })) end, 'share a dtype')
  local mha = nn.MultiheadAttention(8, 2)
  H.raises(function() mha(em.randn({ 5, 3, 6 }), em.randn({ 5, 3, 6 }), em.randn({ 5, 3, 6 })) end,
    'MultiheadAttention', '(L, N, E)', 'embedding 8', '[5,3,6]')
  H.raises(function() nn.Conv1d(3, 4, 3, { groups = 2 }) end, 'Conv1d', 'divisible by groups 2')
  H.raises(function() F.conv1d(em.randn({ 2, 3, 4, 5 }), em.randn({ 4, 3, 3 })) end, 'conv1d', '(N, C, L)')
  H.raises(function() F.rms_norm(em.randn({ 3, 4 }), { 5 }) end, 'rms_norm', '[5]', '[3,4]')
end)

H.done()

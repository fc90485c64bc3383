--[[
test_rnn.lua -- nn.LSTM and nn.GRU against PyTorch (tests/fixtures/gen_losses_sched_rnn.py):
PyTorch's state_dicts load by their names; outputs, final states and the
gradients of the input, the initial states and every parameter agree in float64
on the CPU (contiguous and strided inputs) and on (emulated) CUDA; shapes on meta;
gradcheck; the initialisation; unbatched inputs; dropout between layers; errors.
]]
local dir = (arg and arg[0] and arg[0]:match('^(.*/)')) or
            ((os.getenv('EMBER_TESTS') or 'tests') .. '/lua/')
local H, em = dofile(dir .. 'cuda_emulated.lua')('1:64')
local nn = em.nn
local fixtures = dofile(dir .. '../fixtures/rnn.lua')

local function tensor(fx, dtype, device)
  local t = em.tensor(fx.data, { dtype = dtype or 'float64' }):reshape(fx.shape)
  return device and t:to(device) or t
end

local maxdiff = H.maxdiff

local function build(case, device)
  local o = { dtype = 'float64' }
  for k, v in pairs(case.opts) do o[k] = v end
  local m = nn[case.kind](case.input_size, case.hidden_size, o)
  local sd = {}
  for k, v in pairs(case.state) do sd[k] = tensor(v) end
  m:load_state_dict(sd)
  if device then m:to(device) end
  return m
end

-- Runs the case; returns the module, input, states and results (gradients filled).
local function run(case, device, strided)
  local m = build(case, device)
  local x
  if strided then
    -- The same values seen through a transposed view of a contiguous tensor.
    local s = case.input.shape
    x = tensor(case.input, 'float64', device):transpose(1, 2):contiguous():transpose(1, 2)
    H.check(not x:is_contiguous() and x.shape[1] == s[1], 'the strided input is a view')
  else
    x = tensor(case.input, 'float64', device)
  end
  x:requires_grad_()
  local h0, c0, state
  if case.h0 then
    h0 = tensor(case.h0, 'float64', device):requires_grad_()
    state = h0
    if case.c0 then
      c0 = tensor(case.c0, 'float64', device):requires_grad_()
      state = { h0, c0 }
    end
  end
  local y, hn = m(x, state)
  local cn
  if case.kind == 'LSTM' then hn, cn = hn[1], hn[2] end
  local total = (y * tensor(case.grad_output, 'float64', device)):sum() +
    (hn * tensor(case.grad_h_n, 'float64', device)):sum()
  if cn then total = total + (cn * tensor(case.grad_c_n, 'float64', device)):sum() end
  total:backward()
  return m, x, h0, c0, y, hn, cn
end

for _, case in ipairs(fixtures) do
  H.test(case.name .. ': PyTorch\'s state_dict names, values and gradients', function()
    local m = build(case)
    local want = {}
    for k in pairs(case.state) do want[#want + 1] = k end
    table.sort(want)
    local got = {}
    for k in pairs(m:state_dict()) do got[#got + 1] = k end
    table.sort(got)
    H.eq(got, want, 'state_dict names are PyTorch\'s')
    for _, cfg in ipairs({ { 'cpu', false }, { 'cpu', true }, { 'cuda', false } }) do
      local dev, strided = cfg[1], cfg[2]
      local what = dev .. (strided and ' strided' or '')
      local mm, x, h0, c0, y, hn, cn = run(case, dev, strided)
      local tol = 1e-11
      H.eq(y.shape, case.output.shape, what .. ' output shape')
      H.check(maxdiff(y, case.output) <= tol, what .. ' output off by ' .. maxdiff(y, case.output))
      H.check(maxdiff(hn, case.h_n) <= tol, what .. ' h_n off by ' .. maxdiff(hn, case.h_n))
      if cn then H.check(maxdiff(cn, case.c_n) <= tol, what .. ' c_n off by ' .. maxdiff(cn, case.c_n)) end
      H.check(maxdiff(x.grad, case.grad_input) <= tol, what .. ' input gradient off by ' ..
        maxdiff(x.grad, case.grad_input))
      if h0 then
        H.check(maxdiff(h0.grad, case.grad_h0) <= tol, what .. ' h0 gradient off')
      end
      if c0 then
        H.check(maxdiff(c0.grad, case.grad_c0) <= tol, what .. ' c0 gradient off')
      end
      local worst, at = 0, nil
      for k, p in pairs(mm:state_dict()) do
        local d = maxdiff(mm[k].grad, case.grads[k])
        if d > worst then worst, at = d, k end
        H.eq(p.device, dev == 'cuda' and 'cuda:0' or 'cpu', what .. ' ' .. k .. ' device')
      end
      H.check(worst <= tol, ('%s: parameter gradient off by %g (%s)'):format(what, worst, tostring(at)))
    end
    -- meta: shapes only
    local mm = build(case, 'meta')
    local x = em.empty(case.input.shape, { dtype = 'float64', device = 'meta' })
    local y, hn = mm(x)
    if case.kind == 'LSTM' then
      H.eq(hn[2].shape, case.c_n.shape, 'meta c_n shape')
      hn = hn[1]
    end
    H.eq(y.shape, case.output.shape, 'meta output shape')
    H.eq(hn.shape, case.h_n.shape, 'meta h_n shape')
    H.eq(y.device, 'meta', 'meta output device')
  end)
end

H.test('gradcheck in float64 (2 layers, bidirectional, initial states)', function()
  for _, kind in ipairs({ 'LSTM', 'GRU' }) do
    em.manual_seed(5)
    local m = nn[kind](2, 3, { num_layers = 2, bidirectional = true, dtype = 'float64' })
    local x = em.randn(3, 2, 2, { dtype = 'float64' }):requires_grad_()
    local h0 = em.randn(4, 2, 3, { dtype = 'float64' }):requires_grad_()
    local c0 = em.randn(4, 2, 3, { dtype = 'float64' }):requires_grad_()
    local w = m.weight_hh_l1_reverse
    local ok, err = pcall(em.autograd.gradcheck, function(xx, hh, cc, _)
      local y, s = m(xx, kind == 'LSTM' and { hh, cc } or hh)
      if kind == 'LSTM' then
        return em.cat({ y:reshape(-1), s[1]:reshape(-1), s[2]:reshape(-1) }, 1)
      end
      return em.cat({ y:reshape(-1), s:reshape(-1) }, 1)
    end, { x, h0, c0, w })
    H.check(ok and err ~= false, kind .. ' gradcheck: ' .. tostring(err))
  end
end)

H.test('initialisation is U(-1/sqrt(hidden), 1/sqrt(hidden)), names and shapes PyTorch\'s', function()
  em.manual_seed(1)
  local m = nn.LSTM(10, 16, { num_layers = 2, bidirectional = true })
  local k = 1 / math.sqrt(16)
  H.eq(m.weight_ih_l0.shape, { 64, 10 }, 'weight_ih_l0')
  H.eq(m.weight_hh_l0_reverse.shape, { 64, 16 }, 'weight_hh_l0_reverse')
  H.eq(m.weight_ih_l1.shape, { 64, 32 }, 'weight_ih_l1 takes both directions')
  H.eq(m.bias_hh_l1_reverse.shape, { 64 }, 'bias_hh_l1_reverse')
  H.eq(m.weight_ih_l0.dtype, 'float32', 'float32 by default')
  local n = 0
  for name, p in pairs(m:state_dict()) do
    n = n + 1
    local lo, hi = p:min():item(), p:max():item()
    H.check(lo >= -k and hi <= k and hi > 0.8 * k and lo < -0.8 * k,
      ('%s in [%g, %g], want spread over [-%g, %g]'):format(name, lo, hi, k, k))
  end
  H.eq(n, 16, 'parameter count')
  local g = nn.GRU(4, 5, { bias = false })
  H.eq(g.weight_ih_l0.shape, { 15, 4 }, 'GRU gates r, z, n')
  H.eq(g.bias_ih_l0, nil, 'no bias')
  H.check(tostring(g):find('GRU') ~= nil, 'printable')
end)

H.test('unbatched input, batch_first and dropout between layers', function()
  em.manual_seed(2)
  local m = nn.LSTM(3, 4, { num_layers = 2, dtype = 'float64' })
  local x = em.randn(5, 3, { dtype = 'float64' })
  local y, s = m(x)
  local yb, sb = m(x:unsqueeze(2))
  H.eq(y.shape, { 5, 4 }, 'unbatched output')
  H.eq(s[1].shape, { 2, 4 }, 'unbatched h_n')
  H.close(H.flat(y), H.flat(yb), 1e-15, 'same as a batch of one')
  H.close(H.flat(s[2]), H.flat(sb[2]), 1e-15, 'c_n same as a batch of one')
  local g = nn.GRU(3, 4, { dtype = 'float64', batch_first = true })
  local xb = em.randn(2, 5, 3, { dtype = 'float64' })
  local y1 = g(xb)
  local g2 = nn.GRU(3, 4, { dtype = 'float64' })
  g2:load_state_dict(g:state_dict())
  local y2 = g2(xb:transpose(1, 2))
  H.close(H.flat(y1:transpose(1, 2):contiguous()), H.flat(y2), 1e-15, 'batch_first is a transpose')
  local d = nn.GRU(3, 4, { num_layers = 2, dropout = 0.5, dtype = 'float64' })
  local nd = nn.GRU(3, 4, { num_layers = 2, dtype = 'float64' })
  nd:load_state_dict(d:state_dict())
  local xs = em.randn(4, 2, 3, { dtype = 'float64' })
  d:eval()
  H.close(H.flat(d(xs)), H.flat(nd(xs)), 1e-15, 'eval: no dropout')
  d:train()
  H.check(math.abs((d(xs) - nd(xs)):abs():sum():item()) > 1e-6, 'train: dropout between layers')
end)

H.test('errors name the layer and the shapes', function()
  local m = nn.LSTM(3, 4, { num_layers = 2 })
  H.raises(function() m(em.randn(5, 2, 7)) end, 'LSTM', 'input [5,2,7]', 'input_size 3')
  H.raises(function() m(em.randn(5, 2, 3), { em.zeros(1, 2, 4), em.zeros(2, 2, 4) }) end,
    'LSTM', 'h0 [1,2,4] must be [2,2,4]')
  H.raises(function() m(em.randn(5, 2, 3), em.zeros(2, 2, 4)) end, 'LSTM', 'pair {h0, c0}')
  H.raises(function() m(em.randn(5, 2, 3, { dtype = 'float64' })) end, 'LSTM', 'float64',
    'float32')
  local g = nn.GRU(3, 4)
  H.raises(function() g(em.randn(5, 2, 3), em.zeros(1, 3, 4)) end, 'GRU', 'h0 [1,3,4] must be [1,2,4]')
  H.raises(function() nn.GRU(3, 0) end, 'GRU', 'hidden_size')
  H.raises(function() nn.GRU(3, 4, { num_layers = 0 }) end, 'GRU', 'num_layers')
  H.raises(function() nn.LSTM(3, 4, { dropout = 2 }) end, 'LSTM', 'dropout')
end)

H.done()

--[[
test_cuda_optim.lua -- the optimizers and clip_grad_norm on `cuda` against the CPU, on
the emulated runtime (EMBER_CUDA_EMULATE=2:64; the test runs itself again with it
otherwise). A step updates all of a group's parameters of one device and dtype in ONE
kernel launch (kernels/k_optim.c); these tests check that:
  - SGD (plain, weight decay, momentum, dampening, nesterov), Adam and AdamW with their
    options give, after several steps, the CPU's parameters and state bit for bit
    (float32 and float64; sizes inside, at and across the kernels' 4096-element chunks;
    a parameter skipped for a step, so per-parameter step counts differ);
  - the number of multi-tensor calls per step is one per (group, device, dtype): the
    profiler's op records count them;
  - the state tensors live on the parameter's device;
  - clip_grad_norm's total and the clipped gradients equal the CPU's (p = 2, 1, inf bit
    for bit; p = 3 within float tolerance), with one norm launch and one scaling launch
    per device and dtype; results are the same run to run;
  - parameters on several devices, mixed dtypes, a small model trained end to end,
    and clear errors.
]]
local dir = (arg and arg[0] and arg[0]:match('^(.*/)')) or
            ((os.getenv('EMBER_TESTS') or 'tests') .. '/lua/')
local H, em = dofile(dir .. 'cuda_emulated.lua')('2:64')
local ffi = require 'ffi'
local core = require 'ember.ffi'
local C = core.C

-- -- Helpers -------------------------------------------------------------------------
-- Shapes: small, one chunk exactly (4096), just past a chunk, three chunks, empty.
local SHAPES = { { 7 }, { 3, 5 }, { 4096 }, { 4097 }, { 2, 4100 }, { 0, 3 } }

local function flat(t)
  if t:numel() == 0 then return {} end
  return t:cpu():reshape(-1):totable()
end

-- The largest |a - b| over two tensors' elements (a on any device), and where.
local function maxdiff(a, b)
  local x, y = flat(a), flat(b)
  local worst, at = 0, 0
  for i = 1, #y do
    local d = math.abs(x[i] - y[i])
    if d ~= d then d = math.huge end
    if d > worst then worst, at = d, i end
  end
  return worst, at, x[at], y[at]
end

-- Exactly equal (tol 0) or within tol * (1 + |cpu|).
local function same(got, want, what, tol)
  local worst, at, g, w = maxdiff(got, want)
  tol = tol or 0
  H.check(worst <= tol * (1 + math.abs(w or 0)), ('%s: element %d is %.17g, cpu %.17g (diff %.3g)')
    :format(what, at, g or 0, w or 0, worst), 2)
end

-- Parameters: the same values on the cpu and on `device`, of spec {shape, dtype}.
local function params(specs, device, seed)
  em.manual_seed(seed)
  local cpu, dev = {}, {}
  for i, s in ipairs(specs) do
    local t = em.randn(s[1], { dtype = 'float64' }):to(s[2])
    cpu[i] = t
    dev[i] = t:to(s.device or device)
  end
  return cpu, dev
end

-- Gradients of step k (the same on both sides); parameter `skip` gets none.
local function set_grads(cpu, dev, k, skip)
  em.manual_seed(1000 + k)
  for i = 1, #cpu do
    if i == skip then
      cpu[i].grad, dev[i].grad = nil, nil
    else
      local g = em.randn(cpu[i].shape, { dtype = 'float64' }):to(cpu[i].dtype)
      cpu[i].grad = g
      dev[i].grad = g:to(dev[i].device)
    end
  end
end

-- The profiler's op records of fn: {name = calls}.
local function op_calls(fn)
  em.profile.start {}
  fn()
  em.cuda.synchronize()
  local r = em.profile.stop()
  local calls = {}
  for _, o in ipairs(r.top_ops) do calls[o.name] = o.calls end
  return calls
end

-- float32 and float64 parameters mixed in one list (two launches per step).
local function mixed_specs()
  local specs = {}
  for _, dt in ipairs({ 'float32', 'float64' }) do
    for _, sh in ipairs(SHAPES) do specs[#specs + 1] = { sh, dt } end
  end
  return specs
end

-- Runs `steps` steps of make(params) on the cpu and on cuda and compares the
-- parameters and every state tensor exactly. Step 2 skips parameter 3's gradient.
-- Returns the cuda optimizer and the op records of the last step.
local function against_cpu(name, make, steps, specs, multi_op)
  specs = specs or mixed_specs()
  local pc, pd = params(specs, 'cuda', 7)
  local oc, od = make(pc), make(pd)
  local calls
  for k = 1, steps do
    set_grads(pc, pd, k, k == 2 and 3 or nil)
    oc:step()
    if k < steps then od:step() else calls = op_calls(function() od:step() end) end
  end
  for i = 1, #pc do
    same(pd[i], pc[i], ('%s: parameter %d %s %s after %d steps'):format(name, i,
      H.show(specs[i][1]), specs[i][2], steps))
    local sc, sd = oc.state[i], od.state[i]
    H.check((sc == nil) == (sd == nil), name .. ': state presence differs', 1)
    for key, v in pairs(sc or {}) do
      if type(v) == 'number' then
        H.eq(sd[key], v, ('%s: state %d.%s'):format(name, i, key))
      else
        H.eq(sd[key].device, pd[i].device, ('%s: state %d.%s on the parameter\'s device')
          :format(name, i, key))
        same(sd[key], v, ('%s: state %d.%s'):format(name, i, key))
      end
    end
  end
  return od, calls
end

-- -- SGD, Adam, AdamW against the CPU ------------------------------------------------
local SGD_CASES = {
  { 'plain', { lr = 0.1 } },
  { 'weight decay', { lr = 0.1, weight_decay = 0.01 } },
  { 'momentum', { lr = 0.05, momentum = 0.9 } },
  { 'momentum, dampening', { lr = 0.05, momentum = 0.9, dampening = 0.3 } },
  { 'nesterov, weight decay', { lr = 0.05, momentum = 0.8, nesterov = true, weight_decay = 1e-3 } },
}
for _, c in ipairs(SGD_CASES) do
  H.test('SGD ' .. c[1] .. ' on cuda = cpu, one launch per dtype', function()
    local _, calls = against_cpu('SGD ' .. c[1], function(p) return em.optim.SGD(p, c[2]) end, 3)
    H.eq(calls.sgd_step_multi, 2, 'sgd_step_multi calls in one step (float32, float64)')
    H.eq(calls.sgd_step, nil, 'no per-parameter sgd_step on cuda')
  end)
end

local ADAM_CASES = {
  { 'Adam', 'Adam', { lr = 1e-2 } },
  { 'Adam', 'Adam, L2 weight decay, betas, eps',
    { lr = 1e-2, weight_decay = 0.1, betas = { 0.8, 0.99 }, eps = 1e-6 } },
  { 'AdamW', 'AdamW', { lr = 1e-2 } },
  { 'AdamW', 'AdamW, weight decay, betas', { lr = 2e-2, weight_decay = 0.05, betas = { 0.85, 0.9 } } },
}
for _, c in ipairs(ADAM_CASES) do
  H.test(c[2] .. ' on cuda = cpu, one launch per dtype', function()
    local od, calls = against_cpu(c[2], function(p) return em.optim[c[1]](p, c[3]) end, 3)
    local op = c[1] == 'AdamW' and 'adamw_step_multi' or 'adam_step_multi'
    H.eq(calls[op], 2, op .. ' calls in one step (float32, float64)')
    H.eq(od.state[3].step, 2, 'the parameter skipped once has taken 2 steps')
    H.eq(od.state[1].step, 3, 'the others 3')
  end)
end

-- -- Launch counts: groups, devices ---------------------------------------------------
H.test('one launch per (group, device, dtype)', function()
  if not H.two_devices() then return end
  -- two groups, each with float32 and float64 parameters on cuda:0 and cuda:1
  local specs = {}
  for _, dev in ipairs({ 'cuda:0', 'cuda:1' }) do
    for _, dt in ipairs({ 'float32', 'float64' }) do
      specs[#specs + 1] = { { 4097 }, dt, device = dev }
      specs[#specs + 1] = { { 3, 5 }, dt, device = dev }
    end
  end
  local pc, pd = params(specs, nil, 3)
  local function groups(p)
    local a, b = {}, {}
    for i = 1, #p do if i % 2 == 1 then a[#a + 1] = p[i] else b[#b + 1] = p[i] end end
    return { { params = a }, { params = b, lr = 0.02 } }
  end
  local oc = em.optim.SGD(groups(pc), { lr = 0.1, momentum = 0.9 })
  local od = em.optim.SGD(groups(pd), { lr = 0.1, momentum = 0.9 })
  local calls
  for k = 1, 2 do
    set_grads(pc, pd, k)
    oc:step()
    calls = op_calls(function() od:step() end)
  end
  H.eq(calls.sgd_step_multi, 8, '2 groups x 2 devices x 2 dtypes')
  local index = 0         -- state indices count across the groups, in order
  for _, g in ipairs(od.param_groups) do
    for _, p in ipairs(g.params) do
      index = index + 1
      H.eq(od.state[index].momentum_buffer.device, p.device, 'momentum buffer ' .. index .. ' device')
    end
  end
  for i = 1, #pc do same(pd[i], pc[i], 'parameter ' .. i .. ' on ' .. specs[i].device) end
end)

H.test('cpu and cuda parameters in one optimizer', function()
  if not H.two_devices() then return end
  local specs = { { { 5 }, 'float32', device = 'cpu' }, { { 4097 }, 'float32', device = 'cuda:1' },
                  { { 6 }, 'float64', device = 'cpu' }, { { 9 }, 'float32', device = 'cuda:0' } }
  local pc, pd = params(specs, nil, 5)
  local oc, od = em.optim.AdamW(pc, { lr = 0.01 }), em.optim.AdamW(pd, { lr = 0.01 })
  local calls
  for k = 1, 2 do
    set_grads(pc, pd, k)
    oc:step()
    calls = op_calls(function() od:step() end)
  end
  H.eq(calls.adamw_step_multi, 4, 'cpu float32, cuda:1, cpu float64, cuda:0')
  for i = 1, #pc do
    same(pd[i], pc[i], 'parameter ' .. i)
    H.eq(od.state[i].exp_avg.device, pd[i].device, 'exp_avg ' .. i .. ' device')
    H.eq(od.state[i].exp_avg_sq.device, pd[i].device, 'exp_avg_sq ' .. i .. ' device')
  end
end)

-- A model trained end to end: its gradients come from backward on each backend (whose
-- sums may round differently), so here the parameters agree to float32 tolerance only.
H.test('a small model trained on cuda follows the cpu', function()
  local nn = em.nn
  local function make()
    em.manual_seed(3)
    return nn.Sequential(nn.Linear(20, 300), nn.ReLU(), nn.Linear(300, 5))
  end
  local mc, md = make(), make()
  md:to('cuda')
  local opts = { lr = 1e-2, weight_decay = 0.1 }
  local oc, od = em.optim.AdamW(mc:parameters(), opts), em.optim.AdamW(md:parameters(), opts)
  local calls
  for k = 1, 4 do
    em.manual_seed(100 + k)
    local x = em.randn(8, 20)
    for side, s in ipairs({ { mc, oc, x }, { md, od, x:cuda() } }) do
      s[2]:zero_grad()
      s[1](s[3]):pow(2):mean():backward()
      if side == 2 then
        calls = op_calls(function() s[2]:step() end)
        em.nn.utils.clip_grad_norm(md:parameters(), 1.0)
      else
        s[2]:step()
        em.nn.utils.clip_grad_norm(mc:parameters(), 1.0)
      end
    end
  end
  H.eq(calls.adamw_step_multi, 1, 'one launch for the model\'s 4 parameters')
  local pc, pd = mc:parameters(), md:parameters()
  for i = 1, #pc do
    H.eq(pd[i].device, 'cuda:0', 'parameter ' .. i .. ' stays on cuda')
    H.eq(od.state[i].exp_avg.device, 'cuda:0', 'exp_avg ' .. i .. ' on cuda')
    same(pd[i], pc[i], 'model parameter ' .. i, 1e-5)
  end
end)

-- -- clip_grad_norm --------------------------------------------------------------------
local function grads_pair(seed, scale)
  local specs = mixed_specs()
  local pc, pd = params(specs, 'cuda', seed)
  set_grads(pc, pd, seed)
  if scale then
    for i = 1, #pc do
      if pc[i].grad then pc[i].grad:mul_(scale); pd[i].grad:mul_(scale) end
    end
  end
  return pc, pd
end

for _, c in ipairs({ { 2, 0 }, { 1, 0 }, { math.huge, 0 }, { 3, 1e-12 } }) do
  local p, tol = c[1], c[2]
  H.test(('clip_grad_norm p = %s on cuda = cpu'):format(tostring(p)), function()
    local pc, pd = grads_pair(11)
    local tc = em.optim.clip_grad_norm(pc, 0.5, p)
    local td
    local calls = op_calls(function() td = em.optim.clip_grad_norm(pd, 0.5, p) end)
    H.check(math.abs(td - tc) <= tol * tc, ('total %.17g, cpu %.17g'):format(td, tc))
    H.check(tc > 0.5, 'the gradients were clipped')
    H.eq(calls.clip_grad_norm, 2, 'one norm launch per dtype')
    H.eq(calls.clip_grad_scale, 2, 'one scaling launch per dtype')
    for i = 1, #pc do
      same(pd[i].grad, pc[i].grad, 'clipped grad ' .. i, tol > 0 and 1e-6 or 0)
      H.eq(pd[i].grad.device, pd[i].device, 'grad ' .. i .. ' stays on its device')
    end
    -- the total by the tensor ops, as a check of the C path's meaning
    local acc = 0
    local _, pr = grads_pair(11)
    for i = 1, #pr do
      local n = pr[i].grad:cpu():to('float64'):norm(p):item()
      if p == math.huge then acc = math.max(acc, n) else acc = acc + n ^ p end
    end
    if p ~= math.huge then acc = acc ^ (1 / p) end
    H.close(td, acc, 1e-12, 'the total is the norm of all the gradients')
  end)
end

H.test('clip_grad_norm: no clipping below max_norm, deterministic, devices', function()
  local pc, pd = grads_pair(12)
  local t0
  local calls = op_calls(function() t0 = em.optim.clip_grad_norm(pd, 1e9) end)
  H.eq(calls.clip_grad_scale, nil, 'nothing scaled below max_norm')
  for i = 1, #pc do same(pd[i].grad, pc[i].grad, 'unclipped grad ' .. i) end
  H.eq(em.optim.clip_grad_norm(pd, 1e9), t0, 'the same total run to run')
  -- gradients on both devices: one norm launch per device
  if not H.two_devices() then return end
  local a = em.randn({ 5000 }):cuda(0)
  local b = em.randn({ 300 }):cuda(1)
  local ac, bc = em.randn({ 5000 }), em.randn({ 300 })
  a.grad, b.grad = em.randn({ 5000 }):cuda(0), em.randn({ 300 }):cuda(1)
  ac.grad, bc.grad = a.grad:cpu(), b.grad:cpu()
  local tc = em.optim.clip_grad_norm({ ac, bc }, 1.0)
  local td
  calls = op_calls(function() td = em.optim.clip_grad_norm({ a, b }, 1.0) end)
  H.eq(td, tc, 'total over two devices = cpu')
  H.eq(calls.clip_grad_norm, 2, 'one norm launch per device')
  same(a.grad, ac.grad, 'cuda:0 grad clipped')
  same(b.grad, bc.grad, 'cuda:1 grad clipped')
end)

-- -- Errors ----------------------------------------------------------------------------
H.test('errors', function()
  if not H.two_devices() then return end
  local S = core.S
  local a, b = em.randn({ 4 }):cuda(0), em.randn({ 4 }):cuda(1)
  local P, G = ffi.new('em_tensor*[2]', a._h, b._h), ffi.new('const em_tensor*[2]', a._h, b._h)
  local F = ffi.new('int[2]')
  H.eq(C.em_sgd_step_multi_(S, 2, P, G, nil, F, 0.1, 0, 0, 0, 0) ~= 0, true, 'two devices refused')
  H.check(core.errmsg():find('sgd_step_: parameter 2 is on cuda:1 but parameter 1 is on cuda:0',
    1, true), core.errmsg())
  local c = em.randn({ 4 }, { dtype = 'float64' }):cuda(0)
  P[1], G[1] = c._h, c._h
  H.eq(C.em_sgd_step_multi_(S, 2, P, G, nil, F, 0.1, 0, 0, 0, 0) ~= 0, true, 'two dtypes refused')
  H.check(core.errmsg():find('parameter 2 is float64 but parameter 1 is float32', 1, true),
    core.errmsg())
  local i = em.zeros({ 4 }, { dtype = 'int32' }):cuda()
  i.grad = em.zeros({ 4 }, { dtype = 'int32' }):cuda()
  H.raises(function() em.optim.Adam({ i }):step() end,
    'adam_step_: parameters must be float32 or float64, got int32')
  local p = em.randn({ 3, 2 }):cuda()
  local m1 = em.zeros({ 3, 2 }):cuda(1)
  P[0], G[0] = p._h, p._h
  local B = ffi.new('em_tensor*[1]', m1._h)
  H.eq(C.em_sgd_step_multi_(S, 1, P, G, B, F, 0.1, 0.9, 0, 0, 0) ~= 0, true,
    'a momentum buffer on another device refused')
  H.check(core.errmsg():find('sgd_step_: momentum_buf is on cuda:1 but the parameter is on cuda:0',
    1, true), core.errmsg())
  local out = ffi.new('double[1]')
  local hs = ffi.new('em_tensor*[1]', p._h)
  H.eq(C.em_clip_grad_norm_(S, 1, hs, 1, -1, out) ~= 0, true, 'norm_type -1 refused in C')
  H.check(core.errmsg():find('norm_type must be > 0', 1, true), core.errmsg())
  local ig = em.zeros({ 4 }, { dtype = 'int32' }):cuda()
  hs[0] = ig._h
  H.eq(C.em_clip_grad_norm_(S, 1, hs, 1, 2, out) ~= 0, true, 'int32 gradient refused')
  H.check(core.errmsg():find('clip_grad_norm: gradient 1 is int32', 1, true), core.errmsg())
end)

H.done()

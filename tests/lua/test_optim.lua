--[[
test_optim.lua -- em.optim: the optimizers (SGD, Adam, AdamW) and schedules
(StepLR, CosineAnnealingLR, OneCycleLR) replay the PyTorch 1.13 trajectories
recorded by tests/fixtures/gen_optim.py (fixed gradients per step, parameters
without a gradient skipped); state_dict round trips (a fresh optimizer loaded
from the state continues identically), zero_grad, opt.lr, parameter groups,
clip_grad_norm against PyTorch's values, and error messages.
]]
local dir = (arg and arg[0] and arg[0]:match('^(.*/)')) or
            ((os.getenv('EMBER_TESTS') or 'tests') .. '/lua/')
local H = dofile(dir .. 'harness.lua')
local em = require 'ember'
local core = require 'ember.ffi'
local _ = em.float32    -- loads the core (and t.grad) before the checks below
local flat = H.flat
local fixtures = dofile(dir .. '../fixtures/optim.lua')

-- Gradients go through the public field t.grad (ember.autograd).
local function set_grad(p, g) p.grad = g end
local function get_grad(p) return p.grad end

local function make(case, values)
  local ps = {}
  for i, v in ipairs(values) do
    ps[i] = em.tensor(v, {dtype = case.dtype}):reshape(case.shapes[i])
  end
  return ps
end

local function copy_opts(o)
  local t = {}
  for k, v in pairs(o) do
    if type(v) == 'table' then t[k] = {v[1], v[2]} else t[k] = v end
  end
  return t
end

local function new_opt(case, ps)
  local list = ps
  if case.groups then
    list = {{params = {ps[1]}}, {params = {ps[2], ps[3]}, lr = case.opts.lr * 0.5}}
  end
  return em.optim[case.kind](list, copy_opts(case.opts))
end

local function attach(case, ps, step)
  local gs = case.grads[step]
  for i, p in ipairs(ps) do
    if gs[i] then
      set_grad(p, em.tensor(gs[i], {dtype = case.dtype}):reshape(case.shapes[i]))
    else
      set_grad(p, nil)
    end
  end
end

local function tol(case) return case.dtype == 'float64' and 1e-12 or 2e-6 end

-- -- Trajectories ---------------------------------------------------------------------
for _, case in ipairs(fixtures) do
  H.test('trajectory: ' .. case.name, function()
    local ps = make(case, case.init)
    local opt = new_opt(case, ps)
    local sched = case.sched and em.optim[case.sched](opt, case.sched_opts)
    for step = 1, #case.grads do
      attach(case, ps, step)
      opt:step()
      if sched then
        sched:step()
        H.close(sched:get_last_lr()[1], case.lrs[step][1], 1e-12, 'lr after step ' .. step)
        H.close(opt.lr, case.lrs[step][1], 1e-12, 'opt.lr after step ' .. step)
        local g1 = opt.param_groups[1]
        local m = g1.betas and g1.betas[1] or g1.momentum
        H.close(m, case.moms[step], 1e-12, 'momentum after step ' .. step)
      end
      for i, p in ipairs(ps) do
        H.close(flat(p), case.expected[step][i], tol(case),
                ('param %d after step %d'):format(i, step))
      end
    end
    H.eq(opt.state[3], nil, 'a parameter that never had a gradient has no state')
  end)
end

-- -- state_dict round trip ------------------------------------------------------------
for _, name in ipairs({'sgd nesterov', 'adam weight decay', 'adamw weight decay',
                       'onecycle sgd', 'cosine', 'sgd groups'}) do
  local case
  for _, c in ipairs(fixtures) do if c.name == name then case = c end end
  H.test('state_dict round trip: ' .. name, function()
    local ps = make(case, case.init)
    local opt = new_opt(case, ps)
    local sched = case.sched and em.optim[case.sched](opt, case.sched_opts)
    local half = 3
    for step = 1, half do
      attach(case, ps, step)
      opt:step()
      if sched then sched:step() end
    end
    local sd = opt:state_dict()
    local ssd = sched and sched:state_dict()
    for k, v in pairs(sd.state) do
      H.check(type(k) == 'number', 'state keys are parameter numbers')
      for _, x in pairs(v) do
        H.check(em.is_tensor(x) or type(x) == 'number', 'state values: tensors or numbers')
      end
    end
    -- A fresh optimizer on fresh copies of the parameters, loaded from the state,
    -- with different hyper-parameters that the state overrides.
    local ps2 = {}
    for i, p in ipairs(ps) do ps2[i] = p:clone() end
    local opts = copy_opts(case.opts)
    opts.lr = 123
    local opt2 = em.optim[case.kind](case.groups and
      {{params = {ps2[1]}}, {params = {ps2[2], ps2[3]}}} or ps2, opts)
    opt2:load_state_dict(sd)
    H.eq(opt2.lr, opt.lr, 'lr restored')
    local sched2
    if sched then
      sched2 = em.optim[case.sched](opt2, case.sched_opts)
      sched2:load_state_dict(ssd)
      -- constructing the scheduler reset the lr; the optimizer state has it
      opt2:load_state_dict(sd)
    end
    -- the loaded state is a copy: stepping the original leaves it alone
    for step = half + 1, #case.grads do
      attach(case, ps, step)
      attach(case, ps2, step)
      opt:step()
      opt2:step()
      if sched then
        sched:step()
        sched2:step()
        H.close(sched2:get_last_lr()[1], sched:get_last_lr()[1], 1e-15, 'lr ' .. step)
      end
      for i = 1, #ps do
        H.eq(flat(ps2[i]), flat(ps[i]), ('param %d at step %d'):format(i, step))
        H.close(flat(ps2[i]), case.expected[step][i], tol(case), 'vs PyTorch')
      end
    end
  end)
end

-- -- zero_grad, lr, groups ------------------------------------------------------------
H.test('zero_grad', function()
  local p, q = em.ones(3), em.ones(2)
  local opt = em.optim.SGD({p, q}, {lr = 0.1})
  set_grad(p, em.full({3}, 2, {dtype = 'float32'}))
  opt:zero_grad(false)
  H.eq(flat(get_grad(p)), {0, 0, 0}, 'zero_grad(false) zeroes in place')
  H.eq(get_grad(q), nil, 'no gradient stays none')
  opt:zero_grad()
  H.eq(get_grad(p), nil, 'zero_grad() sets the gradient to nil')
  opt:step()
  H.eq(flat(p), {1, 1, 1}, 'step without gradients changes nothing')
end)

H.test('opt.lr and param groups', function()
  local a, b = em.ones(2), em.ones(2)
  local opt = em.optim.SGD({{params = {a}}, {params = {b}, lr = 1}}, {lr = 0.5})
  H.eq(opt.lr, 0.5, 'opt.lr reads the first group')
  H.eq(opt.param_groups[2].lr, 1, 'group lr')
  opt.lr = 0.25
  H.eq({opt.param_groups[1].lr, opt.param_groups[2].lr}, {0.25, 0.25}, 'opt.lr sets all')
  opt.param_groups[2].lr = 2
  set_grad(a, em.ones(2)); set_grad(b, em.ones(2))
  opt:step()
  H.eq(flat(a), {0.75, 0.75}, 'group 1 lr')
  H.eq(flat(b), {-1, -1}, 'group 2 lr')
  H.eq(opt:step(function() return 42 end), 42, 'step(closure) returns the loss')
  local single = em.optim.Adam(em.ones(2))
  H.eq(single.lr, 1e-3, 'a single tensor and Adam defaults')
end)

H.test('non-contiguous gradient', function()
  local p = em.zeros(2, 3)
  local opt = em.optim.SGD({p}, {lr = 1})
  set_grad(p, em.tensor({{1, 2}, {3, 4}, {5, 6}}, {dtype = 'float32'}):t())
  opt:step()
  H.eq(flat(p), {-1, -3, -5, -2, -4, -6}, 'transposed grad')
end)

H.test('large parameters (threaded kernels)', function()
  local n = 200003
  local p = em.ones(n, {dtype = 'float64'})
  local opt = em.optim.Adam({p}, {lr = 0.1})
  set_grad(p, em.ones(n, {dtype = 'float64'}))
  opt:step()
  -- first Adam step moves every element by lr (sign of the grad)
  H.close(p:sum():item(), n * 0.9, 1e-7, 'sum after one step')
  H.close(p:max():item(), 0.9, 1e-7, 'max')
  H.close(p:min():item(), 0.9, 1e-7, 'min')
end)

-- -- With autograd ------------------------------------------------------------------
H.test('training loop with backward', function()
  -- minimise sum((p - c)^2): gradients from backward, updates in place on a leaf
  -- that requires grad (not recorded), a second backward after the update works.
  local p = em.tensor({1.5, -2, 0.25}, {dtype = 'float64'}):requires_grad_()
  local c = em.tensor({0.5, 1, -1}, {dtype = 'float64'})
  local opt = em.optim.SGD({p}, {lr = 0.1, momentum = 0.5})
  local want = {1.5, -2, 0.25}
  local buf = {}
  for step = 1, 4 do
    opt:zero_grad()
    local d = p - c
    local loss = em.matmul(d, d)   -- a dot product: sum((p - c)^2)
    loss:backward()
    local cv = {0.5, 1, -1}
    for i = 1, 3 do
      local g = 2 * (want[i] - cv[i])
      buf[i] = step == 1 and g or 0.5 * buf[i] + g
      want[i] = want[i] - 0.1 * buf[i]
    end
    H.close(flat(get_grad(p)), (function()
      local t = {}
      for i = 1, 3 do t[i] = 2 * (flat(p)[i] - cv[i]) end
      return t
    end)(), 1e-12, 'grad from backward')
    opt:step()
    H.close(flat(p), want, 1e-12, 'after step ' .. step)
  end
  H.eq(p.requires_grad, true, 'still requires grad')
  H.eq(p.is_leaf, true, 'still a leaf')
end)

-- -- clip_grad_norm --------------------------------------------------------------------
-- Values from PyTorch 1.13: clip_grad_norm_ on grads [3, 4] and [12] (total 13).
H.test('clip_grad_norm', function()
  local a, b, c = em.zeros(2), em.zeros(1), em.zeros(2)
  set_grad(a, em.tensor({3, 4}, {dtype = 'float32'}))
  set_grad(b, em.tensor({12}, {dtype = 'float32'}))
  local total = em.optim.clip_grad_norm({a, b, c}, 1.0)
  H.close(total, 13, 1e-6, 'total 2-norm')
  H.close(flat(get_grad(a)), {3 / (13 + 1e-6), 4 / (13 + 1e-6)}, 1e-6, 'scaled a')
  H.close(flat(get_grad(b)), {12 / (13 + 1e-6)}, 1e-6, 'scaled b')
  H.eq(get_grad(c), nil, 'no gradient stays none')
  total = em.optim.clip_grad_norm({a, b}, 5.0)
  H.close(total, 1, 1e-5, 'norm after clipping')
  H.close(flat(get_grad(b)), {12 / (13 + 1e-6)}, 1e-6, 'below max_norm: unchanged')
  set_grad(a, em.tensor({3, -4}, {dtype = 'float32'}))
  set_grad(b, em.tensor({-2}, {dtype = 'float32'}))
  H.close(em.optim.clip_grad_norm({a, b}, 100, 'inf'), 4, 1e-7, 'inf norm')
  H.close(em.optim.clip_grad_norm({a, b}, 100, 1), 9, 1e-7, '1-norm')
  H.close(em.optim.clip_grad_norm(a, 1, math.huge), 4, 1e-7, 'a single tensor')
  H.close(flat(get_grad(a)), {3 / (4 + 1e-6), -4 / (4 + 1e-6)}, 1e-6, 'inf-norm scaling')
  H.eq(em.optim.clip_grad_norm({em.zeros(2)}, 1), 0, 'no gradients: 0')
  H.raises(function() em.optim.clip_grad_norm({a}, 'x') end, 'clip_grad_norm', 'max_norm')
end)

-- -- Errors ------------------------------------------------------------------------------
H.test('errors', function()
  local p = em.ones(2, 3)
  H.raises(function() em.optim.SGD({p}) end, 'SGD', 'lr is required')
  H.raises(function() em.optim.SGD({}, {lr = 1}) end, 'SGD', 'empty')
  H.raises(function() em.optim.SGD({p, 3}, {lr = 1}) end, 'SGD', 'parameter 2', 'number')
  H.raises(function() em.optim.SGD({p}, {lr = 1, nesterov = true}) end, 'SGD', 'nesterov')
  H.raises(function() em.optim.SGD({p}, {lr = -1}) end, 'SGD', 'lr')
  H.raises(function() em.optim.SGD({p}, {lr = 1, momentun = 0.9}) end, 'unknown option',
           'momentun')
  H.raises(function() em.optim.Adam({p}, {betas = {0.9, 1.5}}) end, 'Adam', 'betas')
  H.raises(function() em.optim.SGD({p, p}, {lr = 1}) end, 'more than once')
  -- gradient of the wrong shape/dtype reaching the kernel: the message names both
  local q = em.ones(2, 3)
  -- (refused at the assignment already, naming both shapes, or else at the step)
  local ok = pcall(set_grad, q, em.ones(3, 2))
  if ok then
    H.raises(function() em.optim.SGD({q}, {lr = 1}):step() end, 'sgd_step_', '[3,2]', '[2,3]')
  else
    H.raises(function() set_grad(q, em.ones(3, 2)) end, 'grad', '[3,2]', '[2,3]')
  end
  local i = em.ones(3, {dtype = 'int32'})
  local st = em.state()
  local ffi = require 'ffi'
  -- The C ops directly: dtype, shape, contiguity errors name the op.
  local C = core.C
  H.eq(C.em_sgd_step_(st, em.handle(i), em.handle(i), nil, 1, 0, 0, 0, 0, 0) ~= 0, true,
       'int32 parameter refused')
  H.check(core.errmsg():find('sgd_step_: parameters must be float32 or float64, got int32',
    1, true), core.errmsg())
  local a, g = em.ones(2, 3), em.ones(3, 2)
  H.eq(C.em_adam_step_(st, em.handle(a), em.handle(g), em.handle(a), em.handle(a), 0.1,
    0.9, 0.999, 1e-8, 0, 0, 1) ~= 0, true, 'shape mismatch refused')
  H.check(core.errmsg():find('adam_step_: grad shape [3,2] doesn\'t match the parameter\'s ' ..
    'shape [2,3]', 1, true), core.errmsg())
  local d = em.ones(2, 3, {dtype = 'float64'})
  H.eq(C.em_adam_step_(st, em.handle(a), em.handle(d), em.handle(a), em.handle(a), 0.1,
    0.9, 0.999, 1e-8, 0, 1, 1) ~= 0, true, 'dtype mismatch refused')
  H.check(core.errmsg():find('adamw_step_: grad dtype float64 doesn\'t match the ' ..
    'parameter\'s dtype float32', 1, true), core.errmsg())
  local nc = em.ones(3, 2):t()
  H.eq(C.em_sgd_step_(st, em.handle(nc), em.handle(a), nil, 1, 0, 0, 0, 0, 0) ~= 0, true,
       'non-contiguous parameter refused')
  H.check(core.errmsg():find('must be contiguous', 1, true), core.errmsg())
  H.eq(C.em_sgd_step_(st, em.handle(a), em.handle(a), nil, 1, 0.9, 0, 0, 0, 0) ~= 0, true,
       'momentum without a buffer refused')
  H.eq(flat(a), {1, 1, 1, 1, 1, 1}, 'failed steps leave the parameter intact')
  local _ = ffi
  -- schedules
  local opt = em.optim.SGD({p}, {lr = 1})
  H.raises(function() em.optim.StepLR(opt, {}) end, 'StepLR', 'step_size')
  H.raises(function() em.optim.StepLR({}, {step_size = 1}) end, 'StepLR', 'optimizer')
  H.raises(function() em.optim.CosineAnnealingLR(opt, {T_max = 0}) end, 'T_max')
  H.raises(function() em.optim.OneCycleLR(opt, {max_lr = 1}) end, 'OneCycleLR', 'total_steps')
  local oc = em.optim.OneCycleLR(opt, {max_lr = 1, total_steps = 2})
  oc:step(); oc:step()
  H.raises(function() oc:step() end, 'OneCycleLR', 'total_steps')
end)

H.test('em.optim.clip_grad_norm aliases', function()
  H.check(em.optim.clip_grad_norm_ == em.optim.clip_grad_norm, 'clip_grad_norm_ alias')
end)

H.done()

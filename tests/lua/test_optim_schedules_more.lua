--[[
test_optim_schedules_more.lua -- LinearLR, LambdaLR, SequentialLR and
ReduceLROnPlateau replay PyTorch's lr sequences (36 steps, two parameter groups)
recorded by tests/fixtures/gen_losses_sched_rnn.py; state_dict /
load_state_dict resume mid-way onto the same sequence; bad options raise
errors naming the schedule.
]]
local dir = (arg and arg[0] and arg[0]:match('^(.*/)')) or
            ((os.getenv('EMBER_TESTS') or 'tests') .. '/lua/')
local H = dofile(dir .. 'harness.lua')
local em = require 'ember'
local fixtures = dofile(dir .. '../fixtures/lr_schedules_more.lua')

-- The generator's lambdas, by name.
local LAMBDAS = {
  exp95 = function(e) return 0.95 ^ e end,
  inv = function(e) return 1.0 / (e + 1) end,
  warm10 = function(e) return math.min(1.0, (e + 1) / 10) end,
}

local function make_opt()
  local p1, p2 = em.zeros(2):requires_grad_(), em.zeros(3):requires_grad_()
  return em.optim.SGD({ { params = { p1 } }, { params = { p2 }, lr = 0.05 } },
    { lr = 0.1, momentum = 0.9 })
end

local function build(opt, spec)
  local kind, o = spec[1], {}
  for k, v in pairs(spec[2]) do o[k] = v end
  if kind == 'LambdaLR' then
    local ls = o.lr_lambda
    if type(ls) == 'table' then
      local fs = {}
      for i, k in ipairs(ls) do fs[i] = LAMBDAS[k] end
      o.lr_lambda = fs
    else
      o.lr_lambda = LAMBDAS[ls]
    end
  end
  if kind == 'SequentialLR' then
    local ss = {}
    for i, s in ipairs(o.schedulers) do ss[i] = build(opt, s) end
    o.schedulers = ss
  end
  return em.optim[kind](opt, o)
end

local function lrs(opt) return { opt.param_groups[1].lr, opt.param_groups[2].lr } end

local function step(s, case, i)
  if case.metrics then s:step(case.metrics[i]) else s:step() end
end

for _, case in ipairs(fixtures) do
  H.test(case.name .. ': the lr sequence is PyTorch\'s', function()
    local opt = make_opt()
    local s = build(opt, case.spec)
    local worst, at = 0, nil
    for i = 0, #case.lrs - 1 do
      if i > 0 then step(s, case, i) end
      local got, want = lrs(opt), case.lrs[i + 1]
      for g = 1, 2 do
        local e = math.abs(got[g] - want[g]) / math.max(math.abs(want[g]), 1e-300)
        if e > worst then worst, at = e, ('step %d group %d: got %.17g, want %.17g'):format(i,
          g, got[g], want[g]) end
      end
    end
    H.check(worst <= 1e-12, 'largest relative difference ' .. worst .. ' at ' .. tostring(at))
    H.close(s:get_last_lr(), case.lrs[#case.lrs], 1e-12, 'get_last_lr after the last step')
  end)

  H.test(case.name .. ': state_dict resumes mid-way', function()
    local opt = make_opt()
    local s = build(opt, case.spec)
    local half = 15
    for i = 1, half do step(s, case, i) end
    local sd = s:state_dict()
    -- A fresh optimizer and schedule, moved on elsewhere, then loaded.
    local opt2 = make_opt()
    local s2 = build(opt2, case.spec)
    for i = 1, 3 do step(s2, case, i) end
    s2:load_state_dict(sd)
    for g = 1, 2 do opt2.param_groups[g].lr = opt.param_groups[g].lr end
    for i = half + 1, #case.lrs - 1 do
      step(s, case, i)
      step(s2, case, i)
    end
    H.close(lrs(opt2), case.lrs[#case.lrs], 1e-12, 'lrs after resuming')
    H.close(lrs(opt), case.lrs[#case.lrs], 1e-12, 'lrs of the original')
  end)
end

H.test('state_dict holds plain data, LambdaLR keeps its functions', function()
  local opt = make_opt()
  local s = em.optim.LambdaLR(opt, { lr_lambda = LAMBDAS.exp95 })
  local sd = s:state_dict()
  H.eq(sd.lr_lambdas, nil, 'no lambdas in the state_dict')
  H.eq(sd.optimizer, nil, 'no optimizer in the state_dict')
  s:load_state_dict(sd)
  s:step()
  H.close(opt.param_groups[1].lr, 0.1 * 0.95, 1e-15, 'lambda still applied')
  local seq = em.optim.SequentialLR(opt, { schedulers = {
    em.optim.LinearLR(opt, { total_iters = 2 }), em.optim.StepLR(opt, { step_size = 2 }) },
    milestones = { 2 } })
  local ssd = seq:state_dict()
  H.eq(#ssd.schedulers, 2, 'one state per inner schedule')
  H.eq(ssd.schedulers[1].name, 'LinearLR', 'inner state is the schedule\'s own')
  local p = em.optim.ReduceLROnPlateau(opt, {})
  p:step(1.0)
  H.eq(p:state_dict().best, 1.0, 'ReduceLROnPlateau best')
  p:step(em.tensor(0.5))
  H.eq(p.best, 0.5, 'a one-element tensor metric is read')
end)

H.test('bad options raise errors naming the schedule', function()
  local opt = make_opt()
  H.raises(function() em.optim.LinearLR(opt, { start_factor = 0 }) end, 'LinearLR',
    'start_factor', '(0, 1]')
  H.raises(function() em.optim.LinearLR(opt, { end_factor = 2 }) end, 'LinearLR', 'end_factor')
  H.raises(function() em.optim.LinearLR(opt, { total_iters = 0 }) end, 'LinearLR', 'total_iters')
  H.raises(function() em.optim.LinearLR({}, {}) end, 'LinearLR', 'optimizer')
  H.raises(function() em.optim.LambdaLR(opt, {}) end, 'LambdaLR', 'lr_lambda must be a function')
  H.raises(function() em.optim.LambdaLR(opt, { lr_lambda = { LAMBDAS.inv } }) end, 'LambdaLR',
    '1 functions for 2 parameter groups')
  H.raises(function() em.optim.LambdaLR(opt, { lr_lambda = function() return 'x' end }) end,
    'LambdaLR', 'returned string')
  local a = em.optim.LinearLR(opt, {})
  H.raises(function() em.optim.SequentialLR(opt, { schedulers = { a, a }, milestones = {} }) end,
    'SequentialLR', 'milestones must list 1')
  H.raises(function() em.optim.SequentialLR(opt, { schedulers = {} }) end, 'SequentialLR',
    'non-empty')
  H.raises(function()
    em.optim.SequentialLR(opt, { schedulers = { a, em.optim.LinearLR(make_opt(), {}) },
      milestones = { 3 } })
  end, 'SequentialLR', 'schedulers[2] drives another optimizer')
  H.raises(function()
    em.optim.SequentialLR(opt, { schedulers = { a, em.optim.ReduceLROnPlateau(opt) },
      milestones = { 3 } })
  end, 'SequentialLR', 'ReduceLROnPlateau')
  H.raises(function() em.optim.ReduceLROnPlateau(opt, { mode = 'median' }) end,
    'ReduceLROnPlateau', "mode must be 'min' or 'max'")
  H.raises(function() em.optim.ReduceLROnPlateau(opt, { factor = 1 }) end,
    'ReduceLROnPlateau', 'factor must be < 1')
  H.raises(function() em.optim.ReduceLROnPlateau(opt, { threshold_mode = 'x' }) end,
    'ReduceLROnPlateau', 'threshold_mode')
  H.raises(function() em.optim.ReduceLROnPlateau(opt, { min_lr = { 1 } }) end,
    'ReduceLROnPlateau', '1 values for 2 parameter groups')
  local p = em.optim.ReduceLROnPlateau(opt)
  H.raises(function() p:step() end, 'ReduceLROnPlateau:step', 'metric')
  H.eq(p.last_epoch, 0, 'a failed step leaves the state as it was')
end)

H.done()

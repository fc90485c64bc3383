--[[
ember.optim.lr_scheduler -- learning-rate schedules, stepping exactly as PyTorch
1.13's torch.optim.lr_scheduler (the recursive "chainable" forms, so values
agree to the last bit):

  StepLR(opt, {step_size, gamma = 0.1})         lr *= gamma every step_size steps
  CosineAnnealingLR(opt, {T_max, eta_min = 0})  cosine from the base lr to eta_min
  OneCycleLR(opt, {max_lr, total_steps, pct_start = 0.3, anneal_strategy = 'cos',
    div_factor = 25, final_div_factor = 1e4, cycle_momentum = true,
    base_momentum = 0.85, max_momentum = 0.95, three_phase = false})
  (LinearLR, LambdaLR, SequentialLR, ReduceLROnPlateau: lr_scheduler_more.lua)

Creating a schedule performs its step 0 (setting the initial lr), as PyTorch
does; call sched:step() after each opt:step(). sched:get_last_lr() returns the
lrs of the groups; state_dict() / load_state_dict(sd) save the position.
]]
local core = require 'ember.ffi'
local raise, kind = core.raise, core.kind

local M = {}

local Scheduler = {}
Scheduler.__index = Scheduler

local function check_opt(name, opt)
  if type(opt) ~= 'table' or type(opt.param_groups) ~= 'table' then
    raise(('%s: expected an optimizer as argument 1, got %s'):format(name, kind(opt)))
  end
end

local function num(name, opts, k, default, lo, integer)
  local v = opts[k]
  if v == nil then v = default end
  if type(v) ~= 'number' or v ~= v or (lo and v < lo) or (integer and v % 1 ~= 0) then
    raise(('%s: %s must be %s%s, got %s'):format(name, k, integer and 'an integer' or 'a number',
      lo and (' >= ' .. lo) or '', type(v) == 'number' and tostring(v) or kind(v)))
  end
  return v
end

-- The base: remembers initial lrs, then takes step 0.
local function init(self, name, opt)
  self.name, self.optimizer = name, opt
  self.base_lrs = {}
  for i, g in ipairs(opt.param_groups) do
    if g.initial_lr == nil then g.initial_lr = g.lr end
    self.base_lrs[i] = g.initial_lr
  end
  self.last_epoch = -1
  self.step_count = 0
  self:step()
  return self
end

-- step(epoch) jumps to an epoch, as PyTorch's deprecated form that SequentialLR
-- uses at its milestones: the closed form where the schedule has one.
function Scheduler:step(epoch)
  self.step_count = self.step_count + 1
  local lrs
  if epoch == nil then
    self.last_epoch = self.last_epoch + 1
    lrs = self:get_lr()
  else
    self.last_epoch = epoch
    lrs = self.closed_form_lr and self:closed_form_lr() or self:get_lr()
  end
  local last = {}
  for i, g in ipairs(self.optimizer.param_groups) do
    g.lr = lrs[i]
    last[i] = lrs[i]
  end
  self.last_lr = last
end

function Scheduler:get_last_lr()
  local t = {}
  for i, v in ipairs(self.last_lr) do t[i] = v end
  return t
end

-- Everything but the optimizer and functions (LambdaLR's lambdas stay with the
-- code, as in PyTorch): numbers, booleans, strings and lists of numbers.
function Scheduler:state_dict()
  local sd = {}
  for k, v in pairs(self) do
    if k ~= 'optimizer' and type(v) ~= 'function' then
      if type(v) == 'table' then
        local t = {}
        for i, x in pairs(v) do t[i] = x end
        v = t
      end
      sd[k] = v
    end
  end
  return sd
end

function Scheduler:load_state_dict(sd)
  if type(sd) ~= 'table' then
    raise(self.name .. ':load_state_dict: expected a table, got ' .. kind(sd))
  end
  for k, v in pairs(sd) do
    if k ~= 'optimizer' and type(v) ~= 'function' then
      if type(v) == 'table' then
        local t = {}
        for i, x in pairs(v) do t[i] = x end
        v = t
      end
      self[k] = v
    end
  end
end

local function class(get_lr)
  local cls = setmetatable({ get_lr = get_lr }, { __index = Scheduler })
  cls.__index = cls
  return cls
end

local function current(self)
  local t = {}
  for i, g in ipairs(self.optimizer.param_groups) do t[i] = g.lr end
  return t
end

-- -- StepLR -------------------------------------------------------------------------
local StepLR = class(function(self)
  local e = self.last_epoch
  local lrs = current(self)
  if e == 0 or e % self.step_size ~= 0 then return lrs end
  for i = 1, #lrs do lrs[i] = lrs[i] * self.gamma end
  return lrs
end)

function StepLR:closed_form_lr()
  local lrs = {}
  for i, b in ipairs(self.base_lrs) do
    lrs[i] = b * self.gamma ^ math.floor(self.last_epoch / self.step_size)
  end
  return lrs
end

function M.StepLR(opt, opts)
  check_opt('StepLR', opt)
  opts = opts or {}
  local self = setmetatable({
    step_size = num('StepLR', opts, 'step_size', nil, 1, true),
    gamma = num('StepLR', opts, 'gamma', 0.1),
  }, StepLR)
  return init(self, 'StepLR', opt)
end

-- -- CosineAnnealingLR ------------------------------------------------------------------
local pi, cos = math.pi, math.cos
local Cosine = class(function(self)
  local e, T, eta = self.last_epoch, self.T_max, self.eta_min
  local lrs = current(self)
  if e == 0 then return lrs end
  if (e - 1 - T) % (2 * T) == 0 then
    for i = 1, #lrs do
      lrs[i] = lrs[i] + (self.base_lrs[i] - eta) * (1 - cos(pi / T)) / 2
    end
    return lrs
  end
  for i = 1, #lrs do
    lrs[i] = (1 + cos(pi * e / T)) / (1 + cos(pi * (e - 1) / T)) * (lrs[i] - eta) + eta
  end
  return lrs
end)

function Cosine:closed_form_lr()
  local lrs, eta = {}, self.eta_min
  for i, b in ipairs(self.base_lrs) do
    lrs[i] = eta + (b - eta) * (1 + cos(pi * self.last_epoch / self.T_max)) / 2
  end
  return lrs
end

function M.CosineAnnealingLR(opt, opts)
  check_opt('CosineAnnealingLR', opt)
  opts = opts or {}
  local self = setmetatable({
    T_max = num('CosineAnnealingLR', opts, 'T_max', nil, 1, true),
    eta_min = num('CosineAnnealingLR', opts, 'eta_min', 0),
  }, Cosine)
  return init(self, 'CosineAnnealingLR', opt)
end

-- -- OneCycleLR -----------------------------------------------------------------------
local function anneal(strategy, s, e, pct)
  if strategy == 'cos' then return e + (s - e) / 2.0 * (cos(pi * pct) + 1) end
  return (e - s) * pct + s
end

-- Phase boundaries (PyTorch's, with pct_start * total_steps kept fractional).
local function phases(self)
  local T, p = self.total_steps, self.pct_start
  if self.three_phase then
    return {
      { p * T - 1, 'initial_lr', 'max_lr', 'max_momentum', 'base_momentum' },
      { 2 * p * T - 2, 'max_lr', 'initial_lr', 'base_momentum', 'max_momentum' },
      { T - 1, 'initial_lr', 'min_lr', 'max_momentum', 'max_momentum' },
    }
  end
  return {
    { p * T - 1, 'initial_lr', 'max_lr', 'max_momentum', 'base_momentum' },
    { T - 1, 'max_lr', 'min_lr', 'base_momentum', 'max_momentum' },
  }
end

local OneCycle = class(function(self)
  local step = self.last_epoch
  if step > self.total_steps then
    raise(('OneCycleLR: stepped %d times, more than total_steps = %d'):format(step,
      self.total_steps))
  end
  local ph = phases(self)
  local lrs = {}
  for i, g in ipairs(self.optimizer.param_groups) do
    local start = 0
    for k, f in ipairs(ph) do
      local stop = f[1]
      if step <= stop or k == #ph then
        local pct = (step - start) / (stop - start)
        lrs[i] = anneal(self.anneal_strategy, g[f[2]], g[f[3]], pct)
        if self.cycle_momentum then
          local m = anneal(self.anneal_strategy, g[f[4]], g[f[5]], pct)
          if self.use_beta1 then g.betas = { m, g.betas[2] } else g.momentum = m end
        end
        break
      end
      start = stop
    end
  end
  return lrs
end)

function M.OneCycleLR(opt, opts)
  local name = 'OneCycleLR'
  check_opt(name, opt)
  opts = opts or {}
  local self = setmetatable({
    total_steps = num(name, opts, 'total_steps', nil, 1, true),
    pct_start = num(name, opts, 'pct_start', 0.3, 0),
    div_factor = num(name, opts, 'div_factor', 25),
    final_div_factor = num(name, opts, 'final_div_factor', 1e4),
    anneal_strategy = opts.anneal_strategy or 'cos',
    cycle_momentum = opts.cycle_momentum ~= false,
    three_phase = opts.three_phase == true,
  }, OneCycle)
  if self.pct_start > 1 then raise(name .. ': pct_start must be in [0, 1], got ' .. self.pct_start) end
  if self.anneal_strategy ~= 'cos' and self.anneal_strategy ~= 'linear' then
    raise(("%s: anneal_strategy must be 'cos' or 'linear', got %s"):format(name,
      tostring(self.anneal_strategy)))
  end
  local groups = opt.param_groups
  local max_lr = opts.max_lr
  local function per_group(v, k, i)
    if type(v) == 'table' then
      if #v ~= #groups then
        raise(('%s: %s has %d values for %d parameter groups'):format(name, k, #v, #groups))
      end
      v = v[i]
    end
    if type(v) ~= 'number' then
      raise(('%s: %s must be a number (or one per group), got %s'):format(name, k, kind(v)))
    end
    return v
  end
  for i, g in ipairs(groups) do
    local m = per_group(max_lr, 'max_lr', i)
    g.initial_lr = m / self.div_factor
    g.max_lr = m
    g.min_lr = g.initial_lr / self.final_div_factor
  end
  if self.cycle_momentum then
    local d = opt.defaults or {}
    if d.momentum == nil and d.betas == nil then
      raise(name .. ': the optimizer has neither momentum nor betas; pass cycle_momentum = false')
    end
    self.use_beta1 = d.betas ~= nil
    for i, g in ipairs(groups) do
      local bm = per_group(opts.base_momentum or 0.85, 'base_momentum', i)
      local mm = per_group(opts.max_momentum or 0.95, 'max_momentum', i)
      if self.use_beta1 then g.betas = { mm, g.betas[2] } else g.momentum = mm end
      g.max_momentum, g.base_momentum = mm, bm
    end
  end
  return init(self, name, opt)
end

-- LinearLR, LambdaLR, SequentialLR and ReduceLROnPlateau build on the same base.
require('ember.optim.lr_scheduler_more')(M, {
  Scheduler = Scheduler, init = init, class = class, num = num, check_opt = check_opt,
  current = current,
})

return M

--[[
ember.optim.lr_scheduler_more -- more learning-rate schedules, stepping as
PyTorch's torch.optim.lr_scheduler does (its chainable forms, so the values
agree to the last bit):

  LinearLR(opt, {start_factor = 1/3, end_factor = 1, total_iters = 5})
      the lr moves linearly from base * start_factor to base * end_factor
  LambdaLR(opt, {lr_lambda})      lr = base * lr_lambda(epoch) (one function, or
                                  one per parameter group)
  SequentialLR(opt, {schedulers, milestones})
      runs schedulers[1] until milestones[1], then schedulers[2] (restarted at
      its epoch 0), ...: a warm-up then a decay
  ReduceLROnPlateau(opt, {mode = 'min', factor = 0.1, patience = 10,
    threshold = 1e-4, threshold_mode = 'rel', cooldown = 0, min_lr = 0, eps = 1e-8})
      sched:step(metric) multiplies the lr by factor once the metric has not
      improved for more than patience steps

Called by lr_scheduler.lua with its base (the Scheduler class and helpers).
]]
local core = require 'ember.ffi'
local raise, kind = core.raise, core.kind

return function(M, base)
  local Scheduler, init, class, num, check_opt, current =
    base.Scheduler, base.init, base.class, base.num, base.check_opt, base.current

  local function opts_of(name, opts)
    if opts == nil then return {} end
    if type(opts) ~= 'table' then raise(name .. ': expected an options table, got ' .. kind(opts)) end
    return opts
  end

  -- -- LinearLR ------------------------------------------------------------------------
  local Linear = class(function(self)
    local e, s, f, n = self.last_epoch, self.start_factor, self.end_factor, self.total_iters
    local lrs = current(self)
    if e == 0 then
      for i = 1, #lrs do lrs[i] = lrs[i] * s end
    elseif e <= n then
      for i = 1, #lrs do lrs[i] = lrs[i] * (1 + (f - s) / (n * s + (e - 1) * (f - s))) end
    end
    return lrs
  end)

  function Linear:closed_form_lr()
    local s, f, n = self.start_factor, self.end_factor, self.total_iters
    local lrs = {}
    for i, b in ipairs(self.base_lrs) do
      lrs[i] = b * (s + (f - s) * math.min(n, self.last_epoch) / n)
    end
    return lrs
  end

  function M.LinearLR(opt, opts)
    local name = 'LinearLR'
    check_opt(name, opt)
    opts = opts_of(name, opts)
    local self = setmetatable({
      start_factor = num(name, opts, 'start_factor', 1 / 3),
      end_factor = num(name, opts, 'end_factor', 1),
      total_iters = num(name, opts, 'total_iters', 5, 1, true),
    }, Linear)
    if self.start_factor <= 0 or self.start_factor > 1 then
      raise(('%s: start_factor must be in (0, 1], got %s'):format(name, self.start_factor))
    end
    if self.end_factor < 0 or self.end_factor > 1 then
      raise(('%s: end_factor must be in [0, 1], got %s'):format(name, self.end_factor))
    end
    return init(self, name, opt)
  end

  -- -- LambdaLR ------------------------------------------------------------------------
  local Lambda = class(function(self)
    local lrs = {}
    for i, b in ipairs(self.base_lrs) do
      local f = self.lr_lambdas[i]
      local m = f(self.last_epoch)
      if type(m) ~= 'number' then
        raise(('LambdaLR: lr_lambda(%d) returned %s, expected a number'):format(self.last_epoch,
          kind(m)))
      end
      lrs[i] = b * m
    end
    return lrs
  end)

  -- The lambdas are code: state_dict leaves them out, load_state_dict keeps them.
  function Lambda:state_dict()
    local sd = Scheduler.state_dict(self)
    sd.lr_lambdas = nil
    return sd
  end
  function Lambda:load_state_dict(sd)
    local fns = self.lr_lambdas
    Scheduler.load_state_dict(self, sd)
    self.lr_lambdas = fns
  end

  function M.LambdaLR(opt, opts)
    local name = 'LambdaLR'
    check_opt(name, opt)
    opts = opts_of(name, opts)
    local f, groups = opts.lr_lambda, #opt.param_groups
    local fns = {}
    if type(f) == 'function' then
      for i = 1, groups do fns[i] = f end
    elseif type(f) == 'table' then
      if #f ~= groups then
        raise(('%s: lr_lambda has %d functions for %d parameter groups'):format(name, #f, groups))
      end
      for i = 1, groups do
        if type(f[i]) ~= 'function' then
          raise(('%s: lr_lambda[%d] must be a function, got %s'):format(name, i, kind(f[i])))
        end
        fns[i] = f[i]
      end
    else
      raise(('%s: lr_lambda must be a function (or a list, one per parameter group), got %s')
        :format(name, kind(f)))
    end
    return init(setmetatable({ lr_lambdas = fns }, Lambda), name, opt)
  end

  -- -- SequentialLR --------------------------------------------------------------------
  local Sequential = {}
  Sequential.__index = Sequential
  setmetatable(Sequential, { __index = Scheduler })

  -- The schedule of milestone interval e: how many milestones are <= e (bisect_right).
  local function which(milestones, e)
    local k = 0
    for _, m in ipairs(milestones) do if m <= e then k = k + 1 end end
    return k + 1
  end

  function Sequential:step()
    self.last_epoch = self.last_epoch + 1
    local k = which(self.milestones, self.last_epoch)
    local s = self.schedulers[k]
    if k > 1 and self.milestones[k - 1] == self.last_epoch then s:step(0) else s:step() end
    self.last_lr = s:get_last_lr()
  end

  function Sequential:state_dict()
    local sd = { name = self.name, last_epoch = self.last_epoch, milestones = {}, last_lr = {},
      schedulers = {} }
    for i, m in ipairs(self.milestones) do sd.milestones[i] = m end
    for i, v in ipairs(self.last_lr) do sd.last_lr[i] = v end
    for i, s in ipairs(self.schedulers) do sd.schedulers[i] = s:state_dict() end
    return sd
  end

  function Sequential:load_state_dict(sd)
    if type(sd) ~= 'table' or type(sd.schedulers) ~= 'table' or #sd.schedulers ~= #self.schedulers then
      raise(('SequentialLR:load_state_dict: expected a state_dict with %d schedulers, got %s')
        :format(#self.schedulers, type(sd) == 'table' and
          (tostring(type(sd.schedulers) == 'table' and #sd.schedulers or 'none') .. ' schedulers')
          or kind(sd)))
    end
    for i, s in ipairs(self.schedulers) do s:load_state_dict(sd.schedulers[i]) end
    self.last_epoch = sd.last_epoch
    self.milestones, self.last_lr = {}, {}
    for i, m in ipairs(sd.milestones or {}) do self.milestones[i] = m end
    for i, v in ipairs(sd.last_lr or {}) do self.last_lr[i] = v end
  end

  function M.SequentialLR(opt, opts)
    local name = 'SequentialLR'
    check_opt(name, opt)
    opts = opts_of(name, opts)
    local scheds, ms = opts.schedulers, opts.milestones
    if type(scheds) ~= 'table' or #scheds < 1 then
      raise(name .. ': schedulers must be a non-empty list of schedules, got ' .. kind(scheds))
    end
    for i, s in ipairs(scheds) do
      if type(s) ~= 'table' or s.optimizer == nil then
        raise(('%s: schedulers[%d] is not a schedule (got %s)'):format(name, i, kind(s)))
      end
      if s.name == 'ReduceLROnPlateau' then
        raise(('%s: schedulers[%d] is a ReduceLROnPlateau, which steps on a metric; it cannot be sequenced')
          :format(name, i))
      end
      if s.optimizer ~= opt then
        raise(('%s: schedulers[%d] drives another optimizer than the one given as argument 1')
          :format(name, i))
      end
    end
    if type(ms) ~= 'table' or #ms ~= #scheds - 1 then
      raise(('%s: milestones must list %d steps (one fewer than the %d schedulers), got %s')
        :format(name, #scheds - 1, #scheds, type(ms) == 'table' and #ms .. ' values' or kind(ms)))
    end
    for i, m in ipairs(ms) do
      if type(m) ~= 'number' or m % 1 ~= 0 or (i > 1 and m < ms[i - 1]) then
        raise(('%s: milestones must be increasing integers, got %s at %d'):format(name,
          tostring(m), i))
      end
    end
    local self = setmetatable({ name = name, optimizer = opt, schedulers = {}, milestones = {},
      last_epoch = 0 }, Sequential)
    for i, s in ipairs(scheds) do self.schedulers[i] = s end
    for i, m in ipairs(ms) do self.milestones[i] = m end
    -- Back to the initial lrs; every schedule's own step 0 is undone (inside nested
    -- sequences too), and the one that runs at step 0 takes it again.
    for _, g in ipairs(opt.param_groups) do g.lr = g.initial_lr end
    local function undo(list)
      for _, s in ipairs(list) do
        if getmetatable(s) == Sequential then undo(s.schedulers)
        else s.last_epoch = s.last_epoch - 1 end
      end
    end
    undo(scheds)
    local first = scheds[which(ms, 0)]
    first.step_count = 0
    first:step()
    self.last_lr = first:get_last_lr()
    return self
  end

  -- -- ReduceLROnPlateau ---------------------------------------------------------------
  local Plateau = {}
  Plateau.__index = Plateau
  setmetatable(Plateau, { __index = Scheduler })

  function Plateau:is_better(a)
    local best, th = self.best, self.threshold
    if self.mode == 'min' then
      if self.threshold_mode == 'rel' then return a < best * (1 - th) end
      return a < best - th
    end
    if self.threshold_mode == 'rel' then return a > best * (th + 1) end
    return a > best + th
  end

  function Plateau:step(metric)
    if type(metric) ~= 'number' then
      if type(metric) == 'cdata' and metric.item then
        metric = metric:item()
      else
        raise('ReduceLROnPlateau:step: expected the metric (a number or a one-element tensor), got '
          .. kind(metric))
      end
    end
    self.last_epoch = self.last_epoch + 1
    if self:is_better(metric) then
      self.best, self.num_bad_epochs = metric, 0
    else
      self.num_bad_epochs = self.num_bad_epochs + 1
    end
    if self.cooldown_counter > 0 then
      self.cooldown_counter = self.cooldown_counter - 1
      self.num_bad_epochs = 0
    end
    if self.num_bad_epochs > self.patience then
      local groups = self.optimizer.param_groups
      if #groups ~= #self.min_lrs then
        if self.default_min_lr == nil then
          raise(('ReduceLROnPlateau:step: the optimizer has %d parameter groups but min_lr lists %d; '
            .. 'set sched.min_lrs to one value per group'):format(#groups, #self.min_lrs))
        end
        for i = 1, #groups do self.min_lrs[i] = self.default_min_lr end
        for i = #groups + 1, #self.min_lrs do self.min_lrs[i] = nil end
      end
      for i, g in ipairs(groups) do
        local new = math.max(g.lr * self.factor, self.min_lrs[i])
        if g.lr - new > self.eps then g.lr = new end
      end
      self.cooldown_counter, self.num_bad_epochs = self.cooldown, 0
    end
    self.last_lr = current(self)
  end

  function M.ReduceLROnPlateau(opt, opts)
    local name = 'ReduceLROnPlateau'
    check_opt(name, opt)
    opts = opts_of(name, opts)
    local self = setmetatable({
      name = name, optimizer = opt,
      mode = opts.mode or 'min',
      factor = num(name, opts, 'factor', 0.1, 0),
      patience = num(name, opts, 'patience', 10, 0, true),
      threshold = num(name, opts, 'threshold', 1e-4, 0),
      threshold_mode = opts.threshold_mode or 'rel',
      cooldown = num(name, opts, 'cooldown', 0, 0, true),
      eps = num(name, opts, 'eps', 1e-8, 0),
      cooldown_counter = 0, num_bad_epochs = 0, last_epoch = 0,
    }, Plateau)
    if self.factor >= 1 then raise(('%s: factor must be < 1, got %s'):format(name, self.factor)) end
    if self.mode ~= 'min' and self.mode ~= 'max' then
      raise(("%s: mode must be 'min' or 'max', got %s"):format(name, tostring(self.mode)))
    end
    if self.threshold_mode ~= 'rel' and self.threshold_mode ~= 'abs' then
      raise(("%s: threshold_mode must be 'rel' or 'abs', got %s"):format(name,
        tostring(self.threshold_mode)))
    end
    local groups, min_lr = opt.param_groups, opts.min_lr or 0
    self.min_lrs = {}
    for i = 1, #groups do
      local v = min_lr
      if type(min_lr) == 'table' then
        if #min_lr ~= #groups then
          raise(('%s: min_lr has %d values for %d parameter groups'):format(name, #min_lr, #groups))
        end
        v = min_lr[i]
      end
      if type(v) ~= 'number' or v < 0 then
        raise(('%s: min_lr must be a number >= 0 (or one per group), got %s'):format(name,
          type(v) == 'number' and tostring(v) or kind(v)))
      end
      self.min_lrs[i] = v
    end
    if type(min_lr) == 'number' then self.default_min_lr = min_lr end
    self.best = self.mode == 'min' and math.huge or -math.huge
    self.last_lr = current(self)
    return self
  end
end

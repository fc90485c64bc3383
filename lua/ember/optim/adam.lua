--[[
ember.optim.adam -- Adam (L2 weight decay added to the gradient) and AdamW
(decoupled weight decay: p = p * (1 - lr * weight_decay) before the update), as
PyTorch 1.13's torch.optim.Adam / AdamW (amsgrad, maximize and foreach are not
offered):

  m = beta1 * m + (1 - beta1) * grad
  v = beta2 * v + (1 - beta2) * grad^2
  p = p - lr / (1 - beta1^t) * m / (sqrt(v) / sqrt(1 - beta2^t) + eps)

state[i] = {step = t, exp_avg = m, exp_avg_sq = v}.
]]
local core = require 'ember.ffi'
local create = require 'ember.create'
local C, S, raise = core.C, core.S, core.raise

return function(optim)
  local function check(op, g, gi)
    optim.check_number(op, g, gi, 'lr', 0)
    optim.check_number(op, g, gi, 'eps', 0)
    optim.check_number(op, g, gi, 'weight_decay', 0)
    local b = g.betas
    if type(b) ~= 'table' or type(b[1]) ~= 'number' or type(b[2]) ~= 'number' or
       not (b[1] >= 0 and b[1] < 1 and b[2] >= 0 and b[2] < 1) then
      raise(('%s: betas must be two numbers in [0, 1), got %s'):format(op,
        type(b) == 'table' and ('{' .. tostring(b[1]) .. ', ' .. tostring(b[2]) .. '}')
        or core.kind(b)))
    end
  end

  local function make(name, decoupled, wd)
    local defaults = { lr = 1e-3, betas = { 0.9, 0.999 }, eps = 1e-8, weight_decay = wd }
    local function update(self, g, p, h, gh, s)
      local step = (s.step or 0) + 1
      if s.exp_avg == nil then
        s.exp_avg = create.zeros_like(p)
        s.exp_avg_sq = create.zeros_like(p)
      end
      local st = C.em_adam_step_(S, h, gh, s.exp_avg._h, s.exp_avg_sq._h, g.lr, g.betas[1],
                                 g.betas[2], g.eps, g.weight_decay, decoupled, step)
      if st == 0 then s.step = step end
      return st
    end
    return optim.class(name, defaults, check, update)
  end

  return { Adam = make('Adam', 0, 0), AdamW = make('AdamW', 1, 1e-2) }
end

--[[
ember.optim.sgd -- stochastic gradient descent with momentum, dampening,
Nesterov momentum and L2 weight decay, as PyTorch 1.13's torch.optim.SGD:

  d = grad + weight_decay * p
  buf = d (first step) or momentum * buf + (1 - dampening) * d
  d = nesterov and d + momentum * buf or buf        (when momentum ~= 0)
  p = p - lr * d

state[i].momentum_buffer holds buf (absent while momentum is 0).
]]
local core = require 'ember.ffi'
local create = require 'ember.create'
local C, S, raise = core.C, core.S, core.raise

return function(optim)
  local defaults = { lr = false, momentum = 0, dampening = 0, weight_decay = 0,
                     nesterov = false }

  local function check(op, g, gi)
    if g.lr == false or g.lr == nil then raise(op .. ': lr is required') end
    optim.check_number(op, g, gi, 'lr', 0)
    optim.check_number(op, g, gi, 'momentum', 0)
    optim.check_number(op, g, gi, 'dampening')
    optim.check_number(op, g, gi, 'weight_decay', 0)
    if type(g.nesterov) ~= 'boolean' then
      raise(op .. ': nesterov must be a boolean, got ' .. core.kind(g.nesterov))
    end
    if g.nesterov and (g.momentum <= 0 or g.dampening ~= 0) then
      raise(op .. ': nesterov momentum requires a momentum and zero dampening')
    end
  end

  local function update(self, g, p, h, gh, s)
    local mom = g.momentum
    local b, first = nil, 0
    if mom ~= 0 then
      b = s.momentum_buffer
      if b == nil then
        b = create.empty_like(p)   -- the kernel writes it whole on the first step
        first = 1
      end
    end
    local st = C.em_sgd_step_(S, h, gh, b and b._h or nil, g.lr, mom, g.dampening,
                              g.weight_decay, g.nesterov and 1 or 0, first)
    -- kept only once written: a failed first step must not leave garbage behind
    if st == 0 and first == 1 then s.momentum_buffer = b end
    return st
  end

  return optim.class('SGD', defaults, check, update)
end

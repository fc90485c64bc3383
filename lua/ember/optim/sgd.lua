--[[
ember.optim.sgd -- stochastic gradient descent with momentum, dampening,
Nesterov momentum and L2 weight decay, as PyTorch 1.13's torch.optim.SGD:

  d = grad + weight_decay * p
  buf = d (first step) or momentum * buf + (1 - dampening) * d
  d = nesterov and d + momentum * buf or buf        (when momentum ~= 0)
  p = p - lr * d

state[i].momentum_buffer holds buf (absent while momentum is 0), on the parameter's
device. A step updates a group's parameters of one device and dtype in one call
(em_sgd_step_multi_: one kernel launch on cuda).
]]
local ffi = require 'ffi'
local core = require 'ember.ffi'
local create = require 'ember.create'
local compile = require 'ember.compile'
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

  -- One C call for the bucket (one device and dtype: init.lua's step).
  local function update(self, g, b)
    local n, mom = b.n, g.momentum
    local P, G = ffi.new('em_tensor*[?]', n), ffi.new('const em_tensor*[?]', n)
    local B = mom ~= 0 and ffi.new('em_tensor*[?]', n) or nil
    local F = ffi.new('int[?]', n)
    local fresh = {}
    for i = 1, n do
      local it = b[i]
      P[i - 1], G[i - 1] = it.h, it.gh
      if B then
        local buf = it.s.momentum_buffer
        if buf == nil then
          buf = create.empty_like(it.p)   -- the kernel writes it whole on the first step
          F[i - 1] = 1
          fresh[i] = buf
        end
        B[i - 1] = buf._h
      end
    end
    local st = C.em_sgd_step_multi_(S, n, P, G, B, F, g.lr, mom, g.dampening,
                                    g.weight_decay, g.nesterov and 1 or 0)
    -- kept only once written: a failed first step must not leave garbage behind
    if st == 0 then
      for i, buf in pairs(fresh) do b[i].s.momentum_buffer = buf end
      -- a compiled step replays this update with the rate of its time
      if compile.capturing() then
        local at = C.em_compile_recorded(S) - 1
        compile.on_replay(function(prog) core.check(C.em_program_patch_sgd(S, prog, at, g.lr)) end)
      end
    end
    return st
  end

  return optim.class('SGD', defaults, check, update)
end

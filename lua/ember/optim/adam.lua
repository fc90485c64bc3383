--[[
ember.optim.adam -- Adam (L2 weight decay added to the gradient) and AdamW
(decoupled weight decay: p = p * (1 - lr * weight_decay) before the update), as
PyTorch 1.13's torch.optim.Adam / AdamW (amsgrad, maximize and foreach are not
offered):

  m = beta1 * m + (1 - beta1) * grad
  v = beta2 * v + (1 - beta2) * grad^2
  p = p - lr / (1 - beta1^t) * m / (sqrt(v) / sqrt(1 - beta2^t) + eps)

state[i] = {step = t, exp_avg = m, exp_avg_sq = v}, the tensors on the parameter's
device. A step updates a group's parameters of one device and dtype in one call
(em_adam_step_multi_: one kernel launch on cuda).
]]
local ffi = require 'ffi'
local core = require 'ember.ffi'
local create = require 'ember.create'
local compile = require 'ember.compile'
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

  -- A compiled step replays the update at index `at` of its program: before each
  -- replay the bias correction takes the next step count (and the group's rate
  -- of the time); after it the counts move on, unless a guard skipped the update
  -- (a GradScaler's step on inf gradients). Empty parameters have no place in
  -- the call.
  local function replayed(b, g, at, decoupled)
    local items = {}
    for i = 1, b.n do if b[i].p:numel() > 0 then items[#items + 1] = b[i] end end
    local steps = ffi.new('int64_t[?]', math.max(#items, 1))
    compile.on_replay(function(prog)
      for k, it in ipairs(items) do steps[k - 1] = it.s.step + 1 end
      core.check(C.em_program_patch_adam(S, prog, at, #items, steps, g.lr, g.weight_decay,
                                         decoupled))
    end, function(prog)
      if C.em_program_ran(prog, at) == 1 then
        for _, it in ipairs(items) do it.s.step = it.s.step + 1 end
      end
    end)
  end

  local function make(name, decoupled, wd)
    local defaults = { lr = 1e-3, betas = { 0.9, 0.999 }, eps = 1e-8, weight_decay = wd }
    -- One C call for the bucket (one device and dtype: init.lua's step).
    local function update(self, g, b)
      -- A graph would replay this step's bias correction forever (em.cuda.graph).
      if C.em_cuda_capturing(S) >= 0 then
        raise(('%s.step: a step can not be captured in a CUDA graph: its bias '
          .. 'correction changes every step; capture forward and backward, and call '
          .. 'step() after the graph (SGD steps can be captured)'):format(name))
      end
      local n = b.n
      local P, G = ffi.new('em_tensor*[?]', n), ffi.new('const em_tensor*[?]', n)
      local M, V = ffi.new('em_tensor*[?]', n), ffi.new('em_tensor*[?]', n)
      local steps = ffi.new('int64_t[?]', n)
      for i = 1, n do
        local it, s = b[i], b[i].s
        if s.exp_avg == nil then   -- on the parameter's device; once in a compiled step
          s.exp_avg, s.exp_avg_sq = compile.once(function()
            return create.zeros_like(it.p), create.zeros_like(it.p)
          end)
        end
        P[i - 1], G[i - 1], M[i - 1], V[i - 1] = it.h, it.gh, s.exp_avg._h, s.exp_avg_sq._h
        steps[i - 1] = (s.step or 0) + 1
      end
      local st = C.em_adam_step_multi_(S, n, P, G, M, V, steps, g.lr, g.betas[1], g.betas[2],
                                       g.eps, g.weight_decay, decoupled)
      if st == 0 then
        for i = 1, n do b[i].s.step = (b[i].s.step or 0) + 1 end
        if compile.capturing() then replayed(b, g, C.em_compile_recorded(S) - 1, decoupled) end
      end
      return st
    end
    return optim.class(name, defaults, check, update)
  end

  return { Adam = make('Adam', 0, 0), AdamW = make('AdamW', 1, 1e-2) }
end

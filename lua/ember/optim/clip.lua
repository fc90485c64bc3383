--[[
ember.optim.clip -- clip_grad_norm(params, max_norm[, norm_type = 2]), also
em.nn.utils.clip_grad_norm: PyTorch 1.13's clip_grad_norm_. The total norm is the
norm_type-norm of the gradients' norms (math.huge or 'inf': the largest absolute
value); when it exceeds max_norm every gradient is scaled in place by
max_norm / (total + 1e-6). Returns the total norm as a number (0 when no
parameter has a gradient). params: a tensor or a list of tensors.
]]
local ffi = require 'ffi'
local core = require 'ember.ffi'
require 'ember.tensor'
local C, S, wrap, raise, kind = core.C, core.S, core.wrap, core.raise, core.kind
local box_t, istype = core.box_t, ffi.istype

return function(params, max_norm, norm_type)
  local op = 'clip_grad_norm'
  if istype(box_t, params) then params = { params } end
  if type(params) ~= 'table' then
    raise(('%s: expected a tensor or a list of tensors, got %s'):format(op, kind(params)))
  end
  if type(max_norm) ~= 'number' then
    raise(('%s: max_norm must be a number, got %s'):format(op, kind(max_norm)))
  end
  if norm_type == nil then norm_type = 2
  elseif norm_type == 'inf' then norm_type = math.huge end
  if type(norm_type) ~= 'number' then
    raise(('%s: norm_type must be a number or \'inf\', got %s'):format(op, kind(norm_type)))
  end
  local grads = {}
  for i, p in ipairs(params) do
    if not istype(box_t, p) then
      raise(('%s: parameter %d is a %s, not a tensor'):format(op, i, kind(p)))
    end
    local gh = C.em_tensor_grad(p._h)
    if gh ~= nil then grads[#grads + 1] = wrap(gh) end
  end
  if #grads == 0 then return 0 end
  local total
  if norm_type == math.huge then
    total = 0
    for _, g in ipairs(grads) do
      local n = tonumber(g:norm(math.huge):item())
      if n > total or n ~= n then total = n end
    end
  else
    local acc = 0
    for _, g in ipairs(grads) do
      acc = acc + tonumber(g:norm(norm_type):item()) ^ norm_type
    end
    total = acc ^ (1 / norm_type)
  end
  local coef = max_norm / (total + 1e-6)
  if coef < 1 then
    for _, g in ipairs(grads) do g:mul_(coef) end
  end
  return total
end

--[[
ember.optim.clip -- clip_grad_norm(params, max_norm[, norm_type = 2]), also
em.nn.utils.clip_grad_norm: PyTorch 1.13's clip_grad_norm_. The total norm is the
norm_type-norm of the gradients' norms (math.huge or 'inf': the largest absolute
value); when it exceeds max_norm every gradient is scaled in place by
max_norm / (total + 1e-6). Returns the total norm as a number (0 when no
parameter has a gradient). params: a tensor or a list of tensors, on any devices.
The norm's sums run in double in a fixed order (core/ops/optim.c's
em_clip_grad_norm_), so cpu and cuda give the same total.

Shards. The parameters of a sharded model (dm:parameters(), ember.distribute.shard)
are this replica's parts of the full gradient, which no replica holds whole: their
norm is summed (the largest taken, for 'inf') across the replicas, so every
replica computes the norm of the whole gradient and scales its part alike.
Every replica must then call clip_grad_norm, as it calls the optimizer's step.

Pipelines. A pipeline's parameters (pp:parameters(), ember.distribute.pipeline)
are one stage's: the norm is summed across every replica of the pipeline's
strategy -- each stage's D data replicas hold the same averaged gradients, so the
sum is divided by D, unless the stages are sharded (their parts partition each
stage's gradient) -- and every replica clips by the norm of the whole model's
gradient, as one model would.
]]
local ffi = require 'ffi'
local core = require 'ember.ffi'
require 'ember.tensor'
local C, S, wrap, raise, kind = core.C, core.S, core.wrap, core.raise, core.kind
local box_t, istype = core.box_t, ffi.istype

-- Every gradient times max_norm / (total + 1e-6) when that is under 1; total.
local function scale(grads, max_norm, total)
  local coef = max_norm / (total + 1e-6)
  if coef < 1 then
    for _, g in ipairs(grads) do g:mul_(coef) end
  end
  return total
end

-- The norm of gradients spread across the replicas of strategy s (a collective):
-- the sum of their norm_type-th powers over the replicas, divided by copies (how
-- many replicas hold each one; the largest, for 'inf').
local function global_norm(s, grads, max_norm, norm_type, copies)
  local inf = norm_type == math.huge
  local acc = 0
  for _, g in ipairs(grads) do
    if g:numel() > 0 then
      local n = tonumber(g:double():norm(norm_type):item())
      if inf then acc = (n > acc or n ~= n) and n or acc else acc = acc + n ^ norm_type end
    end
  end
  local create = require 'ember.create'
  local t = create.full({ 1 }, acc, { dtype = 'float64', device = s.device })
  s:allreduce(t, inf and 'max' or 'sum')
  acc = tonumber(t:item())
  if not inf then acc = acc / (copies or 1) end
  return scale(grads, max_norm, inf and acc or acc ^ (1 / norm_type))
end

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
  local grads, owner, pipe = {}, nil, nil
  local shard = package.loaded['ember.distribute.shard']
  local pipeline = package.loaded['ember.distribute.pipeline']
  for i, p in ipairs(params) do
    if not istype(box_t, p) then
      raise(('%s: parameter %d is a %s, not a tensor'):format(op, i, kind(p)))
    end
    local gh = C.em_tensor_grad(p._h)
    if gh ~= nil then grads[#grads + 1] = wrap(gh) end
    owner = owner or (shard and shard.owner_of(p))
    pipe = pipe or (pipeline and pipeline.of_parameter(p))
  end
  if pipe then
    return global_norm(pipe.strategy, grads, max_norm, norm_type, owner and 1 or pipe.data_size)
  end
  if owner then return global_norm(owner.strategy, grads, max_norm, norm_type) end
  if #grads == 0 then return 0 end
  -- In C when it can (every gradient contiguous, norm_type > 0): one norm launch
  -- and at most one scaling launch per device and dtype, the sums in double in an
  -- order every backend shares (em_clip_grad_norm_).
  local in_c = norm_type > 0
  for _, g in ipairs(grads) do
    if not in_c or C.em_tensor_is_contiguous(g._h) == 0 then in_c = false; break end
  end
  if in_c then
    local n = #grads
    local hs, out = ffi.new('em_tensor*[?]', n), ffi.new('double[1]')
    for i = 1, n do hs[i - 1] = grads[i]._h end
    if C.em_clip_grad_norm_(S, n, hs, max_norm, norm_type, out) ~= 0 then core.fail() end
    return out[0]
  end
  -- Otherwise (a strided gradient, norm_type <= 0) through the tensor ops.
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
  return scale(grads, max_norm, total)
end

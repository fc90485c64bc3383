--[[
ember.nn.norm_more -- RMSNorm(shape, {eps, elementwise_affine}) and GroupNorm(groups,
channels, {eps, affine}), with their functional twins F.rms_norm(x, shape, weight,
eps) and F.group_norm(x, groups, weight, bias, eps). PyTorch's defaults: weight
ones, bias zeros; RMSNorm's eps nil means the dtype's machine epsilon, GroupNorm's
1e-5. Both are compositions of core ops (autograd follows them).
]]
local em = require 'ember'
local core = require 'ember.ffi'
local raise, kind = core.raise, core.kind

local function shape_str(s) return '[' .. table.concat(s, ',') .. ']' end
local machine_eps = { float32 = 1.1920928955078125e-07, float64 = 2.220446049250313e-16,
  float16 = 0.0009765625, bfloat16 = 0.0078125 }

return function(nn)
  local F, Module = nn.F, nn.Module

  function F.rms_norm(x, shape, weight, eps)
    if not em.is_tensor(x) then raise('rms_norm: expected a tensor input, got ' .. kind(x)) end
    if type(shape) == 'number' then shape = { shape } end
    if type(shape) ~= 'table' then raise('rms_norm: normalized_shape must be a number or a list, got ' .. kind(shape)) end
    local xs, nd = x.shape, #shape
    local ok = nd <= #xs
    for i = 1, nd do if xs[#xs - nd + i] ~= shape[i] then ok = false end end
    if not ok then
      raise(('rms_norm: normalized_shape %s must match the last dims of the input %s')
        :format(shape_str(shape), shape_str(xs)))
    end
    eps = eps or machine_eps[x.dtype] or 1e-6
    local flat = nd == 1 and x or x:flatten(#xs - nd + 1, #xs)
    local ms = (flat * flat):mean(-1, true)
    local y = flat * (ms + eps):rsqrt()
    if nd > 1 then y = y:reshape(xs) end
    if weight ~= nil then y = y * weight end
    return y
  end

  function F.group_norm(x, groups, weight, bias, eps)
    if not em.is_tensor(x) then raise('group_norm: expected a tensor input, got ' .. kind(x)) end
    eps = eps or 1e-5
    local xs = x.shape
    if #xs < 2 then raise(('group_norm: expected an input (N, C, ...), got %s'):format(shape_str(xs))) end
    local N, Cn = xs[1], xs[2]
    if type(groups) ~= 'number' or groups < 1 or Cn % groups ~= 0 then
      raise(('group_norm: the %d channels of the input %s must be divisible by groups %s')
        :format(Cn, shape_str(xs), tostring(groups)))
    end
    local g = x:reshape({ N, groups, -1 })
    local mean = g:mean(3, true)
    local c = g - mean
    local var = (c * c):mean(3, true)
    local y = (c * (var + eps):rsqrt()):reshape(xs)
    if weight ~= nil or bias ~= nil then
      local bshape = { 1, Cn }
      for _ = 3, #xs do bshape[#bshape + 1] = 1 end
      if weight ~= nil then y = y * weight:reshape(bshape) end
      if bias ~= nil then y = y + bias:reshape(bshape) end
    end
    return y
  end

  local RMSNorm = Module:extend('RMSNorm')
  function RMSNorm:init(shape, o)
    o = o or {}
    if type(shape) == 'number' then shape = { shape } end
    self.normalized_shape, self.eps = shape, o.eps
    self.elementwise_affine = o.elementwise_affine ~= false
    if self.elementwise_affine then
      self.weight = nn.Parameter(em.ones(shape, { dtype = o.dtype or 'float32' }))
    end
  end
  function RMSNorm:forward(x) return F.rms_norm(x, self.normalized_shape, self.weight, self.eps) end
  function RMSNorm:extra_repr()
    return ('{%s}, eps=%s'):format(table.concat(self.normalized_shape, ','),
      self.eps and tostring(self.eps) or "the dtype's epsilon")
  end
  nn.RMSNorm = RMSNorm

  local GroupNorm = Module:extend('GroupNorm')
  function GroupNorm:init(groups, channels, o)
    o = o or {}
    if type(groups) ~= 'number' or type(channels) ~= 'number' or groups < 1 or channels % groups ~= 0 then
      raise(('GroupNorm: channels %s must be divisible by groups %s'):format(tostring(channels), tostring(groups)))
    end
    self.num_groups, self.num_channels, self.eps = groups, channels, o.eps or 1e-5
    self.affine = o.affine ~= false
    if self.affine then
      local dt = o.dtype or 'float32'
      self.weight = nn.Parameter(em.ones({ channels }, { dtype = dt }))
      self.bias = nn.Parameter(em.zeros({ channels }, { dtype = dt }))
    end
  end
  function GroupNorm:forward(x)
    if x:dim() < 2 or x.shape[2] ~= self.num_channels then
      raise(('GroupNorm: expected an input (N, %d, ...), got %s'):format(self.num_channels, shape_str(x.shape)))
    end
    return F.group_norm(x, self.num_groups, self.weight, self.bias, self.eps)
  end
  function GroupNorm:extra_repr()
    return ('%d, %d, eps=%g, affine=%s'):format(self.num_groups, self.num_channels, self.eps, tostring(self.affine))
  end
  nn.GroupNorm = GroupNorm
end

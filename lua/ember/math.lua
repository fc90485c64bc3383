--[[
ember.math -- element-wise methods: the unary functions (and their in-place
`_` forms), binary arithmetic and comparisons with a tensor or a number on
either side, add/sub with alpha, clamp, where, and the fills (zero_, fill_,
uniform_, normal_). Each method also exists as a function em.<name>(t, ...).
]]
local ffi = require 'ffi'
local core = require 'ember.ffi'
require 'ember.tensor'
local C, S, wrap, fail, raise, kind = core.C, core.S, core.wrap, core.fail, core.raise, core.kind
local FLOAT32, INT64, BOOL = C.EM_FLOAT32, C.EM_INT64, C.EM_BOOL
local box_t, istype = core.box_t, ffi.istype
local Tensor, H, out = core.Tensor, core.H, core.out
local binop, binop_, unop, number_of = core.binop, core.binop_, core.unop, core.number_of

local M = {}   -- em.* functions defined here

-- -- Unary ------------------------------------------------------------------------
-- Lua names of em_unop's ops (EM_NEG is neg, ...).
local unops = { 'neg', 'abs', 'exp', 'log', 'sqrt', 'rsqrt', 'sin', 'cos', 'tanh', 'sigmoid',
  'relu', 'gelu', 'silu', 'floor', 'ceil', 'round', 'trunc', 'sign', 'reciprocal', 'square',
  'log1p', 'expm1', 'log2', 'log10', 'tan', 'asin', 'acos', 'atan', 'sinh', 'cosh', 'erf',
  'logical_not' }
for _, name in ipairs(unops) do
  local op = C['EM_' .. name:upper()]
  local iname = name .. '_'
  Tensor[name] = function(a) return unop(op, name, a) end
  Tensor[iname] = function(a)
    if C.em_unary_(S, op, H(a, iname, 0)) ~= 0 then fail() end
    return a
  end
end

-- gelu(approximate): 'none' (erf, the default) or 'tanh'.
local function gelu_op(name, approximate)
  if approximate == nil or approximate == 'none' then return C.EM_GELU end
  if approximate == 'tanh' then return C.EM_GELU_TANH end
  raise(("%s: approximate must be 'none' or 'tanh', got %s"):format(name, tostring(approximate)))
end
function Tensor.gelu(a, approximate) return unop(gelu_op('gelu', approximate), 'gelu', a) end
function Tensor.gelu_(a, approximate)
  if C.em_unary_(S, gelu_op('gelu_', approximate), H(a, 'gelu_', 0)) ~= 0 then fail() end
  return a
end
Tensor.negative, Tensor.absolute, Tensor.fix = Tensor.neg, Tensor.abs, Tensor.trunc

-- -- Binary -------------------------------------------------------------------------
local binops = {}
for _, name in ipairs({ 'add', 'sub', 'mul', 'div', 'pow', 'maximum', 'minimum', 'eq', 'ne',
  'lt', 'le', 'gt', 'ge', 'remainder', 'atan2', 'logical_and', 'logical_or' }) do
  binops[name] = C['EM_' .. name:upper()]
end
local inplace = { mul = true, div = true, pow = true, remainder = true, atan2 = true,
  eq = true, ne = true, lt = true, le = true, gt = true, ge = true,
  logical_and = true, logical_or = true }

for name, op in pairs(binops) do
  Tensor[name] = function(a, b) return binop(op, name, a, b) end
  M[name] = Tensor[name]
  if inplace[name] then
    local iname = name .. '_'
    Tensor[iname] = function(a, b) return binop_(op, iname, a, b) end
  end
end
Tensor.multiply, Tensor.divide, Tensor.subtract = Tensor.mul, Tensor.div, Tensor.sub
Tensor.greater, Tensor.less, Tensor.greater_equal, Tensor.less_equal =
  Tensor.gt, Tensor.lt, Tensor.ge, Tensor.le
Tensor.not_equal = Tensor.ne

-- add(u[, alpha]): a + alpha * u; sub(u[, alpha]): a - alpha * u.
local function add_scaled(name, a, b, alpha)
  if type(alpha) ~= 'number' then
    raise(('%s: alpha must be a number, got %s'):format(name, kind(alpha)))
  end
  if istype(box_t, b) and istype(box_t, a) then
    if C.em_add_scaled(S, a._h, b._h, alpha, out) ~= 0 then
      fail()
    end
    return wrap(out[0])
  end
  local s = number_of(b)
  if s == nil or not istype(box_t, a) then
    raise(('%s: expected a tensor and a tensor or number, got %s and %s'):format(name,
      kind(a), kind(b)))
  end
  return binop(C.EM_ADD, name, a, s * alpha)
end

function Tensor.add(a, b, alpha)
  if alpha == nil then return binop(C.EM_ADD, 'add', a, b) end
  return add_scaled('add', a, b, alpha)
end

function Tensor.sub(a, b, alpha)
  if alpha == nil then return binop(C.EM_SUB, 'sub', a, b) end
  return add_scaled('sub', a, b, -alpha)
end
M.add, M.sub = Tensor.add, Tensor.sub

local function add_scaled_(name, a, b, alpha)
  local h = H(a, name, 0)
  if istype(box_t, b) then
    if C.em_add_scaled_(S, h, b._h, alpha) ~= 0 then fail() end
    return a
  end
  local s = number_of(b)
  if s == nil then raise(('%s: expected a tensor or a number, got %s'):format(name, kind(b))) end
  if C.em_binary_scalar_(S, C.EM_ADD, h, s * alpha) ~= 0 then fail() end
  return a
end

function Tensor.add_(a, b, alpha)
  if alpha == nil then
    if istype(box_t, b) and istype(box_t, a) then
      if C.em_binary_(S, 0, a._h, b._h) ~= 0 then fail() end
      return a
    end
    return binop_(C.EM_ADD, 'add_', a, b)
  end
  if type(alpha) ~= 'number' then raise('add_: alpha must be a number, got ' .. kind(alpha)) end
  return add_scaled_('add_', a, b, alpha)
end

function Tensor.sub_(a, b, alpha)
  if alpha == nil then return binop_(C.EM_SUB, 'sub_', a, b) end
  if type(alpha) ~= 'number' then raise('sub_: alpha must be a number, got ' .. kind(alpha)) end
  return add_scaled_('sub_', a, b, -alpha)
end

-- clamp(lo, hi): a nil bound is no bound; NaN stays NaN.
function Tensor.clamp(a, lo, hi)
  local h = H(a, 'clamp', 0)
  lo, hi = lo == nil and -math.huge or lo, hi == nil and math.huge or hi
  if type(lo) ~= 'number' or type(hi) ~= 'number' then
    raise(('clamp: bounds must be numbers or nil, got %s and %s'):format(kind(lo), kind(hi)))
  end
  if C.em_clamp(S, h, lo, hi, out) ~= 0 then fail() end
  return wrap(out[0])
end
function Tensor.clamp_(a, lo, hi)
  local h = H(a, 'clamp_', 0)
  lo, hi = lo == nil and -math.huge or lo, hi == nil and math.huge or hi
  if type(lo) ~= 'number' or type(hi) ~= 'number' then
    raise(('clamp_: bounds must be numbers or nil, got %s and %s'):format(kind(lo), kind(hi)))
  end
  if C.em_clamp_(S, h, lo, hi) ~= 0 then fail() end
  return a
end
Tensor.clip, Tensor.clip_ = Tensor.clamp, Tensor.clamp_
function Tensor.clamp_min(a, lo) return Tensor.clamp(a, lo, nil) end
function Tensor.clamp_max(a, hi) return Tensor.clamp(a, nil, hi) end
function Tensor.clamp_min_(a, lo) return Tensor.clamp_(a, lo, nil) end
function Tensor.clamp_max_(a, hi) return Tensor.clamp_(a, nil, hi) end

-- -- where -----------------------------------------------------------------------------
-- A number operand becomes a 0-D tensor of the other operand's dtype when that
-- keeps its value's kind (torch's scalar rule), else int64 / float32.
local function scalar_like(v, other, name, dev)
  local s = number_of(v)
  if s == nil then
    raise(('%s: expected a tensor or a number, got %s'):format(name, kind(v)))
  end
  local dt
  local integral = s % 1 == 0
  if other then
    dt = core.dtype_of(other._h)
    if not core.is_float[dt] and not integral then dt = FLOAT32 end
    if dt == BOOL and type(v) ~= 'boolean' then dt = integral and INT64 or FLOAT32 end
  else
    dt = type(v) == 'boolean' and BOOL or (integral and INT64 or FLOAT32)
  end
  if C.em_full(S, nil, 0, s, dt, dev, out) ~= 0 then
    fail()
  end
  return wrap(out[0])
end

function M.where(cond, a, b)
  H(cond, 'where', 1)
  local ta, tb = istype(box_t, a), istype(box_t, b)
  -- a number goes where the tensors are: the other operand's device, or cond's
  local dev = C.em_tensor_device((ta and a or tb and b or cond)._h)
  if not ta then a = scalar_like(a, tb and b or nil, 'where', dev) end
  if not tb then b = scalar_like(b, a, 'where', dev) end
  -- Handles are taken only now: making the scalars above may sweep.
  if C.em_where(S, cond._h, a._h, b._h, out) ~= 0 then
    fail()
  end
  return wrap(out[0])
end
-- x:where(cond, y) is where(cond, x, y), as in torch.
function Tensor.where(x, cond, y) return M.where(cond, x, y) end

-- -- Fills -----------------------------------------------------------------------------
function Tensor.fill_(a, v)
  local h = H(a, 'fill_', 0)
  local s = number_of(v)
  if s == nil then
    if istype(box_t, v) and tonumber(C.em_tensor_numel(v._h)) == 1 then s = v:item()
      if type(s) == 'boolean' then s = s and 1 or 0 end
    else raise('fill_: expected a number, got ' .. kind(v)) end
  end
  if C.em_fill_(S, h, s) ~= 0 then fail() end
  return a
end

function Tensor.zero_(a)
  if C.em_fill_(S, H(a, 'zero_', 0), 0) ~= 0 then fail() end
  return a
end

local function num_or(v, def, name, what)
  if v == nil then return def end
  if type(v) ~= 'number' then raise(('%s: %s must be a number, got %s'):format(name, what, kind(v))) end
  return v
end

function Tensor.uniform_(a, lo, hi)
  local h = H(a, 'uniform_', 0)
  if C.em_uniform_(S, h, num_or(lo, 0, 'uniform_', 'from'), num_or(hi, 1, 'uniform_', 'to')) ~= 0 then
    fail()
  end
  return a
end

function Tensor.normal_(a, mean, std)
  local h = H(a, 'normal_', 0)
  if C.em_normal_(S, h, num_or(mean, 0, 'normal_', 'mean'), num_or(std, 1, 'normal_', 'std')) ~= 0 then
    fail()
  end
  return a
end

function Tensor.random_(a, lo, hi)
  local h = H(a, 'random_', 0)
  if hi == nil then lo, hi = 0, lo end
  if type(lo) ~= 'number' or type(hi) ~= 'number' then
    raise('random_: expected integer bounds (lo, hi) or (hi)')
  end
  if C.em_randint_(S, h, lo, hi) ~= 0 then fail() end
  return a
end

return M

--[[
ember.tensor -- the Lua tensor type: the em_box metatype (methods, fields,
indexing, operators) and the inspection methods (size, dim, item, totable, ...).
Other modules add their methods to `Tensor` (the __index table content may
change after ffi.metatype; the metatable itself may not, so every metamethod
is defined here).

Hot paths (`a + b`, `a:add_(b)`) take no varargs, build no tables or closures
and check argument types with ffi.istype; C writes results through one shared
`em_tensor*[1]` out-box, read into a local before anything else can run.
]]
local ffi = require 'ffi'
local core = require 'ember.ffi'
require 'ember.handles'
local C, S, wrap, fail, raise = core.C, core.S, core.wrap, core.fail, core.raise
local box_t, kind = core.box_t, core.kind
local istype, tonumber, type = ffi.istype, tonumber, type
local FLOAT32, FLOAT64, FLOAT16, BFLOAT16 = C.EM_FLOAT32, C.EM_FLOAT64, C.EM_FLOAT16, C.EM_BFLOAT16
local INT32, INT64, UINT8, BOOL = C.EM_INT32, C.EM_INT64, C.EM_UINT8, C.EM_BOOL

local out = ffi.new('em_tensor*[1]')
local out2 = ffi.new('em_tensor*[1]')
core.out, core.out2 = out, out2

local Tensor = {}        -- methods
local getters = {}       -- t.shape, t.dtype, ...: function(t) -> value
local setters = {}       -- t.name = v: function(t, v)
core.Tensor, core.getters, core.setters = Tensor, getters, setters

-- -- Argument checks ---------------------------------------------------------------
-- The handle of tensor argument x (argument number n of op), or an error.
local function H(x, op, n)
  if istype(box_t, x) then return x._h end
  if n == 0 then
    raise(("%s: expected a tensor, got %s (method called with '.' instead of ':'?)"):format(
      op, kind(x)))
  end
  raise(('%s: expected a tensor as argument %d, got %s'):format(op, n, kind(x)))
end
core.H = H

-- -- Element access helpers --------------------------------------------------------
local ptr_ct = {
  [FLOAT32] = ffi.typeof('float *'), [FLOAT64] = ffi.typeof('double *'),
  [FLOAT16] = ffi.typeof('uint16_t *'), [BFLOAT16] = ffi.typeof('uint16_t *'),
  [INT32] = ffi.typeof('int32_t *'), [INT64] = ffi.typeof('int64_t *'),
  [UINT8] = ffi.typeof('uint8_t *'), [BOOL] = ffi.typeof('uint8_t *'),
}
core.ptr_ct = ptr_ct

-- Element k (0-based, in elements from the data pointer) of a CPU tensor.
-- float16 / bfloat16 bits are converted by C, as every op converts them.
local function load(h, dt, k)
  if core.host_access then core.host_access('reading an element') end
  local v = ffi.cast(ptr_ct[dt], C.em_tensor_data(h))[k]
  if dt == FLOAT32 or dt == FLOAT64 then return v end
  if dt == INT64 then return tonumber(v) end
  if dt == BOOL then return v ~= 0 end
  if dt == FLOAT16 then return C.em_half_to_float(v) end
  if dt == BFLOAT16 then return C.em_bfloat16_to_float(v) end
  return v
end
core.load = load

-- Element k of a CPU tensor := number v (converted as fill_ converts it). The
-- caller has called em_tensor_bump_version.
local function store(h, dt, k, v)
  if core.host_access then core.host_access('writing an element') end
  local p = ffi.cast(ptr_ct[dt], C.em_tensor_data(h))
  if dt == FLOAT16 then p[k] = C.em_float_to_half(v)
  elseif dt == BFLOAT16 then p[k] = C.em_float_to_bfloat16(v)
  elseif dt == BOOL then p[k] = v ~= 0 and 1 or 0
  else p[k] = v end
end

-- A 1-based (or negative) index i into a dim of size n -> 0-based.
local function cindex(op, i, n, d, h)
  if type(i) ~= 'number' or i % 1 ~= 0 then
    raise(('%s: index must be an integer, got %s'):format(op,
      type(i) == 'number' and tostring(i) or kind(i)))
  end
  if i >= 1 and i <= n then return i - 1 end
  if i < 0 and i >= -n then return n + i end
  raise(('%s: index %d is out of range for dimension %d of size %d (shape %s, ' ..
    'indices are 1-based)'):format(op, i, d, n, core.shape_str(h)))
end
core.cindex = cindex

-- -- Indexing: t[i], t[i] = v ---------------------------------------------------
local function index_get(t, i)
  local h = t._h
  local n = C.em_tensor_ndim(h)
  if n == 0 then raise("index: can't index a 0-D tensor (use item())") end
  local j = cindex('index', i, tonumber(C.em_tensor_size(h, 0)), 1, h)
  if n == 1 and C.em_tensor_device(h) == -1 then
    return load(h, core.dtype_of(h), j * C.em_tensor_stride(h, 0))
  end
  if C.em_select(S, h, 0, j, out) ~= 0 then fail() end
  if n == 1 then return Tensor.item(wrap(out[0])) end  -- on a device: a read, which waits
  return wrap(out[0])
end

local function index_set(t, i, v)
  local h = t._h
  local n = C.em_tensor_ndim(h)
  if n == 0 then raise("index: can't index a 0-D tensor (use fill_ or copy_)") end
  local j = cindex('index', i, tonumber(C.em_tensor_size(h, 0)), 1, h)
  if type(v) == 'boolean' then v = v and 1 or 0 end
  if type(v) == 'number' then
    -- A CPU vector that autograd does not track: write the element here, after
    -- the version bump every in-place write makes (a backward that saved t
    -- then fails). A tracked one takes the general path below, which refuses
    -- in grad mode with fill_'s message, as it does for any other shape.
    if n == 1 and C.em_tensor_device(h) == -1 and C.em_tensor_requires_grad(h) == 0 then
      if C.em_tensor_bump_version(S, h, 'index') ~= 0 then fail() end
      store(h, core.dtype_of(h), j * C.em_tensor_stride(h, 0), v)
      return
    end
  elseif not istype(box_t, v) then
    raise('index: can only assign a number, a boolean or a tensor, got ' .. kind(v))
  end
  if C.em_select(S, h, 0, j, out) ~= 0 then fail() end
  local view = out[0]
  local st
  if type(v) == 'number' then st = C.em_fill_(S, view, v)
  else st = C.em_copy_(S, view, v._h) end
  C.em_tensor_release(view)
  if st ~= 0 then fail() end
end

-- -- Binary operations shared by operators and methods -------------------------------
local function number_of(x)
  if type(x) == 'number' then return x end
  if type(x) == 'boolean' then return x and 1 or 0 end
  if type(x) == 'cdata' and not istype(box_t, x) then
    local v = tonumber(x)
    if v then return v end
  end
  return nil
end
core.number_of = number_of

-- a op b where either side may be a number (op: em_binop).
local function binop(op, name, a, b)
  if istype(box_t, a) then
    if istype(box_t, b) then
      if C.em_binary(S, op, a._h, b._h, out) ~= 0 then
        fail()
      end
      return wrap(out[0])
    end
    local s = number_of(b)
    if s == nil then
      raise(('%s: expected a tensor or a number, got %s'):format(name, kind(b)))
    end
    if C.em_binary_scalar(S, op, a._h, s, 0, out) ~= 0 then
      fail()
    end
    return wrap(out[0])
  end
  local s = number_of(a)
  if s == nil or not istype(box_t, b) then
    raise(('%s: expected a tensor and a tensor or number, got %s and %s'):format(name,
      kind(a), kind(b)))
  end
  if C.em_binary_scalar(S, op, b._h, s, 1, out) ~= 0 then
    fail()
  end
  return wrap(out[0])
end
core.binop = binop

-- a = a op b in place; returns a.
local function binop_(op, name, a, b)
  if istype(box_t, b) then
    if C.em_binary_(S, op, H(a, name, 0), b._h) ~= 0 then fail() end
    return a
  end
  local s = number_of(b)
  if s == nil then
    raise(('%s: expected a tensor or a number, got %s'):format(name, kind(b)))
  end
  if C.em_binary_scalar_(S, op, H(a, name, 0), s) ~= 0 then fail() end
  return a
end
core.binop_ = binop_

local function unop(op, name, a)
  if not istype(box_t, a) then H(a, name, 1) end
  if C.em_unary(S, op, a._h, out) ~= 0 then fail() end
  return wrap(out[0])
end
core.unop = unop

-- -- The metatable -------------------------------------------------------------------
local mt = {}
core.mt = mt

mt.__index = function(t, k)
  local m = Tensor[k]
  if m ~= nil then return m end
  if type(k) == 'number' then return index_get(t, k) end
  local g = getters[k]
  if g ~= nil then return g(t) end
  return nil
end

mt.__newindex = function(t, k, v)
  if type(k) == 'number' then return index_set(t, k, v) end
  local s = setters[k]
  if s ~= nil then return s(t, v) end
  raise(("tensor: can't set field '%s'"):format(tostring(k)))
end

mt.__len = function(t)
  local h = t._h
  if C.em_tensor_ndim(h) == 0 then raise('len: a 0-D tensor has no length') end
  return tonumber(C.em_tensor_size(h, 0))
end

local EM_ADD, EM_SUB, EM_MUL, EM_DIV = C.EM_ADD, C.EM_SUB, C.EM_MUL, C.EM_DIV
local EM_POW, EM_REMAINDER, EM_NEG = C.EM_POW, C.EM_REMAINDER, C.EM_NEG
mt.__add = function(a, b) return binop(EM_ADD, 'add', a, b) end
mt.__sub = function(a, b) return binop(EM_SUB, 'sub', a, b) end
mt.__mul = function(a, b) return binop(EM_MUL, 'mul', a, b) end
mt.__div = function(a, b) return binop(EM_DIV, 'div', a, b) end
-- `^` calls through core.meta_ops.pow: a metatype's metatable can't change once
-- set, and the autocast policy wraps pow there (ember.amp.policy).
local meta_ops = { pow = function(a, b) return binop(EM_POW, 'pow', a, b) end }
core.meta_ops = meta_ops
mt.__pow = function(a, b) return meta_ops.pow(a, b) end
mt.__mod = function(a, b) return binop(EM_REMAINDER, 'remainder', a, b) end
mt.__unm = function(a) return unop(EM_NEG, 'neg', a) end
mt.__tostring = function(t) return require('ember.format').tostring(t) end
mt.__concat = function(a, b)
  return (istype(box_t, a) and tostring(a) or a) .. (istype(box_t, b) and tostring(b) or b)
end

ffi.metatype(box_t, mt)

-- -- Inspection ------------------------------------------------------------------------
getters.shape = function(t) return core.shape_of(t._h) end
getters.dtype = function(t) return core.dtype_names[core.dtype_of(t._h)] end
getters.device = function(t) return core.device_name(C.em_tensor_device(t._h)) end
getters.ndim = function(t) return C.em_tensor_ndim(t._h) end
getters.is_cuda = function(t) return C.em_tensor_device(t._h) >= 0 end

function Tensor.size(t, d)
  local h = H(t, 'size', 0)
  if d == nil then return core.shape_of(h) end
  return tonumber(C.em_tensor_size(h, core.cdim('size', h, d)))
end

function Tensor.stride(t, d)
  local h = H(t, 'stride', 0)
  if d == nil then
    local n, st, r = C.em_tensor_ndim(h), C.em_tensor_strides(h), {}
    for i = 1, n do r[i] = tonumber(st[i - 1]) end
    return r
  end
  return tonumber(C.em_tensor_stride(h, core.cdim('stride', h, d)))
end

function Tensor.dim(t) return C.em_tensor_ndim(H(t, 'dim', 0)) end
Tensor.ndimension = Tensor.dim
function Tensor.numel(t) return tonumber(C.em_tensor_numel(H(t, 'numel', 0))) end
Tensor.nelement = Tensor.numel
function Tensor.is_contiguous(t) return C.em_tensor_is_contiguous(H(t, 'is_contiguous', 0)) ~= 0 end
function Tensor.is_floating_point(t) return core.is_float[core.dtype_of(H(t, 'is_floating_point', 0))] end
function Tensor.element_size(t) return tonumber(C.em_dtype_size(core.dtype_of(H(t, 'element_size', 0)))) end
function Tensor.storage_offset(t) return tonumber(C.em_tensor_offset(H(t, 'storage_offset', 0))) end
function Tensor.data_ptr(t)
  if core.host_access then core.host_access('data_ptr') end
  return C.em_tensor_data(H(t, 'data_ptr', 0))
end
function Tensor.same_storage(t, u)
  return C.em_tensor_same_storage(H(t, 'same_storage', 0), H(u, 'same_storage', 1)) ~= 0
end

local dbox = ffi.new('double[1]')
local ibox = ffi.new('int64_t[1]')
function Tensor.item(t)
  local h = H(t, 'item', 0)
  if core.host_access then core.host_access('item', t) end
  local dt = core.dtype_of(h)
  if dt == INT64 or dt == INT32 then
    if C.em_tensor_item_int(S, h, ibox) ~= 0 then fail() end
    return tonumber(ibox[0])
  end
  if C.em_tensor_item(S, h, dbox) ~= 0 then fail() end
  if dt == BOOL then return dbox[0] ~= 0 end
  return dbox[0]
end

-- A contiguous CPU copy readable from Lua: float64 for floating dtypes, int64
-- for integers, uint8 for bool. Returns handle (owned), typed data pointer.
function core.readable(h)
  if core.host_access then core.host_access('reading values (totable, tostring)') end
  local dt = core.dtype_of(h)
  local want = core.is_float[dt] and FLOAT64 or (dt == BOOL and BOOL or INT64)
  if C.em_to(S, h, want, C.EM_CPU, out) ~= 0 then fail() end
  local a = out[0]
  local st = C.em_contiguous(S, a, out)
  C.em_tensor_release(a)
  if st ~= 0 then fail() end
  local c = out[0]
  return c, ffi.cast(ptr_ct[want], C.em_tensor_data(c)), want
end

function Tensor.totable(t)
  local h = H(t, 'totable', 0)
  local c, p, want = core.readable(h)
  local shape = core.shape_of(h)
  local n = #shape
  local k = 0
  local function get()
    local v = p[k]
    k = k + 1
    if want == 5 then return tonumber(v) end
    if want == 7 then return v ~= 0 end
    return v
  end
  local function build(d)
    local r = {}
    if d == n then
      for i = 1, shape[d] do r[i] = get() end
    else
      for i = 1, shape[d] do r[i] = build(d + 1) end
    end
    return r
  end
  local ok, res = pcall(function()
    if n == 0 then return get() end
    return build(1)
  end)
  C.em_tensor_release(c)
  if not ok then error(res, 0) end
  return res
end
Tensor.tolist = Tensor.totable

return Tensor

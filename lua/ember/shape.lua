--[[
ember.shape -- views (view reshape flatten transpose t permute narrow select
squeeze unsqueeze expand and the *_as forms), copies (clone contiguous copy_)
and conversions (to, float double half bfloat16 int long byte bool, cpu, cuda).

Dims and indices are 1-based here and validated before C sees them, so every
message speaks the user's numbering. A conversion that changes nothing returns
the tensor itself, as torch does.
]]
local ffi = require 'ffi'
local core = require 'ember.ffi'
require 'ember.tensor'
local C, S, wrap, fail, raise, kind = core.C, core.S, core.wrap, core.fail, core.raise, core.kind
local box_t, istype = core.box_t, ffi.istype
local Tensor, H, out = core.Tensor, core.H, core.out
local cdim, cindex = core.cdim, core.cindex

-- -- Shape-taking views ------------------------------------------------------------
local function shape_view(name, fn)
  return function(a, ...)
    local h = H(a, name, 0)
    local n, opts, shape = core.parse_shape(name, true, ...)
    if opts ~= nil then raise(name .. ': unexpected options table') end
    if fn(S, h, shape, n, out) ~= 0 then fail() end
    return wrap(out[0])
  end
end
Tensor.view = shape_view('view', C.em_view)
Tensor.reshape = shape_view('reshape', C.em_reshape)
Tensor.expand = shape_view('expand', C.em_expand)

function Tensor.view_as(a, b) return Tensor.view(a, core.shape_of(H(b, 'view_as', 1))) end
function Tensor.reshape_as(a, b) return Tensor.reshape(a, core.shape_of(H(b, 'reshape_as', 1))) end
function Tensor.expand_as(a, b) return Tensor.expand(a, core.shape_of(H(b, 'expand_as', 1))) end

-- flatten([s[, e]]): dims s..e merged into one (all by default).
function Tensor.flatten(a, s, e)
  local h = H(a, 'flatten', 0)
  local shape = core.shape_of(h)
  local n = #shape
  if n == 0 then return Tensor.reshape(a, { 1 }) end
  local s0 = s == nil and 0 or cdim('flatten', h, s)
  local e0 = e == nil and n - 1 or cdim('flatten', h, e)
  if s0 > e0 then
    raise(('flatten: start dim %d comes after end dim %d'):format(s, e == nil and -1 or e))
  end
  if s0 == e0 then return a end
  local new, m = {}, 1
  for i = 1, s0 do new[#new + 1] = shape[i] end
  for i = s0 + 1, e0 + 1 do m = m * shape[i] end
  new[#new + 1] = m
  for i = e0 + 2, n do new[#new + 1] = shape[i] end
  return Tensor.reshape(a, new)
end

-- -- Dim-taking views ---------------------------------------------------------------
function Tensor.transpose(a, d1, d2)
  local h = H(a, 'transpose', 0)
  if C.em_transpose(S, h, cdim('transpose', h, d1), cdim('transpose', h, d2), out) ~= 0 then
    fail()
  end
  return wrap(out[0])
end

-- t(): the transpose of a matrix; vectors and scalars come back as they are.
function Tensor.t(a)
  local h = H(a, 't', 0)
  local n = C.em_tensor_ndim(h)
  if n > 2 then
    raise(('t: expects a tensor with at most 2 dims, got shape %s (use transpose)'):format(
      core.shape_str(h)))
  end
  if n < 2 then return a end
  if C.em_transpose(S, h, 0, 1, out) ~= 0 then fail() end
  return wrap(out[0])
end

local perm_buf = ffi.new('int[8]')
function Tensor.permute(a, ...)
  local h = H(a, 'permute', 0)
  local dims = ...
  if type(dims) ~= 'table' then dims = { ... } end
  local n = C.em_tensor_ndim(h)
  if #dims ~= n then
    raise(('permute: got %d dims for a %d-D tensor of shape %s'):format(#dims, n,
      core.shape_str(h)))
  end
  local seen = {}
  for i = 1, n do
    local d = cdim('permute', h, dims[i])
    if seen[d] then raise(('permute: dim %d appears more than once'):format(dims[i])) end
    seen[d] = true
    perm_buf[i - 1] = d
  end
  if C.em_permute(S, h, perm_buf, n, out) ~= 0 then fail() end
  return wrap(out[0])
end

-- narrow(dim, start, length): start is 1-based (negative from the end).
function Tensor.narrow(a, dim, start, length)
  local h = H(a, 'narrow', 0)
  local d = cdim('narrow', h, dim)
  local size = tonumber(C.em_tensor_size(h, d))
  if type(length) ~= 'number' or length % 1 ~= 0 or length < 0 then
    raise('narrow: length must be a non-negative integer, got ' ..
      (type(length) == 'number' and tostring(length) or kind(length)))
  end
  local s
  if start == size + 1 and length == 0 then s = size
  else s = cindex('narrow', start, size, dim, h) end
  if s + length > size then
    raise(('narrow: start %d + length %d goes past the end of dimension %d (size %d)'):format(
      start, length, dim, size))
  end
  if C.em_narrow(S, h, d, s, length, out) ~= 0 then fail() end
  return wrap(out[0])
end

-- select(dim, i): removes dim, keeping slice i (1-based).
function Tensor.select(a, dim, i)
  local h = H(a, 'select', 0)
  if C.em_tensor_ndim(h) == 0 then raise("select: can't select from a 0-D tensor") end
  local d = cdim('select', h, dim)
  local j = cindex('select', i, tonumber(C.em_tensor_size(h, d)), dim, h)
  if C.em_select(S, h, d, j, out) ~= 0 then fail() end
  return wrap(out[0])
end

function Tensor.squeeze(a, dim)
  local h = H(a, 'squeeze', 0)
  local st
  if dim == nil then st = C.em_squeeze(S, h, -1, 1, out)
  else st = C.em_squeeze(S, h, cdim('squeeze', h, dim), 0, out) end
  if st ~= 0 then fail() end
  return wrap(out[0])
end

-- unsqueeze(d): a new dim of size 1 at position d (1..ndim+1; -1 = after the last).
function Tensor.unsqueeze(a, dim)
  local h = H(a, 'unsqueeze', 0)
  if C.em_unsqueeze(S, h, cdim('unsqueeze', h, dim, 1), out) ~= 0 then fail() end
  return wrap(out[0])
end

-- -- Copies -----------------------------------------------------------------------------
function Tensor.clone(a)
  if C.em_clone(S, H(a, 'clone', 0), out) ~= 0 then
    fail()
  end
  return wrap(out[0])
end

-- A result that is the input's own handle comes back as the input itself.
local function same_or_wrap(a, h)
  if h == a._h then
    C.em_tensor_release(h)
    return a
  end
  return wrap(h)
end

function Tensor.contiguous(a)
  if C.em_contiguous(S, H(a, 'contiguous', 0), out) ~= 0 then
    fail()
  end
  return same_or_wrap(a, out[0])
end

function Tensor.copy_(a, src)
  local h = H(a, 'copy_', 0)
  if C.em_copy_(S, h, H(src, 'copy_', 1)) ~= 0 then fail() end
  return a
end

-- -- Conversions --------------------------------------------------------------------------
local function convert(a, name, dt, dev)
  if C.em_to(S, a._h, dt, dev, out) ~= 0 then fail() end
  return same_or_wrap(a, out[0])
end

-- to(dtype | device | tensor | {dtype=, device=}); a dtype and a device may
-- also come as two arguments.
function Tensor.to(a, x, y)
  local h = H(a, 'to', 0)
  local dt, dev = core.dtype_of(h), C.em_tensor_device(h)
  local function one(v)
    if type(v) == 'string' then
      local id = core.dtype_ids[v]
      if id == nil and (v == 'float' or v == 'double' or v == 'half' or v == 'int' or
          v == 'long' or v == 'byte') then
        id = core.dtype_id(v, 'to')
      end
      if id ~= nil then dt = id
      else dev = core.device_id(v, 'to') end
    elseif istype(box_t, v) then
      dt, dev = core.dtype_of(v._h), C.em_tensor_device(v._h)
    elseif type(v) == 'table' then
      if v.dtype ~= nil then dt = core.dtype_id(v.dtype, 'to') end
      if v.device ~= nil then dev = core.device_id(v.device, 'to') end
    elseif v ~= nil then
      raise('to: expected a dtype name, a device, a tensor or an options table, got ' .. kind(v))
    end
  end
  one(x)
  one(y)
  return convert(a, 'to', dt, dev)
end

for name, dt in pairs({ float = C.EM_FLOAT32, double = C.EM_FLOAT64, half = C.EM_FLOAT16,
  bfloat16 = C.EM_BFLOAT16, int = C.EM_INT32, long = C.EM_INT64, byte = C.EM_UINT8,
  bool = C.EM_BOOL }) do
  Tensor[name] = function(a)
    return convert(a, name, dt, C.em_tensor_device(H(a, name, 0)))
  end
end

-- type(): the dtype name; type(name) converts, as torch's t.type(dtype).
function Tensor.type(a, dt)
  local h = H(a, 'type', 0)
  if dt == nil then return core.dtype_names[core.dtype_of(h)] end
  return convert(a, 'type', core.dtype_id(dt, 'type'), C.em_tensor_device(h))
end

function Tensor.cpu(a)
  return convert(a, 'cpu', core.dtype_of(H(a, 'cpu', 0)), C.EM_CPU)
end

-- cuda([i]): device i (0-based; the current device, em.cuda.set_device, without
-- it); the error names cuda, not the generic to.
function Tensor.cuda(a, i)
  local h = H(a, 'cuda', 0)
  local dev = i == nil and C.em_cuda_current_device(S) or core.device_id(i, 'cuda')
  if C.em_to(S, h, core.dtype_of(h), dev, out) ~= 0 then
    raise('cuda: ' .. (core.errmsg():gsub('^to: ', '')))
  end
  return same_or_wrap(a, out[0])
end

-- pin_memory(): a copy in pinned host memory, whose :cuda() is asynchronous
-- (it runs on the device's copy stream; don't write the pinned tensor until
-- the device tensor was read or em.cuda.synchronize() ran). is_pinned().
function Tensor.pin_memory(a)
  if C.em_tensor_pin_memory(S, H(a, 'pin_memory', 0), out) ~= 0 then fail() end
  return same_or_wrap(a, out[0])
end

function Tensor.is_pinned(a)
  return C.em_tensor_is_pinned(H(a, 'is_pinned', 0)) ~= 0
end

return Tensor

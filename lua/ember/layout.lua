--[[
ember.layout -- memory formats of 4-D tensors (channels last).

t:to_channels_last() gives t in NHWC memory order (same shape (N,C,H,W) and
values; strides (H*W*C, 1, W*C, C)), t itself when it already has those strides.
t:is_contiguous('channels_last') asks for that order; t:is_contiguous() and
t:is_contiguous('contiguous_format') for the default one. t:contiguous() of an
NHWC tensor is NCHW, as torch's. t:to{memory_format = ...} converts as well (with
dtype/device in the same table). Module:to{memory_format = ...} reorders the 4-D
parameters and buffers of a module in place of their data, so the Parameter
objects (and an optimizer's references to them) stay the same.
em.layout_conversions() counts the copies that reordered a tensor between NCHW
and NHWC (asked for or made inside an op); the profiler shows them as the op
'convert_layout'.
]]
local core = require 'ember.ffi'
require 'ember.tensor'
require 'ember.shape'
local C, S, wrap, fail, raise = core.C, core.S, core.wrap, core.fail, core.raise
local Tensor, H, out = core.Tensor, core.H, core.out

local M = {}

local formats = { channels_last = true, contiguous_format = false, preserve_format = 'keep' }
local function format_of(v, op)
  local f = formats[v]
  if f == nil then
    raise(("%s: unknown memory_format '%s' (channels_last, contiguous_format or "
      .. "preserve_format)"):format(op, tostring(v)))
  end
  return f
end
M.format_of = format_of

function Tensor.to_channels_last(t)
  local h = H(t, 'to_channels_last', 0)
  if C.em_to_channels_last(S, h, out) ~= 0 then fail() end
  if out[0] == h then
    C.em_tensor_release(h)
    return t
  end
  return wrap(out[0])
end

local is_contiguous = Tensor.is_contiguous
function Tensor.is_contiguous(t, memory_format)
  if memory_format == nil or format_of(memory_format, 'is_contiguous') == false then
    return is_contiguous(t)
  end
  if memory_format == 'preserve_format' then
    raise("is_contiguous: memory_format 'preserve_format' is not a layout to test")
  end
  return C.em_tensor_is_channels_last(H(t, 'is_contiguous', 0)) ~= 0
end

-- to{memory_format = ...} (with or without dtype/device): the conversion, then the layout.
local to = Tensor.to
function Tensor.to(a, x, y)
  local fmt
  for _, v in ipairs({ x, y }) do
    if type(v) == 'table' and v.memory_format ~= nil then fmt = format_of(v.memory_format, 'to') end
  end
  if fmt == nil then return to(a, x, y) end
  local r = a
  local rest = {}
  for _, v in ipairs({ x, y }) do
    if type(v) == 'table' then
      if v.dtype ~= nil or v.device ~= nil then r = to(r, { dtype = v.dtype, device = v.device }) end
    elseif v ~= nil then
      r = to(r, v)
    end
  end
  if fmt == 'keep' or r:dim() ~= 4 then return r end
  if fmt then return r:to_channels_last() end
  return r:contiguous()
end

-- In place of t's data (the handle, and so the Lua object, stays): for modules.
function M.set_memory_format_(t, channels_last)
  if C.em_tensor_set_memory_format_(S, H(t, 'set_memory_format_', 0), channels_last and 1 or 0) ~= 0 then
    fail()
  end
  return t
end

function M.layout_conversions() return tonumber(C.em_layout_conversions(S)) end

function M.install(em)
  em.layout_conversions = M.layout_conversions
  em.channels_last, em.contiguous_format = 'channels_last', 'contiguous_format'
  em.preserve_format = 'preserve_format'
end

return M

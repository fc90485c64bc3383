--[[
ember.compile.args -- a compiled step's arguments and results: the signature that
keys its captures (each tensor argument's device, dtype, requires_grad, shape and
strides, and every other argument's value -- tables, functions and modules by
identity -- top level and one level into plain tables such as a batch {x, y}),
the static copies of its tensor arguments that a replay reads, and the copies of
its results handed back to the caller.
]]
local ffi = require 'ffi'
local core = require 'ember.ffi'
local C, S = core.C, core.S
local box_t, istype = core.box_t, ffi.istype

local M = {}

local function tensor_sig(t)
  local h = t._h
  local parts = { t.device, t.dtype, t.requires_grad and 'g' or '' }
  for d = 0, C.em_tensor_ndim(h) - 1 do
    parts[#parts + 1] = tonumber(C.em_tensor_size(h, d)) .. '/' .. tonumber(C.em_tensor_stride(h, d))
  end
  return table.concat(parts, ',')
end

function M.plain(v) return type(v) == 'table' and getmetatable(v) == nil end
local plain = M.plain

local function sorted_keys(tab)
  local keys = {}
  for k in pairs(tab) do keys[#keys + 1] = k end
  table.sort(keys, function(a, b) return tostring(a) < tostring(b) end)
  return keys
end

-- The signature of args ({n = ...}) as one string.
function M.signature(args)
  local parts = {}
  local function one(v)
    if istype(box_t, v) then return 'T(' .. tensor_sig(v) .. ')' end
    local tv = type(v)
    if tv == 'number' or tv == 'boolean' or tv == 'string' or tv == 'nil' then
      return tv:sub(1, 1) .. tostring(v)
    end
    return tv .. ':' .. tostring(v)   -- tables, functions, modules: by identity
  end
  for i = 1, args.n do
    local v = args[i]
    if plain(v) then
      local inner = {}
      for _, k in ipairs(sorted_keys(v)) do inner[#inner + 1] = tostring(k) .. '=' .. one(v[k]) end
      parts[i] = '{' .. table.concat(inner, ';') .. '}'
    else
      parts[i] = one(v)
    end
  end
  return table.concat(parts, '|')
end

-- Visits the tensors among the arguments: fn(tensor, i) at the top level,
-- fn(tensor, i, key) one level into a plain table, in a fixed order.
function M.each_tensor(args, fn)
  for i = 1, args.n do
    local v = args[i]
    if istype(box_t, v) then fn(v, i)
    elseif plain(v) then
      for _, k in ipairs(sorted_keys(v)) do if istype(box_t, v[k]) then fn(v[k], i, k) end end
    end
  end
end

-- A tensor of t's shape, dtype, device and strides, holding t's values: the
-- step is captured on the layout it is given (a transposed or broadcast input
-- takes the kernels it takes eagerly, so the results keep the eager bits).
local out_box = ffi.new('em_tensor*[1]')
function M.static_like(t)
  if t:is_contiguous() then return t:clone() end
  local h, n = t._h, C.em_tensor_ndim(t._h)
  local sizes, strides, span = ffi.new('int64_t[?]', n), ffi.new('int64_t[?]', n), 1
  for d = 0, n - 1 do
    sizes[d], strides[d] = C.em_tensor_size(h, d), C.em_tensor_stride(h, d)
    if strides[d] < 0 then return t:clone() end
    if sizes[d] > 0 then span = span + (sizes[d] - 1) * strides[d] end
  end
  local flat = require('ember').empty(tonumber(span), { dtype = t.dtype, device = t.device })
  core.check(C.em_as_strided(S, flat._h, sizes, strides, n, 0, out_box))
  local s = core.wrap(out_box[0])
  M.fill(s, t)
  return s
end

-- static := t, both of one layout: along a broadcast dim (stride 0) one slice
-- is all there is to copy (and copy_ refuses to write the same element twice).
function M.fill(static, t)
  local h = static._h
  for d = 0, C.em_tensor_ndim(h) - 1 do
    if C.em_tensor_stride(h, d) == 0 and C.em_tensor_size(h, d) > 1 then
      static, t = static:narrow(d + 1, 1, 1), t:narrow(d + 1, 1, 1)
    end
  end
  static:copy_(t)
end

-- The argument at path (i, k): args[i], or args[i][k].
function M.at(args, i, k) if k == nil then return args[i] end return args[i][k] end

-- Copies of the tensors in results (top level and one level into plain tables).
function M.own(res)
  local out = { n = res.n }
  local function copy(v) if istype(box_t, v) then return v:detach():clone() end return v end
  for i = 1, res.n do
    local v = res[i]
    if M.plain(v) then
      local t = {}
      for k, x in pairs(v) do t[k] = copy(x) end
      out[i] = t
    else
      out[i] = copy(v)
    end
  end
  return out
end

return M

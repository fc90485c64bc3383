--[[
ember.compile.signature -- what keys a compiled step's captures: each tensor
argument's device, dtype, requires_grad, shape and strides, and every other
argument's value (tables, functions and modules by identity), top level and one
level into plain tables such as a batch {x, y}.
]]
local ffi = require 'ffi'
local core = require 'ember.ffi'
local C = core.C
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

return M

--[[
ember.ffi_args -- the argument helpers of ember.ffi, installed onto its `core`
table: dtype names and ids, device names and ids, shapes (parse_shape,
parse_opts, shape_of, shape_str) and 1-based dims (cdim).

  require('ember.ffi_args')(core)   -- ember.ffi, once C, S, raise, kind and box_t are set

It is a function of core rather than a module that requires ember.ffi, which
loads it while it is itself being loaded.
]]
local ffi = require 'ffi'

return function(core)
local C, S, raise, kind = core.C, core.S, core.raise, core.kind
local box_t, istype = core.box_t, ffi.istype

-- -- Dtypes ----------------------------------------------------------------------------
-- Ids are em_dtype's values; names and kinds come from the core.
local dtype_names, dtype_ids, is_float = {}, {}, {}
for i = 0, C.EM_NUM_DTYPES - 1 do
  dtype_names[i] = ffi.string(C.em_dtype_name(i))
  dtype_ids[dtype_names[i]] = i
  is_float[i] = C.em_dtype_is_floating(i) ~= 0
end
local aliases = { float = C.EM_FLOAT32, double = C.EM_FLOAT64, half = C.EM_FLOAT16,
  int = C.EM_INT32, long = C.EM_INT64, byte = C.EM_UINT8 }
core.dtype_names, core.dtype_ids = dtype_names, dtype_ids
core.is_float = is_float

function core.dtype_id(name, op)
  local id = dtype_ids[name] or aliases[name]
  if id then return id end
  raise(('%s: unknown dtype %s (expected float32, float64, float16, bfloat16, int32, ' ..
    'int64, uint8 or bool)'):format(op, type(name) == 'string' and "'" .. name .. "'" or
    'of type ' .. kind(name)))
end

-- -- Devices -----------------------------------------------------------------------
-- Names resolve through the core's registry (em_device_parse): 'cpu' -> -1,
-- 'meta' -> -2, 'cuda' -> the current device (em.cuda.set_device; 0 by default),
-- 'cuda:N' -> N (0-based, as CUDA numbers them).
-- Each name is asked once; a device number passes as it is.
local device_ids = { cpu = -1 }
local device_out = ffi.new('int[1]')
function core.device_id(d, op)
  if d == nil then return -1 end
  local id = device_ids[d]
  if id then return id end
  if type(d) == 'string' then
    if C.em_device_parse(S, d, device_out) ~= 0 then
      raise(('%s: unknown device \'%s\' (expected \'cpu\', \'meta\', \'cuda\' or ' ..
        '\'cuda:N\')'):format(op, d))
    end
    id = device_out[0]
    -- ('cuda' alone follows em.cuda.set_device: asked each time)
    if d ~= 'cuda' then device_ids[d] = id end
    return id
  elseif type(d) == 'number' and d >= -2 and d % 1 == 0 then
    return d
  end
  raise(('%s: unknown device %s (expected \'cpu\', \'meta\', \'cuda\' or \'cuda:N\')')
    :format(op, 'of type ' .. kind(d)))
end

function core.device_name(id)
  if id == -1 then return 'cpu' end
  if id == -2 then return 'meta' end
  return 'cuda:' .. id
end

-- -- Shapes -------------------------------------------------------------------------
local MAXD = 8
core.MAXD = MAXD
local shape_buf = ffi.new('int64_t[8]')
local shape_buf2 = ffi.new('int64_t[8]')
core.shape_buf2 = shape_buf2

local function bad_size(op, v)
  raise(('%s: sizes must be non-negative integers, got %s'):format(op,
    type(v) == 'number' and tostring(v) or kind(v)))
end

-- A shape from varargs (numbers, then maybe an options table or a dtype name) or
-- from one table (then maybe the same). Fills shape_buf; returns ndim, opts.
-- allow_neg lets -1 through (view/reshape/expand, which take no options).
function core.parse_shape(op, allow_neg, a1, ...)
  local n, opts = 0, nil
  if type(a1) == 'table' and not istype(box_t, a1) and (a1[1] ~= nil or next(a1) == nil) then
    n = #a1
    if n > MAXD then raise(('%s: %d dimensions (at most %d)'):format(op, n, MAXD)) end
    for i = 1, n do
      local v = a1[i]
      if type(v) ~= 'number' or v % 1 ~= 0 or (v < 0 and not (allow_neg and v == -1)) then
        bad_size(op, v)
      end
      shape_buf[i - 1] = v
    end
    opts = ...
  else
    local nargs = select('#', ...) + 1
    for i = 1, nargs do
      local v
      if i == 1 then v = a1 else v = select(i - 1, ...) end
      if (type(v) == 'table' and not istype(box_t, v)) or
         (type(v) == 'string' and not allow_neg and i > 1) then
        opts = v
        if i ~= nargs then
          raise(op .. ': the options table must come last')
        end
        break
      elseif v == nil and i == nargs then
        break
      end
      if type(v) ~= 'number' or v % 1 ~= 0 or (v < 0 and not (allow_neg and v == -1)) then
        bad_size(op, v)
      end
      if n >= MAXD then raise(('%s: more than %d dimensions'):format(op, MAXD)) end
      shape_buf[n] = v
      n = n + 1
    end
  end
  if opts ~= nil and type(opts) ~= 'table' and not (type(opts) == 'string' and not allow_neg) then
    raise(op .. ': expected an options table or a dtype name after the shape, got ' .. kind(opts))
  end
  return n, opts, shape_buf
end

-- Options {dtype=, device=} with defaults; a bare dtype string is accepted too.
function core.parse_opts(op, opts, def_dtype, def_device)
  if opts == nil then return def_dtype, def_device or -1 end
  if type(opts) == 'string' then return core.dtype_id(opts, op), def_device or -1 end
  if type(opts) ~= 'table' then
    raise(op .. ': expected an options table, got ' .. kind(opts))
  end
  local dt, dev = def_dtype, def_device or -1
  if opts.dtype ~= nil then dt = core.dtype_id(opts.dtype, op) end
  if opts.device ~= nil then dev = core.device_id(opts.device, op) end
  return dt, dev
end

-- The dtype of a handle as a Lua number (C returns an enum cdata).
local em_tensor_dtype = C.em_tensor_dtype
function core.dtype_of(h) return tonumber(em_tensor_dtype(h)) end

-- Shape of a tensor handle as a Lua list.
function core.shape_of(h)
  local n = C.em_tensor_ndim(h)
  local sz = C.em_tensor_sizes(h)
  local t = {}
  for i = 1, n do t[i] = tonumber(sz[i - 1]) end
  return t
end

-- "[2,3]" for messages.
function core.shape_str(h)
  return '[' .. table.concat(core.shape_of(h), ',') .. ']'
end

-- -- Dimensions ------------------------------------------------------------------------
-- A 1-based (or negative, from the end) dim of a tensor with n dims -> 0-based.
-- extra = 1 for dims that may point one past the end (unsqueeze, stack).
function core.cdim(op, h, d, extra)
  local n = C.em_tensor_ndim(h) + (extra or 0)
  local m = n > 0 and n or 1
  if type(d) ~= 'number' or d % 1 ~= 0 then
    raise(('%s: dim must be an integer, got %s'):format(op,
      type(d) == 'number' and tostring(d) or kind(d)))
  end
  if d >= 1 and d <= m then return d - 1 end
  if d < 0 and d >= -m then return d + m end
  local range = d == 0 and ' (dims are 1-based)' or ''
  raise(('%s: dimension %d out of range for a %d-D tensor of shape %s%s'):format(op, d,
    n - (extra or 0), core.shape_str(h), range))
end
end

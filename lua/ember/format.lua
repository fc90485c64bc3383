--[==[
ember.format -- tostring(t) in PyTorch's style (torch/_tensor_str.py):

  tensor([[ 0.1000, -2.0000],
          [ 3.5000,  4.0000]])
  [float32 tensor of size 2x2 on cpu]

One formatter per tensor picks the notation from the values shown: integers
only -> "1." style, a wide range (max/min > 1000, max > 1e8 or min < 1e-4)
-> "%.4e", else "%.4f"; every element is right-aligned to the widest. Tensors
of more than 1000 elements are summarized with the first and last 3 entries of
each dim around "...". Rows longer than 80 columns wrap. The footer names
dtype, size and device (Torch7's habit), which torch puts in the repr instead.
]==]
local core = require 'ember.ffi'
require 'ember.tensor'
local C = core.C

local M = {}
local opts = { precision = 4, threshold = 1000, edgeitems = 3, linewidth = 80 }
M.options = opts

local function isfinite(v) return v == v and v ~= math.huge and v ~= -math.huge end

local function fmt_special(v)
  if v ~= v then return 'nan' end
  if v == math.huge then return 'inf' end
  if v == -math.huge then return '-inf' end
end

-- A formatter over the values that will be shown.
local function formatter(vals, floating, isbool)
  local f = { width = 1 }
  if not floating then
    for i = 1, #vals do
      local s = isbool and tostring(vals[i]) or string.format('%d', vals[i])
      if #s > f.width then f.width = #s end
    end
    f.fmt = function(v)
      local s = isbool and tostring(v) or string.format('%d', v)
      return string.rep(' ', f.width - #s) .. s
    end
    return f
  end
  local int_mode, sci = true, false
  local amin, amax, any = math.huge, 0, false
  for i = 1, #vals do
    local v = vals[i]
    if isfinite(v) and v ~= 0 then
      any = true
      local a = math.abs(v)
      if a < amin then amin = a end
      if a > amax then amax = a end
      if v ~= math.ceil(v) then int_mode = false end
    end
  end
  local p = opts.precision
  local efmt, ffmt = '%.' .. p .. 'e', '%.' .. p .. 'f'
  if any then
    if int_mode then
      sci = amax / amin > 1000 or amax > 1e8
    else
      sci = amax / amin > 1000 or amax > 1e8 or amin < 1e-4
    end
    for i = 1, #vals do
      local v = vals[i]
      if isfinite(v) and v ~= 0 then
        local s
        if sci then s = string.format(efmt, v)
        elseif int_mode then s = string.format('%.0f', v) .. '.'
        else s = string.format(ffmt, v) end
        if #s > f.width then f.width = #s end
      end
    end
  end
  f.fmt = function(v)
    local s = fmt_special(v)   -- nan / inf / -inf, as torch (no trailing '.')
    if not s then
      if sci then s = string.format(efmt, v)
      elseif int_mode then s = string.format('%.0f', v) .. '.'
      else s = string.format(ffmt, v) end
    end
    return string.rep(' ', f.width - #s) .. s
  end
  return f
end

-- Walk the nested structure shown (with summarization) calling visit(k) for each
-- shown element's flat index k (0-based, row-major).
local function shown_indices(shape, summarize)
  local idx = {}
  local n = #shape
  local strides = {}
  local s = 1
  for d = n, 1, -1 do strides[d] = s; s = s * shape[d] end
  local e = opts.edgeitems
  local function walk(d, base)
    if d > n then idx[#idx + 1] = base; return end
    local size = shape[d]
    if summarize and size > 2 * e then
      for i = 0, e - 1 do walk(d + 1, base + i * strides[d]) end
      for i = size - e, size - 1 do walk(d + 1, base + i * strides[d]) end
    else
      for i = 0, size - 1 do walk(d + 1, base + i * strides[d]) end
    end
  end
  walk(1, 0)
  return idx, strides
end

local function body(shape, get, floating, isbool, summarize)
  local n = #shape
  local idx, strides = shown_indices(shape, summarize)
  local vals = {}
  for i = 1, #idx do vals[i] = get(idx[i]) end
  local f = formatter(vals, floating, isbool)
  if n == 0 then return f.fmt(get(0)) end
  local e = opts.edgeitems
  local function vec(base, indent)
    local size = shape[n]
    local items = {}
    local function add(i) items[#items + 1] = f.fmt(get(base + i * strides[n])) end
    if summarize and size > 2 * e then
      for i = 0, e - 1 do add(i) end
      items[#items + 1] = ' ...'
      for i = size - e, size - 1 do add(i) end
    else
      for i = 0, size - 1 do add(i) end
    end
    local per_line = math.max(1, math.floor((opts.linewidth - indent) / (f.width + 2)))
    local lines = {}
    for i = 1, #items, per_line do
      lines[#lines + 1] = table.concat(items, ', ', i, math.min(i + per_line - 1, #items))
    end
    return '[' .. table.concat(lines, ',\n' .. string.rep(' ', indent + 1)) .. ']'
  end
  local function rec(d, base, indent)
    if d == n then return vec(base, indent) end
    local size = shape[d]
    local parts = {}
    if summarize and size > 2 * e then
      for i = 0, e - 1 do parts[#parts + 1] = rec(d + 1, base + i * strides[d], indent + 1) end
      parts[#parts + 1] = '...'
      for i = size - e, size - 1 do
        parts[#parts + 1] = rec(d + 1, base + i * strides[d], indent + 1)
      end
    else
      for i = 0, size - 1 do parts[#parts + 1] = rec(d + 1, base + i * strides[d], indent + 1) end
    end
    local sep = ',' .. string.rep('\n', n - d) .. string.rep(' ', indent + 1)
    return '[' .. table.concat(parts, sep) .. ']'
  end
  return rec(1, 0, 7)
end

-- The footer: [float32 tensor of size 2x3 on cpu].
function M.footer(h)
  local shape = core.shape_of(h)
  local dt = core.dtype_names[core.dtype_of(h)]
  local dev = core.device_name(C.em_tensor_device(h))
  if #shape == 0 then return ('[%s scalar tensor on %s]'):format(dt, dev) end
  return ('[%s tensor of size %s on %s]'):format(dt, table.concat(shape, 'x'), dev)
end

function M.tostring(t)
  local h = t._h
  if h == nil then return 'tensor(<freed>)' end
  local shape = core.shape_of(h)
  local numel = tonumber(C.em_tensor_numel(h))
  local dt = core.dtype_of(h)
  local s
  if numel == 0 then
    s = 'tensor([])'
  elseif C.em_tensor_device(h) == -2 then  -- meta: a shape and a dtype, no values
    s = 'tensor(...)'
  else
    local c, p, want = core.readable(h)
    local ok, res = pcall(function()
      local get
      if want == C.EM_INT64 then get = function(k) return tonumber(p[k]) end
      elseif want == C.EM_BOOL then get = function(k) return p[k] ~= 0 end
      else get = function(k) return p[k] end end
      return body(shape, get, core.is_float[dt], dt == C.EM_BOOL, numel > opts.threshold)
    end)
    C.em_tensor_release(c)
    if not ok then error(res, 0) end
    s = 'tensor(' .. res .. ')'
  end
  return s .. '\n' .. M.footer(h)
end

return M

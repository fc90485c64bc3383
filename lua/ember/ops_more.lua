--[[
ember.ops_more -- more of PyTorch's tensor ops, same semantics, dims and indices
1-based: tril/triu, masked_fill(_), cumsum/cumprod, sort/argsort/topk,
chunk/split, tile, repeat_interleave and flip (em.einsum is in ember.einsum,
em.multinomial in ember.multinomial). Each method also exists as em.<name>(t, ...).

The sorts and scans are C kernels (core/ops/sort_scan.c). The rest compose ops
that already have every backend and their gradients: masks through em.where,
views through narrow/expand/reshape, reorderings through index_select, so
autograd, CUDA and meta come with them.
]]
local ffi = require 'ffi'
local core = require 'ember.ffi'
require 'ember.tensor'
require 'ember.shape'
local C, S, wrap, fail, raise, kind = core.C, core.S, core.wrap, core.fail, core.raise, core.kind
local box_t, istype = core.box_t, ffi.istype
local Tensor, H, out, out2, cdim = core.Tensor, core.H, core.out, core.out2, core.cdim

local where = require('ember.math').where

local M = {}

local function create() return require 'ember.create' end
local function is_int(v) return type(v) == 'number' and v % 1 == 0 end
local function tensor_arg(op, t, i)
  if not istype(box_t, t) then
    raise(('%s: expected a tensor as argument %d, got %s'):format(op, i, kind(t)))
  end
  return t
end

-- A 0-D tensor holding v with t's dtype and device (where's operand).
local function scalar_of(t, v)
  return create().full({}, v, { dtype = t.dtype, device = t.device })
end

-- -- tril / triu ---------------------------------------------------------------------
-- Keeps the elements on and below (tril) or above (triu) diagonal k of the last two
-- dims: column - row <= k (tril) or >= k (triu).
local function triangle(name, a, k)
  local h = H(a, name, 0)
  if k == nil then k = 0 end
  if not is_int(k) then raise(('%s: diagonal must be an integer, got %s'):format(name, kind(k))) end
  local n = C.em_tensor_ndim(h)
  if n < 2 then
    raise(('%s: expected a tensor with at least 2 dims, got shape %s'):format(name,
      core.shape_str(h)))
  end
  local rows, cols = tonumber(C.em_tensor_size(h, n - 2)), tonumber(C.em_tensor_size(h, n - 1))
  local opts = { dtype = 'int64', device = a.device }
  local r = create().arange(0, rows, opts):unsqueeze(2)
  local c = create().arange(0, cols, opts):unsqueeze(1)
  local diff = c - r
  local keep = name == 'tril' and diff:le(k) or diff:ge(k)
  return where(keep, a, scalar_of(a, 0))
end
function Tensor.tril(a, k) return triangle('tril', a, k) end
function Tensor.triu(a, k) return triangle('triu', a, k) end

-- -- masked_fill -----------------------------------------------------------------------
local function check_mask(name, a, mask)
  if not istype(box_t, mask) then
    raise(('%s: mask must be a bool tensor, got %s'):format(name, kind(mask)))
  end
  if mask.dtype ~= 'bool' then
    raise(('%s: mask must be a bool tensor, got %s (compare, e.g. m:ne(0), to make one)'):format(
      name, mask.dtype))
  end
  if mask.device ~= a.device then
    raise(('%s: mask on %s but the tensor on %s'):format(name, mask.device, a.device))
  end
  local ts, ms = a.shape, mask.shape
  local ok = #ms <= #ts
  for i = 1, #ms do
    local m, t = ms[#ms - i + 1], ts[#ts - i + 1]
    if ok and m ~= t and m ~= 1 then ok = false end
  end
  if not ok then
    raise(('%s: mask of shape [%s] does not broadcast to the tensor\'s shape [%s]'):format(name,
      table.concat(ms, ','), table.concat(ts, ',')))
  end
end

local function fill_value(name, a, v)
  if istype(box_t, v) then
    if v:numel() ~= 1 or v:dim() ~= 0 then
      raise(('%s: value must be a number or a 0-D tensor, got a tensor of shape [%s]'):format(
        name, table.concat(v.shape, ',')))
    end
    if v.dtype ~= a.dtype or v.device ~= a.device then v = v:to({ dtype = a.dtype, device = a.device }) end
    return v
  end
  if type(v) == 'boolean' then v = v and 1 or 0 end
  if type(v) ~= 'number' then
    raise(('%s: value must be a number or a 0-D tensor, got %s'):format(name, kind(v)))
  end
  return scalar_of(a, v)
end

function Tensor.masked_fill(a, mask, v)
  tensor_arg('masked_fill', a, 1)
  check_mask('masked_fill', a, mask)
  return where(mask, fill_value('masked_fill', a, v), a)
end

function Tensor.masked_fill_(a, mask, v)
  tensor_arg('masked_fill_', a, 1)
  check_mask('masked_fill_', a, mask)
  local filled = where(mask, fill_value('masked_fill_', a, v), a)
  return a:copy_(filled)
end

-- -- Scans -------------------------------------------------------------------------------
local function scan(name, cfn)
  return function(a, dim)
    local h = H(a, name, 0)
    if dim == nil then raise(name .. ': expected a dim (1-based), got nil') end
    local d = cdim(name, h, dim)
    if cfn(S, h, d, out) ~= 0 then fail() end
    return wrap(out[0])
  end
end
Tensor.cumsum = scan('cumsum', C.em_cumsum)
Tensor.cumprod = scan('cumprod', C.em_cumprod)

-- -- Sorting -----------------------------------------------------------------------------
local function flag(name, what, v, default)
  if v == nil then return default end
  if type(v) ~= 'boolean' then raise(('%s: %s must be a boolean, got %s'):format(name, what, kind(v))) end
  return v
end

-- sort([dim = -1, descending = false]) -> values, indices (stable); sort(true) is
-- sort(-1, true).
function Tensor.sort(a, dim, descending)
  if type(dim) == 'boolean' and descending == nil then dim, descending = nil, dim end
  local h = H(a, 'sort', 0)
  local d = cdim('sort', h, dim == nil and -1 or dim)
  if C.em_sort(S, h, d, flag('sort', 'descending', descending, false) and 1 or 0, 1, out,
      out2) ~= 0 then
    fail()
  end
  local v, i = out[0], out2[0]
  return wrap(v), wrap(i)
end

function Tensor.argsort(a, dim, descending)
  if type(dim) == 'boolean' and descending == nil then dim, descending = nil, dim end
  local h = H(a, 'argsort', 0)
  local d = cdim('argsort', h, dim == nil and -1 or dim)
  if C.em_argsort(S, h, d, flag('argsort', 'descending', descending, false) and 1 or 0, 1,
      out) ~= 0 then
    fail()
  end
  return wrap(out[0])
end

-- topk(k[, dim = -1, largest = true]) -> values, indices, sorted.
function Tensor.topk(a, k, dim, largest)
  local h = H(a, 'topk', 0)
  if not is_int(k) then raise('topk: k must be an integer, got ' .. kind(k)) end
  local d = cdim('topk', h, dim == nil and -1 or dim)
  if C.em_topk(S, h, k, d, flag('topk', 'largest', largest, true) and 1 or 0, 1, out,
      out2) ~= 0 then
    fail()
  end
  local v, i = out[0], out2[0]
  return wrap(v), wrap(i)
end

-- -- chunk / split: Lua lists of narrow views -----------------------------------------
function Tensor.chunk(a, n, dim)
  local h = H(a, 'chunk', 0)
  if not is_int(n) or n < 1 then raise('chunk: the number of chunks must be a positive integer, got ' ..
    (type(n) == 'number' and tostring(n) or kind(n))) end
  if C.em_tensor_ndim(h) == 0 then raise("chunk: can't chunk a 0-D tensor") end
  dim = dim == nil and 1 or dim
  local d = cdim('chunk', h, dim)
  local size = tonumber(C.em_tensor_size(h, d))
  local step = math.ceil(size / n)
  local parts = {}
  if step == 0 then   -- an empty dim: n empty views, as PyTorch
    for i = 1, n do parts[i] = a:narrow(d + 1, 1, 0) end
    return parts
  end
  for s = 0, size - 1, step do
    parts[#parts + 1] = a:narrow(d + 1, s + 1, math.min(step, size - s))
  end
  return parts
end

-- split(size[, dim = 1]): pieces of size (the last may be shorter); split(sizes[, dim]):
-- pieces of the listed sizes, which must add up to the dim's size.
function Tensor.split(a, size, dim)
  local h = H(a, 'split', 0)
  if C.em_tensor_ndim(h) == 0 then raise("split: can't split a 0-D tensor") end
  dim = dim == nil and 1 or dim
  local d = cdim('split', h, dim)
  local total = tonumber(C.em_tensor_size(h, d))
  local parts = {}
  if type(size) == 'table' and not istype(box_t, size) then
    local sum = 0
    for i, s in ipairs(size) do
      if not is_int(s) or s < 0 then
        raise(('split: sizes must be non-negative integers, got %s at position %d'):format(tostring(s), i))
      end
      sum = sum + s
    end
    if sum ~= total then
      raise(('split: sizes {%s} add up to %d but dimension %d has size %d (shape %s)'):format(
        table.concat(size, ','), sum, dim, total, core.shape_str(h)))
    end
    local at = 1
    for i, s in ipairs(size) do
      parts[i] = a:narrow(d + 1, at, s)
      at = at + s
    end
    return parts
  end
  if not is_int(size) or size < 1 then
    raise('split: size must be a positive integer or a list of sizes, got ' ..
      (type(size) == 'number' and tostring(size) or kind(size)))
  end
  if total == 0 then return { a:narrow(d + 1, 1, 0) } end
  for s = 0, total - 1, size do
    parts[#parts + 1] = a:narrow(d + 1, s + 1, math.min(size, total - s))
  end
  return parts
end

-- -- tile / repeat_interleave -------------------------------------------------------------
-- tile(...): PyTorch's repeat. reps shorter than a's dims are padded with leading 1s;
-- longer ones give a leading dims of size 1. Each dim (s) is seen as (1, s), expanded to
-- (r, s), and the whole reshaped to (r*s, ...).
function Tensor.tile(a, ...)
  local h = H(a, 'tile', 0)
  local reps = ...
  if type(reps) ~= 'table' then reps = { ... } end
  local shape = core.shape_of(h)
  local n = math.max(#reps, #shape)
  local r, s = {}, {}
  for i = 1, n do
    r[i] = reps[i - (n - #reps)] or 1
    s[i] = shape[i - (n - #shape)] or 1
    if not is_int(r[i]) or r[i] < 0 then
      raise(('tile: repeats must be non-negative integers, got %s'):format(tostring(r[i])))
    end
  end
  local inter, expanded, final = {}, {}, {}
  for i = 1, n do
    inter[2 * i - 1], inter[2 * i] = 1, s[i]
    expanded[2 * i - 1], expanded[2 * i] = r[i], s[i]
    final[i] = r[i] * s[i]
  end
  if n == 0 then return a:clone() end
  return a:reshape(inter):expand(expanded):reshape(final)
end

-- repeat_interleave(n[, dim]): each element n times along dim (flattened when dim is
-- nil); n may also be a list or 1-D tensor of per-element counts.
function Tensor.repeat_interleave(a, n, dim)
  local h = H(a, 'repeat_interleave', 0)
  if dim == nil then a, dim = a:reshape(-1), 1; h = H(a, 'repeat_interleave', 0) end
  local d = cdim('repeat_interleave', h, dim)
  local size = C.em_tensor_ndim(h) == 0 and 1 or tonumber(C.em_tensor_size(h, d))
  if is_int(n) then
    if n < 0 then raise('repeat_interleave: repeats must be >= 0, got ' .. n) end
    local shape = core.shape_of(h)
    if #shape == 0 then return a:reshape(1):expand(n) end
    local inter, expanded, final = {}, {}, {}
    for i = 1, #shape do
      final[i] = shape[i]
      inter[#inter + 1], expanded[#expanded + 1] = shape[i], shape[i]
      if i == d + 1 then
        inter[#inter + 1], expanded[#expanded + 1] = 1, n
        final[i] = shape[i] * n
      end
    end
    return a:reshape(inter):expand(expanded):reshape(final)
  end
  local counts
  if istype(box_t, n) then counts = n:reshape(-1):totable()
  elseif type(n) == 'table' then counts = n
  else raise('repeat_interleave: repeats must be an integer, a list or a tensor, got ' .. kind(n)) end
  if #counts ~= size then
    raise(('repeat_interleave: %d repeats for dimension %d of size %d'):format(#counts, dim, size))
  end
  local idx = {}
  for i, c in ipairs(counts) do
    if not is_int(c) or c < 0 then
      raise(('repeat_interleave: repeats must be non-negative integers, got %s'):format(tostring(c)))
    end
    for _ = 1, c do idx[#idx + 1] = i end
  end
  local it = create().tensor(idx, { dtype = 'int64', device = a.device })
  if #idx == 0 then it = create().empty({ 0 }, { dtype = 'int64', device = a.device }) end
  return a:index_select(d + 1, it)
end

-- -- flip --------------------------------------------------------------------------------
-- flip(dims): reversed along each listed dim (a number or a list), by index_select.
function Tensor.flip(a, dims, ...)
  local h = H(a, 'flip', 0)
  if type(dims) == 'number' then dims = { dims, ... } end
  if type(dims) ~= 'table' or istype(box_t, dims) then
    raise('flip: dims must be a number or a list of numbers, got ' .. kind(dims))
  end
  if C.em_tensor_ndim(h) == 0 then return a:clone() end
  local seen, r = {}, a
  for _, dim in ipairs(dims) do
    local d = cdim('flip', h, dim)
    if seen[d] then raise(('flip: dim %d appears more than once'):format(dim)) end
    seen[d] = true
    local size = tonumber(C.em_tensor_size(h, d))
    local idx = create().arange(size, 0, -1, { dtype = 'int64', device = a.device })
    if size == 0 then idx = create().empty({ 0 }, { dtype = 'int64', device = a.device }) end
    r = r:index_select(d + 1, idx)
  end
  if r == a then r = a:clone() end
  return r
end

return M

--[[
ember.reduce -- reductions (sum mean prod amax amin logsumexp any all var std
norm max min argmax argmin) and softmax / log_softmax.

`dim` is optional and may be a number or a list of numbers (1-based, negative
from the end); `keepdim` keeps the reduced dims with size 1. max(dim)/min(dim)
return values and 1-based indices; max()/min() with no dim give the overall
value as a 0-D tensor, and max(u)/min(u) with a tensor are maximum/minimum.
]]
local ffi = require 'ffi'
local core = require 'ember.ffi'
require 'ember.tensor'
local C, S, wrap, fail, raise, kind = core.C, core.S, core.wrap, core.fail, core.raise, core.kind
local box_t, istype = core.box_t, ffi.istype
local Tensor, H, out, out2 = core.Tensor, core.H, core.out, core.out2

local M = {}
local dims_buf = ffi.new('int[8]')

-- Fill dims_buf from nil / a dim / a list of dims; returns the count (0 = all).
local function parse_dims(op, h, dim)
  if dim == nil then return 0 end
  if type(dim) == 'number' then
    dims_buf[0] = core.cdim(op, h, dim)
    return 1
  end
  if type(dim) ~= 'table' or istype(box_t, dim) then
    raise(('%s: dim must be a number or a list of numbers, got %s'):format(op, kind(dim)))
  end
  local n = #dim
  if n == 0 then return 0 end
  if n > 8 then raise(op .. ': too many dims') end
  local seen = {}
  for i = 1, n do
    local d = core.cdim(op, h, dim[i])
    if seen[d] then raise(('%s: dim %d appears more than once'):format(op, dim[i])) end
    seen[d] = true
    dims_buf[i - 1] = d
  end
  return n
end

local function check_keepdim(op, keepdim)
  if keepdim == nil then return 0 end
  if type(keepdim) ~= 'boolean' then
    raise(('%s: keepdim must be a boolean, got %s'):format(op, kind(keepdim)))
  end
  return keepdim and 1 or 0
end

local function reducer(name, op)
  return function(a, dim, keepdim)
    local h = H(a, name, 0)
    if type(dim) == 'boolean' and keepdim == nil then dim, keepdim = nil, dim end
    local n = parse_dims(name, h, dim)
    if C.em_reduce(S, op, h, dims_buf, n, check_keepdim(name, keepdim), out) ~= 0 then
      fail()
    end
    return wrap(out[0])
  end
end

Tensor.sum = reducer('sum', C.EM_SUM)
Tensor.mean = reducer('mean', C.EM_MEAN)
Tensor.prod = reducer('prod', C.EM_PROD)
Tensor.amax = reducer('amax', C.EM_AMAX)
Tensor.amin = reducer('amin', C.EM_AMIN)
Tensor.logsumexp = reducer('logsumexp', C.EM_LOGSUMEXP)
Tensor.any = reducer('any', C.EM_ANY)
Tensor.all = reducer('all', C.EM_ALL)

-- var/std(dim, keepdim) as every reduction of API.md; the correction comes in
-- an options table as the last argument: {unbiased = false} or {correction = 0}
-- (keys dim and keepdim are accepted there too). Unbiased by default.
-- torch's positional var(dim, unbiased, keepdim) would read the same call
-- var(1, true) differently, so a third positional flag is refused with a hint.
local function variance(name, take_sqrt)
  return function(a, dim, keepdim, opts)
    local h = H(a, name, 0)
    if type(dim) == 'table' and not istype(box_t, dim) and dim[1] == nil and next(dim) then
      dim, keepdim, opts = nil, nil, dim
    elseif type(keepdim) == 'table' then
      keepdim, opts = nil, keepdim
    end
    if opts ~= nil and type(opts) ~= 'table' then
      raise(('%s: expected (dim, keepdim, {unbiased=, correction=}); got %s as the third '
        .. 'argument (torch\'s var(dim, unbiased, keepdim) order is not used here)')
        :format(name, kind(opts)))
    end
    local correction = 1
    if opts then
      if opts.dim ~= nil then dim = opts.dim end
      if opts.keepdim ~= nil then keepdim = opts.keepdim end
      if opts.unbiased ~= nil then
        if type(opts.unbiased) ~= 'boolean' then
          raise(('%s: unbiased must be a boolean, got %s'):format(name, kind(opts.unbiased)))
        end
        correction = opts.unbiased and 1 or 0
      end
      if opts.correction ~= nil then correction = opts.correction end
    end
    if type(correction) ~= 'number' then
      raise(('%s: correction must be a number, got %s'):format(name, kind(correction)))
    end
    local n = parse_dims(name, h, dim)
    if C.em_var(S, h, dims_buf, n, correction, check_keepdim(name, keepdim), take_sqrt, out) ~= 0 then
      fail()
    end
    return wrap(out[0])
  end
end
Tensor.var = variance('var', 0)
Tensor.std = variance('std', 1)

-- norm(p, dim, keepdim): p = 2 by default ('fro' too), math.huge for max-abs.
function Tensor.norm(a, p, dim, keepdim)
  local h = H(a, 'norm', 0)
  if p == nil or p == 'fro' then p = 2
  elseif p == 'inf' then p = math.huge
  elseif p == '-inf' then p = -math.huge end
  if type(p) ~= 'number' then
    raise(("norm: p must be a number, 'fro' or nil, got %s"):format(kind(p)))
  end
  local n = parse_dims('norm', h, dim)
  if C.em_norm(S, h, p, dims_buf, n, check_keepdim('norm', keepdim), out) ~= 0 then
    fail()
  end
  return wrap(out[0])
end

-- max()/min(): overall 0-D value; max(dim[, keepdim]) -> values, indices;
-- max(u): element-wise maximum.
local function extreme(name, redop, binop, fn)
  return function(a, dim, keepdim)
    local h = H(a, name, 0)
    if dim == nil then
      if C.em_reduce(S, redop, h, dims_buf, 0, 0, out) ~= 0 then
        fail()
      end
      return wrap(out[0])
    end
    if type(dim) ~= 'number' then
      if istype(box_t, dim) then return core.binop(binop, name, a, dim) end
      raise(('%s: expected a dim (number) or a tensor, got %s'):format(name, kind(dim)))
    end
    local d = core.cdim(name, h, dim)
    if fn(S, h, d, check_keepdim(name, keepdim), 1, out, out2) ~= 0 then fail() end
    local v, i = out[0], out2[0]
    return wrap(v), wrap(i)
  end
end
Tensor.max = extreme('max', C.EM_AMAX, C.EM_MAXIMUM, C.em_max_dim)
Tensor.min = extreme('min', C.EM_AMIN, C.EM_MINIMUM, C.em_min_dim)

local function argext(name, fn)
  return function(a, dim, keepdim)
    local h = H(a, name, 0)
    local d, all = 0, 1
    if type(dim) == 'boolean' and keepdim == nil then dim, keepdim = nil, dim end
    if dim ~= nil then d, all = core.cdim(name, h, dim), 0 end
    if fn(S, h, d, all, check_keepdim(name, keepdim), 1, out) ~= 0 then fail() end
    return wrap(out[0])
  end
end
Tensor.argmax = argext('argmax', C.em_argmax)
Tensor.argmin = argext('argmin', C.em_argmin)

-- -- softmax ---------------------------------------------------------------------------
local function softmax(name, log)
  return function(a, dim)
    local h = H(a, name, 0)
    if dim == nil then raise(name .. ': dim is required (e.g. -1 for the last dim)') end
    if C.em_softmax(S, h, core.cdim(name, h, dim), log, out) ~= 0 then
      fail()
    end
    return wrap(out[0])
  end
end
Tensor.softmax = softmax('softmax', 0)
Tensor.log_softmax = softmax('log_softmax', 1)

return M

--[[
ember.index -- joining and indexing (em.cat, em.stack, index_select, gather,
em.one_hot) and linear algebra (em.matmul, mm, bmm, dot, mv).

Index tensors are 1-based (C is told index_base = 1); a Lua list of numbers is
accepted wherever an index tensor is. mm/bmm/dot/mv check the number of dims
themselves so their messages carry their own names.
]]
local ffi = require 'ffi'
local core = require 'ember.ffi'
require 'ember.tensor'
local C, S, wrap, fail, raise, kind = core.C, core.S, core.wrap, core.fail, core.raise, core.kind
local box_t, istype = core.box_t, ffi.istype
local Tensor, H, out = core.Tensor, core.H, core.out
local cdim = core.cdim

local M = {}

-- -- Lists of tensors ------------------------------------------------------------------
local list_buf, list_cap = nil, 0
local function tensor_list(op, list)
  if type(list) ~= 'table' or istype(box_t, list) then
    raise(('%s: expected a list of tensors, got %s'):format(op, kind(list)))
  end
  local n = #list
  if n == 0 then raise(op .. ': expected a non-empty list of tensors') end
  if n > list_cap then
    list_cap = math.max(n, 2 * list_cap, 16)
    list_buf = ffi.new('em_tensor*[?]', list_cap)
  end
  for i = 1, n do
    local t = list[i]
    if not istype(box_t, t) then
      raise(('%s: element %d of the list is a %s, not a tensor'):format(op, i, kind(t)))
    end
    list_buf[i - 1] = t._h
  end
  return list_buf, n
end

-- cat(list[, dim = 1]): joins along an existing dim.
function M.cat(list, dim)
  local buf, n = tensor_list('cat', list)
  local d = cdim('cat', buf[0], dim == nil and 1 or dim)
  if C.em_cat(S, buf, n, d, out) ~= 0 then fail() end
  return wrap(out[0])
end
M.concat, M.concatenate = M.cat, M.cat

-- stack(list[, dim = 1]): joins along a new dim (1..ndim+1).
function M.stack(list, dim)
  local buf, n = tensor_list('stack', list)
  local d = cdim('stack', buf[0], dim == nil and 1 or dim, 1)
  if C.em_stack(S, buf, n, d, out) ~= 0 then fail() end
  return wrap(out[0])
end

-- An index argument as a handle: a tensor as is, a Lua list (or a number) as an
-- int64 tensor on device dev (the indexed tensor's).
local function index_arg(op, idx, dev)
  if istype(box_t, idx) then return idx._h, idx end
  if type(idx) == 'number' then idx = { idx } end
  if type(idx) == 'table' then
    local t = require('ember.create').tensor(idx, { dtype = 'int64' })
    if dev ~= -1 then t = t:to(core.device_name(dev)) end
    return t._h, t
  end
  raise(('%s: expected an index tensor or a list of indices, got %s'):format(op, kind(idx)))
end

-- index_select and gather share their shape: an index argument, a dim, one C call.
local function indexer(name, cfn)
  return function(a, dim, idx)
    -- The index first: making it may sweep, and a's handle is taken after.
    local hi, keep = index_arg(name, idx, C.em_tensor_device(H(a, name, 0)))
    local h = H(a, name, 0)
    local d = cdim(name, h, dim)
    if cfn(S, h, d, hi, 1, out) ~= 0 then fail() end
    local r = wrap(out[0])
    keep = nil          -- the index tensor stays alive until the call is done
    return r
  end
end
Tensor.index_select = indexer('index_select', C.em_index_select)
Tensor.gather = indexer('gather', C.em_gather)

-- one_hot(labels[, n]): labels are 1-based; n inferred from the largest label.
function M.one_hot(labels, n)
  local hi, keep = index_arg('one_hot', labels, -1)
  if n ~= nil and (type(n) ~= 'number' or n % 1 ~= 0) then
    raise('one_hot: number of classes must be an integer, got ' .. kind(n))
  end
  if C.em_one_hot(S, hi, n or -1, 1, out) ~= 0 then
    fail()
  end
  local r = wrap(out[0])
  keep = nil
  return r
end
function Tensor.one_hot(a, n) return M.one_hot(a, n) end

M.index_select, M.gather = Tensor.index_select, Tensor.gather

-- -- Linear algebra ----------------------------------------------------------------------
function M.matmul(a, b)
  local ha, hb = H(a, 'matmul', 1), H(b, 'matmul', 2)
  if C.em_matmul(S, ha, hb, out) ~= 0 then fail() end
  return wrap(out[0])
end
Tensor.matmul = M.matmul

local function need_dims(op, ha, hb, na, nb, what)
  if C.em_tensor_ndim(ha) ~= na or C.em_tensor_ndim(hb) ~= nb then
    raise(('%s: expected %s, got shapes %s and %s'):format(op, what, core.shape_str(ha),
      core.shape_str(hb)))
  end
end

function M.mm(a, b)
  local ha, hb = H(a, 'mm', 1), H(b, 'mm', 2)
  need_dims('mm', ha, hb, 2, 2, '2-D tensors')
  if C.em_matmul(S, ha, hb, out) ~= 0 then
    raise((core.errmsg():gsub('^matmul:', 'mm:')))
  end
  return wrap(out[0])
end

function M.bmm(a, b)
  local ha, hb = H(a, 'bmm', 1), H(b, 'bmm', 2)
  need_dims('bmm', ha, hb, 3, 3, '3-D tensors')
  if C.em_tensor_size(ha, 0) ~= C.em_tensor_size(hb, 0) then
    raise(('bmm: batch sizes differ: shapes %s and %s'):format(core.shape_str(ha),
      core.shape_str(hb)))
  end
  if C.em_matmul(S, ha, hb, out) ~= 0 then
    raise((core.errmsg():gsub('^matmul:', 'bmm:')))
  end
  return wrap(out[0])
end

function M.dot(a, b)
  local ha, hb = H(a, 'dot', 1), H(b, 'dot', 2)
  need_dims('dot', ha, hb, 1, 1, '1-D tensors')
  if C.em_tensor_size(ha, 0) ~= C.em_tensor_size(hb, 0) then
    raise(('dot: sizes differ: shapes %s and %s'):format(core.shape_str(ha), core.shape_str(hb)))
  end
  if C.em_matmul(S, ha, hb, out) ~= 0 then
    raise((core.errmsg():gsub('^matmul:', 'dot:')))
  end
  return wrap(out[0])
end

function M.mv(a, b)
  local ha, hb = H(a, 'mv', 1), H(b, 'mv', 2)
  need_dims('mv', ha, hb, 2, 1, 'a 2-D and a 1-D tensor')
  if C.em_matmul(S, ha, hb, out) ~= 0 then
    raise((core.errmsg():gsub('^matmul:', 'mv:')))
  end
  return wrap(out[0])
end

Tensor.mm, Tensor.bmm, Tensor.dot, Tensor.mv = M.mm, M.bmm, M.dot, M.mv

return M

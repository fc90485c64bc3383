--[[
ember.autograd -- the Lua face of the C autograd engine (core/autograd/):
t:requires_grad_([flag]), t.requires_grad, t.grad (readable and assignable),
t.is_leaf, t:backward([g]), t:detach(); em.no_grad(fn, ...) and
em.enable_grad(fn, ...) run fn with grad mode off / on and restore it even when
fn errors; em.set_grad_enabled(flag), em.is_grad_enabled(); and
em.autograd.gradcheck, which compares the analytic Jacobian with central finite
differences in float64; em.autograd.apply and backward_capture (ember.function).
]]
local ffi = require 'ffi'
local core = require 'ember.ffi'
require 'ember.tensor'
local C, S, wrap, fail, raise, kind = core.C, core.S, core.wrap, core.fail, core.raise, core.kind
local box_t, istype = core.box_t, ffi.istype
local Tensor, getters, setters, H, out = core.Tensor, core.getters, core.setters, core.H, core.out

local M = {}
local function pack(...) return { n = select('#', ...), ... } end

-- -- Tensor fields and methods ---------------------------------------------------------

function Tensor.requires_grad_(t, flag)
  local h = H(t, 'requires_grad_', 0)
  if flag == nil then flag = true end
  if C.em_tensor_set_requires_grad(S, h, flag and 1 or 0) ~= 0 then fail() end
  return t
end

getters.requires_grad = function(t) return C.em_tensor_requires_grad(t._h) ~= 0 end
setters.requires_grad = function(t, v) Tensor.requires_grad_(t, v and true or false) end
getters.is_leaf = function(t) return C.em_tensor_is_leaf(t._h) ~= 0 end

getters.grad = function(t)
  local g = C.em_tensor_grad(t._h)
  if g == nil then return nil end
  return wrap(g)
end
setters.grad = function(t, g)
  if g ~= nil and not istype(box_t, g) then
    raise('grad: expected a tensor or nil, got ' .. kind(g))
  end
  if C.em_tensor_set_grad(S, t._h, g ~= nil and g._h or nil) ~= 0 then fail() end
end

function Tensor.backward(t, g)
  local h = H(t, 'backward', 0)
  local gh = nil
  if g ~= nil then
    if type(g) == 'number' then g = require('ember.create').full({}, g, { dtype = t.dtype }) end
    gh = H(g, 'backward', 1)
  end
  core.handles.before_backward()  -- dead forward outputs go first (handles.lua)
  if C.em_backward(S, h, gh) ~= 0 then fail() end
  core.handles.after_backward()   -- and the rest of the forward's, after
end
-- A custom function's backward calls back into Lua from em_backward: that FFI
-- call must never be compiled (ember.function).
jit.off(Tensor.backward)

function Tensor.detach(t)
  if C.em_detach(S, H(t, 'detach', 0), out) ~= 0 then fail() end
  return wrap(out[0])
end

-- -- Grad mode ------------------------------------------------------------------------------

function M.is_grad_enabled() return C.em_is_grad_enabled(S) ~= 0 end
function M.set_grad_enabled(flag) C.em_set_grad_enabled(S, flag and 1 or 0) end

local function with_mode(mode, name)
  return function(fn, ...)
    if type(fn) ~= 'function' then
      raise(('%s: expected a function, got %s'):format(name, kind(fn)))
    end
    local was = C.em_is_grad_enabled(S)
    C.em_set_grad_enabled(S, mode)
    local res = pack(pcall(fn, ...))
    C.em_set_grad_enabled(S, was)
    if not res[1] then error(res[2], 0) end
    return unpack(res, 2, res.n)
  end
end
M.no_grad = with_mode(0, 'no_grad')
M.enable_grad = with_mode(1, 'enable_grad')

-- -- gradcheck ------------------------------------------------------------------------------

local dptr = ffi.typeof('double *')

-- Address of element k (0-based, row-major over the shape) of a float64 tensor.
local function elem_ptr(h)
  local nd = C.em_tensor_ndim(h)
  local sizes, strides = C.em_tensor_sizes(h), C.em_tensor_strides(h)
  local base = ffi.cast(dptr, C.em_tensor_data(h))
  return function(k)
    local off = 0
    for d = nd - 1, 0, -1 do
      local n = tonumber(sizes[d])
      off = off + (k % n) * tonumber(strides[d])
      k = math.floor(k / n)
    end
    return base + off
  end
end

local function index_str(h, k)
  local nd = C.em_tensor_ndim(h)
  local sizes, idx = C.em_tensor_sizes(h), {}
  for d = nd - 1, 0, -1 do
    local n = tonumber(sizes[d])
    idx[d + 1] = k % n + 1
    k = math.floor(k / n)
  end
  return '[' .. table.concat(idx, ',') .. ']'
end

-- The tensors fn returns (one or several, or one table of them), as float64 copies.
local function outputs(fn, inputs)
  local res = pack(fn(unpack(inputs, 1, #inputs)))
  if res.n == 1 and type(res[1]) == 'table' and not istype(box_t, res[1]) then
    res = res[1]
    res.n = #res
  end
  local outs = {}
  for i = 1, res.n do
    if istype(box_t, res[i]) then outs[#outs + 1] = res[i] end
  end
  if #outs == 0 then raise('gradcheck: fn returned no tensor') end
  return outs
end

local function flat_values(t)
  local c = t:to('float64'):contiguous()
  local p = ffi.cast(dptr, C.em_tensor_data(c._h))
  local v = {}
  for k = 0, t:numel() - 1 do v[k + 1] = p[k] end
  return v
end

local function all_values(outs)
  local v = {}
  for o = 1, #outs do
    for _, x in ipairs(flat_values(outs[o])) do v[#v + 1] = x end
  end
  return v
end

function M.gradcheck(fn, inputs, opts)
  opts = opts or {}
  local eps, atol, rtol = opts.eps or 1e-6, opts.atol or 1e-5, opts.rtol or 1e-3
  if type(fn) ~= 'function' then raise('gradcheck: expected a function, got ' .. kind(fn)) end
  if istype(box_t, inputs) then inputs = { inputs } end
  for i, x in ipairs(inputs) do
    if istype(box_t, x) and x.requires_grad and x.dtype ~= 'float64' then
      raise(('gradcheck: input %d is %s; gradcheck needs float64 inputs'):format(i, x.dtype))
    end
  end
  -- numerical Jacobian: num[i][k] = list over outputs, flattened, of d out / d x_i[k]
  local num, nout = {}, nil
  M.no_grad(function()
    for i, x in ipairs(inputs) do
      if istype(box_t, x) and x.requires_grad then
        local at = elem_ptr(x._h)
        num[i] = {}
        for k = 0, x:numel() - 1 do
          local p = at(k)
          local v0 = p[0]
          -- values are read at once: an output may be a view of the input
          p[0] = v0 + eps
          local plus = all_values(outputs(fn, inputs))
          p[0] = v0 - eps
          local minus = all_values(outputs(fn, inputs))
          p[0] = v0
          local col = {}
          for j = 1, #plus do col[j] = (plus[j] - minus[j]) / (2 * eps) end
          num[i][k + 1] = col
          nout = #col
        end
      end
    end
  end)
  if not nout then raise('gradcheck: no input requires grad') end
  -- analytic Jacobian, one backward per output element
  local row, worst = 0, nil
  local probe = outputs(fn, inputs)
  for o = 1, #probe do
    local n = probe[o]:numel()
    for j = 0, n - 1 do
      row = row + 1
      for _, x in ipairs(inputs) do if istype(box_t, x) and x.requires_grad then x.grad = nil end end
      local outs = outputs(fn, inputs)
      local y = outs[o]
      if y.requires_grad then
        local g = require('ember.create').zeros(y.shape, { dtype = y.dtype })
        elem_ptr(g._h)(j)[0] = 1
        y:backward(g)
      end
      for i, x in pairs(num) do
        local gx = inputs[i].grad
        local gv = gx and flat_values(gx)
        for k = 1, #x do
          local a, b = gv and gv[k] or 0, x[k][row]
          local excess = math.abs(a - b) - (atol + rtol * math.abs(b))
          if excess ~= excess then excess = math.huge end
          if excess > 0 and (not worst or excess > worst[1]) then
            worst = { excess, i, k, o, j, a, b }
          end
        end
      end
    end
  end
  for _, x in ipairs(inputs) do if istype(box_t, x) and x.requires_grad then x.grad = nil end end
  if worst then
    local _, i, k, o, j, a, b = unpack(worst)
    raise(('gradcheck: Jacobian mismatch for input %d, element %s (output %d, element %d): '
      .. 'analytic %.10g vs numerical %.10g'):format(i, index_str(inputs[i]._h, k - 1), o,
      j + 1, a, b))
  end
  return true
end

local fn = require 'ember.function'
M.apply, M.backward_capture = fn.apply, fn.backward_capture

-- The engine's own kernels in a backward allocate from C: when one runs out of
-- memory, the engine asks for a collection and tries once more (what the ops
-- Lua calls get from core.fail). Lua may be entered there: em_backward's
-- callers are kept out of the JIT, and the engine asks only outside Lua's own
-- nodes and hooks. An error must not cross C: the allocation then fails as it
-- would have.
local reclaim = ffi.cast('em_backward_reclaim_fn', function() pcall(core.collect) end)
function M._set_reclaim(on) C.em_backward_set_reclaim(S, on and reclaim or nil, nil) end
M._set_reclaim(true)
table.insert(core.on_close, function() M._set_reclaim(false) end)

return M

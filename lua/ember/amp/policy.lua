--[[
ember.amp.policy -- autocast's op lists and the hooks that apply them.

em.amp.autocast sets a low dtype (bfloat16 or float16) for the duration of a
function. While it is set, the ops of `lowp` (matmul, mm, bmm, mv, linear,
conv2d) cast their floating inputs to it and so compute and return in it, and
the ops of `fp32` (softmax, log_softmax, the norms, every loss, reductions,
exp/log/pow and their kin) cast float16/bfloat16 inputs up to float32: PyTorch's
lists, for the same reasons (GEMMs and convs gain speed and lose little;
sums, exponentials and normalisations lose too much in 8 mantissa bits).
float64 inputs are left alone, as torch does.

batch_norm is on neither list, as in torch: it takes a float16/bfloat16 input
with its float32 weight, bias and running statistics, computes in float32 and
returns the input's dtype (the CPU kernels and cuDNN read half data with float
parameters), so it needs no cast up before it and none down after it -- two
passes over every activation of a CNN saved. layer_norm stays float32.

The policy lives here, once: install() wraps the listed Tensor methods and em
functions at load, and wrap_functional() the listed em.nn.F functions. A wrapper
costs one upvalue test while autocast is off. Casts of leaf tensors that require
grad (the parameters) are cached for the autocast region, keyed by the tensor
and the grad mode, so a weight used by several ops is cast once; the cache is
dropped when the outermost region ends. Casts are differentiable (em_to records
itself), so gradients reach the float32 parameters in float32.
]]
local ffi = require 'ffi'
local core = require 'ember.ffi'
local C, S = core.C, core.S
local box_t, istype = core.box_t, ffi.istype
local F32, F64, F16, BF16 = C.EM_FLOAT32, C.EM_FLOAT64, C.EM_FLOAT16, C.EM_BFLOAT16

local P = {}

local low = nil          -- the autocast dtype id, or nil when off
local low_name = nil
local cache = nil        -- leaf tensor -> {[grad_on] = cast}, for the region

-- Op lists (Tensor methods and em functions share names; F gets its own).
P.lowp = { 'matmul', 'mm', 'bmm', 'mv' }
P.fp32 = { 'softmax', 'log_softmax', 'sum', 'mean', 'prod', 'var', 'std', 'norm',
  'logsumexp', 'exp', 'log', 'log1p', 'expm1', 'log2', 'log10', 'pow', 'reciprocal',
  'rsqrt', 'sinh', 'cosh', 'tan', 'asin', 'acos', 'cumsum', 'cumprod' }
P.F_lowp = { 'linear', 'conv2d', 'conv1d', 'scaled_dot_product_attention' }
P.F_fp32 = { 'layer_norm', 'group_norm', 'rms_norm', 'cross_entropy', 'nll_loss', 'mse_loss',
  'l1_loss', 'smooth_l1_loss', 'huber_loss', 'binary_cross_entropy_with_logits', 'softmax',
  'log_softmax' }

local function to(t, dt)
  local out = core.out
  if C.em_to(S, t._h, dt, C.em_tensor_device(t._h), out) ~= 0 then core.fail() end
  return core.wrap(out[0])
end

-- v cast to the low dtype when it is a float32 tensor (through the cache for leaves
-- that require grad).
local function down(v)
  if not istype(box_t, v) then return v end
  local h = v._h
  local dt = C.em_tensor_dtype(h)
  if dt ~= F32 and dt ~= F16 and dt ~= BF16 or dt == low then return v end
  if C.em_tensor_requires_grad(h) == 0 or C.em_tensor_is_leaf(h) == 0 then return to(v, low) end
  local on = C.em_is_grad_enabled(S) ~= 0
  local e = cache[v]
  if e == nil then e = {}; cache[v] = e end
  local c = e[on]
  if c == nil then c = to(v, low); e[on] = c end
  return c
end

local function up(v)
  if not istype(box_t, v) then return v end
  local dt = C.em_tensor_dtype(v._h)
  if dt == F16 or dt == BF16 then return to(v, F32) end
  return v
end

local function map(cast, ...)
  local n = select('#', ...)
  if n == 1 then return cast((...)) end
  if n == 2 then local a, b = ...; return cast(a), cast(b) end
  local t = { ... }
  for i = 1, n do t[i] = cast(t[i]) end
  return unpack(t, 1, n)
end

local function hook(f, cast)
  return function(...)
    if low == nil then return f(...) end
    return f(map(cast, ...))
  end
end

-- Wraps tbl[name] for each listed name (once: a wrapped function is marked).
local wrapped = setmetatable({}, { __mode = 'k' })
local function wrap_all(tbl, names, cast)
  for _, name in ipairs(names) do
    local f = rawget(tbl, name)
    if f ~= nil and not wrapped[f] then
      local g = hook(f, cast)
      wrapped[g] = true
      tbl[name] = g
    end
  end
end

-- `a ^ b` (the __pow metamethod, through core.meta_ops) is pow, so it takes
-- pow's cast: float32.
local function install_meta()
  if core.meta_ops then wrap_all(core.meta_ops, { 'pow' }, up) end
end

-- Called by ember's loader with the Tensor method table and em (before em's
-- per-method functions are made from Tensor).
function P.install(Tensor, em)
  for _, names in ipairs({ P.lowp, P.fp32 }) do
    local cast = names == P.lowp and down or up
    for _, name in ipairs(names) do
      local orig = rawget(Tensor, name)
      wrap_all(Tensor, { name }, cast)
      if orig ~= nil and rawget(em, name) == orig then em[name] = Tensor[name]
      elseif rawget(em, name) ~= nil then wrap_all(em, { name }, cast) end
    end
  end
  install_meta()
end

-- (again once em.nn's later files have added theirs: F.conv1d, the norms and
-- attention; what is wrapped already stays as it is)
function P.wrap_functional(F)
  wrap_all(F, P.F_lowp, down)
  wrap_all(F, P.F_fp32, up)
  return F
end

local names = { bfloat16 = BF16, float16 = F16, half = F16 }

-- Runs fn(...) with autocast set to dtype (false: off); restores the previous
-- setting whatever happens and returns fn's results.
local function pack(ok, ...) return ok, select('#', ...), { ... } end
function P.run(dtype, fn, ...)
  local id
  if dtype == false then id = nil
  else
    id = names[dtype]
    if id == nil then
      core.raise(("autocast: dtype must be 'bfloat16' or 'float16' (or false for off), got %s")
        :format(type(dtype) == 'string' and "'" .. dtype .. "'" or core.kind(dtype)))
    end
  end
  if type(fn) ~= 'function' and not (type(fn) == 'table' and getmetatable(fn)
      and getmetatable(fn).__call) then
    core.raise('autocast: expected a function as argument 2, got ' .. core.kind(fn))
  end
  local prev, prev_name, prev_cache = low, low_name, cache
  low, low_name = id, id and (id == BF16 and 'bfloat16' or 'float16') or nil
  if cache == nil then cache = setmetatable({}, { __mode = 'k' }) end
  local ok, n, r = pack(pcall(fn, ...))
  low, low_name, cache = prev, prev_name, prev_cache
  if not ok then error(r[1], 0) end
  return unpack(r, 1, n)
end

-- The autocast dtype name in force, or nil.
function P.dtype() return low_name end

return P

--[[
ember.nn.functional -- em.nn.F: the stateless layer functions the modules call.

Each is one fused C op (em_conv2d, em_max_pool2d, em_cross_entropy,
em_batch_norm, ...) that records itself for autograd (the recorders are in
core/autograd/grad_nn.c); linear, dropout and embedding are compositions of
core ops. Class targets are 1-based (index_base 1 in C).
]]
local ffi = require 'ffi'
local em = require 'ember'
local core = require 'ember.ffi'
local C, S, wrap, fail, raise, kind = core.C, core.S, core.wrap, core.fail, core.raise, core.kind
local H, box_t, istype = core.H, core.box_t, ffi.istype

local F = {}

local o1 = ffi.new('em_tensor*[1]')
local pk, ps, pp, pd = ffi.new('int64_t[2]'), ffi.new('int64_t[2]'), ffi.new('int64_t[2]'),
  ffi.new('int64_t[2]')

local function is_tensor(x) return istype(box_t, x) end

-- A pair argument (number or {h, w}) into buf; returns buf, or nil for nil when allowed.
local function pair(op, what, v, buf, def)
  if v == nil then v = def end
  if v == nil then return nil end
  if type(v) == 'number' then buf[0], buf[1] = v, v
  elseif type(v) == 'table' and #v == 2 then buf[0], buf[1] = v[1], v[2]
  else raise(('%s: %s must be a number or a pair {h, w}, got %s'):format(op, what, kind(v))) end
  return buf
end

-- Raises the state's last error as the user's call op: the C op may name itself
-- `internal` (bce_with_logits for binary_cross_entropy_with_logits).
local function fail_as(op, internal, hint)
  local msg = core.errmsg()
  pcall(fail)   -- what fail does besides raising (a collection under memory pressure)
  if internal and msg:sub(1, #internal + 2) == internal .. ': ' then
    msg = op .. msg:sub(#internal + 1)
  end
  raise(msg .. (hint or ''))
end

local reductions = { none = 0, mean = 1, sum = 2 }
local function reduction_of(op, r)
  if r == nil then return 1 end
  local v = reductions[r]
  if not v then raise(("%s: reduction must be 'none', 'mean' or 'sum', got %s"):format(op, tostring(r))) end
  return v
end

-- -- Linear and activations -----------------------------------------------------------
-- One C call (em_linear): without autograd recording it makes no tensor but the
-- result, where x:matmul(w:t()) + b makes three (what small-net inference pays for).
function F.linear(x, w, b)
  local hx, hw = H(x, 'linear', 1), H(w, 'linear', 2)
  local hb = nil
  if b ~= nil then hb = H(b, 'linear', 3) end
  if C.em_linear(S, hx, hw, hb, o1) ~= 0 then
    -- The C op multiplies inside; the user called linear with x and w.
    local msg = core.errmsg()
    if msg:find('^matmul: shapes') then
      local xs, ws = core.shape_str(hx), core.shape_str(hw)
      raise(("linear: input %s does not fit weight %s: the input's last dim must be %s "
        .. '(in_features = weight:size(2))')
        :format(xs, ws, tostring(tonumber(C.em_tensor_sizes(hw)[C.em_tensor_ndim(hw) - 1]))))
    end
    fail()
  end
  return wrap(o1[0])
end

function F.relu(x) return x:relu() end
function F.gelu(x, approximate) return x:gelu(approximate) end
function F.silu(x) return x:silu() end
function F.tanh(x) return x:tanh() end
function F.sigmoid(x) return x:sigmoid() end
function F.softmax(x, dim) return x:softmax(dim or -1) end
function F.log_softmax(x, dim) return x:log_softmax(dim or -1) end

function F.dropout(x, p, training)
  p = p or 0.5
  if type(p) ~= 'number' or p < 0 or p > 1 then
    raise(('dropout: p must be a probability in [0, 1], got %s'):format(tostring(p)))
  end
  if training == false or p == 0 then return x end
  if p == 1 then return x * 0 end
  local mask = em.rand_like(x):ge(p):to(x.dtype)
  return x * mask:mul(1 / (1 - p))
end

-- -- Convolution and pooling ---------------------------------------------------------------
function F.conv2d(x, w, b, stride, padding, dilation, groups)
  local hx, hw = H(x, 'conv2d', 1), H(w, 'conv2d', 2)
  local hb = b ~= nil and H(b, 'conv2d', 3) or nil
  if C.em_conv2d(S, hx, hw, hb, pair('conv2d', 'stride', stride, ps, 1),
      pair('conv2d', 'padding', padding, pp, 0), pair('conv2d', 'dilation', dilation, pd, 1),
      groups or 1, o1) ~= 0 then fail() end
  return wrap(o1[0])
end

function F.max_pool2d(x, kernel, stride, padding, dilation, ceil_mode)
  local hx = H(x, 'max_pool2d', 1)
  if C.em_max_pool2d(S, hx, pair('max_pool2d', 'kernel_size', kernel, pk),
      pair('max_pool2d', 'stride', stride, ps), pair('max_pool2d', 'padding', padding, pp, 0),
      pair('max_pool2d', 'dilation', dilation, pd, 1), ceil_mode and 1 or 0, 1, o1, nil) ~= 0 then
    fail()
  end
  return wrap(o1[0])
end

function F.avg_pool2d(x, kernel, stride, padding, ceil_mode, count_include_pad)
  local hx = H(x, 'avg_pool2d', 1)
  if C.em_avg_pool2d(S, hx, pair('avg_pool2d', 'kernel_size', kernel, pk),
      pair('avg_pool2d', 'stride', stride, ps), pair('avg_pool2d', 'padding', padding, pp, 0),
      ceil_mode and 1 or 0, count_include_pad == false and 0 or 1, o1) ~= 0 then fail() end
  return wrap(o1[0])
end

function F.adaptive_avg_pool2d(x, size)
  local hx = H(x, 'adaptive_avg_pool2d', 1)
  if C.em_adaptive_avg_pool2d(S, hx, pair('adaptive_avg_pool2d', 'output_size', size, pk), o1) ~= 0 then
    fail()
  end
  return wrap(o1[0])
end

-- -- Losses --------------------------------------------------------------------------------
local function opts_of(op, o)
  if o == nil then return {} end
  if type(o) ~= 'table' then raise(op .. ': expected an options table, got ' .. kind(o)) end
  return o
end

-- The fused op on (N, C) logits and (N) labels; F.cross_entropy (loss_functions.lua)
-- brings the other shapes and options to it.
local function fused_cross_entropy(input, target, ignore_index, label_smoothing, reduction)
  local r = reduction_of('cross_entropy', reduction)
  local hx, ht = H(input, 'cross_entropy', 1), H(target, 'cross_entropy', 2)
  if C.em_cross_entropy(S, hx, ht, 1, ignore_index, label_smoothing, r, o1, nil) ~= 0 then
    fail()
  end
  return wrap(o1[0])
end

function F.nll_loss(input, target, opts)
  opts = opts_of('nll_loss', opts)
  local r = reduction_of('nll_loss', opts.reduction)
  local ign = opts.ignore_index or -100
  if C.em_nll_loss(S, H(input, 'nll_loss', 1), H(target, 'nll_loss', 2), 1, ign, r, o1) ~= 0 then
    fail()
  end
  return wrap(o1[0])
end

function F.mse_loss(input, target, opts)
  opts = opts_of('mse_loss', opts)
  local r = reduction_of('mse_loss', opts.reduction)
  if C.em_mse_loss(S, H(input, 'mse_loss', 1), H(target, 'mse_loss', 2), r, o1) ~= 0 then
    fail()
  end
  return wrap(o1[0])
end

function F.binary_cross_entropy_with_logits(input, target, opts)
  opts = opts_of('binary_cross_entropy_with_logits', opts)
  local r = reduction_of('binary_cross_entropy_with_logits', opts.reduction)
  if C.em_bce_with_logits(S, H(input, 'binary_cross_entropy_with_logits', 1),
      H(target, 'binary_cross_entropy_with_logits', 2), r, o1) ~= 0 then
    local dtype_msg = core.errmsg():find('target has dtype int') ~= nil
    fail_as('binary_cross_entropy_with_logits', 'bce_with_logits',
      dtype_msg and ' (targets are 0/1 floats here: target:to(input.dtype))' or nil)
  end
  return wrap(o1[0])
end

-- cross_entropy (every option and shape), l1_loss, smooth_l1_loss, huber_loss.
require('ember.nn.loss_functions')(F, fused_cross_entropy, reduction_of, opts_of)

-- -- Normalisation ----------------------------------------------------------------------------
-- batch_norm(x, running_mean, running_var, weight, bias, training, momentum, eps)
function F.batch_norm(x, rm, rv, w, b, training, momentum, eps)
  momentum, eps = momentum or 0.1, eps or 1e-5
  local h = H(x, 'batch_norm', 1)
  local hrm = rm ~= nil and H(rm, 'batch_norm', 2) or nil
  local hrv = rv ~= nil and H(rv, 'batch_norm', 3) or nil
  local hw = w ~= nil and H(w, 'batch_norm', 4) or nil
  local hb = b ~= nil and H(b, 'batch_norm', 5) or nil
  if C.em_batch_norm(S, h, hw, hb, hrm, hrv, training and 1 or 0, momentum, eps, o1, nil, nil) ~= 0 then
    -- A per-channel tensor that does not fit is the layer's num_features against
    -- the input's channels (dim 2): say so.
    local what, has, want = core.errmsg():match('^batch_norm: (%S+) %[(%d+)%] must be %[(%d+)%]$')
    if what then
      pcall(fail)
      raise(('batch_norm: input %s has %s channels (dim 2) but the %s is for %s: the layer was '
        .. 'made for num_features = %s; make it for %s (%s) or check the layer before it')
        :format(core.shape_str(h), want, what, has, has, want,
          C.em_tensor_ndim(h) >= 4 and ('BatchNorm2d(' .. want .. ')') or ('BatchNorm1d(' .. want .. ')')))
    end
    fail()
  end
  return wrap(o1[0])
end

-- layer_norm(x, normalized_shape, weight, bias, eps)
function F.layer_norm(x, shape, w, b, eps)
  eps = eps or 1e-5
  if type(shape) == 'number' then shape = { shape } end
  local nd = #shape
  local h = H(x, 'layer_norm', 1)
  if C.em_layer_norm(S, h, nd, w ~= nil and H(w, 'layer_norm', 3) or nil,
      b ~= nil and H(b, 'layer_norm', 4) or nil, eps, o1, nil, nil) ~= 0 then
    -- A weight that does not fit is the layer's normalized_shape against the
    -- input's last dims: name the layer that would fit.
    local xd = C.em_tensor_ndim(h)
    if core.errmsg():find('does not match the last', 1, true) and xd >= nd then
      local sz, last = C.em_tensor_sizes(h), {}
      for i = xd - nd, xd - 1 do last[#last + 1] = tostring(tonumber(sz[i])) end
      fail_as('layer_norm', nil, ('; the layer normalizes over [%s], the input ends in [%s]: '
        .. 'make it LayerNorm(%s)'):format(table.concat(shape, ','), table.concat(last, ','),
        nd == 1 and last[1] or '{' .. table.concat(last, ', ') .. '}'))
    end
    fail()
  end
  return wrap(o1[0])
end

function F.embedding(idx, w)
  local ok, flat = pcall(w.index_select, w, 1, idx:reshape(-1))
  if not ok then
    -- Named as the user's call: an index out of range is a token id out of range.
    -- The message already holds the user's position.
    local msg = tostring(flat):gsub(
      'index_select: index (%-?%d+) is out of range for dimension 1 of size (%d+)',
      'embedding: index %1 is out of range for %2 embeddings', 1)
    msg = msg:gsub('index_select: expected an int64 or int32 index tensor, got (%w+)',
      'embedding: expected int64 or int32 indices, got %1 (idx:long())', 1)
    error(msg, 0)
  end
  local shape = idx.shape
  shape[#shape + 1] = w.shape[2]
  return flat:reshape(shape)
end

F.is_tensor = is_tensor
return require('ember.amp.policy').wrap_functional(F)   -- autocast's op lists

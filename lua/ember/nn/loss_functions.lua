--[[
ember.nn.loss_functions -- F.cross_entropy with all of PyTorch's options, and the
regression losses F.l1_loss, F.smooth_l1_loss, F.huber_loss.

  cross_entropy(x, target, {weight, ignore_index = -100, label_smoothing = 0,
    reduction = 'mean'})
    x (N, C), (N, C, d1, ...) or (C); target: class labels (integers, 1-based,
    shape x's without dim 2) or class probabilities (a float tensor of x's shape).

Labels without class weights go to the fused C op (em_cross_entropy, which also
range-checks them); a K-dimensional input is moved to (N * d1 * ..., C) for it.
Class weights and probability targets are compositions of core ops (autograd and
every backend come with them), following PyTorch's formulas: with weights the
mean divides by the sum of the weights of the counted targets, and the smoothing
term is -sum_c w_c log p_c, over the same denominator. Called by functional.lua
with F and the fused op.
]]
local em = require 'ember'
local core = require 'ember.ffi'
local raise, kind, CC = core.raise, core.kind, core.C

return function(F, fused_cross_entropy, reduction_of, opts_of)
  local function shape_str(t) return '[' .. table.concat(t.shape, ',') .. ']' end

  local function reduce(op, v, r, denom)
    if r == 'none' then return v end
    if r == 'sum' then return v:sum() end
    if denom then return v:sum() / denom end
    return v:mean()
  end

  -- weight reshaped to broadcast along dim 2 of an nd-dim input.
  local function weight_view(w, nd, C)
    local s = {}
    for i = 1, nd do s[i] = 1 end
    s[math.min(2, nd)] = C
    return w:reshape(s)
  end

  local function check_weight(w, x, C)
    if not em.is_tensor(w) then
      raise('cross_entropy: weight must be a tensor of ' .. C .. ' class weights, got ' .. kind(w))
    end
    if w:dim() ~= 1 or w.shape[1] ~= C then
      raise(('cross_entropy: weight %s must be 1-D with one value per class (%d) of input %s')
        :format(shape_str(w), C, shape_str(x)))
    end
    if w.dtype ~= x.dtype or w.device ~= x.device then
      raise(("cross_entropy: weight is %s on %s but input is %s on %s; "
        .. "convert it with weight:to({dtype = '%s', device = '%s'})")
        :format(w.dtype, w.device, x.dtype, x.device, x.dtype, x.device))
    end
  end

  -- Probability targets: -sum_c w_c t_c log p_c, smoothed t_c, mean over N * d1 * ...
  local function prob_target(x, t, w, ls, r, C)
    local cdim = x:dim() == 1 and 1 or 2
    local logp = x:log_softmax(cdim)
    if ls > 0 then t = t * (1 - ls) + ls / C end
    local prod = logp * t
    if w then prod = prod * weight_view(w, x:dim(), C) end
    if r == 'none' then return -prod:sum(cdim) end
    if r == 'sum' then return -prod:sum() end
    return -prod:sum() / (x:numel() / C)
  end

  -- Labels with class weights: the fused op's per-target -log p_t (range-checked,
  -- 0 where ignored) times w_t, plus the smoothing term.
  local function weighted(x2, t2, w, ign, ls, r, C)
    local nll = fused_cross_entropy(x2, t2, ign, 0, 'none')
    local ignored = t2:eq(ign)
    local safe = em.where(ignored, 1, t2)
    local wt = em.where(ignored, 0, w:index_select(1, safe))
    local denom = r == 'mean' and wt:sum() or nil
    local loss = reduce('cross_entropy', nll * wt, r, denom)
    if ls > 0 then
      local smooth = -(x2:log_softmax(2) * w:reshape(1, C)):sum(2)
      smooth = em.where(ignored, 0, smooth)
      loss = loss * (1 - ls) + reduce('cross_entropy', smooth, r, denom) * (ls / C)
    end
    return loss
  end

  function F.cross_entropy(x, target, opts)
    opts = opts_of('cross_entropy', opts)
    reduction_of('cross_entropy', opts.reduction)
    local r = opts.reduction or 'mean'
    local ls, ign, w = opts.label_smoothing or 0, opts.ignore_index or -100, opts.weight
    if type(ls) ~= 'number' or not (ls >= 0 and ls <= 1) then
      raise('cross_entropy: label_smoothing must be a number in [0, 1], got ' .. tostring(ls))
    end
    if type(ign) ~= 'number' or ign % 1 ~= 0 then
      raise('cross_entropy: ignore_index must be an integer, got ' .. tostring(ign))
    end
    if not em.is_tensor(x) then raise('cross_entropy: expected a tensor as argument 1, got ' .. kind(x)) end
    if not em.is_tensor(target) then
      raise('cross_entropy: expected a tensor as argument 2 (class labels or probabilities), got '
        .. kind(target))
    end
    local nd = CC.em_tensor_ndim(x._h)
    -- The common case, (N, C) logits and (N) labels without weights, goes straight
    -- to the fused op (whose checks cover it): no shape tables in a training step.
    if w == nil and nd == 2 and CC.em_tensor_ndim(target._h) == 1 and
        not core.is_float[core.dtype_of(target._h)] then
      return fused_cross_entropy(x, target, ign, ls, opts.reduction)
    end
    if nd < 1 then raise('cross_entropy: input ' .. shape_str(x) .. ' must have a class dimension') end
    local C = nd == 1 and x.shape[1] or x.shape[2]
    if w ~= nil then check_weight(w, x, C) end
    if target:is_floating_point() then
      local same = target:dim() == nd
      for i = 1, nd do same = same and target.shape[i] == x.shape[i] end
      if not same then
        raise(("cross_entropy: a float target holds class probabilities and must have the "
          .. "input's shape %s, got %s (class labels are integers: target:long())")
          :format(shape_str(x), shape_str(target)))
      end
      return prob_target(x, target, w, ls, r, C)
    end
    -- Labels: (N, d1, ...) for input (N, C, d1, ...), a 0-d label for input (C).
    local want, xs = {}, shape_str(x)
    if nd == 1 then
      x = x:reshape(1, C)
    else
      want[1] = x.shape[1]
      for i = 3, nd do want[#want + 1] = x.shape[i] end
    end
    local ok = target:dim() == #want
    for i = 1, #want do ok = ok and target.shape[i] == want[i] end
    if not ok then
      raise(("cross_entropy: target %s must be [%s] (input %s without its class dim 2), "
        .. "or a float tensor of probabilities of the input's shape")
        :format(shape_str(target), table.concat(want, ','), xs))
    end
    local x2, t2 = x, target:reshape(-1)
    if nd > 2 then
      local perm = { 1 }
      for i = 3, nd do perm[#perm + 1] = i end
      perm[#perm + 1] = 2
      x2 = x:permute(perm):reshape(-1, C)
    end
    local loss
    if w ~= nil then loss = weighted(x2, t2, w, ign, ls, r, C)
    else loss = fused_cross_entropy(x2, t2, ign, ls, r) end
    if r == 'none' then loss = loss:reshape(want) end
    return loss
  end

  -- -- Regression losses ---------------------------------------------------------------
  local function check_pair(op, a, b)
    if not em.is_tensor(a) then raise(op .. ': expected a tensor as argument 1, got ' .. kind(a)) end
    if not em.is_tensor(b) then raise(op .. ': expected a tensor as argument 2, got ' .. kind(b)) end
    if not a:is_floating_point() or not b:is_floating_point() then
      raise(('%s: input and target must be floating point, got %s and %s'):format(op, a.dtype,
        b.dtype))
    end
  end

  local function positive(op, k, v, default)
    if v == nil then return default end
    if type(v) ~= 'number' or not (v >= 0) then
      raise(('%s: %s must be a number >= 0, got %s'):format(op, k, tostring(v)))
    end
    return v
  end

  function F.l1_loss(a, b, opts)
    opts = opts_of('l1_loss', opts)
    reduction_of('l1_loss', opts.reduction)
    check_pair('l1_loss', a, b)
    return reduce('l1_loss', (a - b):abs(), opts.reduction or 'mean')
  end

  -- 0.5 d^2 / beta where |d| < beta, |d| - 0.5 beta elsewhere; beta = 0 is l1.
  function F.smooth_l1_loss(a, b, opts)
    opts = opts_of('smooth_l1_loss', opts)
    reduction_of('smooth_l1_loss', opts.reduction)
    check_pair('smooth_l1_loss', a, b)
    local beta = positive('smooth_l1_loss', 'beta', opts.beta, 1)
    local d = (a - b):abs()
    local v = beta == 0 and d or em.where(d:lt(beta), d * d * (0.5 / beta), d - 0.5 * beta)
    return reduce('smooth_l1_loss', v, opts.reduction or 'mean')
  end

  -- 0.5 d^2 where |d| < delta, delta (|d| - 0.5 delta) elsewhere.
  function F.huber_loss(a, b, opts)
    opts = opts_of('huber_loss', opts)
    reduction_of('huber_loss', opts.reduction)
    check_pair('huber_loss', a, b)
    local delta = positive('huber_loss', 'delta', opts.delta, 1)
    local d = (a - b):abs()
    local v = em.where(d:lt(delta), d * d * 0.5, (d - 0.5 * delta) * delta)
    return reduce('huber_loss', v, opts.reduction or 'mean')
  end
end

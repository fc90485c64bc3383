--[[
ember.nn.attention -- em.nn.F.scaled_dot_product_attention(q, k, v, {mask, causal,
dropout, scale}) and em.nn.MultiheadAttention(dim, heads, {batch_first, dropout, bias,
kdim, vdim, add_bias_kv, add_zero_attn}).

On the CPU (float32, float64, bfloat16, no dropout) attention is the fused kernel of
core/cpu/attention.c: no L x S matrix is kept, forward or backward (it recomputes
each block's scores from the saved row log-sum-exps); its gradients reach autograd
through em.autograd.apply. Elsewhere (CUDA, meta) and with dropout it is the
composition matmul, softmax, matmul. A bool mask is true where a query may attend
(PyTorch's convention for this function); a float mask is added to the scores.
Both broadcast against (..., L, S).
]]
local ffi = require 'ffi'
local em = require 'ember'
local core = require 'ember.ffi'
local C, S, raise, kind = core.C, core.S, core.raise, core.kind

local function shape_str(t) return '[' .. table.concat(t.shape, ',') .. ']' end

-- The broadcast of two batch shapes, or nil when they do not broadcast.
local function broadcast(a, b)
  local n, out = math.max(#a, #b), {}
  for i = 1, n do
    local x, y = a[#a - n + i] or 1, b[#b - n + i] or 1
    if x ~= y and x ~= 1 and y ~= 1 then return nil end
    out[i] = x == 1 and y or x
  end
  return out
end

local function prod(s) local n = 1 for _, v in ipairs(s) do n = n * v end return n end
local function concat(a, b) local r = {} for _, v in ipairs(a) do r[#r + 1] = v end for _, v in ipairs(b) do r[#r + 1] = v end return r end

-- g summed down to shape (the gradient of an input that was broadcast).
local function sum_to(g, shape)
  local gs = g.shape
  local lead = #gs - #shape
  for _ = 1, lead do g = g:sum(1) end
  for d = 1, #shape do
    if shape[d] == 1 and g.shape[d] ~= 1 then g = g:sum(d, true) end
  end
  return g
end

local function batch_of(t) local s = t.shape; s[#s] = nil; s[#s] = nil; return s end

-- The mask as an additive tensor of the compute dtype, expanded to full (a view).
local function additive_mask(mask, cdt, full, what)
  if not em.is_tensor(mask) then raise(what .. ': mask must be a tensor, got ' .. kind(mask)) end
  if not broadcast(mask.shape, full) or #mask.shape > #full then
    raise(('%s: mask of shape %s does not broadcast to the scores\' shape [%s] (..., L, S)')
      :format(what, shape_str(mask), table.concat(full, ',')))
  end
  local m
  if mask.dtype == 'bool' then m = em.where(mask, 0, -math.huge):to(cdt)
  elseif mask:is_floating_point() then m = mask:to(cdt)
  else raise(('%s: mask must be bool (true = attend) or floating (added to the scores), got %s')
    :format(what, mask.dtype)) end
  return m:expand(full)
end

-- The mask view's batch dims as at most two (size, stride) groups the kernel reads
-- (b / inner) * s_outer + (b % inner) * s_inner; nil when they need more.
local function mask_groups(m, nb)
  local st = m:stride()
  local groups = {}
  for d = nb, 1, -1 do
    local n, s = m.shape[d], st[d]
    local g = groups[#groups]
    if n == 1 then -- nothing
    elseif g and s == g[2] * g[1] then g[1] = g[1] * n
    else groups[#groups + 1] = { n, s } end
  end
  if #groups > 2 then return nil end
  local inner, outer = groups[1] or { 1, 0 }, groups[2] or { 1, 0 }
  return inner[1], outer[2], inner[2], st[nb + 1], st[nb + 2]
end

local i64x5 = ffi.typeof('int64_t[5]')
local function ptr(t) return C.em_tensor_data(t._h) end
local dtype_code = { float32 = C.EM_FLOAT32, float64 = C.EM_FLOAT64, bfloat16 = C.EM_BFLOAT16 }

-- The fused CPU kernel; q, k, v already checked. Returns the output (batch..., L, Ev).
local function fused(q, k, v, mask, causal, scale, batch)
  local L, E, Skv, Ev = q.shape[#q.shape - 1], q.shape[#q.shape], k.shape[#k.shape - 1], v.shape[#v.shape]
  local B, dt = prod(batch), q.dtype
  local cdt = dt == 'float64' and 'float64' or 'float32'
  local function flat(t, n, c) return t:expand(concat(batch, { n, c })):reshape({ B, n, c }):contiguous() end
  local m, ms
  if mask ~= nil then
    m = additive_mask(mask, cdt, concat(batch, { L, Skv }), 'scaled_dot_product_attention')
    local inner, so, si, sl, ss = mask_groups(m, #batch)
    if not inner then
      m = m:contiguous()
      inner, so, si, sl, ss = B, 0, L * Skv, Skv, 1
    end
    ms = i64x5(inner, so, si, sl, ss)
  end
  local code = dtype_code[dt]
  local function run()
    local qc, kc, vc = flat(q:detach(), L, E), flat(k:detach(), Skv, E), flat(v:detach(), Skv, Ev)
    local out = em.empty({ B, L, Ev }, { dtype = dt })
    local lse = em.empty({ B, L }, { dtype = cdt })
    if C.em_cpu_attention_forward(S, code, B, L, Skv, E, Ev, ptr(qc), ptr(kc), ptr(vc),
        m and ptr(m) or nil, ms, causal and 1 or 0, scale, ptr(out), ptr(lse)) ~= 0 then
      core.fail()
    end
    return qc, kc, vc, out, lse
  end
  local qc, kc, vc, out, lse = em.no_grad(run)
  local value = out:reshape(concat(batch, { L, Ev }))
  local need = em.autograd.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad)
  if not need then return value end
  return em.autograd.apply('scaled_dot_product_attention', value, { q, k, v }, function(g)
    return em.no_grad(function()
      local gc = g:reshape({ B, L, Ev }):to(dt):contiguous()
      local dq, dk, dv = em.empty({ B, L, E }, { dtype = dt }), em.empty({ B, Skv, E }, { dtype = dt }),
        em.empty({ B, Skv, Ev }, { dtype = dt })
      if C.em_cpu_attention_backward(S, code, B, L, Skv, E, Ev, ptr(qc), ptr(kc), ptr(vc),
          m and ptr(m) or nil, ms, causal and 1 or 0, scale, ptr(out), ptr(lse), ptr(gc),
          ptr(dq), ptr(dk), ptr(dv)) ~= 0 then
        core.fail()
      end
      return {
        q.requires_grad and sum_to(dq:reshape(concat(batch, { L, E })), q.shape) or nil,
        k.requires_grad and sum_to(dk:reshape(concat(batch, { Skv, E })), k.shape) or nil,
        v.requires_grad and sum_to(dv:reshape(concat(batch, { Skv, Ev })), v.shape) or nil }
    end)
  end)
end

-- The composition every device runs; also returns the attention weights.
local function composed(q, k, v, mask, causal, scale, dropout, batch)
  local L, Skv = q.shape[#q.shape - 1], k.shape[#k.shape - 1]
  local s = em.matmul(q, k:transpose(-2, -1)) * scale
  if causal then
    local i = em.arange(0, L, { device = q.device }):reshape({ L, 1 })
    local j = em.arange(0, Skv, { device = q.device }):reshape({ 1, Skv })
    s = em.where(j:gt(i), -math.huge, s)
  end
  if mask ~= nil then
    s = s + additive_mask(mask, s.dtype, concat(batch, { L, Skv }), 'scaled_dot_product_attention')
  end
  local p = s:softmax(-1)
  -- the weights returned are the ones applied, after dropout (as PyTorch's MHA)
  if dropout > 0 then p = em.nn.F.dropout(p, dropout, true) end
  return em.matmul(p, v), p
end

local function check_inputs(what, q, k, v)
  for i, t in ipairs({ q, k, v }) do
    if not em.is_tensor(t) then
      raise(('%s: argument %d (%s) must be a tensor, got %s'):format(what, i, ({ 'q', 'k', 'v' })[i], kind(t)))
    end
    if t:dim() < 2 then
      raise(('%s: %s must have at least 2 dims (..., T, E), got %s'):format(what,
        ({ 'q', 'k', 'v' })[i], shape_str(t)))
    end
  end
  local qs, ks, vs = q.shape, k.shape, v.shape
  if qs[#qs] ~= ks[#ks] then
    raise(('%s: q %s and k %s must have the same last dim (the embedding E)'):format(what,
      shape_str(q), shape_str(k)))
  end
  if ks[#ks - 1] ~= vs[#vs - 1] then
    raise(('%s: k %s and v %s must have the same number of keys (dim -2)'):format(what,
      shape_str(k), shape_str(v)))
  end
  if q.dtype ~= k.dtype or q.dtype ~= v.dtype then
    raise(('%s: q, k, v must share a dtype, got %s, %s, %s'):format(what, q.dtype, k.dtype, v.dtype))
  end
  if q.device ~= k.device or q.device ~= v.device then
    raise(('%s: q, k, v must be on one device, got %s, %s, %s'):format(what, q.device, k.device, v.device))
  end
  if not q:is_floating_point() then raise(('%s: expected floating point inputs, got %s'):format(what, q.dtype)) end
  local batch = broadcast(batch_of(q), broadcast(batch_of(k), batch_of(v)) or { -1 })
  if not batch or not broadcast(batch_of(k), batch_of(v)) then
    raise(('%s: the batch dims of q %s, k %s, v %s do not broadcast'):format(what, shape_str(q),
      shape_str(k), shape_str(v)))
  end
  return batch
end

return function(nn)
  local F = nn.F
  local what = 'scaled_dot_product_attention'

  -- F._sdpa(q, k, v, o, want_weights, path): path 'fused' or 'composed' forces one
  -- (the tests compare them); returns the output and, when asked, the weights.
  function F._sdpa(q, k, v, o, want_weights, path)
    o = o or {}
    if type(o) ~= 'table' or em.is_tensor(o) then raise(what .. ': expected an options table, got ' .. kind(o)) end
    local batch = check_inputs(what, q, k, v)
    local E = q.shape[#q.shape]
    local scale = o.scale or 1 / math.sqrt(E)
    local dropout = o.dropout or o.dropout_p or 0
    if type(dropout) ~= 'number' or dropout < 0 or dropout > 1 then
      raise(('%s: dropout must be a probability in [0, 1], got %s'):format(what, tostring(dropout)))
    end
    local causal = o.causal or o.is_causal or false
    local mask = o.mask or o.attn_mask
    local can_fuse = q.device == 'cpu' and dropout == 0 and dtype_code[q.dtype] ~= nil and not want_weights
    if path == 'fused' and not can_fuse then raise(what .. ': the fused path needs cpu, no dropout, no weights') end
    if path ~= 'composed' and can_fuse then return fused(q, k, v, mask, causal, scale, batch) end
    return composed(q, k, v, mask, causal, scale, dropout, batch)
  end
  function F.scaled_dot_product_attention(q, k, v, o) return (F._sdpa(q, k, v, o)) end

  -- -- MultiheadAttention -------------------------------------------------------------
  local MHA = nn.Module:extend('MultiheadAttention')
  function MHA:init(dim, heads, o)
    o = o or {}
    if type(dim) ~= 'number' or type(heads) ~= 'number' or dim < 1 or heads < 1 then
      raise(('MultiheadAttention: dim and heads must be positive integers, got %s and %s')
        :format(tostring(dim), tostring(heads)))
    end
    if dim % heads ~= 0 then
      raise(('MultiheadAttention: dim %d must be divisible by heads %d (each head gets dim / heads)')
        :format(dim, heads))
    end
    for _, key in ipairs({ 'kdim', 'vdim' }) do
      local v = o[key]
      if v ~= nil and (type(v) ~= 'number' or v < 1 or v ~= math.floor(v)) then
        raise(('MultiheadAttention: %s must be a positive integer, got %s'):format(key, tostring(v)))
      end
    end
    local dt = o.dtype or 'float32'
    local function xavier(rows, cols)
      return nn.Parameter(nn.init.xavier_uniform_(em.empty({ rows, cols }, { dtype = dt })))
    end
    self.embed_dim, self.num_heads, self.head_dim = dim, heads, dim / heads
    self.kdim, self.vdim = o.kdim or dim, o.vdim or dim
    self.batch_first, self.dropout = o.batch_first or false, o.dropout or 0
    self.add_zero_attn = o.add_zero_attn or false
    -- (as torch: one packed projection when k and v have q's width, three otherwise)
    if self.kdim == dim and self.vdim == dim then
      self.in_proj_weight = xavier(3 * dim, dim)
    else
      self.q_proj_weight = xavier(dim, dim)
      self.k_proj_weight = xavier(dim, self.kdim)
      self.v_proj_weight = xavier(dim, self.vdim)
    end
    if o.bias ~= false then self.in_proj_bias = nn.Parameter(em.zeros({ 3 * dim }, { dtype = dt })) end
    -- (a learned key and value appended to every sequence: a place to attend
    -- that no padding masks)
    if o.add_bias_kv then
      self.bias_k = nn.Parameter(nn.init.xavier_normal_(em.empty({ 1, 1, dim }, { dtype = dt })))
      self.bias_v = nn.Parameter(nn.init.xavier_normal_(em.empty({ 1, 1, dim }, { dtype = dt })))
    end
    self.out_proj = nn.Linear(dim, dim, o.bias ~= false, { dtype = dt })
    if o.bias ~= false then nn.init.zeros_(self.out_proj.bias) end
  end

  -- mha(q, k, v[, {mask, attn_mask, key_padding_mask, causal, need_weights,
  -- average_attn_weights}]) -> output, weights (nil when need_weights = false).
  function MHA:forward(q, k, v, o)
    o = o or {}
    local name = 'MultiheadAttention'
    for i, t in ipairs({ q, k, v }) do
      if not em.is_tensor(t) then raise(('%s: argument %d must be a tensor, got %s'):format(name, i, kind(t))) end
    end
    local E, H, hd = self.embed_dim, self.num_heads, self.head_dim
    local unbatched = q:dim() == 2
    local want = unbatched and 2 or 3
    local widths = { E, self.kdim, self.vdim }
    for i, t in ipairs({ q, k, v }) do
      if t:dim() ~= want or t.shape[want] ~= widths[i] then
        raise(('%s: %s must be %s with embedding %d, got %s'):format(name, ({ 'q', 'k', 'v' })[i],
          unbatched and '(L, E)' or (self.batch_first and '(N, L, E)' or '(L, N, E)'), widths[i],
          shape_str(t)))
      end
    end
    if unbatched then q, k, v = q:unsqueeze(1), k:unsqueeze(1), v:unsqueeze(1)
    elseif self.batch_first then q, k, v = q:transpose(1, 2), k:transpose(1, 2), v:transpose(1, 2) end
    -- now (L, N, E)
    local L, N, Skv = q.shape[1], q.shape[2], k.shape[1]
    local w, b = self.in_proj_weight, self.in_proj_bias
    local own = { self.q_proj_weight, self.k_proj_weight, self.v_proj_weight }
    local function proj(x, i)
      return F.linear(x, w and w:narrow(1, (i - 1) * E + 1, E) or own[i],
        b and b:narrow(1, (i - 1) * E + 1, E) or nil)
    end
    local keys, values = proj(k, 2), proj(v, 3)
    -- extra key columns no mask covers: bias_k/bias_v, then a zero key and value
    local extra = 0
    if self.bias_k then
      keys = em.cat({ keys, self.bias_k:expand({ 1, N, E }) }, 1)
      values = em.cat({ values, self.bias_v:expand({ 1, N, E }) }, 1)
      extra = 1
    end
    local function heads(x, T) return x:reshape({ T, N * H, hd }):transpose(1, 2):reshape({ N, H, T, hd }) end
    local qh, kh, vh = heads(proj(q, 1), L), heads(keys, Skv + extra),
      heads(values, Skv + extra)
    if self.add_zero_attn then
      local z = em.zeros({ N, H, 1, hd }, { dtype = kh.dtype, device = kh.device })
      kh, vh = em.cat({ kh, z }, 3), em.cat({ vh, z }, 3)
      extra = extra + 1
    end
    -- every mask as additive floats: mask (true = attend), attn_mask and
    -- key_padding_mask (PyTorch's MHA convention: true = masked out)
    local function additive(m, attend, what)
      if not em.is_tensor(m) then raise(('%s: %s must be a tensor, got %s'):format(name, what, kind(m))) end
      if m.dtype ~= 'bool' then return m:to(qh.dtype) end
      if attend then return em.where(m, 0, -math.huge):to(qh.dtype) end
      return em.where(m, -math.huge, 0):to(qh.dtype)
    end
    local mask
    local function add(m)
      if extra > 0 then m = F.pad(m, { 0, extra }) end   -- (the extra keys: attend)
      mask = mask and (mask + m) or m
    end
    if o.mask ~= nil then add(additive(o.mask, true, 'mask')) end
    if o.attn_mask ~= nil then add(additive(o.attn_mask, false, 'attn_mask')) end
    if o.key_padding_mask ~= nil then
      local kp = additive(o.key_padding_mask, false, 'key_padding_mask')
      if kp.shape[#kp.shape] ~= Skv or kp:numel() ~= N * Skv then
        raise(('%s: key_padding_mask must be (N, S) = (%d, %d), got %s'):format(name, N, Skv, shape_str(kp)))
      end
      add(kp:reshape({ N, 1, 1, Skv }))
    end
    if mask ~= nil and mask:dim() == 3 then  -- (N*H, L, S), PyTorch's per-head layout
      mask = mask:reshape({ N, H, L, Skv + extra })
    end
    local need = o.need_weights ~= false
    local opts = { mask = mask, causal = o.causal or o.is_causal,
      dropout = self.training and self.dropout or 0 }
    local out, p = F._sdpa(qh, kh, vh, opts, need)
    out = out:transpose(2, 3):reshape({ N, L, E }):transpose(1, 2)   -- (L, N, E)
    out = self.out_proj(out)
    if unbatched then out = out:squeeze(2)
    elseif self.batch_first then out = out:transpose(1, 2) end
    if not need then return out, nil end
    if o.average_attn_weights ~= false then p = p:mean(2) end
    if unbatched then p = p:squeeze(1) end
    return out, p
  end
  function MHA:extra_repr()
    return ('%d, heads=%d, batch_first=%s'):format(self.embed_dim, self.num_heads, tostring(self.batch_first))
  end
  nn.MultiheadAttention = MHA
end

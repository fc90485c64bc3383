--[[
ember.nn.conv -- Conv2d(in, out, k, {stride, padding, dilation, groups, bias}) and
Conv1d (the same options, numbers; F.conv1d runs conv2d on a height-1 view),
PyTorch's default init (kaiming_uniform_(a = sqrt(5)); bias U(+-1/sqrt(fan_in))).
]]
local em = require 'ember'
local core = require 'ember.ffi'
return function(nn)
  local Module, F, I = nn.Module, nn.F, nn.init
  local function two(v) if type(v) == 'number' then return { v, v } end return v end

  local Conv2d = Module:extend('Conv2d')
  function Conv2d:init(cin, cout, k, o)
    o = o or {}
    local g = o.groups or 1
    if cin % g ~= 0 or cout % g ~= 0 then
      core.raise(('Conv2d: in_channels %d and out_channels %d must be divisible by groups %d')
        :format(cin, cout, g))
    end
    self.in_channels, self.out_channels, self.groups = cin, cout, g
    self.kernel_size, self.stride = two(k), two(o.stride or 1)
    self.padding, self.dilation = two(o.padding or 0), two(o.dilation or 1)
    local dt = o.dtype or 'float32'
    local ks = self.kernel_size
    self.weight = nn.Parameter(I.kaiming_uniform_(em.empty({ cout, cin / g, ks[1], ks[2] },
      { dtype = dt }), { a = math.sqrt(5) }))
    if o.bias ~= false then
      local fan_in = cin / g * ks[1] * ks[2]
      local bound = fan_in > 0 and 1 / math.sqrt(fan_in) or 0
      self.bias = nn.Parameter(I.uniform_(em.empty({ cout }, { dtype = dt }), -bound, bound))
    end
  end
  function Conv2d:forward(x)
    return F.conv2d(x, self.weight, self.bias, self.stride, self.padding, self.dilation, self.groups)
  end
  function Conv2d:extra_repr()
    local k, s, p = self.kernel_size, self.stride, self.padding
    return ('%d, %d, kernel_size={%d,%d}, stride={%d,%d}, padding={%d,%d}%s%s'):format(
      self.in_channels, self.out_channels, k[1], k[2], s[1], s[2], p[1], p[2],
      self.groups ~= 1 and ', groups=' .. self.groups or '', self.bias and '' or ', bias=false')
  end
  nn.Conv2d = Conv2d

  -- F.conv1d(x (N, C, L) or (C, L), w (out, C/groups, k), b, stride, padding,
  -- dilation, groups); padding a number, 'valid' or 'same' (stride 1).
  local function one(op, what, v, def)
    if v == nil then return def end
    if type(v) == 'table' and #v == 1 then v = v[1] end
    if type(v) ~= 'number' then
      core.raise(('%s: %s must be a number, got %s'):format(op, what, core.kind(v)))
    end
    return v
  end
  function F.conv1d(x, w, b, stride, padding, dilation, groups)
    if not em.is_tensor(x) or not em.is_tensor(w) then
      core.raise('conv1d: expected tensors for the input and the weight')
    end
    local batched = x:dim() == 3
    if x:dim() ~= 2 and x:dim() ~= 3 then
      core.raise(('conv1d: expected an input (N, C, L) or (C, L), got [%s]'):format(table.concat(x.shape, ',')))
    end
    if w:dim() ~= 3 then
      core.raise(('conv1d: expected a weight (out, in/groups, k), got [%s]'):format(table.concat(w.shape, ',')))
    end
    stride, dilation = one('conv1d', 'stride', stride, 1), one('conv1d', 'dilation', dilation, 1)
    local k = w.shape[3]
    if padding == 'valid' then padding = 0
    elseif padding == 'same' then
      if stride ~= 1 then core.raise("conv1d: padding = 'same' needs stride 1, got " .. stride) end
      local total = dilation * (k - 1)
      local lo = math.floor(total / 2)
      if total % 2 == 1 then x = F.pad(x, { lo, total - lo }) padding = 0 else padding = lo end
    else padding = one('conv1d', 'padding', padding, 0) end
    if not batched then x = x:unsqueeze(1) end
    local y = F.conv2d(x:unsqueeze(3), w:unsqueeze(3), b, { 1, stride }, { 0, padding },
      { 1, dilation }, groups or 1):squeeze(3)
    if not batched then y = y:squeeze(1) end
    return y
  end

  local Conv1d = Module:extend('Conv1d')
  function Conv1d:init(cin, cout, k, o)
    o = o or {}
    local g = o.groups or 1
    if cin % g ~= 0 or cout % g ~= 0 then
      core.raise(('Conv1d: in_channels %d and out_channels %d must be divisible by groups %d')
        :format(cin, cout, g))
    end
    self.in_channels, self.out_channels, self.groups = cin, cout, g
    self.kernel_size = one('Conv1d', 'kernel_size', k)
    self.stride, self.dilation = one('Conv1d', 'stride', o.stride, 1), one('Conv1d', 'dilation', o.dilation, 1)
    self.padding = (o.padding == 'same' or o.padding == 'valid') and o.padding or one('Conv1d', 'padding', o.padding, 0)
    local dt = o.dtype or 'float32'
    self.weight = nn.Parameter(I.kaiming_uniform_(em.empty({ cout, cin / g, self.kernel_size },
      { dtype = dt }), { a = math.sqrt(5) }))
    if o.bias ~= false then
      local fan_in = cin / g * self.kernel_size
      local bound = fan_in > 0 and 1 / math.sqrt(fan_in) or 0
      self.bias = nn.Parameter(I.uniform_(em.empty({ cout }, { dtype = dt }), -bound, bound))
    end
  end
  function Conv1d:forward(x)
    return F.conv1d(x, self.weight, self.bias, self.stride, self.padding, self.dilation, self.groups)
  end
  function Conv1d:extra_repr()
    return ('%d, %d, kernel_size=%d, stride=%d, padding=%s%s%s'):format(self.in_channels,
      self.out_channels, self.kernel_size, self.stride, tostring(self.padding),
      self.groups ~= 1 and ', groups=' .. self.groups or '', self.bias and '' or ', bias=false')
  end
  nn.Conv1d = Conv1d
end

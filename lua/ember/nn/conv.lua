--[[
ember.nn.conv -- Conv2d(in, out, k, {stride, padding, dilation, groups, bias}),
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
end

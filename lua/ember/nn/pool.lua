--[[
ember.nn.pool -- MaxPool2d(k[, stride, padding]), AvgPool2d(k[, stride, padding]),
AdaptiveAvgPool2d(out). stride defaults to the kernel size, as in PyTorch.
An options table may follow: {dilation, ceil_mode, count_include_pad}.
]]
return function(nn)
  local Module, F = nn.Module, nn.F
  local function str(v) if type(v) == 'table' then return '{' .. table.concat(v, ',') .. '}' end return tostring(v) end

  local function args(self, k, stride, padding, o)
    if type(stride) == 'table' and stride[1] == nil then stride, padding, o = nil, nil, stride end
    if type(padding) == 'table' and padding[1] == nil then padding, o = nil, padding end
    o = o or {}
    self.kernel_size, self.stride = k, stride or o.stride or k
    self.padding = padding or o.padding or 0
    self.dilation, self.ceil_mode = o.dilation or 1, o.ceil_mode or false
    self.count_include_pad = o.count_include_pad ~= false
  end
  local function repr(self)
    return ('kernel_size=%s, stride=%s, padding=%s'):format(str(self.kernel_size),
      str(self.stride), str(self.padding))
  end

  local MaxPool2d = Module:extend('MaxPool2d')
  MaxPool2d.init = args
  function MaxPool2d:forward(x)
    return F.max_pool2d(x, self.kernel_size, self.stride, self.padding, self.dilation, self.ceil_mode)
  end
  MaxPool2d.extra_repr = repr
  nn.MaxPool2d = MaxPool2d

  local AvgPool2d = Module:extend('AvgPool2d')
  AvgPool2d.init = args
  function AvgPool2d:forward(x)
    return F.avg_pool2d(x, self.kernel_size, self.stride, self.padding, self.ceil_mode,
      self.count_include_pad)
  end
  AvgPool2d.extra_repr = repr
  nn.AvgPool2d = AvgPool2d

  local Adaptive = Module:extend('AdaptiveAvgPool2d')
  function Adaptive:init(size) self.output_size = size end
  function Adaptive:forward(x) return F.adaptive_avg_pool2d(x, self.output_size) end
  function Adaptive:extra_repr() return 'output_size=' .. str(self.output_size) end
  nn.AdaptiveAvgPool2d = Adaptive
end

--[[
ember.nn.activation -- ReLU GELU SiLU Tanh Sigmoid Softmax(dim) LogSoftmax(dim),
and Flatten([start, end]) (1-based dims, default 2..-1: keeps the batch dim).
]]
return function(nn)
  local Module, F = nn.Module, nn.F
  local function simple(name, fn)
    local cls = Module:extend(name)
    function cls:forward(x) return fn(x) end
    nn[name] = cls
  end
  simple('ReLU', F.relu)
  simple('SiLU', F.silu)
  simple('Tanh', F.tanh)
  simple('Sigmoid', F.sigmoid)

  local GELU = Module:extend('GELU')
  function GELU:init(approximate) self.approximate = approximate end
  function GELU:forward(x) return F.gelu(x, self.approximate) end
  nn.GELU = GELU

  for _, name in ipairs({ 'Softmax', 'LogSoftmax' }) do
    local cls = Module:extend(name)
    local fn = name == 'Softmax' and F.softmax or F.log_softmax
    function cls:init(dim) self.dim = dim or -1 end
    function cls:forward(x) return fn(x, self.dim) end
    function cls:extra_repr() return 'dim=' .. self.dim end
    nn[name] = cls
  end

  local Flatten = Module:extend('Flatten')
  function Flatten:init(s, e) self.start_dim, self.end_dim = s or 2, e or -1 end
  function Flatten:forward(x) return x:flatten(self.start_dim, self.end_dim) end
  function Flatten:extra_repr() return ('start_dim=%d, end_dim=%d'):format(self.start_dim, self.end_dim) end
  nn.Flatten = Flatten
end

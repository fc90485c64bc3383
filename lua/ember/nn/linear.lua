--[[
ember.nn.linear -- Linear(in, out[, bias]) and Identity, PyTorch's default init:
weight kaiming_uniform_(a = sqrt(5)), bias U(-1/sqrt(in), 1/sqrt(in)).
]]
local em = require 'ember'
return function(nn)
  local Module, F, I = nn.Module, nn.F, nn.init

  local Linear = Module:extend('Linear')
  function Linear:init(inf, outf, bias, opts)
    if type(bias) == 'table' then bias, opts = nil, bias end
    opts = opts or {}
    if bias == nil then bias = opts.bias ~= false end
    local dt = opts.dtype or 'float32'
    self.in_features, self.out_features = inf, outf
    self.weight = nn.Parameter(I.kaiming_uniform_(em.empty({ outf, inf }, { dtype = dt }), { a = math.sqrt(5) }))
    if bias then
      local bound = inf > 0 and 1 / math.sqrt(inf) or 0
      self.bias = nn.Parameter(I.uniform_(em.empty({ outf }, { dtype = dt }), -bound, bound))
    end
  end
  function Linear:forward(x) return F.linear(x, self.weight, self.bias) end
  function Linear:extra_repr()
    return ('in_features=%d, out_features=%d, bias=%s'):format(self.in_features,
      self.out_features, tostring(self.bias ~= nil))
  end
  nn.Linear = Linear

  local Identity = Module:extend('Identity')
  function Identity:forward(x) return x end
  nn.Identity = Identity
end

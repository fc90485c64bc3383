--[[
ember.nn.dropout -- Dropout(p): zeroes elements with probability p in training
and scales the rest by 1/(1-p); the identity in eval.
]]
return function(nn)
  local Dropout = nn.Module:extend('Dropout')
  function Dropout:init(p) self.p = p == nil and 0.5 or p end
  function Dropout:forward(x) return nn.F.dropout(x, self.p, self.training) end
  function Dropout:extra_repr() return 'p=' .. self.p end
  nn.Dropout = Dropout
end

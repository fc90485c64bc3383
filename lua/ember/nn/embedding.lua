--[[
ember.nn.embedding -- Embedding(n, d): a lookup table initialised N(0, 1);
indices are 1-based integers of any shape, the result adds a last dim d.
]]
local em = require 'ember'
return function(nn)
  local Embedding = nn.Module:extend('Embedding')
  function Embedding:init(n, d, o)
    o = o or {}
    self.num_embeddings, self.embedding_dim = n, d
    self.weight = nn.Parameter(nn.init.normal_(em.empty({ n, d }, { dtype = o.dtype or 'float32' })))
  end
  function Embedding:forward(idx) return nn.F.embedding(idx, self.weight) end
  function Embedding:extra_repr() return self.num_embeddings .. ', ' .. self.embedding_dim end
  nn.Embedding = Embedding
end

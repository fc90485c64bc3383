--[[
ember.nn.loss -- CrossEntropyLoss({weight, ignore_index, label_smoothing,
reduction}), NLLLoss, MSELoss, BCEWithLogitsLoss, L1Loss ({reduction}),
SmoothL1Loss({beta, reduction}), HuberLoss({delta, reduction}); called as
loss(input, target). The options go to the em.nn.F function as given.
]]
return function(nn)
  local F = nn.F
  local function make(name, fn)
    local cls = nn.Module:extend(name)
    function cls:init(o) self.opts = o or {} end
    function cls:forward(input, target) return fn(input, target, self.opts) end
    function cls:extra_repr() return "reduction='" .. (self.opts.reduction or 'mean') .. "'" end
    nn[name] = cls
  end
  make('CrossEntropyLoss', F.cross_entropy)
  -- The class weights are a buffer, as in PyTorch: in the state_dict, moved by :to().
  local CE = nn.CrossEntropyLoss
  local ce_init = CE.init
  function CE:init(o)
    ce_init(self, o)
    if self.opts.weight ~= nil then self:register_buffer('weight', self.opts.weight) end
  end
  function CE:forward(input, target)
    local o = self.opts
    if o.weight ~= nil then
      o = {}
      for k, v in pairs(self.opts) do o[k] = v end
      o.weight = self.weight
    end
    return F.cross_entropy(input, target, o)
  end
  make('NLLLoss', F.nll_loss)
  make('MSELoss', F.mse_loss)
  make('BCEWithLogitsLoss', F.binary_cross_entropy_with_logits)
  make('L1Loss', F.l1_loss)
  make('SmoothL1Loss', F.smooth_l1_loss)
  make('HuberLoss', F.huber_loss)
end

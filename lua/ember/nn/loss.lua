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
  make('NLLLoss', F.nll_loss)
  make('MSELoss', F.mse_loss)
  make('BCEWithLogitsLoss', F.binary_cross_entropy_with_logits)
  make('L1Loss', F.l1_loss)
  make('SmoothL1Loss', F.smooth_l1_loss)
  make('HuberLoss', F.huber_loss)
end

--[[
ember.nn.loss -- CrossEntropyLoss({label_smoothing, reduction, ignore_index}),
NLLLoss, MSELoss, BCEWithLogitsLoss ({reduction}); called as loss(input, target).
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
end

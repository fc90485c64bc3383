--[[
ember.nn.norm -- BatchNorm1d(n), BatchNorm2d(n) (buffers running_mean,
running_var, num_batches_tracked; momentum 0.1, eps 1e-5; batch statistics in
training, running ones in eval) and LayerNorm(shape) (weight 1, bias 0).
Options: {eps, momentum, affine, track_running_stats, elementwise_affine, dtype}.
]]
local em = require 'ember'
local core = require 'ember.ffi'
return function(nn)
  local Module, F = nn.Module, nn.F

  local function make_bn(name, ndims)
    local BN = Module:extend(name)
    function BN:init(n, o)
      o = o or {}
      local dt = o.dtype or 'float32'
      self.num_features, self.eps = n, o.eps or 1e-5
      self.momentum = o.momentum == nil and 0.1 or o.momentum
      self.affine = o.affine ~= false
      self.track_running_stats = o.track_running_stats ~= false
      if self.affine then
        self.weight = nn.Parameter(em.ones({ n }, { dtype = dt }))
        self.bias = nn.Parameter(em.zeros({ n }, { dtype = dt }))
      end
      if self.track_running_stats then
        self:register_buffer('running_mean', em.zeros({ n }, { dtype = dt }))
        self:register_buffer('running_var', em.ones({ n }, { dtype = dt }))
        self:register_buffer('num_batches_tracked', em.zeros({}, { dtype = 'int64' }))
      end
    end
    function BN:forward(x)
      local d = x:dim()
      if not ndims[d] then
        core.raise(('%s: expected a %s input, got %d-D %s'):format(name, ndims.what, d,
          '[' .. table.concat(x.shape, ',') .. ']'))
      end
      local use_batch = self.training or not self.track_running_stats
      local momentum = self.momentum
      if self.training and self.track_running_stats then
        em.no_grad(function() self.num_batches_tracked:add_(1) end)
        if momentum == false or momentum == nil then  -- cumulative moving average
          momentum = 1 / self.num_batches_tracked:item()
        end
      end
      local track = self.track_running_stats and (self.training or not use_batch)
      return F.batch_norm(x, track and self.running_mean or nil,
        track and self.running_var or nil, self.weight, self.bias, use_batch, momentum, self.eps)
    end
    function BN:extra_repr()
      return ('%d, eps=%g, momentum=%s, affine=%s'):format(self.num_features, self.eps,
        tostring(self.momentum), tostring(self.affine))
    end
    return BN
  end
  nn.BatchNorm1d = make_bn('BatchNorm1d', { [2] = true, [3] = true, what = '2-D or 3-D' })
  nn.BatchNorm2d = make_bn('BatchNorm2d', { [4] = true, what = '4-D' })

  local LayerNorm = Module:extend('LayerNorm')
  function LayerNorm:init(shape, o)
    o = o or {}
    if type(shape) == 'number' then shape = { shape } end
    self.normalized_shape, self.eps = shape, o.eps or 1e-5
    self.elementwise_affine = o.elementwise_affine ~= false
    if self.elementwise_affine then
      local dt = o.dtype or 'float32'
      self.weight = nn.Parameter(em.ones(shape, { dtype = dt }))
      self.bias = nn.Parameter(em.zeros(shape, { dtype = dt }))
    end
  end
  function LayerNorm:forward(x)
    return F.layer_norm(x, self.normalized_shape, self.weight, self.bias, self.eps)
  end
  function LayerNorm:extra_repr()
    return ('{%s}, eps=%g'):format(table.concat(self.normalized_shape, ','), self.eps)
  end
  nn.LayerNorm = LayerNorm
end

--[[
ember.nn.linear -- Linear(in, out[, bias]) and Identity, PyTorch's default init:
weight kaiming_uniform_(a = sqrt(5)), bias U(-1/sqrt(in), 1/sqrt(in)).
]]
local em = require 'ember'
local core = require 'ember.ffi'
local C = core.C
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
  -- The input's last dim must be in_features; checked here so the message names
  -- the layer rather than the matmul inside F.linear.
  function Linear:forward(x)
    if em.is_tensor(x) then
      local h = x._h
      local nd = C.em_tensor_ndim(h)
      local last = nd > 0 and tonumber(C.em_tensor_sizes(h)[nd - 1]) or nil
      if last ~= self.in_features then
        core.raise(('Linear(%d, %d): input %s must have in_features = %d as its last dim, got %s; '
          .. 'reshape the input (x:flatten(2) for images) or make the layer Linear(%s, %d)')
          :format(self.in_features, self.out_features, core.shape_str(h), self.in_features,
            last or 'a 0-d tensor', last or '?', self.out_features))
      end
    end
    return F.linear(x, self.weight, self.bias)
  end
  function Linear:extra_repr()
    return ('in_features=%d, out_features=%d, bias=%s'):format(self.in_features,
      self.out_features, tostring(self.bias ~= nil))
  end
  nn.Linear = Linear

  local Identity = Module:extend('Identity')
  function Identity:forward(x) return x end
  nn.Identity = Identity
end

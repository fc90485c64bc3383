--[[
port_common.lua -- what the ported PyTorch scripts (test_port_*.lua) share: tensors
from tests/fixtures/ports_*.lua, PyTorch's state_dict names mapped to ember's, and
the comparisons of losses and final parameters.

  local P = dofile(dir .. 'port_common.lua')(H, em)
]]
return function(H, em)
  local P = {}

  -- A fixture tensor {shape, data} as float32 (int64 for integer ids), on device.
  function P.tensor(fx, dtype, device)
    local t = em.tensor(fx.data, { dtype = dtype or 'float32' }):reshape(fx.shape)
    return device and t:to(device) or t
  end

  -- PyTorch counts list entries from 0 (`h.0.ln_1.weight`), ember from 1
  -- (`h.1.ln_1.weight`): every number between dots moves up by one.
  function P.ember_name(name)
    local s = ('.' .. name .. '.'):gsub('%.(%d+)%f[.]', function(n) return '.' .. (tonumber(n) + 1) end)
    return s:sub(2, -2)
  end

  -- PyTorch's state_dict, renamed, as ember tensors.
  function P.state(fx_state)
    local sd = {}
    for k, v in pairs(fx_state) do sd[P.ember_name(k)] = P.tensor(v) end
    return sd
  end

  P.maxdiff = H.maxdiff

  -- Every entry of PyTorch's final state_dict against the model's, within tol; the
  -- names in skip (PyTorch's) are left to the caller.
  function P.check_final(model, fx_final, tol, what, skip)
    local sd = model:state_dict()
    local names, worst, worst_name = {}, 0, nil
    for k in pairs(fx_final) do
      if not (skip and skip[k]) then names[#names + 1] = k end
    end
    table.sort(names)
    for _, k in ipairs(names) do
      local t = sd[P.ember_name(k)]
      H.check(t ~= nil, (what or 'final') .. ': the model has no ' .. P.ember_name(k))
      if t then
        local d = P.maxdiff(t, fx_final[k])
        if d > worst then worst, worst_name = d, k end
      end
    end
    H.check(worst < tol, ('%s: parameters differ from PyTorch\'s by %g (at %s), over %g')
      :format(what or 'final', worst, tostring(worst_name), tol))
    return worst
  end

  -- Losses per step against PyTorch's, each within tol (relative).
  function P.check_losses(got, want, tol, what)
    H.check(#got == #want, ('%s: %d steps run, %d expected'):format(what, #got, #want))
    for i = 1, #want do
      local d = math.abs(got[i] - want[i]) / (1 + math.abs(want[i]))
      H.check(d < tol, ('%s: step %d: %.9g, PyTorch %.9g'):format(what, i, got[i], want[i]))
    end
  end

  return P
end

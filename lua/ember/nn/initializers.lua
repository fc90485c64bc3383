--[[
ember.nn.initializers -- em.nn.init: in-place weight initialisers (run under
no_grad, so they also work on parameters), with PyTorch's fan and gain rules.
]]
local em = require 'ember'
local core = require 'ember.ffi'

local I = {}

function I.calculate_fan_in_and_fan_out(t)
  local s = t.shape
  if #s < 2 then core.raise('init: fan in and fan out need a tensor of at least 2 dims') end
  local rf = 1
  for d = 3, #s do rf = rf * s[d] end
  return s[2] * rf, s[1] * rf
end

function I.calculate_gain(nonlinearity, param)
  if nonlinearity == 'relu' then return math.sqrt(2) end
  if nonlinearity == 'tanh' then return 5 / 3 end
  if nonlinearity == 'leaky_relu' then
    local a = param or 0.01
    return math.sqrt(2 / (1 + a * a))
  end
  if nonlinearity == 'selu' then return 3 / 4 end
  return 1
end

local function nograd(f) return em.no_grad(f) end

function I.uniform_(t, a, b) nograd(function() t:uniform_(a or 0, b or 1) end) return t end
function I.normal_(t, mean, std) nograd(function() t:normal_(mean or 0, std or 1) end) return t end
function I.constant_(t, v) nograd(function() t:fill_(v) end) return t end
function I.zeros_(t) return I.constant_(t, 0) end
function I.ones_(t) return I.constant_(t, 1) end

local function fan(t, mode)
  local fi, fo = I.calculate_fan_in_and_fan_out(t)
  return (mode == 'fan_out') and fo or fi
end

-- kaiming_uniform_(t, {a, mode, nonlinearity}); PyTorch's default nonlinearity is leaky_relu.
function I.kaiming_uniform_(t, o)
  o = o or {}
  local gain = I.calculate_gain(o.nonlinearity or 'leaky_relu', o.a or 0)
  local bound = gain * math.sqrt(3 / fan(t, o.mode))
  return I.uniform_(t, -bound, bound)
end

function I.kaiming_normal_(t, o)
  o = o or {}
  local gain = I.calculate_gain(o.nonlinearity or 'leaky_relu', o.a or 0)
  return I.normal_(t, 0, gain / math.sqrt(fan(t, o.mode)))
end

function I.xavier_uniform_(t, gain)
  local fi, fo = I.calculate_fan_in_and_fan_out(t)
  local bound = (gain or 1) * math.sqrt(6 / (fi + fo))
  return I.uniform_(t, -bound, bound)
end

function I.xavier_normal_(t, gain)
  local fi, fo = I.calculate_fan_in_and_fan_out(t)
  return I.normal_(t, 0, (gain or 1) * math.sqrt(2 / (fi + fo)))
end

return I

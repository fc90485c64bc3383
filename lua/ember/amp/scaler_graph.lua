--[[
ember.amp.scaler_graph -- the GradScaler's device side, which lets a step run
inside em.cuda.graph.

Why. Eagerly the scaler reads one flag per step on the host (:item()) and
branches: skip opt:step() or not, back the scale off or grow it. A captured
graph replays device work only; the Lua that branched does not run again, and
reading a value can't be captured at all. So, as PyTorch's capturable scaler
does, everything the step decides lives on the device:

  scale     a 0-d float32 tensor: scale(loss) multiplies by it, unscale_ by its
            reciprocal, so a replay uses the scale of that moment, not the one
            the capture saw;
  found     a 0-d float32 tensor, 1 when some gradient is inf or NaN (the NaN
            trick of amp/scaler.lua, then x ~= x);
  step      "skip via where": the parameters and every optimizer state tensor
            are copied before opt:step() and, after it, put back where found is
            1 -- bit for bit, whatever the update did with the infs. (This costs
            a copy of the parameters and the state per step, in the graph's pool.)
  update    growth tracker and scale as tensor arithmetic: with f = found,
            t = (tracker + 1)(1 - f), g = (t >= interval):
            scale *= f*backoff + (1 - f)(g*growth + 1 - g), tracker = t(1 - g).

The tensors are made by the first step outside the capture (the warm-up the
optimizer needs anyway); once an update has been captured the device holds the
truth, and the host's copy (get_scale, state_dict, eager steps) is read back
from it by each call outside a capture (one read each), eager updates writing
it back. Under a strategy the flag would need a
collective inside the capture: one replica only for now.
]]
local em = require 'ember'
local core = require 'ember.ffi'
local C, S, raise = core.C, core.S, core.raise

local G = {}

function G.capturing() return C.em_cuda_capturing(S) >= 0 end

local WHAT = 'GradScaler inside em.cuda.graph'

-- The device state on the loss's device, made (outside a capture) or checked.
function G.ensure(self, loss)
  local dev = loss.device
  local d = self._dev
  if d and d.device == dev then return d end
  if G.capturing() then
    raise(('%s: the scale lives on %s and is made by a step outside the graph: run one ' ..
      'step (scale, backward, step, update) before capturing, as the optimizer needs'):format(
      WHAT, dev))
  end
  G.host(self)
  d = { device = dev,
        scale = em.full({}, self._scale, { dtype = 'float32', device = dev }),
        tracker = em.full({}, self._growth_tracker, { dtype = 'float32', device = dev }) }
  self._dev = d
  return d
end

-- Reads the device's scale and tracker back into the host's numbers once an
-- update has been captured (outside a capture only). From then on the device
-- holds the truth for good: a graph may be launched at any time, and its
-- launches run no Lua.
function G.host(self)
  if not self._dev_auth or G.capturing() then return end
  local d = self._dev
  self._scale = d.scale:item()
  self._growth_tracker = d.tracker:item()
end

-- After an eager update: the device copy follows the host's numbers.
function G.push(self)
  local d = self._dev
  if d then d.scale:fill_(self._scale); d.tracker:fill_(self._growth_tracker) end
end

local function device_state(self)
  local d = self._dev
  if d == nil then
    raise(WHAT .. ': call scaler:scale(loss) inside the graph before unscale_/step/update')
  end
  return d
end

-- unscale_ in a capture: gradients times 1/scale; found on the device.
function G.unscale_(self, gs, s)
  if s ~= nil and (s.world_size or 1) > 1 then
    raise(('%s: %d replicas would agree on skipping through a collective in the graph, ' ..
      'which is not supported: capture forward and backward only, and call ' ..
      'scaler:step(opt) and scaler:update() after the graph'):format(WHAT, s.world_size))
  end
  return G.unscale_found(device_state(self), gs)
end

-- Gradients gs times 1/scale (device state d's), and a 0-d float32 tensor on
-- d's device that is 1 when some gradient is inf or NaN (0 for no gradients).
-- (Also the compiled step's, ember.amp.scaler_compile.)
function G.unscale_found(d, gs)
  local inv = d.scale:reciprocal()
  local acc = nil
  for _, g in ipairs(gs) do
    g:mul_(inv)
    local t = (g * 0):sum():float()
    acc = acc == nil and t or acc:add(t)
  end
  if acc == nil then return em.zeros({}, { dtype = 'float32', device = d.device }) end
  return acc:ne(acc):float()
end

-- opt:step() whose effect is undone where found is 1.
function G.step(opt, found, ...)
  local keep = {}
  for _, grp in ipairs(opt.param_groups) do
    for _, p in ipairs(grp.params) do
      if p.grad ~= nil then keep[#keep + 1] = { p, p:detach():clone() } end
    end
  end
  for _, st in pairs(opt.state or {}) do
    if type(st) == 'table' then
      for _, v in pairs(st) do
        if type(v) == 'cdata' and core.box_t and require('ffi').istype(core.box_t, v) then
          keep[#keep + 1] = { v, v:clone() }
        end
      end
    end
  end
  opt:step(...)
  local bad = found:gt(0)
  em.no_grad(function()
    for _, k in ipairs(keep) do
      local t = k[1]:detach()
      t:copy_(em.where(bad, k[2], t))
    end
  end)
end

-- update() in a capture: the schedule as tensor arithmetic (the essay above).
function G.update(self, found)
  local d = device_state(self)
  local f = found
  local t = (d.tracker + 1) * (1 - f)
  local g = t:ge(self.growth_interval):float()
  local grown = d.scale * (f * self.backoff_factor + (1 - f) * (g * self.growth_factor + 1 - g))
  -- a scale that would overflow float32 stays where it was
  d.scale:copy_(em.where(grown:lt(math.huge), grown, d.scale))
  d.tracker:copy_(t * (1 - g))
  self._dev_auth = true
end

return G

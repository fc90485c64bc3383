--[[
ember.amp.scaler_compile -- the GradScaler inside a step compiled by em.compile
(on the CPU).

Why. Eagerly the scaler reads one flag per step (any gradient inf or NaN?) and
branches in Lua: skip opt:step() or not, back the scale off or grow it. A replay
runs no Lua. So inside a capture:

  scale     a 0-d float32 tensor (the scaler's device state, kept by
            amp/scaler_graph.lua's ensure): scale(loss) multiplies by it and
            unscale_ by its reciprocal, so a replay uses the scale of its time;
  found     computed as the CUDA graph path does (gradients' NaN sum), agreed by
            the replicas through a recorded 'max' allreduce;
  step      opt:step() inside a compile guard on found: a replay jumps past the
            update when found is 1, as the eager step does not call it;
  after     each replay, hooks read found (a CPU scalar: no cost) and do on the
            host what the eager calls would have: the per-optimizer state that
            step() and update() read, and update()'s schedule, whose new scale
            is written into the scale tensor for the next replay.

The capture runs the update to record it, so a step that finds inf at its
capture (the first steps of a float16 run often do) is run as the eager step
runs it and not kept: the next call captures again (compile.retry).
]]
local compile = require 'ember.compile'
local G = require 'ember.amp.scaler_graph'

local SC = {}

-- Whether a scaler call on loss's device goes the compiled way.
function SC.active(t) return compile.capturing() and t.device == 'cpu' end

-- The scale tensor, made outside the record (a replay must not remake it).
local function state(self, t)
  return compile.once(G.ensure, self, t)
end

function SC.scale(self, loss)
  local d = state(self, loss)
  return loss * (loss.dtype == 'float32' and d.scale or d.scale:to(loss.dtype))
end

-- Gradients times 1/scale; found (a 0-d tensor, 1 when some gradient is inf or
-- NaN on any replica) and its value at the capture.
function SC.unscale_(self, gs, strategy)
  local found = G.unscale_found(state(self, { device = 'cpu' }), gs)
  if strategy ~= nil and (strategy.world_size or 1) > 1 then strategy:allreduce(found, 'max') end
  return found, compile.peek(found) ~= 0
end

-- After each replay: opt's entry as the eager unscale_ and step leave it (st is
-- the capture's: whether fn stepped is known once fn has run).
function SC.follow(self, opt, st)
  compile.on_replay(nil, function()
    self._per_opt[opt] = { unscaled = true, stepped = st.stepped,
                           found_inf = st.found_t:item() ~= 0 }
  end)
end

-- scaler:step(opt) in a capture: the update guarded by found. Returns whether it
-- stepped at the capture (a capture that skipped is not kept).
function SC.step(opt, st, ...)
  if st.found_inf then
    compile.retry('a GradScaler skipped the optimizer step (inf or NaN gradients), so its ' ..
      'update was not recorded')
    return false
  end
  compile.guard(st.found_t, opt.step, opt, ...)
  return true
end

-- scaler:update() in a capture: runs now as eagerly (advance), and again after
-- every replay on what that replay found.
function SC.update(self, advance)
  advance(self)
  compile.on_replay(nil, function() advance(self) end)
end

return SC

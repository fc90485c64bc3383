--[[
ember.amp.scaler -- em.amp.GradScaler: dynamic loss scaling.

  local scaler = em.amp.GradScaler{init_scale = 65536, growth_factor = 2,
    backoff_factor = 0.5, growth_interval = 2000, enabled = true, strategy = s}
  scaler:scale(loss):backward()
  scaler:unscale_(opt)             -- optional, before clipping; once per step
  local stepped = scaler:step(opt) -- skipped when a gradient is inf or NaN
  scaler:update()

How the inf check is done: unscale_ multiplies each gradient by 1/scale in
place and adds (g * 0):sum() into one running scalar on the gradients' device:
g * 0 is 0 for finite elements and NaN for inf or NaN ones, so the sum is NaN
exactly when some element is not finite. One reduction per tensor, no host
round trip until the end, where a single :item() reads the flag (one sync per
step on a GPU).

Under a strategy the flag is agreed by all replicas: a 1-element float32 tensor
(1 for "found inf") is allreduced with 'max' through the strategy's
communicator, so every replica skips the same steps and the scales stay equal.
The strategy is opts.strategy (a mirrored strategy, or a wrapped / sharded /
pipelined model, whose .strategy is used); without it, a replica started by
`ember --replicas N` or by mpirun uses em.distribute.mirrored{}, which shares
the replicas' communicator. Every replica takes part, whatever it holds: a
sharded model's optimizer sees only this replica's shards of the gradients,
and a pipeline stage's only its stage's parameters, so each checks its own
part and the allreduce makes one answer of them (a replica with no gradient
at all still sends its 0).

Inside em.cuda.graph the scale, the flag and the skip live on the device
(ember.amp.scaler_graph); inside a step compiled by em.compile, on the CPU,
the skip is a guard of the replay and the schedule follows each replay
(ember.amp.scaler_compile).
]]
local ffi = require 'ffi'
local em = require 'ember'
local core = require 'ember.ffi'
local raise, kind = core.raise, core.kind
local G = require 'ember.amp.scaler_graph'
local SC = require 'ember.amp.scaler_compile'
local compile = require 'ember.compile'

local Scaler = {}
Scaler.__index = Scaler

local function num_opt(o, k, def, ok, what)
  local v = o[k]
  if v == nil then return def end
  if type(v) ~= 'number' or not ok(v) then
    raise(('GradScaler: %s must be %s, got %s'):format(k, what, tostring(v)))
  end
  return v
end

local known = { init_scale = true, growth_factor = true, backoff_factor = true,
  growth_interval = true, enabled = true, strategy = true }

local function GradScaler(o)
  o = o or {}
  if type(o) ~= 'table' then raise('GradScaler: expected an options table, got ' .. kind(o)) end
  for k in pairs(o) do
    if not known[k] then raise(("GradScaler: unknown option '%s'"):format(tostring(k))) end
  end
  local self = setmetatable({
    _scale = num_opt(o, 'init_scale', 65536, function(v) return v > 0 and v < math.huge end,
      'a positive finite number'),
    growth_factor = num_opt(o, 'growth_factor', 2, function(v) return v > 1 end, '> 1'),
    backoff_factor = num_opt(o, 'backoff_factor', 0.5, function(v) return v > 0 and v < 1 end,
      'in (0, 1)'),
    growth_interval = num_opt(o, 'growth_interval', 2000,
      function(v) return v >= 1 and v % 1 == 0 end, 'an integer >= 1'),
    enabled = o.enabled ~= false,
    _strategy = o.strategy,
    _growth_tracker = 0,
    _per_opt = setmetatable({}, { __mode = 'k' }),  -- opt -> {unscaled, found_inf}
  }, Scaler)
  return self
end

function Scaler:get_scale()
  if not self.enabled then return 1.0 end
  G.host(self)
  return self._scale
end
function Scaler:is_enabled() return self.enabled end

-- loss * scale (differentiable); the loss itself when disabled.
function Scaler:scale(loss)
  if not self.enabled then return loss end
  if not core.box_t or not require('ffi').istype(core.box_t, loss) then
    raise('GradScaler:scale: expected a tensor, got ' .. kind(loss))
  end
  if loss.is_cuda then
    local d = G.ensure(self, loss)
    if G.capturing() then return loss * d.scale:to(loss.dtype) end
  end
  if SC.active(loss) then return SC.scale(self, loss) end
  G.host(self)
  return loss * self._scale
end

local function strategy_of(self)
  local s = self._strategy
  if s ~= nil then
    if type(s) == 'table' and s.allreduce == nil and s.strategy ~= nil then s = s.strategy end
    return s
  end
  local r = rawget(_G, 'EMBER_REPLICA')
  local rank, size = ffi.new('int[1]'), ffi.new('int[1]')
  if r and (r.world_size or 1) > 1 or
     not r and core.C.em_mpi_launched(rank, size) ~= 0 and size[0] > 1 then
    self._strategy = em.distribute.mirrored{}
    return self._strategy
  end
  return nil
end

local function grads_of(opt)
  if type(opt) ~= 'table' or type(opt.param_groups) ~= 'table' then
    raise('GradScaler: expected an optimizer (with param_groups), got ' .. kind(opt))
  end
  local gs = {}
  for _, g in ipairs(opt.param_groups) do
    for _, p in ipairs(g.params) do
      local gr = p.grad
      if gr ~= nil then gs[#gs + 1] = gr end
    end
  end
  return gs
end

-- Multiplies opt's gradients by 1/scale and records whether any is inf or NaN
-- (on every replica alike). Once per step and optimizer.
function Scaler:unscale_(opt)
  if not self.enabled then return end
  local st = self._per_opt[opt]
  if st and st.unscaled then
    raise('GradScaler:unscale_: already called for this optimizer since the last update()')
  end
  local gs = grads_of(opt)
  if G.capturing() then
    self._per_opt[opt] = { unscaled = true, found_t = G.unscale_(self, gs, strategy_of(self)) }
    return
  end
  if compile.capturing() and (#gs == 0 or SC.active(gs[1])) then
    local found_t, found = SC.unscale_(self, gs, strategy_of(self))
    local st = { unscaled = true, found_t = found_t, found_inf = found, compiled = true }
    self._per_opt[opt] = st
    SC.follow(self, opt, st)
    return
  end
  G.host(self)
  local inv = 1.0 / self._scale
  local acc = nil       -- per device: a running NaN-iff-nonfinite scalar
  for _, g in ipairs(gs) do
    g:mul_(inv)
    local s = (g * 0):sum():float()
    acc = acc == nil and s or acc:add(s:to(acc.device))
  end
  local flag = 0
  if acc ~= nil and acc:item() ~= acc:item() then flag = 1 end
  local s = strategy_of(self)
  if s ~= nil and (s.world_size or 1) > 1 then
    local t = em.tensor({ flag })
    if s.device and s.device ~= 'cpu' then t = t:to(s.device) end
    flag = s:allreduce(t, 'max'):item()
  end
  self._per_opt[opt] = { unscaled = true, found_inf = flag > 0 }
end

-- Unscales (unless unscale_ ran) and calls opt:step() when no gradient is inf or
-- NaN; returns whether it stepped (nil inside a graph capture, where the step is
-- undone on the device instead).
function Scaler:step(opt, ...)
  if not self.enabled then opt:step(...); return true end
  local st = self._per_opt[opt]
  if not (st and st.unscaled) then self:unscale_(opt); st = self._per_opt[opt] end
  st.stepped = true
  if st.compiled then return SC.step(opt, st, ...) end
  if st.found_t then G.step(opt, st.found_t, ...); return nil end
  if st.found_inf then return false end
  opt:step(...)
  return true
end

-- update()'s schedule on the host: the scale backs off when this step found
-- inf/NaN (or becomes new_scale), the next step's state is readied.
local function advance(self, new_scale)
  G.host(self)
  local found = false
  for _, st in pairs(self._per_opt) do if st.found_inf then found = true end end
  if new_scale ~= nil then
    if type(new_scale) ~= 'number' or not (new_scale > 0) then
      raise('GradScaler:update: new_scale must be a positive number, got ' .. tostring(new_scale))
    end
    self._scale = new_scale
  elseif found then
    self._scale = self._scale * self.backoff_factor
    self._growth_tracker = 0
  else
    self._growth_tracker = self._growth_tracker + 1
    if self._growth_tracker >= self.growth_interval then
      local g = self._scale * self.growth_factor
      if g < math.huge then self._scale = g end
      self._growth_tracker = 0
    end
  end
  self._per_opt = setmetatable({}, { __mode = 'k' })
  compile.once(G.push, self)
  local prof = package.loaded['ember.profile']
  if prof and prof.note then prof.note('amp.scaler', { scale = self._scale, found_inf = found }) end
end

-- Backs the scale off when this step found inf/NaN, grows it after
-- growth_interval clean steps in a row; readies the next step.
function Scaler:update(new_scale)
  if not self.enabled then return end
  if G.capturing() then
    if new_scale ~= nil then raise('GradScaler:update: new_scale can not be captured in a CUDA graph') end
    local f = nil
    for _, st in pairs(self._per_opt) do
      if st.found_t then f = f == nil and st.found_t or (f + st.found_t):gt(0):float() end
    end
    if f == nil then raise('GradScaler:update: inside em.cuda.graph, call scaler:step(opt) first') end
    G.update(self, f)
    self._per_opt = setmetatable({}, { __mode = 'k' })
    return
  end
  local compiled = false
  for _, st in pairs(self._per_opt) do compiled = compiled or st.compiled end
  if compiled then
    if new_scale ~= nil then
      raise('GradScaler:update: new_scale can not be replayed by em.compile: call ' ..
        'update(new_scale) outside the compiled function')
    end
    SC.update(self, advance)
    return
  end
  advance(self, new_scale)
end

function Scaler:state_dict()
  if not self.enabled then return {} end
  G.host(self)
  return { scale = self._scale, growth_factor = self.growth_factor,
    backoff_factor = self.backoff_factor, growth_interval = self.growth_interval,
    _growth_tracker = self._growth_tracker }
end

function Scaler:load_state_dict(sd)
  if type(sd) ~= 'table' then raise('GradScaler:load_state_dict: expected a table, got ' .. kind(sd)) end
  if next(sd) == nil then
    if self.enabled then raise('GradScaler:load_state_dict: the state is empty (saved by a disabled scaler)') end
    return
  end
  if type(sd.scale) ~= 'number' or type(sd._growth_tracker) ~= 'number' then
    raise('GradScaler:load_state_dict: the state lacks scale or _growth_tracker')
  end
  self._scale, self._growth_tracker = sd.scale, sd._growth_tracker
  self.growth_factor = sd.growth_factor or self.growth_factor
  self.backoff_factor = sd.backoff_factor or self.backoff_factor
  self.growth_interval = sd.growth_interval or self.growth_interval
  G.push(self)
end

function Scaler:__tostring()
  G.host(self)
  return ('GradScaler(scale=%g, growth_factor=%g, backoff_factor=%g, growth_interval=%d%s)')
    :format(self._scale, self.growth_factor, self.backoff_factor, self.growth_interval,
      self.enabled and '' or ', disabled')
end

return GradScaler

--[[
ember.distribute.shard.grads -- a sharded model's gradients, averaged across
the replicas during backward (shard.lua's essay, "Gradients"): each gradient
copied into its unit's flat buffer as it arrives, units launched strictly in
unit order, at most MAX_IN_FLIGHT under way, and each finished unit's slices
given to the shards as .grad.
]]
local em = require 'ember'
local core = require 'ember.ffi'
local gather = require 'ember.distribute.shard.gather'

local M = {}

local slice, nbytes, count = gather.slice, gather.nbytes, gather.count
local release = core.handles.release

local function launch(dm, u)
  local s, flat = dm.strategy, u.flat
  if dm.shard_mode == 'gradients' or dm.shard_mode == 'parameters' then
    count(dm, 'reduce_scatter', nbytes(flat) * (s.world_size - 1) / s.world_size)
    u.work = s:reduce_scatter(flat, 'mean', { async = true })
  else
    count(dm, 'allreduce', 2 * nbytes(flat) * (s.world_size - 1) / s.world_size)
    u.work = s:allreduce(flat, 'mean', { async = true })
  end
  u.t_launch = em.clock()
end

local drain
local function launch_ready(dm)
  local units = dm._units
  while dm._next <= #units and units[dm._next].ready do
    launch(dm, units[dm._next])
    dm._next = dm._next + 1
    drain(dm, false)
  end
end

-- The unit's flat gradient buffer (zeros where no gradient arrives: padding,
-- unused parameters), in the dtype it is sent in.
local function flat_buffer(dm, u)
  if not u.flat then
    u.flat = em.zeros(u.L, { dtype = dm._comm_dtype or u.dtype, device = u.device })
  end
  return u.flat
end

-- Unit u has every gradient it will get; the weights of 'parameters' go (their
-- work in this backward is done).
local function complete(dm, u)
  flat_buffer(dm, u)
  u.ready = true
  if dm.shard_mode == 'parameters' and u.depth == 0 then gather.free(dm, u) end
end

-- Each gradient goes into its place in the flat buffer as it arrives, and the
-- parameter lets go of it: a unit holds one buffer, not its gradients and a copy.
function M.on_grad(dm, i)
  local u = dm._units[dm._unit_of[i]]
  local pos = dm._pos[i]
  if u.ready or u.g[pos] then return end
  local p = dm._P[i]
  local g = p.grad
  p.grad = nil
  local dst = slice(flat_buffer(dm, u), u.off[pos], u.numel[pos])
  local view = dst:view(g.shape)
  view:copy_(g)
  release(view); release(dst); release(g)
  u.g[pos] = true
  u.got = u.got + 1
  if u.got == #u.idx then complete(dm, u) end
  launch_ready(dm)
end

-- The averaged slice of each shard: its .grad, or added to the one it has.
local function apply(dm, u, result)
  local cast = result.dtype ~= u.dtype and result:to(u.dtype)
  local seg = cast or result
  local part = not (dm.shard_mode == 'gradients' or dm.shard_mode == 'parameters') and
    dm.shard_mode and slice(seg, dm.strategy.rank * u.seg, u.seg)
  for pos, i in ipairs(u.idx) do
    local len = u.hi[pos] - u.lo[pos]
    local sh = dm._shards[i]
    if len > 0 then
      local piece = slice(part or seg, u.at[pos], len)
      local g = piece:view(sh.shape)
      release(piece)
      if dm._offload then
        local host = g:to('cpu')
        release(g)
        g = host
      end
      local have = sh.grad
      if have == nil then sh.grad = g else have:add_(g); release(have); release(g) end
    end
  end
  if part then release(part) end
  if cast then release(cast) end
  release(result)
end

-- Units are applied in unit order, releasing their flat buffers: the oldest
-- once more than MAX_IN_FLIGHT are under way (block = false: waiting for it if
-- need be), or all of them (block = true). So a backward holds a bounded number
-- of flat gradient buffers whatever the model's depth -- and always the same
-- number at the same point: a unit is never applied early because the comm
-- thread happened to be quick (w:done()), which made the step's peak memory
-- depend on thread timing.
local MAX_IN_FLIGHT = require('ember.distribute.shard.layout').MAX_IN_FLIGHT
drain = function(dm, block)
  local units = dm._units
  while dm._applied < dm._next - 1 do
    local u = units[dm._applied + 1]
    local w, flat = u.work, u.flat
    local in_flight = dm._next - 1 - dm._applied
    if not block and in_flight <= MAX_IN_FLIGHT then return end
    local t0 = em.clock()
    u.work, u.flat = nil, nil
    dm._applied = dm._applied + 1
    local ok, r = pcall(w.wait, w)
    local t1 = em.clock()
    -- the collective's time from its launch to when it was seen done (under way
    -- while backward computed, unless backward was waiting for it)
    dm._stats.wait_s = dm._stats.wait_s + (t1 - t0)
    dm._stats.comm_s = dm._stats.comm_s + (t1 - u.t_launch)
    if ok and not dm._error then apply(dm, u, r) elseif not ok then dm._error = dm._error or r end
    -- (an allreduce's result is its input, released by apply)
    if flat and (not ok or r ~= flat) then release(flat) end
  end
end

function M.reset(dm)
  for _, u in ipairs(dm._units) do
    u.ready, u.got, u.g = false, 0, {}
  end
  dm._next, dm._applied, dm._error = 1, 0, nil
end

local function finish(dm)
  for _, u in ipairs(dm._units) do
    if not u.ready then complete(dm, u) end
  end
  launch_ready(dm)
  drain(dm, true)
  local err = dm._error
  M.reset(dm)
  if err then error(err, 0) end
end

function M.on_backward_end(dm, failed)
  dm._armed = false
  if failed then
    -- the collectives already started must still be waited for (their buffers)
    dm._error = 'backward failed'
    drain(dm, true)
    for _, u in ipairs(dm._units) do
      if u.flat then release(u.flat); u.flat = nil end
    end
    M.reset(dm)
    return
  end
  finish(dm)
  dm._stats.steps = dm._stats.steps + 1
  if dm.shard_mode == 'optimizer' or dm.shard_mode == 'gradients' then dm._stale = true end
  local ms = em.memory_stats(dm.strategy.device)
  dm._mem.activations = math.max(0, ms.peak - dm._mem.start)
end

return M

--[[
ember.distribute.shard.gather -- a sharded model's weights from the replicas'
shards (shard.lua's essay, "Weights"): every unit at once after a step for
'optimizer' and 'gradients'; one module's, just before its forward and again
for its backward, for 'parameters', freed in between.
]]
local ffi = require 'ffi'
local em = require 'ember'
local core = require 'ember.ffi'
local C, S = core.C, core.S

local M = {}

local function pack(...) return { n = select('#', ...), ... } end
-- narrow with a 0-based start, on dim 1 of a 1-D tensor
function M.slice(t, start, len) return t:narrow(1, start + 1, len) end
function M.nbytes(t) return t:numel() * t:element_size() end
function M.check(st) if st ~= 0 then core.fail() end end
local slice, nbytes, check = M.slice, M.nbytes, M.check
-- Buffers of megabytes are released as soon as they are dead, not at Lua's next
-- collection (which would hold every unit's gathered weights at once).
local release = core.handles.release

-- This replica's segment of unit u, on the unit's device, and whether it is a
-- temporary (the caller releases it).
local function segment(dm, u)
  if u.segt then
    if dm._offload then return u.segt:to(u.device), true end
    return u.segt, false
  end
  local pieces, used = {}, 0
  for k, i in ipairs(u.idx) do
    if u.hi[k] > u.lo[k] then
      pieces[#pieces + 1] = dm._shards[i]:detach()
      used = used + u.hi[k] - u.lo[k]
    end
  end
  if used < u.seg then
    pieces[#pieces + 1] = em.zeros(u.seg - used, { dtype = u.dtype, device = u.device })
  end
  local seg = em.cat(pieces, 1)
  for _, t in ipairs(pieces) do release(t) end
  return seg, true
end

-- The model's communication counters (comm_stats).
function M.count(dm, kind, bytes)
  local st = dm._stats
  st[kind] = st[kind] + 1
  st.bytes = st.bytes + bytes
end

-- The flat unit from every replica's segment (a collective). Async: the work,
-- and the segment to release once it is done (or nil).
function M.allgather(dm, u, async)
  local seg, temp = segment(dm, u)
  M.count(dm, 'allgather', nbytes(seg) * (dm.strategy.world_size - 1))
  local r = dm.strategy:allgather(seg, { async = async })
  if async then return r, temp and seg or nil end
  if temp then release(seg) end
  return r
end

-- Copies (or fills, for resident weights) every weight of unit u from its flat
-- unit, then releases the flat unit.
local function scatter_flat(dm, u, flat, fill)
  for pos, i in ipairs(u.idx) do
    local p = dm._P[i]
    local piece = slice(flat, u.off[pos], u.numel[pos])
    local v = piece:view(p.shape)
    if fill then check(C.em_tensor_fill_data(S, p._h, v._h)) else p:copy_(v) end
    release(v); release(piece)
  end
  release(flat)
end

-- 'optimizer' / 'gradients': every unit's full weights from the shards.
function M.gather_all(dm)
  em.no_grad(function()
    local works, temps = {}, {}
    for k, u in ipairs(dm._units) do works[k], temps[k] = M.allgather(dm, u, true) end
    for k, u in ipairs(dm._units) do
      scatter_flat(dm, u, works[k]:wait(), false)
      if temps[k] then release(temps[k]) end
    end
  end)
  dm._stale = false
end

-- 'parameters': unit u's weights, gathered into their resident storage.
function M.gather(dm, u)
  if u.gathered then return end
  em.no_grad(function() scatter_flat(dm, u, M.allgather(dm, u, false), true) end)
  u.gathered = true
end

function M.free(dm, u)
  for _, i in ipairs(u.idx) do check(C.em_tensor_free_data(S, dm._P[i]._h)) end
  u.gathered = false
end

-- 'parameters': the module gathers its weights for its forward, frees them after,
-- and its outputs carry a node that gathers them again for its backward. The
-- node hands its gradient on to the core (apply's give): held by a Lua tensor,
-- the module's output gradient would live until a collection, not only until
-- the module's backward has used it.
function M.hook_forward(dm, u)
  local m = u.module
  local inner = m.forward
  u.depth = 0
  local function gather_for_backward(g)
    M.gather(dm, u)
    return { g }
  end
  rawset(m, 'forward', function(self, ...)
    M.gather(dm, u)
    u.depth = u.depth + 1
    local res = pack(pcall(inner, self, ...))
    u.depth = u.depth - 1
    if u.depth == 0 then M.free(dm, u) end
    if not res[1] then error(res[2], 0) end
    -- (also outside a synced step: any backward through these outputs needs the
    -- weights back, no_sync's included)
    if em.is_grad_enabled() then
      for k = 2, res.n do
        local t = res[k]
        if ffi.istype(core.box_t, t) and t.requires_grad then
          res[k] = em.autograd.apply('gather_for_backward', t, { t }, gather_for_backward, true)
        end
      end
    end
    return unpack(res, 2, res.n)
  end)
end

return M

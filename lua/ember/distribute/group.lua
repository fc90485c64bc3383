--[[
ember.distribute.group -- a strategy's groups (the methods distribute.lua gives
Strategy): s:group(ranks) and s:split(color) make a strategy of some of s's
replicas, on a communicator of their own (core/dist/group.c).
]]
local ffi = require 'ffi'
local em = require 'ember'
local core = require 'ember.ffi'
local cm = require 'ember.distribute.comm'
local C, S = core.C, core.S
local raise = core.raise

local Strategy = {}

-- s:group(ranks): a strategy of some of s's replicas (core/dist/group.c), for
-- instance one pipeline stage's replicas {p, p + P, p + 2P, ...}. Every member
-- calls it with the same ranks (ascending, 0-based ranks of s); the result is a
-- strategy like s -- rank is this replica's index in ranks, world_size #ranks --
-- whose collectives, send / recv and wrap (any shard mode) stay among the members,
-- with `parent` (s) and `ranks` besides. Its bytes travel by s's point-to-point on
-- channels of its own, so s's sends between the same replicas never mix with it.
function Strategy:group(ranks)
  if type(ranks) ~= 'table' then
    raise('group: expected a list of ranks, got ' .. core.kind(ranks))
  end
  local n = #ranks
  local arr = ffi.new('int[?]', math.max(n, 1))
  local copy = {}
  for i = 1, n do
    local r = ranks[i]
    if type(r) ~= 'number' or r % 1 ~= 0 then
      raise(('group: ranks[%d] must be a rank (0-based integer), got %s'):format(i, tostring(r)))
    end
    arr[i - 1], copy[i] = r, r
  end
  local c = cm.comm(self, 'group')
  local out = ffi.new('em_comm*[1]')
  if C.em_comm_group(S, c, n, arr, out) ~= 0 then core.fail() end
  local box = cm.track(ffi.gc(cm.commbox_t(out[0]), cm.group_collected), cm.free_group)
  local g = box._h
  -- (the Strategy metatable is ember.distribute's, loaded by the time s exists)
  return setmetatable({
    _box = box, backend = ffi.string(C.em_comm_backend(g)), timeout = self.timeout,
    rank = C.em_comm_rank(g), world_size = C.em_comm_size(g), device = self.device,
    parent = self, ranks = copy,
  }, require('ember.distribute').Strategy)
end

-- s:split(color): every replica of s calls it; those that pass the same color
-- (an integer) form one group, in the order of their ranks in s.
function Strategy:split(color)
  if type(color) ~= 'number' or color % 1 ~= 0 then
    raise('split: color must be an integer, got ' .. tostring(color))
  end
  local all = self:allgather(em.tensor({ color }, { dtype = 'int64' }):to(self.device))
  local ranks = {}
  for r, v in ipairs(all:to('cpu'):totable()) do
    if v == color then ranks[#ranks + 1] = r - 1 end
  end
  return self:group(ranks)
end

return Strategy

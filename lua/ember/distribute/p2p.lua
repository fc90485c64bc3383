--[[
ember.distribute.p2p -- a strategy's point-to-point send and recv (the methods
distribute.lua gives Strategy), synchronous or, with {async = true}, a Work to
wait for (distribute/comm.lua runs them).
]]
local core = require 'ember.ffi'
local cm = require 'ember.distribute.comm'
local C, S = core.C, core.S
local raise = core.raise
local comm, run = cm.comm, cm.run

local Strategy = {}

-- Point-to-point: the k-th send to a rank meets that rank's k-th recv from this
-- one. A send returns once the peer has the values (use async sends when two
-- replicas send to each other first); recv fills t in place.
local function p2p(self, name, t, rank, o, start)
  o = o or {}
  if type(o) ~= 'table' then raise(name .. ': expected an options table {async = true}') end
  local h = core.H(t, name, 1)
  if type(rank) ~= 'number' or rank % 1 ~= 0 or rank < 0 or rank >= self.world_size
     or rank == self.rank then
    raise(('%s: rank must be another replica of this job (0..%d, this one is %d), got %s')
      :format(name, self.world_size - 1, self.rank, tostring(rank)))
  end
  local c = comm(self, name)
  return run(self, o.async, function(w) return start(c, h, rank, w) end, t)
end

function Strategy:send(t, rank, o)
  return p2p(self, 'send', t, rank, o,
    function(c, h, r, w) return C.em_comm_send(S, c, h, r, w) end)
end

function Strategy:recv(t, rank, o)
  return p2p(self, 'recv', t, rank, o,
    function(c, h, r, w) return C.em_comm_recv(S, c, h, r, w) end)
end

return Strategy

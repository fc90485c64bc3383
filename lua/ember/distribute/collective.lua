--[[
ember.distribute.collective -- a strategy's collectives (the methods
distribute.lua gives Strategy): allreduce, broadcast, allgather, reduce_scatter
and barrier, each synchronous or, with {async = true}, a Work to wait for
(distribute/comm.lua runs them).
]]
local ffi = require 'ffi'
local core = require 'ember.ffi'
local cm = require 'ember.distribute.comm'
local C, S = core.C, core.S
local raise = core.raise
local comm, run = cm.comm, cm.run

local Strategy = {}

local ops = { sum = 0, mean = 1, max = 2, min = 3 }
local function op_id(name, where)
  local id = ops[name or 'sum']
  if not id then
    raise(("%s: unknown reduction %s (expected 'sum', 'mean', 'max' or 'min')"):format(where,
      type(name) == 'string' and "'" .. name .. "'" or core.kind(name)))
  end
  return id
end

-- Trailing arguments: (x, opts) or (opts) or (x) where opts = {async = true}.
local function split_opts(a, b)
  if type(a) == 'table' and b == nil then return nil, a end
  if b ~= nil and type(b) ~= 'table' then raise('expected an options table {async = true}') end
  return a, b or {}
end

function Strategy:allreduce(t, op, o)
  op, o = split_opts(op, o)
  local h = core.H(t, 'allreduce', 1)
  local id, c = op_id(op, 'allreduce'), comm(self, 'allreduce')
  return run(self, o.async, function(w) return C.em_comm_allreduce(S, c, h, id, w) end, t)
end

function Strategy:broadcast(t, root, o)
  root, o = split_opts(root, o)
  local h = core.H(t, 'broadcast', 1)
  root = root or 0
  if type(root) ~= 'number' or root % 1 ~= 0 then
    raise('broadcast: root must be a rank (0-based integer), got ' .. tostring(root))
  end
  local c = comm(self, 'broadcast')
  return run(self, o.async, function(w) return C.em_comm_broadcast(S, c, h, root, w) end, t)
end

local function out_collective(self, name, t, start, o)
  local h = core.H(t, name, 1)
  local c = comm(self, name)
  local out = ffi.new('em_tensor*[1]')
  return run(self, o.async, function(w) return start(c, h, out, w) end, nil, out)
end

function Strategy:allgather(t, o)
  if o ~= nil and type(o) ~= 'table' then raise('allgather: expected an options table {async = true}') end
  return out_collective(self, 'allgather', t, function(c, h, out, w)
    return C.em_comm_allgather(S, c, h, out, w)
  end, o or {})
end

function Strategy:reduce_scatter(t, op, o)
  op, o = split_opts(op, o)
  local id = op_id(op, 'reduce_scatter')
  return out_collective(self, 'reduce_scatter', t, function(c, h, out, w)
    return C.em_comm_reduce_scatter(S, c, h, id, out, w)
  end, o)
end

function Strategy:barrier(o)
  o = o or {}
  local c = comm(self, 'barrier')
  return run(self, o.async, function(w) return C.em_comm_barrier(S, c, w) end, nil)
end

return Strategy

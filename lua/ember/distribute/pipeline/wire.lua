--[[
ember.distribute.pipeline.wire -- how pipeline stages hand each other tensors
over point-to-point: activations forward, gradients backward, results to the
rest of a pipeline.

  local w = wire.new(s, device, wait)     -- wait(name, fn): runs fn, a blocking wait
  w:send(kind, key, t, peer)              -- asynchronous; waited for by w:flush()
  w:settle(work)                          -- one send known received: let go now
  w:send(nil, nil, t, peer)               -- no header: the peer knows the shape
  local t = w:recv(kind, key, peer)       -- shape and dtype told once per key
  w:recv_into(t, peer)                    -- the shape is known here already
  w:flush()

Why headers, and why keys. A receiving stage cannot know the shape of what its
predecessor computes. The first time a (kind, key, peer) is used -- key names
the batch's shape, which every replica of the pipeline knows -- the sender
sends a small int64 header first (dtype code, rank, sizes) and both sides
remember that they did; afterwards only the tensor travels.

Why asynchronous sends. A send returns once its peer has received. Under 1F1B
a stage may be sending an activation forward while its successor sends a
gradient back: both would wait on each other. Every send is therefore started
asynchronously and waited for at the end of the step, so a stage only ever
blocks in a receive, and receives are issued in an order both sides agree on
(pipeline/schedule.lua).

Why host memory between real GPUs. NCCL runs a replica's sends and receives in
its stream's order, and a send holds the stream until the peer receives: the
1F1B exchange above (each side sending before it receives) would stall both
streams. Over a communicator that moves device memory itself (NCCL on a real
GPU: em_comm_device_native) the wire therefore moves host copies, which the
host communicator matches out of order as on CPU replicas; the others --
emulated devices, GPU replicas over 'local' or 'mpi' (several on one GPU),
groups -- stage device tensors through host memory already.
]]
local em = require 'ember'
local core = require 'ember.ffi'
local cm = require 'ember.distribute.comm'
local raise = core.raise

local M = {}

local DTYPES = { 'float32', 'float64', 'float16', 'bfloat16', 'int32', 'int64', 'uint8', 'bool',
                 'int8', 'int16' }
local CODE = {}
for i, d in ipairs(DTYPES) do CODE[d] = i end
local MAX_DIMS = 8

local Wire = {}
Wire.__index = Wire

function M.new(s, device, wait)
  local host = device ~= 'cpu' and core.C.em_comm_device_native(cm.comm(s, 'pipeline')) ~= 0
  return setmetatable({ s = s, dev = device, wire_dev = host and 'cpu' or device, wait = wait,
                        told = {}, known = {}, pending = {} }, Wire)
end

local function header(t, dev)
  local shape = t.shape
  if #shape > MAX_DIMS then
    raise(('pipeline: an activation of %d dimensions (at most %d travel between stages)')
      :format(#shape, MAX_DIMS))
  end
  local code = CODE[t.dtype]
  if not code then raise('pipeline: activations of dtype ' .. tostring(t.dtype) .. ' cannot travel') end
  local v = { code, #shape }
  for i = 1, MAX_DIMS do v[i + 2] = shape[i] or 0 end
  return em.tensor(v, { dtype = 'int64' }):to(dev)
end

-- kind == nil: no header (the receiver knows the shape: a gradient's).
-- Returns the send's work, for settle().
function Wire:send(kind, key, t, peer)
  local k = kind and kind .. '|' .. key .. '|' .. peer
  if k and not self.told[k] then
    local h = header(t, self.wire_dev)
    self.pending[#self.pending + 1] = self.s:send(h, peer, { async = true })
    self.told[k] = true
  end
  if self.wire_dev ~= self.dev then t = t:to(self.wire_dev) end
  local work = self.s:send(t, peer, { async = true })
  self.pending[#self.pending + 1] = work
  return work
end

-- A send the caller knows was received (its peer answered what depended on
-- it): waited for (at once) and let go, so its tensor goes before the step
-- ends instead of at flush().
function Wire:settle(work)
  local list = self.pending
  for i = #list, 1, -1 do
    if list[i] == work then
      table.remove(list, i)
      self.wait('pipeline.send', function() work:wait() end)
      return
    end
  end
end

function Wire:recv_into(t, peer)
  local into = t.device == self.wire_dev and t or em.empty(t.shape, { dtype = t.dtype, device = self.wire_dev })
  self.wait('pipeline.recv', function() self.s:recv(into, peer) end)
  if into ~= t then em.no_grad(function() t:copy_(into) end) end
  return t
end

function Wire:recv(kind, key, peer)
  local k = kind .. '|' .. key .. '|' .. peer
  local meta = self.known[k]
  if not meta then
    local h = em.zeros({ MAX_DIMS + 2 }, { dtype = 'int64', device = self.wire_dev })
    self:recv_into(h, peer)
    local v = h:to('cpu'):totable()
    local shape = {}
    for i = 1, v[2] do shape[i] = v[i + 2] end
    meta = { shape = shape, dtype = DTYPES[v[1]] }
    self.known[k] = meta
  end
  return self:recv_into(em.zeros(meta.shape, { dtype = meta.dtype, device = self.dev }), peer)
end

function Wire:flush()
  local list = self.pending
  self.pending = {}
  for _, w in ipairs(list) do self.wait('pipeline.send', function() w:wait() end) end
end

return M

--[[
train.lua -- the replica that tests/faults/run.sh hurts: data-parallel training
that never ends by itself, run under mpirun.

  ember train.lua DIR TIMEOUT [SAVE_EVERY]

Each replica trains a wrapped two-layer model with SGD (momentum) on random
batches in an endless loop, with em.distribute.mirrored{timeout = TIMEOUT}.
Replica 0 saves a checkpoint to DIR/ckpt every SAVE_EVERY steps (default 1: a
kill may land in the middle of a save), holding the model, the optimizer, the
step, `world` (the number of replicas) and `sum`, the sum of every parameter
computed before the save. check_ckpt.lua replays the run to the saved step from
the seeds below (the model's 7, replica R's batches 100 + R) and compares
every tensor, so what this loop draws and how it steps must stay as it is. After its third step each replica writes its pid to
DIR/ready.RANK: the fault is injected only once every replica is mid-training.
The only way out is a fault: the communicator's error (a peer that died,
stopped or was cut off) ends the replica with a message naming the peer.
]]
local ffi = require 'ffi'
ffi.cdef 'int getpid(void);'
local dir, timeout = arg[1], tonumber(arg[2])
local save_every = tonumber(arg[3] or 1)
assert(dir and timeout, 'usage: ember train.lua DIR TIMEOUT [SAVE_EVERY]')
local nn = em.nn

local s = em.distribute.mirrored{ timeout = timeout }
em.manual_seed(7)
local model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 8))
local dm = s:wrap(model)
local opt = em.optim.SGD(dm:parameters(), { lr = 0.01, momentum = 0.9 })
em.manual_seed(100 + s.rank)

local function param_sum()
  local t = 0
  for _, p in ipairs(model:parameters()) do t = t + p:double():sum():item() end
  return t
end

local step = 0
while true do
  step = step + 1
  local x, y = em.randn(16, 32), em.randn(16, 8)
  opt:zero_grad()
  em.nn.F.mse_loss(dm(x), y):backward()
  opt:step()
  if s.rank == 0 and step % save_every == 0 then
    em.checkpoint.save(dir .. '/ckpt', { model = model, optimizer = opt, step = step,
      world = s.world_size, sum = param_sum() })
  end
  if step == 3 then
    local f = assert(io.open(dir .. '/ready.' .. s.rank .. '.tmp', 'w'))
    f:write(ffi.C.getpid(), '\n')
    f:close()
    os.rename(dir .. '/ready.' .. s.rank .. '.tmp', dir .. '/ready.' .. s.rank)
  end
end

--[[
profile_replicas.lua -- a profiled data-parallel loop for test_profile.lua, run as
`ember --replicas 2 profile_replicas.lua MODE OUTDIR`:
  skew  replica 1 does extra work each step (the others wait for it);
  comm  a large model whose gradient allreduce the test slows down
        (EMBER_TEST_COMM_GBPS), so communication dominates;
  memory  Adam instead of SGD: the memory by kind of every replica (MEMk lines:
        parameters, gradients, optimizer, activations, peak), the lines r:print()
        shows for them, and NUMEL, the model's parameter count.
Replica 0 prints the report's fields as KEY=value lines for the test to read.
]]
local em = require 'ember'
local mode, out = arg[1], arg[2]
local s = em.distribute.mirrored {}
em.manual_seed(1)
local width = mode == 'comm' and 1024 or 64
local model = em.nn.Sequential(em.nn.Linear(width, width), em.nn.ReLU(), em.nn.Linear(width, 4))
local dm = s:wrap(model, { bucket_mb = 1 })
local opt = mode == 'memory' and em.optim.Adam(model:parameters(), { lr = 0.01 })
  or em.optim.SGD(model:parameters(), { lr = 0.01 })
local x, y = em.randn(8, width), em.randn(8, 4)
local extra = em.randn(256, 256)

local function step()
  opt:zero_grad()
  local loss = em.nn.functional.mse_loss(dm(x), y)
  loss:backward()
  opt:step()
  if mode == 'skew' and s.rank == 1 then      -- the slow replica
    local t0 = em.clock()
    while em.clock() - t0 < 0.03 do em.matmul(extra, extra) end
  end
end

step()                                        -- warm up outside the profile
em.profile.start { trace = out .. '/trace.json', html = out .. '/page.html' }
for _ = 1, 10 do step(); em.profile.step() end
local r = em.profile.stop()
if s.rank == 0 then
  print('STEPS=' .. r.steps)
  print('REPLICAS=' .. #r.replicas)
  print('KIND=' .. r.diagnosis[1].kind)
  print('MSG=' .. r.diagnosis[1].message)
  print('GBPS=' .. r.projection.gbps)
  print('MEASURED=' .. tostring(r.projection.measured))
  for _, x in ipairs(r.replicas) do
    print(('REP%d=%.6f %.6f'):format(x.rank, x.step_s, x.wait_s))
    local m = x.memory
    -- (activations and other: the rest of the peak)
    print(('MEM%d=%d %d %d %d %d'):format(x.rank, m.parameters, m.gradients, m.optimizer,
      m.activations + m.other, m.peak))
  end
  local numel = 0
  for _, p in ipairs(model:parameters()) do numel = numel + p:numel() end
  print('NUMEL=' .. numel)
  local shown = 0
  for _, line in ipairs(r:lines()) do
    if line:match('^    rank %d: parameters ') then shown = shown + 1 end
  end
  print('PRINTED=' .. shown)
end

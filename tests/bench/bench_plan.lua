-- bench_plan.lua -- the planner's time for a 100-layer model (a Sequential of
-- 100 identical blocks: measured once thanks to the per-child cache), 4 devices,
-- every data-parallel layout:  ember tests/bench/bench_plan.lua
local nn = em.nn
local blocks = {}
for i = 1, 100 do
  blocks[i] = nn.Sequential(nn.Linear(256, 256), nn.GELU(), nn.LayerNorm(256))
end
local model = nn.Sequential(unpack(blocks))
local o = { input = { shape = { 64, 256 } }, devices = 4, memory = '64M', optimizer = 'adam' }
local t0 = em.clock()
local plan = em.distribute.plan(model, o)
local t1 = em.clock()
plan:print()
print(('planner: 100 layers, %d candidates, %.3f s (timing runs included)'):format(#plan.candidates, t1 - t0))
o.time = false
t0 = em.clock()
em.distribute.plan(model, o)
print(('planner without timing runs: %.3f s'):format(em.clock() - t0))

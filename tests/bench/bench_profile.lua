--[[
bench_profile.lua -- what recording costs: Fashion-MNIST CNN training steps
(train_common.lua) with em.profile off and on, in alternating rounds (best of
each), as the slowdown in percent. The twin bench_profile.py measures
torch.profiler (CPU activities) the same way. Goal: <= 5% slower.
]]
local dir = debug.getinfo(1, 'S').source:sub(2):match('(.*/)')
local B = dofile(dir .. 'common.lua')
local T = dofile(dir .. 'train_common.lua')
local step, batch = T.setup('cnn')
local STEPS, ROUNDS = 20, tonumber(os.getenv('EMBER_BENCH_ROUNDS') or '') or 4

for i = 1, 5 do step(i) end
local best_off, best_on = math.huge, math.huge
local events = 0
for _ = 1, ROUNDS do
  local t0 = B.now()
  for i = 1, STEPS do step(i) end
  best_off = math.min(best_off, (B.now() - t0) / STEPS)
  em.profile.start {}
  t0 = B.now()
  for i = 1, STEPS do step(i); em.profile.step() end
  best_on = math.min(best_on, (B.now() - t0) / STEPS)
  local r = em.profile.stop()
  events = r.ops_per_step
end
B.result('profile_off_cnn', batch / best_off, 'samples/s', 'higher', 'report')
B.result('profile_on_cnn', batch / best_on, 'samples/s', 'higher', 'report')
B.result('profile_overhead_cnn', (best_on / best_off - 1) * 100, '%', 'lower',
         ('<= 5%% (%d ops per step recorded)'):format(events))

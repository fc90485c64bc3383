--[[
bench_profile.lua -- what recording costs: Fashion-MNIST CNN training steps
(train_common.lua) with em.profile off and on, in alternating rounds (best of
each), as the slowdown in percent; and what recording adds to one tiny op
(c = a + b on 16 floats) when ops are all there is. The twin bench_profile.py measures
torch.profiler (CPU activities) the same way. Goal: <= 5% slower.
]]
local dir = debug.getinfo(1, 'S').source:sub(2):match('(.*/)')
local B = dofile(dir .. 'common.lua')
local T = dofile(dir .. 'train_common.lua')
local step, batch = T.setup('cnn')
local STEPS, ROUNDS = 20, tonumber(os.getenv('EMBER_BENCH_ROUNDS') or '') or 6

for i = 1, 5 do step(i) end
local best_off, best_on = math.huge, math.huge
local events = 0
local function round_off()
  local t0 = B.now()
  for i = 1, STEPS do step(i) end
  best_off = math.min(best_off, (B.now() - t0) / STEPS)
end
local function round_on()
  em.profile.start {}
  local t0 = B.now()
  for i = 1, STEPS do step(i); em.profile.step() end
  best_on = math.min(best_on, (B.now() - t0) / STEPS)
  events = em.profile.stop().ops_per_step
end
for r = 1, ROUNDS do          -- the order alternates too: neither side always goes first
  if r % 2 == 1 then round_off(); round_on() else round_on(); round_off() end
end
B.result('profile_off_cnn', batch / best_off, 'samples/s', 'higher', 'report')
B.result('profile_on_cnn', batch / best_on, 'samples/s', 'higher', 'report')
B.result('profile_overhead_cnn', (best_on / best_off - 1) * 100, '%', 'lower',
         ('<= 5%% (%d ops per step recorded)'):format(events))

-- the cost per recorded op, where nothing hides it
local a, b = em.ones(16), em.ones(16)
local N = 200000
local function tiny(n) for _ = 1, n do local _ = a + b end end
local off, on = math.huge, math.huge
for _ = 1, ROUNDS do
  off = math.min(off, B.time(tiny, N, 1))
  em.profile.start {}
  on = math.min(on, B.time(tiny, N, 1))
  em.profile.stop()
end
B.result('profile_tiny_add_off', off * 1e9, 'ns', 'lower', 'report')
B.result('profile_cost_per_op', (on - off) * 1e9, 'ns', 'lower', 'report')

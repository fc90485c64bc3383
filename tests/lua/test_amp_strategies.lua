--[[
test_amp_strategies.lua -- float16 autocast + GradScaler under every strategy, on
2 replicas (threads, and processes under mpirun where it is installed): s:wrap,
the sharded model in its three modes, and a 2-stage pipeline
(pp:step(x, y, loss_fn, scaler)). An inf in the gradients one replica holds (its
shard, its stage's) makes every replica skip with its parameters bit for bit
unchanged and the same halved scale; without an inf, training with the scaler
matches training without it. The script: dist/amp_strategies.lua.
]]
local dir = (arg and arg[0] and arg[0]:match('^(.*/)')) or
            ((os.getenv('EMBER_TESTS') or 'tests') .. '/lua/')
local H = dofile(dir .. 'harness.lua')
local ember = arg[-1] or 'ember'
local L = dofile(dir .. 'dist/launch.lua')(dir, ember)

local function check(out, rc, what)
  H.eq(rc, 0, what .. ': exit status: ' .. out)
  for r = 0, 1 do
    local function has(line) H.check(out:find(line, 1, true), what .. ': no "' .. line .. '" in\n' .. out) end
    has(('rank %d step 1 stepped=true scale=256 unchanged=false'):format(r))
    has(('rank %d step 2 stepped=false scale=128 unchanged=true'):format(r))
    has(('rank %d step 3 stepped=true scale=128 unchanged=false'):format(r))
    local d, n = out:match(('rank %d match maxdiff (%%S+) params (%%d+)'):format(r))
    H.check(d and tonumber(n) > 0, what .. ': no match line for rank ' .. r .. ' in\n' .. out)
    H.check(d and tonumber(d) <= 1e-6, ('%s: rank %d: with the scaler vs without: %s'):format(what, r, d))
  end
end

for _, kind in ipairs({ 'wrap', 'optimizer', 'gradients', 'parameters', 'pipeline' }) do
  H.test(kind .. ', 2 replicas (threads): an inf on one skips all; the scaler changes nothing else', function()
    local out, rc = L.replicas(2, 'amp_strategies.lua', kind)
    check(out, rc, kind)
  end)
end

H.test('under mpirun: s:wrap, shard = gradients, the pipeline', function()
  if not L.have_mpirun() then return H.skip(L.no_mpirun_why) end
  for _, kind in ipairs({ 'wrap', 'gradients', 'pipeline' }) do
    local out, rc = L.mpirun(2, 'amp_strategies.lua', kind)
    check(out, rc, 'mpirun ' .. kind)
  end
end)

H.done()

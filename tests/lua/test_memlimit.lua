--[[
test_memlimit.lua -- the cap on CPU tensor memory: em.set_memory_limit in this
process, and `ember --memory-limit SIZE` / EMBER_MEMORY_LIMIT through the ember
command, on one replica and on each of `--replicas 2`. Past the cap an op is the
out-of-memory error a full GPU gives (device, size asked, in use, limit); the
state keeps working; garbage tensors are collected before the error is final.
]]
local dir = (arg and arg[0] and arg[0]:match('^(.*/)')) or
            ((os.getenv('EMBER_TESTS') or 'tests') .. '/lua/')
local H = dofile(dir .. 'harness.lua')
local em = require 'ember'
local MiB = 2 ^ 20

-- Runs the ember command on a script (text) and returns its output (stdout and
-- stderr) and exit status.
local function run(opts, text, env) return H.ember(text, { args = opts, prefix = env }) end

H.test('em.set_memory_limit: the error, the state after it, capacity', function()
  em.collect()
  H.eq(em.memory_stats('cpu').capacity, 0)
  local base = em.memory_stats('cpu').allocated
  em.set_memory_limit(base + 4 * MiB)
  H.eq(em.memory_stats('cpu').capacity, base + 4 * MiB)
  H.eq(em.memory_stats().capacity, base + 4 * MiB, 'cpu is the default device')
  local keep = em.zeros(3 * MiB / 4):fill_(2)                  -- 3 MiB
  H.raises(function() return em.zeros(MiB / 2) end, 'cpu: out of memory allocating 2.00 MiB',
    '3.00 MiB allocated by tensors', ' limit', 'float32', '[524288]')
  H.raises(function() return keep * 2 end, 'out of memory allocating 3.00 MiB')
  -- the state is intact: keep is unchanged, small tensors and in-place ops work
  keep:add_(1)
  H.eq(keep:sum():item(), 3 * 3 * MiB / 4)
  H.eq(em.tensor({ 1, 2 }):add(1):totable(), { 2, 3 })
  keep = nil
  em.collect()
  H.eq(em.memory_stats('cpu').allocated, base)
  local t = em.zeros(3 * MiB / 4):fill_(5)                     -- fits again
  H.eq(t[1], 5)
  t = nil
  em.set_memory_limit(nil)
  H.eq(em.memory_stats('cpu').capacity, 0)
  H.eq(em.zeros(2 * MiB):numel(), 2 * MiB)                    -- 8 MiB without a cap
end)

H.test('garbage tensors are collected before an out-of-memory error is final', function()
  em.collect()
  local base = em.memory_stats('cpu').allocated
  em.set_memory_limit(base + 4 * MiB)
  em.reset_peak_memory_stats()
  -- 200 MiB of 1 MiB temporaries under a 4 MiB cap: each hit of the cap
  -- collects the garbage and the op succeeds on its second try
  local s = 0
  for i = 1, 200 do s = s + em.zeros(MiB / 4):fill_(i):sum():item() end
  H.eq(s, MiB / 4 * 200 * 201 / 2)
  H.check(em.memory_stats('cpu').peak <= base + 4 * MiB, 'the peak never passes the cap')
  em.set_memory_limit(0)
end)

-- A backward whose own kernels meet garbage: a node of Lua code (a custom
-- function, as a checkpoint's recompute is) leaves tensors dead, and the
-- engine's next allocation -- the matmul's gradients, from C -- would pass the
-- cap. The engine asks Lua to collect and tries once more; without that (the
-- reclaim removed, as before it existed) the backward fails.
H.test('a backward collects garbage its own kernels meet at the cap', function()
  local function step(reclaim)
    em.collect()
    local base = em.memory_stats('cpu').allocated
    em.manual_seed(1)
    local a = em.randn(512, 512):requires_grad_()              -- 1 MiB
    local w = em.randn(512, 2048):requires_grad_()             -- 4 MiB
    local h = a:mm(w)                                          -- 4 MiB
    local out = em.autograd.apply('junk', h, { h }, function(g)
      local junk = {}
      for i = 1, 7 do junk[i] = em.zeros(MiB / 4) end         -- 7 MiB, then dead
      junk = nil
      return { g }
    end)
    local loss = out:sum()
    em.set_memory_limit(base + 20 * MiB)
    if not reclaim then em.autograd._set_reclaim(false) end
    local ok, err = pcall(function() loss:backward() end)
    em.autograd._set_reclaim(true)
    em.set_memory_limit(0)
    return ok, err, a, w
  end
  local ok, err = step(false)
  H.check(not ok and tostring(err):find('out of memory', 1, true),
    'without the reclaim the cap is passed: ' .. tostring(err))
  local ok2, err2, a, w = step(true)
  H.check(ok2, 'with it the backward runs: ' .. tostring(err2))
  if ok2 then
    -- and its gradients are right: d(sum(a w))/da = rowsum(w), /dw = colsum(a)
    local ga = w:sum(2):view(1, 512):expand(512, 512)
    local gw = a:sum(1):view(512, 1):expand(512, 2048)
    H.check(H.maxrel(a.grad, ga) < 1e-5, 'a.grad')
    H.check(H.maxrel(w.grad, gw) < 1e-5, 'w.grad')
  end
end)

H.test('sizes: bytes, K, M, G; bad ones are clear errors', function()
  em.set_memory_limit('512K')
  H.eq(em.memory_stats().capacity, 512 * 1024)
  em.set_memory_limit('3m')
  H.eq(em.memory_stats().capacity, 3 * MiB)
  em.set_memory_limit('2G')
  H.eq(em.memory_stats().capacity, 2 * 1024 * MiB)
  em.set_memory_limit(123456)
  H.eq(em.memory_stats().capacity, 123456)
  em.set_memory_limit('654321')
  H.eq(em.memory_stats().capacity, 654321)
  em.set_memory_limit()
  H.eq(em.memory_stats().capacity, 0)
  H.raises(function() em.set_memory_limit('12X') end, 'set_memory_limit', "'12X'", 'K, M or G')
  H.raises(function() em.set_memory_limit('1.5G') end, "'1.5G'")
  H.raises(function() em.set_memory_limit(-1) end, 'set_memory_limit', '-1')
  H.raises(function() em.set_memory_limit(2.5) end, '2.5')
  H.raises(function() em.set_memory_limit({}) end, 'set_memory_limit')
  H.eq(em.memory_stats().capacity, 0, 'a bad size leaves the limit as it was')
end)

local script = [[
local s = em.distribute.mirrored{}
local keep = em.zeros(2 * 2^20 / 4):fill_(s.rank + 1)            -- 2 MiB
local ok, err = pcall(function() return em.zeros(2 * 2^20 / 4) end)
print('rank ' .. s.rank .. ' capacity ' .. em.memory_stats('cpu').capacity)
print('rank ' .. s.rank .. ' error ' .. tostring(err))
print('rank ' .. s.rank .. ' after ' .. keep:sum():item() .. ' ' .. em.ones(8):sum():item())
s:barrier()
]]

H.test('ember --memory-limit: the error, then the script goes on', function()
  local out, rc = run('--memory-limit 3M', script)
  H.eq(rc, 0, out)
  H.check(out:find('rank 0 capacity 3145728', 1, true), out)
  H.check(out:find('rank 0 error [^\n]*zeros: cpu: out of memory allocating 2%.00 MiB %(2%.00 ' ..
    'MiB allocated by tensors, 3%.00 MiB limit'), out)
  H.check(out:find('rank 0 after 524288 8', 1, true), out)
  out, rc = run('--memory-limit=3145728', script)
  H.check(rc == 0 and out:find('rank 0 capacity 3145728', 1, true), out)
end)

H.test('ember --replicas 2 --memory-limit: every replica has the cap', function()
  local out, rc = run('--replicas 2 --memory-limit 3M', script)
  H.eq(rc, 0, out)
  for r = 0, 1 do
    H.check(out:find('rank ' .. r .. ' capacity 3145728', 1, true), out)
    H.check(out:find('rank ' .. r .. ' error [^\n]*cpu: out of memory allocating 2%.00 MiB'), out)
    H.check(out:find(('rank %d after %d 8'):format(r, (r + 1) * 524288), 1, true), out)
  end
end)

H.test('EMBER_MEMORY_LIMIT', function()
  local out, rc = run('', script, 'EMBER_MEMORY_LIMIT=3M')
  H.eq(rc, 0, out)
  H.check(out:find('rank 0 capacity 3145728', 1, true), out)
  H.check(out:find('rank 0 error [^\n]*3%.00 MiB limit'), out)
  out, rc = run('--memory-limit 1G', 'print(em.memory_stats().capacity)', 'EMBER_MEMORY_LIMIT=3M')
  H.check(rc == 0 and out:find('^1073741824\n'), 'the option wins over the variable: ' .. out)
  out = run('', 'print(em.memory_stats().capacity)', 'EMBER_MEMORY_LIMIT=')
  H.check(out:find('^0\n'), 'empty: no cap: ' .. out)
end)

H.test('bad sizes are usage errors', function()
  for _, bad in ipairs({ '12X', '1.5G', '-3M', 'M', '' }) do
    local out, rc = run("--memory-limit '" .. bad .. "'", 'print("ran")')
    H.eq(rc, 1, out)
    H.check(out:find("--memory-limit needs a size", 1, true) and
            out:find("got '" .. bad .. "'", 1, true) and not out:find('ran'), out)
  end
  local out, rc = run('--memory-limit', '')
  H.eq(rc, 1, out)
  H.check(out:find('--memory-limit needs a size', 1, true), out)
  out, rc = run('', 'print("ran")', 'EMBER_MEMORY_LIMIT=lots')
  H.eq(rc, 1, out)
  H.check(out:find("EMBER_MEMORY_LIMIT needs a size", 1, true) and out:find("'lots'") and
          not out:find('ran'), out)
end)

H.done()

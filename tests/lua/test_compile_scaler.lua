--[[
test_compile_scaler.lua -- a GradScaler inside a step compiled by em.compile: the
optimizer's update is a guarded stretch of the replay, skipped when a gradient
is inf or NaN, and the scale's schedule follows each replay. Compiled runs
against the same eager runs, call by call: losses, scales, parameters bit for
bit and Adam's step counts, with inf inputs at the capture and later, with
update() inside and outside the step, with unscale_ and clipping, under float16
autocast and on two replicas; the C guard alone through em_program_ran.
]]
local dir = (arg and arg[0] and arg[0]:match('^(.*/)')) or
            ((os.getenv('EMBER_TESTS') or 'tests') .. '/lua/')
local H = dofile(dir .. 'harness.lua')
local em = require 'ember'
local nn, F = em.nn, em.nn.F

-- One run of 8 steps: each step's loss and scale, then the weights' bits and
-- Adam's step count, as one string. o: {compiled, opt = 'sgd'|'adam', infs = {[i] =
-- true}, update_outside, clip, autocast}.
local function run(o)
  em.manual_seed(3)
  local m = nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 3))
  local opt = o.opt == 'adam' and em.optim.Adam(m:parameters(), { lr = 1e-2 }) or
              em.optim.SGD(m:parameters(), { lr = 0.1, momentum = 0.9 })
  local sc = em.amp.GradScaler{ init_scale = 2 ^ 10, growth_interval = 2 }
  local function forward(x, y) return F.mse_loss(m(x), y) end
  local function step(x, y)
    opt:zero_grad()
    local loss = o.autocast and em.amp.autocast('float16', forward, x, y) or forward(x, y)
    sc:scale(loss):backward()
    if o.clip then
      sc:unscale_(opt)
      em.nn.utils.clip_grad_norm_(m:parameters(), 0.5)
    end
    sc:step(opt)
    if not o.update_outside then sc:update() end
    return loss
  end
  local f = o.compiled and em.compile(step) or step
  local out = {}
  for i = 1, 8 do
    em.manual_seed(100 + i)
    local x, y = em.randn(5, 6), em.randn(5, 3)
    if o.infs and o.infs[i] then x[1][2] = math.huge end
    local loss = f(x, y)
    if o.update_outside then sc:update() end
    out[#out + 1] = ('%d: loss %.9g scale %g'):format(i, loss:item(), sc:get_scale())
  end
  for _, p in ipairs(m:parameters()) do
    local v = p:flatten():totable()
    out[#out + 1] = ('%.17g %.17g %.17g'):format(v[1], v[2], v[#v])
  end
  local st = opt.state and next(opt.state) and select(2, next(opt.state))
  if st and st.step then out[#out + 1] = 'adam steps ' .. st.step end
  return table.concat(out, '\n'), o.compiled and f:stats()
end

local function same(o, replays)
  local eager = run(o)
  o.compiled = true
  local comp, stats = run(o)
  H.eq(comp, eager, 'compiled equals eager')
  H.eq(stats.replays, replays, 'replays')
  return eager, stats
end

H.test('SGD and Adam: an inf step is skipped by the replay, the scale follows', function()
  for _, opt in ipairs{ 'sgd', 'adam' } do
    local eager = same({ opt = opt }, 7)
    H.check(eager:find('8: loss %S+ scale 16384'), opt .. ': the scale grew every 2 steps: ' .. eager)
    eager = same({ opt = opt, infs = { [3] = true, [5] = true, [6] = true } }, 7)
    H.check(eager:find('3: loss nan scale 1024', 1, true) and eager:find('6: loss nan scale 256', 1, true),
      opt .. ': the scale backed off at each inf: ' .. eager)
    if opt == 'adam' then H.check(eager:find('adam steps 5', 1, true), 'Adam counted 5 steps: ' .. eager) end
  end
end)

H.test('an inf at the capture: that call runs eagerly, the next captures again', function()
  local _, stats = same({ opt = 'adam', infs = { [1] = true, [4] = true } }, 6)
  H.eq({ stats.captures, stats.retries }, { 1, 1 }, 'captures kept, captures retried')
end)

H.test('update() after the compiled call, unscale_ and clipping inside it', function()
  same({ opt = 'sgd', infs = { [4] = true }, update_outside = true }, 7)
  local _, stats = same({ opt = 'adam', infs = { [5] = true }, clip = true }, 7)
  H.eq(stats.breaks, 0, 'clipping does not end the record')
end)

H.test('check = true: a checked call that skips its update is no difference', function()
  local m = nn.Linear(4, 2)
  local opt = em.optim.SGD(m:parameters(), { lr = 0.1 })
  local sc = em.amp.GradScaler{ init_scale = 2 ^ 10 }
  local step = em.compile(function(x, y)
    opt:zero_grad()
    sc:scale(F.mse_loss(m(x), y)):backward()
    sc:step(opt)
    sc:update()
  end, { check = true })
  local x, y = em.randn(3, 4), em.randn(3, 2)
  step(x, y)
  local bad = x:clone()
  bad[1][1] = math.huge
  step(bad, y)       -- checked, and skipped: nothing to compare
  step(x, y)         -- checked
  step(x, y)         -- replayed
  H.eq({ step:stats().replays, sc:get_scale() }, { 1, 512 }, 'replays, the scale halved once')
end)

H.test('under float16 autocast', function()
  same({ opt = 'adam', infs = { [2] = true }, autocast = true }, 7)
end)

H.test('a guard skips its stretch while its flag is set', function()
  local ffi = require 'ffi'
  local core = require 'ember.ffi'
  local C, S = core.C, core.S
  local x, flag = em.zeros(3), em.zeros({})
  core.check(C.em_compile_begin(S))
  x:add_(1)
  core.check(C.em_compile_guard_begin(S, flag._h))
  x:add_(10)
  core.check(C.em_compile_guard_end(S))
  x:add_(100)
  local box, why = ffi.new('em_program*[1]'), ffi.new('char[256]')
  core.check(C.em_compile_end(S, box, why, 256))
  local prog = ffi.gc(box[0], function(p) C.em_program_free(S, p) end)
  H.eq(ffi.string(why), '', 'replayable')
  H.eq(x:totable(), { 111, 111, 111 }, 'the capture ran the stretch')
  core.check(C.em_program_run(S, prog))
  H.eq(x:totable(), { 222, 222, 222 }, 'a replay with the flag 0 runs it')
  H.eq({ C.em_program_ran(prog, 0), C.em_program_ran(prog, 2) }, { 1, 1 }, 'ran')
  flag:fill_(1)
  core.check(C.em_program_run(S, prog))
  H.eq(x:totable(), { 323, 323, 323 }, 'with the flag 1 it is skipped')
  H.eq({ C.em_program_ran(prog, 2), C.em_program_ran(prog, 3), C.em_program_ran(prog, 9) },
       { 0, 1, -1 }, 'skipped, ran after, no call')
  core.check(C.em_compile_begin(S))
  H.raises(function() core.check(C.em_compile_guard_begin(S, em.zeros(2)._h)) end,
           'guard', 'one element')
  core.check(C.em_compile_guard_begin(S, flag._h))
  H.raises(function() core.check(C.em_compile_guard_begin(S, flag._h)) end, 'do not nest')
  core.check(C.em_compile_end(S, box, why, 256))
  C.em_program_free(S, box[0])
  H.check(ffi.string(why):find('not closed', 1, true), 'an open guard is refused: ' .. ffi.string(why))
end)

H.test('two replicas: the replicas agree on skipping, equal to eager', function()
  local out, rc = H.ember([[
    local em = require 'ember'
    local nn, F = em.nn, em.nn.F
    local s = em.distribute.mirrored{}
    local function make()
      em.manual_seed(3)
      local m = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 3))
      local dm = s:wrap(m)
      local opt = em.optim.Adam(dm:parameters(), { lr = 1e-2 })
      local sc = em.amp.GradScaler{ init_scale = 2 ^ 10, growth_interval = 2 }
      return m, sc, function(x, y)
        opt:zero_grad()
        sc:scale(F.mse_loss(dm(x), y)):backward()
        sc:step(opt)
        sc:update()
      end
    end
    local m1, sc1, eager = make()
    local m2, sc2, step = make()
    local comp = em.compile(step)
    em.manual_seed(10 + s.rank)   -- each replica its own batches
    local xs, ys = {}, {}
    for i = 1, 6 do xs[i] = em.randn(4, 6); ys[i] = em.randn(4, 3) end
    if s.rank == 1 then xs[4][1][1] = 0 / 0 end   -- one replica's NaN skips both
    for i = 1, 6 do eager(xs[i], ys[i]); comp(xs[i], ys[i]) end
    local d = 0
    local p1, p2 = m1:parameters(), m2:parameters()
    for i = 1, #p1 do d = math.max(d, (p1[i] - p2[i]):abs():max():item()) end
    print(('rank %d diff %g sum %.9g scale %g %g replays %d'):format(s.rank, d,
      p2[1]:sum():item(), sc1:get_scale(), sc2:get_scale(), comp:stats().replays))
  ]], { args = '--replicas 2' })
  H.eq(rc, 0, 'exit status: ' .. out)
  local sums = {}
  for r, d, sum, s1, s2, n in out:gmatch('rank (%d) diff (%S+) sum (%S+) scale (%S+) (%S+) replays (%d+)') do
    H.eq({ tonumber(d), s1, s2, tonumber(n) }, { 0, '2048', '2048', 5 },
         'rank ' .. r .. ': difference to eager, scales (4096 after 6 clean steps, halved once), replays')
    sums[#sums + 1] = sum
  end
  H.eq(#sums, 2, 'both replicas reported: ' .. out)
  H.eq(sums[1], sums[2], 'the replicas hold the same weights')
end)

H.done()

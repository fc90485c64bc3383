-- p2p.lua -- run by test_distribute_p2p.lua under `ember --replicas N`, mpirun
-- and GPU replicas (emulated): point-to-point of a mirrored strategy.
--   pingpong   rank 0 sends each dtype (a strided tensor, on s.device) to every
--              other rank, which checks it and answers with its own values
--              (sync and async); then a ring exchange (async sends) and a
--              receive posted before the send it waits for. Values are known
--              functions of the sender's rank, checked here. Prints
--              "rank R checks P failed F" and one line per failed check.
--   exit       replica 1 leaves at once (os.exit(0)); the others wait to
--              receive from it
--   error      replica 1 raises an error; the others wait to receive from it
--   mismatch   rank 0 sends float32 [3, 4], rank 1 receives into float32 [5]
--   profile    profiled: rank 0 sends two float32 [7, 5] to rank 1 and receives
--              an int64 [7, 5]; the trace goes to arg[2]
--   silent     replica 1 sends nothing for 6 s (timeout 2 s), then ends
--   silent_send  the same, while the others send to it (it never receives)
-- In the failure modes, every other replica prints "caught: <message>" and
-- ends normally (so that its exit tells the others nothing).
local mode = arg[1] or 'pingpong'
local silent = mode == 'silent' or mode == 'silent_send'
local s = em.distribute.mirrored{ timeout = silent and 2 or 60 }
local R, N, dev = s.rank, s.world_size, s.device
local passed, failed = 0, 0
local function check(ok, what)
  if ok then passed = passed + 1 else failed = failed + 1; print('FAILED ' .. what) end
end
-- element i (1-based, row-major) of what replica r sends in round k: small integers
-- (5 .. 122, uint8 too); bool holds their parity, so that its elements differ
local function val(r, k, i, dt)
  local v = (r + 1) * 10 + k * 3 + i % 17 - 8
  if dt == 'bool' then return v % 2 == 1 end
  return v
end
local function source(dt, r, k) -- a [7, 5] transposed view of a [5, 7] tensor, on dev
  local v = {}
  for c = 1, 5 do
    v[c] = {}
    for row = 1, 7 do v[c][row] = val(r, k, (row - 1) * 5 + c, dt) end
  end
  return em.tensor(v, { dtype = dt }):to(dev):t()
end
local function expect(t, r, k, what, dt)
  check(t.device == dev, what .. ': stays on ' .. dev .. ', got ' .. tostring(t.device))
  local v = t:to('cpu'):flatten():totable()
  check(#v == 35, what .. ': 35 values')
  for i = 1, #v do
    if v[i] ~= val(r, k, i, dt) then
      check(false, ('%s [%d]: got %s, want %s'):format(what, i, tostring(v[i]),
        tostring(val(r, k, i, dt))))
      return
    end
  end
  check(true)
end
local function zeros(dt) return em.zeros({ 7, 5 }, { dtype = dt, device = dev }) end

if mode == 'pingpong' then
  local dtypes = { 'float32', 'float64', 'float16', 'bfloat16', 'int32', 'int64', 'uint8',
                   'bool' }
  for k, dt in ipairs(dtypes) do
    if R == 0 then
      for p = 1, N - 1 do
        check(s:send(source(dt, 0, k), p) ~= nil, 'send returns its tensor')
        local b = zeros(dt)
        check(s:recv(b, p) == b, 'recv returns its tensor')
        expect(b, p, k, 'answer of ' .. p .. ' ' .. dt, dt)
        local w = s:recv(zeros(dt), p, { async = true })
        expect(w:wait(), p, k + 20, 'async answer of ' .. p .. ' ' .. dt, dt)
      end
    else
      local dst = zeros(dt):t():contiguous():t()       -- a strided destination
      s:recv(dst, 0)
      expect(dst, 0, k, 'recv ' .. dt, dt)
      s:send(source(dt, R, k), 0)
      local w = s:send(source(dt, R, k + 20), 0, { async = true })
      check(w:wait() ~= nil, 'async send')
    end
  end
  -- a ring: everyone sends to the next (async) and receives from the previous
  local nxt, prv = (R + 1) % N, (R + N - 1) % N
  if N > 1 then
    local w = s:send(source('float32', R, 50), nxt, { async = true })
    local b = s:recv(zeros('float32'), prv)
    w:wait()
    expect(b, prv, 50, 'ring')
    -- a receive posted before the send it answers; an allreduce in between
    local got = s:recv(zeros('float64'), prv, { async = true })
    local sum = s:allreduce(em.ones({ 3 }, { device = dev }))
    check(sum:to('cpu'):sum():item() == 3 * N, 'allreduce among pending receives')
    s:send(source('float64', R, 60), nxt, { async = true }):wait()
    expect(got:wait(), prv, 60, 'early recv')
  end
  -- bad arguments
  local function err(f, want)
    local ok, e = pcall(f)
    check(not ok and tostring(e):find(want, 1, true), ('error %q, got %s'):format(want, tostring(e)))
  end
  err(function() s:send(zeros('float32'), R) end, 'send: rank must be another replica')
  err(function() s:recv(zeros('float32'), N) end, 'recv: rank must be another replica')
  err(function() s:send(zeros('float32'), 0.5) end, 'rank must be another replica')
  err(function() s:send({ 1, 2 }, (R + 1) % N) end, 'send: expected a tensor')
  err(function() s:recv(zeros('float32'), (R + 1) % N, 'async') end, 'options table')
  s:barrier()
  print(('rank %d device %s backend %s checks %d failed %d'):format(R, dev, s.backend, passed, failed))
  return
end

if mode == 'profile' then       -- ranks 0 and 1, profiled; arg[2]: the trace's path
  em.profile.start { trace = arg[2] }
  if R == 0 then
    s:send(source('float32', 0, 1), 1)
    s:send(source('float32', 0, 2), 1, { async = true }):wait()
    s:recv(zeros('int64'), 1)
  elseif R == 1 then
    s:recv(zeros('float32'), 0)
    s:recv(zeros('float32'), 0)
    s:send(source('int64', 1, 3), 0)
  end
  em.profile.step()
  em.profile.stop()
  print(('rank %d profiled'):format(R))
  return
end

if mode == 'mismatch' then      -- ranks 0 and 1; then a matching pair still goes through
  if R > 1 then return end
  local ok, e = pcall(function()
    if R == 0 then s:send(em.ones({ 3, 4 }, { device = dev }), 1)
    else s:recv(em.zeros({ 5 }, { device = dev }), 0) end
  end)
  print(('rank %d caught: %s'):format(R, ok and 'nothing' or tostring(e)))
  local t = R == 0 and em.full({ 6 }, 42, { dtype = 'int64', device = dev }) or
    em.zeros({ 6 }, { dtype = 'int64', device = dev })
  if R == 0 then s:send(t, 1) else s:recv(t, 0) end
  print(('rank %d then got %s'):format(R, t:to('cpu'):sum():item()))
  return
end

-- the failure modes
if R == 1 then
  if mode == 'exit' then os.exit(0) end
  if mode == 'error' then error('boom in replica one') end
  if silent then dofile((arg[0]:match('^(.*/)') or './') .. 'idle.lua')(6) return end
end
local ok, e = pcall(function()
  if mode == 'silent_send' then return s:send(source('int64', R, 1), 1) end
  return s:recv(zeros('float32'), 1)
end)
print(('rank %d caught: %s'):format(R, ok and 'nothing' or tostring(e)))

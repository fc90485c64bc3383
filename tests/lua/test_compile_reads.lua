--[[
test_compile_reads.lua -- em.compile and values a step reads with item(): a read
after the step's last kernel call is replayed (the replay's value of the same
tensor, equal to the eager step's, call after call), returned alone or in a
table beside tensors; a read before the last kernel, a result computed from a
read, a read not returned (it could steer Lua) and two equal reads run eagerly
and explain() says why.
]]
local dir = (arg and arg[0] and arg[0]:match('^(.*/)')) or
            ((os.getenv('EMBER_TESTS') or 'tests') .. '/lua/')
local H = dofile(dir .. 'harness.lua')
local em = require 'ember'
local nn, F = em.nn, em.nn.F

-- A model, its SGD and a step that returns what `finish(loss, out)` returns.
local function stepper(finish)
  em.manual_seed(3)
  local m = nn.Sequential(nn.Linear(5, 8), nn.ReLU(), nn.Linear(8, 3))
  local opt = em.optim.SGD(m:parameters(), { lr = 0.1, momentum = 0.9 })
  return function(x, y)
    opt:zero_grad()
    local out = m(x)
    local loss = F.cross_entropy(out, y)
    loss:backward()
    opt:step()
    return finish(loss, out)
  end, m
end

local function batches(n)
  em.manual_seed(9)
  local r = {}
  for i = 1, n do
    r[i] = { em.randn(6, 5), em.randint(1, 4, { 6 }, { dtype = 'int64' }) }
  end
  return r
end

H.test('loss:item() after the last kernel replays: the same losses as eager', function()
  local finish = function(loss) return loss:item() end
  local eager = stepper(finish)
  local fn, m = stepper(finish)
  local step = em.compile(fn)
  local want, got = {}, {}
  for i, b in ipairs(batches(5)) do want[i] = eager(b[1], b[2]) end
  for i, b in ipairs(batches(5)) do got[i] = step(b[1], b[2]) end
  H.eq(got, want, 'losses, call by call')
  H.check(want[5] ~= want[4], 'the losses move (training happens)')
  local s = step:stats()
  H.eq({ s.captures, s.replays, s.breaks, s.eager }, { 1, 4, 0, 0 }, 'captured once, replayed after')
  H.check(step:explain():find('replayed', 1, true), step:explain())
  H.check(type(got[3]) == 'number', 'a number comes back')
  H.check(m ~= nil, 'model')
end)

H.test('reads beside tensors, in a table: each slot gets its replayed value', function()
  local finish = function(loss, out)
    local top = out:max()
    return { loss = loss:item(), top = top:item(), out = out }, loss
  end
  local eager = stepper(finish)
  local step = em.compile((stepper(finish)))
  for i, b in ipairs(batches(4)) do
    local we, le = eager(b[1], b[2])
    local wc, lc = step(b[1], b[2])
    H.eq({ wc.loss, wc.top }, { we.loss, we.top }, 'read values, call ' .. i)
    H.eq(H.flat(wc.out), H.flat(we.out), 'the tensor beside them, call ' .. i)
    H.eq(lc:item(), le:item(), 'the loss tensor, call ' .. i)
  end
  H.eq(step:stats().replays, 3, 'replayed')
end)

-- a step's results as numbers (a tensor by its one value)
local function values(...)
  local r = { ... }
  for i, v in ipairs(r) do if type(v) ~= 'number' then r[i] = v:item() end end
  return r
end

H.test('reads the replay cannot honour run eagerly, and explain says why', function()
  local cases = {
    { 'computed from a read', function(loss) return loss:item() / 2 end,
      'none of the values it read' },
    { 'a read it does not return', function(loss)
      if loss:item() > 100 then print('diverging') end
      return loss
    end, 'that it does not return' },
    { 'two equal reads', function(loss)
      local copy = loss:clone()
      return loss:item(), copy:item()
    end,
      'two values it reads are equal' },
  }
  for _, c in ipairs(cases) do
    local eager = stepper(c[2])
    local step = em.compile((stepper(c[2])))
    for i, b in ipairs(batches(3)) do
      H.eq(values(step(b[1], b[2])), values(eager(b[1], b[2])), c[1] .. ': eager results, call ' .. i)
    end
    local s = step:stats()
    H.eq({ s.breaks, s.eager, s.replays }, { 1, 2, 0 }, c[1] .. ': eager after its capture')
    H.check(step:explain():find(c[3], 1, true), c[1] .. ': ' .. step:explain())
  end
  -- a read before the last kernel: what follows could depend on it
  em.manual_seed(3)
  local m = nn.Linear(5, 3)
  local step = em.compile(function(x)
    local v = x:sum():item()
    return m(x) * v
  end)
  local b = batches(2)
  for i = 1, 2 do
    H.eq(H.flat(step(b[i][1])), H.flat(m(b[i][1]) * b[i][1]:sum():item()), 'eager values ' .. i)
  end
  H.check(step:explain():find('before its last kernel call', 1, true), step:explain())
end)

H.done()

--[[
test_data_map.lua -- ds:map(fn) with a Lua function, run in the loader's worker
threads, each in a LuaJIT state of its own (lua/host/luamap.c,
lua/ember/data/luamap.lua, lua/ember/data/worker.lua).

  - values: x -> 2x (and y kept) gives the same, hand-derived batches with 0,
    1 and 4 workers, over two epochs, and through ds:get (the caller's thread);
  - upvalues carried: numbers, strings, booleans, nested tables (shared and
    cyclic references kept), helper functions (recursive too), module values
    (math.floor, em, em.data.T); globals `em` and `math` in the worker;
  - upvalues refused at ds:map, at the caller's line, naming the upvalue: a
    tensor, a tensor inside a table, a coroutine, a userdata, a stray C
    function, an object with a metatable, a helper's own bad upvalue;
  - results: numbers become 0-d tensors (int64 / float32), nil keeps the field,
    too many results / a string are errors naming the function;
  - an error inside fn surfaces from loader:epoch() with the user's file:line
    and the worker's number; the loader runs the next epoch after it;
  - dropping the loaders and datasets closes every worker state;
  - a plain `luajit` host (libember_lua.so) runs a map with workers (skipped
    when luajit is missing).
]]
local dir = (arg and arg[0] and arg[0]:match('^(.*/)')) or
            ((os.getenv('EMBER_TESTS') or 'tests') .. '/lua/')
local H = dofile(dir .. 'harness.lua')
local em = require 'ember'
local luamap = require 'ember.data.luamap'

local N, B = 8, 4
-- x row i is (2i-1, 2i), y[i] = i: hand-derivable sums.
local x = em.arange(1, 2 * N + 1):view(N, 2):float()
local y = em.arange(1, N + 1):long()

-- All batches of one epoch as Lua lists {{x rows}, {y}}.
local function collect(ds, workers, epoch)
  local l = ds:loader{ workers = workers, progress = false }
  local got = {}
  for a, b in l:epoch(epoch) do got[#got + 1] = { a:totable(), b:totable() } end
  return got
end

local function expected(fx, fy)
  local got = {}
  for s = 1, N, B do
    local xs, ys = {}, {}
    for i = s, s + B - 1 do
      xs[#xs + 1] = { fx(2 * i - 1), fx(2 * i) }
      ys[#ys + 1] = fy(i)
    end
    got[#got + 1] = { xs, ys }
  end
  return got
end

H.test('x -> 2x: the same batches with 0, 1 and 4 workers', function()
  local ds = em.data.tensors(x, y):map(function(a, b) return a * 2, b end):batch(B)
  local want = expected(function(v) return 2 * v end, function(i) return i end)
  for _, w in ipairs({ 0, 1, 4 }) do
    for epoch = 1, 2 do
      H.eq(collect(ds, w, epoch), want)
    end
  end
  -- On the caller's thread (worker -1), without a loader.
  local m = em.data.tensors(x, y):map(function(a, b) return a * 2, b + 10 end)
  local a, b = m:get(3)
  H.eq(a:totable(), { 10, 12 })
  H.eq(b:item(), 13)
  H.eq(a.dtype, 'float32')
  H.eq(b.dtype, 'int64')
end)

H.test('upvalues: numbers, strings, tables, helpers and modules are carried', function()
  local scale, offset, name, on = 3, 0.5, 'abc', true
  local cfg = { add = 10, nested = { mul = 2, list = { 1, 2, 3 } } }
  cfg.self = cfg                               -- a cycle
  local shared = { v = 100 }
  local pair = { a = shared, b = shared }      -- shared references stay shared
  local floor = math.floor                     -- a C function of a module
  local E = em                                 -- the ember module itself
  local T = em.data.T                          -- a table of a loaded module
  local function fact(n) if n <= 1 then return 1 end return n * fact(n - 1) end
  local function helper(v) return v * scale + offset end
  local fn = function(a, b)
    assert(cfg.self == cfg and pair.a == pair.b and T ~= nil and #name == 3 and on)
    local extra = cfg.add + cfg.nested.mul * cfg.nested.list[3] + pair.a.v  -- 10 + 6 + 100
    local r = helper(a) + extra + fact(3)                 -- 3a + 0.5 + 116 + 6
    return E.floor(r) + floor(0.7) + math.floor(0.2), b:float():sqrt()
  end
  local ds = em.data.tensors(x, y):map(fn):batch(B)
  local want = expected(function(v) return math.floor(3 * v + 122.5) end,
    function(i) return math.sqrt(i) end)
  for _, w in ipairs({ 0, 2 }) do
    local got = collect(ds, w, 1)
    H.eq(#got, 2)
    for k = 1, #got do
      H.eq(got[k][1], want[k][1])
      for j = 1, B do H.close(got[k][2][j], want[k][2][j], 1e-6) end
    end
  end
  -- Globals: `em` and the standard libraries of the worker's own state.
  local g = em.data.tensors(x, y):map(function(a, b)
    return em.full({ 2 }, string.len('four') + math.max(1, 2)), b
  end):batch(B)
  H.eq(collect(g, 2, 1)[2][1], { { 6, 6 }, { 6, 6 }, { 6, 6 }, { 6, 6 } })
end)

H.test('upvalues that cannot travel: errors at the ds:map line', function()
  local src = em.data.tensors(x, y)
  local w = em.ones(2)
  local line = debug.getinfo(1, 'l').currentline + 1
  local ok, err = pcall(function() return src:map(function(a, b) return a * w, b end) end)
  H.check(not ok, 'a tensor upvalue must be refused')
  H.check(tostring(err):find("upvalue 'w' is a tensor (cdata)", 1, true), err)
  H.check(tostring(err):find('test_data_map.lua:' .. line, 1, true), err)
  H.check(tostring(err):find('em.data.T', 1, true), err)

  local cfg = { weights = { w } }
  H.raises(function() src:map(function(a) return a * cfg.weights[1] end) end,
    "upvalue 'cfg' holds, at cfg.weights[1], a tensor (cdata)")
  local co = coroutine.create(function() end)
  H.raises(function() src:map(function(a) return co and a end) end,
    "upvalue 'co' is a coroutine")
  local u = newproxy(false)
  H.raises(function() src:map(function(a) return u and a end) end,
    "upvalue 'u' is a userdata")
  local iter = ('ab'):gmatch('.')
  H.raises(function() src:map(function(a) return iter and a end) end,
    "upvalue 'iter' is a C function that is in no loaded module")
  local obj = setmetatable({}, { __index = {} })
  H.raises(function() src:map(function(a) return obj and a end) end,
    "upvalue 'obj' is a table with a metatable")
  local lin = em.nn.Linear(2, 2)
  H.raises(function() src:map(function(a) return lin(a) end) end, "upvalue 'lin'")
  local function helper(a) return a + w end
  H.raises(function() src:map(function(a) return helper(a) end) end,
    "upvalue 'helper' holds, at helper (upvalue w), a tensor (cdata)")
  H.raises(function() src:map(print) end, 'a C function cannot run in the worker Lua states')
  H.raises(function() src:map(42) end, 'map')
end)

H.test('results: numbers, nil, and wrong values', function()
  local src = em.data.tensors(x, y)
  local a, b = src:map(function(p, q) return nil, 7 end):get(2)
  H.eq(a:totable(), { 3, 4 })                     -- nil keeps the field
  H.eq(b:item(), 7); H.eq(b.dtype, 'int64'); H.eq(b:dim(), 0)
  a, b = src:map(function(p, q) return 0.25 end):get(1)
  H.eq(a:item(), 0.25); H.eq(a.dtype, 'float32'); H.eq(b:item(), 1)
  a = src:map(function(p) end):get(4)              -- no results: unchanged
  H.eq(a:totable(), { 7, 8 })

  local many = src:map(function(p, q) return p, q, p end)
  H.raises(function() many:get(1) end, 'returned 3 values, but the samples have 2 fields')
  local str = src:map(function(p, q) return 'no' end)
  H.raises(function() str:get(1) end, 'returned string as value 1')
  local tbl = src:map(function(p, q) return p, { q } end):batch(2)
  local l = tbl:loader{ workers = 2, progress = false }
  H.raises(function() for _ in l:epoch() do end end, 'returned table as value 2')
end)

H.test('a module the workers cannot require: the set-up error, every time', function()
  package.loaded['test_data_map_fake'] = { k = 2 }   -- in package.loaded, on no path
  local fake = package.loaded['test_data_map_fake']
  local ds = em.data.tensors(x, y):map(function(a, b) return a * fake.k, b end)
  for _ = 1, 2 do
    H.raises(function() ds:get(1) end, 'ds:map function: could not set up its Lua state',
      "module 'test_data_map_fake' not found")
  end
  package.loaded['test_data_map_fake'] = nil
end)

H.test('an error in fn: the user line, the worker, then the next epoch runs', function()
  local flag = os.tmpname()
  local f = io.open(flag, 'w'); f:write('x'); f:close()
  local line = debug.getinfo(1, 'l').currentline + 3
  local ds = em.data.tensors(x, y):map(function(a, b)
    local fh = io.open(flag, 'r')
    if fh then fh:close(); if b:item() == 6 then error('sample six is bad') end end
    return a + 1, b
  end):batch(B)
  for _, w in ipairs({ 0, 3 }) do
    local l = ds:loader{ workers = w, progress = false }
    local seen = 0
    local ok, err = pcall(function() for _ in l:epoch(1) do seen = seen + 1 end end)
    H.check(not ok, 'the epoch must fail')
    H.check(tostring(err):find('test_data_map.lua:' .. line .. ': sample six is bad', 1, true), err)
    H.check(tostring(err):find(w == 0 and 'ds:map function: ' or 'ds:map function (worker ',
      1, true), err)
    H.check(seen <= 1, 'batch 2 holds the bad sample')
    os.remove(flag)
    H.eq(collect(ds, w, 2), expected(function(v) return v + 1 end, function(i) return i end))
    -- (a fresh loader above; the failed one runs again too)
    local n = 0
    for _ in l:epoch(3) do n = n + 1 end
    H.eq(n, 2)
    f = io.open(flag, 'w'); f:write('x'); f:close()
  end
  os.remove(flag)
end)

H.test('dropping loaders and datasets closes the worker states', function()
  collectgarbage(); collectgarbage()
  local before = luamap.live_states()
  do
    local ds = em.data.tensors(x, y):map(function(a, b) return a - 1, b end):batch(B)
    local l = ds:loader{ workers = 4, progress = false }
    for _ in l:epoch() do end
    H.check(luamap.live_states() >= before + 1, 'worker states were opened')
  end
  -- Compiled traces keep the objects they specialised on (an epoch's iterator,
  -- and through it the loader) alive until flushed.
  jit.flush()
  collectgarbage(); collectgarbage()
  H.eq(luamap.live_states(), before)
end)

H.test('a plain luajit host uses libember_lua.so', function()
  local bin = arg and arg[-1] or ''
  local build = bin:match('^(.*)/[^/]*$')
  local lj = io.popen('command -v luajit 2>/dev/null'):read('*l')
  if not build or not lj or lj == '' then H.skip('no luajit or build dir') return end
  local script = ([[
    package.path = '%s/lua/?.lua;%s/lua/?/init.lua;' .. package.path
    local em = require 'ember'
    local k = 5
    local ds = em.data.tensors(em.arange(1, 9):float(), em.arange(1, 9):long())
      :map(function(a, b) return a * k, b end):batch(4)
    local l = ds:loader{workers = 2, progress = false}
    local s = 0
    for a in l:epoch() do s = s + a:sum():item() end
    io.write('sum ', s, '\n')
    l, ds = nil, nil
    collectgarbage(); collectgarbage()
    io.write('live ', require('ember.data.luamap').live_states(), '\n')
    io.stdout:flush()
  ]]):format(build, build)
  local file = os.tmpname()
  local f = io.open(file, 'w'); f:write(script); f:close()
  local p = io.popen(lj .. ' ' .. file .. ' 2>&1')
  local out = p:read('*a')
  p:close()
  os.remove(file)
  if out:find('ASan runtime', 1, true) or out:find('libtsan', 1, true) then
    H.skip('a sanitizer build: luajit cannot load it') return
  end
  H.check(out:find('sum 180', 1, true), out)       -- 5 * (1 + ... + 8)
  H.check(out:find('live 0', 1, true), out)
end)

H.test('randomness inside fn is per sample: same for any worker count, new each epoch', function()
  local ds = em.data.tensors(em.zeros(12, 3), em.arange(1, 13))
    :map(function(x, y) return x + em.rand(3), y end, { seed = 4 }):batch(4)
  local function run(workers)
    local l = ds:loader{ workers = workers }
    local r = {}
    for e = 1, 2 do
      for x in l:epoch(e) do r[#r + 1] = x:clone() end
    end
    return r
  end
  local a, b = run(0), run(3)
  local same = #a == #b
  for i = 1, #a do same = same and a[i]:eq(b[i]):all():item() end
  H.check(same, 'workers 0 and 3 give the same random values')
  H.check(not a[1]:eq(a[4]):all():item(), 'epoch 2 draws other values than epoch 1')
  H.check(not a[1][1]:eq(a[1][2]):all():item(), 'samples draw different values')
end)

H.done()

--[[
test_cuda.lua -- em.cuda and cuda tensors from Lua, on the emulated runtime
(EMBER_CUDA_EMULATE=2:64; the test runs itself again with it otherwise):
the em.cuda functions, t:cuda() / t:to('cuda:1') / t:cpu() round trips for every
dtype against the CPU values, reading values (item, totable, indexing, printing)
from a device tensor, memory statistics, and the errors for what is not built yet.
]]
local dir = (arg and arg[0] and arg[0]:match('^(.*/)')) or
            ((os.getenv('EMBER_TESTS') or 'tests') .. '/lua/')
local H, em = dofile(dir .. 'cuda_emulated.lua')('2:64')   -- the devices this test expects
-- On a GPU machine (EMBER_TEST_REAL_CUDA, tests/bench/gpu_run.sh) the test runs on the
-- real devices: "the other device" is cuda:1 where there is one, else cuda:0, and the
-- checks of the emulated 64 MB devices' sizes are skipped.
local EMU = os.getenv('EMBER_TEST_REAL_CUDA') == nil   -- the 2:64 devices of cuda_emulated.lua
local D1 = em.cuda.device_count() > 1 and 1 or 0
local OTHER = 'cuda:' .. D1

H.test('em.cuda on two emulated devices', function()
  if not EMU then return H.skip('a real GPU: its own devices, not two emulated ones') end
  H.eq(em.cuda.is_available(), true)
  H.eq(em.cuda.device_count(), 2)
  H.eq(em.cuda.emulated(), true)
  H.eq(em.cuda.why_not(), nil)
  em.cuda.synchronize()
  em.cuda.synchronize(1)
  H.raises(function() em.cuda.synchronize(5) end, 'cuda:5')
  local p = em.cuda.get_device_properties(1)
  H.eq(p.total_memory, 64 * 2 ^ 20)
  H.eq(p.emulated, true)
  H.check(p.major >= 8 and p.multi_processor_count >= 1 and #p.name > 0, p.name)
  H.raises(function() em.cuda.get_device_properties(2) end, 'cuda:2')
end)

H.test('round trips for every dtype', function()
  for _, dt in ipairs({ 'float32', 'float64', 'float16', 'bfloat16', 'int32', 'int64',
                        'uint8', 'bool' }) do
    local h = em.tensor({ { 1, 0, 3 }, { 4, 5, 0 } }, { dtype = dt })
    local d = h:cuda()
    H.eq(d.device, 'cuda:0')
    H.eq(d.is_cuda, true)
    H.eq(d:cpu():totable(), h:totable(), dt)
    local d1 = h:to(OTHER)
    H.eq(d1.device, OTHER)
    H.eq(d1:t():cpu():totable(), h:t():totable(), dt .. ' transposed on the device')
    H.eq(d1:t():contiguous():cpu():totable(), h:t():totable(), dt .. ' strided copy kernel')
  end
end)

H.test('reading values from a device tensor', function()
  local d = em.tensor({ 1.5, -2, 7 }):cuda()
  H.eq(d[3], 7, 't[i] of a 1-D device tensor is a number (a read: it waits)')
  H.eq(d:narrow(1, 3, 1):item(), 7)
  H.eq(d:totable(), { 1.5, -2, 7 })
  H.check(tostring(d):find('cuda:0', 1, true), tostring(d))
  local f = em.full({ 4, 4 }, 2.25, { device = 'cuda' })
  H.eq(f:cpu():totable()[4][4], 2.25)
  f:fill_(-1)
  H.eq(f:cpu():totable()[2][3], -1)
end)

H.test('memory statistics and empty_cache', function()
  em.cuda.empty_cache()
  local before = em.cuda.memory_stats(0)
  local t = em.zeros({ 1000 }, { device = 'cuda:0', dtype = 'float64' })
  local during = em.cuda.memory_stats('cuda:0')
  H.check(during.allocated >= before.allocated + 8000, 'allocated grew')
  if EMU then H.eq(during.capacity, 64 * 2 ^ 20) else H.check(during.capacity > 2 ^ 30, 'a GPU') end
  t = nil
  em.cuda.empty_cache(0)             -- releases what Lua no longer reaches, then the cache
  H.eq(em.cuda.memory_stats(0).allocated, before.allocated)
  H.eq(em.cuda.memory_stats(0).reserved, 0)
end)

H.test('errors: what is not built yet, mixed devices, out of memory', function()
  local d = em.ones(3):cuda()
  local d4 = em.ones({ 1, 1, 2, 2 }):cuda()
  H.raises(function() return em.nn.functional.conv2d(d4, em.ones({ 1, 1, 2, 2 })) end, 'cuda:0', 'cpu')
  H.raises(function() return d + em.ones(3) end, 'cuda:0', 'cpu')
  if D1 == 1 then H.raises(function() return d + d:cuda(1) end, 'cuda:0', 'cuda:1') end
  local rows = math.ceil(em.cuda.memory_stats(0).capacity / 2 ^ 22) + 16   -- float32 rows of 4 MB
  H.raises(function() return em.zeros({ rows, 2 ^ 20 }, { device = 'cuda' }) end,
           'out of memory')
  H.eq(em.ones(2):cuda():cpu():totable(), { 1, 1 })     -- usable after the failure
end)

H.test('between devices: t:to(cuda:1), with a dtype, strided, and gradients', function()
  local h = em.randn(6, 9)
  local d0 = h:cuda()
  H.eq(d0:to(OTHER):cpu():totable(), h:totable(), 'cuda:0 -> ' .. OTHER)
  H.eq(d0:t():to(OTHER, 'float64'):cpu():totable(), h:t():double():totable(),
       'transposed, to float64')
  local x = h:cuda(D1):requires_grad_()
  ;((x:to('cuda:0') * 3):sum()):backward()
  H.eq(x.grad.device, OTHER)
  H.eq(x.grad:cpu():totable(), em.full({ 6, 9 }, 3):totable(), 'the gradient came back')
end)

H.test('pinned memory: pin_memory, is_pinned, asynchronous :cuda()', function()
  local h = em.randn(40, 50)
  local p = h:pin_memory()
  H.eq(p:is_pinned(), true)
  H.eq(h:is_pinned(), false)
  H.eq(p.device, 'cpu')
  H.eq(p:totable(), h:totable())
  H.check(rawequal(p:pin_memory(), p), 'pinning a pinned tensor gives it back')
  local d = p:cuda()
  H.eq((d * 2):cpu():totable(), (h * 2):totable(), 'computed after the copy stream')
  H.eq(p:cuda(D1):cpu():totable(), h:totable(), 'to ' .. OTHER)
  H.raises(function() return d:pin_memory() end, 'pin_memory', 'cuda:0')
end)

H.test('device memory short: Lua collects its garbage and the op is retried', function()
  if not EMU then return H.skip('sized for the emulated 64 MB device') end
  em.cuda.empty_cache()
  -- past 80 % the allocator raises the pressure flag, and the next tensor made
  -- runs a full collection: 160 MB of garbage never fill the 64 MB device
  for _ = 1, 40 do local _ = em.zeros({ 1024, 1024 }, { device = 'cuda:1' }) end
  H.check(em.cuda.memory_stats(1).allocated < 60 * 2 ^ 20, '160 MB made on a 64 MB device')
  -- garbage that only a collection finds (the collector is stopped, so none runs
  -- by itself), then an op that needs its memory: it fails, Lua collects, the op
  -- is called again and succeeds
  collectgarbage('stop')
  local big = em.zeros({ 40, 2 ^ 20 }, { device = 'cuda:1', dtype = 'uint8' })
  big = nil
  local retries = em.cuda.memory_stats(1).oom_retries
  local again = em.full({ 40, 2 ^ 20 }, 7, { device = 'cuda:1', dtype = 'uint8' })
  H.eq(again[40][2 ^ 20], 7, 'made after the retry')
  H.check(em.cuda.memory_stats(1).oom_retries > retries, 'the allocator ran short first')
  again = nil
  -- what can't fit at all is an error naming the device and the sizes, with
  -- Lua's garbage collected before it is raised
  H.raises(function() return em.zeros({ 100, 2 ^ 20 }, { device = 'cuda:1', dtype = 'uint8' }) end,
           'cuda:1', 'out of memory allocating 100.00 MiB', 'capacity')
  collectgarbage('restart')
  H.check(em.cuda.memory_stats(1).allocated < 2 ^ 20, 'the garbage was freed')
  H.eq(em.zeros(2, { device = 'cuda:1' }):cpu():totable(), { 0, 0 }, 'usable')
end)

H.test('device memory short: every op that makes tensors is retried, not only some', function()
  if not EMU then return H.skip('sized for the emulated 64 MB devices') end
  local D = 'cuda:1'
  -- junk_mb of garbage that only a collection finds (the collector is stopped),
  -- with what is live kept under the 80 % that raises the pressure flag by
  -- itself; fn then needs more than is left on the device, so its first try
  -- fails, Lua collects and the second try succeeds.
  local function fresh()         -- no cached segment for the inputs to split
    em.collect()
    em.cuda.empty_cache()
  end
  local function short(junk_mb, fn)
    collectgarbage('stop')
    local junk = em.zeros({ junk_mb, 2 ^ 20 }, { device = D, dtype = 'uint8' })
    junk = nil
    local retries = em.cuda.memory_stats(1).oom_retries
    local ok, r = pcall(fn)
    local ran_short = em.cuda.memory_stats(1).oom_retries > retries
    collectgarbage('restart')
    return ok, r, ran_short
  end
  -- Each case in a function of its own: a result left in a register of the
  -- test's frame would stay reachable and hold its memory.
  local function retried(name, junk_mb, fn, check)
    local ok, r, ran_short = short(junk_mb, fn)
    H.check(ok, name .. ' made after the retry: ' .. tostring(r))
    H.check(ran_short, name .. ': the allocator ran short first')
    if ok then check(r) end
  end
  -- a reduction along a dim of size 1: 8 MB in, 8 MB of values and 16 of indices out
  local function max_dim()
    fresh()
    local x = em.full({ 1, 2 ^ 21 }, 3, { device = D, dtype = 'float32' })
    retried('max(dim)', 36, function() return { x:max(1) } end, function(r)
      H.eq(r[1][2 ^ 21], 3, 'max(dim) values')
      H.eq(r[2][2 ^ 21], 1, 'max(dim) indices')
    end)
  end
  -- index_select: 8 MB in, 24 MB out
  local function index_select()
    fresh()
    local x = em.full({ 2, 2 ^ 20 }, 5, { device = D, dtype = 'float32' })
    local idx = em.tensor({ 1, 2, 1, 2, 1, 2 }):cuda(1)
    retried('index_select', 40, function() return x:index_select(1, idx) end, function(r)
      H.eq(r[6][2 ^ 20], 5, 'index_select values')
    end)
  end
  -- a functional op: max_pool2d with a 1x1 window, 12 MB in and 12 MB out
  local function max_pool2d()
    fresh()
    local x = em.full({ 1, 3, 1024, 1024 }, 2, { device = D, dtype = 'float32' })
    retried('max_pool2d', 36, function() return em.nn.F.max_pool2d(x, 1) end, function(r)
      H.eq(r[1][3][1024][1024], 2, 'max_pool2d values')
    end)
  end
  max_dim()
  index_select()
  max_pool2d()
  em.collect()
  H.check(em.cuda.memory_stats(1).allocated < 2 ^ 20, 'the garbage was freed')
end)

H.test('em.cuda.graph: a training step captured once, launched as a whole', function()
  em.manual_seed(5)
  -- the optimizer is made after m:to('cuda'), which gives the model new tensors
  local function setup(from)
    local m = em.nn.Sequential(em.nn.Linear(6, 16), em.nn.ReLU(), em.nn.Linear(16, 3))
    if from then m:load_state_dict(from:state_dict()) end
    m:to('cuda')
    return m, em.optim.SGD(m:parameters(), { lr = 0.05, momentum = 0.9 })
  end
  local mg, og = setup()
  local md, od = setup(mg)
  local before = H.flat(mg:parameters()[1]:cpu())
  local x, y = em.zeros({ 8, 6 }, { device = 'cuda' }), em.zeros({ 8, 3 }, { device = 'cuda' })
  local function step(m, o, xs, ys)
    o:zero_grad()
    local loss = ((m(xs) - ys) ^ 2):mean()
    loss:backward()
    o:step()
    return loss
  end
  step(mg, og, x, y)     -- a warm-up outside the graph makes the optimizer's state
  step(md, od, x, y)
  local g = em.cuda.graph(function() return step(mg, og, x, y) end)
  for i = 1, 4 do
    local bx, by = em.randn(8, 6), em.randn(8, 3)
    x:copy_(bx); y:copy_(by)                 -- new data into the static inputs
    local lg = g()
    local ld = step(md, od, bx:cuda(), by:cuda())
    H.close(lg:item(), ld:item(), 1e-5, 'loss of launch ' .. i)
  end
  local pg, pd = mg:parameters(), md:parameters()
  local moved = 0
  for i, v in ipairs(H.flat(pg[1]:cpu())) do moved = math.max(moved, math.abs(v - before[i])) end
  H.check(moved > 1e-3, 'the captured steps moved the weights (by ' .. moved .. ')')
  for k = 1, #pg do
    H.close(H.flat(pg[k]:cpu()), H.flat(pd[k]:cpu()), 1e-5, 'parameter ' .. k .. ' after 5 steps')
  end
  H.raises(function() em.cuda.graph(function() return x:sum():item() end) end,
           'cuda.graph', 'capturing', 'copy to the CPU')
  H.raises(function() em.cuda.graph(function() return x + em.ones(6) end) end, 'cuda:0', 'cpu')
  H.raises(function() em.cuda.graph(42) end, 'expected a function')
  local adam = em.optim.Adam(mg:parameters())
  H.raises(function() em.cuda.graph(function() adam:step() end) end, 'Adam.step', 'captured',
           'bias correction')
  H.eq(em.cuda.is_capturing(), false)
  g:free()
  H.raises(function() g() end, 'freed')
  H.eq((x + 1):cpu():size(1), 8, 'usable after the failed captures')
end)

H.test('allow_tf32', function()
  H.eq(em.cuda.allow_tf32(), false)
  H.eq(em.cuda.allow_tf32(true), false)
  H.eq(em.cuda.allow_tf32(false), true)
  H.raises(function() em.cuda.allow_tf32('yes') end, 'allow_tf32')
end)

H.test('element-wise ops on the device match the cpu', function()
  local a = em.tensor({ { 1.5, -2, 0 }, { 4, -0.25, 7 } })
  local b = em.tensor({ 3, 0.5, -1 })
  H.eq((a:cuda() + b:cuda()):cpu():totable(), (a + b):totable(), 'a + b (broadcast)')
  H.eq((a:cuda() * 2 - b:cuda()):cpu():totable(), (a * 2 - b):totable(), 'a * 2 - b')
  H.eq(a:cuda():double():cpu():totable(), a:double():totable(), 'a cast on the device')
  local i = em.tensor({ 7, -7, 5 }, { dtype = 'int32' })
  local j = em.tensor({ 2, 3, -2 }, { dtype = 'int32' })
  H.eq((i:cuda() + j:cuda()):cpu():totable(), (i + j):totable(), 'int32 add')
end)

H.test('autograd through cuda tensors', function()
  -- a CPU leaf used on the device: its gradient comes back through the copy
  local a = em.tensor({ 1.0, 2.5, -3.0 }):requires_grad_()
  local b = em.tensor({ 0.4, 0.5, 0.6 })
  ;((a:cuda() * b:cuda()):exp():sum()):backward()
  local a2 = em.tensor({ 1.0, 2.5, -3.0 }):requires_grad_()
  ;((a2 * b):exp():sum()):backward()
  H.eq(a.grad.device, 'cpu')
  for i = 1, 3 do H.close(a.grad[i], a2.grad[i], 1e-5 * math.abs(a2.grad[i])) end
  -- a leaf on the device: the gradient stays there
  local w = em.tensor({ { 1, -2 }, { 0.5, 3 } }):cuda():requires_grad_()
  ;((w * w):sum() + w:softmax(2):amax()):backward()
  H.eq(w.grad.device, 'cuda:0')
  local wc = em.tensor({ { 1, -2 }, { 0.5, 3 } }):requires_grad_()
  ;((wc * wc):sum() + wc:softmax(2):amax()):backward()
  local g, gc = w.grad:cpu():totable(), wc.grad:totable()
  for i = 1, 2 do for j = 1, 2 do H.close(g[i][j], gc[i][j], 1e-5) end end
end)

H.test("a model on cuda: m:to('cuda'), forward and backward match the CPU", function()
  em.manual_seed(3)
  local function model()
    return em.nn.Sequential(em.nn.Linear(4, 8), em.nn.ReLU(), em.nn.Linear(8, 3))
  end
  local mc, md = model(), model()
  md:load_state_dict(mc:state_dict())
  md:to('cuda')
  local x = em.randn(5, 4)
  local yc, yd = mc(x), md(x:cuda())
  H.eq(yd.device, 'cuda:0')
  local a, b = yc:totable(), yd:cpu():totable()
  for i = 1, 5 do for j = 1, 3 do H.close(b[i][j], a[i][j], 1e-5) end end
  yc:pow(2):mean():backward()
  yd:pow(2):mean():backward()
  local pc, pd = mc:parameters(), md:parameters()
  for k = 1, #pc do
    H.eq(pd[k].grad.device, 'cuda:0')
    local gc, gd = pc[k].grad:reshape(-1):totable(), pd[k].grad:cpu():reshape(-1):totable()
    for i = 1, #gc do H.close(gd[i], gc[i], 1e-5) end
  end
end)

H.done()

--[[
test_meta.lua -- the meta device and each device's memory statistics: meta
tensors have shapes and dtypes and no data; every op runs its checks, type
promotion, shape logic and autograd on them; their allocations are counted
(em.memory_stats('meta')) as the same step on the CPU counts its own; reading a
value is a clear error; m:to('meta') moves a model. On two emulated CUDA
devices, em.memory_stats('cuda:N') is the allocator's own account.
]]
local dir = (arg and arg[0] and arg[0]:match('^(.*/)')) or
            ((os.getenv('EMBER_TESTS') or 'tests') .. '/lua/')
local H, em = dofile(dir .. 'cuda_emulated.lua')('2:256')
local nn = em.nn
local collect = require('ember.handles').collect

local MB = 2 ^ 20

H.test('meta tensors: shapes, dtypes, bytes counted, no data', function()
  collect()
  local before = em.memory_stats('meta').allocated
  local cpu_before = em.memory_stats('cpu').allocated
  local x = em.zeros(1024, 1024, { device = 'meta' })
  H.eq(x.device, 'meta')
  H.eq(x:size()[1], 1024)
  H.eq(x.dtype, 'float32')
  H.eq(em.memory_stats('meta').allocated - before, 4 * MB, '4 MiB counted on meta')
  H.eq(em.memory_stats('cpu').allocated, cpu_before, 'nothing on the CPU')
  local y = em.ones(1024, { device = 'meta', dtype = 'float64' })
  H.eq((x + y).dtype, 'float64', 'type promotion runs')
  H.eq((x + y):size()[2], 1024, 'broadcasting runs')
  local z = x:t():matmul(em.zeros(1024, 8, { device = 'meta' }))
  H.eq(z:size()[1], 1024); H.eq(z:size()[2], 8)
  H.eq(z:sum(2):size()[1], 1024, 'reductions give their shapes')
  local ok, err = pcall(function() return x:matmul(em.zeros(3, 8, { device = 'meta' })) end)
  H.check(not ok and err:find('matmul'), 'a bad shape is the same error as on the CPU: ' .. tostring(err))
  ok, err = pcall(function() return x + em.zeros(1024, 1024) end)
  H.check(not ok and err:find('meta') and err:find('cpu'), 'mixing devices names both: ' .. tostring(err))
  x, y, z = nil, nil, nil
  collect()
  H.eq(em.memory_stats('meta').allocated, before, 'freed tensors leave the count')
end)

H.test('reading a meta tensor is an error; printing shows its shape', function()
  local x = em.ones(2, 3, { device = 'meta' })
  local ok, err = pcall(function() return x:sum():item() end)
  H.check(not ok and err:find('meta tensor') and err:find('no data'), tostring(err))
  ok, err = pcall(function() return x:to('cpu') end)
  H.check(not ok and err:find('meta tensor'), tostring(err))
  local s = tostring(x)
  H.check(s:find('on meta') and s:find('2x3'), s)
  local c = em.ones(2, 3):to('meta')
  H.eq(c.device, 'meta', 'a CPU tensor moves to meta')
end)

H.test('the Lua layer keeps meta tensors on meta: literals, indexing, index lists, loaders', function()
  local t = em.tensor({ 1, 2, 3 }, { device = 'meta' })
  H.eq(t.device, 'meta', 'em.tensor with device meta')
  local ok, err = pcall(function() return t[2] end)
  H.check(not ok and err:find('meta tensor'), 'reading an element is an error: ' .. tostring(err))
  t[2] = 5                                   -- a write with nothing to write to
  H.eq(t.device, 'meta')
  local v = em.zeros(4, 3, { device = 'meta' }):index_select(1, { 1, 3 })
  H.eq(v.device, 'meta'); H.eq(v:size()[1], 2, 'an index list goes to the tensor\'s device')
  local ds = em.data.tensors(em.zeros(8, 2))
  ok, err = pcall(function() return em.data.loader(ds, { batch_size = 4, device = 'meta' }) end)
  H.check(not ok and err:find('meta'), 'a loader onto meta is refused: ' .. tostring(err))
end)

-- The tensor bytes of one training step, from the start of the forward.
local function step_peak(device)
  em.manual_seed(1)
  local m = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 10))
  if device ~= 'cpu' then m:to(device) end
  local x = em.randn(32, 64):to(device)
  local t = em.ones(32, { dtype = 'int64' }):to(device)
  collect()
  em.reset_peak_memory_stats(device)
  local base = em.memory_stats(device).allocated
  local loss = nn.functional.cross_entropy(m:forward(x), t)
  loss:backward()
  local grads = {}
  for _, p in ipairs(m:parameters()) do grads[#grads + 1] = p.grad and p.grad:size() end
  return em.memory_stats(device).peak - base, grads
end

H.test('a training step on meta counts the bytes the CPU holds, and makes every gradient', function()
  local cpu_peak, cpu_grads = step_peak('cpu')
  local meta_peak, meta_grads = step_peak('meta')
  H.check(cpu_peak > 0, 'the CPU step holds memory')
  H.eq(meta_peak, cpu_peak, 'peak bytes of the step: meta = cpu')
  H.eq(#meta_grads, #cpu_grads, 'every parameter has a gradient')
  for i = 1, #cpu_grads do
    H.eq(table.concat(meta_grads[i], 'x'), table.concat(cpu_grads[i], 'x'), 'gradient shape ' .. i)
  end
end)

H.test('memory statistics of every device; a new peak', function()
  for _, d in ipairs({ 'cpu', 'meta' }) do
    local s = em.memory_stats(d)
    H.check(s.allocated >= 0 and s.peak >= s.allocated and s.reserved >= s.allocated, d)
    H.eq(s.capacity, 0, d .. ' has no fixed capacity')
  end
  local keep = em.zeros(256, 1024, { device = 'meta' })
  local tmp = em.zeros(1024, 1024, { device = 'meta' })
  tmp = nil
  collect()
  em.reset_peak_memory_stats('meta')
  local s = em.memory_stats('meta')
  H.eq(s.peak, s.allocated, 'reset: the peak starts at what is held')
  H.check(s.allocated >= 1 * MB, 'the kept tensor')
  local ok, err = pcall(em.memory_stats, 'tpu:0')
  H.check(not ok and err:find('tpu'), tostring(err))
  keep = nil
  if em.cuda.is_available() then
    local c = em.memory_stats('cuda:1')
    H.eq(c.capacity, 256 * MB, 'the emulated device has 256 MB')
    local a = em.zeros(MB, { device = 'cuda:1' })
    local c2 = em.memory_stats('cuda:1')
    H.check(c2.allocated - c.allocated >= 4 * MB, 'a device tensor counts on its device')
    H.eq(em.memory_stats('cuda:1').allocated, em.cuda.memory_stats(1).allocated,
      'the same account as em.cuda.memory_stats')
    a = nil
  end
end)

H.done()

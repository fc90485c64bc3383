--[[
bench_loader_mem.lua -- loader throughput on data already in memory:
Fashion-MNIST train as uint8 (60000, 1, 28, 28), shuffled, batches of 128, no
transform, 2 worker threads; samples/s over 2 whole epochs after a warm-up epoch.
What it measures is the pipeline's own overhead (gather of shuffled samples into
a batch, hand-off between threads). The PyTorch twin is bench_loader_mem.py.
Without Debian's dataset-fashion-mnist it prints a skip line.
]]
local B = dofile(debug.getinfo(1, 'S').source:sub(2):match('(.*/)') .. 'common.lua')

local ok, ds = pcall(em.data.fashion_mnist, { split = 'train' })
if not ok then
  print('SKIP loader_mem: ' .. tostring(ds))
  return
end
em.manual_seed(0)
local loader = ds:shuffle():batch(128):loader{ workers = 2, progress = false }

local function epoch()
  local n = 0
  for x in loader:epoch() do n = n + x:size(1) end
  return n
end
epoch()                                      -- warm-up: threads, first touch of memory
local t0, n = em.clock(), 0
for _ = 1, 2 do n = n + epoch() end
B.result('loader_mem', n / (em.clock() - t0), 'samples/s', 'higher', '>= 1000000 samples/s')

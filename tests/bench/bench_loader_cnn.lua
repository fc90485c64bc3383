--[[
bench_loader_cnn.lua -- does the loader keep the training step fed? The
Fashion-MNIST CNN (train_common.lua's, as in examples/fashion_mnist.lua), Adam
1e-3, batch 128, fed by ds:shuffle():map(to_float, normalize):batch(128) with 2
loader workers, timed over STEPS steps after WARM; then the same on
em.data.synthetic uint8 samples through the same map (alternating, best of 2). Reported:

  loader_cnn_wait           % of the timed real-data steps spent waiting for a batch
  loader_cnn_real           samples/s on Fashion-MNIST
  loader_cnn_synthetic      samples/s on synthetic data
  loader_cnn_real_vs_synth  the ratio of the two (1 = reading real data costs nothing)

The machine has 2 cores: the 2 workers compete with the 2 compute threads, which
is the case measured (a loader that needs cores of its own is not keeping up). The PyTorch twin is bench_loader_cnn.py. Without Debian's
dataset-fashion-mnist it prints a skip line.
]]
local B = dofile(debug.getinfo(1, 'S').source:sub(2):match('(.*/)') .. 'common.lua')
local TC = dofile(debug.getinfo(1, 'S').source:sub(2):match('(.*/)') .. 'train_common.lua')
local F, T = em.nn.F, em.data.T

local WARM, STEPS, BATCH = 10, 150, 128

local ok, real = pcall(em.data.fashion_mnist, { split = 'train' })
if not ok then
  print('SKIP loader_cnn: ' .. tostring(real))
  return
end

-- samples/s and wait fraction of STEPS training steps fed from ds.
local function run(ds)
  em.manual_seed(0)
  local loader = ds:shuffle():map(T.compose{ T.to_float(), T.normalize(0.2860, 0.3530) })
    :batch(BATCH):loader{ workers = 2, progress = false }
  local model = TC.model('cnn')
  local opt = em.optim.Adam(model:parameters(), { lr = 1e-3 })
  local i, t0, s0 = 0, nil, nil
  for x, y in loader:epoch() do
    local loss = F.cross_entropy(model(x), y)
    opt:zero_grad()
    loss:backward()
    opt:step()
    i = i + 1
    if i == WARM then t0, s0 = em.clock(), loader:stats() end
    if i == WARM + STEPS then break end
  end
  local t, s = em.clock() - t0, loader:stats()
  loader:close()
  return STEPS * BATCH / t, (s.wait_s - s0.wait_s) / (s.elapsed_s - s0.elapsed_s)
end

-- Real and synthetic alternate, best of 2 each: the machine's load drifts.
local fake = em.data.synthetic{ shape = { 1, 28, 28 }, dtype = 'uint8', classes = 10,
                                size = #real, seed = 1 }
local rate, wait, synth = 0, 1, 0
for _ = 1, 2 do
  local r, w = run(real)
  if r > rate then rate, wait = r, w end
  synth = math.max(synth, (run(fake)))
end
B.result('loader_cnn_wait', 100 * wait, '%', 'lower', '<= 5 %')
B.result('loader_cnn_real', rate, 'samples/s', 'higher', 'ratio >= 1')
B.result('loader_cnn_synthetic', synth, 'samples/s', 'higher', 'ratio >= 1')
B.result('loader_cnn_real_vs_synth', rate / synth, 'x', 'higher', '>= 0.95 x')

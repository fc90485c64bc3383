--[[
bench_cuda_train.lua -- whole training steps on a GPU, ember beside PyTorch eager
on the same GPU in the same run:

  cnn     the Fashion-MNIST CNN of examples/fashion_mnist.lua, batch 128, Adam 1e-3
  resnet  an 18-layer residual network for 32x32 inputs: a 3x3 stem of 16
          filters, four stages of two basic blocks with 16, 32, 64 and 128
          filters (stride 2 from the second stage, 1x1 projections where the
          shape changes), global average pooling, a 10-way linear layer; batch
          512, NCHW, synthetic data, SGD with momentum 0.9 and weight decay 5e-4
          (the set-up of the classic MXNet-versus-TensorFlow multi-GPU runs)

and each of the two again in bfloat16 autocast with channels-last (cnn_bf16,
resnet_bf16): em.amp.autocast('bfloat16') and m:to{memory_format = 'channels_last'},
each batch made channels-last at the model's entry, against torch.autocast('cuda',
dtype=torch.bfloat16) and torch.channels_last (eager). Those rows print
"skipped: ..." where this build lacks em.amp or to_channels_last.

Each figure is samples per second over whole steps (forward, cross-entropy,
backward, optimizer step), after warm-up steps, with a synchronize before the
clock starts and stops: the median of several repetitions. The ratio is ember /
PyTorch (above 1: ember faster); the target is >= 1.2.

  build/ember tests/bench/bench_cuda_train.lua [--smoke] [--steps N] [--tf32]
                                               [--only ROW,...] [--no-peer]

--only runs the named rows (cnn, resnet, cnn_bf16, resnet_bf16, and two rows that
split the ResNet's bf16+CL figure: resnet_cl, float32 channels-last, and resnet_amp,
bf16 autocast in NCHW); --no-peer leaves PyTorch out. Under `ember --profile` each
step marks a profiled step, so the report shows where a row's step time goes.

PyTorch's side is bench_cuda_train.py, run by $EMBER_BENCH_PYTHON (default
/usr/bin/python3; the GPU machine's is `python3`) with the same sizes. Without a
CUDA device this prints "skipped: ..." and exits 0. On emulated devices it runs
tiny smoke sizes, with PyTorch on the CPU: a check of the script, not a figure.
]]
local dir = arg[0]:match('^(.*/)') or './'
local B = dofile(dir .. 'common.lua')
local em = B.em
local nn, F = em.nn, em.nn.F

if not em.cuda.is_available() then
  local why = tostring(em.cuda.why_not()):gsub('^no CUDA device: ', '')
  print(('skipped: no CUDA device (%s)'):format(why))
  os.exit(0)
end

local smoke = em.cuda.emulated()
local steps = nil
local tf32 = false     -- --tf32: float32 matmul and convolution in TF32 on both sides
local only, no_peer = nil, false
for i, a in ipairs(arg) do
  if a == '--smoke' then smoke = true end
  if a == '--steps' then steps = tonumber(arg[i + 1]) end
  if a == '--tf32' then tf32 = true end
  if a == '--no-peer' then no_peer = true end
  if a == '--only' then
    only = {}
    for k in tostring(arg[i + 1]):gmatch('[^,]+') do only[k] = true end
  end
end
local Z = smoke and { cnn_batch = 8, resnet_batch = 4, steps = steps or 2, reps = 2, warm = 1 }
                 or { cnn_batch = 128, resnet_batch = 512, steps = steps or 20, reps = 5, warm = 5 }
local DEV = 'cuda'
em.cuda.allow_tf32(tf32)

-- -- The models ------------------------------------------------------------------------
local function cnn()
  return nn.Sequential(
    nn.Conv2d(1, 32, 3, { padding = 1 }), nn.ReLU(), nn.MaxPool2d(2),
    nn.Conv2d(32, 64, 3, { padding = 1 }), nn.ReLU(), nn.MaxPool2d(2),
    nn.Flatten(), nn.Linear(3136, 128), nn.ReLU(), nn.Linear(128, 10))
end

-- The seed's ResNet-18 for 32x32 inputs (resnet_common.lua, shared with the CPU bench).
local R = dofile(dir .. 'resnet_common.lua')
local resnet18 = R.resnet18

-- -- Timing ----------------------------------------------------------------------------
-- samples/s of `step` (one training step on `batch` samples): the median of Z.reps
-- repetitions of Z.steps steps, each repetition between two synchronizes.
local function rate(step, batch)
  for _ = 1, Z.warm do step() end
  local rs = {}
  for r = 1, Z.reps do
    collectgarbage()
    em.cuda.synchronize()
    local t0 = B.now()
    for _ = 1, Z.steps do step() end
    em.cuda.synchronize()
    rs[r] = Z.steps * batch / (B.now() - t0)
  end
  return B.median(rs)
end

-- One training step of `model` on a synthetic batch of `shape`, with bfloat16 autocast
-- when amp and in channels-last when cl (the model once, the batch at the model's entry).
local function bench(model, opt, shape, batch, amp, cl)
  if cl then model:to{ memory_format = 'channels_last' } end
  local x = em.randn({ batch, (table.unpack or unpack)(shape) }, { device = DEV })
  local y = em.randint(1, 11, { batch }, { device = DEV })
  local function forward()
    return F.cross_entropy(model(cl and x:to_channels_last() or x), y)
  end
  return rate(function()
    local loss = amp and em.amp.autocast('bfloat16', forward) or forward()
    opt:zero_grad()
    loss:backward()
    opt:step()
    em.profile.step()
  end, batch)
end

local function bench_cnn(amp, cl)
  em.manual_seed(0)
  local model = cnn():to(DEV)
  return bench(model, em.optim.Adam(model:parameters(), { lr = 1e-3 }), { 1, 28, 28 },
               Z.cnn_batch, amp, cl)
end

local function bench_resnet(amp, cl)
  em.manual_seed(0)
  local model = resnet18():to(DEV)
  return bench(model, R.sgd(model), { 3, 32, 32 }, Z.resnet_batch, amp, cl)
end

-- What the bf16 rows need, where this build lacks it.
local low_missing = (not R.has_amp() and 'em.amp not built')
                 or (not R.has_channels_last() and 'channels-last (to_channels_last) not built')
                 or nil

-- -- PyTorch's side, then the table ---------------------------------------------------------
local py = os.getenv('EMBER_BENCH_PYTHON') or '/usr/bin/python3'
local cmd = ('%s %sbench_cuda_train.py --device %s --cnn-batch %d --resnet-batch %d ' ..
             '--steps %d --reps %d --warm %d --tf32 %d --bf16 %d 2>&1'):format(py, dir,
             smoke and 'cpu' or 'cuda', Z.cnn_batch, Z.resnet_batch, Z.steps, Z.reps, Z.warm,
             tf32 and 1 or 0, low_missing and 0 or 1)
local torch, info, torch_na = {}, {}, {}
local p = io.popen(no_peer and 'true' or cmd)
for line in p:lines() do
  local name, value = line:match('^RESULT (%S+) (%S+)')
  if name then torch[name] = tonumber(value) end
  local what, why = line:match('^NA (%S+) (.*)$')
  if what then torch_na[what] = why end
  local text = line:match('^INFO (.*)$')
  if text then info[#info + 1] = text end
end
p:close()

local props = em.cuda.get_device_properties(0)
print(('ember on %s%s; PyTorch: %s'):format(props.name, smoke and ' (emulated)' or '',
                                           table.concat(info, ', ')))
if smoke then print('emulated: smoke sizes, PyTorch on the CPU: these are not GPU figures') end
print(('TF32 for float32 matmul and convolution: %s on both sides'):format(tf32 and 'on' or 'off'))
print('ratio: ember samples/s / PyTorch samples/s (> 1: ember faster; goal >= 1.2)')
print()
print(('%-36s %14s %14s %8s'):format('step', 'ember', 'PyTorch', 'ratio'))
local ember_failed = false
local cnn_label = ('Fashion-MNIST CNN, batch %d'):format(Z.cnn_batch)
local resnet_label = ('ResNet-18 32x32, batch %d'):format(Z.resnet_batch)
-- { key, label, bench, amp, cl, diagnostic (run only when --only names it) }
local rows = { { 'cnn', cnn_label, bench_cnn },
               { 'resnet', resnet_label, bench_resnet },
               { 'cnn_bf16', cnn_label .. ', bf16+CL', bench_cnn, true, true },
               { 'resnet_bf16', resnet_label .. ', bf16+CL', bench_resnet, true, true },
               { 'resnet_cl', resnet_label .. ', CL', bench_resnet, false, true, true },
               { 'resnet_amp', resnet_label .. ', bf16', bench_resnet, true, false, true } }
for _, r in ipairs(rows) do
  if only and not only[r[1]] or not only and r[6] then
    -- not asked for
  elseif (r[4] or r[5]) and low_missing then
    print(('%-36s skipped: %s'):format(r[2], low_missing))
  else
    local ok, v = pcall(r[3], r[4], r[5])
    local t = torch[r[1]]
    if ok then
      print(('%-36s %14.1f %14s %8s'):format(r[2], v, t and ('%.1f'):format(t) or 'n/a',
                                             t and ('%.3f'):format(v / t) or 'n/a'))
      B.result('cuda_train_' .. r[1], v, 'samples/s', 'higher', 'ratio >= 1.2')
    else
      print(('%-36s %14s %14s %8s  ember n/a: %s'):format(r[2], 'n/a',
            t and ('%.1f'):format(t) or 'n/a', 'n/a', tostring(v)))
      ember_failed = true
    end
    if torch_na[r[1]] then print(('  torch n/a: %s'):format(torch_na[r[1]])) end
  end
end
-- ember's own side failing is a failure of the run (PyTorch missing is not).
if ember_failed then os.exit(1) end

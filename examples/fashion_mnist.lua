-- fashion_mnist.lua -- trains an MLP or a small CNN on Fashion-MNIST (the files of
-- Debian's dataset-fashion-mnist package), with a progress bar, one line per epoch,
-- a checkpoint at the end and `test accuracy: NN.NN%` as the last line.
--
--   ember examples/fashion_mnist.lua [--model mlp|cnn] [--epochs 5] [--batch 128]
--                                    [--lr 1e-3] [--resume] [--checkpoint PATH]
--                                    [--root dir] [--limit n] [--workers 2]
--                                    [--device cpu|cuda|cuda:N]
--                                    [--shard optimizer|gradients|parameters]
--                                    [--amp bf16|fp16] [--channels-last] [--compile]
--
-- --device cuda trains on a GPU (or, with EMBER_CUDA_EMULATE=1, on an emulated
-- one: slowly, but through the same CUDA backend code); batches come to the
-- device through pinned memory, copied while the previous step computes.
--
-- --amp bf16|fp16 runs forward and loss under em.amp.autocast (matmul, linear and conv
-- in bfloat16 or float16, the loss and the norms in float32; parameters, gradients
-- and the optimizer stay float32); fp16 adds an em.amp.GradScaler, which scales the
-- loss, unscales the gradients and skips a step whose gradients overflowed. The test
-- set is evaluated the same way. --channels-last (the CNN) keeps the model's weights
-- in NHWC memory order (m:to{memory_format = 'channels_last'}) and converts each batch
-- once, as it enters the model; every layer keeps that layout from there on.
--
-- --compile runs each training step (forward, loss, backward, Adam's update) through
-- em.compile: captured at the first batch and replayed after, without Lua between its
-- kernels; under --replicas its gradient averaging is replayed too. A step em.compile
-- can't replay (fp16's GradScaler reads the overflow flag; --shard gathers weights)
-- runs eagerly, and the line before the first epoch's says why.
--
-- The checkpoint goes to PATH, by default $XDG_CACHE_HOME/ember/fashion_mnist.ckpt
-- (~/.cache/ember/... when XDG_CACHE_HOME is unset), never into the source tree;
-- its folder is created when missing.
--
-- The same script runs data-parallel, unchanged (em.distribute.mirrored):
--   ember --replicas 2 examples/fashion_mnist.lua      2 replicas, threads of one process
--   mpirun -np 2 ember examples/fashion_mnist.lua      2 processes, any number of hosts
--   ember --replicas 2 --devices cuda:0,cuda:1 examples/fashion_mnist.lua
--                                                      2 replicas, one GPU each
-- Each replica trains on its shard of every epoch with --batch samples per step;
-- gradients are averaged across replicas during backward. Replica 0 evaluates,
-- prints and saves the checkpoint; the epoch line counts the samples of all
-- replicas.
--
-- --shard optimizer|gradients|parameters trains sharded (ZeRO 1, 2 or 3): each
-- replica keeps only its share of the optimizer state (and of the gradients, and
-- of the weights); every replica then evaluates (the model's forward gathers
-- across replicas) and writes its share of the checkpoint, a folder at PATH.d.
--
-- The recipe is the plain one of the benchmark (Adam 1e-3, batch 128), so that the
-- figures compare with PyTorch doing the same work.

local nn, F = em.nn, em.nn.F
local ffi = require 'ffi'

-- -- Where the checkpoint goes -----------------------------------------------------------
local function default_checkpoint()
  local cache = os.getenv('XDG_CACHE_HOME')
  if not cache or cache == '' then
    local home = os.getenv('HOME')
    cache = (home and home ~= '') and home .. '/.cache' or (os.getenv('TMPDIR') or '/tmp')
  end
  return cache .. '/ember/fashion_mnist.ckpt'
end

-- mkdir -p of the folder that holds path.
pcall(ffi.cdef, 'int mkdir(const char *path, unsigned int mode);')
local function make_parent(path)
  local dir = path:match('^(.*)/[^/]*$')
  if not dir or dir == '' then return end
  local sofar = dir:sub(1, 1) == '/' and '' or '.'
  for part in dir:gmatch('[^/]+') do
    sofar = sofar .. '/' .. part
    ffi.C.mkdir(sofar, tonumber('755', 8))     -- fails harmlessly where it exists
  end
end

-- -- Options ---------------------------------------------------------------------------
local strategy = em.distribute.mirrored{}
local opt = { model = 'cnn', epochs = 5, batch = 128, lr = 1e-3, resume = false,
              checkpoint = default_checkpoint(), root = nil, limit = nil, seed = 1,
              shard = false, amp = false, ['channels-last'] = false, compile = false,
              workers = strategy.world_size > 1 and 1 or 2,
              -- a replica placed on a device (--devices) trains there
              device = strategy.device or 'cpu' }
do
  local i = 1
  while arg and arg[i] do
    local k = arg[i]:match('^%-%-(.+)$')
    if not k or opt[k] == nil and k ~= 'root' and k ~= 'limit' then
      error(('unknown argument %s (see the header of %s)'):format(arg[i], arg[0]), 0)
    end
    if k == 'resume' or k == 'channels-last' or k == 'compile' then opt[k] = true; i = i + 1
    else
      local v = arg[i + 1]
      if v == nil then error('--' .. k .. ' needs a value', 0) end
      opt[k] = tonumber(v) or v
      i = i + 2
    end
  end
  if opt.model ~= 'mlp' and opt.model ~= 'cnn' then error('--model must be mlp or cnn', 0) end
  if opt.shard and opt.shard ~= 'optimizer' and opt.shard ~= 'gradients' and
     opt.shard ~= 'parameters' then
    error('--shard must be optimizer, gradients or parameters', 0)
  end
  if opt.amp and opt.amp ~= 'bf16' and opt.amp ~= 'fp16' then
    error('--amp must be bf16 or fp16', 0)
  end
  if opt.amp and type(em.amp) ~= 'table' then error('--amp: this build has no em.amp', 0) end
  if opt['channels-last'] and opt.model ~= 'cnn' then
    error('--channels-last needs --model cnn (the MLP has no convolutions)', 0)
  end
  if opt.shard then opt.checkpoint = tostring(opt.checkpoint) .. '.d' end
  opt.checkpoint = tostring(opt.checkpoint)
  opt.device = tostring(opt.device)
  if opt.device ~= 'cpu' and not em.cuda.is_available() then
    error(('--device %s: %s'):format(opt.device, em.cuda.why_not()), 0)
  end
end
if strategy:is_main() then make_parent(opt.checkpoint) end
em.manual_seed(opt.seed)

-- -- Data ----------------------------------------------------------------------------------
-- The input pipeline of em.data: shuffled each epoch, batched, and u8 -> normalised
-- float32 (a whole batch at a time) in C worker threads, ahead of the step.
local T = em.data.T
local MEAN, STD = 0.2860, 0.3530
local norm = T.compose{ T.to_float(), T.normalize(MEAN, STD) }
local function split(name)
  local ds = em.data.fashion_mnist{ split = name, root = opt.root }
  if opt.limit then ds = ds:take(opt.limit) end
  return ds
end
local train = split('train')
-- every replica shuffles the same way (same seed) and takes its own shard
-- On a GPU the loader delivers batches there, through pinned memory.
local on_gpu = opt.device ~= 'cpu'
local function loader_options(o)
  if on_gpu then o.device, o.pin_memory = opt.device, true end
  return o
end
local train_loader = strategy:shard(train:shuffle()):batch(opt.batch):map(norm)
  :loader(loader_options{ workers = opt.workers })
local test_loader = (strategy:is_main() or opt.shard) and
  split('test'):batch(1000):map(norm):loader(loader_options{ workers = opt.workers,
                                                             progress = false })

-- -- Model -------------------------------------------------------------------------------------
local function build(kind)
  if kind == 'mlp' then
    return nn.Sequential(nn.Flatten(), nn.Linear(784, 512), nn.ReLU(), nn.Linear(512, 256),
                         nn.ReLU(), nn.Linear(256, 10))
  end
  return nn.Sequential(
    nn.Conv2d(1, 32, 3, { padding = 1 }), nn.ReLU(), nn.MaxPool2d(2),
    nn.Conv2d(32, 64, 3, { padding = 1 }), nn.ReLU(), nn.MaxPool2d(2),
    nn.Flatten(), nn.Linear(3136, 128), nn.ReLU(), nn.Linear(128, 10))
end
local model = build(opt.model):to(opt.device)
local channels_last = opt['channels-last']
if channels_last then model:to{ memory_format = 'channels_last' } end
-- replica 0's parameters everywhere; gradients averaged during backward (or
-- reduce-scattered, with --shard; the optimizer then updates this replica's share)
local dmodel = strategy:wrap(model, { shard = opt.shard or nil })
local optimizer = em.optim.Adam(dmodel:parameters(), { lr = opt.lr })
local first_epoch = 1
if opt.resume then        -- every replica reads the checkpoint
  local rest = em.checkpoint.load(opt.checkpoint, { model = dmodel, optimizer = optimizer })
  first_epoch = (rest.epoch or 0) + 1
  if strategy:is_main() then
    print(('resumed from %s after epoch %d'):format(opt.checkpoint, first_epoch - 1))
  end
end
if strategy:is_main() then
  print(model)
  if strategy.world_size > 1 then print(tostring(strategy)) end
end

-- -- Training and evaluation -------------------------------------------------------------------------
-- The forward pass as --amp and --channels-last ask: the batch converted once at the
-- model's entry, forward (and loss) under autocast.
local amp_dtype = opt.amp and ({ bf16 = 'bfloat16', fp16 = 'float16' })[opt.amp]
local function run(net, x, f)
  if channels_last then x = x:to_channels_last() end
  if amp_dtype then return em.amp.autocast(amp_dtype, function() return f(net(x)) end) end
  return f(net(x))
end
local function logits(out) return out end
-- float16's small range needs a scaled loss; bfloat16 has float32's range
local scaler = opt.amp == 'fp16' and em.amp.GradScaler{} or nil
-- (a sharded model's forward is a collective: every replica evaluates through it)
local evaluator = opt.shard and dmodel or model
local function evaluate()
  model:eval()
  local correct, total = 0, 0
  em.no_grad(function()
    for x, y in test_loader:epoch() do
      correct = correct + run(evaluator, x, logits):argmax(2):eq(y):sum():item()
      total = total + y:size(1)
    end
  end)
  model:train()
  return 100 * correct / total
end

-- One training step on a batch; returns the loss.
local function train_step(x, y)
  local loss = run(dmodel, x, function(out) return F.cross_entropy(out, y) end)
  optimizer:zero_grad()
  if scaler then          -- scaled backward; the step is skipped when gradients overflowed
    scaler:scale(loss):backward()
    scaler:step(optimizer)
    scaler:update()
  else
    loss:backward()
    optimizer:step()
  end
  return loss
end
local step = opt.compile and em.compile(train_step) or train_step

local accuracy
for epoch = first_epoch, opt.epochs do
  local loss_sum, batches = 0, 0
  train_loader:note('')
  for x, y in train_loader:epoch(epoch) do     -- the loader shows a progress bar
    local loss = step(x, y)
    batches = batches + 1
    loss_sum = loss_sum + loss:item()
    if batches % 20 == 0 then train_loader:note(('loss %.4f'):format(loss_sum / batches)) end
  end
  local st = train_loader:stats()
  -- all replicas together: mean loss, summed throughput, the worst data wait
  local mean_loss = strategy:allreduce(em.tensor({ loss_sum / batches }, { dtype = 'float64' }), 'mean')
  local speed = strategy:allreduce(em.tensor({ st.samples_per_s }, { dtype = 'float64' }))
  local wait = strategy:allreduce(em.tensor({ st.wait_fraction }, { dtype = 'float64' }), 'max')
  if opt.shard or strategy:is_main() then accuracy = evaluate() end
  if opt.compile and epoch == first_epoch and strategy:is_main() then
    print('compiled step: ' .. step:explain():gsub('\n', '\n  '))
  end
  if strategy:is_main() then
    print(('epoch %d/%d  loss %.4f  test %.2f%%  %d samples/s  (waited for data %.1f%%)'):format(
      epoch, opt.epochs, mean_loss:item(), accuracy, math.floor(speed:item()),
      100 * wait:item()))
  end
  if opt.shard or strategy:is_main() then   -- sharded: every replica writes its share
    em.checkpoint.save(opt.checkpoint, { model = opt.shard and dmodel or model,
      optimizer = optimizer, epoch = epoch })
  end
end
if opt.shard and not accuracy then accuracy = evaluate() end
if strategy:is_main() then
  accuracy = accuracy or evaluate()
  print(('test accuracy: %.2f%%'):format(accuracy))
end

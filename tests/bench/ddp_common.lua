--[[
ddp_common.lua -- the worker of the data-parallel benchmarks (bench_ddp_cnn,
bench_ddp_overlap): the Fashion-MNIST CNN of examples/fashion_mnist.lua
(train_common.lua's), Adam 1e-3, batch 128 per replica, trained wrapped by
em.distribute.mirrored on this replica's shard of the shuffled train set
(s:shard(ds:shuffle())), fed by a loader with no worker threads (workers = 0:
each batch is made in the replica's own thread; on 2 cores shared by 2 replicas
extra loader threads only compete for them, and PyTorch's DDP, too, runs fastest
here with num_workers=0).

  W.train{steps, warm, epochs, bucket_mb, first_bucket_mb}

times `steps` steps after `warm` (a barrier in between), or with `epochs` whole
epochs from the start, and prints from replica 0 (DATA lines, dist_common.lua):

  samples_s   global samples/s: all replicas' samples / the slower replica's seconds
  step_ms     ms per step
  comm_ms, overlap_ms, wait_ms   per step, from dm:comm_stats() (mean of replicas)
  overlap     overlap_ms / comm_ms: the share of the allreduce time that ran
              while backward was still computing
  buckets     the reducer's buckets
  accuracy    with epochs: test accuracy, evaluated on replica 0 only
]]
local dir = debug.getinfo(1, 'S').source:sub(2):match('(.*/)')
local D = dofile(dir .. 'dist_common.lua')
local TC = dofile(dir .. 'train_common.lua')
local em = D.B.em
local F, T = em.nn.F, em.data.T

local W = { BATCH = 128, MEAN = 0.2860, STD = 0.3530 }

-- Steps timed by default: EMBER_BENCH_DDP_STEPS, else 100 per replica.
W.STEPS = tonumber(os.getenv('EMBER_BENCH_DDP_STEPS') or '') or 100
W.WARM = 10

local function evaluate(model, norm)
  local test = em.data.fashion_mnist{ split = 'test' }:batch(1000):map(norm)
    :loader{ workers = 0, progress = false }
  model:eval()
  local correct, total = 0, 0
  em.no_grad(function()
    for x, y in test:epoch() do
      correct = correct + model(x):argmax(2):eq(y):sum():item()
      total = total + y:size(1)
    end
  end)
  model:train()
  test:close()
  return 100 * correct / total
end

function W.train(o)
  local s = em.distribute.mirrored{}
  em.manual_seed(1)         -- every replica shuffles the same way, takes its own shard
  local norm = T.compose{ T.to_float(), T.normalize(W.MEAN, W.STD) }
  local loader = s:shard(em.data.fashion_mnist{ split = 'train' }:shuffle()):batch(W.BATCH)
    :map(norm):loader{ workers = o.workers or 0, progress = false }
  local model = TC.model('cnn')
  local dm = s:wrap(model, { bucket_mb = o.bucket_mb, first_bucket_mb = o.first_bucket_mb })
  local opt = em.optim.Adam(dm:parameters(), { lr = 1e-3 })

  local warm = o.epochs and 0 or (o.warm or W.WARM)
  local total = o.epochs and o.epochs * loader:size() or warm + (o.steps or W.STEPS)
  local i, epoch, t0, c0 = 0, 0, nil, nil
  local function start()
    s:barrier()
    t0, c0 = em.clock(), dm:comm_stats()
  end
  if warm == 0 then start() end
  local function train(x, y)
    local loss = F.cross_entropy(dm(x), y)
    opt:zero_grad()
    loss:backward()
    opt:step()
    return loss
  end
  -- --compile 1: the step (its bucket allreduces included) through em.compile
  local step = o.compile and em.compile(train) or train
  while i < total do
    epoch = epoch + 1
    for x, y in loader:epoch(epoch) do
      step(x, y)
      i = i + 1
      if i == warm then start() end
      if i == total then break end
    end
  end
  local secs, c1 = em.clock() - t0, dm:comm_stats()
  loader:close()
  local steps = total - warm
  local slowest = s:allreduce(em.tensor({ secs }, { dtype = 'float64' }), 'max'):item()
  local comm = s:allreduce(em.tensor({ c1.comm_s - c0.comm_s, c1.overlap_s - c0.overlap_s,
                                       c1.wait_s - c0.wait_s }, { dtype = 'float64' }), 'mean')
    :totable()
  D.data(s, 'samples_s', s.world_size * steps * W.BATCH / slowest)
  D.data(s, 'step_ms', 1000 * slowest / steps)
  D.data(s, 'comm_ms', 1000 * comm[1] / steps)
  D.data(s, 'overlap_ms', 1000 * comm[2] / steps)
  D.data(s, 'wait_ms', 1000 * comm[3] / steps)
  D.data(s, 'overlap', comm[1] > 0 and comm[2] / comm[1] or 0)
  D.data(s, 'buckets', c1.buckets)
  if o.compile then D.data(s, 'replays', step:stats().replays) end
  if o.epochs and s:is_main() then D.data(s, 'accuracy', evaluate(model, norm)) end
end

-- The driver's options: [--steps N] [--epochs N] -> a list of worker arguments.
function W.driver_args()
  local a, i = {}, 1
  while arg and arg[i] do
    local k, v = arg[i]:match('^%-%-(%a+)$'), tonumber(arg[i + 1])
    if (k ~= 'steps' and k ~= 'epochs') or not v then
      error(('usage: ember %s [--steps N] [--epochs N]'):format(arg[0]), 0)
    end
    a[#a + 1], a[#a + 2] = '--' .. k, v
    i = i + 2
  end
  return a
end

W.D = D
-- The start of every data-parallel bench: a worker (started by the driver as one
-- replica) trains its share and gets nil; a driver gets its arguments, or nil
-- after a SKIP line when Fashion-MNIST is not installed.
function W.start(name)
  local w = D.worker_args()
  if w then W.train(w) return nil end
  local ok, err = pcall(em.data.fashion_mnist, { split = 'train' })
  if not ok then
    print('SKIP ' .. name .. ': ' .. tostring(err))
    return nil
  end
  return W.driver_args()
end

return W

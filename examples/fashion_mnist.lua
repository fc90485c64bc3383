-- fashion_mnist.lua -- trains an MLP or a small CNN on Fashion-MNIST (the files of
-- Debian's dataset-fashion-mnist package), with a progress bar, one line per epoch,
-- a checkpoint at the end and `test accuracy: NN.NN%` as the last line.
--
--   ember examples/fashion_mnist.lua [--model mlp|cnn] [--epochs 5] [--batch 128]
--                                    [--lr 1e-3] [--resume] [--checkpoint path]
--                                    [--root dir] [--limit n]
--
-- The recipe is the plain one of the benchmark (Adam 1e-3, batch 128), so that the
-- figures compare with PyTorch doing the same work.

local nn, F = em.nn, em.nn.F

-- -- Options ---------------------------------------------------------------------------
local opt = { model = 'cnn', epochs = 5, batch = 128, lr = 1e-3, resume = false,
              checkpoint = 'fashion_mnist.ckpt', root = nil, limit = nil, seed = 1 }
do
  local i = 1
  while arg and arg[i] do
    local k = arg[i]:match('^%-%-(.+)$')
    if not k or opt[k] == nil and k ~= 'root' and k ~= 'limit' then
      error(('unknown argument %s (see the header of %s)'):format(arg[i], arg[0]), 0)
    end
    if k == 'resume' then opt.resume = true; i = i + 1
    else
      local v = arg[i + 1]
      if v == nil then error('--' .. k .. ' needs a value', 0) end
      opt[k] = tonumber(v) or v
      i = i + 2
    end
  end
  if opt.model ~= 'mlp' and opt.model ~= 'cnn' then error('--model must be mlp or cnn', 0) end
end
em.manual_seed(opt.seed)

-- -- Data ----------------------------------------------------------------------------------
-- Whole splits in memory as normalised float32 (N, 1, 28, 28): 188 MB for train.
local MEAN, STD = 0.2860, 0.3530
local function load(split)
  local ds = em.data.fashion_mnist{ split = split, root = opt.root }
  local x, y = ds.images, ds.labels
  if opt.limit then x, y = x:narrow(1, 1, opt.limit), y:narrow(1, 1, opt.limit) end
  return (x:float() / 255 - MEAN) / STD, y
end
local train_x, train_y = load('train')
local test_x, test_y = load('test')
local ntrain = train_x:size(1)

-- A fresh permutation of 1..n each epoch (Fisher-Yates on the seeded stream).
local function permutation(n)
  local r = em.rand(n, { dtype = 'float64' }):totable()
  local p = {}
  for i = 1, n do p[i] = i end
  for i = n, 2, -1 do
    local j = math.floor(r[i] * i) + 1
    p[i], p[j] = p[j], p[i]
  end
  return em.tensor(p)
end

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
local model = build(opt.model)
local optimizer = em.optim.Adam(model:parameters(), { lr = opt.lr })
local first_epoch = 1
if opt.resume then
  local rest = em.checkpoint.load(opt.checkpoint, { model = model, optimizer = optimizer })
  first_epoch = (rest.epoch or 0) + 1
  print(('resumed from %s after epoch %d'):format(opt.checkpoint, first_epoch - 1))
end
print(model)

-- -- Progress ------------------------------------------------------------------------------------
local tty = os.getenv('TERM') and io.stdout.seek and os.execute('test -t 1') == 0
local last_line = 0
local function progress(epoch, done, total, loss, rate)
  if not tty then                     -- a log file gets a plain line every ~15k samples
    if done - last_line >= 15000 or done < last_line then
      last_line = done
      print(('epoch %d/%d  %d/%d  loss %.4f  %.0f samples/s'):format(epoch, opt.epochs, done,
        total, loss, rate))
    end
    return
  end
  local width = 30
  local fill = math.floor(width * done / total)
  io.stdout:write(('\repoch %d/%d [%s%s] %5d/%d  loss %.4f  %6.0f samples/s '):format(epoch,
    opt.epochs, ('='):rep(fill), (' '):rep(width - fill), done, total, loss, rate))
  io.stdout:flush()
end

-- -- Training and evaluation -------------------------------------------------------------------------
local function evaluate()
  model:eval()
  local correct = 0
  em.no_grad(function()
    for s = 1, test_x:size(1), 1000 do
      local n = math.min(1000, test_x:size(1) - s + 1)
      local pred = model(test_x:narrow(1, s, n)):argmax(2)
      correct = correct + pred:eq(test_y:narrow(1, s, n)):sum():item()
    end
  end)
  model:train()
  return 100 * correct / test_x:size(1)
end

local accuracy
for epoch = first_epoch, opt.epochs do
  local order = permutation(ntrain)
  local t0, seen, loss_sum, batches = em.clock(), 0, 0, 0
  for s = 1, ntrain, opt.batch do
    local n = math.min(opt.batch, ntrain - s + 1)
    local idx = order:narrow(1, s, n)
    local x, y = train_x:index_select(1, idx), train_y:index_select(1, idx)
    local loss = F.cross_entropy(model(x), y)
    optimizer:zero_grad()
    loss:backward()
    optimizer:step()
    seen, batches = seen + n, batches + 1
    loss_sum = loss_sum + loss:item()
    if batches % 20 == 0 then
      progress(epoch, seen, ntrain, loss_sum / batches, seen / math.max(em.clock() - t0, 1e-9))
    end
  end
  local elapsed = em.clock() - t0
  accuracy = evaluate()
  if tty then io.stdout:write('\r' .. (' '):rep(90) .. '\r') end
  print(('epoch %d/%d  loss %.4f  test %.2f%%  %d samples/s'):format(epoch, opt.epochs,
    loss_sum / batches, accuracy, math.floor(seen / elapsed)))
  em.checkpoint.save(opt.checkpoint, { model = model, optimizer = optimizer, epoch = epoch })
end
accuracy = accuracy or evaluate()
print(('test accuracy: %.2f%%'):format(accuracy))

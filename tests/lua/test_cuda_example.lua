--[[
test_cuda_example.lua -- examples/fashion_mnist.lua trains on emulated GPUs: with
--device cuda it reaches the CPU's loss and accuracy on the same slice of the
data (same seed, same shuffle: only the order of float sums differs), and with
two GPU replicas (--replicas 2 --devices cuda:0,cuda:1) it trains, only replica 0
evaluates, and its loss is that of one replica on the global batch, within the
tolerance of averaged float32 gradients.
]]
local dir = (arg and arg[0] and arg[0]:match('^(.*/)')) or
            ((os.getenv('EMBER_TESTS') or 'tests') .. '/lua/')
local H = dofile(dir .. 'harness.lua')
local ember = arg[-1] or 'ember'

local function fashion_mnist_here()
  local f = io.open('/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz') or
    io.open((os.getenv('EMBER_DATA') or '/nonexistent') .. '/train-images-idx3-ubyte.gz')
  if f then f:close() return true end
end

local example = dir .. '../../examples/fashion_mnist.lua'
local function run(env, prefix, extra)
  local ckpt = os.tmpname()
  local cmd = ('%s %s %s %s --epochs 1 --limit 512 --batch 64 --workers 1 --checkpoint %s%s ' ..
               '2>&1; echo "exit=$?"'):format(env, ember, prefix, example, ckpt, extra or '')
  local p = io.popen(cmd)
  local out = p:read('*a')
  p:close()
  os.remove(ckpt)
  return out, tonumber(out:match('exit=(%d+)%s*$'))
end

local function figures(out)
  return tonumber(out:match('epoch 1/1%s+loss (%d+%.%d+)')),
         tonumber(out:match('test accuracy: (%d+%.%d+)%%'))
end

H.test('--device cuda reaches the CPU loss on the same data', function()
  if not fashion_mnist_here() then H.skip('Fashion-MNIST not installed (make deps-run)') return end
  local out_cpu, rc = run('', '', '')
  H.eq(rc, 0, out_cpu)
  local out_gpu
  out_gpu, rc = run('EMBER_CUDA_EMULATE=1:512', '', ' --device cuda')
  H.eq(rc, 0, out_gpu)
  local loss_c, acc_c = figures(out_cpu)
  local loss_g, acc_g = figures(out_gpu)
  H.check(loss_c and loss_g, 'both print a loss:\n' .. out_cpu .. out_gpu)
  H.close(loss_g, loss_c, 2e-3, 'the mean training loss')
  H.check(math.abs(acc_g - acc_c) <= 1.0, ('test accuracy %.2f%% vs %.2f%% on the CPU')
          :format(acc_g, acc_c))
  H.raises(function()
    local o, r = run('', '', ' --device cuda')        -- no GPU and no emulation here
    if r ~= 0 then error(o) end
  end, '--device cuda', 'EMBER_CUDA_EMULATE')
end)

H.test('two GPU replicas: --replicas 2 --devices cuda:0,cuda:1', function()
  if not fashion_mnist_here() then H.skip('Fashion-MNIST not installed (make deps-run)') return end
  local out, rc = run('EMBER_CUDA_EMULATE=2:512', '--replicas 2 --devices cuda:0,cuda:1', '')
  H.eq(rc, 0, out)
  H.eq(select(2, out:gsub('test accuracy:', '')), 1, 'only replica 0 evaluates')
  local loss = figures(out)
  H.check(loss and loss > 0 and loss < 2.3, 'it learns: ' .. tostring(loss))
end)

H.done()

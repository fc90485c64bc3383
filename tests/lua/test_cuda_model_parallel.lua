--[[
test_cuda_model_parallel.lua -- model parallelism by hand on two emulated GPUs
(EMBER_CUDA_EMULATE=2:64): a model whose blocks are placed with m.block:to('cuda:1')
and whose forward moves the activation between them. Each device holds only its
own blocks' weights (and, after a step, their gradients and optimizer state) --
also when the whole model went to cuda:0 first and a block moved on, whose old
copy the move hands back at once; autograd carries the activation's gradient
back across devices; training equals the same model on one device and on the
CPU; and an activation left on the wrong device is an error naming both.
]]
local dir = (arg and arg[0] and arg[0]:match('^(.*/)')) or
            ((os.getenv('EMBER_TESTS') or 'tests') .. '/lua/')
local H, em = dofile(dir .. 'cuda_emulated.lua')('2:64')
local nn, F = em.nn, em.nn.F
-- (on a real machine with one GPU: skipped, saying so)
if not H.two_devices() then H.done() return end

-- Two blocks; the forward hands the first's output to the second's device (a
-- no-op when both are on one device).
local Two = nn.Module:extend('Two')
function Two:init(width)
  self.a = nn.Sequential { nn.Linear(16, width), nn.ReLU(), nn.Linear(width, width), nn.Tanh() }
  self.b = nn.Sequential { nn.Linear(width, width), nn.ReLU(), nn.Linear(width, 4) }
end
function Two:forward(x)
  local h = self.a(x)
  return self.b(h:to(self.b[1].weight.device))
end

local function build(seed)
  em.manual_seed(seed or 7)
  return Two(48)
end

-- Built on the CPU, then block a on cuda:0 and block b on cuda:1.
local function placed()
  local m = build()
  m.a:to('cuda:0')
  m.b:to('cuda:1')
  return m
end

-- The device bytes of m's weights: each a block of the caching allocator, in
-- 512-byte steps (as CUDA's)
local function bytes(m)
  local n = 0
  for _, p in ipairs(m:parameters()) do n = n + math.ceil(p:numel() * p:element_size() / 512) * 512 end
  return n
end

local function allocated(dev)
  em.collect()
  return em.memory_stats(dev).allocated
end

H.test('placed by hand, each device holds only its own blocks', function()
  local z0, z1 = allocated('cuda:0'), allocated('cuda:1')
  -- from the CPU, one block per device
  local m = placed()
  local A, B = bytes(m.a), bytes(m.b)
  H.eq(em.memory_stats('cuda:0').allocated - z0, A, 'cuda:0 holds block a (bytes)')
  H.eq(em.memory_stats('cuda:1').allocated - z1, B, 'cuda:1 holds block b (bytes)')
  m = nil
  H.eq({ allocated('cuda:0') - z0, allocated('cuda:1') - z1 }, { 0, 0 }, 'dropped: all back')

  -- the whole model to cuda:0, then one block on: its copy on cuda:0 goes at
  -- once, not when the collector next runs
  m = build()
  m:to('cuda:0')
  H.eq(em.memory_stats('cuda:0').allocated - z0, A + B, 'whole model on cuda:0')
  m.b:to('cuda:1')
  H.eq(em.memory_stats('cuda:0').allocated - z0, A, 'cuda:0 after moving b: only a')
  H.eq(em.memory_stats('cuda:1').allocated - z1, B, 'cuda:1 after moving b: b')
  for _, p in ipairs(m.b:parameters()) do H.eq(p.device, 'cuda:1', 'b\'s parameters') end
  for _, p in ipairs(m.a:parameters()) do H.eq(p.device, 'cuda:0', 'a\'s parameters') end
end)

-- Steps of Adam on a fixed batch; returns the losses, the final weights (CPU)
-- and the optimizer.
local function train(m, dev_in, steps)
  local opt = em.optim.Adam(m:parameters(), { lr = 1e-2 })
  em.manual_seed(3)
  local x = em.randn(12, 32):t()           -- strided: a transposed view
  x = x:narrow(1, 1, 16):t()                -- 12 x 16, not contiguous
  local y = em.randn(1, 4):expand(12, 4)    -- broadcast target
  local losses = {}
  for s = 1, steps do
    opt:zero_grad()
    local out = m(x:to(dev_in))
    local loss = F.mse_loss(out, y:to(out.device))
    loss:backward()
    opt:step()
    losses[s] = H.num(loss:cpu())
  end
  local w = {}
  for _, p in ipairs(m:parameters()) do w[#w + 1] = p:detach():cpu() end
  return losses, w, opt
end

H.test('training across two devices equals one device and the CPU', function()
  local z0, z1 = allocated('cuda:0'), allocated('cuda:1')
  local split = placed()
  local A, B = bytes(split.a), bytes(split.b)
  local ls, ws, opt = train(split, 'cuda:0', 5)

  -- gradients stay with their weights; Adam's state too: per device its
  -- blocks' weights, gradients and two moments, nothing more
  for _, p in ipairs(split.a:parameters()) do H.eq(p.grad.device, 'cuda:0', 'a\'s gradients') end
  for _, p in ipairs(split.b:parameters()) do H.eq(p.grad.device, 'cuda:1', 'b\'s gradients') end
  H.eq(allocated('cuda:0') - z0, 4 * A, 'cuda:0: a\'s weights, gradients, state')
  H.eq(allocated('cuda:1') - z1, 4 * B, 'cuda:1: b\'s weights, gradients, state')
  H.check(opt ~= nil, 'the optimizer (and so its state) is held while measuring')

  local l1, w1 = train(build():to('cuda:0'), 'cuda:0', 5)
  local lc, wc = train(build(), 'cpu', 5)
  H.close(ls, l1, 1e-6, 'losses: split vs one device')
  H.close(ls, lc, 1e-5, 'losses: split vs CPU')
  H.check(ls[5] < ls[1], ('the loss falls: %g -> %g'):format(ls[1], ls[5]))
  for k = 1, #ws do
    H.check(H.maxrel(ws[k], w1[k]) < 1e-6, 'weights ' .. k .. ': split vs one device')
    H.check(H.maxrel(ws[k], wc[k]) < 1e-5, 'weights ' .. k .. ': split vs CPU')
  end
end)

H.test('an activation on the wrong device is an error naming both', function()
  local m = placed()
  local x = em.randn(2, 16):to('cuda:0')
  local h = m.a(x)
  H.raises(function() return m.b(h) end, 'cuda:0', 'cuda:1')
  H.raises(function() return m.a(x:to('cuda:1')) end, 'cuda:0', 'cuda:1')
  -- and nothing broke: the right call still runs
  H.eq(m(x).shape, { 2, 4 }, 'the placed model still runs')
end)

H.done()

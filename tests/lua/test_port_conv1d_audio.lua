--[[
test_port_conv1d_audio.lua -- a 1-D convolutional audio classifier ported from
PyTorch (tests/fixtures/gen_ports.py): three Conv1d + GroupNorm + ReLU blocks in a
ModuleList, an asymmetric F.pad before the unpadded strided conv, a global average
over time, Linear, cross_entropy, SGD with momentum and ReduceLROnPlateau fed the
loss. From PyTorch's initial state_dict, loaded by name, five steps give PyTorch's
loss and learning rate at every step (the plateau halves it three times) and its
final parameters, in float32. The first step's loss and gradients on (emulated)
CUDA equal the CPU's.
]]
local dir = (arg and arg[0] and arg[0]:match('^(.*/)')) or
            ((os.getenv('EMBER_TESTS') or 'tests') .. '/lua/')
local H, em = dofile(dir .. 'cuda_emulated.lua')('1:64')
local P = dofile(dir .. 'port_common.lua')(H, em)
local nn, F = em.nn, em.nn.F
local fx = dofile(dir .. '../fixtures/ports_conv1d_audio.lua')

local ConvBlock = nn.Module:extend('ConvBlock')
function ConvBlock:init(cin, cout, k, stride, padding, groups)
  self.conv = nn.Conv1d(cin, cout, k, { stride = stride, padding = padding })
  self.norm = nn.GroupNorm(groups, cout)
end
function ConvBlock:forward(x) return F.relu(self.norm(self.conv(x))) end

local AudioNet = nn.Module:extend('AudioNet')
function AudioNet:init(classes)
  self.blocks = nn.ModuleList({ ConvBlock(1, 8, 5, 2, 2, 2),
                                ConvBlock(8, 12, 3, 2, 0, 4),
                                ConvBlock(12, 16, 3, 1, 1, 4) })
  self.head = nn.Linear(16, classes)
end

function AudioNet:forward(wave)
  local x = self.blocks[1](wave)
  -- Asymmetric padding before the unpadded strided conv, as "same" padding for an
  -- even length needs.
  x = self.blocks[2](F.pad(x, { 1, 2 }))
  x = self.blocks[3](x)
  return self.head(x:mean(3))
end

local function build(device)
  local model = AudioNet(fx.classes)
  model:load_state_dict(P.state(fx.state))
  if device then model:to(device) end
  return model
end

local function step_loss(model, i, device)
  return F.cross_entropy(model(P.tensor(fx.inputs[i], 'float32', device)),
                         P.tensor(fx.targets[i], 'int64', device))
end

H.test('five SGD steps with ReduceLROnPlateau give PyTorch\'s losses, rates, parameters', function()
  local model = build()
  local opt = em.optim.SGD(model:parameters(), { lr = fx.opt.lr, momentum = fx.opt.momentum })
  local sched = em.optim.ReduceLROnPlateau(opt, fx.plateau)
  local losses, lrs = {}, {}
  for i = 1, #fx.inputs do
    lrs[i] = opt.param_groups[1].lr
    local loss = step_loss(model, i)
    opt:zero_grad()
    loss:backward()
    opt:step()
    sched:step(loss:item())
    losses[i] = loss:item()
  end
  lrs[#lrs + 1] = opt.param_groups[1].lr
  P.check_losses(losses, fx.losses, 2e-6, 'loss')
  H.close(lrs, fx.lrs, 1e-12, 'the learning rate before each step and after the last')
  P.check_final(model, fx.final, 1e-6)
end)

H.test('a strided (transposed) input gives the same first loss', function()
  local model = build()
  local x = P.tensor(fx.inputs[1])
  -- The same values seen through a view whose batch dim is the innermost.
  local strided = x:transpose(1, 3):contiguous():transpose(1, 3)
  H.check(not strided:is_contiguous(), 'the input is a strided view')
  local loss = F.cross_entropy(model(strided), P.tensor(fx.targets[1], 'int64'))
  P.check_losses({ loss:item() }, { fx.losses[1] }, 2e-6, 'strided loss')
end)

H.test('the first step on cuda equals the CPU\'s', function()
  local cpu, gpu = build(), build('cuda')
  local a, b = step_loss(cpu, 1), step_loss(gpu, 1, 'cuda')
  P.check_losses({ b:item() }, { fx.losses[1] }, 2e-6, 'cuda loss')
  a:backward()
  b:backward()
  local grads = {}
  for _, np in ipairs(gpu:named_parameters()) do grads[np[1]] = np[2].grad end
  local worst = 0
  for _, np in ipairs(cpu:named_parameters()) do
    worst = math.max(worst, H.maxrel(grads[np[1]]:cpu(), np[2].grad))
  end
  H.check(worst < 1e-4, 'cuda gradients equal the CPU\'s: ' .. worst)
end)

H.done()

--[[
test_port_lstm_classifier.lua -- a text classifier ported from PyTorch
(tests/fixtures/gen_ports.py): Embedding -> 2-layer bidirectional LSTM
(batch_first) -> Linear on the last layer's final states of both directions,
cross_entropy with label_smoothing 0.1, Adam. From PyTorch's initial state_dict,
loaded by name, five steps give PyTorch's loss at every step and its final
parameters, in float32; a transposed view of the ids gives the same first loss.
The first step's loss and gradients on (emulated) CUDA equal the CPU's.
]]
local dir = (arg and arg[0] and arg[0]:match('^(.*/)')) or
            ((os.getenv('EMBER_TESTS') or 'tests') .. '/lua/')
local H, em = dofile(dir .. 'cuda_emulated.lua')('1:64')
local P = dofile(dir .. 'port_common.lua')(H, em)
local nn, F = em.nn, em.nn.F
local fx = dofile(dir .. '../fixtures/ports_lstm_classifier.lua')

local TextClassifier = nn.Module:extend('TextClassifier')
function TextClassifier:init(cfg)
  self.embedding = nn.Embedding(cfg.vocab, cfg.embed)
  self.lstm = nn.LSTM(cfg.embed, cfg.hidden, { num_layers = 2, bidirectional = true, batch_first = true })
  self.fc = nn.Linear(2 * cfg.hidden, cfg.classes)
end

function TextClassifier:forward(tokens)
  local _, states = self.lstm(self.embedding(tokens))
  local h_n = states[1]
  -- h_n[-2], h_n[-1]: the last layer's forward and backward directions.
  local L = h_n:size(1)
  return self.fc(em.cat({ h_n:select(1, L - 1), h_n:select(1, L) }, 2))
end

local function build(device)
  local model = TextClassifier(fx.config)
  model:load_state_dict(P.state(fx.state))
  if device then model:to(device) end
  return model
end

local function step_loss(model, i, device)
  local logits = model(P.tensor(fx.inputs[i], 'int64', device))
  return F.cross_entropy(logits, P.tensor(fx.targets[i], 'int64', device),
                         { label_smoothing = fx.label_smoothing })
end

H.test('five Adam steps give PyTorch\'s losses and final parameters', function()
  local model = build()
  H.eq(#model:parameters(), 3 + 2 * 2 * 4, 'embedding, fc and 4 tensors per layer and direction')
  local opt = em.optim.Adam(model:parameters(), { lr = fx.opt.lr, betas = fx.opt.betas, eps = fx.opt.eps })
  local losses = {}
  for i = 1, #fx.inputs do
    local loss = step_loss(model, i)
    opt:zero_grad()
    loss:backward()
    opt:step()
    losses[i] = loss:item()
  end
  P.check_losses(losses, fx.losses, 2e-6, 'loss')
  P.check_final(model, fx.final, 1e-6)
end)

H.test('strided (transposed) token ids give the same first loss', function()
  local model = build()
  local tokens = P.tensor(fx.inputs[1], 'int64')
  local strided = tokens:t():contiguous():t()
  H.check(not strided:is_contiguous(), 'the ids are a transposed view')
  local loss = F.cross_entropy(model(strided), P.tensor(fx.targets[1], 'int64'),
                               { label_smoothing = fx.label_smoothing })
  P.check_losses({ loss:item() }, { fx.losses[1] }, 2e-6, 'strided loss')
end)

H.test('the first step on cuda equals the CPU\'s', function()
  local cpu, gpu = build(), build('cuda')
  local a, b = step_loss(cpu, 1), step_loss(gpu, 1, 'cuda')
  P.check_losses({ b:item() }, { fx.losses[1] }, 2e-6, 'cuda loss')
  a:backward()
  b:backward()
  local worst = 0
  for _, np in ipairs(cpu:named_parameters()) do
    local g = gpu:named_parameters()
    for _, q in ipairs(g) do
      if q[1] == np[1] then worst = math.max(worst, H.maxrel(q[2].grad:cpu(), np[2].grad)) end
    end
  end
  H.check(worst < 1e-4, 'cuda gradients equal the CPU\'s: ' .. worst)
end)

H.done()

--[[
test_port_nanogpt.lua -- a nanoGPT-style character model ported from PyTorch
(tests/fixtures/gen_ports.py): token and position embeddings, a ModuleList of
blocks (LayerNorm, causal self-attention, a GELU MLP), AdamW with two parameter
groups, a linear warm-up then cosine decay (SequentialLR), clip_grad_norm. From
PyTorch's initial state_dict, loaded by name, five steps give PyTorch's loss,
learning rate and gradient norm at every step and its final parameters, in float32;
once with scaled_dot_product_attention's causal option and once with an explicit
tril / masked_fill mask. The first step's loss on (emulated) CUDA equals the CPU's.
Sampling with em.multinomial is reproducible under em.manual_seed and gives valid
1-based ids (its random stream is not PyTorch's, so the ids themselves are not
compared).
]]
local dir = (arg and arg[0] and arg[0]:match('^(.*/)')) or
            ((os.getenv('EMBER_TESTS') or 'tests') .. '/lua/')
local H, em = dofile(dir .. 'cuda_emulated.lua')('1:64')
local P = dofile(dir .. 'port_common.lua')(H, em)
local nn, F = em.nn, em.nn.F
local fx = dofile(dir .. '../fixtures/ports_nanogpt.lua')

-- -- The model, as PyTorch's nanoGPT writes it ----------------------------------------------
local SelfAttention = nn.Module:extend('SelfAttention')
function SelfAttention:init(n_embd, n_head, explicit_mask)
  self.n_head = n_head
  self.c_attn = nn.Linear(n_embd, 3 * n_embd)
  self.c_proj = nn.Linear(n_embd, n_embd)
  self.explicit_mask = explicit_mask
end

function SelfAttention:forward(x)
  local B, T, C = x.shape[1], x.shape[2], x.shape[3]
  local qkv = self.c_attn(x):split(C, 3)
  local hs = C / self.n_head
  local function heads(t) return t:reshape(B, T, self.n_head, hs):transpose(2, 3) end
  local q, k, v = heads(qkv[1]), heads(qkv[2]), heads(qkv[3])
  local y
  if self.explicit_mask then
    local att = em.matmul(q, k:transpose(-2, -1)) * (1 / math.sqrt(hs))
    local future = em.ones({ T, T }, { device = x.device }):tril():eq(0)
    att = att:masked_fill(future, -math.huge)
    y = em.matmul(att:softmax(-1), v)
  else
    y = F.scaled_dot_product_attention(q, k, v, { causal = true })
  end
  return self.c_proj(y:transpose(2, 3):contiguous():view(B, T, C))
end

local MLP = nn.Module:extend('MLP')
function MLP:init(n_embd)
  self.c_fc = nn.Linear(n_embd, 4 * n_embd)
  self.gelu = nn.GELU()
  self.c_proj = nn.Linear(4 * n_embd, n_embd)
end
function MLP:forward(x) return self.c_proj(self.gelu(self.c_fc(x))) end

local Block = nn.Module:extend('Block')
function Block:init(n_embd, n_head, explicit_mask)
  self.ln_1 = nn.LayerNorm(n_embd)
  self.attn = SelfAttention(n_embd, n_head, explicit_mask)
  self.ln_2 = nn.LayerNorm(n_embd)
  self.mlp = MLP(n_embd)
end
function Block:forward(x)
  x = x + self.attn(self.ln_1(x))
  return x + self.mlp(self.ln_2(x))
end

local GPT = nn.Module:extend('GPT')
function GPT:init(cfg, explicit_mask)
  self.wte = nn.Embedding(cfg.vocab, cfg.n_embd)
  self.wpe = nn.Embedding(cfg.block_size, cfg.n_embd)
  local blocks = {}
  for i = 1, cfg.n_layer do blocks[i] = Block(cfg.n_embd, cfg.n_head, explicit_mask) end
  self.h = nn.ModuleList(blocks)
  self.ln_f = nn.LayerNorm(cfg.n_embd)
  self.lm_head = nn.Linear(cfg.n_embd, cfg.vocab, false)
end

-- logits, and the mean cross-entropy when targets are given.
function GPT:forward(idx, targets)
  local T = idx.shape[2]
  local pos = em.arange(1, T + 1, { dtype = 'int64' }):to(idx.device)
  local x = self.wte(idx) + self.wpe(pos)
  for _, block in ipairs(self.h) do x = block(x) end
  local logits = self.lm_head(self.ln_f(x))
  if not targets then return logits end
  return logits, F.cross_entropy(logits:view(-1, logits.shape[3]), targets:view(-1))
end

-- -- Training as the PyTorch script trains ----------------------------------------------------
local function build(explicit_mask, device)
  local model = GPT(fx.config, explicit_mask)
  model:load_state_dict(P.state(fx.state))
  if device then model:to(device) end
  return model
end

local function ids(list, i, device) return P.tensor(list[i], 'int64', device) end

local function train(explicit_mask)
  local model = build(explicit_mask)
  local decay, nodecay = {}, {}
  for _, p in ipairs(model:parameters()) do
    local list = p:dim() >= 2 and decay or nodecay
    list[#list + 1] = p
  end
  local o = fx.opt
  local opt = em.optim.AdamW({ { params = decay, weight_decay = o.weight_decay },
                               { params = nodecay, weight_decay = 0 } },
                             { lr = o.lr, betas = o.betas, eps = o.eps })
  local warm = em.optim.LinearLR(opt, fx.warmup)
  local cos = em.optim.CosineAnnealingLR(opt, fx.cosine)
  local sched = em.optim.SequentialLR(opt, { schedulers = { warm, cos }, milestones = fx.milestones })
  local losses, lrs, norms = {}, {}, {}
  for i = 1, #fx.inputs do
    lrs[i] = opt.param_groups[1].lr
    local _, loss = model(ids(fx.inputs, i), ids(fx.targets, i))
    opt:zero_grad()
    loss:backward()
    norms[i] = em.nn.utils.clip_grad_norm(model:parameters(), fx.max_norm)
    opt:step()
    sched:step()
    losses[i] = loss:item()
  end
  return model, losses, lrs, norms
end

for _, variant in ipairs({ 'causal', 'masked' }) do
  local want = fx[variant]
  H.test(variant .. ' attention: five AdamW steps give PyTorch\'s losses and parameters', function()
    local model, losses, lrs, norms = train(variant == 'masked')
    P.check_losses(losses, want.losses, 2e-6, variant .. ' loss')
    H.close(lrs, want.lrs, 1e-12, variant .. ': the warm-up then cosine learning rates')
    P.check_losses(norms, want.norms, 1e-5, variant .. ' clip_grad_norm')
    -- The key projection's bias gets no gradient (softmax ignores a score added to
    -- every key of a query), only rounding noise, which Adam scales up to steps of
    -- about lr: those elements are held to the sum of the rates, the rest of the
    -- bias to float32's rounding.
    local skip, sd, C, moved = {}, model:state_dict(), fx.config.n_embd, 0
    for b = 0, fx.config.n_layer - 1 do skip[('h.%d.attn.c_attn.bias'):format(b)] = true end
    P.check_final(model, want.final, 1e-6, variant, skip)
    for name in pairs(skip) do
      local got, fxb = sd[P.ember_name(name)], want.final[name]
      local q, v = P.maxdiff(got:narrow(1, 1, C), fxb, 1, C),
                   P.maxdiff(got:narrow(1, 2 * C + 1, C), fxb, 2 * C + 1, 3 * C)
      H.check(q < 1e-6 and v < 1e-6, ('%s: query and value biases differ by %g, %g'):format(name, q, v))
      moved = math.max(moved, P.maxdiff(got:narrow(1, C + 1, C), fxb, C + 1, 2 * C))
    end
    local budget = 0
    for _, lr in ipairs(want.lrs) do budget = budget + lr end
    H.check(moved < budget,
      ('%s: key biases differ by %g, over the rates\' sum %g'):format(variant, moved, budget))
  end)
end

H.test('the key projection\'s bias gets a zero gradient, as in exact arithmetic', function()
  local model = build(false)
  local _, loss = model(ids(fx.inputs, 1), ids(fx.targets, 1))
  loss:backward()
  local C = fx.config.n_embd
  for _, block in ipairs(model.h) do
    local g = block.attn.c_attn.bias.grad
    local qg, kg = g:narrow(1, 1, C):abs():max():item(), g:narrow(1, C + 1, C):abs():max():item()
    H.check(kg < 1e-6 * qg, ('key bias gradient %g against the query bias\'s %g'):format(kg, qg))
  end
end)

H.test('the first step\'s loss on cuda equals the CPU\'s', function()
  for _, explicit in ipairs({ false, true }) do
    local what = explicit and 'masked' or 'causal'
    local model = build(explicit, 'cuda')
    local _, loss = model(ids(fx.inputs, 1, 'cuda'), ids(fx.targets, 1, 'cuda'))
    H.check(loss.device == 'cuda' or tostring(loss.device):find('cuda'), what .. ': the loss is on cuda')
    loss:backward()
    local norm = em.nn.utils.clip_grad_norm(model:parameters(), fx.max_norm)
    P.check_losses({ loss:item() }, { fx[what].losses[1] }, 2e-6, what .. ' cuda loss')
    P.check_losses({ norm }, { fx[what].norms[1] }, 1e-5, what .. ' cuda gradient norm')
  end
end)

H.test('sampling with em.multinomial: reproducible under manual_seed, valid ids', function()
  local model = build(false)
  local V, block = fx.config.vocab, fx.config.block_size
  local function sample(seed, n)
    em.manual_seed(seed)
    local idx = ids(fx.inputs, 1):narrow(2, 1, 2)
    em.no_grad(function()
      for _ = 1, n do
        local ctx = idx:size(2) > block and idx:narrow(2, idx:size(2) - block + 1, block) or idx
        local logits = model(ctx)
        local probs = logits:select(2, ctx:size(2)):softmax(-1)
        idx = em.cat({ idx, em.multinomial(probs, 1) }, 2)
      end
    end)
    return idx
  end
  local a, b, c = sample(5, 12), sample(5, 12), sample(6, 12)
  H.eq(a.shape, { fx.batch, 14 }, 'the prompt plus twelve tokens')
  H.eq(a.dtype, 'int64', 'the ids\' dtype')
  H.eq(a:totable(), b:totable(), 'the same seed samples the same text')
  local flat, differs = H.flat(a), false
  local ok = true
  for _, id in ipairs(flat) do ok = ok and id >= 1 and id <= V and id % 1 == 0 end
  H.check(ok, 'every sampled id is a 1-based class index in 1..' .. V)
  for i, id in ipairs(H.flat(c)) do differs = differs or id ~= flat[i] end
  H.check(differs, 'another seed samples other text')
  -- The sampled ids index the model's alphabet.
  local row = {}
  for j = 1, a:size(2) do
    local id = flat[j]
    row[j] = fx.chars:sub(id, id)
  end
  H.check(#table.concat(row) == a:size(2), 'the ids decode to characters')
end)

H.done()

-- gpt.lua -- trains a small GPT-style decoder (examples/gpt_model.lua) on the
-- characters of a text file, then writes a sample of what it learnt.
--
--   ember examples/gpt.lua [--layers 2] [--dim 64] [--heads 4] [--context 64]
--                          [--batch 16] [--steps 500] [--lr 3e-3] [--every 100]
--                          [--file /usr/share/common-licenses/GPL-3] [--seed 1]
--                          [--sample 200] [--prompt 'The '] [--temperature 0.8]
--                          [--device cpu|cuda|cuda:N]
--                          [--shard optimizer|gradients|parameters]
--
-- Tokens are the file's bytes: the vocabulary is the set of bytes it holds (the
-- GPL's 35 kB of English make about 80). Each step draws --batch windows of
-- --context + 1 bytes at random offsets; the model predicts every next byte, the
-- loss is the mean cross-entropy (ln of the vocabulary size at the start, ~4.4).
-- It prints `step N/STEPS  loss X.XXXX` at step 1, every --every steps and at the
-- last, then --sample bytes continuing --prompt: drawn from softmax(logits /
-- temperature) with em's generator, or the most likely byte at --temperature 0.
-- Everything -- weights, windows, sample -- follows from --seed.
--
-- The same script runs data-parallel, unchanged (em.distribute.mirrored):
--   ember --replicas 2 examples/gpt.lua                    2 replicas, threads
--   ember --replicas 2 examples/gpt.lua --shard parameters ZeRO 3: each replica
--                                                          keeps 1/2 of the state
-- Every replica draws the same global batch of world_size x --batch windows and
-- trains on its own --batch of them, so N replicas at --batch b print the losses
-- of one replica at --batch N*b (to float tolerance). The loss printed is the
-- mean over the replicas.

local nn, F = em.nn, em.nn.F

-- -- Options ---------------------------------------------------------------------------
local strategy = em.distribute.mirrored{}
local opt = { layers = 2, dim = 64, heads = 4, context = 64, batch = 16, steps = 500,
              lr = 3e-3, every = 100, file = '/usr/share/common-licenses/GPL-3', seed = 1,
              sample = 200, prompt = 'The ', temperature = 0.8, shard = false,
              device = strategy.device or 'cpu' }
do
  local i = 1
  while arg and arg[i] do
    local k = arg[i]:match('^%-%-(.+)$')
    if not k or opt[k] == nil then
      error(('unknown argument %s (see the header of %s)'):format(arg[i], arg[0]), 0)
    end
    local v = arg[i + 1]
    if v == nil then error('--' .. k .. ' needs a value', 0) end
    if type(opt[k]) == 'number' then
      opt[k] = tonumber(v) or error(('--%s needs a number, got %s'):format(k, v), 0)
    else
      opt[k] = v
    end
    i = i + 2
  end
  for _, k in ipairs({ 'layers', 'dim', 'heads', 'context', 'batch', 'steps', 'every', 'sample' }) do
    if opt[k] < (k == 'sample' and 0 or 1) or opt[k] % 1 ~= 0 then
      error(('--%s must be a positive integer, got %s'):format(k, tostring(opt[k])), 0)
    end
  end
  if opt.dim % opt.heads ~= 0 then
    error(('--dim %d must be a multiple of --heads %d'):format(opt.dim, opt.heads), 0)
  end
  if opt.temperature < 0 then error('--temperature must be >= 0', 0) end
  if opt.shard and opt.shard ~= 'optimizer' and opt.shard ~= 'gradients' and
     opt.shard ~= 'parameters' then
    error('--shard must be optimizer, gradients or parameters', 0)
  end
  opt.device, opt.file, opt.prompt = tostring(opt.device), tostring(opt.file), tostring(opt.prompt)
  if opt.device ~= 'cpu' and not em.cuda.is_available() then
    error(('--device %s: %s'):format(opt.device, em.cuda.why_not()), 0)
  end
end
em.manual_seed(opt.seed)

-- -- Data: the file's bytes as 1-based token ids ----------------------------------------------
local text
do
  local f, err = io.open(opt.file, 'rb')
  if not f then error(('--file: cannot read %s (%s)'):format(opt.file, err), 0) end
  text = f:read('*a')
  f:close()
end
if #text < opt.context + 2 then
  error(('--file %s: %d bytes, fewer than --context %d + 2'):format(opt.file, #text, opt.context), 0)
end
local id_of, byte_of = {}, {}          -- byte -> id, id -> byte
do
  local seen = {}
  for i = 1, #text do seen[text:byte(i)] = true end
  for b = 0, 255 do
    if seen[b] then byte_of[#byte_of + 1] = b; id_of[b] = #byte_of end
  end
end
local vocab = #byte_of
local tokens
do
  local ids = {}
  for i = 1, #text do ids[i] = id_of[text:byte(i)] end
  tokens = em.tensor(ids, { dtype = 'int64' })
end

-- One step's windows: the global batch drawn alike on every replica, this
-- replica's rows of it. x: (batch, context) inputs, y: the bytes that follow.
local offsets = em.arange(0, opt.context, { dtype = 'int64' }):view(1, -1)
local function batch()
  local global = opt.batch * strategy.world_size
  local starts = em.randint(1, #text - opt.context + 1, { global }, { dtype = 'int64' })
  local idx = (starts:view(-1, 1) + offsets):narrow(1, strategy.rank * opt.batch + 1, opt.batch)
  local x = tokens:index_select(1, idx:flatten()):view(opt.batch, opt.context)
  local y = tokens:index_select(1, (idx + 1):flatten())
  return x:to(opt.device), y:to(opt.device)
end

-- -- Model ------------------------------------------------------------------------------------------
local here = arg[0]:match('^(.*/)') or './'
local GPT = dofile(here .. 'gpt_model.lua')
local model = GPT.build{ vocab = vocab, layers = opt.layers, dim = opt.dim, heads = opt.heads,
                         context = opt.context }:to(opt.device)
-- replica 0's parameters everywhere; gradients averaged during backward (or
-- sharded, with --shard)
local dmodel = strategy:wrap(model, { shard = opt.shard or nil })
local optimizer = em.optim.AdamW(dmodel:parameters(), { lr = opt.lr, weight_decay = 0 })
if strategy:is_main() then
  print(('%s: %d bytes, %d distinct'):format(opt.file, #text, vocab))
  print(('model: %d blocks, dim %d, %d heads, context %d, %d parameters'):format(
    opt.layers, opt.dim, opt.heads, opt.context, model:num_parameters()))
  if strategy.world_size > 1 then print(tostring(strategy)) end
end

-- -- Training ----------------------------------------------------------------------------------------
for step = 1, opt.steps do
  local x, y = batch()
  local logits = dmodel(x)
  local loss = F.cross_entropy(logits:view(opt.batch * opt.context, vocab), y)
  optimizer:zero_grad()
  loss:backward()
  optimizer:step()
  if step == 1 or step % opt.every == 0 or step == opt.steps then
    local mean = strategy:allreduce(em.tensor({ loss:item() }, { dtype = 'float64' }), 'mean')
    if strategy:is_main() then
      print(('step %d/%d  loss %.4f'):format(step, opt.steps, mean:item()))
    end
  end
end

-- -- Sampling ---------------------------------------------------------------------------------------
-- A sharded model's forward is a collective: then every replica samples (alike:
-- same generator, same logits), and replica 0 prints.
if opt.sample > 0 and (opt.shard or strategy:is_main()) then
  local net = opt.shard and dmodel or model
  local ids = {}
  for i = 1, #opt.prompt do
    local id = id_of[opt.prompt:byte(i)]
    if not id then
      error(('--prompt: %q does not occur in %s'):format(opt.prompt:sub(i, i), opt.file), 0)
    end
    ids[i] = id
  end
  if #ids == 0 then ids[1] = id_of[text:byte(1)] end
  local out = {}
  em.no_grad(function()
    for _ = 1, opt.sample do
      local first = math.max(1, #ids - opt.context + 1)
      local window = em.tensor({ { unpack(ids, first, #ids) } }, { dtype = 'int64' })
      local last = net(window:to(opt.device))[1][window:size(2)]:to('cpu'):double()   -- (vocab)
      local id
      if opt.temperature == 0 then
        id = last:argmax():item()
      else
        local p = (last / opt.temperature):softmax(1):totable()
        local r, acc = em.rand({ 1 }, { dtype = 'float64' }):item(), 0
        id = vocab
        for k = 1, vocab do
          acc = acc + p[k]
          if r < acc then id = k break end
        end
      end
      ids[#ids + 1] = id
      out[#out + 1] = string.char(byte_of[id])
    end
  end)
  if strategy:is_main() then
    print(('sample (temperature %g):'):format(opt.temperature))
    print(opt.prompt .. table.concat(out))
  end
end

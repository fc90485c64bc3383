-- gpt.lua -- trains a small GPT-style decoder (examples/gpt_model.lua) on the
-- characters of a text file, then writes a sample of what it learnt.
--
--   ember examples/gpt.lua [--layers 2] [--dim 64] [--heads 4] [--context 64]
--                          [--batch 16] [--steps 500] [--lr 3e-3] [--every 100]
--                          [--file /usr/share/common-licenses/GPL-3] [--seed 1]
--                          [--sample 200] [--prompt 'The '] [--temperature 0.8]
--                          [--device cpu|cuda|cuda:N]
--                          [--shard optimizer|gradients|parameters]
--                          [--plan] [--memory SIZE]
--
-- Tokens are the file's bytes: the vocabulary is the set of bytes it holds (the
-- GPL's 35 kB of English make about 80). Each step draws --batch windows of
-- --context + 1 bytes at random offsets; the model predicts every next byte, the
-- loss is the mean cross-entropy (ln of the vocabulary size at the start, ~4.4).
-- It prints `step N/STEPS  loss X.XXXXXX` at step 1, every --every steps and at the
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
--
-- --plan lets em.distribute.plan choose the layout, for models whose training
-- state does not fit one replica's memory (the founding case of the planner):
--   ember --replicas 4 --memory-limit 5M examples/gpt.lua --plan --layers 8 --dim 96
--         --context 8 --batch 1 --file <3 kB of text>     (state 2.8 x the cap)
-- The planner sees the global batch (world_size x --batch windows), Adam and
-- the memory of one device (the --memory-limit cap, or --memory SIZE), prints
-- its table on replica 0 and wraps the model: data parallel, sharded, with
-- checkpointing, or a pipeline (pp:step). Whatever it picks, the windows of a
-- step are the global batch, so the losses are those of one unlimited device
-- at --batch world_size x b. Without --plan the same configuration runs out
-- of memory: plain data parallel keeps the whole state on every replica.

local nn, F = em.nn, em.nn.F

-- -- Options ---------------------------------------------------------------------------
local strategy = em.distribute.mirrored{}
local opt = { layers = 2, dim = 64, heads = 4, context = 64, batch = 16, steps = 500,
              lr = 3e-3, every = 100, file = '/usr/share/common-licenses/GPL-3', seed = 1,
              sample = 200, prompt = 'The ', temperature = 0.8, shard = false,
              device = strategy.device or 'cpu', plan = false, memory = false }
local FLAGS = { plan = true }               -- options without a value
do
  local i = 1
  while arg and arg[i] do
    local k = arg[i]:match('^%-%-(.+)$')
    if not k or opt[k] == nil then
      error(('unknown argument %s (see the header of %s)'):format(arg[i], arg[0]), 0)
    end
    if FLAGS[k] then
      opt[k], i = true, i + 1
    else
      local v = arg[i + 1]
      if v == nil then error('--' .. k .. ' needs a value', 0) end
      if type(opt[k]) == 'number' then
        opt[k] = tonumber(v) or error(('--%s needs a number, got %s'):format(k, v), 0)
      else
        opt[k] = v
      end
      i = i + 2
    end
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
  if opt.plan and opt.shard then error('--plan chooses the sharding itself: drop --shard', 0) end
  if opt.memory and not opt.plan then error('--memory is the memory --plan plans for: add --plan', 0) end
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

-- One step's windows: the global batch of world_size x --batch windows, drawn
-- alike on every replica, and the rows [index * rows, (index + 1) * rows) of it
-- (this replica's; all of them for a pipeline, which shares them out itself).
-- x: (rows, context) inputs, y: (rows, context), the bytes that follow.
local offsets = em.arange(0, opt.context, { dtype = 'int64' }):view(1, -1)
local global_batch = opt.batch * strategy.world_size
local function batch(rows, index)
  local starts = em.randint(1, #text - opt.context + 1, { global_batch }, { dtype = 'int64' })
  local idx = (starts:view(-1, 1) + offsets):narrow(1, index * rows + 1, rows)
  local x = tokens:index_select(1, idx:flatten()):view(rows, opt.context)
  local y = tokens:index_select(1, (idx + 1):flatten()):view(rows, opt.context)
  return x:to(opt.device), y:to(opt.device)
end
local function loss_fn(logits, y)          -- the mean cross-entropy of every next byte
  return F.cross_entropy(logits:view(-1, vocab), y:reshape(-1))
end

-- -- Model ------------------------------------------------------------------------------------------
local here = arg[0]:match('^(.*/)') or './'
local GPT = dofile(here .. 'gpt_model.lua')
local model = GPT.build{ vocab = vocab, layers = opt.layers, dim = opt.dim, heads = opt.heads,
                         context = opt.context }:to(opt.device)
if strategy:is_main() then
  print(('%s: %d bytes, %d distinct'):format(opt.file, #text, vocab))
  print(('model: %d blocks, dim %d, %d heads, context %d, %d parameters'):format(
    opt.layers, opt.dim, opt.heads, opt.context, model:num_parameters()))
  if strategy.world_size > 1 then print(tostring(strategy)) end
end
-- dmodel: the model as this replica runs it; rows, index: the rows of the
-- global batch it passes; pp: the pipeline, when the plan is one.
local dmodel, pp
local rows, index = opt.batch, strategy.rank
if opt.plan then
  dmodel, pp, rows, index = dofile(here .. 'gpt_plan.lua').apply(model, strategy, {
    batch = global_batch, context = opt.context, loss = loss_fn, device = opt.device,
    memory = opt.memory or nil })
else
  -- replica 0's parameters everywhere; gradients averaged during backward (or
  -- sharded, with --shard)
  dmodel = strategy:wrap(model, { shard = opt.shard or nil })
end
local optimizer = em.optim.AdamW(dmodel:parameters(), { lr = opt.lr, weight_decay = 0 })

-- -- Training ----------------------------------------------------------------------------------------
-- zero_grad first: the gradients of the last step are gone before this
-- step's activations arrive (the order the planner counts on)
for step = 1, opt.steps do
  local x, y = batch(rows, index)
  optimizer:zero_grad()
  local loss
  if pp then
    loss = pp:step(x, y, loss_fn)         -- the global batch's loss on every replica
  else
    loss = loss_fn(dmodel(x), y)
    loss:backward()
  end
  optimizer:step()
  if step == 1 or step % opt.every == 0 or step == opt.steps then
    local value = loss:item()
    if not pp then
      value = strategy:allreduce(em.tensor({ value }, { dtype = 'float64' }), 'mean'):item()
    end
    if strategy:is_main() then
      print(('step %d/%d  loss %.6f'):format(step, opt.steps, value))
    end
  end
end

-- -- Sampling ---------------------------------------------------------------------------------------
-- A sharded model's or a pipeline's forward is a collective: then every
-- replica samples (alike: same generator, same logits), and replica 0 prints.
local collective = opt.shard or opt.plan
if opt.sample > 0 and (collective or strategy:is_main()) then
  local net = collective and dmodel or model
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

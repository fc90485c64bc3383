-- shard_train.lua -- sharded data parallel on N replicas, run by test_distribute_shard.lua:
--   train MODE OPT [FLAGS]   three steps of s:wrap(model, {shard = MODE}) against one
--                            model trained in this process on the global batch;
--                            prints 'rank R maxdiff D' (parameters) and 'rank R
--                            gradient_norm A B' (clip_grad_norm's total, sharded
--                            and reference)
--   memory MODE OPT          one step of a model of ~1M parameters: this replica's
--                            bytes by kind against the ZeRO formulas, from
--                            dm:memory() ('rank R memory KIND got want') and
--                            from the allocator ('rank R allocator KIND got want')
-- MODE: none (the unsharded wrap, with FLAGS bf16 its Lua path), optimizer,
-- gradients, parameters. OPT: sgd (momentum) or adam. FLAGS, comma-separated:
-- bf16 (comm_dtype = 'bfloat16'), ckpt (one block under em.nn.Checkpoint), unused
-- (a layer that never runs), cuda (the replica's device: EMBER_DEVICES), offload.
local nn = em.nn
local F = nn.functional
local action, mode, optname, flags = arg[1], arg[2], arg[3], arg[4] or ''
local has = {}
for f in flags:gmatch('[^,]+') do has[f] = true end
if mode == 'none' then mode = nil end
local s = em.distribute.mirrored{ timeout = 60 }
local N, r = s.world_size, s.rank
local dev = s.device

-- depth: the linear layers of width x width in the middle block (default 2)
local function build(width, depth)
  em.manual_seed(3)
  local inner = {}
  for k = 1, depth or 2 do
    if k > 1 then inner[#inner + 1] = nn.Tanh() end
    inner[#inner + 1] = nn.Linear(width, width)
  end
  local block = nn.Sequential(inner)
  local m = nn.Sequential(nn.Linear(6, width), nn.Tanh(),
    has.ckpt and nn.Checkpoint(block) or block, nn.Tanh(), nn.Linear(width, 4))
  if has.unused then m.spare = nn.Linear(3, 3) end
  return m
end

local function make_opt(params)
  if optname == 'adam' then return em.optim.Adam(params, { lr = 0.01 }) end
  return em.optim.SGD(params, { lr = 0.1, momentum = 0.9 })
end

local function wrap(m)
  return s:wrap(m, { shard = mode, bucket_mb = 200 / 2 ^ 20,   -- several units per step
    comm_dtype = has.bf16 and 'bfloat16' or nil, offload = has.offload or nil })
end

if action == 'train' then
  local ref, model = build(9), build(9)
  local dm = wrap(model)
  local opt, ropt = make_opt(dm:parameters()), make_opt(ref:parameters())
  local B = 3
  em.manual_seed(11)
  local gn, rgn
  for step = 1, 3 do
    local X, Y = em.randn(B * N, 6), em.randn(B * N, 4)
    F.mse_loss(ref(X), Y):backward()
    rgn = em.nn.utils.clip_grad_norm(ref:parameters(), 0.05)
    ropt:step(); ropt:zero_grad()
    local x = X:narrow(1, r * B + 1, B):to(dev)
    local y = Y:narrow(1, r * B + 1, B):to(dev)
    F.mse_loss(dm(x), y):backward()
    gn = em.nn.utils.clip_grad_norm(dm:parameters(), 0.05)
    opt:step(); opt:zero_grad()
  end
  local sd, worst = dm:state_dict(), 0
  for k, v in pairs(ref:state_dict()) do
    worst = math.max(worst, (sd[k]:to('cpu') - v):abs():max():item())
  end
  print(('rank %d maxdiff %.3g'):format(r, worst))
  print(('rank %d gradient_norm %.9g %.9g'):format(r, gn, rgn))
  print(('rank %d units %d'):format(r, dm:num_buckets()))
elseif action == 'memory' then
  -- ~1M parameters in 6 modules, 4 of them 1 MB: a full float32 copy of the
  -- weights (4 MB) is far past what the allocator holds beside the model (x, y,
  -- the strategy's own tensors), and past two modules' weights
  local x, y = em.randn(8, 6):to(dev), em.randn(8, 4):to(dev)
  -- bytes the allocator holds once the garbage is gone
  local function held()
    em.collect()
    return em.memory_stats(dev).allocated
  end
  local base = held()
  local model = build(500, 4)
  local psi = model:num_parameters()
  -- the largest module's weights, in bytes
  local by_module, largest = {}, 0
  for _, np in ipairs(model:named_parameters()) do
    local owner = np[1]:match('^(.*)%.[^.]+$') or ''
    by_module[owner] = (by_module[owner] or 0) + np[2]:numel() * 4
    largest = math.max(largest, by_module[owner])
  end
  local dm = wrap(model)
  local opt = make_opt(dm:parameters())
  local weights = held() - base
  em.reset_peak_memory_stats(dev)
  local out = dm(x)
  -- 'parameters' gathers one module's weights for its forward (into them from
  -- the allgather's flat copy) and frees them after: the forward's peak over
  -- the shards is some two modules' weights, not the model's
  print(('rank %d forward_peak %d largest %d whole %d'):format(r,
    em.memory_stats(dev).peak - base - weights, largest, 4 * psi))
  local loss = F.mse_loss(out, y)
  out = nil
  loss:backward()
  loss = nil
  local grads = held() - base - weights
  opt:step()
  local got = dm:memory()
  opt:zero_grad()
  local state = held() - base - weights
  local per_state = optname == 'adam' and 8 or 4
  -- float32: weights, gradients, optimizer state per parameter, by mode
  local per = ({
    optimizer = { parameters = 4, gradients = 4, optimizer = per_state / N },
    gradients = { parameters = 4, gradients = 4 / N, optimizer = per_state / N },
    parameters = { parameters = 4 / N, gradients = 4 / N, optimizer = per_state / N },
  })[mode]
  -- the model's own accounting (dm:memory(), after the step)
  for _, kind in ipairs({ 'parameters', 'gradients', 'optimizer' }) do
    print(('rank %d memory %s %d %d'):format(r, kind, got[kind], per[kind] * psi))
  end
  print(('rank %d activations %d'):format(r, got.activations))
  -- the allocator's count: what each kind added to the bytes held
  local measured = { parameters = weights, gradients = grads, optimizer = state }
  for _, kind in ipairs({ 'parameters', 'gradients', 'optimizer' }) do
    print(('rank %d allocator %s %d %d'):format(r, kind, measured[kind], per[kind] * psi))
  end
end

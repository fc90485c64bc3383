-- shard_train.lua -- sharded data parallel on N replicas, run by test_distribute_shard.lua:
--   train MODE OPT [FLAGS]   three steps of s:wrap(model, {shard = MODE}) against one
--                            model trained in this process on the global batch;
--                            prints 'rank R maxdiff D' (parameters) and 'rank R
--                            gradient_norm A B' (clip_grad_norm's total, sharded
--                            and reference)
--   memory MODE OPT          after one step, this replica's bytes by kind against
--                            the ZeRO formulas: prints 'rank R memory KIND got want'
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

local function build(width)
  em.manual_seed(3)
  local block = nn.Sequential(nn.Linear(width, width), nn.Tanh(), nn.Linear(width, width))
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
  local model = build(64)
  local psi = model:num_parameters()
  local dm = wrap(model)
  local opt = make_opt(dm:parameters())
  local x, y = em.randn(8, 6):to(dev), em.randn(8, 4):to(dev)
  F.mse_loss(dm(x), y):backward()
  opt:step()
  local got = dm:memory()
  local state = optname == 'adam' and 8 or 4
  -- float32: weights, gradients, optimizer state per parameter, by mode
  local per = ({
    optimizer = { parameters = 4, gradients = 4, optimizer = state / N },
    gradients = { parameters = 4, gradients = 4 / N, optimizer = state / N },
    parameters = { parameters = 4 / N, gradients = 4 / N, optimizer = state / N },
  })[mode]
  for _, kind in ipairs({ 'parameters', 'gradients', 'optimizer' }) do
    print(('rank %d memory %s %d %d'):format(r, kind, got[kind], per[kind] * psi))
  end
  print(('rank %d activations %d'):format(r, got.activations))
  -- the allocator's own count at rest: weights and optimizer state, and x and y
  opt:zero_grad()
  em.collect()
  local rest = dm:memory()
  print(('rank %d allocated %d %d'):format(r, em.memory_stats(dev).allocated,
    rest.parameters + rest.optimizer + (8 * 6 + 8 * 4) * 4))
end

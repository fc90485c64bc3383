-- shard_ckpt.lua -- sharded checkpoints on N replicas, run by test_checkpoint_shard.lua:
--   save PATH OPT MODE UNIT         train `steps` = 1 sharded step, save the folder PATH
--   load PATH OPT MODE UNIT [STEPS] load into a fresh sharded model (STEPS: the training
--                                   the checkpoint should hold, default 1), compare
--   loadplain PATH OPT [STEPS]      the same into a plain model (1 replica)
--   saveplain PATH OPT              a plain model's plain checkpoint file
--   crash PATH OPT MODE UNIT STEP RANK  save (1 step), train a step, save again with
--                                   replica RANK exiting the process at STEP
-- The reference is a plain model trained on the same full gradients in this process;
-- values are compared exactly. Prints 'match true' or what differs.
local dir = arg[0]:match('^(.*/)') or './'
local standin = dofile(dir .. 'shard_standin.lua')
local nn = em.nn
local action, path, optname, mode, unit = arg[1], arg[2], arg[3], arg[4], tonumber(arg[5])
local s = em.distribute.mirrored{ timeout = 60 }

-- The one place the stand-in is used (the real s:wrap(model, {shard = mode}) replaces it).
local function shard(model, mode_, unit_)
  return standin.wrap(s, model, { shard = mode_, unit = unit_ })
end

local function build(seed)
  em.manual_seed(seed)
  local m = nn.Sequential(nn.Linear(7, 5), nn.BatchNorm1d(5), nn.Linear(5, 3))
  return m
end

local function make_opt(params)
  if optname == 'adam' then return em.optim.Adam(params, { lr = 0.01 }) end
  return em.optim.SGD(params, { lr = 0.1, momentum = 0.9 })
end

-- The full gradient of parameter i at step k (deterministic, the same everywhere).
local function full_grad(i, n, k)
  return (em.arange(n, { dtype = 'float64' }) * (0.37 * k + 0.11 * i)):sin():float()
end

local function set_buffers(m, k)
  m[2].running_mean:copy_(em.arange(5):float() * k)
  m[2].running_var:fill_(1 + k)
end

-- A plain model and optimizer after `steps` steps.
local function reference(steps)
  local m = build(7)
  local opt = make_opt(m:parameters())
  for k = 1, steps do
    for i, p in ipairs(m:parameters()) do p.grad = full_grad(i, p:numel(), k):reshape(p.shape) end
    opt:step()
    set_buffers(m, k)
  end
  return m, opt
end

-- A sharded model and optimizer trained the same way.
local function train_sharded(steps)
  local m = build(7)
  local dm = shard(m, mode, unit)
  local opt = make_opt(dm:parameters())
  local lay = dm:shard_layout()
  local function step(k)
    for i, p in ipairs(lay.params) do
      p.shard.grad = full_grad(i, p.numel, k):narrow(1, p.lo + 1, p.hi - p.lo)
    end
    opt:step()
    set_buffers(m, k)
  end
  for k = 1, steps do step(k) end
  return dm, opt, step
end

-- Exactly equal (a NaN never is).
local function same(a, b)
  return a:numel() == b:numel() and a:ne(b):sum():item() == 0
end

-- Compares full parameters, buffers and optimizer state with the reference.
local function compare(full_params, full_state, buffers, opt_groups, steps)
  local ref, ropt = reference(steps)
  local bad = {}
  for i, np in ipairs(ref:named_parameters()) do
    local want = np[2]:detach():double():reshape(np[2]:numel())
    local got = full_params[np[1]]:double():reshape(np[2]:numel())
    if not same(want, got) then bad[#bad + 1] = np[1] end
    local rs = ropt.state[i] or {}
    for key, v in pairs(rs) do
      local g = full_state[i] and full_state[i][key]
      if type(v) == 'number' then
        if g ~= v then bad[#bad + 1] = np[1] .. '.' .. key .. '=' .. tostring(g) end
      elseif not g or not same(v:double():reshape(v:numel()), g:double():reshape(v:numel())) then
        bad[#bad + 1] = np[1] .. '.' .. key
      end
    end
  end
  for _, nb in ipairs(ref:named_buffers()) do
    if not same(nb[2]:double(), buffers[nb[1]]:double()) then bad[#bad + 1] = nb[1] end
  end
  if opt_groups[1].lr ~= ropt.param_groups[1].lr then bad[#bad + 1] = 'lr' end
  print(('rank %d match %s %s'):format(s.rank, tostring(#bad == 0), table.concat(bad, ',')))
end

if action == 'save' then
  local dm, opt = train_sharded(1)
  em.checkpoint.save(path, { model = dm, optimizer = opt, epoch = 1, note = 'hi' })
  print('saved')
elseif action == 'saveplain' then
  local m, opt = reference(1)
  em.checkpoint.save(path, { model = m, optimizer = opt, epoch = 1, note = 'hi' })
  print('saved')
elseif action == 'crash' then
  local step_name, who = arg[6], tonumber(arg[7])
  local dm, opt, step = train_sharded(1)
  em.checkpoint.save(path, { model = dm, optimizer = opt, epoch = 1, note = 'hi' })
  step(2)
  require('ember.checkpoint.shard_save')._hook = function(name, rank)
    if name == step_name and rank == who then
      io.stdout:write('crashing at ', name, '\n')
      io.stdout:flush()
      os.exit(3)
    end
  end
  em.checkpoint.save(path, { model = dm, optimizer = opt, epoch = 2, note = 'hi' })
  print('not crashed')
elseif action == 'load' then
  local m = build(99)                 -- other values everywhere
  local dm = shard(m, mode, unit)
  local opt = make_opt(dm:parameters())
  opt.lr = 123
  local rest = em.checkpoint.load(path, { model = dm, optimizer = opt })
  local steps = rest.epoch
  local lay = dm:shard_layout()
  local full_state = {}
  for i, p in ipairs(lay.params) do
    local st = opt.state[i]
    full_state[i] = {}
    -- every replica gathers the same keys (a collective); an absent shard is NaN
    local keys = optname == 'adam' and { 'exp_avg', 'exp_avg_sq' } or { 'momentum_buffer' }
    for _, key in ipairs(keys) do
      local v = st and st[key] or em.full({ p.hi - p.lo }, 0 / 0)
      full_state[i][key] = dm:gather(p, v)
    end
    if st then full_state[i].step = st.step end
  end
  local bufs = {}
  for _, nb in ipairs(m:named_buffers()) do bufs[nb[1]] = nb[2] end
  compare(dm:state_dict(), full_state, bufs, opt.param_groups, steps)
  print(('rank %d epoch %s note %s'):format(s.rank, tostring(rest.epoch), tostring(rest.note)))
elseif action == 'loadplain' then
  local m = build(99)
  local opt = make_opt(m:parameters())
  local rest = em.checkpoint.load(path, { model = m, optimizer = opt })
  local sd, bufs = {}, {}
  for _, np in ipairs(m:named_parameters()) do sd[np[1]] = np[2]:detach() end
  for _, nb in ipairs(m:named_buffers()) do bufs[nb[1]] = nb[2] end
  compare(sd, opt.state, bufs, opt.param_groups, rest.epoch)
  print(('rank %d epoch %s note %s'):format(s.rank, tostring(rest.epoch), tostring(rest.note)))
end

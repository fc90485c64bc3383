-- sweep.lua -- run by test_memory_sweep.lua under `ember --replicas N` and mpirun:
-- each kind of object ember hands out, built, used and dropped ROUNDS times in
-- this one process, as a hyper-parameter sweep or a REPL session does; after
-- each round a full collection (ember.handles' collect), then the tensor memory
-- still held. A kind that keeps itself (or its tensors) alive grows every round.
--   ember --replicas 2 sweep.lua DIR [KIND ...]   (default: every kind)
-- DIR: a scratch folder (checkpoint files). Prints, per replica and kind:
--   "rank R kind K r6 BYTES r16 BYTES"  (or "rank R kind K error MESSAGE")
local dir = assert(arg[1], 'usage: sweep.lua DIR [KIND ...]')
local s = em.distribute.mirrored{ timeout = 60 }
local nn, F = em.nn, em.nn.F
local collect = require('ember.handles').collect
local R, N = s.rank, s.world_size
local ROUNDS = 16

-- A small model: 85k parameters (a copy of its weights is 0.33 MiB), so one
-- round's model left alive is well past the test's 1 MB over ten rounds.
local IN, HID, OUT, B = 64, 256, 10, 8
local function build(ckpt)
  local function block(i, o)
    local b = nn.Sequential(nn.Linear(i, o), nn.ReLU())
    return ckpt and nn.Checkpoint(b) or b
  end
  return nn.Sequential(block(IN, HID), block(HID, HID), nn.Linear(HID, OUT))
end
local function batch() return em.randn(B, IN), em.randn(B, OUT) end

-- two steps of an optimizer on m (a model or a wrapped one)
local function train(m, opt)
  for _ = 1, 2 do
    local x, y = batch()
    opt:zero_grad()
    F.mse_loss(m(x), y):backward()
    opt:step()
  end
end
local function adam(m) return em.optim.Adam(m:parameters(), { lr = 1e-3 }) end
local function wrapped(o) return function() local dm = s:wrap(build(), o); train(dm, adam(dm)) end end

local kinds = {
  { 'model_adam', function() local m = build(); train(m, adam(m)) end },
  { 'model_sgd', function()
    local m = build()
    train(m, em.optim.SGD(m:parameters(), { lr = 1e-3, momentum = 0.9 }))
  end },
  { 'wrap', wrapped(nil) },
  { 'wrap_optimizer', wrapped { shard = 'optimizer' } },
  { 'wrap_gradients', wrapped { shard = 'gradients' } },
  { 'wrap_parameters', wrapped { shard = 'parameters' } },
  { 'wrap_bfloat16', wrapped { comm_dtype = 'bfloat16' } },
  { 'checkpoint_module', function() local m = build(true); train(m, adam(m)) end },
  { 'checkpoint_wrap', function() local dm = s:wrap(build(true)); train(dm, adam(dm)) end },
  { 'checkpoint_forward_only', function()     -- a forward whose graph is never used
    local m = build(true)
    local x = batch()
    local out = m(x)
    assert(out.requires_grad)
  end },
  { 'save_load', function()
    local m = build()
    local opt = adam(m)
    train(m, opt)
    local path = ('%s/sweep_r%d.ckpt'):format(dir, R)
    em.checkpoint.save(path, { model = m, optimizer = opt, step = 2 })
    local m2 = build()
    local opt2 = adam(m2)
    em.checkpoint.load(path, { model = m2, optimizer = opt2 })
    train(m2, opt2)
  end },
  { 'loader', function()
    local ds = em.data.tensors(em.randn(64, IN), em.randn(64, OUT))
    local loader = s:shard(ds:shuffle { seed = 1 }):batch(B):loader { workers = 1 }
    local n = 0
    for x in loader:epoch() do n = n + x:size(1) end
    assert(n == 64 / N, 'one epoch of this replica\'s share')
  end },
  { 'plan', function()
    local m = build()
    local plan = em.distribute.plan(m, { input = { shape = { B * N, IN } },
      target = { shape = { B * N, OUT } }, loss = F.mse_loss, optimizer = 'adam', devices = N,
      memory = 2 ^ 30, time = false, pipeline = false })
    local dm = plan:apply(s)
    train(dm, adam(dm))
  end },
  { 'pipeline', function()
    local pp = s:pipeline(build(), { stages = N, chunks = 2, sample = em.randn(2, IN) })
    local opt = adam(pp)
    for _ = 1, 2 do
      local x, y = batch()
      opt:zero_grad()
      pp:step(x, y, F.mse_loss)
      opt:step()
    end
  end },
  { 'async_collective', function()   -- a handle dropped without wait()
    s:allreduce(em.randn(65536), 'sum', { async = true })
    local w = s:allgather(em.randn(4096), { async = true })
    assert(w)
  end },
  { 'profile', function()
    local m = build()
    local opt = adam(m)
    em.profile.start {}
    for _ = 1, 2 do train(m, opt); em.profile.step() end
    local r = em.profile.stop()
    assert(r.steps == 2, r.steps)
  end },
}

local wanted = {}
for i = 2, #arg do wanted[arg[i]] = true end
for _, k in ipairs(kinds) do
  local name, fn = k[1], k[2]
  if next(wanted) == nil or wanted[name] then
    local held = {}
    local ok, err = pcall(function()
      for r = 1, ROUNDS do
        fn()
        collect()
        held[r] = em.memory_stats('cpu').allocated
      end
    end)
    if ok then
      print(('rank %d kind %s r6 %d r16 %d'):format(R, name, held[6], held[ROUNDS]))
    else
      print(('rank %d kind %s error %s'):format(R, name, tostring(err):gsub('\n', ' ')))
    end
    io.stdout:flush()
  end
end

--[[
bench_shard.lua -- sharded data parallel (s:wrap(model, {shard = ...})) against
PyTorch 2 on the CPU: for each mode

  plain       s:wrap(model)                      PyTorch: DistributedDataParallel
  optimizer   s:wrap(model, {shard = 'optimizer'})   ZeroRedundancyOptimizer over DDP
  gradients   s:wrap(model, {shard = 'gradients'})   FSDP1, SHARD_GRAD_OP
  parameters  s:wrap(model, {shard = 'parameters'})  FSDP2 fully_shard per layer

on `ember --replicas N` (threads, the local communicator, 1 intra-op thread each)
for N = 2 and 4, the model 'mlp' (784 -> 4 x 1024 -> 10, 3.96 M parameters: 63 MB
of float32 Adam state unsharded) and optionally 'cnn' (train_common's
Fashion-MNIST CNN), float32, Adam 1e-3, cross-entropy, batch 64 per replica on
synthetic batches, `steps` timed steps after 5. The twin, bench_shard.py, runs
the peers above as N gloo processes x 1 thread over the same steps.

Per configuration: global samples/s (all replicas' samples / the slowest
replica's seconds), then one more, untimed step measured for memory, the largest
replica's bytes by kind: dm:memory() {parameters, gradients, optimizer,
activations}; for plain, which has no dm:memory(), what ember.memory_kinds counts
from the optimizer (parameters, their .grad, its state: each storage once) and,
as dm:memory() does, activations = the peak of forward and backward above what
was allocated when the forward began (em.memory_stats('cpu')). Beside them: ZeRO's
formula for float32 Adam (bytes per parameter: plain 4 + 4 + 8; optimizer 4 + 4
+ 8/N; gradients 4 + 4/N + 8/N; parameters 4/N + 4/N + 8/N), PyTorch's
figures (tensor storages counted, bench_shard.py's header says how), and the
replica's allocator peak over the step (em.memory_stats('cpu').peak).

  ember tests/bench/bench_shard.lua [--steps N] [--model mlp|cnn|all]
        [--world 2,4] [--modes plain,optimizer,gradients,parameters]

(steps default 30, or EMBER_BENCH_SHARD_STEPS.) RESULT lines, the same names as
the twin's, so that run.sh's ratios are ember/PyTorch for samples/s and
PyTorch/ember for memory:
  shard_<model>_<mode>_n<N>                     global samples/s (target: >= PyTorch's)
  shard_<model>_mem_<mode>_n<N>                 parameters + gradients + optimizer
                                                state per replica, MB
  shard_<model>_mem_<mode>_n<N>_vs_formula      that / the formula (target <= 1.05)
Standalone, the driver runs the twin itself and prints both in one table.
]]
local dir = debug.getinfo(1, 'S').source:sub(2):match('(.*/)')
local D = dofile(dir .. 'dist_common.lua')
local em = D.B.em
local nn, F = em.nn, em.nn.F

local BATCH, WARM, POOL = 64, 5, 4
local MODES = { 'plain', 'optimizer', 'gradients', 'parameters' }
local KINDS = { 'parameters', 'gradients', 'optimizer', 'activations' }
local MB = 1024 * 1024
local STEPS = tonumber(os.getenv('EMBER_BENCH_SHARD_STEPS') or '') or 30

local function make_model(kind)
  em.manual_seed(0)
  if kind == 'mlp' then
    return nn.Sequential(nn.Linear(784, 1024), nn.ReLU(), nn.Linear(1024, 1024), nn.ReLU(),
                         nn.Linear(1024, 1024), nn.ReLU(), nn.Linear(1024, 1024), nn.ReLU(),
                         nn.Linear(1024, 10))
  end
  return dofile(dir .. 'train_common.lua').model('cnn')
end

-- ZeRO's bytes per kind for n float32 parameters under Adam on N replicas.
local function formula(mode, n, N)
  local p, g, o = 4 * n, 4 * n, 8 * n
  if mode ~= 'plain' then o = o / N end
  if mode == 'gradients' or mode == 'parameters' then g = g / N end
  if mode == 'parameters' then p = p / N end
  return { parameters = p, gradients = g, optimizer = o }
end

-- The plain wrapped model's bytes by kind: what ember.memory_kinds counts from
-- the live optimizers (each storage once at its full size, so gradients that are
-- views of the reducer's buckets count as the buckets), summed over devices.
local function counted()
  local m = { parameters = 0, gradients = 0, optimizer = 0 }
  for _, d in pairs(require('ember.memory_kinds').measure()) do
    for k in pairs(m) do m[k] = m[k] + (d[k] or 0) end
  end
  return m
end

-- -- The worker: one replica ---------------------------------------------------------------
local function train(o)
  local kind, mode = o.model or 'mlp', o.mode or 'plain'
  local steps = o.steps or STEPS
  local s = em.distribute.mirrored{}
  local model = make_model(kind)
  local numel = 0
  for _, p in ipairs(model:parameters()) do numel = numel + p:numel() end
  local dm = mode == 'plain' and s:wrap(model) or s:wrap(model, { shard = mode })
  local opt = em.optim.Adam(dm:parameters(), { lr = 1e-3 })
  em.manual_seed(1000 + s.rank)
  local data = {}
  for i = 1, POOL do
    local x = kind == 'mlp' and em.randn(BATCH, 784) or em.randn(BATCH, 1, 28, 28)
    data[i] = { x, em.randint(1, 11, { BATCH }) }   -- classes 1..10
  end
  local function step(i)
    local b = data[(i - 1) % POOL + 1]
    local loss = F.cross_entropy(dm(b[1]), b[2])
    opt:zero_grad()
    loss:backward()
    opt:step()
  end

  local slowest = D.timed(s, WARM, steps, step)

  -- the memory step: dead tensors hold their memory until a collection releases
  -- it (em.collect: collectgarbage alone leaves the release to the next op)
  local b = data[1]
  opt:zero_grad()
  em.collect()
  em.reset_peak_memory_stats('cpu')
  local a0 = em.memory_stats('cpu').allocated
  F.cross_entropy(dm(b[1]), b[2]):backward()
  local grown = em.memory_stats('cpu').peak - a0
  opt:step()
  local peak = em.memory_stats('cpu').peak
  local m
  if dm.memory then
    m = dm:memory()
  else             -- as the sharded model reports them: the peak of forward and backward
    m = counted()  -- above what was allocated when the forward began
    m.activations = math.max(0, grown)
  end
  local v = {}
  for i, k in ipairs(KINDS) do v[i] = m[k] or 0 end
  v[#v + 1] = peak
  v = s:allreduce(em.tensor(v, { dtype = 'float64' }), 'max'):totable()

  D.data(s, 'samples_s', s.world_size * steps * BATCH / slowest)
  for i, k in ipairs(KINDS) do D.data(s, k, v[i]) end
  D.data(s, 'peak', v[#KINDS + 1])
  D.data(s, 'numel', numel)
end

local w = D.worker_args()
if w then return train(w) end

-- -- The driver ----------------------------------------------------------------------------
local split = D.split

-- The twin's figures: {RESULT name = value}, {KIND name = {bytes by kind}}; or nil, why.
local function peer(o)
  if os.getenv('EMBER_BENCH_PEER') == '0' then return nil, nil, 'run.sh runs it' end
  if select(2, D.sh(D.PY .. " -c 'import torch'")) ~= 0 then return nil, nil, 'no torch' end
  local out, rc = D.sh(('PYTHONDONTWRITEBYTECODE=1 %s %s --steps %d --model %s --world %s --modes %s')
    :format(D.PY, D.quote(dir .. 'bench_shard.py'), o.steps, D.quote(o.model), D.quote(o.world),
            D.quote(o.modes)))
  local r, kinds = {}, {}
  for k, v in out:gmatch('RESULT (%S+) (%S+)') do r[k] = tonumber(v) end
  for k, p, g, opt, a in out:gmatch('KIND (%S+) (%S+) (%S+) (%S+) (%S+)') do
    kinds[k] = { parameters = tonumber(p), gradients = tonumber(g), optimizer = tonumber(opt),
                 activations = tonumber(a) }
  end
  for line in out:gmatch('[^\n]+') do
    if line:match('^SKIP ') then print((line:gsub('^SKIP ', 'SKIP torch: '))) end
  end
  if rc ~= 0 and not next(r) then return nil, nil, 'torch failed (exit ' .. rc .. ')' end
  return r, kinds
end

local o = D.options({ steps = STEPS, model = 'mlp', world = '2,4', modes = table.concat(MODES, ',') },
  ('usage: ember %s [--steps N] [--model mlp|cnn|all] [--world 2,4] '
   .. '[--modes plain,optimizer,gradients,parameters]'):format(arg and arg[0] or 'bench_shard.lua'))
local models = o.model == 'all' and { 'mlp', 'cnn' } or { o.model }
local runs, why = {}, {}
for _, kind in ipairs(models) do
  for _, N in ipairs(split(o.world)) do
    for _, mode in ipairs(split(o.modes)) do
      local name = ('shard_%s_%s_n%s'):format(kind, mode, N)
      runs[#runs + 1] = { name = name, kind = kind, mode = mode, N = tonumber(N) }
      local r = runs[#runs]
      r.r, why[name] = D.launch('local', r.N, 1,
        { '--model', kind, '--mode', mode, '--steps', o.steps })
    end
  end
end
local pr, pk, peer_why = peer(o)

print(('sharded data parallel, batch %d per replica, %d steps after %d, replicas x 1 thread; '
  .. 'memory per replica in MB: ember / ZeRO formula / PyTorch'):format(BATCH, o.steps, WARM))
print(('%-4s %-10s %2s %9s %9s %6s  %-20s %-20s %-20s %-12s %7s'):format('', 'mode', 'N',
  'samples/s', 'PyTorch', 'ratio', 'parameters', 'gradients', 'optimizer', 'activations',
  'peak'))
local function f(v) return v and ('%.2f'):format(v / MB) or 'n/a' end
for _, c in ipairs(runs) do
  local r, tr = c.r, pr and pr[c.name]
  local tk = pk and pk[c.name] or {}
  if r then
    local fm = formula(c.mode, r.numel, c.N)
    local cells = {}
    for i = 1, 3 do
      local k = KINDS[i]
      cells[i] = ('%s/%s/%s'):format(f(r[k]), f(fm[k]), f(tk[k]))
    end
    print(('%-4s %-10s %2d %9.0f %9s %6s  %-20s %-20s %-20s %-12s %7s'):format(c.kind, c.mode,
      c.N, r.samples_s, D.fmt(tr, '%.0f'), D.fmt(tr and r.samples_s / tr, '%.2f'), cells[1],
      cells[2], cells[3], f(r.activations) .. '/' .. f(tk.activations), f(r.peak)))
  else
    print(('%-4s %-10s %2d n/a (%s)'):format(c.kind, c.mode, c.N, why[c.name]))
  end
end
if not pr then print(('PyTorch: n/a (%s)'):format(peer_why)) end
print('activations: ember = the peak of forward and backward above its start, transient buffers '
  .. 'included (dm:memory()); PyTorch = the tensors autograd saved for backward (its CPU '
  .. 'allocator keeps no statistics)')

for _, c in ipairs(runs) do
  local r = c.r
  if r then
    local fm = formula(c.mode, r.numel, c.N)
    local state = r.parameters + r.gradients + r.optimizer
    local mem = ('shard_%s_mem_%s_n%d'):format(c.kind, c.mode, c.N)
    D.B.result(c.name, r.samples_s, 'samples/s', 'higher', 'ratio >= 1')
    D.B.result(mem, state / MB, 'MB', 'lower', '-')
    D.B.result(mem .. '_vs_formula', state / (fm.parameters + fm.gradients + fm.optimizer), 'x',
               'lower', '<= 1.05')
  else
    D.skip(c.name, why[c.name])
  end
end

--[[
check_ckpt.lua -- is the checkpoint that train.lua's replica 0 left whole, and is it
the training run's state at the step it names?

  ember check_ckpt.lua PATH

Loads PATH into a fresh model and optimizer of train.lua's shapes, then:
  - every parameter and every momentum buffer as loaded is, bit for bit, the
    tensor the file holds under its name (each went where it belongs);
  - the parameters sum to the `sum` saved beside them (computed before the save,
    in float64, so only the same bytes give the same sum);
  - every parameter and every momentum buffer equals, element by element, the
    run replayed here to the saved step: train.lua's model and seeds, each of the
    `world` replicas' batches, their gradients averaged as the reducer does (a
    sum, then divided by the number of replicas), the same SGD steps. With two
    replicas the sum has one order, so the replay is the same bits; with more,
    MPI may add in another order, so each element may differ by rounding
    (REPLAY_TOL of the tensor's largest value), far less than one step moves it.
Prints "ckpt-ok step N" or "ckpt-bad: WHY" and exits non-zero when bad.
]]
local path = assert(arg[1], 'usage: ember check_ckpt.lua PATH')
local ffi = require 'ffi'
ffi.cdef 'int memcmp(const void *a, const void *b, size_t n);'
local nn = em.nn
local LR, MOMENTUM = 0.01, 0.9
local REPLAY_TOL = 1e-5

local function model_and_opt()
  local m = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 8))
  return m, em.optim.SGD(m:parameters(), { lr = LR, momentum = MOMENTUM })
end

local function bad(why)
  print('ckpt-bad: ' .. why)
  os.exit(1)
end

local model, opt = model_and_opt()
local ok, rest = pcall(em.checkpoint.load, path, { model = model, optimizer = opt })
if not ok then bad(tostring(rest)) end
if type(rest.step) ~= 'number' or rest.step < 1 then bad('no step in the checkpoint') end
if type(rest.world) ~= 'number' or rest.world < 1 then bad('no world size in the checkpoint') end

-- The tensors to compare, by the names the file gives them.
local function named(m, o)
  local out = {}
  for k, t in pairs(m:state_dict()) do out['model.' .. k] = t end
  for i, p in ipairs(m:parameters()) do
    local st = o.state[i]
    out['optimizer.state.' .. i .. '.momentum_buffer'] = st and st.momentum_buffer or false
  end
  return out
end
local loaded = named(model, opt)

-- a tensor's elements as one flat list of numbers
local function flat(t)
  local out = {}
  local function walk(v)
    if type(v) == 'table' then for i = 1, #v do walk(v[i]) end else out[#out + 1] = v end
  end
  walk(t:totable())
  return out
end

-- first element where a and b differ by more than tol * (largest |b|), or nil;
-- tol 0: the same bits (NaN included)
local function differs(a, b, tol)
  if a.dtype ~= b.dtype or #a.shape ~= #b.shape then
    return ('%s %s, want %s %s'):format(a.dtype, table.concat(a.shape, 'x'), b.dtype,
      table.concat(b.shape, 'x'))
  end
  for d = 1, #a.shape do
    if a.shape[d] ~= b.shape[d] then
      return ('shape %s, want %s'):format(table.concat(a.shape, 'x'), table.concat(b.shape, 'x'))
    end
  end
  local x, y = a:contiguous(), b:contiguous()
  if tol == 0 and ffi.C.memcmp(x:data_ptr(), y:data_ptr(), x:numel() * x:element_size()) == 0 then
    return nil
  end
  local xs, ys = flat(x), flat(y)
  local scale = 0
  for i = 1, #ys do scale = math.max(scale, math.abs(ys[i])) end
  for i = 1, #xs do
    local d = math.abs(xs[i] - ys[i])
    if not (d <= tol * scale) or (tol == 0 and 1 / xs[i] ~= 1 / ys[i]) then
      return ('element %d of %d is %.9g, want %.9g'):format(i, #xs, xs[i], ys[i])
    end
  end
  return tol == 0 and 'the bytes differ (a NaN\'s payload)' or nil
end

-- The file's own tensors, read apart from load.
local file = em.load(path)
for name, t in pairs(loaded) do
  if not t then bad(name .. ': no momentum buffer after the load') end
  if not file[name] then bad(name .. ': not in the file') end
  local why = differs(t, file[name], 0)
  if why then bad(name .. ' as loaded is not what the file holds: ' .. why) end
end

local sum = 0
for _, p in ipairs(model:parameters()) do sum = sum + p:double():sum():item() end
if sum ~= rest.sum then
  bad(('the parameters sum to %.17g, the checkpoint says %.17g'):format(sum, rest.sum))
end

-- The replay: train.lua's seeds and steps, the replicas one after another.
em.manual_seed(7)
local ref, ref_opt = model_and_opt()
local batches = {}
for r = 0, rest.world - 1 do
  em.manual_seed(100 + r)
  batches[r] = {}
  for step = 1, rest.step do batches[r][step] = { em.randn(16, 32), em.randn(16, 8) } end
end
local params = ref:parameters()
for step = 1, rest.step do
  local sums = {}
  for r = 0, rest.world - 1 do
    ref_opt:zero_grad()
    local b = batches[r][step]
    nn.F.mse_loss(ref(b[1]), b[2]):backward()
    for i, p in ipairs(params) do sums[i] = sums[i] and sums[i] + p.grad or p.grad:clone() end
  end
  em.no_grad(function()
    for i, p in ipairs(params) do p.grad:copy_(sums[i] / rest.world) end
  end)
  ref_opt:step()
end
local tol = rest.world <= 2 and 0 or REPLAY_TOL
for name, want in pairs(named(ref, ref_opt)) do
  local why = differs(loaded[name], want, tol)
  if why then
    bad(('%s is not the run\'s at step %d (%d replicas, replayed): %s'):format(name,
      rest.step, rest.world, why))
  end
end
print('ckpt-ok step ' .. rest.step)
os.exit(0)

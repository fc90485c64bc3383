--[[
test_distribute_shard.lua -- sharded data parallel: s:wrap(model, {shard = 'optimizer'
| 'gradients' | 'parameters'}), comm_dtype, offload, and what it is built on.

In this process: the layout arithmetic (every element of every parameter on
exactly one replica, segments of equal size), resident tensors (data freed and
gathered again under autograd's saved views, counted right, meta while away),
the options' errors, and a world of one that trains as the plain model does.
Through `ember --replicas N` (tests/lua/dist/shard_train.lua): every mode with
SGD-momentum and Adam on 1 to 4 replicas, several units per step and a layer that
never runs, against one model trained on the global batch (parameters and
clip_grad_norm's global norm); bfloat16 gradients; activation checkpointing
inside a sharded model; the bytes by kind on 2 and 4 replicas against the ZeRO
formulas, by the model's accounting and by the allocator's count, and ZeRO 3's
forward peak; under mpirun; on emulated GPU replicas with and without offload.
]]
local dir = (arg and arg[0] and arg[0]:match('^(.*/)')) or
            ((os.getenv('EMBER_TESTS') or 'tests') .. '/lua/')
local H = dofile(dir .. 'harness.lua')
local em = require 'ember'
local nn = em.nn
local core = require 'ember.ffi'
local C, S = core.C, core.S
local ember = arg[-1] or 'ember'
local L = dofile(dir .. 'dist/launch.lua')(dir, ember)
local layout = require 'ember.distribute.shard.layout'

-- -- In this process ----------------------------------------------------------------------------

H.test('the layout puts every element on exactly one replica', function()
  for _, case in ipairs({ { { 7 }, 3 }, { { 1, 1, 1 }, 4 }, { { 35, 5, 15, 3 }, 3 },
                          { { 2, 64, 1 }, 2 }, { { 5 }, 8 }, { { 12, 12 }, 4 } }) do
    local numels, world = case[1], case[2]
    local owner = {}
    local total = 0
    for _, n in ipairs(numels) do total = total + n end
    for rank = 0, world - 1 do
      local u = layout.unit(numels, world, rank)
      H.eq(u.L % world, 0, 'L is a multiple of the world size')
      H.check(u.L >= total and u.L - total < world, 'padding under one element per replica')
      H.eq(u.seg * world, u.L)
      for i, n in ipairs(numels) do
        H.check(u.lo[i] >= 0 and u.lo[i] <= u.hi[i] and u.hi[i] <= n, 'range inside the parameter')
        for e = u.lo[i], u.hi[i] - 1 do
          local flat = u.off[i] + e
          H.check(flat >= rank * u.seg and flat < (rank + 1) * u.seg, 'in this replica\'s segment')
          H.eq(u.at[i] + (e - u.lo[i]), flat - rank * u.seg, 'at the right offset')
          local key = i .. ':' .. e
          H.check(owner[key] == nil, 'one owner for ' .. key)
          owner[key] = rank
        end
      end
    end
    local covered = 0
    for _ in pairs(owner) do covered = covered + 1 end
    H.eq(covered, total, 'every element owned')
  end
  -- buckets: reverse order, one dtype each, the first small
  local b = layout.buckets({ 10, 10, 10, 10 }, { 'f', 'f', 'd', 'd' }, 5, 25)
  H.eq(b, { { 4 }, { 3 }, { 2, 1 } })
end)

H.test('a resident tensor frees its data and gets it back under saved views', function()
  local w0 = em.randn(4, 3)
  local w = w0:clone():requires_grad_()
  local x = em.randn(2, 3):requires_grad_()
  local before = em.memory_stats().allocated
  H.eq(tonumber(C.em_tensor_free_data(S, w._h)), 0)
  H.eq(em.memory_stats().allocated, before - 48, 'the 48 bytes are counted out')
  H.eq(w.device, 'meta')
  H.eq(tonumber(C.em_tensor_has_data(w._h)), 0)
  H.raises(function() return (w + 1):sum():item() end, 'meta')
  H.raises(function() return x:matmul(w:t()) end, 'matmul', 'cpu', 'meta')
  H.eq(tonumber(C.em_tensor_fill_data(S, w._h, w0._h)), 0)
  H.eq(em.memory_stats().allocated, before)
  H.eq(w.device, 'cpu')
  local y = (x:matmul(w:t()) * 2):sum()             -- saves views of w
  H.eq(tonumber(C.em_tensor_free_data(S, w._h)), 0)
  H.eq(tonumber(C.em_tensor_fill_data(S, w._h, w0._h)), 0)   -- no version bump
  y:backward()
  H.close(H.flat(x.grad), H.flat((em.ones(2, 4) * 2):matmul(w0)), 1e-6, 'x.grad')
  H.close(H.flat(w.grad), H.flat((em.ones(4, 2) * 2):matmul(x:detach())), 1e-6, 'w.grad')
  H.raises(function() C.em_tensor_fill_data(S, w._h, em.zeros(3, 4)._h); core.fail() end,
    'fill_data', '[3,4]', '[4,3]')
  local shared = em.randn(5)
  local v = shared:view(5)
  local values = H.flat(shared)
  H.raises(function() C.em_tensor_free_data(S, shared._h); core.fail() end, 'shared')
  -- the refusal leaves the data where it was, for the tensor and its view
  H.eq(tonumber(C.em_tensor_has_data(shared._h)), 1, 'the refused tensor keeps its data')
  H.eq(shared.device, 'cpu', 'and stays on its device')
  H.eq(H.flat(v), values, 'its view reads the same values')
end)

H.test('options are checked', function()
  local s = em.distribute.mirrored{}
  local m = nn.Linear(3, 2)
  H.raises(function() s:wrap(m, { shard = 'weights' }) end, "shard must be 'optimizer'", "'weights'")
  H.raises(function() s:wrap(m, { offload = true }) end, 'offload = true', 'needs shard')
  H.raises(function() s:wrap(m, { shard = 'gradients', comm_dtype = 'int8' }) end, 'comm_dtype')
  H.raises(function() s:wrap(m, { shard = 'gradients', offload = 1 }) end, 'offload must be')
  H.raises(function() s:wrap(m, { sharding = 'x' }) end, "unknown option 'sharding'")
end)

H.test('one replica trains as the plain model in every mode', function()
  local s = em.distribute.mirrored{}
  for _, mode in ipairs({ 'optimizer', 'gradients', 'parameters' }) do
    em.manual_seed(5)
    local ref = nn.Sequential(nn.Linear(4, 6), nn.ReLU(), nn.Linear(6, 2))
    em.manual_seed(5)
    local m = nn.Sequential(nn.Linear(4, 6), nn.ReLU(), nn.Linear(6, 2))
    local dm = s:wrap(m, { shard = mode })
    H.eq(dm.shard_mode, mode)
    local opt, ropt = em.optim.Adam(dm:parameters(), { lr = 0.05 }),
      em.optim.Adam(ref:parameters(), { lr = 0.05 })
    for _ = 1, 3 do
      local x, y = em.randn(5, 4), em.randn(5, 2)
      nn.functional.mse_loss(ref(x), y):backward(); ropt:step(); ropt:zero_grad()
      nn.functional.mse_loss(dm(x), y):backward(); opt:step(); opt:zero_grad()
    end
    local sd = dm:state_dict()
    for k, v in pairs(ref:state_dict()) do H.close(H.flat(sd[k]), H.flat(v), 1e-6, mode .. ' ' .. k) end
    if mode == 'parameters' then
      H.eq(m[1].weight.device, 'meta', 'weights are away between steps')
      local before = em.no_grad(function() return dm(em.ones(1, 4)) end)
      H.close(H.flat(before), H.flat(ref(em.ones(1, 4)):detach()), 1e-6, 'an evaluation gathers them')
      H.eq(m[1].weight.device, 'meta', 'and frees them after')
    end
    -- dm:zero_grad() clears what the optimizer reads, as model:zero_grad() does
    nn.functional.mse_loss(dm(em.randn(5, 4)), em.randn(5, 2)):backward()
    H.check(dm:parameters()[1].grad ~= nil, mode .. ': shards get gradients')
    dm:zero_grad()
    for _, sh in ipairs(dm:parameters()) do H.check(sh.grad == nil, mode .. ': zero_grad') end
    local lay = dm:shard_layout()
    H.eq(#lay.params, 4)
    H.eq(lay.params[1].name, '1.weight')
    H.eq({ lay.params[1].lo, lay.params[1].hi }, { 0, 24 })
  end
end)

-- -- On N replicas ------------------------------------------------------------------------------

local function values(out, key)
  local list = {}
  for rank, a, b in out:gmatch('rank (%d+) ' .. key .. ' (%S+) ?(%S*)') do
    list[#list + 1] = { tonumber(rank), tonumber(a), tonumber(b) }
  end
  return list
end

local function trains(out, rc, n, tol, what)
  H.eq(rc, 0, what .. ': exit status\n' .. out)
  local diffs = values(out, 'maxdiff')
  H.eq(#diffs, n, what .. ': every replica reports\n' .. out)
  for _, d in ipairs(diffs) do H.check(d[2] <= tol, ('%s: rank %d maxdiff %g'):format(what, d[1], d[2])) end
  for _, g in ipairs(values(out, 'gradient_norm')) do
    H.check(math.abs(g[2] - g[3]) <= 1e-5 * g[3] + tol, ('%s: global norm %g vs %g'):format(
      what, g[2], g[3]))
  end
end

H.test('every mode on 1 to 4 replicas equals one model on the global batch', function()
  for _, mode in ipairs({ 'optimizer', 'gradients', 'parameters' }) do
    for _, opt in ipairs({ 'sgd', 'adam' }) do
      for n = 1, 4 do
        local out, rc = L.replicas(n, 'shard_train.lua', ('train %s %s unused'):format(mode, opt))
        trains(out, rc, n, 2e-6, ('%s %s x%d'):format(mode, opt, n))
      end
    end
  end
end)

H.test('bfloat16 gradients, and checkpointed blocks inside a sharded model', function()
  for _, mode in ipairs({ 'none', 'gradients', 'parameters' }) do
    local out, rc = L.replicas(2, 'shard_train.lua', 'train ' .. mode .. ' adam bf16')
    trains(out, rc, 2, 1e-3, mode .. ' bf16')
    H.check(values(out, 'maxdiff')[1][2] > 0, 'bfloat16 rounds (the path ran)')
  end
  for _, mode in ipairs({ 'optimizer', 'parameters' }) do
    local out, rc = L.replicas(3, 'shard_train.lua', 'train ' .. mode .. ' sgd ckpt')
    trains(out, rc, 3, 2e-6, mode .. ' checkpointed')
  end
end)

-- Each kind twice: the model's own accounting (dm:memory()) and the allocator's
-- count of what the kind added, on a model of ~1M parameters. Padding is under
-- one element per unit and replica, so 1 % is room enough, and a weight copy
-- kept gathered (4 MB) is four times the smallest kind. ZeRO 3's forward peak
-- tells whether it ever holds more than about one module's weights at once.
H.test('bytes per replica by kind match the ZeRO formulas', function()
  for _, n in ipairs({ 2, 4 }) do
    for _, mode in ipairs({ 'optimizer', 'gradients', 'parameters' }) do
      local out, rc = L.replicas(n, 'shard_train.lua', 'memory ' .. mode .. ' adam')
      H.eq(rc, 0, out)
      for _, source in ipairs({ 'memory', 'allocator' }) do
        local rows = 0
        for rank, kind, got, want in out:gmatch('rank (%d+) ' .. source .. ' (%a+) (%d+) (%d+)') do
          rows = rows + 1
          got, want = tonumber(got), tonumber(want)
          H.check(math.abs(got - want) <= 0.01 * want, ('%s x%d rank %s %s (%s): %d bytes, ' ..
            'formula %d'):format(mode, n, rank, kind, source, got, want))
        end
        H.eq(rows, 3 * n, ('%s x%d: every replica and kind (%s)\n%s'):format(mode, n, source, out))
      end
      if mode == 'parameters' then
        -- one module's weights at a time: gathered from the allgather's flat copy,
        -- freed after its forward (the activations are a tenth of a module)
        local rows = 0
        for rank, peak, largest, whole in out:gmatch('rank (%d+) forward_peak (%d+) largest (%d+) whole (%d+)') do
          rows = rows + 1
          peak, largest, whole = tonumber(peak), tonumber(largest), tonumber(whole)
          H.check(peak >= largest and peak <= 2.2 * largest, ('parameters x%d rank %s: the ' ..
            'forward holds %d bytes over the shards; a module is %d, the model %d'):format(n, rank,
            peak, largest, whole))
        end
        H.eq(rows, n, 'parameters x' .. n .. ': every replica\'s forward peak\n' .. out)
      end
    end
  end
end)

H.test('under mpirun', function()
  if not L.have_mpirun() then H.skip(L.no_mpirun_why) return end
  for _, mode in ipairs({ 'optimizer', 'gradients', 'parameters' }) do
    for n = 2, 4 do
      local out, rc = L.mpirun(n, 'shard_train.lua', 'train ' .. mode .. ' adam unused')
      trains(out, rc, n, 2e-6, ('mpirun %s x%d'):format(mode, n))
    end
  end
end)

H.test('on emulated GPU replicas, with and without offload', function()
  local env = 'EMBER_CUDA_EMULATE=2:64'
  local dev = '--devices cuda:0,cuda:1 ' .. dir .. 'dist/shard_train.lua'
  for _, mode in ipairs({ 'optimizer', 'gradients', 'parameters' }) do
    for _, flags in ipairs({ 'cuda', 'cuda,offload' }) do
      local out, rc = L.run(('%s %s --replicas 2 %s train %s adam %s'):format(env, ember, dev,
        mode, flags))
      trains(out, rc, 2, 2e-6, ('gpu %s %s'):format(mode, flags))
    end
  end
  local out, rc = L.run(('%s %s --replicas 2 %s memory gradients adam offload'):format(env, ember, dev))
  H.eq(rc, 0, out)
  H.check(out:find('rank 1 memory optimizer') ~= nil, out)
end)

H.done()

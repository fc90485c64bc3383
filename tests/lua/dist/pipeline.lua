-- pipeline.lua -- run by test_distribute_pipeline.lua under `ember --replicas N`,
-- mpirun and emulated GPU replicas: em.distribute.pipeline.
--   SCHED is gpipe, 1f1b or interleavedV (the interleaved schedule, virtual = V).
--   equiv SCHED P CHUNKS [BALANCE [SHARD]]  a pipeline of P stages (world P x D; BALANCE
--        '-': the default; SHARD: the stages' replicas shard so) against one
--        model trained on the whole batch: 3 Adam steps; each step compares the loss
--        and every gradient of this stage, then the parameters after the update.
--        Prints "rank R stage S lossdiff X graddiff Y maxdiff Z counts a,b,..".
--   bubble SCHED P CHUNKS TRACE  P (x V) pieces that each sleep 10 ms in forward and in
--        backward per micro-batch; one step, profiled, its trace written to TRACE,
--        then one that sleeps nowhere: prints "rank R bubble B step_s S next B2"
--        (pp:stats() of the two steps)
--   memory SCHED P CHUNKS   P stages of DEPTH linear layers, micro-batches of 64 rows:
--        prints "rank R peak BYTES activations BYTES depth DEPTH tensor BYTES" (the
--        step's peak, its part over what the stage held before the step, and the
--        bytes of one layer's output for one micro-batch)
--   errors P                 every bad setting, caught: "rank R case NAME: message"
--   save DIR [P [SHARD [SCHED]]]  P stages (default 2; world P x D, the stages' replicas
--        sharding with SHARD: 'optimizer', 'gradients', 'parameters' or 'none'; SCHED
--        default 1f1b): 2 Adam steps, then em.checkpoint.save
--   load DIR P [SHARD [SCHED]]    loads DIR into a P-stage pipeline (world P x D, sharded
--        so; SCHED default gpipe), runs a third step and compares with a model trained
--        3 steps (as equiv prints)
--   zero DIR SHARD            loads DIR into a data-parallel s:wrap(model, {shard = SHARD})
--        and compares its third step the same way
local mode = arg[1] or 'equiv'
local s = em.distribute.mirrored{ timeout = 60 }
local nn = em.nn
local R, N, dev = s.rank, s.world_size, s.device

-- the output times a buffer (checkpoints must carry it, from the last stage's file)
local Scale = nn.Module:extend('Scale')
function Scale:init(n) self:register_buffer('scale', em.ones(n)) end
function Scale:forward(x) return x * self.scale end
local function build(scale)
  em.manual_seed(7)
  local width = 8
  local m = nn.Sequential(nn.Linear(5, width), nn.Tanh(), nn.Linear(width, width), nn.ReLU(),
    nn.Linear(width, width), nn.Tanh(), nn.Linear(width, width), nn.Linear(width, 3), Scale(3))
  m[9].scale:copy_(em.tensor({ 1, scale or 2, 0.5 }))
  return m
end
local function mse(out, y) return ((out - y) ^ 2):mean() end
local function batch(step, B)
  em.manual_seed(100 + step)
  return em.randn(B, 5), em.randn(B, 3)
end
-- the model's named parameters: name -> tensor
local function by_name(m)
  local t = {}
  for _, np in ipairs(m:named_parameters()) do t[np[1]] = np[2] end
  return t
end
-- 'interleaved2' -> 'interleaved', 2
local function schedule_of(name)
  local v = name and tonumber(name:match('^interleaved(%d+)$'))
  if v then return 'interleaved', v end
  return name, nil
end
local function maxabs(a, b) return (a:to('cpu') - b:to('cpu')):abs():max():item() end
-- elements [lo, hi) of t flattened, on the CPU
local function part(t, lo, hi)
  return t:detach():to('cpu'):reshape(-1):narrow(1, lo + 1, hi - lo)
end
-- What this replica holds of each parameter (m:shard_layout(): a pipeline's or
-- a sharded model's), against the reference's parameters rp: the largest
-- difference of the gradients (when grads) or of the values.
local function held_diff(m, rp, grads)
  local d = 0
  for _, p in ipairs(m:shard_layout().params) do
    if p.hi > p.lo and p.shard.requires_grad then
      local mine, want = p.shard, rp[p.name]
      if grads then mine, want = mine.grad, want.grad end
      d = math.max(d, maxabs(part(mine, 0, p.hi - p.lo), part(want, p.lo, p.hi)))
    end
  end
  return d
end

if mode == 'equiv' or mode == 'load' or mode == 'save' then
  local sched, P, chunks = arg[2], tonumber(arg[3]), tonumber(arg[4])
  local balance = arg[5]
  local dir, shard = nil, arg[6]
  if balance == '-' then balance = nil end
  if mode == 'save' then
    dir, P, shard, sched, chunks = arg[2], tonumber(arg[3]) or 2, arg[4], arg[5] or '1f1b', 4
  end
  if mode == 'load' then dir, P, shard, sched, chunks = arg[2], tonumber(arg[3]), arg[4], arg[5] or 'gpipe', 4 end
  if mode ~= 'equiv' then
    balance = nil
    shard = shard ~= 'none' and shard or nil
  end
  local virtual
  sched, virtual = schedule_of(sched)
  if balance and balance:find(',') then
    local list = {}
    for c in balance:gmatch('%d+') do list[#list + 1] = tonumber(c) end
    balance = list
  end
  local D = N / P
  local B = 16
  local ref = build()
  -- a loaded pipeline starts from other buffers: the checkpoint's must replace them
  local pp = em.distribute.pipeline(build(mode == 'load' and 3 or 2), { stages = P, chunks = chunks, schedule = sched,
    virtual = virtual, balance = balance, sample = em.randn(4, 5), shard = shard })
  -- a stage of activations only (a balance may cut so) has nothing to update
  local opt = #pp:parameters() > 0 and em.optim.Adam(pp:parameters(), { lr = 1e-2 }) or
    { zero_grad = function() end, step = function() end }
  local ropt = em.optim.Adam(ref:parameters(), { lr = 1e-2 })
  local rp = by_name(ref)
  local lossdiff, graddiff, maxdiff, loaddiff = 0, 0, 0, nil
  local first_step = 1
  if mode == 'load' then
    -- the reference trains the two saved steps; the pipeline loads them
    for step = 1, 2 do
      local x, y = batch(step, B)
      ropt:zero_grad(); mse(ref(x), y):backward(); ropt:step()
    end
    em.checkpoint.load(dir, { model = pp, optimizer = opt })
    first_step = 3
  end
  -- the rows this replica's first module reads in a step: its data replica's share
  local first, seen = pp.parts[1][1], 0
  local forward = first.forward
  first.forward = function(self, x) seen = seen + x.shape[1]; return forward(self, x) end
  local last = mode == 'save' and 2 or 3
  for step = first_step, last do
    seen = 0
    local x, y = batch(step, B)
    ropt:zero_grad()
    local rl = mse(ref(x), y)
    rl:backward()
    opt:zero_grad()
    local loss = pp:step(x, y, mse)     -- the global batch: each data replica takes its rows
    lossdiff = math.max(lossdiff, math.abs(loss:item() - rl:item()))
    -- (a sharded stage's gradients are its shards')
    graddiff = math.max(graddiff, held_diff(pp, rp, true))
    opt:step(); ropt:step()
  end
  local stepped = seen                  -- (the forward below reads rows too)
  maxdiff = held_diff(pp, rp)
  -- and the whole stage: its tensors under the full model's names
  for name, t in pairs(pp:state_dict()) do
    maxdiff = math.max(maxdiff, maxabs(t, rp[name] or ref:state_dict()[name]))
  end
  if mode == 'save' then
    em.checkpoint.save(dir, { model = pp, optimizer = opt })
    print(('rank %d saved'):format(R))
    return
  end
  -- forward: the last stage's output on every replica
  local xe = batch(9, 6)
  local out = pp:forward(xe)
  local fdiff = maxabs(out, ref(xe):detach())
  local counts = table.concat(pp.counts, ',')
  print(('rank %d stage %d lossdiff %.3g graddiff %.3g maxdiff %.3g forward %.3g device %s ' ..
    'counts %s rows %d share %d'):format(R, pp.stage, lossdiff, graddiff, maxdiff, fdiff, dev,
    counts, stepped, B / D))
  return
end

-- clip SCHED P CHUNKS [SHARD]: one step of a pipeline (world P x D, stages sharded
-- so) and of one model on the whole batch, then clip_grad_norm(params, 0.01) on
-- each: prints "rank R clip REF PIPE graddiff G" (the two norms returned, and the
-- largest difference of this replica's clipped gradients from the model's).
if mode == 'clip' then
  local sched, P, chunks, shard = arg[2], tonumber(arg[3]), tonumber(arg[4]), arg[5]
  local virtual
  sched, virtual = schedule_of(sched)
  local D, B = N / P, 16
  local ref = build()
  -- (batch = 'share': each data replica passes its own rows, cut here by hand)
  local pp = em.distribute.pipeline(build(), { stages = P, chunks = chunks, schedule = sched,
    virtual = virtual, sample = em.randn(4, 5), shard = shard, batch = 'share' })
  local x, y = batch(1, B)
  mse(ref(x), y):backward()
  local per = B / D
  local d = pp.data_index
  pp:step(x:narrow(1, d * per + 1, per), y:narrow(1, d * per + 1, per), mse)
  local rn = em.nn.utils.clip_grad_norm(ref:parameters(), 0.01)
  local pn = em.optim.clip_grad_norm(pp:parameters(), 0.01)
  print(('rank %d clip %.17g %.17g graddiff %.3g'):format(R, rn, pn,
    held_diff(pp, by_name(ref), true)))
  return
end

if mode == 'zero' then
  local dir, smode, B = arg[2], arg[3], 16
  local ref = build()
  local ropt = em.optim.Adam(ref:parameters(), { lr = 1e-2 })
  for step = 1, 2 do
    local x, y = batch(step, B)
    ropt:zero_grad(); mse(ref(x), y):backward(); ropt:step()
  end
  local dm = s:wrap(build(3), { shard = smode })
  local opt = em.optim.Adam(dm:parameters(), { lr = 1e-2 })
  em.checkpoint.load(dir, { model = dm, optimizer = opt })
  local rp = by_name(ref)
  local x, y = batch(3, B)
  ropt:zero_grad()
  local rl = mse(ref(x), y)
  rl:backward()
  local per = B / N
  opt:zero_grad()
  local loss = mse(dm(x:narrow(1, R * per + 1, per)), y:narrow(1, R * per + 1, per))
  loss:backward()
  local lt = s:allreduce(loss:detach():reshape({ 1 }):to(dev), 'sum'):to('cpu')
  local lossdiff = math.abs(lt[1] / N - rl:item())
  local graddiff = held_diff(dm, rp, true)
  opt:step(); ropt:step()
  local maxdiff = held_diff(dm, rp)
  for name, t in pairs(dm:state_dict()) do
    maxdiff = math.max(maxdiff, maxabs(t, rp[name] or ref:state_dict()[name]))
  end
  local xe = batch(9, 6)
  local out = em.no_grad(function() return dm(xe) end)
  print(('rank %d stage 0 lossdiff %.3g graddiff %.3g maxdiff %.3g forward %.3g device %s'):format(
    R, lossdiff, graddiff, maxdiff, maxabs(out, ref(xe):detach()), dev))
  return
end

-- the linear layers per stage of `memory`
local DEPTH = 32
if mode == 'bubble' or mode == 'memory' then
  local sched, P, chunks = arg[2], tonumber(arg[3]), tonumber(arg[4])
  local virtual
  sched, virtual = schedule_of(sched)
  local V = virtual or 1
  local model
  local napping = true
  if mode == 'bubble' then
    local ffi = require 'ffi'
    pcall(ffi.cdef, 'int usleep(unsigned int usec);')
    -- 10 ms per chunk: the formula holds for any equal cost, and a longer
    -- one leaves the ops' own overhead a smaller share
    local function nap() if napping then ffi.C.usleep(10000) end end
    local Sleep = nn.Module:extend('Sleep')
    function Sleep:forward(x)
      nap()
      return em.autograd.apply('sleep', x:detach():clone(), { x }, function(g) nap(); return { g } end)
    end
    local kids = {}
    for k = 1, P * V do kids[k] = Sleep() end
    kids[1] = nn.Sequential(nn.Linear(4, 4), Sleep())
    model = nn.Sequential(kids)
  else
    -- a chain of linear layers: each keeps its input for the backward, so a
    -- micro-batch in flight holds DEPTH tensors on a stage and leaves no
    -- garbage in its forward
    em.manual_seed(1)
    local kids = {}
    for k = 1, P * DEPTH do kids[k] = nn.Linear(256, 256) end
    model = nn.Sequential(kids)
  end
  local pp = em.distribute.pipeline(model, { stages = P, chunks = chunks, schedule = sched,
    virtual = virtual })
  local width = mode == 'bubble' and 4 or 256
  local rows = mode == 'bubble' and chunks or chunks * 64
  local x, y = em.randn(rows, width), em.randn(rows, width)
  local function mse_(o, t) return ((o - t) ^ 2):mean() end
  if mode == 'bubble' then
    -- the first step under the profiler: it sends the activations' headers too
    s:barrier()
    em.profile.start { trace = arg[5] }
    pp:step(x, y, mse_)
    em.profile.step()
    em.profile.stop()
    local st = pp:stats()
    -- and a step that sleeps nowhere: its figure is its own, whatever the last
    -- step waited
    napping = false
    pp:step(x, y, mse_)
    print(('rank %d bubble %.9f step_s %.9f next %.9f'):format(R, st.bubble, st.step_s,
      pp:stats().bubble))
    return
  end
  local base
  for _ = 1, 2 do
    em.collect()
    base = em.memory_stats().allocated
    pp:step(x, y, mse_)
  end
  local st = pp:stats()
  -- the step's peak over what was held before it: the micro-batches in flight
  print(('rank %d peak %d activations %d depth %d tensor %d'):format(R, st.peak_bytes,
    st.peak_bytes - base, DEPTH, 64 * 256 * 4))
  return
end

if mode == 'errors' then
  local P = tonumber(arg[2])
  local function case(name, fn)
    local ok, e = pcall(fn)
    print(('rank %d case %s: %s'):format(R, name, ok and 'no error' or tostring(e)))
  end
  local m = build()
  case('chunks', function()
    local pp = em.distribute.pipeline(m, { stages = P, chunks = 5 })
    pp:step(em.randn(4, 5), em.randn(4, 3), mse)
  end)
  case('stages', function() em.distribute.pipeline(m, { stages = 10 }) end)
  case('divisible', function() em.distribute.pipeline(m, { stages = 3 }) end)
  case('balance', function() em.distribute.pipeline(m, { stages = P, balance = { 3, 4 } }) end)
  case('balance_len', function() em.distribute.pipeline(m, { stages = P, balance = { 8 } }) end)
  case('schedule', function() em.distribute.pipeline(m, { stages = P, schedule = 'zigzag' }) end)
  case('option', function() em.distribute.pipeline(m, { stages = P, chunk = 2 }) end)
  case('sequential', function() em.distribute.pipeline(nn.Linear(3, 3), { stages = P }) end)
  case('sample', function() em.distribute.pipeline(m, { stages = P, balance = 'time' }) end)
  case('multiple', function()
    em.distribute.pipeline(m, { stages = P, chunks = 3, schedule = 'interleaved' })
  end)
  case('virtual', function() em.distribute.pipeline(m, { stages = P, virtual = 2 }) end)
  case('virtual_int', function()
    em.distribute.pipeline(m, { stages = P, schedule = 'interleaved', virtual = 0 })
  end)
  case('pieces', function()
    em.distribute.pipeline(m, { stages = P, schedule = 'interleaved', virtual = 5 })
  end)
  case('balance_pieces', function()
    em.distribute.pipeline(m, { stages = P, schedule = 'interleaved', balance = { 4, 5 } })
  end)
  case('batch', function() em.distribute.pipeline(m, { stages = P, batch = 'local' }) end)
  case('uneven', function()     -- one stage, two data replicas: 5 rows do not split in two
    local pp = em.distribute.pipeline(build(), { stages = 1, chunks = 1 })
    pp:step(em.randn(5, 5), em.randn(5, 3), mse)
  end)
  -- after all of that, a pipeline still works
  local pp = em.distribute.pipeline(build(), { stages = P, chunks = 2 })
  local l = pp:step(em.randn(4, 5), em.randn(4, 3), mse)
  print(('rank %d after errors loss %s'):format(R, tostring(l:item() == l:item())))
  return
end
error('pipeline.lua: unknown mode ' .. tostring(mode))

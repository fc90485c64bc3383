--[[
ember.distribute.plan.time -- the planner's clock: each child's forward and
backward seconds, measured on the real device at one batch, and the link's
bandwidth.

Children are timed one at a time, on inputs of the shape the previous child
produced (random floats; ones for integer inputs such as token ids), the best
of a few runs after a warm-up. Identical children (same class, parameter shapes
and input shape) are timed once. The model's own parameters are used as they
are; their gradients are dropped after.

With a strategy only replica 0 times (the others wait in agree's broadcast
and take its times): replicas timing at once on shared cores would slow each
other down, and two layouts of near-equal time could come out in another order
on another replica. What all replicas running at once costs is share()'s
factor; what each collective costs beyond its bytes, latency()'s.

The bandwidth: with a strategy of several replicas, the time of an allreduce of
up to 4 MiB -- less when the device's memory cap leaves less room -- (every
replica must plan: it is a collective), as bus bytes 2(N-1)/N x
size per second. Without one, DEFAULT_BANDWIDTH, an assumed figure for a
host's shared memory.
]]
local em = require 'ember'

local M = {}

M.DEFAULT_BANDWIDTH = 5e9
M.RUNS = 3

local function key_of(c, shape, dtype)
  local parts = { tostring(c.__name), table.concat(shape, 'x'), dtype }
  for _, np in ipairs(c:named_parameters()) do
    parts[#parts + 1] = np[1] .. ':' .. table.concat(np[2].shape, 'x')
  end
  return table.concat(parts, ';')
end

local function input(shape, dtype, device)
  if dtype == 'float32' or dtype == 'float64' or dtype == 'float16' or dtype == 'bfloat16' then
    return em.randn(shape, { dtype = dtype, device = device })
  end
  return em.ones(shape, { dtype = dtype, device = device })
end

local function sync(device)
  if device ~= 'cpu' then em.cuda.synchronize(tonumber(device:match(':(%d+)$')) or 0) end
end

-- One child at one input: (forward seconds, backward seconds, output shape and dtype).
local function time_child(c, shape, dtype, device, runs)
  local f, b = math.huge, math.huge
  local out_shape, out_dtype
  for r = 0, runs do
    local x = input(shape, dtype, device)
    if x:is_floating_point() then x:requires_grad_() end
    local t0 = em.clock()
    local y = c(x)
    sync(device)
    local t1 = em.clock()
    y:backward(em.ones(y.shape, { dtype = y.dtype, device = device }))
    sync(device)
    local t2 = em.clock()
    if r > 0 then f, b = math.min(f, t1 - t0), math.min(b, t2 - t1) end
    out_shape, out_dtype = y.shape, y.dtype
    for _, p in ipairs(c:parameters()) do p.grad = nil end
  end
  return f, b, out_shape, out_dtype
end

-- o = {input = {shape, dtype}, batch, device, runs, cache}; children: the list
-- of modules run in order (a model that is no Sequential: itself alone).
-- Returns {fwd, bwd, fwd_i, bwd_i, batch}.
function M.children(children, o)
  local cache = o.cache or {}
  local shape, dtype = { unpack(o.input.shape) }, o.input.dtype or 'float32'
  shape[1] = o.batch
  local t = { fwd = 0, bwd = 0, fwd_i = {}, bwd_i = {}, batch = o.batch }
  for i, c in ipairs(children) do
    local key = key_of(c, shape, dtype)
    local m = cache[key]
    if not m then
      local f, b, sh, dt = time_child(c, shape, dtype, o.device or 'cpu', o.runs or M.RUNS)
      m = { fwd = f, bwd = b, shape = sh, dtype = dt }
      cache[key] = m
    end
    t.fwd_i[i], t.bwd_i[i] = m.fwd, m.bwd
    t.fwd, t.bwd = t.fwd + m.fwd, t.bwd + m.bwd
    shape, dtype = m.shape, m.dtype
  end
  return t
end

-- Times without running anything: seconds proportional to each child's weights
-- (plan{time = false}, and a device too full to time a child).
function M.estimate(children, batch)
  local t = { fwd = 0, bwd = 0, fwd_i = {}, bwd_i = {}, batch = batch }
  for i, c in ipairs(children) do
    local w = 0
    for _, p in ipairs(c:parameters()) do w = w + p:numel() * p:element_size() end
    t.fwd_i[i], t.bwd_i[i] = w * 1e-10, 2 * w * 1e-10
    t.fwd, t.bwd = t.fwd + w * 1e-10, t.bwd + 2 * w * 1e-10
  end
  return t
end

-- Every replica takes replica 0's times (a broadcast; see above).
function M.agree(t, s)
  if not s or s.world_size < 2 then return t end
  local n = #t.fwd_i
  local v = {}
  for i = 1, n do v[i], v[n + i] = t.fwd_i[i], t.bwd_i[i] end
  v = s:broadcast(em.tensor(v, { dtype = 'float64', device = s.device }), 0):to('cpu'):totable()
  t.fwd, t.bwd = 0, 0
  for i = 1, n do
    t.fwd_i[i], t.bwd_i[i] = v[i], v[n + i]
    t.fwd, t.bwd = t.fwd + v[i], t.bwd + v[n + i]
  end
  return t
end

-- Bytes per second over the strategy's link (see above), or the default.
function M.bandwidth(s)
  if not s or s.world_size < 2 then return M.DEFAULT_BANDWIDTH, 'assumed' end
  local n = 2 ^ 20
  local ms = em.memory_stats(s.device)
  if ms.capacity and ms.capacity > 0 then
    -- a quarter of what the cap leaves, at least 64 KiB (the figure of a
    -- smaller message would be mostly latency)
    n = math.max(2 ^ 14, math.min(n, math.floor((ms.capacity - ms.allocated) / 16)))
  end
  -- (the replicas' free memory differs: all take the smallest size)
  n = s:allreduce(em.tensor({ n }, { dtype = 'float64', device = s.device }), 'min'):item()
  local t = em.zeros(n, { device = s.device })
  s:allreduce(t, 'sum')              -- warm-up (and connection set-up)
  local best = math.huge
  for _ = 1, M.RUNS do
    local t0 = em.clock()
    s:allreduce(t, 'sum')
    best = math.min(best, em.clock() - t0)
  end
  -- every replica must agree: the slowest one's figure
  local worst = s:allreduce(em.tensor({ best }, { dtype = 'float64', device = s.device }), 'max'):item()
  local N = s.world_size
  return 2 * (N - 1) / N * n * 4 / math.max(worst, 1e-9), 'measured'
end

-- Seconds of one collective too small for its bytes to count (one float's
-- allreduce): what every collective and point-to-point message costs on top of
-- its bytes. The slowest replica's best of a few; DEFAULT_LATENCY without a
-- strategy of several replicas.
M.DEFAULT_LATENCY = 20e-6
function M.latency(s)
  if not s or s.world_size < 2 then return M.DEFAULT_LATENCY end
  local t = em.zeros(1, { device = s.device })
  s:allreduce(t, 'sum')
  local best = math.huge
  for _ = 1, 2 * M.RUNS do
    local t0 = em.clock()
    s:allreduce(t, 'sum')
    best = math.min(best, em.clock() - t0)
  end
  return s:allreduce(em.tensor({ best }, { dtype = 'float64', device = s.device }), 'max'):item()
end

-- The CPU cores online.
function M.cores() return require('ember.ffi').cpu_count() end

-- How much slower a replica computes when all N run at once than the one
-- timed alone: on CPU replicas of one host the N x threads share the cores
-- (max(1, N x threads / cores)); on accelerators, 1.
function M.share(N, device)
  if device ~= 'cpu' or N < 2 then return 1 end
  local c = M.cores()
  if not c then return 1 end
  return math.max(1, N * em.get_num_threads() / c)
end

-- The planner's times: the children's at every per-replica batch and
-- micro-batch a layout of list runs (a small batch costs more per row than a
-- share of a big one's time) for the global batch B over N devices, with the
-- link's bandwidth and latency and the replicas' share of the cores. Returns
-- times by batch, how they were had, and the bandwidth and how it was had.
function M.for_layouts(children, list, B, o, N)
  local sizes, seen = {}, {}
  for _, l in ipairs(list) do
    local b = B / (l.data * (l.pipeline > 1 and l.chunks or 1))
    if not seen[b] then seen[b] = true; sizes[#sizes + 1] = b end
  end
  table.sort(sizes)
  local base_shape = { shape = o.input.shape, dtype = o.input.dtype }
  local device = children[1]:parameters()[1] and children[1]:parameters()[1].device or 'cpu'
  local time_how = o.time == false and 'estimated' or 'measured'
  local times, time_cache = {}, {}
  local s = o.strategy
  for _, b in ipairs(sizes) do
    local t
    if o.time == false then
      t = M.estimate(children, b)
    elseif s and s.world_size > 1 and s.rank ~= 0 then
      -- replica 0 times alone (the others wait in agree's broadcast): replicas
      -- timing at once on shared cores would slow each other down
      t = M.estimate(children, b)
    else
      local ok, res = pcall(M.children, children, { input = base_shape, batch = b,
                                                    device = device, cache = time_cache })
      -- a device too full to run one child beside the whole model still gets its
      -- memory answer (which then says what does not fit): times from the weights
      if ok then t = res
      elseif tostring(res):find('out of memory', 1, true) then
        t, time_how = M.estimate(children, b), 'estimated (timing ran out of memory)'
      else error(res, 0) end
    end
    if o.time ~= false then M.agree(t, s) end
    times[b] = t
  end
  local bw, bw_how = M.bandwidth(s)
  local lat = M.latency(s)
  local share = M.share(N, device)
  for _, t in pairs(times) do t.bandwidth, t.latency, t.share = bw, lat, share end
  return times, time_how, bw, bw_how
end

return M

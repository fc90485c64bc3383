--[[
ember.profile.projection -- the report's scaling projection (r.projection,
r:project{replicas, gbps, latency_us, mode}): the measured step carried to N
replicas, in every sharding mode.

The projection (M.project) models data-parallel steps at N replicas from the
measured step: compute c (the step less its exposed communication), gradient
bytes G per step in k allreduces, bus bandwidth B and per-allreduce latency a:
  allreduce(N) = k*a + 2(N-1)/N * G / B                 (ring / Rabenseifner)
  no overlap:   c + allreduce(N)
  overlap:      c + max(allreduce(N) - backward, allreduce(N) / k)
(overlap hides communication under backward, except at least the last bucket).
Scaling efficiency = c / step(N): the share of ideal N-fold throughput.

The sharded modes move other bytes. Per replica and step, with f = (N-1)/N,
gradient bytes G and parameter bytes P of the whole model (ring collectives):
  plain       allreduce of the gradients               2f*G
  optimizer   allreduce, then allgather of the
              updated parameter shards                 2f*G + f*P
  gradients   reduce-scatter, then allgather           f*G + f*P
  parameters  allgather in forward and again in
              backward, reduce-scatter of gradients    2f*P + f*G
The gradient collectives overlap backward as above; the allgather after the
update waits (nothing is left to hide it); the forward allgather of
'parameters' hides under forward (the step less backward), except at least the
last unit. Each unit or bucket costs a latency per collective. Memory per
replica by mode, with optimizer state O = state_ratio * P (2P for Adam, P for
SGD with momentum) and gradients as large as the parameters:
  plain P + G + O,  optimizer P + G + O/N,  gradients P + (G + O)/N,
  parameters (P + G + O)/N,  each plus the activations measured (the same in
every mode). For float32 Adam: 16, 8 + 8/N, 4 + 12/N and 16/N bytes per parameter.
]]
local M = {}

M.DEFAULT_LATENCY_S = 20e-6
M.ASSUMED_GBPS = 10      -- GB/s, when no communicator was measured and none given

M.MODES = { 'plain', 'optimizer', 'gradients', 'parameters' }
M.MODE_LABEL = { plain = 'plain', optimizer = 'optimizer (ZeRO-1)',
                 gradients = 'gradients (ZeRO-2)', parameters = 'parameters (ZeRO-3)' }
local is_mode = { plain = true, optimizer = true, gradients = true, parameters = true }

-- Bytes one replica sends per step in `mode` at n replicas: {grad, after, forward}
-- (the collectives during backward, after the update, during forward) and the
-- number of collectives per unit in each.
function M.traffic(mode, n, grad_bytes, param_bytes)
  local t = { grad = 0, after = 0, forward = 0, grad_n = 1, after_n = 0, forward_n = 0 }
  if n > 1 then
    local f, G, P = (n - 1) / n, grad_bytes, param_bytes
    if mode == 'plain' then
      t.grad = 2 * f * G
    elseif mode == 'optimizer' then
      t.grad, t.after, t.after_n = 2 * f * G, f * P, 1
    elseif mode == 'gradients' then
      t.grad, t.after, t.after_n = f * G, f * P, 1
    else
      t.forward, t.forward_n = f * P, 1
      t.grad, t.grad_n = f * P + f * G, 2
    end
  end
  t.total = t.grad + t.after + t.forward
  return t
end

-- Bytes per replica by kind in `mode` at n replicas (see the formulas above).
function M.memory(mode, n, param_bytes, state_ratio, activations)
  local P = param_bytes
  local G, O = P, P * (state_ratio or 0)
  local m = { parameters = P, gradients = G, optimizer = O, activations = activations or 0 }
  if mode == 'optimizer' then m.optimizer = O / n
  elseif mode == 'gradients' then m.gradients, m.optimizer = G / n, O / n
  elseif mode == 'parameters' then
    m.parameters, m.gradients, m.optimizer = P / n, G / n, O / n
  end
  m.total = m.parameters + m.gradients + m.optimizer + m.activations
  return m
end

-- o: replicas (number or list), gbps (GB/s bus bandwidth), latency_us, mode (the
-- one the rows' own fields describe; the measured run's by default); base: the
-- measured figures {compute_s, backward_s, grad_bytes, buckets, gbps, latency_s,
-- param_bytes, state_ratio, activations, mode}.
function M.project(base, o)
  o = o or {}
  local gbps = o.gbps or base.gbps
  local measured = o.gbps == nil and base.gbps ~= nil
  gbps = gbps or M.ASSUMED_GBPS
  local lat = o.latency_us and o.latency_us * 1e-6 or base.latency_s or M.DEFAULT_LATENCY_S
  local k = math.max(1, base.buckets or 1)
  local mode = o.mode or base.mode or 'plain'
  if not is_mode[mode] then
    error(("profile.project: unknown mode '%s' (plain, optimizer, gradients, " ..
      "parameters)"):format(tostring(mode)), 3)
  end
  local G = base.grad_bytes
  local P = base.param_bytes and base.param_bytes > 0 and base.param_bytes or G
  local c, bwd = base.compute_s, base.backward_s
  local fwd = math.max(c - bwd, 0)
  local function time(bytes, count)
    return bytes > 0 and count * k * lat + bytes / (gbps * 1e9) or 0
  end
  local function mode_row(m, n)
    local t = M.traffic(m, n, G, P)
    local tg, ta, tf = time(t.grad, t.grad_n), time(t.after, t.after_n),
                       time(t.forward, t.forward_n)
    local with = c + (tg > 0 and math.max(tg - bwd, tg / k) or 0) + ta +
                 (tf > 0 and math.max(tf - fwd, tf / k) or 0)
    local without = c + tg + ta + tf
    return { mode = m, step_s = with, step_s_no_overlap = without, comm_s = tg + ta + tf,
             traffic_bytes = t.total, traffic = t,
             efficiency = with > 0 and c / with or 1,
             efficiency_no_overlap = without > 0 and c / without or 1,
             memory = M.memory(m, n, P, base.state_ratio, base.activations) }
  end
  local function row(n)
    local r = { replicas = n, modes = {} }
    for _, m in ipairs(M.MODES) do r.modes[m] = mode_row(m, n) end
    for key, v in pairs(r.modes[mode]) do r[key] = v end
    r.allreduce_s = r.modes.plain.comm_s
    r.memory_bytes = r.memory.total
    return r
  end
  local ns = o.replicas or { 2, 4, 8, 16 }
  local single = type(ns) == 'number'
  if single then ns = { ns } end
  local rows = {}
  for i, n in ipairs(ns) do
    if type(n) ~= 'number' or n < 1 or n ~= math.floor(n) then
      error('profile.project: replicas must be whole numbers >= 1, got ' .. tostring(n), 3)
    end
    rows[i] = row(n)
  end
  local p = { gbps = gbps, measured = measured, latency_s = lat, grad_bytes = base.grad_bytes,
              buckets = k, compute_s = base.compute_s, rows = rows, mode = mode,
              param_bytes = P, state_ratio = base.state_ratio or 0,
              activations = base.activations or 0, modes = M.MODES }
  if single then
    for key, v in pairs(rows[1]) do p[key] = v end
  end
  return p
end

return M

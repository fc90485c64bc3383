--[[
ember.profile.report_text -- the report as text (r:lines(), and so r:print() and
tostring(r)): step time, breakdown, pipeline, memory by kind beside the
prediction, replicas, top ops, the diagnosis and the scaling projection table.
]]
local projection = require 'ember.profile.projection'

local M = {}

local function pct(x) return string.format('%.0f%%', x * 100) end

local function bytes_str(b)
  if b >= 1e9 then return string.format('%.2f GB', b / 1e9) end
  if b >= 1e6 then return string.format('%.1f MB', b / 1e6) end
  return string.format('%.1f KB', b / 1e3)
end

-- "parameters 1.2 MB, gradients ..., optimizer ..., activations ...[, other ...]; peak ..."
-- (other: what was held before the step beyond the three, a dataset in memory)
local function kinds_str(m)
  local other = (m.other or 0) > 0 and ', other ' .. bytes_str(m.other) or ''
  return string.format('parameters %s, gradients %s, optimizer %s, activations %s%s; peak %s',
    bytes_str(m.parameters or 0), bytes_str(m.gradients or 0), bytes_str(m.optimizer or 0),
    bytes_str(m.activations or 0), other, bytes_str(m.peak or 0))
end

-- ", bubble 12%" where the breakdown has a pipeline bubble.
local function bubble_str(b) return b.bubble and (', bubble ' .. pct(b.bubble)) or '' end

-- "measured 1.2 MB, predicted 1.1 MB (+9%)" when a prediction was given.
local function predicted_str(measured, predicted)
  if not predicted then return nil end
  local rel = predicted > 0 and measured and
    string.format(' (%+.0f%%)', (measured - predicted) / predicted * 100) or ''
  return string.format('peak %s measured, %s predicted%s', bytes_str(measured or 0),
    bytes_str(predicted), rel)
end

-- "stage 0 of 2, 4 chunks, 1f1b: bubble 30% (formula 20%)"
local function pipeline_str(pl)
  local v = pl.virtual or 1
  return string.format('stage %d of %d, %d chunks, %s%s: bubble %s of the pipeline step ' ..
    '(formula %s: %s)', pl.stage, pl.stages, pl.chunks, pl.schedule,
    v > 1 and string.format(' x%d', v) or '', pct(pl.bubble),
    v > 1 and '(p-1)/(v m+p-1)' or '(p-1)/(m+p-1)', pct(pl.expected))
end

function M.lines(self)
  local L = {}
  local function add(...) L[#L + 1] = string.format(...) end
  add('ember profile: %d step%s, %.2f ms per step%s', self.steps, self.steps == 1 and '' or 's',
      self.step_s * 1e3, #self.replicas > 1 and (', ' .. #self.replicas .. ' replicas') or '')
  if self.steps_counted then add('  steps: %s', self.steps_counted) end
  local b = self.breakdown
  add('  breakdown: compute %s, host %s, input %s, communication %s%s', pct(b.compute),
      pct(b.host), pct(b.input), pct(b.communication), bubble_str(b))
  if #self.replicas <= 1 and self.pipeline then
    add('  pipeline: %s', pipeline_str(self.pipeline))
  end
  add('  %d ops per step, %.1f µs per op on average', math.floor(self.ops_per_step + 0.5),
      self.mean_op_us)
  local dts = {}
  for _, x in ipairs(self.dtype_share or {}) do dts[#dts + 1] = x.dtype .. ' ' .. pct(x.share) end
  if #dts > 0 then add('  compute by dtype: %s', table.concat(dts, ', ')) end
  local mem = {}
  for dev, v in pairs(self.peak_bytes or {}) do mem[#mem + 1] = dev .. ' ' .. bytes_str(v) end
  table.sort(mem)
  if #mem > 0 then add('  peak memory: %s', table.concat(mem, ', ')) end
  if #self.replicas > 1 then
    add('  memory per replica by kind (the step with the highest peak):')
    for _, x in ipairs(self.replicas) do
      if x.memory then add('    rank %d: %s', x.rank, kinds_str(x.memory)) end
      local pr = predicted_str(x.peak_bytes, x.expected_peak_bytes)
      if pr then add('    rank %d: %s', x.rank, pr) end
    end
  else
    if self.memory then add('  memory by kind: %s', kinds_str(self.memory)) end
    local pr = predicted_str(self.measured_peak_bytes, self.expected_peak_bytes)
    if pr then add('  memory: %s', pr) end
  end
  if #self.replicas > 1 then
    add('  replicas:')
    for _, x in ipairs(self.replicas) do
      add('    rank %d: %.2f ms per step; compute %s, host %s, input %s, communication %s ' ..
          '(%.2f ms waiting for peers)%s', x.rank, x.step_s * 1e3, pct(x.breakdown.compute),
          pct(x.breakdown.host), pct(x.breakdown.input), pct(x.breakdown.communication),
          x.wait_s * 1e3, bubble_str(x.breakdown))
      if x.pipeline then add('      pipeline %s', pipeline_str(x.pipeline)) end
    end
  end
  if #self.top_ops > 0 then
    add('  top ops:')
    add('    %-24s %8s %11s %10s', 'op', 'calls', 'total ms', 'mean µs')
    for i = 1, math.min(10, #self.top_ops) do
      local o = self.top_ops[i]
      add('    %-24s %8d %11.2f %10.1f', o.name, o.calls, o.total_s * 1e3, o.mean_us)
    end
  end
  add('  diagnosis:')
  for _, d in ipairs(self.diagnosis) do add('    [%s] %s', d.kind, d.message) end
  local p = self.projection
  if p then
    add('  scaling projection (%s of gradients and %s of parameters per step, %d bucket%s, ' ..
        '%.2f GB/s %s; this run: %s):', bytes_str(p.grad_bytes), bytes_str(p.param_bytes or 0),
        math.floor(p.buckets + 0.5), math.floor(p.buckets + 0.5) == 1 and '' or 's', p.gbps,
        p.measured and 'measured' or 'assumed; pass gbps= to project{}',
        projection.MODE_LABEL[p.mode] or tostring(p.mode))
    add('    %8s  %-20s %9s %11s %10s %14s %14s', 'replicas', 'mode', 'step ms',
        'no overlap', 'efficiency', 'sent/replica', 'memory/replica')
    for _, row in ipairs(p.rows) do
      for _, m in ipairs(projection.MODES) do
        local x = row.modes and row.modes[m]
        if x then
          add('    %8d  %-20s %9.2f %11.2f %10s %14s %14s', row.replicas,
              (projection.MODE_LABEL[m] or m) .. (m == p.mode and ' *' or ''), x.step_s * 1e3,
              x.step_s_no_overlap * 1e3, pct(x.efficiency), bytes_str(x.traffic_bytes),
              bytes_str(x.memory.total))
        end
      end
    end
    add('    (* this run\'s mode; memory: parameters, gradients, optimizer state and the ' ..
        'activations measured)')
  end
  if (self.dropped or 0) > 0 then
    add('  note: %d events were dropped (buffers full); the figures undercount', self.dropped)
  end
  if self.trace then add('  trace: %s (open in https://ui.perfetto.dev or chrome://tracing)', self.trace) end
  if self.html then add('  page:  %s', self.html) end
  return L
end

return M

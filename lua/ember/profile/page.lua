--[[
ember.profile.page -- the profiler's report as one self-contained HTML page.

  local page = require 'ember.profile.page'
  local html = page.render(report, timeline)       -- a string
  local ok, err = page.write(path, report, timeline)  -- true, or nil and a message

The page needs nothing but itself: inline CSS and SVG drawn here in Lua, no
script, no font, no image, no link; a Content-Security-Policy forbids any fetch
on top of that. Every string that comes from the report (op names, track names,
device names, diagnosis messages) is escaped, `:` and `/` included, so that
nothing in the page's source can read as a URL.

It shows, top to bottom:
  - a header: steps, mean step time, replicas, peak memory per device;
  - the diagnosis, one card per entry with its kind as a coloured badge;
  - the step breakdown per replica as stacked horizontal bars (input, compute,
    communication, host, idle), with a legend and a table of percentages;
  - memory per replica by kind as stacked bars and a table (page_memory.lua);
  - a timeline of a few steps (page_timeline.lua);
  - the top ops as a table with an inline bar of their share of the step;
  - the scaling projection as a table, with the bandwidth it assumed, and for
    each replica count every sharding mode's step time, bytes sent and memory
    per replica, to choose a mode by.

report and timeline are the profiler's (see ember.profile); any field may be
missing, the page then says so instead of failing. Escaping, number formats,
colours and the style sheet are html.lua's.
]]
local M = {}

local fmt, concat, floor = string.format, table.concat, math.floor

local H = require 'ember.profile.html'
M.MAX_EVENTS = H.MAX_EVENTS
M.escape = H.esc
local W = H.W
local esc = H.esc
local isnum = H.isnum
local DASH = H.DASH
local num = H.num
local int = H.int
local ms = H.ms
local pct = H.pct
local bytes = H.bytes
local clip = H.clip
local PARTS = H.PARTS
local PART_COLOR = H.PART_COLOR
local EXTRA_COLORS = H.EXTRA_COLORS
local DARK_TEXT = H.DARK_TEXT
local KIND_COLOR = H.KIND_COLOR
local KIND_OTHER = H.KIND_OTHER
local css = H.css
local pipeline_table     -- below the breakdown (defined after parts_of)
local timeline_section = require 'ember.profile.page_timeline'
local memory_section = require 'ember.profile.page_memory'

-- -- Sections ---------------------------------------------------------------------------

local function sorted_keys(t)
  local keys = {}
  for k in pairs(t) do keys[#keys + 1] = k end
  table.sort(keys, function(a, b) return tostring(a) < tostring(b) end)
  return keys
end

local function stat(out, value, label)
  out[#out + 1] = fmt('<div class="stat"><b>%s</b><small>%s</small></div>', value, label)
end

local function header(out, r)
  local nrep = type(r.replicas) == 'table' and #r.replicas or 0
  out[#out + 1] = '<header><h1><span>ember</span> profile</h1>'
  out[#out + 1] = fmt('<p class="sub">%s steps profiled%s</p>', int(r.steps),
    isnum(r.ops_per_step) and fmt(', %s ops per step', int(r.ops_per_step)) or '')
  out[#out + 1] = '<div class="stats">'
  stat(out, int(r.steps), 'steps')
  stat(out, ms(r.step_s) .. ' ms', 'mean step time')
  stat(out, int(nrep > 0 and nrep or 1), nrep > 0 and 'replicas' or 'replica (one process)')
  local peaks = type(r.peak_bytes) == 'table' and r.peak_bytes or {}
  local keys = sorted_keys(peaks)
  for _, dev in ipairs(keys) do
    stat(out, bytes(peaks[dev]), 'peak memory &middot; ' .. esc(dev))
  end
  if #keys == 0 then stat(out, DASH, 'peak memory') end
  out[#out + 1] = '</div></header>'
end

local function diagnosis(out, r)
  out[#out + 1] = '<section id="diagnosis"><h2>Diagnosis</h2>'
  local list = type(r.diagnosis) == 'table' and r.diagnosis or {}
  if #list == 0 then
    out[#out + 1] = '<p class="note">No diagnosis in this report.</p>'
  end
  for _, d in ipairs(list) do
    local kind = tostring(d.kind or 'note')
    local c = KIND_COLOR[kind] or KIND_OTHER
    out[#out + 1] = fmt('<div class="diag" style="border-color:%s">' ..
      '<span class="badge" style="color:%s;background:%s">%s</span><p>%s</p></div>',
      c[3], c[1], c[2], esc(kind), esc(d.message or ''))
  end
  out[#out + 1] = '</section>'
end

-- The parts of the breakdowns present, in order: PARTS first, then any others.
local function parts_of(bars)
  local seen, list, extra = {}, {}, {}
  for _, b in ipairs(bars) do
    for k, v in pairs(b.breakdown) do
      if isnum(v) and not seen[k] then seen[k] = true end
    end
  end
  for _, p in ipairs(PARTS) do
    if seen[p] then list[#list + 1] = p; seen[p] = nil end
  end
  for _, k in ipairs(sorted_keys(seen)) do extra[#extra + 1] = k end
  local colors = {}
  for i, k in ipairs(extra) do
    list[#list + 1] = k
    colors[k] = EXTRA_COLORS[(i - 1) % #EXTRA_COLORS + 1]
  end
  return list, colors
end

-- Pipeline stages: each one's layout and measured bubble against the formula.
pipeline_table = function(out, r)
  local rows = {}
  if type(r.replicas) == 'table' and #r.replicas > 0 then
    for i, rep in ipairs(r.replicas) do
      if type(rep.pipeline) == 'table' then
        rows[#rows + 1] = { label = 'rank ' .. tostring(rep.rank or (i - 1)), p = rep.pipeline }
      end
    end
  elseif type(r.pipeline) == 'table' then
    rows[1] = { label = 'this process', p = r.pipeline }
  end
  if #rows == 0 then return end
  out[#out + 1] = '<h2 style="margin-top:20px">Pipeline</h2><p class="sub">The bubble is the ' ..
    'share of each pipeline step a stage sat blocked on a neighbour stage; the formula ' ..
    '(p&minus;1)&#47;(m+p&minus;1) is what GPipe and 1F1B leave idle with p stages and m ' ..
    'chunks on stages of equal cost.</p>'
  out[#out + 1] = '<table id="pipeline"><tr><th>replica</th><th>stage</th><th>chunks</th>' ..
    '<th>schedule</th><th>step ms</th><th>bubble</th><th>formula</th></tr>'
  for _, row in ipairs(rows) do
    local p = row.p
    out[#out + 1] = fmt('<tr><td>%s</td><td>%s of %s</td><td>%s</td><td>%s</td><td>%s</td>' ..
      '<td>%s</td><td>%s</td></tr>', esc(row.label), int(p.stage), int(p.stages), int(p.chunks),
      esc(p.schedule or DASH), ms(p.step_s, '%.3f'), pct(p.bubble), pct(p.expected))
  end
  out[#out + 1] = '</table>'
end

local function breakdown(out, r)
  out[#out + 1] = '<section id="breakdown"><h2>Step breakdown</h2>'
  local bars = {}
  if type(r.replicas) == 'table' and #r.replicas > 0 then
    for i, rep in ipairs(r.replicas) do
      bars[#bars + 1] = { label = 'rank ' .. tostring(rep.rank or (i - 1)), step_s = rep.step_s,
                          wait_s = rep.wait_s, breakdown = type(rep.breakdown) == 'table'
                            and rep.breakdown or {} }
    end
  else
    bars[1] = { label = 'this process', step_s = r.step_s,
                breakdown = type(r.breakdown) == 'table' and r.breakdown or {} }
  end
  local parts, extra_colors = parts_of(bars)
  local function color(p) return PART_COLOR[p] or extra_colors[p] end
  if #parts == 0 then
    out[#out + 1] = '<p class="note">No breakdown in this report.</p></section>'
    return
  end

  -- legend, with the whole run's shares where the report has them
  local total = type(r.breakdown) == 'table' and r.breakdown or {}
  out[#out + 1] = '<div class="legend">'
  for _, p in ipairs(parts) do
    out[#out + 1] = fmt('<span><i style="background:%s"></i>%s%s</span>', color(p), esc(p),
      isnum(total[p]) and (' ' .. pct(total[p])) or '')
  end
  out[#out + 1] = '</div>'

  local LW, X0, X1, BH, GAP = 150, 160, W - 4, 30, 12
  local H = #bars * (BH + GAP) + 4
  out[#out + 1] = fmt('<svg viewBox="0 0 %d %d" role="img" aria-label="step breakdown per replica">',
    W, H)
  for i, b in ipairs(bars) do
    local y = 4 + (i - 1) * (BH + GAP)
    out[#out + 1] = fmt('<text class="lbl" x="0" y="%d" font-weight="600">%s</text>', y + 13,
      esc(clip(b.label, 22)))
    out[#out + 1] = fmt('<text x="0" y="%d">%s ms / step</text>', y + 27, ms(b.step_s))
    local sum = 0
    for _, p in ipairs(parts) do
      local v = b.breakdown[p]
      if isnum(v) and v > 0 then sum = sum + v end
    end
    local scale = sum > 1 and 1 / sum or 1   -- fractions that over-run are shrunk to fit
    local x = X0
    out[#out + 1] = fmt('<rect x="%d" y="%d" width="%d" height="%d" fill="#f0f2f4" rx="3"/>',
      X0, y, X1 - X0, BH)
    for _, p in ipairs(parts) do
      local v = b.breakdown[p]
      if isnum(v) and v > 0 then
        local w = v * scale * (X1 - X0)
        out[#out + 1] = fmt('<rect x="%.2f" y="%d" width="%.2f" height="%d" fill="%s">' ..
          '<title>%s %s: %s (%s ms)</title></rect>', x, y, w, BH, color(p), esc(b.label), esc(p),
          pct(v), isnum(b.step_s) and ms(b.step_s * v) or DASH)
        if w >= 40 then
          out[#out + 1] = fmt('<text class="%s" x="%.2f" y="%d" text-anchor="middle">%s</text>',
            DARK_TEXT[p] and 'segd' or 'seg', x + w / 2, y + BH / 2 + 4, pct(v))
        end
        x = x + w
      end
    end
  end
  out[#out + 1] = '</svg>'

  -- the numbers
  out[#out + 1] = '<table><tr><th>replica</th><th>step ms</th>'
  for _, p in ipairs(parts) do out[#out + 1] = '<th>' .. esc(p) .. '</th>' end
  local any_wait = false
  for _, b in ipairs(bars) do any_wait = any_wait or isnum(b.wait_s) end
  if any_wait then out[#out + 1] = '<th>wait ms</th>' end
  out[#out + 1] = '</tr>'
  for _, b in ipairs(bars) do
    out[#out + 1] = fmt('<tr><td>%s</td><td>%s</td>', esc(b.label), ms(b.step_s))
    for _, p in ipairs(parts) do out[#out + 1] = '<td>' .. pct(b.breakdown[p]) .. '</td>' end
    if any_wait then out[#out + 1] = '<td>' .. ms(b.wait_s, '%.3f') .. '</td>' end
    out[#out + 1] = '</tr>'
  end
  out[#out + 1] = '</table>'
  pipeline_table(out, r)
  out[#out + 1] = '</section>'
end

local MAX_OPS = 50

local function top_ops(out, r)
  out[#out + 1] = '<section id="ops"><h2>Top ops</h2>'
  local ops = type(r.top_ops) == 'table' and r.top_ops or {}
  if #ops == 0 then
    out[#out + 1] = '<p class="note">No ops in this report.</p></section>'
    return
  end
  local step_total = (isnum(r.steps) and isnum(r.step_s) and r.steps > 0 and r.step_s > 0)
    and r.steps * r.step_s or nil
  if isnum(r.ops_per_step) or isnum(r.mean_op_us) then
    out[#out + 1] = fmt('<p class="sub">%s ops per step, %s &micro;s per op on average.</p>',
      int(r.ops_per_step), num(r.mean_op_us, '%.1f'))
  end
  out[#out + 1] = '<table><tr><th>op</th><th>calls</th><th>total ms</th><th>mean &micro;s</th>' ..
    '<th class="bar">share of step</th></tr>'
  for i = 1, math.min(#ops, MAX_OPS) do
    local op = ops[i]
    local share = step_total and isnum(op.total_s) and op.total_s / step_total or nil
    local bar = share and fmt('<div style="width:%.1f%%"></div><span>%s</span>',
      math.max(0, math.min(share, 1)) * 78, pct(share)) or DASH
    out[#out + 1] = fmt('<tr><td class="name">%s</td><td>%s</td><td>%s</td><td>%s</td>' ..
      '<td class="bar">%s</td></tr>', esc(op.name or '?'), int(op.calls), ms(op.total_s, '%.3f'),
      num(op.mean_us, '%.1f'), bar)
  end
  out[#out + 1] = '</table>'
  if #ops > MAX_OPS then
    out[#out + 1] = fmt('<p class="note">and %d more ops.</p>', #ops - MAX_OPS)
  end
  out[#out + 1] = '</section>'
end

local MODE_LABEL = { plain = 'plain data parallel', optimizer = 'optimizer (ZeRO-1)',
                     gradients = 'gradients (ZeRO-2)', parameters = 'parameters (ZeRO-3)' }

-- Every sharding mode at each replica count: step time, bytes sent, memory.
local function by_mode(out, p)
  local modes = type(p.modes) == 'table' and p.modes or {}
  local any = false
  for _, row in ipairs(p.rows) do any = any or type(row.modes) == 'table' end
  if #modes == 0 or not any then return end
  out[#out + 1] = fmt('<h2 style="margin-top:20px">By sharding mode</h2><p class="sub">This ' ..
    'run: <b>%s</b>. Bytes each replica sends per step (ring collectives) and the memory it ' ..
    'holds: parameters, gradients, optimizer state and the activations measured (%s); ' ..
    'hover a memory figure for its parts.</p>', esc(MODE_LABEL[p.mode] or p.mode or 'plain'),
    bytes(p.activations))
  out[#out + 1] = '<table id="modes"><tr><th>replicas</th><th>mode</th><th>step ms ' ..
    '(overlap)</th><th>step ms (no overlap)</th><th>efficiency</th><th>sent &#47; replica</th>' ..
    '<th>memory &#47; replica</th></tr>'
  for _, row in ipairs(p.rows) do
    for _, m in ipairs(modes) do
      local x = type(row.modes) == 'table' and row.modes[m]
      if type(x) == 'table' then
        local mem = type(x.memory) == 'table' and x.memory or {}
        out[#out + 1] = fmt('<tr%s><td>%s</td><td>%s</td><td>%s</td><td>%s</td><td>%s</td>' ..
          '<td>%s</td><td title="parameters %s, gradients %s, optimizer %s, activations %s">' ..
          '%s</td></tr>', m == p.mode and ' style="font-weight:600"' or '', int(row.replicas),
          esc(MODE_LABEL[m] or m), ms(x.step_s, '%.3f'), ms(x.step_s_no_overlap, '%.3f'),
          pct(x.efficiency), bytes(x.traffic_bytes), bytes(mem.parameters),
          bytes(mem.gradients), bytes(mem.optimizer), bytes(mem.activations), bytes(mem.total))
      end
    end
  end
  out[#out + 1] = '</table>'
end

local function projection(out, r)
  out[#out + 1] = '<section id="projection"><h2>Scaling projection</h2>'
  local p = r.projection
  if type(p) ~= 'table' or type(p.rows) ~= 'table' or #p.rows == 0 then
    out[#out + 1] = '<p class="note">No scaling projection in this report.</p></section>'
    return
  end
  local how = p.measured and 'measured on this machine' or 'assumed (not measured)'
  local extra = {}
  if isnum(p.grad_bytes) then extra[#extra + 1] = bytes(p.grad_bytes) .. ' of gradients' end
  if isnum(p.buckets) then
    extra[#extra + 1] = fmt('%s bucket%s', int(p.buckets), p.buckets == 1 and '' or 's')
  end
  out[#out + 1] = fmt('<p class="sub">Projected with an all-reduce bandwidth of <b>%s GB/s</b>, ' ..
    '<b>%s</b>%s.</p>', num(p.gbps, '%.1f'), how,
    #extra > 0 and ('; ' .. concat(extra, ' in ')) or '')
  out[#out + 1] = '<table><tr><th>replicas</th><th>step ms (overlap)</th>' ..
    '<th>step ms (no overlap)</th><th class="bar">efficiency (overlap)</th>' ..
    '<th class="bar">efficiency (no overlap)</th></tr>'
  local function eff(e)
    if not isnum(e) then return DASH end
    return fmt('<div style="width:%.1f%%;background:#54a24b"></div><span>%s</span>',
      math.max(0, math.min(e, 1)) * 60, pct(e))
  end
  for _, row in ipairs(p.rows) do
    out[#out + 1] = fmt('<tr><td>%s</td><td>%s</td><td>%s</td><td class="bar">%s</td>' ..
      '<td class="bar">%s</td></tr>', int(row.replicas), ms(row.step_s, '%.3f'),
      ms(row.step_s_no_overlap, '%.3f'), eff(row.efficiency), eff(row.efficiency_no_overlap))
  end
  out[#out + 1] = '</table>'
  by_mode(out, p)
  out[#out + 1] = '</section>'
end

-- -- Entry points -------------------------------------------------------------------------

function M.render(report, timeline)
  local r = type(report) == 'table' and report or {}
  local out = {
    '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">',
    -- nothing may be fetched: no script, no image, no font, no connection
    '<meta http-equiv="Content-Security-Policy" content="default-src \'none\'; ' ..
      'style-src \'unsafe-inline\'">',
    '<meta name="viewport" content="width=device-width, initial-scale=1">',
    '<title>ember profile</title><style>', css(), '</style></head><body><main>\n',
  }
  header(out, r)
  diagnosis(out, r)
  breakdown(out, r)
  memory_section(out, r)
  timeline_section(out, timeline)
  top_ops(out, r)
  projection(out, r)
  out[#out + 1] = '<footer>ember.profile &middot; self-contained page, no network</footer>'
  out[#out + 1] = '</main></body></html>\n'
  return concat(out, '\n')
end

function M.write(path, report, timeline)
  local ok, html = pcall(M.render, report, timeline)
  if not ok then return nil, 'profile page: ' .. tostring(html) end
  local f, err = io.open(path, 'wb')
  if not f then return nil, 'profile page: ' .. tostring(err) end
  local wok, werr = f:write(html)
  local cok, cerr = f:close()
  if not wok then return nil, 'profile page: ' .. tostring(werr) end
  if not cok then return nil, 'profile page: ' .. tostring(cerr) end
  return true
end

return M

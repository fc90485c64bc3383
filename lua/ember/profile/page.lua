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
  - a timeline of a few steps: one lane per track (nested events stacked in
    rows), events coloured by category with hover titles, step boundaries as
    vertical lines, an x axis in ms; at most MAX_EVENTS events are drawn;
  - the top ops as a table with an inline bar of their share of the step;
  - the scaling projection as a table, with the bandwidth it assumed.

report and timeline are the profiler's (see ember.profile); any field may be
missing, the page then says so instead of failing.
]]
local M = {}

local fmt, concat, floor = string.format, table.concat, math.floor
local MAX_EVENTS = 20000   -- events drawn in the timeline at most (the page stays < ~4 MB)
M.MAX_EVENTS = MAX_EVENTS

-- -- Escaping and numbers -------------------------------------------------------------

local ESC = { ['&'] = '&amp;', ['<'] = '&lt;', ['>'] = '&gt;', ['"'] = '&quot;',
              ["'"] = '&#39;', ['/'] = '&#47;', [':'] = '&#58;' }

-- HTML text or attribute value from any value.
local function esc(s)
  return (tostring(s == nil and '' or s):gsub('[&<>"\'/:]', ESC))
end
M.escape = esc

local function isnum(x)
  return type(x) == 'number' and x == x and x ~= math.huge and x ~= -math.huge
end

local DASH = '&ndash;'

local function num(x, f)
  if not isnum(x) then return DASH end
  return fmt(f or '%.2f', x)
end

-- 12345 -> 12,345
local function int(x)
  if not isnum(x) then return DASH end
  local s = fmt('%d', floor(x + 0.5))
  local neg, digits = s:match('^(-?)(%d+)$')
  digits = digits:reverse():gsub('(%d%d%d)', '%1,'):reverse():gsub('^,', '')
  return neg .. digits
end

local function ms(s, f)
  if not isnum(s) then return DASH end
  return fmt(f or '%.2f', s * 1e3)
end

local function pct(f, digits)
  if not isnum(f) then return DASH end
  return fmt('%.' .. (digits or 1) .. 'f%%', f * 100)
end

local function bytes(b)
  if not isnum(b) then return DASH end
  local units = { 'B', 'KiB', 'MiB', 'GiB', 'TiB' }
  local u = 1
  while math.abs(b) >= 1024 and u < #units do b, u = b / 1024, u + 1 end
  return u == 1 and fmt('%d B', b) or fmt('%.1f %s', b, units[u])
end

-- Cuts a string to n bytes at most without splitting a UTF-8 character.
local function clip(s, n)
  s = tostring(s)
  if #s <= n then return s end
  local cut = n - 1
  while cut > 0 and s:byte(cut + 1) and s:byte(cut + 1) >= 0x80 and s:byte(cut + 1) < 0xc0 do
    cut = cut - 1
  end
  return s:sub(1, cut) .. '\226\128\166'   -- an ellipsis
end

-- -- Colours -------------------------------------------------------------------------

-- The parts of a step, in drawing order, and their colours (shared with the
-- timeline's categories: input ~ data, compute ~ op, communication ~ collective).
local PARTS = { 'input', 'compute', 'communication', 'host', 'idle' }
local PART_COLOR = { input = '#f2a93b', compute = '#4c78a8', communication = '#b279a2',
                     host = '#7f8c8d', idle = '#d5dae0' }
local EXTRA_COLORS = { '#72b7b2', '#54a24b', '#e45756', '#9d755d', '#eeca3b' }
local DARK_TEXT = { idle = true, input = true }   -- light fills get dark labels

-- Timeline categories.
local CATS = { 'op', 'backward', 'data', 'loader', 'collective', 'comm-wait', 'optimizer',
               'range', 'copy' }
local CAT_COLOR = { op = '#4c78a8', backward = '#72b7b2', data = '#f2a93b', loader = '#eeca3b',
                    collective = '#b279a2', ['comm-wait'] = '#e45756', optimizer = '#54a24b',
                    range = '#c9c3bf', copy = '#9d755d', other = '#8a8f98' }
local CAT_CLASS = {}
for i, c in ipairs(CATS) do CAT_CLASS[c] = 'k' .. i end
CAT_CLASS.other = 'k0'

-- Diagnosis kinds: text colour, background.
local KIND_COLOR = {
  ['input-bound'] = { '#92400e', '#fef3c7', '#f59e0b' },
  ['launch-bound'] = { '#5b21b6', '#ede9fe', '#8b5cf6' },
  ['communication-bound'] = { '#1e40af', '#dbeafe', '#3b82f6' },
  ['replica-skew'] = { '#991b1b', '#fee2e2', '#ef4444' },
  ['balanced'] = { '#166534', '#dcfce7', '#22c55e' },
}
local KIND_OTHER = { '#374151', '#e5e7eb', '#9ca3af' }

-- -- Style ----------------------------------------------------------------------------

local function css()
  local t = {
    [[
*{box-sizing:border-box}
body{margin:0;background:#f4f5f7;color:#1f2328;
 font:14px/1.5 -apple-system,BlinkMacSystemFont,"Segoe UI",Roboto,"Helvetica Neue",Arial,sans-serif}
main{max-width:1100px;margin:0 auto;padding:24px 20px 48px}
h1{font-size:22px;margin:0 0 2px;font-weight:650;letter-spacing:-.01em}
h1 span{color:#e8590c}
h2{font-size:16px;margin:0 0 12px;font-weight:600}
section{background:#fff;border:1px solid #e1e4e8;border-radius:8px;padding:16px 18px;margin:16px 0}
.sub{color:#57606a;margin:0 0 14px}
.stats{display:flex;flex-wrap:wrap;gap:10px}
.stat{background:#fff;border:1px solid #e1e4e8;border-radius:8px;padding:8px 14px;min-width:120px}
.stat b{display:block;font-size:20px;font-weight:600;font-variant-numeric:tabular-nums}
.stat small{color:#57606a;font-size:12px}
.diag{border-left:5px solid;border-radius:6px;padding:10px 14px;margin:8px 0;background:#fafbfc}
.diag p{margin:6px 0 0;font-size:15px}
.badge{display:inline-block;border-radius:999px;padding:1px 10px;font-size:12px;font-weight:600;
 letter-spacing:.02em}
.legend{display:flex;flex-wrap:wrap;gap:6px 16px;margin:8px 0;font-size:13px;color:#333}
.legend i{display:inline-block;width:12px;height:12px;border-radius:3px;margin-right:5px;
 vertical-align:-1px}
table{border-collapse:collapse;width:100%;font-size:13px;font-variant-numeric:tabular-nums}
th,td{padding:5px 8px;border-bottom:1px solid #eef0f2;text-align:right;white-space:nowrap}
th{font-weight:600;color:#57606a;border-bottom:1px solid #d0d7de}
th:first-child,td:first-child{text-align:left}
td.name{text-align:left;font-family:ui-monospace,SFMono-Regular,Menlo,Consolas,monospace;
 white-space:normal;word-break:break-all}
td.bar,th.bar{width:30%;text-align:left}
.bar div{display:inline-block;height:10px;border-radius:2px;background:#4c78a8;vertical-align:middle}
.bar span{margin-left:6px;color:#333}
.note{color:#57606a;font-size:13px;margin:8px 0 0}
svg{display:block;width:100%;height:auto}
svg text{font-size:11px;fill:#333;font-family:inherit}
svg .lbl{font-size:12px;fill:#1f2328}
svg .seg{font-size:11px;fill:#fff;font-weight:600}
svg .segd{font-size:11px;fill:#222;font-weight:600}
svg .ax{stroke:#8c959f;stroke-width:1}
svg .grid{stroke:#eaeef2;stroke-width:1}
svg .stepl{stroke:#24292f;stroke-width:1;stroke-dasharray:4 3}
svg .lane{fill:#f6f8fa}
footer{color:#8c959f;font-size:12px;text-align:center}
]] }
  for i, c in ipairs(CATS) do t[#t + 1] = fmt('svg .k%d{fill:%s}\n', i, CAT_COLOR[c]) end
  t[#t + 1] = fmt('svg .k0{fill:%s}\n', CAT_COLOR.other)
  return concat(t)
end

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

local W = 1060   -- the SVGs' width in user units (they scale to the section)

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
  out[#out + 1] = '</table></section>'
end

-- A round tick step for a range: 1, 2 or 5 times a power of ten.
local function nice_step(range, n)
  local raw = range / n
  local p = 10 ^ floor(math.log10(raw))
  for _, m in ipairs({ 1, 2, 5, 10 }) do
    if raw <= m * p then return m * p end
  end
  return 10 * p
end

local function tick_label(v, step)
  if step >= 1 then return fmt('%d', floor(v + 0.5)) end
  local digits = math.max(0, -floor(math.log10(step) + 1e-9))
  return fmt('%.' .. digits .. 'f', v)
end

local function timeline_section(out, tl)
  out[#out + 1] = '<section id="timeline"><h2>Timeline</h2>'
  local events = type(tl) == 'table' and type(tl.events) == 'table' and tl.events or {}
  if #events == 0 then
    out[#out + 1] = '<p class="note">No timeline in this report.</p></section>'
    return
  end
  local n = #events
  local shown = math.min(n, MAX_EVENTS)

  -- tracks: the timeline's, plus any an event names beyond them
  local tracks = {}
  for i, t in ipairs(type(tl.tracks) == 'table' and tl.tracks or {}) do tracks[i] = tostring(t) end
  local ntracks = #tracks
  for i = 1, shown do
    local t = tonumber(events[i].track) or 1
    if t >= 1 and t > ntracks then ntracks = floor(t) end
  end
  ntracks = math.min(ntracks, 256)
  for t = 1, ntracks do tracks[t] = tracks[t] or ('track ' .. t) end

  -- the time range (µs)
  local steps = {}
  for _, s in ipairs(type(tl.steps) == 'table' and tl.steps or {}) do
    if isnum(s) then steps[#steps + 1] = s end
  end
  local t0, t1 = math.huge, -math.huge
  for _, s in ipairs(steps) do t0, t1 = math.min(t0, s), math.max(t1, s) end
  local per_track = {}
  for t = 1, ntracks do per_track[t] = {} end
  local cats_seen = {}
  for i = 1, shown do
    local e = events[i]
    local t = floor(tonumber(e.track) or 1)
    if isnum(e.ts) and per_track[t] then
      local d = isnum(e.dur) and math.max(e.dur, 0) or 0
      t0, t1 = math.min(t0, e.ts), math.max(t1, e.ts + d)
      local list = per_track[t]
      list[#list + 1] = i
      cats_seen[CAT_CLASS[e.cat] and e.cat or 'other'] = true
    end
  end
  if t0 == math.huge then t0, t1 = 0, 1 end
  t0 = math.min(t0, 0)
  if t1 <= t0 then t1 = t0 + 1 end

  -- nesting depth of each event within its track: a flame chart's rows
  local MAXROWS, RH = 4, 14
  local depth, rows = {}, {}
  for t = 1, ntracks do
    local list = per_track[t]
    table.sort(list, function(a, b)
      local ea, eb = events[a], events[b]
      if ea.ts ~= eb.ts then return ea.ts < eb.ts end
      local da, db = tonumber(ea.dur) or 0, tonumber(eb.dur) or 0
      if da ~= db then return da > db end
      return a < b
    end)
    local stack, maxd = {}, 0
    for _, i in ipairs(list) do
      local e = events[i]
      while #stack > 0 and stack[#stack] <= e.ts + 1e-9 do stack[#stack] = nil end
      local d = #stack
      depth[i] = math.min(d, MAXROWS - 1)
      maxd = math.max(maxd, d)
      stack[#stack + 1] = e.ts + (isnum(e.dur) and math.max(e.dur, 0) or 0)
    end
    rows[t] = math.min(maxd + 1, MAXROWS)
  end

  -- legend
  out[#out + 1] = '<div class="legend">'
  for _, c in ipairs(CATS) do
    if cats_seen[c] then
      out[#out + 1] = fmt('<span><i style="background:%s"></i>%s</span>', CAT_COLOR[c], c)
    end
  end
  if cats_seen.other then
    out[#out + 1] = fmt('<span><i style="background:%s"></i>other</span>', CAT_COLOR.other)
  end
  out[#out + 1] = '</div>'

  local LW, X0, X1, TOP = 150, 160, W - 6, 22
  local lane_y, y = {}, TOP
  for t = 1, ntracks do
    lane_y[t] = y
    y = y + rows[t] * RH + 8
  end
  local AXY = y + 2
  local H = AXY + 26
  local span = t1 - t0
  local function X(us) return X0 + (us - t0) / span * (X1 - X0) end

  out[#out + 1] = fmt('<svg viewBox="0 0 %d %d" role="img" aria-label="timeline">', W, H)
  -- lanes and their names
  for t = 1, ntracks do
    local ly, lh = lane_y[t], rows[t] * RH + 4
    out[#out + 1] = fmt('<rect class="lane" x="%d" y="%d" width="%d" height="%d"/>',
      X0, ly - 2, X1 - X0, lh)
    out[#out + 1] = fmt('<text class="lbl" x="0" y="%d"><title>%s</title>%s</text>', ly + 11,
      esc(tracks[t]), esc(clip(tracks[t], 22)))
  end
  -- x axis: ticks in ms, faint grid lines
  local span_ms = span / 1e3
  local tstep = nice_step(span_ms, 10)
  local first = math.ceil((t0 / 1e3) / tstep) * tstep
  out[#out + 1] = fmt('<line class="ax" x1="%d" y1="%d" x2="%d" y2="%d"/>', X0, AXY, X1, AXY)
  local v, guard = first, 0
  while v <= t1 / 1e3 + 1e-9 and guard < 100 do
    local x = X(v * 1e3)
    out[#out + 1] = fmt('<line class="grid" x1="%.2f" y1="%d" x2="%.2f" y2="%d"/>' ..
      '<line class="ax" x1="%.2f" y1="%d" x2="%.2f" y2="%d"/>' ..
      '<text x="%.2f" y="%d" text-anchor="middle">%s</text>',
      x, TOP - 4, x, AXY, x, AXY, x, AXY + 5, x, AXY + 17, tick_label(v, tstep))
    v, guard = v + tstep, guard + 1
  end
  out[#out + 1] = fmt('<text x="%d" y="%d" text-anchor="end">time (ms)</text>', X0 - 12, AXY + 17)

  -- events
  for t = 1, ntracks do
    for _, i in ipairs(per_track[t]) do
      local e = events[i]
      local x = X(e.ts)
      local dur = isnum(e.dur) and math.max(e.dur, 0) or 0
      local w = math.max(dur / span * (X1 - X0), 0.6)
      local cat = CAT_CLASS[e.cat] and e.cat or 'other'
      out[#out + 1] = fmt('<rect class="%s" x="%.2f" y="%d" width="%.2f" height="%d">' ..
        '<title>%s (%s) %s ms at %s ms</title></rect>',
        CAT_CLASS[cat], x, lane_y[t] + depth[i] * RH, w, RH - 2, esc(e.name or '?'),
        esc(e.cat or '?'), num(dur / 1e3, '%.3f'), num(e.ts / 1e3, '%.3f'))
    end
  end

  -- step boundaries and step names
  table.sort(steps)
  for k, s in ipairs(steps) do
    local x = X(s)
    out[#out + 1] = fmt('<line class="stepl" x1="%.2f" y1="%d" x2="%.2f" y2="%d"/>',
      x, TOP - 8, x, AXY)
    local nxt = steps[k + 1] or (t1 > s + span * 0.02 and t1 or nil)
    if nxt then
      local label = fmt('step %d', k)
      if steps[k + 1] then label = label .. fmt(' &middot; %.2f ms', (nxt - s) / 1e3) end
      out[#out + 1] = fmt('<text x="%.2f" y="10" text-anchor="middle" font-weight="600">%s</text>',
        (X(s) + X(nxt)) / 2, label)
    end
  end
  out[#out + 1] = '</svg>'
  if shown < n then
    out[#out + 1] = fmt('<p class="note">The timeline holds %s events; the first %s are drawn.</p>',
      int(n), int(shown))
  else
    out[#out + 1] = fmt('<p class="note">%s events on %d tracks; hover an event for its ' ..
      'name and duration.</p>', int(n), ntracks)
  end
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
  out[#out + 1] = '</table></section>'
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

--[[
ember.profile.page_timeline -- the page's timeline of a few steps (see page.lua):
one lane per track, events that nest stacked in rows, coloured by category with
hover titles, step boundaries as dashed lines and an x axis in ms; at most
MAX_EVENTS events are drawn.
]]
local fmt, concat, floor = string.format, table.concat, math.floor
local H = require 'ember.profile.html'
local MAX_EVENTS, W = H.MAX_EVENTS, H.W
local esc = H.esc
local isnum = H.isnum
local num = H.num
local int = H.int
local ms = H.ms
local clip = H.clip
local CATS = H.CATS
local CAT_COLOR = H.CAT_COLOR
local CAT_CLASS = H.CAT_CLASS

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

return timeline_section

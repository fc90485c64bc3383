--[[
ember.profile.page_memory -- the page's memory per replica by kind (see page.lua):
one stacked bar per replica (parameters, gradients, optimizer state,
activations, other) on a common scale with the step's peak marked, and a table of the
bytes. The bars of all replicas share the scale of the largest peak, so a
replica that holds more stands out. Where a peak was predicted (the planner's,
through em.profile.expect), a dashed mark and a column show it beside the
measured peak.
]]
local fmt = string.format
local H = require 'ember.profile.html'
local W, esc, isnum, bytes, clip = H.W, H.esc, H.isnum, H.bytes, H.clip

local BASE_KINDS = { 'parameters', 'gradients', 'optimizer', 'activations' }
local COLOR = { parameters = '#4c78a8', gradients = '#f58518', optimizer = '#54a24b',
                activations = '#b279a2', other = '#9d9da1' }

local function memory_section(out, r)
  out[#out + 1] = '<section id="memory"><h2>Memory per replica</h2>'
  local rows = {}
  if type(r.replicas) == 'table' and #r.replicas > 0 then
    for i, rep in ipairs(r.replicas) do
      if type(rep.memory) == 'table' then
        rows[#rows + 1] = { label = 'rank ' .. tostring(rep.rank or (i - 1)), m = rep.memory,
                            predicted = rep.expected_peak_bytes }
      end
    end
  elseif type(r.memory) == 'table' then
    rows[1] = { label = 'this process', m = r.memory, predicted = r.expected_peak_bytes }
  end
  if #rows == 0 then
    out[#out + 1] = '<p class="note">No memory by kind in this report.</p></section>'
    return
  end
  -- other (held before the step: a dataset in memory) only where a replica has some
  local KINDS = { unpack(BASE_KINDS) }
  for _, row in ipairs(rows) do
    if isnum(row.m.other) and row.m.other > 0 then KINDS[#KINDS + 1] = 'other'; break end
  end
  out[#out + 1] = '<p class="sub">Bytes held at the step with the highest peak: parameters, ' ..
    'their gradients and the optimizer state, measured; other is what was held before ' ..
    'the step beside them (a dataset in memory); activations are the rest of the peak ' ..
    '(every other tensor of the step).</p>'
  out[#out + 1] = '<div class="legend">'
  for _, k in ipairs(KINDS) do
    out[#out + 1] = fmt('<span><i style="background:%s"></i>%s</span>', COLOR[k], k)
  end
  out[#out + 1] = '<span><i style="background:#24292f"></i>peak</span>'
  for _, row in ipairs(rows) do
    if isnum(row.predicted) then
      out[#out + 1] = '<span><i style="background:#e45756"></i>predicted peak</span>'
      break
    end
  end
  out[#out + 1] = '</div>'

  local top = 0
  for _, row in ipairs(rows) do
    local sum = 0
    for _, k in ipairs(KINDS) do
      if isnum(row.m[k]) and row.m[k] > 0 then sum = sum + row.m[k] end
    end
    row.sum = sum
    top = math.max(top, sum, isnum(row.m.peak) and row.m.peak or 0,
                   isnum(row.predicted) and row.predicted or 0)
  end
  if top <= 0 then top = 1 end
  local X0, X1, BH, GAP = 160, W - 4, 26, 12
  out[#out + 1] = fmt('<svg viewBox="0 0 %d %d" role="img" aria-label="memory per replica ' ..
    'by kind">', W, #rows * (BH + GAP) + 4)
  for i, row in ipairs(rows) do
    local y = 4 + (i - 1) * (BH + GAP)
    out[#out + 1] = fmt('<text class="lbl" x="0" y="%d" font-weight="600">%s</text>', y + 12,
      esc(clip(row.label, 22)))
    out[#out + 1] = fmt('<text x="0" y="%d">peak %s</text>', y + 25, bytes(row.m.peak))
    out[#out + 1] = fmt('<rect x="%d" y="%d" width="%d" height="%d" fill="#f0f2f4" rx="3"/>',
      X0, y, X1 - X0, BH)
    local x = X0
    for _, k in ipairs(KINDS) do
      local v = row.m[k]
      if isnum(v) and v > 0 then
        local w = v / top * (X1 - X0)
        out[#out + 1] = fmt('<rect x="%.2f" y="%d" width="%.2f" height="%d" fill="%s">' ..
          '<title>%s %s: %s</title></rect>', x, y, w, BH, COLOR[k], esc(row.label), k, bytes(v))
        if w >= 70 then
          out[#out + 1] = fmt('<text class="seg" x="%.2f" y="%d" text-anchor="middle">%s</text>',
            x + w / 2, y + BH / 2 + 4, bytes(v))
        end
        x = x + w
      end
    end
    if isnum(row.m.peak) and row.m.peak > 0 then
      local px = X0 + row.m.peak / top * (X1 - X0)
      out[#out + 1] = fmt('<rect x="%.2f" y="%d" width="2" height="%d" fill="#24292f">' ..
        '<title>%s peak: %s</title></rect>', px - 1, y - 2, BH + 4, esc(row.label),
        bytes(row.m.peak))
    end
    if isnum(row.predicted) and row.predicted > 0 then
      local px = X0 + row.predicted / top * (X1 - X0)
      out[#out + 1] = fmt('<line x1="%.2f" y1="%d" x2="%.2f" y2="%d" stroke="#e45756" ' ..
        'stroke-width="2" stroke-dasharray="3,2"><title>%s predicted peak: %s</title></line>',
        px, y - 3, px, y + BH + 3, esc(row.label), bytes(row.predicted))
    end
  end
  out[#out + 1] = '</svg>'
  local any_predicted = false
  for _, row in ipairs(rows) do any_predicted = any_predicted or isnum(row.predicted) end

  out[#out + 1] = '<table><tr><th>replica</th><th>' .. table.concat(KINDS, '</th><th>') ..
    '</th><th>peak</th>' .. (any_predicted and '<th>predicted peak</th>' or '') .. '</tr>'
  for _, row in ipairs(rows) do
    local cells = { esc(row.label) }
    for _, k in ipairs(KINDS) do cells[#cells + 1] = bytes(row.m[k]) end
    cells[#cells + 1] = bytes(row.m.peak)
    if any_predicted then
      local d = isnum(row.predicted) and row.predicted > 0 and isnum(row.m.peak) and
        fmt(' (%+.0f%%)', (row.m.peak - row.predicted) / row.predicted * 100) or ''
      cells[#cells + 1] = bytes(row.predicted) .. d
    end
    out[#out + 1] = '<tr><td>' .. table.concat(cells, '</td><td>') .. '</td></tr>'
  end
  out[#out + 1] = '</table></section>'
end

return memory_section

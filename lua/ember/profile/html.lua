--[[
ember.profile.html -- what the profiler's page (page.lua, page_timeline.lua) draws
with: escaping every string that comes from a report, number formats, the colours
of the breakdown's parts, the event categories and the diagnosis kinds, and the
page's style sheet.
]]
local fmt, concat, floor = string.format, table.concat, math.floor
local MAX_EVENTS = 20000   -- events drawn in the timeline at most (the page stays < ~4 MB)
local W = 1060             -- the SVGs' width in user units (they scale to the section)

-- -- Escaping and numbers -------------------------------------------------------------

local ESC = { ['&'] = '&amp;', ['<'] = '&lt;', ['>'] = '&gt;', ['"'] = '&quot;',
              ["'"] = '&#39;', ['/'] = '&#47;', [':'] = '&#58;' }

-- HTML text or attribute value from any value.
local function esc(s)
  return (tostring(s == nil and '' or s):gsub('[&<>"\'/:]', ESC))
end

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
local PARTS = { 'input', 'compute', 'communication', 'bubble', 'host', 'idle' }
local PART_COLOR = { input = '#f2a93b', compute = '#4c78a8', communication = '#b279a2',
                     bubble = '#e8b4b8', host = '#7f8c8d', idle = '#d5dae0' }
local EXTRA_COLORS = { '#72b7b2', '#54a24b', '#e45756', '#9d755d', '#eeca3b' }
local DARK_TEXT = { idle = true, input = true, bubble = true }   -- light fills get dark labels

-- Timeline categories.
local CATS = { 'op', 'backward', 'data', 'loader', 'collective', 'comm-wait', 'optimizer',
               'range', 'copy', 'bubble' }
local CAT_COLOR = { op = '#4c78a8', backward = '#72b7b2', data = '#f2a93b', loader = '#eeca3b',
                    collective = '#b279a2', ['comm-wait'] = '#e45756', optimizer = '#54a24b',
                    range = '#c9c3bf', copy = '#9d755d', bubble = '#e8b4b8',
                    other = '#8a8f98' }
local CAT_CLASS = {}
for i, c in ipairs(CATS) do CAT_CLASS[c] = 'k' .. i end
CAT_CLASS.other = 'k0'

-- Diagnosis kinds: text colour, background.
local KIND_COLOR = {
  ['input-bound'] = { '#92400e', '#fef3c7', '#f59e0b' },
  ['launch-bound'] = { '#5b21b6', '#ede9fe', '#8b5cf6' },
  ['communication-bound'] = { '#1e40af', '#dbeafe', '#3b82f6' },
  ['replica-skew'] = { '#991b1b', '#fee2e2', '#ef4444' },
  ['pipeline-bubble'] = { '#9d174d', '#fce7f3', '#ec4899' },
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

return {
  MAX_EVENTS = MAX_EVENTS,
  W = W,
  ESC = ESC,
  esc = esc,
  isnum = isnum,
  DASH = DASH,
  num = num,
  int = int,
  ms = ms,
  pct = pct,
  bytes = bytes,
  clip = clip,
  PARTS = PARTS,
  PART_COLOR = PART_COLOR,
  EXTRA_COLORS = EXTRA_COLORS,
  DARK_TEXT = DARK_TEXT,
  CATS = CATS,
  CAT_COLOR = CAT_COLOR,
  CAT_CLASS = CAT_CLASS,
  KIND_COLOR = KIND_COLOR,
  KIND_OTHER = KIND_OTHER,
  css = css,
}

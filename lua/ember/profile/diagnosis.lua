--[[
ember.profile.diagnosis -- the diagnoses of how a step computes, beside
report.lua's of where its time goes (input, launches, communication, skew,
bubbles). Each reads one replica's summary (summary.lua) and returns nil or
{kind, message, share}; the report lists them with the others, largest share
first. The rules (the README lists them with these thresholds):

  copies              copy ops (summary.COPY_OPS: clone, copy_, contiguous,
                      convert_layout, dtype conversions) take >= COPY_SHARE of
                      the step. Names who made them -- the autograd node whose
                      backward ran them, the module whose forward did, or the
                      step's own code -- with calls and time per step, and
                      what to change for each.
  float16-unscaled    float16 compute (>= FP16_SHARE of compute time) and no
                      'amp.scaler' note in the run: float16 gradients underflow
                      without loss scaling.
  scale-backoff       the 'amp.scaler' notes (em.amp.GradScaler:update) show
                      >= BACKOFFS steps skipped for inf/NaN, or a scale that fell
                      below 1: the loss overflows float16 again and again.
  layout-conversions  more than MAX_LAYOUT convert_layout ops per step: the
                      model converts between NCHW and NHWC inside the step,
                      where one conversion at the entry would do.

The share of compute in each dtype (dtype_share) is the report's too.
]]
local M = {}

M.COPY_SHARE, M.FP16_SHARE, M.BACKOFFS, M.MAX_LAYOUT = 0.10, 0.01, 3, 1

local function ms(s) return string.format('%.2f ms', s * 1e3) end
local function pct(x) return string.format('%.0f%%', x * 100) end
local function count(x)
  local r = math.floor(x + 0.5)
  return (math.abs(x - r) < 0.05) and tostring(r) or string.format('%.1f', x)
end

-- {{dtype, share}, ...} of compute time, largest first.
function M.dtype_share(s)
  local total, list = 0, {}
  for _, x in pairs(s.dtype_s or {}) do total = total + x end
  if total <= 0 then return list end
  for dt, x in pairs(s.dtype_s) do list[#list + 1] = { dtype = dt, share = x / total } end
  table.sort(list, function(a, b) return a.share > b.share end)
  return list
end

-- What to change, by where a copy ran.
local function advice(by)
  if by:find('^backward of ') then
    return 'a gradient reached .grad in another layout than the parameter\'s, or while ' ..
      'something else held it (a hook or a kept reference): produce it in the parameter\'s ' ..
      'layout and drop the extra reference'
  elseif by:find('^module ') then
    return 'the module converts its input each call (layout, dtype or contiguity): ' ..
      'convert once at the model\'s entry (m:to{...}, to_channels_last on the input) and ' ..
      'keep that layout and dtype through the model'
  end
  return 'the step\'s own clone/copy_/contiguous/:to() calls: do them once outside the ' ..
    'loop, or use views'
end

function M.copies(s)
  if (s.copy_s or 0) < M.COPY_SHARE * s.step_s or s.step_s <= 0 then return nil end
  local list = {}
  for by, c in pairs(s.copies or {}) do list[#list + 1] = { by = by, c = c } end
  table.sort(list, function(a, b) return a.c.total_s > b.c.total_s end)
  local parts = {}
  for i = 1, math.min(4, #list) do
    local x = list[i]
    local ops = {}
    for name, n in pairs(x.c.ops) do ops[#ops + 1] = name end
    table.sort(ops)
    parts[#parts + 1] = string.format('%s: %s call%s of %s, %s per step (%s)', x.by,
      count(x.c.calls), x.c.calls >= 1.5 and 's' or '', table.concat(ops, '/'),
      ms(x.c.total_s), advice(x.by))
  end
  return { kind = 'copies', share = s.copy_s / s.step_s, made_by = list,
    message = string.format('Copies take %s of the step (%s of a %s step). Made by %s.',
      pct(s.copy_s / s.step_s), ms(s.copy_s), ms(s.step_s), table.concat(parts, '; ')) }
end

local function scaler_notes(s)
  local list = {}
  for _, n in ipairs(s.notes or {}) do
    if n.name == 'amp.scaler' then list[#list + 1] = n.fields or {} end
  end
  return list
end

function M.fp16_unscaled(s)
  local f16, total = (s.dtype_s or {}).float16 or 0, 0
  for _, x in pairs(s.dtype_s or {}) do total = total + x end
  if total <= 0 or f16 < M.FP16_SHARE * total or #scaler_notes(s) > 0 then return nil end
  return { kind = 'float16-unscaled', share = f16 / math.max(s.step_s, 1e-12),
    message = string.format('float16 without a scaler: %s of compute runs in float16 and ' ..
      'no GradScaler ran. Small float16 gradients flush to zero; use em.amp.GradScaler ' ..
      '(scaler:scale(loss):backward(); scaler:step(opt); scaler:update()), or autocast to ' ..
      'bfloat16, which needs no scaling.', pct(f16 / total)) }
end

function M.scale_backoff(s)
  local notes = scaler_notes(s)
  if #notes == 0 then return nil end
  local skipped, low = 0, math.huge
  for _, f in ipairs(notes) do
    if f.found_inf then skipped = skipped + 1 end
    if type(f.scale) == 'number' then low = math.min(low, f.scale) end
  end
  if skipped < M.BACKOFFS and low >= 1 then return nil end
  return { kind = 'scale-backoff', share = skipped / #notes, skipped = skipped,
    message = string.format('A scale that keeps backing off: %d of %d scaler updates found ' ..
      'inf/NaN gradients and skipped the step%s. The loss or activations overflow float16: ' ..
      'autocast to bfloat16 (float32\'s range), keep the overflowing ops (large sums, ' ..
      'exp, custom losses) in float32, lower the learning rate, or look for NaN in the data.',
      skipped, #notes, low < math.huge and string.format('; the scale fell to %g', low) or '') }
end

function M.layout_conversions(s)
  local n = s.layout_conversions or 0
  if n <= M.MAX_LAYOUT then return nil end
  local t = s.layout_s or 0
  local by = {}
  for name, c in pairs(s.copies or {}) do
    if c.ops.convert_layout then by[#by + 1] = name end
  end
  table.sort(by)
  return { kind = 'layout-conversions', share = t / math.max(s.step_s, 1e-12),
    message = string.format('Layout conversions inside the step: %s per step between NCHW ' ..
      'and NHWC (%s), made by %s. Convert once at the entry: m:to{memory_format = ' ..
      '\'channels_last\'} and x:to_channels_last() on the input, so that every layer keeps ' ..
      'that layout; ops without a channels-last kernel convert back and forth.', count(n),
      ms(t), table.concat(by, ', ')) }
end

-- Every diagnosis that holds for summary s.
function M.all(s)
  local out = {}
  for _, f in ipairs({ M.copies, M.fp16_unscaled, M.scale_backoff, M.layout_conversions }) do
    local d = f(s)
    if d then out[#out + 1] = d end
  end
  return out
end

return M

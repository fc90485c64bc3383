--[[
test_profile_diagnosis.lua -- the diagnoses of diagnosis.lua from recorded
events: synthetic profiles (em_profile_event arrays, as summary.read gives them)
go through summary.summarize and report.build as a real recording does. Each
diagnosis fires and does not: copies (the MLP step whose weight gradients were
cloned in the transpose's backward: clone at ~43% of the step), float16 without
a scaler, a scale that keeps backing off, layout conversions inside the step;
the share of compute per dtype; em.profile.note in a real recording and its
trace; a real recording names the module whose forward made a copy.
]]
local dir = (arg and arg[0] and arg[0]:match('^(.*/)')) or
            ((os.getenv('EMBER_TESTS') or 'tests') .. '/lua/')
local H = dofile(dir .. 'harness.lua')
local em = require 'ember'
local ffi = require 'ffi'
local C = require('ember.ffi').C
local summary = require 'ember.profile.summary'
local report = require 'ember.profile.report'
local K = summary.KIND
local MS = 1e-3

-- A profile of `steps` steps of 10 ms; each step's events are spans
-- {kind, name, t0_ms, t1_ms, dtype} relative to the step's start.
local function profile(steps, spans, notes)
  local list = {}
  for s = 0, steps - 1 do
    local base = s * 10 * MS
    for _, x in ipairs(spans) do
      list[#list + 1] = { kind = x[1], name = x[2], t0 = base + x[3] * MS, t1 = base + x[4] * MS,
                          dtype = x[5] or C.EM_FLOAT32 }
    end
    list[#list + 1] = { kind = K.STEP, name = 'step', t0 = base + 10 * MS, t1 = base + 10 * MS,
                        dtype = 0 }
  end
  table.sort(list, function(a, b) return a.t0 < b.t0 end)
  local ev = ffi.new('em_profile_event[?]', #list)
  for i, x in ipairs(list) do
    local e = ev[i - 1]
    e.t0, e.t1, e.name, e.kind, e.track, e.dtype = x.t0, x.t1, x.name, x.kind, 0, x.dtype
  end
  local p = { events = ev, n = #list, tracks = { 'main' }, main = 0, origin = 0, dropped = 0,
              peak_cpu = 0, notes = notes or {}, _anchor = { list, ev } }
  local s = summary.summarize(p, steps * 10 * MS, false, 0)
  return report.build({ s }, nil, summary.top_ops(s.op_table, 15), {}, {}), s
end

local function kinds(r)
  local k = {}
  for _, d in ipairs(r.diagnosis) do k[d.kind] = d end
  return k
end

-- The 512-2048-2048-10 MLP step as it was: three weight-gradient clones in the
-- transposes' backward, 4.3 ms of a 10 ms step.
local OLD_MLP = {
  { K.RANGE, 'module Linear', 0.0, 1.6 }, { K.OP, 'matmul', 0.1, 1.5 },
  { K.BACKWARD, 'matmul', 2.0, 3.5 }, { K.OP, 'matmul', 2.1, 3.4 },
  { K.BACKWARD, 'transpose', 3.5, 5.0 }, { K.OP, 'clone', 3.6, 5.0 },
  { K.BACKWARD, 'transpose', 5.0, 6.5 }, { K.OP, 'clone', 5.1, 6.5 },
  { K.BACKWARD, 'transpose', 6.5, 8.0 }, { K.OP, 'clone', 6.6, 8.0 },
  { K.OP, 'sgd_step_multi', 8.2, 9.5 },
}

H.test('copies: fire on the old MLP step and name the transpose backward', function()
  local r, s = profile(3, OLD_MLP)
  local d = kinds(r).copies
  H.check(d, 'copies diagnosed')
  H.check(not kinds(r).balanced, 'no longer "balanced"')
  H.close(d.share, 4.2 / 10, 1e-9, 'share of the step')
  H.check(d.message:find('backward of transpose: 3 calls of clone', 1, true), d.message)
  H.check(d.message:find('parameter\'s layout', 1, true), 'says what to change')
  H.close(s.copy_s, 4.2 * MS, 1e-9)
  H.eq(r.diagnosis[1].kind, 'copies', 'the largest share comes first')
end)

H.test('copies: do not fire under the threshold; a module\'s copy is named', function()
  local r = profile(2, {
    { K.RANGE, 'module Conv2d', 0, 3 }, { K.OP, 'contiguous', 0.1, 0.6 },
    { K.OP, 'conv2d', 0.7, 2.9 }, { K.BACKWARD, 'conv2d', 3, 8 }, { K.OP, 'conv2d_backward', 3.1, 7.9 },
  })
  H.check(not kinds(r).copies, 'a 5% copy is not diagnosed')
  r = profile(2, {
    { K.RANGE, 'module Conv2d', 0, 3 }, { K.OP, 'contiguous', 0.1, 2.0 },
    { K.OP, 'conv2d', 2.1, 2.9 }, { K.OP, 'copy_', 8, 9 },
  })
  local d = kinds(r).copies
  H.check(d and d.message:find('module Conv2d: 1 call of contiguous', 1, true), d and d.message)
  H.check(d and d.message:find('outside any module', 1, true), 'the step\'s own copy_')
  H.close(d.share, 0.29, 1e-9)
end)

H.test('compute by dtype', function()
  local r, s = profile(2, {
    { K.OP, 'matmul', 0, 3, C.EM_BFLOAT16 }, { K.OP, 'add', 3, 4, C.EM_FLOAT32 },
    { K.OP, 'gt', 4, 5, C.EM_BOOL },
  })
  H.eq(#r.dtype_share, 2, 'bool is no compute dtype')
  H.eq(r.dtype_share[1].dtype, 'bfloat16')
  H.close(r.dtype_share[1].share, 0.75, 1e-9)
  H.close(r.dtype_share[2].share, 0.25, 1e-9)
  H.check(tostring(r):find('compute by dtype: bfloat16 75%, float32 25%', 1, true), tostring(r))
  H.check(not kinds(r)['float16-unscaled'], 'bfloat16 needs no scaler')
end)

local F16 = { { K.OP, 'matmul', 0, 4, C.EM_FLOAT16 }, { K.OP, 'add', 4, 5 } }
local function scaler(scale, inf) return { name = 'amp.scaler', t = 0.001,
  fields = { scale = scale, found_inf = inf } } end

H.test('float16 without a scaler', function()
  local d = kinds(profile(2, F16))['float16-unscaled']
  H.check(d and d.message:find('80%% of compute runs in float16'), d and d.message)
  H.check(not kinds(profile(2, F16, { scaler(65536, false) }))['float16-unscaled'],
          'a scaler note silences it')
  H.check(not kinds(profile(2, { { K.OP, 'matmul', 0, 4 } }))['float16-unscaled'], 'float32')
end)

H.test('a scale that keeps backing off', function()
  local three = { scaler(32768, true), scaler(16384, true), scaler(16384, false),
                  scaler(8192, true) }
  local d = kinds(profile(2, F16, three))['scale-backoff']
  H.check(d and d.message:find('3 of 4 scaler updates', 1, true), d and d.message)
  H.eq(d and d.skipped, 3)
  H.check(not kinds(profile(2, F16, { scaler(65536, true), scaler(32768, true),
    scaler(32768, false) }))['scale-backoff'], 'two back-offs are normal')
  d = kinds(profile(2, F16, { scaler(0.5, true) }))['scale-backoff']
  H.check(d and d.message:find('fell to 0.5', 1, true), 'a scale below 1')
end)

H.test('layout conversions inside the step', function()
  local spans = {
    { K.RANGE, 'module Conv2d', 0, 2 }, { K.OP, 'convert_layout', 0, 0.2 },
    { K.OP, 'conv2d', 0.2, 2 },
    { K.RANGE, 'module BatchNorm2d', 2, 4 }, { K.OP, 'convert_layout', 2, 2.3 },
    { K.OP, 'batch_norm', 2.3, 3.7 }, { K.OP, 'convert_layout', 3.7, 4 },
  }
  local r = profile(2, spans)
  local d = kinds(r)['layout-conversions']
  H.check(d and d.message:find('3 per step', 1, true), d and d.message)
  H.check(d and d.message:find('module BatchNorm2d', 1, true), 'names the module')
  H.close(d.share, 0.08, 1e-9)
  r = profile(2, { { K.OP, 'convert_layout', 0, 0.2 }, { K.OP, 'conv2d', 0.2, 2 } })
  H.check(not kinds(r)['layout-conversions'], 'one at the entry is fine')
end)

H.test('em.profile.note: an instant in the trace, kept in the report', function()
  em.profile.note('ignored', { a = 1 })     -- not recording: nothing
  H.raises(function() em.profile.note(3) end, 'profile.note', 'name')
  H.raises(function() em.profile.note('x', 5) end, 'profile.note', 'fields')
  local path = H.tmpdir() .. '/notes.json'
  em.profile.start { trace = path }
  em.profile.note('amp.scaler', { scale = 1024, found_inf = true, f = function() end })
  em.randn(8):sum()
  local r = em.profile.stop()
  H.eq(#r.notes, 1)
  H.eq(r.notes[1].name, 'amp.scaler')
  H.eq(r.notes[1].fields, { scale = 1024, found_inf = true })
  local doc = require('ember.checkpoint.json')(H.read(path), 64)
  local found
  for _, e in ipairs(doc.traceEvents) do
    if e.cat == 'note' then found = e end
  end
  H.check(found and found.name == 'amp.scaler' and found.ph == 'i', 'the note in the trace')
  H.eq(found and found.args.scale, 1024)
  H.eq(found and found.args.found_inf, true)
end)

H.test('a real recording names the module whose forward copies', function()
  local Cloner = em.nn.Module:extend('Cloner')
  function Cloner:forward(x)
    for _ = 1, 20 do x = x:clone() end
    return x
  end
  local m = em.nn.Sequential(Cloner(), em.nn.Linear(4, 2))
  local x = em.randn({ 2000, 4 })
  em.profile.start {}
  for _ = 1, 3 do m(x):sum():backward(); em.profile.step() end
  local r = em.profile.stop()
  local d = kinds(r).copies
  H.check(d and d.message:find('module Cloner: 20 calls of clone', 1, true),
          d and d.message or r.diagnosis[1].message)
end)

H.done()

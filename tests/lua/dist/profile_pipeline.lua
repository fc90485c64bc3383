--[[
profile_pipeline.lua -- a hand-made pipeline of known cost for
test_profile_pipeline.lua, run as `ember --replicas P profile_pipeline.lua MODE
OUTDIR`: replica r is stage r of P. Each step streams M = 2 chunks forward
through the stages (GPipe's forward half): a stage receives a chunk from the
stage before it (a bubble: it waits on a neighbour), works on it for C seconds
and sends it on; at the end a "done" token travels back from the last stage,
so that every stage's step ends together. With equal stages each stage idles
(P-1)*C of a (M+P-1)*C step, the formula's share.
  even    every stage works C per chunk;
  uneven  the last stage works 4*C per chunk: the others wait for it, and the
          first stage's bubble is far above the formula.
Each replica waits only inside the profiler's bubbles (prof.hooks.wait), times
those waits (inside the spans) and its steps itself, reports each step through
prof.hooks.pipeline_step, and sets a predicted peak of (rank + 1) MB (em.profile.expect).
Replica 0 prints the report's fields as KEY=value lines, a replica's figures
as REPk=name:value ones.
]]
local em = require 'ember'
local prof = require 'ember.profile'
local mode, out = arg[1], arg[2]
local s = em.distribute.mirrored {}
local P, r = s.world_size, s.rank
local M, C = 2, 0.01
local cost = (mode == 'uneven' and r == P - 1) and 4 * C or C
local w = em.randn(64, 64)

local function work(seconds)        -- ops of a known duration
  local t0 = em.clock()
  while em.clock() - t0 < seconds do em.matmul(w, w) end
end

-- Seconds spent in bubbles this step, by this clock, timed inside the span (so
-- that the span's own start and end are all that lies between the two figures).
local waited = 0
local function bubble(name, fn)
  prof.hooks.wait(name, function()
    local t0 = em.clock()
    fn()
    waited = waited + (em.clock() - t0)
  end)
end

local function step()
  waited = 0
  local t0 = em.clock()
  local sends = {}
  for k = 1, M do
    local act = em.zeros(16)
    if r > 0 then bubble('recv activation', function() s:recv(act, r - 1) end) end
    work(cost)
    if r < P - 1 then sends[#sends + 1] = s:send(act, r + 1, { async = true }) end
  end
  local done = em.zeros(1)
  if r < P - 1 then bubble('recv done', function() s:recv(done, r + 1) end) end
  if r > 0 then
    local h = s:send(done, r - 1, { async = true })
    bubble('send done', function() h:wait() end)
  end
  bubble('wait sends', function() for _, h in ipairs(sends) do h:wait() end end)
  local dt = em.clock() - t0
  prof.hooks.pipeline_step { stage = r, stages = P, chunks = M, schedule = 'gpipe',
                   bubble = waited / dt, step_s = dt }
  return waited, dt
end

step()                              -- warm up outside the profile
s:barrier()
em.profile.expect { peak_bytes = (r + 1) * 1e6 }
local wsum, share_sum = 0, 0
em.profile.start { trace = out .. '/trace.json', html = out .. '/page.html' }
for _ = 1, 5 do
  local wt, dt = step()
  wsum, share_sum = wsum + wt, share_sum + wt / dt
  em.profile.step()
end
local rep = em.profile.stop()
em.profile.expect {}
-- every replica's own measures of its bubble: the seconds of the profiled steps
-- its clock read inside bubbles, and the mean of the shares it reported, for
-- replica 0 to print
local all = s:allgather(em.tensor({ wsum, share_sum / 5 }, { dtype = 'float64' })):totable()
if r == 0 then
  print('REPLICAS=' .. #rep.replicas)
  -- per replica: its breakdown's shares and bubble seconds (all steps), its own
  -- figures, its pipeline's figures in the report and its predicted peak
  for _, x in ipairs(rep.replicas) do
    print(('REP%d=bubble:%.9f communication:%.9f bubble_s:%.9f waited:%.9f stage:%s ' ..
      'pipeline_bubble:%s predicted:%s mean:%.9f'):format(x.rank,
      x.breakdown.bubble or -1, x.breakdown.communication,
      (x.breakdown.bubble or 0) * x.step_s * rep.steps, all[2 * x.rank + 1],
      x.pipeline and x.pipeline.stage or 'nil',
      x.pipeline and ('%.9f'):format(x.pipeline.bubble) or 'nil', tostring(x.expected_peak_bytes),
      all[2 * x.rank + 2]))
  end
  local kinds = {}
  for _, d in ipairs(rep.diagnosis) do
    kinds[#kinds + 1] = d.kind
    if d.kind == 'pipeline-bubble' then print('BUBBLEMSG=' .. d.message) end
  end
  print('KINDS=' .. table.concat(kinds, ','))
  local text = tostring(rep)
  print('PRINT_PIPELINE=' .. select(2, text:gsub('pipeline stage %d of', '')))
  print('PRINT_PREDICTED=' .. select(2, text:gsub('rank %d: peak [^\n]* predicted', '')))
end

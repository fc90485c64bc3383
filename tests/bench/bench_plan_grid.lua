--[[
bench_plan_grid.lua -- the planner's promise over a grid: GPTs of the shipped
example, MLPs and CNNs, global batches of 2 and 8 rows a replica, caps of 1.6,
2.5, 4 and 8 times the weights, on 2 and 4 replicas (tests/lua/dist/
plan_grid_run.lua). For every case, `--plan` as a user runs it (the memory
defaults to the cap); every layout the planner accepts trains ten steps under
that cap. One line per layout: the case, predicted and measured peak (the
replicas' largest; measured in steps 2-10), their error, and whether it ran.

RESULT lines: plan_grid_accepted_ran (the share of accepted layouts that
trained under their cap; goal 1), plan_grid_worst_under (the largest amount a
measured peak exceeds its prediction, in percent; goal <= the planner's safety
share, 5, or 10 for checkpointed pipelines), plan_grid_over_margin (runs where a
replica's peak passed its own stage's prediction with its margin; goal 0),
plan_grid_within_10 (the share of runs predicted within 10 %; goal 1) and
plan_grid_cases.

  build/ember tests/bench/bench_plan_grid.lua [--size small|large] [--chosen]

--chosen trains only the chosen layout and the accepted one closest to the cap
(what `make test` does, at small sizes).
]]
local dir = debug.getinfo(1, 'S').source:sub(2):match('(.*/)') or './'
local B = dofile(dir .. 'common.lua')
local size, all = 'large', true
do
  local i = 1
  while arg[i] do
    if arg[i] == '--size' and arg[i + 1] then size = arg[i + 1]; i = i + 2
    elseif arg[i] == '--chosen' then all = false; i = i + 1
    else error('usage: bench_plan_grid.lua [--size small|large] [--chosen]', 0) end
  end
end
local tests = dir .. '../lua/'
local G = dofile(tests .. 'dist/plan_grid_run.lua')(tests, arg[-1] or 'ember')
local layouts = require 'ember.distribute.plan.layouts'

print(('%-26s %2s %7s  %-44s %9s %9s %7s  %s'):format('case', 'N', 'cap', 'layout',
  'predicted', 'measured', 'error', 'ran'))
local t0 = B.now()
local cases, runs, ran, within, worst, over_margin = {}, 0, 0, 0, -math.huge, 0
G.run(size, { all = all, progress = function(r)
  cases[r.case .. r.replicas] = true
  if not r.layout then
    print(('%-26s %2d %7s  %-44s %9s %9s %7s  %s'):format(r.case, r.replicas, r.cap,
      r.ok and '(nothing fits)' or '(plan failed)', '-', '-', '-', r.why and r.why:gsub('\n', ' '):sub(1, 60) or ''))
    return
  end
  runs = runs + 1
  local err = r.measured > 0 and (r.predicted - r.measured) / r.measured or 0
  if r.ok then
    ran = ran + 1
    if math.abs(err) <= 0.10 then within = within + 1 end
    worst = math.max(worst, -err)
    if r.over_margin then over_margin = over_margin + 1 end
  end
  print(('%-26s %2d %7s  %-44s %8.2fM %8.2fM %+6.1f%%  %s%s%s'):format(r.case, r.replicas, r.cap,
    r.layout .. (r.layout == r.chosen and ' *' or ''), r.predicted / 2 ^ 20, r.measured / 2 ^ 20,
    100 * err, r.ok and 'yes' or 'NO ', r.over_margin and ' (a stage past its margin)' or '',
    r.why and (' ' .. r.why:sub(1, 80)) or ''))
  io.stdout:flush()
end })
local n = 0
for _ in pairs(cases) do n = n + 1 end
print(('%d cases, %d runs in %.0f s (* the chosen layout)'):format(n, runs, B.now() - t0))
B.result('plan_grid_accepted_ran', runs > 0 and ran / runs or 0, 'share', 'higher', '1')
B.result('plan_grid_worst_under', 100 * math.max(worst, 0), '%', 'lower',
  ('<= %g (the safety share, %g for checkpointed pipelines; %d KiB more on top)'):format(
  100 * layouts.SAFETY, 100 * layouts.SAFETY_RECOMPUTED, layouts.SAFETY_BYTES / 1024))
B.result('plan_grid_over_margin', over_margin, 'runs', 'lower', '0')
B.result('plan_grid_within_10', ran > 0 and within / ran or 0, 'share', 'higher', '1')
B.result('plan_grid_cases', n, 'cases', 'higher', '>= 40')

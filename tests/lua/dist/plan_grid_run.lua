--[[
plan_grid_run.lua -- the planner's grid: its cases and how they run (used by
tests/lua/test_plan_grid.lua at small sizes and tests/bench/bench_plan_grid.lua
at larger ones).

  local G = dofile(dir .. 'dist/plan_grid_run.lua')(dir, ember)
  for _, row in ipairs(G.run('small', {all = false, progress = fn})) do ... end

A case is a model, a global batch, a cap per replica (a multiple of the
model's weights, from tight to loose) and a number of replicas. For each, one
`ember --replicas N --memory-limit CAP plan_grid.lua plan ...` asks the planner
(memory defaulting to the cap) which layouts fit; then each layout trained
(every accepted one with all, else the chosen one and the accepted one
predicted to need the most) runs in a process of its own under the same cap
(`plan_grid.lua run`), so that running out of memory ends that run alone.

Rows: {case, replicas, cap, fits, chosen, layout, predicted, margin, measured,
over_margin, ok, why} per layout trained (predicted, margin -- the prediction
with the layout's margin -- and measured: the replicas' largest; over_margin:
some replica's peak passed its own stage's prediction with the margin), and one
row with layout = nil for a case where nothing fits (or the plan failed).
]]
return function(dir, ember)
  local L = dofile(dir .. 'dist/launch.lua')(dir, ember)
  local G = {}

  -- model (plan_grid.lua's MODEL), global batch per replica count, caps x weights
  G.GRIDS = {
    small = {
      replicas = { 2, 4 },
      models = { 'gpt:2:48:16', 'mlp:3:256', 'cnn:16' },
      rows = { 2 },             -- per replica: the global batch is rows x replicas
      caps = { 2.5, 6 },
    },
    large = {
      replicas = { 2, 4 },
      models = { 'gpt:2:64:32', 'gpt:4:96:32', 'gpt:8:64:32', 'mlp:4:512', 'mlp:3:1024',
                 'cnn:32', 'cnn:64' },
      rows = { 2, 8 },
      caps = { 1.6, 2.5, 4, 8 },
    },
  }

  local function cap_text(n) return ('%dK'):format(math.ceil(n / 1024)) end

  function G.run(size, o)
    o = o or {}
    local grid = assert(G.GRIDS[size], 'grid size: small | large')
    local rows, weights = {}, {}
    local function add(r)
      rows[#rows + 1] = r
      if o.progress then o.progress(r) end
    end
    for _, N in ipairs(grid.replicas) do
      for _, model in ipairs(grid.models) do
        for _, per in ipairs(grid.rows) do
          local B = per * N
          if not weights[model] then
            local out = L.run(('%s %sdist/plan_grid.lua weights %s %d'):format(ember, dir, model, B))
            weights[model] = tonumber(out:match('weights (%d+)')) or error('weights: ' .. out)
          end
          for _, f in ipairs(grid.caps) do
            local cap = cap_text(f * weights[model])
            local case = ('%s b%d cap %.1fW'):format(model, B, f)
            local env = 'EMBER_MEMORY_LIMIT=' .. cap
            local out, rc = L.replicas(N, 'plan_grid.lua', ('plan %s %d'):format(model, B), env)
            local fits, chosen = out:match('plan fits (%a+) layout ([^\n]+)')
            local base = { case = case, replicas = N, cap = cap, fits = fits == 'yes',
                           chosen = chosen }
            local accepted, most = {}, nil
            for name, peak in out:gmatch('accepted ([^\n]-) (%d+)\n') do
              accepted[#accepted + 1] = name
              if not most or tonumber(peak) > most[2] then most = { name, tonumber(peak) } end
            end
            if rc ~= 0 or not fits or #accepted == 0 then
              local r = setmetatable({ ok = rc == 0 and fits ~= nil,
                why = rc ~= 0 and out:sub(-300) or (not fits and out:sub(-300)) or nil },
                { __index = base })
              add(r)
            end
            for _, name in ipairs(accepted) do
              if o.all or name == chosen or name == most[1] then
                local args = ('run %s %d "%s"'):format(model, B, name)
                local rout, rrc = L.replicas(N, 'plan_grid.lua', args, env)
                local p, g, m, over = 0, 0, 0, false
                for pr, mg, me in rout:gmatch('predicted (%d+) margin (%d+) measured (%d+)') do
                  p, g, m = math.max(p, tonumber(pr)), math.max(g, tonumber(mg)), math.max(m, tonumber(me))
                  over = over or tonumber(me) > tonumber(mg)
                end
                add(setmetatable({ layout = name, predicted = p, margin = g, measured = m,
                  over_margin = over,
                  ok = rrc == 0 and m > 0,
                  why = rrc ~= 0 and (rout:match('failed: ([^\n]*)') or rout:sub(-300)) or nil },
                  { __index = base }))
              end
            end
          end
        end
      end
    end
    return rows
  end

  return G
end

--[[
bench_train_resnet.lua -- training samples/s of the seed's 18-layer ResNet for 32x32
inputs (resnet_common.lua) on the CPU, batch 64, 2 threads, SGD momentum 0.9 with
weight decay 5e-4, synthetic data, ember beside PyTorch 2 (bench_train_resnet.py):

  fp32 NCHW, fp32 channels-last     float32 in each memory layout
  bf16 NCHW, bf16 channels-last     em.amp.autocast('bfloat16') against
                                    torch.autocast('cpu', dtype=torch.bfloat16)

Each figure is samples per second over whole steps (forward, cross-entropy, backward,
SGD step) after warm-up steps: the median of several repetitions. Channels-last
converts the model once (m:to{memory_format = 'channels_last'}) and each batch at the
model's entry, as a data pipeline would hand NCHW batches over. Each side's best
layout makes the headline: train_resnet_fp32_vs_torch2 and train_resnet_bf16_vs_torch2
(ember samples/s / PyTorch's; goal >= 1.3).

  build/ember tests/bench/bench_train_resnet.lua [--smoke] [--steps N] [--reps N]
                                                 [--configs fp32_nchw,bf16_cl,...] [--compile]

--compile also measures each configuration's step through em.compile, and prints
train_resnet_compiled_<fp32|bf16> and _vs_torch2 (the best compiled layout against
PyTorch's best eager one).

Started by hand it runs the twin itself ($EMBER_BENCH_PYTHON, else the peers'
environment), alternating: in each repetition ember's configurations, then PyTorch's,
so that both see the same load; it prints a table and the _vs_torch2 lines. Under
run.sh (EMBER_BENCH_PEER=0) it prints ember's RESULT lines only; run.sh runs the twin
and makes the ratios. Rows whose feature this build lacks (em.amp, channels-last)
print "skipped: ..." and are left out. --smoke: tiny sizes, a check of the script.
Under `ember --profile` each step ends a profiled step.
]]
local dir = arg[0]:match('^(.*/)') or './'
local B = dofile(dir .. 'common.lua')
local R = dofile(dir .. 'resnet_common.lua')
local em = B.em
local F = em.nn.F

local smoke, steps, reps, only, compile = false, nil, nil, nil, false
do
  local i = 1
  while arg[i] do
    local a = arg[i]
    if a == '--smoke' then smoke = true; i = i + 1
    elseif a == '--compile' then compile = true; i = i + 1
    elseif a == '--steps' or a == '--reps' or a == '--configs' then
      local v = arg[i + 1]
      if not v then error(a .. ' needs a value', 0) end
      if a == '--configs' then only = v
      else
        local n = tonumber(v)
        if not n or n < 1 or n % 1 ~= 0 then error(a .. ' needs a positive integer, got ' .. v, 0) end
        if a == '--steps' then steps = n else reps = n end
      end
      i = i + 2
    else error(('unknown argument %s (see the header of %s)'):format(a, arg[0]), 0) end
  end
end
local Z = smoke and { batch = 8, steps = steps or 2, reps = reps or 2, warm = 1 }
                 or { batch = 64, steps = steps or 20, reps = reps or 5, warm = 3 }
local peer = os.getenv('EMBER_BENCH_PEER') ~= '0'

-- -- The configurations, and what this build can run ----------------------------------------
local has_amp, has_cl = R.has_amp(), R.has_channels_last()
local CONFIGS = {
  { name = 'fp32_nchw', label = 'fp32 NCHW' },
  { name = 'fp32_cl', label = 'fp32 channels-last', cl = true },
  { name = 'bf16_nchw', label = 'bf16 autocast NCHW', bf16 = true },
  { name = 'bf16_cl', label = 'bf16 autocast channels-last', bf16 = true, cl = true },
}
-- runs: the configurations asked for whose kind (fp32, bf16) ember can run in at
-- least one layout; those ember cannot run itself (c.why) still run on PyTorch's
-- side, so that its best layout is its best.
local runs, kinds = {}, {}
for _, c in ipairs(CONFIGS) do
  c.kind = c.bf16 and 'bf16' or 'fp32'
  c.why = (c.bf16 and not has_amp and 'em.amp not built')
       or (c.cl and not has_cl and 'channels-last (to_channels_last) not built') or nil
  c.wanted = not only or (',' .. only .. ','):find(',' .. c.name .. ',', 1, true)
  if c.wanted and not c.why then kinds[c.kind] = true end
  if c.wanted and c.why then print(('skipped: %s: %s'):format(c.label, c.why)) end
end
for _, c in ipairs(CONFIGS) do
  if c.wanted and kinds[c.kind] then runs[#runs + 1] = c end
end

-- -- ember's side ----------------------------------------------------------------------------
-- One configuration's model, data and step, made on first use and kept;
-- compiled: the step (forward, backward, update) through em.compile.
local function setup(c, compiled)
  em.manual_seed(0)
  local model = R.resnet18()
  if c.cl then model:to{ memory_format = 'channels_last' } end
  local opt = R.sgd(model)
  local x = em.randn({ Z.batch, 3, 32, 32 })
  local y = em.randint(1, 11, { Z.batch })
  local function train(xb, yb)
    local function forward()
      return F.cross_entropy(model(c.cl and xb:to_channels_last() or xb), yb)
    end
    local loss = c.bf16 and em.amp.autocast('bfloat16', forward) or forward()
    opt:zero_grad()
    loss:backward()
    opt:step()
    return loss
  end
  local run = compiled and em.compile(train) or train
  return function()
    run(x, y)
    if em.profile.active() then em.profile.step() end
  end
end

-- One repetition of c (compiled: its em.compile twin): Z.steps steps; samples/s.
local function rep(c, compiled)
  local key = compiled and 'cstep' or 'step'
  if not c[key] then
    c[key] = setup(c, compiled)
    for _ = 1, Z.warm do c[key]() end
  end
  collectgarbage()
  local t0 = B.now()
  for _ = 1, Z.steps do c[key]() end
  return Z.steps * Z.batch / (B.now() - t0)
end

-- -- PyTorch's side: one run of the twin, `n` repetitions of each configuration ---------------
local function twin(n)
  local names = {}
  for i, c in ipairs(runs) do names[i] = c.name end
  local cmd = ('EMBER_NUM_THREADS=2 OMP_NUM_THREADS=2 PYTHONDONTWRITEBYTECODE=1 %s ' ..
               '%sbench_train_resnet.py --configs %s --batch %d --steps %d --reps %d ' ..
               '--warm %d 2>&1'):format(B.python(), dir, table.concat(names, ','), Z.batch,
               Z.steps, n, Z.warm)
  local got, info, na, last = {}, {}, {}, nil
  local p = io.popen(cmd)
  for line in p:lines() do
    local name, v = line:match('^RESULT train_resnet_(%S+) (%S+)')
    if name then got[name] = tonumber(v) end
    local what, why = line:match('^NA (%S+) (.*)$')
    if what then na[what] = why end
    local text = line:match('^INFO (.*)$')
    if text then info[#info + 1] = text end
    if line:match('%S') then last = line end
  end
  p:close()
  return got, info, na, last
end

-- -- The measurements: rounds of ember's configurations, then PyTorch's --------------------------
local mine, theirs, errors, info, na, twin_why = {}, {}, {}, {}, {}, nil
local compiled = {}
for _, c in ipairs(runs) do mine[c.name], theirs[c.name], compiled[c.name] = {}, {}, {} end
for r = 1, Z.reps do
  for _, c in ipairs(runs) do
    if not errors[c.name] and not c.why then
      local ok, v = pcall(rep, c)
      if ok then table.insert(mine[c.name], v) else errors[c.name] = tostring(v) end
      if compile and ok then
        ok, v = pcall(rep, c, true)
        if ok then table.insert(compiled[c.name], v) else errors[c.name] = 'compiled: ' .. tostring(v) end
      end
    end
  end
  if peer and #runs > 0 and not twin_why then
    local got, inf, nas, last = twin(1)
    if next(got) == nil and next(nas) == nil then
      twin_why = 'PyTorch failed: ' .. tostring(last)
    end
    if r == 1 then info, na = inf, nas end
    for name, v in pairs(got) do
      if theirs[name] then table.insert(theirs[name], v) end
    end
  end
end

local function med(xs) return #xs > 0 and B.median(xs) or nil end
local best_mine, best_theirs, best_compiled = {}, {}, {}
for _, c in ipairs(runs) do
  c.mine, c.theirs, c.compiled = med(mine[c.name]), med(theirs[c.name]), med(compiled[c.name])
  local k = c.bf16 and 'bf16' or 'fp32'
  if c.compiled and (not best_compiled[k] or c.compiled > best_compiled[k].v) then
    best_compiled[k] = { v = c.compiled, c = c }
  end
  if c.mine and (not best_mine[k] or c.mine > best_mine[k].v) then best_mine[k] = { v = c.mine, c = c } end
  if c.theirs and (not best_theirs[k] or c.theirs > best_theirs[k].v) then
    best_theirs[k] = { v = c.theirs, c = c }
  end
end

-- -- The table (by hand) and the RESULT lines ---------------------------------------------------------
local GOAL = '>= 1.3'
if peer then
  print(('ResNet-18 32x32, batch %d, SGD momentum 0.9 wd 5e-4, synthetic data, %d threads each; ' ..
         'median of %d x %d steps%s'):format(Z.batch, tonumber(os.getenv('EMBER_NUM_THREADS') or '2') or 2,
         Z.reps, Z.steps, smoke and ' (smoke sizes: not a figure)' or ''))
  print('PyTorch: ' .. (#info > 0 and table.concat(info, ', ') or (twin_why or 'n/a')))
  print(('ratio: ember samples/s / PyTorch samples/s (> 1: ember faster; goal %s)'):format(GOAL))
  print()
  print(('%-30s %14s %14s %8s'):format('configuration', 'ember', 'PyTorch', 'ratio'))
  local function row(label, a, b, note)
    print(('%-30s %14s %14s %8s%s'):format(label, a and ('%.1f'):format(a) or 'n/a',
          b and ('%.1f'):format(b) or 'n/a', (a and b) and ('%.3f'):format(a / b) or 'n/a',
          note or ''))
  end
  for _, c in ipairs(runs) do
    row(c.label, c.mine, c.theirs, (c.why and ('  ember skipped: ' .. c.why)) or
        (errors[c.name] and ('  ember n/a: ' .. errors[c.name])) or
        (na[c.name] and ('  torch n/a: ' .. na[c.name])))
  end
  for _, c in ipairs(runs) do
    if c.compiled then row(c.label .. ', compiled', c.compiled, c.theirs) end
  end
  for _, k in ipairs({ 'fp32', 'bf16' }) do
    local m, t = best_mine[k], best_theirs[k]
    if m or t then
      row(('best layout, %s'):format(k), m and m.v, t and t.v,
          ('  (ember %s, PyTorch %s)'):format(m and m.c.label or 'n/a', t and t.c.label or 'n/a'))
    end
    local mc = best_compiled[k]
    if mc then
      row(('best layout, %s, compiled'):format(k), mc.v, t and t.v,
          ('  (ember %s, PyTorch %s)'):format(mc.c.label, t and t.c.label or 'n/a'))
    end
  end
  print()
end
for _, c in ipairs(runs) do
  if c.mine then B.result('train_resnet_' .. c.name, c.mine, 'samples/s', 'higher', 'report') end
end
for _, k in ipairs({ 'fp32', 'bf16' }) do
  local m, t = best_mine[k], best_theirs[k]
  if m then B.result('train_resnet_' .. k, m.v, 'samples/s', 'higher', 'ratio ' .. GOAL) end
  if m and t then
    B.result(('train_resnet_%s_vs_torch2'):format(k), m.v / t.v, 'x', 'higher', GOAL .. ' x')
  end
  -- --compile: ember's best compiled layout against PyTorch's best eager one
  local mc = best_compiled[k]
  if mc then B.result('train_resnet_compiled_' .. k, mc.v, 'samples/s', 'higher', 'report') end
  if mc and t then
    B.result(('train_resnet_compiled_%s_vs_torch2'):format(k), mc.v / t.v, 'x', 'higher', GOAL .. ' x')
  end
end
-- ember's own side failing is a failure of the run (PyTorch missing is not).
for _, c in ipairs(runs) do
  if errors[c.name] then
    io.stderr:write(('bench_train_resnet: %s failed: %s\n'):format(c.label, errors[c.name]))
    os.exit(1)
  end
end

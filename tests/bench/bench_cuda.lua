--[[
bench_cuda.lua -- the GPU benchmarks of the CUDA backend: ember on cuda:0 beside
PyTorch on the same GPU, measured in the same run. One table, one row per figure:

  matmul 4096x4096 bfloat16, float32 with TF32 off, float32 with TF32 on (TFLOP/s)
  a + b and a * 2 + b on 4M and 64M float32 (GB/s: inputs read once, output
    written once, 12 bytes per element for both)
  sum over the last dim and full sum of 8192x4096 float32 (GB/s read), softmax
    over its last dim (GB/s read + written)
  launch overhead of a + b on 16 floats, host time per op without and with the
    synchronize at the end of the loop (us/op)

The ratio is ember's speed relative to PyTorch's, as in run.sh: ember/torch for
throughputs, torch/ember for times -- above 1 means ember is faster.
Timing: warm-up calls first, each repetition bracketed by em.cuda.synchronize()
(torch.cuda.synchronize() on PyTorch's side), the median of the repetitions.

  build/ember tests/bench/bench_cuda.lua [--smoke]

PyTorch's figures come from bench_cuda.py, run with the sizes measured here by
$EMBER_BENCH_PYTHON (default /usr/bin/python3, as the other benchmarks; the GPU
machine's is `python3`). Without a CUDA device this prints "skipped: ..." and
exits 0. On emulated devices (EMBER_CUDA_EMULATE) it runs the smoke sizes, with
PyTorch on the CPU: that checks the script, the figures mean nothing. An op that
fails on cuda (not built yet, say) gives "n/a: <message>" in its row.
run.sh leaves this benchmark out: tests/bench/gpu_run.sh runs it on the GPU machine.
]]
local dir = arg[0]:match('^(.*/)') or './'
local B = dofile(dir .. 'common.lua')
local em = B.em

if not em.cuda.is_available() then
  local why = tostring(em.cuda.why_not()):gsub('^no CUDA device: ', '')
  print(('skipped: no CUDA device (%s)'):format(why))
  os.exit(0)
end

local emulated = em.cuda.emulated()
local smoke = emulated
for _, a in ipairs(arg) do if a == '--smoke' then smoke = true end end

local DEV = 'cuda'
-- The sizes, passed on to bench_cuda.py as they are.
local Z = smoke and {
  mm = 64, ew = { 4096, 65536 }, rows = 64, cols = 256, tiny = 16, launch = 50,
  iters = 3, reps = 3,
} or {
  mm = 4096, ew = { 4 * 2 ^ 20, 64 * 2 ^ 20 }, rows = 8192, cols = 4096, tiny = 16,
  launch = 500, iters = 20, reps = 7,
}

local function sync() em.cuda.synchronize() end

-- Median seconds per call of fn over Z.reps repetitions of `iters` calls, after
-- warm-up calls; an op slower than 25 ms gets fewer calls per repetition (down to
-- 1) so that a slow kernel cannot hold the run for minutes (bench_cuda.py alike).
local function timed(fn, iters)
  iters = iters or Z.iters
  fn()
  sync()
  local t0 = B.now()
  fn()
  sync()
  local one = B.now() - t0
  iters = math.max(1, math.min(iters, math.floor(0.5 / math.max(one, 1e-9))))
  if one < 0.05 then for _ = 1, 2 do fn() end end
  sync()
  local ts = {}
  for r = 1, Z.reps do
    collectgarbage()              -- the last repetition's results, outside the clock
    sync()
    local t0 = B.now()
    for _ = 1, iters do fn() end
    sync()
    ts[r] = (B.now() - t0) / iters
  end
  return B.median(ts)
end

local function rand(shape, dtype)
  return em.rand(shape, { device = DEV, dtype = dtype or 'float32' })
end

-- The rows: key (bench_cuda.py's name), op, size, unit, better, fn -> ember's figure.
local rows = {}
local function row(key, op, size, unit, better, fn)
  rows[#rows + 1] = { key = key, op = op, size = size, unit = unit, better = better, fn = fn }
end

local N = Z.mm
local mmsize = ('%dx%d'):format(N, N)
local function matmul(dtype)
  return function()
    local a, b = rand({ N, N }, dtype), rand({ N, N }, dtype)
    return 2 * N ^ 3 / timed(function() return em.matmul(a, b) end) / 1e12
  end
end
row('matmul_bf16', 'matmul bfloat16', mmsize, 'TFLOP/s', 'higher', matmul('bfloat16'))
row('matmul_f32', 'matmul float32 (TF32 off)', mmsize, 'TFLOP/s', 'higher', matmul('float32'))
row('matmul_f32_tf32', 'matmul float32 (TF32 on)', mmsize, 'TFLOP/s', 'higher', function()
  -- em.cuda.allow_tf32(true) lets the float32 gemm use TF32 tensor cores, as
  -- torch.backends.cuda.matmul.allow_tf32 does on PyTorch's side.
  local sw = em.cuda.allow_tf32
  sw(true)
  local ok, v = pcall(matmul('float32'))
  sw(false)
  if not ok then error(v, 0) end
  return v
end)

local function elements(n)
  return n % 2 ^ 20 == 0 and ('%dM'):format(n / 2 ^ 20) or tostring(n)
end
for _, n in ipairs(Z.ew) do
  row('add_' .. n, 'a + b', elements(n), 'GB/s', 'higher', function()
    local a, b = rand(n), rand(n)
    return 12 * n / timed(function() return a + b end) / 1e9
  end)
  row('axpb_' .. n, 'a * 2 + b', elements(n), 'GB/s', 'higher', function()
    local a, b = rand(n), rand(n)
    return 12 * n / timed(function() return a * 2 + b end) / 1e9
  end)
end

local R, C = Z.rows, Z.cols
local rcsize = ('%dx%d'):format(R, C)
row('sum_last', 'sum(-1)', rcsize, 'GB/s', 'higher', function()
  local x = rand({ R, C })
  return 4 * R * C / timed(function() return x:sum(-1) end) / 1e9
end)
row('sum_all', 'sum()', rcsize, 'GB/s', 'higher', function()
  local x = rand({ R, C })
  return 4 * R * C / timed(function() return x:sum() end) / 1e9
end)
row('softmax_last', 'softmax(-1)', rcsize, 'GB/s', 'higher', function()
  local x = rand({ R, C })
  return 8 * R * C / timed(function() return x:softmax(-1) end) / 1e9
end)

-- Launch overhead: both figures come from the same repetitions.
local launch
local function measure_launch()
  local a, b = rand(Z.tiny), rand(Z.tiny)
  local n = Z.launch
  for _ = 1, n do local _ = a + b end
  sync()
  local nosync, withsync = {}, {}
  for r = 1, math.max(Z.reps, 11) do
    collectgarbage()
    sync()
    local t0 = B.now()
    for _ = 1, n do local _ = a + b end
    local t1 = B.now()
    sync()
    local t2 = B.now()
    nosync[r], withsync[r] = (t1 - t0) / n, (t2 - t0) / n
  end
  return { nosync = B.median(nosync) * 1e6, sync = B.median(withsync) * 1e6 }
end
row('launch_nosync', 'launch a + b, no sync', tostring(Z.tiny), 'us/op', 'lower', function()
  launch = measure_launch()
  return launch.nosync
end)
row('launch_sync', 'launch a + b, with sync', tostring(Z.tiny), 'us/op', 'lower', function()
  if not launch then launch = measure_launch() end
  return launch.sync
end)

-- The error's message without the "file:line: " in front, on one line.
local function message(e)
  e = tostring(e):gsub('^[^\n]-:%d+: ', ''):gsub('\n.*', '')
  return e
end

-- ember's figures.
for _, r in ipairs(rows) do
  local ok, v = pcall(r.fn)
  if ok then r.ember = v else r.ember_err = message(v) end
  collectgarbage()
  pcall(em.cuda.empty_cache)
end

-- PyTorch's figures, from bench_cuda.py with the same sizes.
local PY = os.getenv('EMBER_BENCH_PYTHON') or '/usr/bin/python3'
local function quote(s) return "'" .. tostring(s):gsub("'", "'\\''") .. "'" end
local ew = {}
for i, n in ipairs(Z.ew) do ew[i] = ('%d'):format(n) end
local cmd = ('PYTHONDONTWRITEBYTECODE=1 %s %s --device %s --mm %d --ew %s --rows %d --cols %d ' ..
             '--tiny %d --launch %d --iters %d --reps %d 2>&1; echo "exit=$?"')
  :format(PY, quote(dir .. 'bench_cuda.py'), emulated and 'cpu' or 'cuda', Z.mm,
          table.concat(ew, ','), R, C, Z.tiny, Z.launch, Z.iters, Z.reps)
local p = io.popen(cmd)
local out = p:read('*a')
p:close()
local torch, torch_na, info, last = {}, {}, {}, nil
local torch_all_na
for line in out:gmatch('[^\n]+') do
  local k, v = line:match('^RESULT (%S+) (%S+)')
  if k then torch[k] = tonumber(v) end
  local nk, why = line:match('^NA (%S+) (.*)$')
  if nk == '*' then torch_all_na = why elseif nk then torch_na[nk] = why end
  local i = line:match('^INFO (.*)$')
  if i then info[#info + 1] = i end
  if line:match('%S') and not line:match('^exit=') then last = line end
end
local rc = tonumber(out:match('exit=(%d+)%s*$')) or -1
local torch_failed = rc ~= 0 and ('%s failed (exit %d): %s'):format(PY, rc, last or 'no output')
if next(torch) == nil and not torch_all_na then torch_all_na = torch_failed end

-- The table.
print(('ember on %s%s; PyTorch: %s'):format(DEV, emulated and ' (emulated)' or '',
  #info > 0 and table.concat(info, ', ') or 'n/a'))
if emulated then print('emulated: figures are not GPU figures (smoke sizes, PyTorch on the CPU)')
elseif smoke then print('smoke sizes: figures are not representative') end
print('ratio: ember speed / PyTorch speed (ember/torch for throughputs, torch/ember for us/op); > 1: ember faster')
print()
local fmt = '%-26s %-10s %18s %18s %7s  %s'
print((fmt:format('op', 'size', 'ember', 'PyTorch', 'ratio', ''):gsub('%s+$', '')))
for _, r in ipairs(rows) do
  local e = r.ember and ('%.4g %s'):format(r.ember, r.unit) or 'n/a'
  local tv = torch[r.key]
  local t = tv and ('%.4g %s'):format(tv, r.unit) or 'n/a'
  local ratio = 'n/a'
  if r.ember and tv and r.ember > 0 and tv > 0 then
    ratio = ('%.3g'):format(r.better == 'lower' and tv / r.ember or r.ember / tv)
  end
  local notes = {}
  if r.ember_err then notes[#notes + 1] = 'ember n/a: ' .. r.ember_err end
  if not tv then
    notes[#notes + 1] = 'torch n/a: ' .. (torch_na[r.key] or torch_all_na or torch_failed or 'no figure')
  end
  local line = fmt:format(r.op, r.size, e, t, ratio, table.concat(notes, '; '))
  print((line:gsub('%s+$', '')))
end
-- ember's own side failing is a failure of the run (PyTorch missing is not).
for _, r in ipairs(rows) do if r.ember_err then os.exit(1) end end

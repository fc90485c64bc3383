--[[
bench_sdpa.lua -- scaled_dot_product_attention forward + backward on the CPU, B = 1,
8 heads of 64, T = 256 and 1024, causal, float32 and bfloat16: ember's fused kernel
against PyTorch's F.scaled_dot_product_attention (bench_sdpa.py, same RESULT names:
tests/bench/run.sh runs it from the peers' python and prints the ratio, PyTorch's time
over ember's), both on 2 threads. RESULT lines: sdpa_<fp32|bf16>_T<T> in ms.
Run alone with EMBER_BENCH_PEER=1, it runs the twin itself and prints
sdpa_<dtype>_T<T>_vs_torch (ember's time over PyTorch's). EMBER_BENCH_SDPA_T=32,48
picks other lengths (a quick check that it runs).
]]
local dir = arg[0]:match('^(.*/)') or './'
local B = dofile(dir .. 'common.lua')
local em = B.em
local F = em.nn.F

local lengths = os.getenv('EMBER_BENCH_SDPA_T') or '256,1024'
local heads, E = 8, 64

local ours = {}
for T in lengths:gmatch('%d+') do
  T = tonumber(T)
  for _, dt in ipairs({ 'float32', 'bfloat16' }) do
    em.manual_seed(0)
    local q = em.randn({ 1, heads, T, E }):to(dt):requires_grad_()
    local k = em.randn({ 1, heads, T, E }):to(dt):requires_grad_()
    local v = em.randn({ 1, heads, T, E }):to(dt):requires_grad_()
    local g = em.randn({ 1, heads, T, E }):to(dt)
    local function step(n)
      for _ = 1, n do
        q.grad, k.grad, v.grad = nil, nil, nil
        F.scaled_dot_product_attention(q, k, v, { causal = true }):backward(g)
      end
    end
    step(1)
    local reps = T >= 1024 and 3 or 5
    local s = B.time(step, 2, reps)
    local name = ('sdpa_%s_T%d'):format(dt == 'float32' and 'fp32' or 'bf16', T)
    ours[name] = s
    B.result(name, s * 1e3, 'ms', 'lower', 'ratio >= 0.67')
  end
end

if os.getenv('EMBER_BENCH_PEER') == '1' then
  local cmd = ('EMBER_BENCH_SDPA_T=%s %q %q 2>&1'):format(lengths, B.python(), dir .. 'bench_sdpa.py')
  local p = io.popen(cmd)
  local out = p:read('*a')
  p:close()
  for name, ms in out:gmatch('RESULT (sdpa_%w+_T%d+) ([%d.e+-]+) ms') do
    if ours[name] then
      B.result(name .. '_vs_torch', ours[name] * 1e3 / tonumber(ms), 'x', 'lower',
        'ember / PyTorch time, <= 1.5')
    end
  end
end

--[[
bench_elementwise.lua -- memory-bound throughput on 4M float32 elements:
out-of-place `a + b` (reads 2, writes 1: 48 MB moved per op, result allocated
each time) and `a:sum()` (reads 16 MB). Figures in GB/s of data touched. Then the
float32 transcendental ops on the same 4M elements, in elements per second (G/s):
exp, tanh, sigmoid and gelu, ember's vectorized functions against PyTorch's (Sleef).
]]
local dir = arg[0]:match('^(.*/)') or './'
local B = dofile(dir .. 'common.lua')
local em = B.em

local N = 4 * 1024 * 1024
local a, b = em.rand(N), em.rand(N)
local function add(n)
  local c
  for _ = 1, n do c = a + b end
  return c
end
local function sum(n)
  local s
  for _ = 1, n do s = a:sum() end
  return s
end
add(5); sum(5)
B.result('add_4M', 3 * N * 4 / B.time(add, 20, 7) / 1e9, 'GB/s', 'higher', 'ratio >= 1')
B.result('sum_4M', N * 4 / B.time(sum, 40, 7) / 1e9, 'GB/s', 'higher', 'ratio >= 1')
for _, op in ipairs({ 'exp', 'tanh', 'sigmoid', 'gelu' }) do
  local x = em.randn(N)
  local function run(n)
    local y
    for _ = 1, n do y = x[op](x) end
    return y
  end
  run(3)
  B.result(op .. '_4M', N / B.time(run, 10, 5) / 1e9, 'G/s', 'higher', 'ratio >= 1')
end

--[[
bench_matmul.lua -- 1024 x 1024 x 1024 float32 matmul (result allocated each
time), in GFLOP/s (2 n^3 flops per product).
]]
local dir = arg[0]:match('^(.*/)') or './'
local B = dofile(dir .. 'common.lua')
local em = B.em

local n = 1024
local a, b = em.rand(n, n), em.rand(n, n)
local function mm(k)
  local c
  for _ = 1, k do c = em.matmul(a, b) end
  return c
end
mm(2)
B.result('matmul_1024', 2 * n ^ 3 / B.time(mm, 5, 5) / 1e9, 'GFLOP/s', 'higher',
         'ratio >= 0.95')

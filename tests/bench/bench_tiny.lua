--[[
bench_tiny.lua -- per-op overhead on tiny tensors: `c = a + b` with 16 floats
(a fresh result each time, so the cost of creating and collecting a tensor handle
is in the figure: the loop is long enough for many GC cycles) and `a:add_(b)`.
]]
local dir = arg[0]:match('^(.*/)') or './'
local B = dofile(dir .. 'common.lua')
local em = B.em

local a, b = em.rand(16), em.rand(16)
local function add(n)
  local c
  for _ = 1, n do c = a + b end
  return c
end
local function add_(n)
  for _ = 1, n do a:add_(b) end
end
add(200000); add_(200000)                      -- warm up the JIT and the allocator
B.result('tiny_add', B.time(add, 2000000) * 1e6, 'us/op', 'lower', '<= 0.3 us')
a:zero_()
B.result('tiny_add_', B.time(add_, 2000000) * 1e6, 'us/op', 'lower', '<= 0.05 us')

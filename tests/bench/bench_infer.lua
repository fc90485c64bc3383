--[[
bench_infer.lua -- small-net inference, the game-loop case: a 32-64-4 MLP
(Linear 32->64, ReLU, Linear 64->4), batch 1, forward with grad mode off
(em.no_grad), from Lua (an nn.Sequential called on a (1, 32) tensor) and from C
(tests/bench/bench_infer.c through ember.h alone, compiled here with cc against
the libember.so of the build that runs this; skipped with a SKIP line when there is no
cc or no libember.so). The C driver prints its own RESULT line, passed on as is.
]]
local dir = arg[0]:match('^(.*/)') or './'
local B = dofile(dir .. 'common.lua')
local em = B.em
local nn = em.nn

em.manual_seed(1)
local model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 4))
local x = em.randn(1, 32)

local function fwd(n)
  local y
  em.no_grad(function()
    for _ = 1, n do y = model(x) end
  end)
  return y
end
fwd(100000)                               -- warm up the JIT and the allocator
B.result('infer_mlp_lua', B.time(fwd, 200000, 7) * 1e6, 'us/op', 'lower', '<= 1.5 us')

-- -- The C driver ------------------------------------------------------------------------
-- The library of this build: build/lua/ember/ffi.lua -> build/libember.so (the
-- ember command links the core in, so core.libpath says 'process' there).
local core = require 'ember.ffi'
local build = core.dir .. '/../..'
local lib = build .. '/libember.so'
local src = dir .. 'bench_infer.c'
local inc = dir .. '../../core/include'
local f = io.open(lib, 'rb')
if not f then
  print('SKIP infer_mlp_c: no ' .. lib)
  return
end
f:close()
local exe = os.tmpname()
local cmd = ('cc -O2 -I%q %q -o %q -L%q -lember -Wl,-rpath,%q 2>&1'):format(inc, src, exe, build, build)
local p = io.popen(cmd)
local msg = p:read('*a')
local ok = p:close()
if not ok or msg:match('error') then
  print('SKIP infer_mlp_c: cc failed: ' .. msg:gsub('\n', ' '):sub(1, 200))
  os.remove(exe)
  return
end
p = io.popen(('%q 200000'):format(exe))
io.write(p:read('*a'))
p:close()
os.remove(exe)

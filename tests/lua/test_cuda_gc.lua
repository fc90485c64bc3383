--[[
test_cuda_gc.lua -- dead device tensors go back to the caching allocator soon, not
when the device is nearly full: device storages count in em_memory_allocated with
the host's, so Lua's collector runs once tensor memory has grown by max(64 MB, a
quarter) since the last sweep (ember.handles), and a loop making garbage on a GPU
reuses the blocks it just freed (as PyTorch's reference counting does) instead of
cycling through the whole device. On a 1 GB emulated device
(EMBER_CUDA_EMULATE=1:1024), far from its 80 % pressure mark.
]]
local dir = (arg and arg[0] and arg[0]:match('^(.*/)')) or
            ((os.getenv('EMBER_TESTS') or 'tests') .. '/lua/')
local H, em = dofile(dir .. 'cuda_emulated.lua')('1:1024')
local core = require 'ember.ffi'

local MB = 2 ^ 20
local collect = require('ember.handles').collect    -- everything unreachable, released now

H.test('device garbage is collected by the tensor-memory measure, well before the pressure mark', function()
  collect(); em.cuda.empty_cache()
  local base = em.cuda.memory_stats(0).allocated
  local a = em.randn(2 * 2 ^ 20, { device = 'cuda' })          -- 8 MB, kept
  for _ = 1, 100 do local c = a + 1 end                         -- 800 MB of garbage, 8 MB each
  local st = em.cuda.memory_stats(0)
  -- the kept 8 MB, the 64 MB slack, the tensor that crossed it and randn's own
  -- temporaries: about 100 MB; without the device's own measure, ~800 MB
  H.check(st.peak - base < 128 * MB,
    ('peak %.1f MB over the start: the slack, not the garbage'):format((st.peak - base) / MB))
  H.check(st.reserved < 200 * MB, ('reserved %.1f MB: the blocks freed were reused'):format(st.reserved / MB))
  H.check(tonumber(core.C.em_memory_allocated(core.S)) >= 8 * MB,
    'em_memory_allocated counts the live device tensor')
end)

H.done()

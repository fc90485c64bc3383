--[[
test_cuda_gc_wide.lua -- on a device with more memory, dead device tensors may wait
longer for the collector (ember.handles): device memory has its own slack, a 16th
of cuda:0's memory up to 1 GiB, so that a loop of small GPU ops is not held up by a
full collection every 64 MB; the host's slack stays 64 MB. On a 4 GB emulated device
(EMBER_CUDA_EMULATE=1:4096): a 256 MB slack. test_cuda_gc.lua has the 1 GB device,
where the slack is the host's 64 MB.
]]
local dir = (arg and arg[0] and arg[0]:match('^(.*/)')) or
            ((os.getenv('EMBER_TESTS') or 'tests') .. '/lua/')
local H, em = dofile(dir .. 'cuda_emulated.lua')('1:4096')

local MB = 2 ^ 20
local collect = require('ember.handles').collect

H.test('device garbage waits for a slack of a 16th of the device, then is collected', function()
  collect(); em.cuda.empty_cache()
  local base = em.cuda.memory_stats(0).allocated
  local a = em.randn(2 * 2 ^ 20, { device = 'cuda' })          -- 8 MB, kept
  for _ = 1, 60 do local c = a + 1 end                          -- 480 MB of garbage
  local st = em.cuda.memory_stats(0)
  -- the slack is 256 MB: more than 64 MB of garbage waits, but no more than the
  -- slack plus a tensor and randn's temporaries
  H.check(st.peak - base > 128 * MB,
    ('peak %.1f MB over the start: the device slack is wider than 64 MB'):format((st.peak - base) / MB))
  H.check(st.peak - base < 320 * MB,
    ('peak %.1f MB over the start: collected at the 256 MB slack'):format((st.peak - base) / MB))
end)

H.test('host garbage keeps the 64 MB slack while the device holds tensors', function()
  collect()
  local keep = em.randn(2 ^ 20, { device = 'cuda' })
  local base = em.memory_stats('cpu').allocated
  em.reset_peak_memory_stats('cpu')
  for _ = 1, 30 do local c = em.zeros(2 * 2 ^ 20) end         -- 240 MB of 8 MB host tensors
  local peak = em.memory_stats('cpu').peak
  H.check(peak - base < 100 * MB,
    ('host peak %.1f MB over the start: the host slack, not the device one'):format((peak - base) / MB))
  H.check(keep:numel() == 2 ^ 20, 'the device tensor is live')
end)

H.done()

--[[
cuda_emulated.lua -- the header of a CUDA test: makes it run on the emulated devices
it was written for and hands it the harness and ember.
  local dir = (arg and arg[0] and arg[0]:match('^(.*/)')) or
              ((os.getenv('EMBER_TESTS') or 'tests') .. '/lua/')
  local H, em = dofile(dir .. 'cuda_emulated.lua')('2:64')

When EMBER_CUDA_EMULATE is not `spec`, the test script runs again under it, its
output is passed on, and this process exits with the child's status (LuaJIT's
p:close() does not return it, so the shell echoes it). With EMBER_TEST_REAL_CUDA set
(tests/bench/gpu_run.sh on a GPU machine) the test runs as it is, on the real devices.

Either way there must be a CUDA device: the emulator is part of this build, and
EMBER_TEST_REAL_CUDA says there is a GPU. So no device is one failed check (with
em.cuda.why_not(), the reason the backend gives, such as a libember_cuda.so that
did not load) and the end of the test, never a silent skip.

A file loaded by another test with its own harness passes it: (spec, H).
]]
local here = debug.getinfo(1, 'S').source:match('^@(.*/)') or './'

return function(spec, H)
  local real = os.getenv('EMBER_TEST_REAL_CUDA')
  if os.getenv('EMBER_CUDA_EMULATE') ~= spec and not real then
    local ember = arg[-1] or 'ember'
    local p = io.popen(('EMBER_CUDA_EMULATE=%s %s %s 2>&1; echo "#exit $?"'):format(spec, ember,
                                                                                     arg[0]))
    local out = p:read('*a')
    p:close()
    local code = tonumber(out:match('#exit (%d+)%s*$'))
    io.stdout:write((out:gsub('#exit %d+%s*$', '')))
    os.exit(code == 0 and 0 or 1)
  end
  H = H or dofile(here .. 'harness.lua')
  local em = require 'ember'
  if not em.cuda.is_available() then
    H.check(false, ('no CUDA device (%s): %s'):format(
      real and 'EMBER_TEST_REAL_CUDA is set' or 'EMBER_CUDA_EMULATE=' .. spec,
      tostring(em.cuda.why_not())))
    H.done()
  end
  return H, em
end

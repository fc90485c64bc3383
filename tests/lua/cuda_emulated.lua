--[[
cuda_emulated.lua -- makes a CUDA test run on the emulated devices it was written
for: when EMBER_CUDA_EMULATE is not `spec`, the test script runs again under it,
its output is passed on, and this process exits with the child's status (LuaJIT's
p:close() does not return it, so the shell echoes it). With EMBER_TEST_REAL_CUDA set
(tests/bench/gpu_run.sh on a GPU machine) the test runs as it is, on the real devices.
  dofile(dir .. 'cuda_emulated.lua')('2:64')
]]
return function(spec)
  if os.getenv('EMBER_CUDA_EMULATE') == spec or os.getenv('EMBER_TEST_REAL_CUDA') then return end
  local ember = arg[-1] or 'ember'
  local p = io.popen(('EMBER_CUDA_EMULATE=%s %s %s 2>&1; echo "#exit $?"'):format(spec, ember,
                                                                                   arg[0]))
  local out = p:read('*a')
  p:close()
  local code = tonumber(out:match('#exit (%d+)%s*$'))
  io.stdout:write((out:gsub('#exit %d+%s*$', '')))
  os.exit(code == 0 and 0 or 1)
end

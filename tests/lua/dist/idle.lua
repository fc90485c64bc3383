--[[
idle.lua -- what a replica that plays dead does while the others find out:
it sleeps, it does not spin. A spinning replica takes a whole core from the
tests that run beside it (tests/run.sh runs programs side by side) and, on two
cores, slows the very replicas whose timeout is being tested.

  dofile((arg[0]:match('^(.*/)') or './') .. 'idle.lua')(6)   -- 6 s
]]
local ffi = require 'ffi'
pcall(ffi.cdef, 'int poll(void *fds, unsigned long nfds, int timeout_ms);')
return function(seconds)
  local left = seconds
  while left > 0 do
    local ms = math.min(left, 1) * 1000
    ffi.C.poll(nil, 0, math.floor(ms))
    left = left - ms / 1000
  end
end

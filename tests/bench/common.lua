--[[
common.lua -- shared by the ember side of the benchmarks: a monotonic clock, the
median, and the result line tests/bench/run.sh reads:

  RESULT <name> <value> <unit> <lower|higher> <target...>

(lower|higher says which way is better; the target is free text for the table.)
Both sides run with 2 threads: run.sh sets EMBER_NUM_THREADS, OMP_NUM_THREADS and
OPENBLAS_NUM_THREADS, and this file also asks ember directly when it can.
]]
local ffi = require 'ffi'
local em = require 'ember'

local B = {}

-- em.clock is the monotonic wall clock (a second declaration of clock_gettime
-- with another struct type would clash with it in the FFI).
B.now = em.clock

function B.median(xs)
  local s = {}
  for i, v in ipairs(xs) do s[i] = v end
  table.sort(s)
  local n = #s
  return n % 2 == 1 and s[(n + 1) / 2] or (s[n / 2] + s[n / 2 + 1]) / 2
end

-- Runs fn(n) `reps` times and returns the median seconds per iteration.
function B.time(fn, n, reps)
  local ts = {}
  for r = 1, reps or 5 do
    local t0 = B.now()
    fn(n)
    ts[r] = (B.now() - t0) / n
  end
  return B.median(ts)
end

function B.result(name, value, unit, better, target)
  io.write(('RESULT %s %.6g %s %s %s\n'):format(name, value, unit, better, target or ''))
  io.stdout:flush()
end

-- The peers' python for a benchmark that runs its twin itself: run.sh's
-- (EMBER_BENCH_PYTHON), else the environment tests/bench/peers/setup.sh made, else
-- Debian's.
function B.python()
  local py = os.getenv('EMBER_BENCH_PYTHON')
  if py and py ~= '' then return py end
  local cache = os.getenv('XDG_CACHE_HOME') or ((os.getenv('HOME') or '') .. '/.cache')
  py = (os.getenv('EMBER_PEERS_VENV') or (cache .. '/ember/peers')) .. '/bin/python'
  local f = io.open(py, 'r')
  if f then f:close(); return py end
  return '/usr/bin/python3'
end

local threads = tonumber(os.getenv('EMBER_NUM_THREADS') or '2') or 2
if type(em.set_num_threads) == 'function' then pcall(em.set_num_threads, threads) end

B.em = em
return B

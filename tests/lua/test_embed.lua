--[[
test_embed.lua -- the game-loop host of examples/embed/ as an embedder would
meet it: built as a separate C program against this build's libember.so and
libember_lua.so (luaopen_ember), then run for a few hundred seeded episodes.

Checks: it learns (the success rate per 100 episodes rises, and two runs of one
seed agree to the last bit); it prints per-frame latencies (the policy's
forward p99 under 1 ms, outside sanitizers); an injected script error is
reported and the game goes on -- learning too, or with the last good policy
once learn() keeps failing; a memory cap is a clean error, never a crash, both
when it refuses the state and when it bites mid-game; two agents on two
threads get exactly what each gets alone.

Under ThreadSanitizer (the build of `make test SANITIZE=thread`, seen from the
process: __tsan_init exists) the program is compiled with -fsanitize=thread too
and the checks that matter there run: two agents, errors, the cap.
]]
local dir = (arg and arg[0] and arg[0]:match('^(.*/)')) or
            ((os.getenv('EMBER_TESTS') or 'tests') .. '/lua/')
local H = dofile(dir .. 'harness.lua')
local core = require 'ember.ffi'

local root = dir .. '../../'
local build = core.dir:gsub('/lua/ember$', '')
local tsan = H.tsan()

local function sh(cmd)
  local p = io.popen('(' .. cmd .. ') 2>&1; echo "#rc=$?"')
  local out = p:read('*a')
  p:close()
  local rc = tonumber(out:match('#rc=(%d+)%s*$'))
  return out:gsub('#rc=%d+%s*$', ''), rc
end

local function q(s) return "'" .. s:gsub("'", "'\\''") .. "'" end

-- The program, built the way examples/embed/Makefile builds it, with this
-- build's include and library folders in place of pkg-config's.
local exe = build .. '/embed_game'
local script = root .. 'examples/embed/policy.lua'
local flags = tsan and '-O1 -g -fsanitize=thread' or '-O2'
local luajit = (sh('pkg-config --cflags --libs luajit')):gsub('%s+$', '')
if luajit == '' or luajit:find('not found') then luajit = '-I/usr/include/luajit-2.1 -lluajit-5.1' end
local built_out, built_rc = sh(('cc -std=gnu11 -pthread %s -Wall -Wextra -Werror -I%s -o %s %s ' ..
  '-L%s -lember -lember_lua %s -Wl,-rpath,%s'):format(flags, q(root .. 'core/include'), q(exe),
  q(root .. 'examples/embed/game.c'), q(build), luajit, q(build)))

-- Runs the game; returns its output, exit status and what it printed, parsed.
local function game(args)
  local out, rc = sh(q(exe) .. ' --script ' .. q(script) .. ' ' .. args)
  local r = { out = out, rc = rc, agents = {} }
  for id, pct in out:gmatch('agent (%d+) episodes%s+%d+%-%d+%s+success%s+(%d+)%%') do
    local a = r.agents[tonumber(id)] or { curve = {} }
    r.agents[tonumber(id)] = a
    a.curve[#a.curve + 1] = tonumber(pct)
  end
  for id, sum in out:gmatch('agent (%d+) checksum (%S+ %S+)') do r.agents[tonumber(id)].checksum = sum end
  for id, p50, p99 in out:gmatch('agent (%d+) latency over %d+ frames: policy forward p50 ([%d.]+) us, p99 ([%d.]+) us') do
    r.agents[tonumber(id)].fwd_p50, r.agents[tonumber(id)].fwd_p99 = tonumber(p50), tonumber(p99)
  end
  for id, n in out:gmatch('agent (%d+) script errors: (%d+)') do r.agents[tonumber(id)].errors = tonumber(n) end
  for id, n in out:gmatch('agent (%d+) memory: peak %d+ bytes[^,]*, (%d+) allocations refused') do
    if r.agents[tonumber(id)] then r.agents[tonumber(id)].refused = tonumber(n) end
  end
  return r
end

-- A clean run: exit status 0 and no sanitizer report.
local function clean(r, want_rc)
  H.check(r.rc == (want_rc or 0), ('exit status %s, want %d:\n%s'):format(tostring(r.rc), want_rc or 0, r.out), 2)
  H.check(not r.out:find('ThreadSanitizer', 1, true), 'ThreadSanitizer report:\n' .. r.out, 2)
end

local function rises(curve, by)
  return #curve >= 2 and curve[#curve] >= curve[1] + by, ('learning curve %s'):format(H.show(curve))
end

local EP = tsan and 200 or 300

H.test('the example builds against the library (ember.h, libember, luaopen_ember)', function()
  H.check(built_rc == 0, 'cc failed:\n' .. built_out)
end)
if built_rc ~= 0 then H.done() return end

local solo
H.test('it learns, prints latencies, and a seed fixes every bit', function()
  solo = game('--episodes ' .. EP .. ' --seed 1')
  clean(solo)
  local a = solo.agents[0] or { curve = {} }
  H.check(rises(a.curve, 30))
  H.check(a.fwd_p50 and a.fwd_p99, 'no latency line:\n' .. solo.out)
  if not tsan then H.check((a.fwd_p99 or 1e9) < 1000, 'policy forward p99 ' .. tostring(a.fwd_p99) .. ' us >= 1 ms') end
  H.eq(a.errors, 0, 'script errors')
  if not tsan then
    local again = game('--episodes ' .. EP .. ' --seed 1')
    H.eq(again.agents[0] and again.agents[0].checksum, a.checksum, 'checksum of a second run')
  end
end)

H.test('an injected script error is reported and the game goes on learning', function()
  local r = game('--episodes ' .. EP .. ' --seed 1 --fail-at 500')
  clean(r)
  local a = r.agents[0] or { curve = {} }
  H.eq(a.errors, 1, 'script errors')
  H.check(r.out:find('script error at frame 500 in learn%(%): [^\n]*injected error'), 'no report:\n' .. r.out)
  H.check(r.out:find('policy.lua:%d+: in function'), 'no traceback into the script:\n' .. r.out)
  H.check(rises(a.curve, 30))
  r = game('--episodes 100 --seed 1 --fail-at 300 --fail-in act')
  clean(r)
  H.check(r.out:find('script error at frame 300 in act%(%)'), 'no act() report:\n' .. r.out)
end)

H.test('learn() failing every time: the host keeps the last good policy', function()
  local r = game('--episodes ' .. EP .. ' --seed 1 --fail-at 2000 --fail-mode always')
  clean(r)
  H.check(r.out:find('learning stopped at frame %d+; kept acting with the last good policy'),
          'no stop report:\n' .. r.out)
  local a = r.agents[0] or { curve = {} }
  -- By frame 2000 the policy is good; it keeps succeeding without learning.
  H.check((a.curve[#a.curve] or 0) >= 50, 'success after learning stopped: ' .. H.show(a.curve))
end)

H.test('a memory cap is a clean error, never a crash', function()
  local r = game('--episodes 10 --mem-cap 1000')
  clean(r, 2)
  H.check(r.out:find('agent 0: could not start: [^\n]*out of memory'), 'no clean message:\n' .. r.out)
  -- Room for the state and the script's buffers, not for what learning needs:
  -- refusals mid-game are script errors, the game goes on.
  r = game('--episodes 100 --mem-cap 700000 --quiet')
  clean(r)
  local a = r.agents[0] or {}
  H.check((a.refused or 0) > 0 and (a.errors or 0) > 0 and #(a.curve or {}) == 1,
          'no refusals mid-game:\n' .. r.out)
  H.check(r.out:find('out of memory allocating'), 'the first error names the allocation:\n' .. r.out)
  -- Room for learning, not for the garbage of many frames: the refusals are
  -- met by collections (an op's retry, and the backward's own) -- no error.
  r = game('--episodes 100 --mem-cap 800000 --quiet')
  clean(r)
  a = r.agents[0] or {}
  H.check((a.refused or 0) > 0 and (a.errors or 0) == 0 and #(a.curve or {}) == 1,
          'refusals met by collections, no script error:\n' .. r.out)
end)

H.test('two agents on two threads get what each gets alone', function()
  local two = game('--episodes ' .. EP .. ' --seed 1 --agents 2')
  clean(two)
  local lone2 = game('--episodes ' .. EP .. ' --seed 2')
  clean(lone2)
  local first = solo and solo.agents[0] and solo.agents[0].checksum
  H.eq(two.agents[0] and two.agents[0].checksum, first, 'agent 0 beside agent 1 vs alone')
  H.eq(two.agents[1] and two.agents[1].checksum, lone2.agents[0] and lone2.agents[0].checksum,
       'agent 1 beside agent 0 vs alone')
end)

os.remove(exe)
H.done()

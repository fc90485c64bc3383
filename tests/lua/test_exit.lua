--[[
test_exit.lua -- os.exit in scripts run by the ember command: the exit status,
what is flushed, what pcall / xpcall / coroutines can't stop; under
`ember --replicas N` it ends its own replica only (the others go on, or fail
with "replica K exited" when they need it; the status is the worst of the
replicas'); under mpirun a zero exit finalizes MPI cleanly and a non-zero one
ends the job naming it.
]]
local dir = (arg and arg[0] and arg[0]:match('^(.*/)')) or
            ((os.getenv('EMBER_TESTS') or 'tests') .. '/lua/')
local H = dofile(dir .. 'harness.lua')
local em = require 'ember'
local ember = arg[-1] or 'ember'

-- `ember opts script` (the script given as text, or read from stdin): its output
-- (stdout and stderr) and exit status.
local function run(opts, text, stdin) return H.ember(text, { args = opts, stdin = stdin }) end

H.test('a plain run exits with the code, everything flushed', function()
  for _, c in ipairs({ { '3', 3 }, { '0', 0 }, { '', 0 }, { 'true', 0 }, { 'false', 1 } }) do
    local out, rc = run('', 'io.write("before ") os.exit(' .. c[1] .. ') print("after")')
    H.eq(rc, c[2], 'os.exit(' .. c[1] .. '): ' .. out)
    H.eq(out, 'before ', 'unflushed output written, nothing after')
  end
  -- a file written and not closed is flushed when the state closes
  local path = os.tmpname()
  local out, rc = run('', ('local f = io.open(%q, "w") f:write("kept") os.exit(0)'):format(path))
  H.eq(rc, 0, out)
  local f = io.open(path)
  H.eq(f and f:read('*a'), 'kept')
  if f then f:close() end
  os.remove(path)
  -- ember's state closes too: a tensor alive at the exit is released
  out, rc = run('', 'local t = em.ones(1000) os.exit(5)')
  H.eq(rc, 5, out)
  -- -e code and stdin
  local p = io.popen(ember .. ' -e "os.exit(6)" -e "print(1)" 2>&1; echo "exit=$?"')
  out = p:read('*a')
  p:close()
  H.eq(out, 'exit=6\n')
  out, rc = run('', 'print("in") os.exit(7)', true)
  H.eq(rc, 7, out)
  H.check(out:find('^in\n'), out)
end)

H.test('pcall, xpcall and coroutines do not stop an exit', function()
  local out, rc = run('', 'print(pcall(os.exit, 4)) print("after")')
  H.eq({ out, rc }, { '', 4 }, 'nothing printed, status 4')
  out, rc = run('', 'print(xpcall(function() os.exit(2) end, function(e) print("handler") return e end)) print("after")')
  H.eq({ out, rc }, { '', 2 }, 'nothing printed, status 2')
  out, rc = run('', [[
local co = coroutine.create(function() coroutine.yield(1) os.exit(3) end)
print(coroutine.resume(co))
print(coroutine.resume(co))
print('after')]])
  H.eq({ out, rc }, { 'true\t1\n', 3 }, 'the first resume printed, status 3')
  out, rc = run('', 'local f = coroutine.wrap(function() os.exit(9) end) pcall(f) print("after")')
  H.eq({ out, rc }, { '', 9 }, 'nothing printed, status 9')
  -- errors still work as before around them
  out, rc = run('', [[
print(pcall(error, 'plain'))
print(select('#', pcall(function() return 1, nil, 3 end)))
print(xpcall(function(a, b) return a + b end, print, 2, 3))
print(xpcall(function() error('x', 0) end, function(e) return 'h:' .. e end))
local ok, e = pcall(function() return em.ones(2) + em.ones(3) end)
print(ok, e)]])
  H.eq(rc, 0, out)
  H.check(out:find('^false\tplain\n4\ntrue\t5\nfalse\th:x\nfalse\t[^\n]*:5: ') ~= nil,
    'results and positions (the user line, not the wrapper): ' .. out)
end)

H.test('--replicas: os.exit(0) ends its replica only', function()
  local out, rc = run('--replicas 2', [[
local s = em.distribute.mirrored{}
s:barrier()
if s.rank == 0 then print('rank 0 leaves') os.exit(0) end
os.execute('sleep 0.3')
local t = em.zeros(4)
for i = 1, 5 do t:add_(i) end
print('rank ' .. s.rank .. ' done ' .. t:sum():item())]])
  H.eq(rc, 0, out)
  H.check(out:find('rank 0 leaves', 1, true), out)
  H.check(out:find('[rank 1] rank 1 done 60', 1, true), 'the other replica finished: ' .. out)
end)

H.test('--replicas: a replica that needs one that exited fails naming it', function()
  local out, rc = run('--replicas 3', [[
local s = em.distribute.mirrored{timeout = 120}
s:barrier()
if s.rank == 1 then os.exit(0) end
os.execute('sleep 0.3')
local ok, err = pcall(function() return s:allreduce(em.ones(2)) end)
print('rank ' .. s.rank .. ' allreduce ' .. tostring(ok) .. ' ' .. tostring(err))]])
  H.eq(rc, 0, out)    -- each caught its error
  for _, r in ipairs({ 0, 2 }) do
    H.check(out:find('rank ' .. r .. ' allreduce false [^\n]*: replica 1 exited\n'), out)
  end
  H.check(not out:find('timed out'), out)
  out, rc = run('--replicas 2', [[
local s = em.distribute.mirrored{timeout = 120}
if s.rank == 0 then os.exit(0) end
s:allreduce(em.ones(2))]])
  H.eq(rc, 1, out)
  H.check(out:find('ember: replica 1 failed: [^\n]*replica 0 exited'), out)
end)

H.test('--replicas: the exit status is the worst of the replicas\'', function()
  local out, rc = run('--replicas 3', [[
local s = em.distribute.mirrored{}
if s.rank == 2 then os.exit(4) end
if s.rank == 1 then os.exit(0) end
print('rank ' .. s.rank .. ' went on')]])
  H.eq(rc, 4, out)
  H.check(out:find('rank 0 went on', 1, true), out)
  H.check(out:find('replica 2 failed: os.exit(4)', 1, true), out)
  out, rc = run('--replicas 2', [[
local s = em.distribute.mirrored{}
if s.rank == 0 then error('boom') end
os.exit(3)]])
  H.eq(rc, 3, out)
  out, rc = run('--replicas 2', [[
local s = em.distribute.mirrored{}
if s.rank == 1 then os.exit(0) end
error('boom')]])
  H.eq(rc, 1, out)
  H.check(out:find('replica 0 failed: [^\n]*boom'), out)
end)

local no_mpi = os.getenv('EMBER_TEST_NO_MPI')
local have_mpirun = not no_mpi and os.execute('command -v mpirun >/dev/null 2>&1') == 0
local MPIRUN = 'OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 timeout 120 mpirun ' ..
  '--oversubscribe --bind-to none --mca btl self,vader,tcp --mca btl_tcp_if_include lo ' ..
  '--mca oob_tcp_if_include lo -np 2 '

local function mpirun(text) return H.ember(text, { prefix = MPIRUN }) end

H.test('under mpirun: os.exit(0) finalizes MPI; a non-zero exit ends the job', function()
  if not have_mpirun then
    H.skip(no_mpi and 'mpirun runs skipped: ' .. no_mpi or 'mpirun not found (Debian: openmpi-bin)')
    return
  end
  local out, rc = mpirun([[
local s = em.distribute.mirrored{}
local t = s:allreduce(em.ones(3))
print('rank ' .. s.rank .. ' sum ' .. t:sum():item())
os.exit(0)]])
  H.eq(rc, 0, out)
  H.check(not out:find('improperly'), out)
  H.check(out:find('rank 0 sum 6', 1, true) and out:find('[rank 1] rank 1 sum 6', 1, true), out)
  -- one leaves early, the other goes on without it
  out, rc = mpirun([[
local s = em.distribute.mirrored{}
s:barrier()
if s.rank == 0 then os.exit(0) end
os.execute('sleep 0.3')
print('rank ' .. s.rank .. ' went on ' .. em.ones(3):sum():item())]])
  H.eq(rc, 0, out)
  H.check(out:find('[rank 1] rank 1 went on 3', 1, true), out)
  -- one leaves, the other needs it
  out, rc = mpirun([[
local s = em.distribute.mirrored{timeout = 60}
s:barrier()
if s.rank == 1 then os.exit(0) end
s:allreduce(em.ones(2))]])
  H.check(rc ~= 0, 'the job fails: ' .. out)
  H.check(out:find('ember: [^\n]*: replica 1 exited'), out)
  -- a non-zero exit ends the job, naming it
  out, rc = mpirun([[
local s = em.distribute.mirrored{timeout = 60}
s:barrier()
if s.rank == 1 then os.exit(3) end
s:allreduce(em.ones(2))]])
  H.check(rc ~= 0, 'the job fails: ' .. out)
  H.check(out:find('replica 1 failed: os.exit(3)', 1, true), out)
end)

H.done()

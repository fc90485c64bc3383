--[[
launch.lua -- how the tests run a script of tests/lua/dist/ on several replicas:
`ember --replicas N` (threads joined by the local communicator) or mpirun
(processes). Each returns the output (stdout and stderr), the exit status and
the wall seconds.

  local L = dofile(dir .. 'dist/launch.lua')(dir, ember)
  local out, rc = L.replicas(2, 'script.lua', 'args', 'ENV=1')
  if L.have_mpirun() then L.mpirun(3, 'script.lua', 'args') else H.skip(L.no_mpirun_why) end
]]
local em = require 'ember'

return function(dir, ember)
  local L = {}

  local function run(cmd)
    local t0 = em.clock()
    local p = io.popen(cmd)
    local out = p:read('*a')
    p:close()
    return out, tonumber(out:match('exit=(%d+)%s*$')), em.clock() - t0
  end

  -- Any command line (its output, status and seconds).
  function L.run(cmd) return run(cmd .. ' 2>&1; echo "exit=$?"') end

  local function path(script)
    return script:match('^/') and script or dir .. 'dist/' .. script
  end

  function L.replicas(n, script, args, env)
    return run(('%s%s --replicas %d %s %s 2>&1; echo "exit=$?"'):format(
      env and env .. ' ' or '', ember, n, path(script), args or ''))
  end

  -- As root Open MPI needs its allow-run-as-root variables. EMBER_TEST_NO_MPI:
  -- the ThreadSanitizer pass (Open MPI's uninstrumented plugins trip it inside
  -- libmpi; ember's own threads are checked by the local runs).
  local no_mpi = os.getenv('EMBER_TEST_NO_MPI')
  function L.have_mpirun()
    return not no_mpi and os.execute('command -v mpirun >/dev/null 2>&1') == 0
  end
  L.no_mpirun_why = no_mpi and 'mpirun runs skipped: ' .. no_mpi or
    'mpirun not found (Debian: openmpi-bin)'

  function L.mpirun(n, script, args, env)
    return run(('%sOMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 timeout 120 mpirun ' ..
      '--oversubscribe --bind-to none --mca btl self,vader,tcp --mca btl_tcp_if_include lo ' ..
      '--mca oob_tcp_if_include lo -np %d %s %s %s 2>&1; echo "exit=$?"'):format(
      env and env .. ' ' or '', n, ember, path(script), args or ''))
  end

  return L
end

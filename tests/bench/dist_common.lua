--[[
dist_common.lua -- shared by the em.distribute benchmarks (bench_allreduce,
bench_ddp_cnn, bench_ddp_overhead, bench_ddp_overlap, bench_pipeline, bench_shard):
each bench file is both a driver and a worker. Run plainly (by run.sh, or by
hand) it is the driver: it starts itself again as replicas with `--worker ...`

  local   EMBER_NUM_THREADS=1 ember --replicas 2 bench_X.lua --worker ...
  mpi     mpirun -np 2 --oversubscribe --bind-to none ember bench_X.lua --worker ...
  1x2     EMBER_NUM_THREADS=2 ember bench_X.lua --worker ...

reads the `DATA <key> <value>` lines replica 0 prints, and prints the table and
the RESULT lines run.sh reads. When a launch fails its figures are "n/a (reason)"
and no RESULT line is printed for them (a SKIP line says why).

Standalone, the driver also runs the PyTorch twin (bench_X.py, under
$EMBER_BENCH_PYTHON, default /usr/bin/python3) once, so that its table carries the ratios measured in the same
run; run.sh sets EMBER_BENCH_PEER=0, as it runs the twin itself, alternating.
]]
local B = dofile(debug.getinfo(1, 'S').source:sub(2):match('(.*/)') .. 'common.lua')
local em = B.em

local D = {}

D.ember = arg and arg[-1] or 'ember'
D.script = arg and arg[0]
-- The peers' python: run.sh's (EMBER_BENCH_PYTHON), else the environment that
-- tests/bench/peers/setup.sh made, else Debian's.
local function peers_python()
  local cache = os.getenv('XDG_CACHE_HOME') or ((os.getenv('HOME') or '') .. '/.cache')
  local py = (os.getenv('EMBER_PEERS_VENV') or (cache .. '/ember/peers')) .. '/bin/python'
  local f = io.open(py, 'r')
  if f then f:close(); return py end
end
D.PY = os.getenv('EMBER_BENCH_PYTHON') or peers_python() or '/usr/bin/python3'

local function quote(s) return "'" .. tostring(s):gsub("'", "'\\''") .. "'" end
D.quote = quote

-- The worker's options: `--worker --key value ...` -> {key = value}; nil when this
-- is not a worker.
function D.worker_args()
  if not (arg and arg[1] == '--worker') then return nil end
  local o, i = {}, 2
  while arg[i] do
    local k = assert(arg[i]:match('^%-%-(.+)$'), 'bad worker argument ' .. arg[i])
    local v = arg[i + 1]
    o[k] = tonumber(v) or v
    i = i + 2
  end
  return o
end

-- The worker's timing: `warm` untimed steps, a barrier, then `steps` timed ones;
-- step(i, timed) runs step i of its phase. Returns the slowest replica's seconds,
-- the time the whole group took.
function D.timed(s, warm, steps, step)
  for i = 1, warm do step(i, false) end
  s:barrier()
  local t0 = em.clock()
  for i = 1, steps do step(i, true) end
  local secs = em.clock() - t0
  return s:allreduce(em.tensor({ secs }, { dtype = 'float64' }), 'max'):item()
end

-- A line for the driver, from replica 0 only.
function D.data(s, key, value)
  if s.rank == 0 then
    io.write(('DATA %s %.9g\n'):format(key, value))
    io.stdout:flush()
  end
end

-- Runs a shell command; returns its output (stdout and stderr), exit status, seconds.
function D.sh(cmd)
  local t0 = em.clock()
  local p = io.popen(cmd .. ' 2>&1; echo "exit=$?"')
  local out = p:read('*a')
  p:close()
  local rc = tonumber(out:match('exit=(%d+)%s*$')) or -1
  out = out:gsub('exit=%d+%s*$', '')
  return out, rc, em.clock() - t0
end

local function argstring(args)
  local parts = {}
  for _, a in ipairs(args or {}) do parts[#parts + 1] = quote(a) end
  return table.concat(parts, ' ')
end

-- The environment every launch gets: `threads` intra-op threads per replica.
local function env(threads)
  return ('EMBER_NUM_THREADS=%d OMP_NUM_THREADS=%d OPENBLAS_NUM_THREADS=%d EMBER_BENCH_PEER=0')
    :format(threads, threads, threads)
end

local TIMEOUT = tonumber(os.getenv('EMBER_BENCH_TIMEOUT') or '') or 900

-- The launch command of one configuration: how = 'local' | 'mpi' | 'single'.
function D.command(how, n, threads, args)
  local a = argstring(args)
  if how == 'local' then
    return ('%s timeout %d %s --replicas %d %s --worker %s'):format(env(threads), TIMEOUT,
      quote(D.ember), n, quote(D.script), a)
  elseif how == 'mpi' then
    return ('OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1 ' ..
            '%s timeout %d mpirun -np %d --oversubscribe --bind-to none %s %s --worker %s')
      :format(env(threads), TIMEOUT, n, quote(D.ember), quote(D.script), a)
  end
  return ('%s timeout %d %s %s --worker %s'):format(env(threads), TIMEOUT, quote(D.ember),
    quote(D.script), a)
end

local function last_line(out)
  local last
  for line in out:gmatch('[^\n]+') do
    if line:match('%S') and not line:match('^DATA ') then last = line end
  end
  return last
end

-- Runs a configuration; returns {key = value} from its DATA lines, or nil and why.
function D.launch(how, n, threads, args)
  if how == 'mpi' and select(2, D.sh('command -v mpirun >/dev/null')) ~= 0 then
    return nil, 'no mpirun'
  end
  local out, rc = D.sh(D.command(how, n, threads, args))
  local r, any = {}, false
  for k, v in out:gmatch('DATA (%S+) (%S+)') do r[k] = tonumber(v); any = true end
  if rc ~= 0 or not any then
    local why = last_line(out) or ('exit status ' .. rc)
    if rc == 124 then why = 'timed out after ' .. TIMEOUT .. ' s' end
    why = why:gsub('^%[rank %d+%] ', ''):sub(1, 160)
    return nil, ('%s failed: %s'):format(how, why)
  end
  return r
end

-- A twin's RESULT lines {name = value} (module: 'torch', the default, or
-- 'tensorflow' for a _tf twin), when it is wanted and can run; else nil and why.
function D.peer(pyfile, args, module)
  module = module or 'torch'
  local want = os.getenv('EMBER_BENCH_PEER')
  if want == '0' then return nil, 'run.sh runs it' end
  if select(2, D.sh(D.PY .. " -c 'import " .. module .. "'")) ~= 0 then return nil, 'no ' .. module end
  local out, rc = D.sh(('EMBER_NUM_THREADS=2 OMP_NUM_THREADS=2 TF_CPP_MIN_LOG_LEVEL=2 ' ..
    'PYTHONDONTWRITEBYTECODE=1 %s %s %s'):format(D.PY, quote(pyfile), argstring(args)))
  local r, any = {}, false
  for k, v in out:gmatch('RESULT (%S+) (%S+)') do r[k] = tonumber(v); any = true end
  if rc ~= 0 or not any then return nil, module .. ' failed: ' .. (last_line(out) or rc) end
  return r
end

-- The driver's options: `--key value ...` over the defaults {key = value}; a key
-- whose default is a number takes a number. An unknown key, a missing value or a
-- non-number raises `usage`.
function D.options(defaults, usage)
  local o = {}
  for k, v in pairs(defaults) do o[k] = v end
  local i = 1
  while arg and arg[i] do
    local k, v = arg[i]:match('^%-%-(%a+)$'), arg[i + 1]
    if o[k] == nil or v == nil then error(usage, 0) end
    o[k] = type(defaults[k]) == 'number' and tonumber(v) or v
    if o[k] == nil then error(usage, 0) end
    i = i + 2
  end
  return o
end

-- 'a,b,c' -> {'a', 'b', 'c'}
function D.split(str)
  local t = {}
  for x in str:gmatch('[^,]+') do t[#t + 1] = x end
  return t
end

function D.fmt(v, f)
  if v == nil then return 'n/a' end
  return (f or '%.4g'):format(v)
end

-- One "n/a (reason)" note per failed configuration, printed once.
function D.skip(name, why) print(('SKIP %s: n/a (%s)'):format(name, why)) end

D.B = B
return D

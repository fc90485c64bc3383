--[[
doctest.lua -- runs the code blocks of ember's docs and checks what they print.

  build/ember tools/doctest.lua [-q] PAGE.md [PAGE.md ...]

Each page's ```lua blocks run in order in one Lua state of their own (a child
`ember` per page, so one page's globals, seed or crash cannot reach another):
globals carry over from block to block, locals do not, `em` is preloaded. An
```output block right after a block must equal what it printed (print and
io.write), line by line, trailing spaces ignored. Flags after `lua`:

  norun        not run: counted and listed as skipped, with the block's first
               comment line as the reason
  gpu          run on the emulated CUDA devices (EMBER_CUDA_EMULATE=2:256): the
               page's gpu blocks run in order in one more child state
  replicas=N   the block is a whole script, run as `ember --replicas N FILE`
  mpi=N        the same under `mpirun -np N ember FILE` (skipped, saying so, where
               there is no mpirun)
  fresh        the same as `ember FILE`

For the last three an output block compares the process's standard output
(in any order of lines for replicas and mpi: replicas print side by side). A
```c block whose info string has `run` is compiled with cc against the build's
ember.h and libember and run. Other blocks (sh, text, c, output alone) are not
run. A failure prints `FAIL page:line: error`; each page ends with its counts,
the whole run with `N run, N failed, N skipped` and the status 1 on a failure.
Every process of a page runs in a fresh temporary folder (removed after it), so
what an example writes (a checkpoint, an image) stays out of the checkout.
-q prints only failures, skips and the counts. A page's process that runs past
EMBER_DOCTEST_TIMEOUT seconds (default 300) is stopped and fails.

Internal: `--page FILE NAME` and `--page-gpu FILE NAME` run a page's blocks in this
process and report each as `#doctest RESULT LINE MESSAGE` (the parent's input).
]]
local parse = require 'ember.doc_parse'

-- Absolute paths: the blocks run in a temporary folder of their own.
local cwd = os.getenv('PWD') or '.'
local function absolute(p) return p:sub(1, 1) == '/' and p or cwd .. '/' .. p end
local here = absolute(debug.getinfo(1, 'S').source:match('^@(.*)/[^/]*$') or '.')
local root = here .. '/..'
local ember = arg[-1] or 'ember'
if ember:find('/', 1, true) then ember = absolute(ember) end
local GPU_SPEC = '2:256'

local function read(path)
  local f, err = io.open(path, 'rb')
  if not f then return nil, err end
  local s = f:read('*a')
  f:close()
  return s
end

local function sh_quote(s) return "'" .. tostring(s):gsub("'", "'\\''") .. "'" end

-- The words of an info string: kind ('lua'), flags {norun = true, replicas = '2'}.
local function info_of(info)
  local kind, rest = info:match('^(%S*)%s*(.*)$')
  local flags = {}
  for w in rest:gmatch('%S+') do
    local k, v = w:match('^([%w_]+)=(.*)$')
    if k then flags[k] = v else flags[w] = true end
  end
  return kind, flags
end

local function norm(s)
  return (s:gsub('[ \t]+\n', '\n'):gsub('[ \t]+$', ''):gsub('\n+$', ''))
end

local function escape(s) return (tostring(s):gsub('\\', '\\\\'):gsub('\n', '\\n')) end
local function unescape(s) return (s:gsub('\\(.)', function(c) return c == 'n' and '\n' or c end)) end

local function diff_message(want, got)
  return ('output differs\n--- expected\n%s\n--- got\n%s'):format(want, got)
end

-- The reason of a norun block: its first comment line.
local function norun_reason(code)
  for l in (code .. '\n'):gmatch('([^\n]*)\n') do
    local c = l:match('^%s*%-%-%s*(.-)%s*$')
    if c and c ~= '' then return c end
  end
  return '(no reason given: start the block with a comment saying why)'
end

-- The blocks to handle, each with the output block that follows it (if any).
local function plan(text)
  local blocks, out = parse.blocks(text), {}
  for i, b in ipairs(blocks) do
    local kind, flags = info_of(b.info)
    if kind == 'lua' or (kind == 'c' and flags.run) then
      local nxt = blocks[i + 1]
      local want = nxt and info_of(nxt.info) == 'output' and nxt.code or nil
      out[#out + 1] = { kind = kind, flags = flags, code = b.code, line = b.line, want = want }
    end
  end
  return out
end

-- -- In the child: one page's blocks in this state ----------------------------------------
local function run_in_state(path, gpu, page)
  local text = assert(read(path))
  -- print and io.write are captured for the whole state (the page has it alone), so
  -- what ember itself prints (a plan, a report) is compared too
  local buf
  _G.print = function(...)
    local n = select('#', ...)
    local parts = {}
    for k = 1, n do parts[k] = tostring((select(k, ...))) end
    buf[#buf + 1] = table.concat(parts, '\t') .. '\n'
  end
  io.write = function(...)
    for k = 1, select('#', ...) do buf[#buf + 1] = tostring((select(k, ...))) end
    return io.stdout
  end
  for _, b in ipairs(plan(text)) do
    if b.kind == 'lua' and not b.flags.norun and not b.flags.replicas and not b.flags.mpi
       and not b.flags.fresh and (b.flags.gpu and true or false) == gpu then
      buf = {}
      -- the block's lines keep their page numbers: an error says page:line
      local fn, err = loadstring(('\n'):rep(b.line) .. b.code, '@' .. page)
      if fn then
        local ok, e = xpcall(fn, function(m) return debug.traceback(tostring(m), 2) end)
        if not ok then err = e:gsub('\n%s*%[C%]: in function \'xpcall0?\'.*$', '') end
      end
      if err then
        io.stdout:write(('#doctest FAIL %d %s\n'):format(b.line, escape(err)))
      elseif b.want and norm(table.concat(buf)) ~= norm(b.want) then
        io.stdout:write(('#doctest FAIL %d %s\n'):format(b.line,
          escape(diff_message(norm(b.want), norm(table.concat(buf))))))
      else
        io.stdout:write(('#doctest PASS %d\n'):format(b.line))
      end
      io.stdout:flush()
    end
  end
end

if arg[1] == '--page' or arg[1] == '--page-gpu' then
  run_in_state(arg[2], arg[1] == '--page-gpu', arg[3] or arg[2])
  os.exit(0)
end

-- -- In the parent -----------------------------------------------------------------------------
local quiet = false
local files = {}
for _, a in ipairs(arg) do
  if a == '-q' then quiet = true else files[#files + 1] = a end
end
if #files == 0 then
  io.stderr:write('usage: ember tools/doctest.lua [-q] PAGE.md [PAGE.md ...]\n')
  os.exit(2)
end

local function have(cmd)
  local p = io.popen('command -v ' .. cmd .. ' 2>/dev/null')
  local s = p:read('*a')
  p:close()
  return s:match('%S') ~= nil
end

-- Runs a shell command: its standard output, its standard error and its status.
local workdir     -- the page's temporary folder
-- A page's process that runs past LIMIT seconds is stopped (status 124): a block
-- that hangs fails its page, not the whole test run.
local LIMIT = tonumber(os.getenv('EMBER_DOCTEST_TIMEOUT') or '') or 300
local timeout = nil
local function run(cmd)
  if timeout == nil then timeout = have('timeout') and ('timeout -k 5 %d '):format(LIMIT) or '' end
  local errfile = os.tmpname()
  local p = io.popen(('cd %s && %s%s 2>%s; echo "#status $?"'):format(sh_quote(workdir or '.'),
                                                                      timeout, cmd, sh_quote(errfile)))
  local out = p:read('*a')
  p:close()
  local err = read(errfile) or ''
  os.remove(errfile)
  local status = tonumber(out:match('#status (%d+)%s*$'))
  if status == 124 and timeout ~= '' then err = err .. ('\n(stopped after %d s)'):format(LIMIT) end
  return (out:gsub('#status %d+%s*$', '')), err, status
end

local function tmpfile(ext)
  local name = os.tmpname()
  os.remove(name)
  return name .. ext
end

local function tail(s, n)
  local lines = {}
  for l in s:gmatch('[^\n]+') do lines[#lines + 1] = l end
  return table.concat(lines, '\n', math.max(1, #lines - n + 1))
end

-- A child state for a page's in-state blocks: {[line] = {ok, message}}.
local function run_child(page, gpu)
  local env = gpu and ('EMBER_CUDA_EMULATE=' .. GPU_SPEC .. ' ') or ''
  local out, err, status = run(('%s%s %s %s %s %s'):format(env ~= '' and 'env ' .. env or '', sh_quote(ember),
    sh_quote(here .. '/doctest.lua'), gpu and '--page-gpu' or '--page', sh_quote(absolute(page)),
    sh_quote(page)))
  local res = {}
  for what, line, msg in out:gmatch('#doctest (%u+) (%d+) ?([^\n]*)') do
    res[tonumber(line)] = { what == 'PASS', unescape(msg) }
  end
  return res, status, out .. err
end

local mpirun_ok = have('mpirun')

local function sorted_lines(s)
  local l = {}
  for x in (s .. '\n'):gmatch('([^\n]*)\n') do l[#l + 1] = x end
  table.sort(l)
  return table.concat(l, '\n')
end

-- A whole-script block: replicas=N, mpi=N, fresh.
local function run_script(page, b)
  local file = tmpfile('.lua')
  local f = assert(io.open(file, 'wb'))
  f:write(('\n'):rep(b.line), b.code, '\n')
  f:close()
  local cmd
  if b.flags.replicas then
    cmd = ('%s --replicas %d %s'):format(sh_quote(ember), tonumber(b.flags.replicas) or 2, sh_quote(file))
  elseif b.flags.mpi then
    if not mpirun_ok then os.remove(file) return nil, 'mpirun is not installed' end
    cmd = ('env OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 mpirun --oversubscribe -np %d %s %s')
      :format(tonumber(b.flags.mpi) or 2, sh_quote(ember), sh_quote(file))
  else
    cmd = ('%s %s'):format(sh_quote(ember), sh_quote(file))
  end
  local out, err, status = run(cmd)
  local msg
  if status ~= 0 then
    msg = ('exit status %s:\n%s'):format(tostring(status),
      tail((out .. err):gsub(file:gsub('%p', '%%%0'), page), 15))
  elseif b.want then
    -- replicas print side by side: their lines are compared in any order
    local got, want = norm(out), norm(b.want)
    if b.flags.replicas or b.flags.mpi then got, want = sorted_lines(got), sorted_lines(want) end
    if got ~= want then msg = diff_message(norm(b.want), norm(out)) end
  end
  os.remove(file)
  return msg == nil, msg
end

-- A ```c run block: compiled against the build's header and library, then run.
local function run_c(page, b)
  local build = (ember:match('^(.*)/[^/]*$') or '.')
  local src, exe = tmpfile('.c'), tmpfile('')
  local f = assert(io.open(src, 'wb'))
  f:write(('#line %d "%s"\n'):format(b.line + 1, page), b.code, '\n')
  f:close()
  local cc = ('cc -std=gnu11 -I%s -o %s %s %s -Wl,-rpath,%s -lm'):format(
    sh_quote(root .. '/core/include'), sh_quote(exe), sh_quote(src),
    sh_quote(build .. '/libember.so'), sh_quote(build))
  local out, err, status = run(cc)
  local ok, msg = status == 0, nil
  if not ok then msg = 'does not compile:\n' .. tail(out .. err, 15)
  else
    local got, gerr, st = run(sh_quote(exe))
    if st ~= 0 then ok, msg = false, ('exit status %d:\n%s'):format(st, tail(got .. gerr, 15))
    elseif b.want and norm(got) ~= norm(b.want) then ok, msg = false, diff_message(norm(b.want), norm(got)) end
  end
  os.remove(src); os.remove(exe)
  return ok, msg
end

local total_run, total_failed, total_skipped = 0, 0, 0
for _, page in ipairs(files) do
  local text, err = read(page)
  workdir = tmpfile('.d')
  os.execute('mkdir -p ' .. sh_quote(workdir))
  local nrun, nfail, nskip = 0, 0, 0
  local function fail(line, msg)
    nrun, nfail = nrun + 1, nfail + 1
    print(('FAIL %s:%d: %s'):format(page, line, msg))
  end
  local function skip(line, why)
    nskip = nskip + 1
    print(('skip %s:%d: %s'):format(page, line, why))
  end
  if not text then
    fail(0, err)
  else
    local blocks = plan(text)
    local has_plain, has_gpu = false, false
    for _, b in ipairs(blocks) do
      if b.kind == 'lua' and not (b.flags.norun or b.flags.replicas or b.flags.mpi or b.flags.fresh) then
        if b.flags.gpu then has_gpu = true else has_plain = true end
      end
    end
    local results = {}
    for _, gpu in ipairs({ false, true }) do
      if (gpu and has_gpu) or (not gpu and has_plain) then
        local res, status, out = run_child(page, gpu)
        for line, r in pairs(res) do results[line] = r end
        if status ~= 0 then
          fail(0, ('the page\'s %sstate ended with status %s:\n%s'):format(gpu and 'gpu ' or '',
            tostring(status), tail(out:gsub('#doctest[^\n]*\n', ''), 15)))
        end
      end
    end
    for _, b in ipairs(blocks) do
      if b.flags.norun then
        skip(b.line, norun_reason(b.code))
      elseif b.kind == 'c' then
        local ok, msg = run_c(page, b)
        if ok then nrun = nrun + 1 else fail(b.line, msg) end
      elseif b.flags.replicas or b.flags.mpi or b.flags.fresh then
        local ok, msg = run_script(page, b)
        if ok == nil then skip(b.line, msg)
        elseif ok then nrun = nrun + 1
        else fail(b.line, msg) end
      else
        local r = results[b.line]
        if not r then fail(b.line, 'did not run (the page\'s state ended before it)')
        elseif r[1] then nrun = nrun + 1
        else fail(b.line, r[2]) end
      end
    end
  end
  os.execute('rm -rf ' .. sh_quote(workdir))
  if not quiet or nfail > 0 or nskip > 0 then
    print(('%s: %d run, %d failed, %d skipped'):format(page, nrun, nfail, nskip))
  end
  total_run, total_failed, total_skipped = total_run + nrun, total_failed + nfail, total_skipped + nskip
end
print(('%d run, %d failed, %d skipped'):format(total_run, total_failed, total_skipped))
os.exit(total_failed == 0 and 0 or 1)

--[[
harness.lua -- the tiny harness of the Lua tests (the twin of tests/c/check.h).

  local H = dofile(dir .. 'harness.lua')
  H.test('views alias their base', function()
    H.eq(t:narrow(2, 2, 2).shape, {3, 2})
    H.raises(function() em.matmul(a, b) end, 'matmul', '[2,3]')
  end)
  H.done()

H.test runs one group: every H.check/eq/close/raises in it is one check; an error
escaping the function (a missing method, say) is one more failure and ends the
group. Each group prints one line ("ok" or "FAIL" with counts), each failed check
one line with its file:line, and H.done() prints `#counts PASSED FAILED` (the line
tests/run.sh adds up) and exits non-zero when a check failed. Skips are printed
and counted apart; they are neither passes nor failures. A file that cannot run
at all here says why with H.skip_all(reason): tests/run.sh fails a file that made
no check unless it printed such a `skip: ` line.
]]
local H = {}

local passed, failed, skipped = 0, 0, 0
local gname, gpassed, gfailed, gskipped

local function out(s)
  io.stdout:write(s, '\n')
  io.stdout:flush()
end

local function where(level)
  local info = debug.getinfo(level + 1, 'Sl')
  if not info then return '?' end
  return (info.short_src or '?'):match('[^/]*$') .. ':' .. (info.currentline or 0)
end

local function group_end()
  if not gname then return end
  local skips = gskipped > 0 and (', %d skipped'):format(gskipped) or ''
  if gfailed > 0 then
    out(('FAIL %s (%d of %d checks failed%s)'):format(gname, gfailed, gpassed + gfailed, skips))
  else
    out(('ok   %s (%d checks%s)'):format(gname, gpassed, skips))
  end
  gname = nil
end

function H.group(name)
  group_end()
  gname, gpassed, gfailed, gskipped = name, 0, 0, 0
end

-- Records one check. level: how many calls up the failure should be reported.
function H.check(ok, msg, level)
  if ok then
    passed, gpassed = passed + 1, (gpassed or 0) + 1
    return true
  end
  failed, gfailed = failed + 1, (gfailed or 0) + 1
  out(('  FAIL %s: %s'):format(where((level or 1) + 1), tostring(msg or 'check failed')))
  return false
end

function H.skip(msg)
  skipped, gskipped = skipped + 1, (gskipped or 0) + 1
  out('  skip ' .. tostring(msg))
end

-- True in the build of `make test SANITIZE=thread` (the process has __tsan_init):
-- there everything runs several times slower, so shares of time measured
-- against fixed sleeps do not hold.
function H.tsan()
  local ffi = require 'ffi'
  pcall(ffi.cdef, 'void __tsan_init(void);')
  return (pcall(function() return ffi.C.__tsan_init end))
end

-- The cases of `list` to run: all of them, but under ThreadSanitizer only those at
-- the indices `picks`. For lists whose cases differ in sizes or counts, not in the
-- code they reach: a race shows at the smallest case that reaches its code, and
-- the plain build still runs every case. Says how many it kept.
function H.tsan_pick(list, picks)
  if not H.tsan() then return list end
  local kept = {}
  for _, i in ipairs(picks) do kept[#kept + 1] = list[i] end
  out(('  under ThreadSanitizer: %d of %d cases, each code path once'):format(#kept, #list))
  return kept
end

-- A file's bytes, or nil when it cannot be read.
function H.read(path)
  local f = io.open(path, 'rb')
  if not f then return nil end
  local s = f:read('*a')
  f:close()
  return s
end

-- A shell command's standard output and exit status (stderr is not captured;
-- add 2>&1 to the command for it). The status comes from the shell, because
-- LuaJIT's p:close() does not return it.
function H.sh(cmd)
  local p = io.popen('{ ' .. cmd .. '\n}; echo "#rc=$?"')
  local out = p:read('*a')
  p:close()
  local rc = tonumber(out:match('#rc=(%d+)%s*$'))
  return (out:gsub('#rc=%d+%s*$', '')), rc
end

-- Runs the ember command that runs this test on a script given as text:
-- `PREFIX ember ARGS FILE` (o.prefix: environment settings or a launcher such as
-- mpirun; o.args: ember's options), or `ember ARGS - < FILE` with o.stdin. Returns
-- its output, standard output and error together, and its exit status.
function H.ember(text, o)
  o = o or {}
  local path = os.tmpname()
  local f = assert(io.open(path, 'w'))
  f:write(text)
  f:close()
  local out, rc = H.sh(('%s %s %s %s 2>&1'):format(o.prefix or '', arg and arg[-1] or 'ember',
    o.args or '', o.stdin and '- < ' .. path or path))
  os.remove(path)
  return out, rc
end

-- A fresh folder under the system's temporary one.
-- A fresh directory, removed with everything in it by H.done().
local tmpdirs = {}
function H.tmpdir()
  local d = os.tmpname()
  os.remove(d)
  os.execute('mkdir -p ' .. d)
  tmpdirs[#tmpdirs + 1] = d
  return d
end

-- true where there are two cuda devices; else one skip saying so (the CUDA tests on
-- a one-GPU machine, tests/bench/gpu_run.sh).
function H.two_devices()
  local n = require('ember').cuda.device_count()
  if n >= 2 then return true end
  H.skip(('needs two cuda devices (this machine has %d)'):format(n))
  return false
end

-- -- Values ----------------------------------------------------------------------

-- A readable form of a value: tables as {1, 2, {3}}, strings quoted.
local function show(v, depth)
  depth = depth or 0
  if type(v) == 'table' and depth < 3 then
    local parts = {}
    for i = 1, math.min(#v, 12) do parts[i] = show(v[i], depth + 1) end
    if #v > 12 then parts[#parts + 1] = '...' end
    return '{' .. table.concat(parts, ', ') .. '}'
  elseif type(v) == 'string' then
    return ('%q'):format(v)
  end
  return tostring(v)
end
H.show = show

local function deep_eq(a, b)
  if type(a) == 'table' and type(b) == 'table' then
    if #a ~= #b then return false end
    for i = 1, #a do if not deep_eq(a[i], b[i]) then return false end end
    return true
  end
  if type(a) == 'number' and type(b) == 'number' and a ~= a and b ~= b then return true end
  return a == b
end
H.deep_eq = deep_eq

-- Equal (tables element by element, NaN equal to NaN).
function H.eq(got, want, msg)
  -- not a tail call: check() finds the test's line by counting frames
  local ok = H.check(deep_eq(got, want),
                     ('%s: got %s, want %s'):format(msg or 'values', show(got), show(want)), 2)
  return ok
end

-- |got - want| <= tol * (1 + |want|), element-wise for tables; NaN matches NaN.
local function close(g, w, tol)
  if type(g) ~= 'number' or type(w) ~= 'number' then return false end
  if w ~= w then return g ~= g end
  if w == math.huge or w == -math.huge then return g == w end
  return math.abs(g - w) <= tol * (1 + math.abs(w))
end

function H.close(got, want, tol, msg)
  tol = tol or 1e-6
  local ok = true
  if type(want) == 'table' then
    ok = type(got) == 'table' and #got == #want
    for i = 1, ok and #want or 0 do ok = ok and close(got[i], want[i], tol) end
  else
    ok = close(got, want, tol)
  end
  ok = H.check(ok, ('%s: got %s, want %s (tol %g)'):format(msg or 'values', show(got),
                                                        show(want), tol), 2)
  return ok
end

-- fn must raise an error whose message contains every given string (plain find).
-- Returns the message.
function H.raises(fn, ...)
  local ok, err = pcall(fn)
  err = tostring(err)
  local good, missing = not ok, nil
  if good then
    for i = 1, select('#', ...) do
      local s = select(i, ...)
      if not err:find(s, 1, true) then good, missing = false, s break end
    end
  end
  H.check(good, ok and 'expected an error, got none'
              or ('error message %q lacks %q'):format(err, tostring(missing)), 2)
  return err
end

-- -- Tensors -----------------------------------------------------------------------

-- The elements of a tensor (or a number / boolean) as a flat list of numbers.
function H.flat(t)
  local res = {}
  local function walk(v)
    if type(v) == 'table' then
      for i = 1, #v do walk(v[i]) end
    elseif type(v) == 'boolean' then
      res[#res + 1] = v and 1 or 0
    else
      res[#res + 1] = tonumber(v)
    end
  end
  if type(t) == 'number' or type(t) == 'boolean' then
    walk(t)
  elseif t:dim() == 0 then
    walk(t:item())
  else
    walk(t:totable())
  end
  return res
end

-- The largest |got - want| of two tensors of one size (any dtype, device, layout),
-- relative to want's largest magnitude: one error measure for a whole result.
function H.maxrel(got, want)
  local g, w = got:double():reshape(-1):totable(), want:double():reshape(-1):totable()
  assert(#g == #w, 'sizes differ')
  local scale = 0
  for i = 1, #w do scale = math.max(scale, math.abs(w[i])) end
  local m = 0
  for i = 1, #w do m = math.max(m, math.abs(g[i] - w[i]) / (scale + 1e-12)) end
  return m
end

-- The largest |got - want| / (1 + |want|) over the elements of tensor got (any
-- device) and a fixture's flat list want (a fixture tensor {shape, data}, or its
-- elements from..to): the error measure of the PyTorch fixtures. A NaN, or a
-- count that differs, is an infinite error.
function H.maxdiff(got, want, from, to)
  local g, w = H.flat(got:cpu():double()), want.data
  if from then w = { unpack(w, from, to) } end
  if #g ~= #w then return math.huge end
  local m = 0
  for i = 1, #w do
    local d = math.abs(g[i] - w[i]) / (1 + math.abs(w[i]))
    if d ~= d then d = math.huge end
    if d > m then m = d end
  end
  return m
end

-- A number from a number or a one-element tensor.
function H.num(x)
  if type(x) == 'number' then return x end
  if type(x) == 'boolean' then return x and 1 or 0 end
  return tonumber(x:item())
end

-- -- Groups ------------------------------------------------------------------------

-- Runs fn as one group; an error escaping it is a failure (with a traceback line).
function H.test(name, fn)
  H.group(name)
  local ok, err = xpcall(fn, function(e)
    local tb = debug.traceback('', 2)
    local loc = tb:match('\n%s*([^\n]*test_[^\n]*)') or ''
    return tostring(e) .. (loc ~= '' and ('  [at ' .. loc:gsub('^%s+', '') .. ']') or '')
  end)
  if not ok then
    failed, gfailed = failed + 1, gfailed + 1
    out('  FAIL error: ' .. tostring(err))
  end
  group_end()
end

-- `#counts PASSED FAILED SKIPPED`, then exits (non-zero when a check failed).
function H.done()
  for _, d in ipairs(tmpdirs) do os.execute("rm -rf '" .. d .. "'") end
  group_end()
  out(('#counts %d %d %d'):format(passed, failed, skipped))
  os.exit(failed > 0 and 1 or 0)
end

-- Ends a file that cannot run on this machine: one `skip: REASON` line (what
-- tests/run.sh accepts from a file with no checks) and the counts.
function H.skip_all(reason)
  group_end()
  skipped = skipped + 1
  out('skip: ' .. tostring(reason))
  H.done()
end

return H

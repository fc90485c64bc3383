--[[
test_gpu_pack.lua -- the GPU carry, checked on this CPU-only machine:

  - tests/bench/gpu_pack.sh builds the portable (x86-64-v3) build into build-portable/
    and packs it under the device runner's 64 MiB, and fails, saying why, when the
    archive is over its limit (EMBER_PACK_LIMIT_MB); no AVX-512 instruction is
    built outside the kernels chosen at run time (functions named *_avx512);
  - the packed ember, with only its own lib/ on LD_LIBRARY_PATH, trains a small
    CNN (conv2d forward and backward, matmul, Adam, float16 round trips) on an
    emulated Haswell (qemu-x86_64 -cpu Haswell: AVX2, no AVX-512) and on this CPU,
    and prints the figures the native build prints for the same script: on this
    CPU to 1e-6 (the same kernels run), on Haswell to TOL_HASWELL (OpenBLAS and
    ember pick other kernels there, which sum in another order);
  - tests/bench/gpu_run.sh with no GPU stops within 60 s, exit 0, saying so, and
    on emulated devices (EMBER_GPU_EMULATE) its summary passes the steps asked for.

The build takes a minute or more (less when build-portable/ is up to date). A missing
tool is a skip that names it.
]]
local dir = (arg and arg[0] and arg[0]:match('^(.*/)')) or
            ((os.getenv('EMBER_TESTS') or 'tests') .. '/lua/')
local H = dofile(dir .. 'harness.lua')

local TOL_HASWELL = 1e-4
local LIMIT_MB = 64

-- -- Helpers ------------------------------------------------------------------------

local function q(s) return "'" .. tostring(s):gsub("'", "'\\''") .. "'" end

-- sh(cmd): runs cmd through sh (stderr joined to stdout); output, exit status, seconds.
local function sh(cmd)
  local p = io.popen('t0=$(date +%s%N); { ' .. cmd .. '\n} 2>&1; rc=$?; ' ..
                     'echo "#rc $rc $(( ($(date +%s%N) - t0) / 1000000 ))"')
  local out = p:read('*a')
  p:close()
  local rc, ms = out:match('#rc (%d+) (%d+)%s*$')
  return out:gsub('#rc %d+ %d+%s*$', ''), tonumber(rc) or -1, (tonumber(ms) or 0) / 1000
end

local function have(tool) return os.execute('command -v ' .. tool .. ' >/dev/null 2>&1') == 0 end

local function missing(...)
  for i = 1, select('#', ...) do
    local t = select(i, ...)
    if not have(t) then return t end
  end
end

local function tail(s, n)
  local lines = {}
  for l in s:gmatch('[^\n]+') do lines[#lines + 1] = l end
  return table.concat(lines, '\n', math.max(1, #lines - (n or 15) + 1))
end

local function abspath(p)
  local out = sh('cd ' .. q(p) .. ' && pwd')
  return (out:gsub('%s+$', ''))
end

local ROOT = abspath(dir .. '../..')
local EMBER = arg[-1] or 'ember'
if not EMBER:find('/') then
  EMBER = (sh('command -v ' .. EMBER)):gsub('%s+$', '')
elseif EMBER:sub(1, 1) ~= '/' then
  EMBER = abspath('.') .. '/' .. EMBER
end
local TMP = (sh('mktemp -d "${TMPDIR:-/tmp}/ember-gpu-pack.XXXXXX"')):gsub('%s+$', '')
local ARCHIVE = TMP .. '/ember-gpu.tar.gz'   -- a copy: build-portable/ is shared
local PACK                                    -- the unpacked ember-gpu/
local packed                                  -- why not, when the archive is missing

-- -- The workload: a few steps of a small CNN -----------------------------------------
-- Conv2d(8, 16, 3) with stride 1 takes conv_fast.c's im2col-free path where the
-- AVX-512 GEMM runs, and the im2col + OpenBLAS path elsewhere; the first conv (one
-- input channel) and the unpadded third take conv.c's own GEMM (nn_gemm.c). One
-- thread, so that the sums run in one order. The input gradient of a 1x1 conv with
-- one input channel is a GEMM of one row, whose stride OpenBLAS refused on the
-- AVX2 path (gx all zeros) until nn_gemm.c passed one it accepts.
local WORKLOAD = [[
local em = require 'ember'
local nn, F = em.nn, em.nn.functional
em.manual_seed(7)
local model = nn.Sequential(
  nn.Conv2d(1, 8, 3, { padding = 1 }), nn.ReLU(),
  nn.Conv2d(8, 16, 3, { padding = 1 }), nn.Tanh(), nn.MaxPool2d(2),
  nn.Conv2d(16, 16, 3), nn.ReLU(),
  nn.Flatten(), nn.Linear(16 * 4 * 4, 32), nn.ReLU(), nn.Linear(32, 10))
local opt = em.optim.Adam(model:parameters(), { lr = 1e-2 })
local x, y = em.randn(16, 1, 12, 12), em.randint(1, 11, {16})
for step = 1, 5 do
  local loss = F.cross_entropy(model(x), y)
  opt:zero_grad()
  loss:backward()
  opt:step()
  print(('loss%d %.9g'):format(step, loss:item()))
end
local a, b = em.randn(64, 96), em.randn(96, 48)
print(('matmul %.9g'):format(a:matmul(b):abs():sum():item()))
print(('half %.9g'):format((a:half():float() - a):abs():sum():item()))
print(('sqrt %.9g'):format(a:abs():sqrt():sum():item()))
local out = model(x)
print(('logits %.9g %.9g'):format(out:sum():item(), out:abs():sum():item()))
local c1, xg = nn.Conv2d(1, 4, 1), em.randn(2, 1, 5, 5)
xg.requires_grad = true
local yg = c1(xg)
local l1 = (yg * yg):sum()
l1:backward()
print(('conv1x1_gx %.9g'):format(xg.grad:abs():sum():item()))
]]
local SCRIPT = TMP .. '/workload.lua'
do
  local f = assert(io.open(SCRIPT, 'w'))
  f:write(WORKLOAD)
  f:close()
end

-- The figures a run printed (lines "name number..."): {name = {numbers}}, and the
-- names in order.
local function figures(out)
  local res, names = {}, {}
  for line in out:gmatch('[^\n]+') do
    local name, rest = line:match('^(%a[%w_]*)%s+(%S.-)%s*$')
    local v = {}
    for n in (rest or ''):gmatch('%S+') do v[#v + 1] = tonumber(n) or false end
    local numeric = name and #v > 0
    for i = 1, #v do numeric = numeric and v[i] ~= false end
    if numeric then
      if not res[name] then names[#names + 1] = name end
      res[name] = v
    end
  end
  return res, names
end

-- Checks that run `got` printed the figures of `want` to tol relative; returns the
-- largest relative difference.
local function same_figures(got, want, tol, what)
  local g, names = figures(got)
  local w, wnames = figures(want)
  local worst = 0
  H.check(#names == #wnames and #wnames >= 10,
          ('%s: printed %d figures, the native build %d:\n%s'):format(what, #names, #wnames, tail(got)))
  for name, wv in pairs(w) do
    local gv = g[name] or {}
    H.check(#gv == #wv, ('%s: %s printed %d values, want %d'):format(what, name, #gv, #wv))
    for i = 1, math.min(#gv, #wv) do
      local d = math.abs(gv[i] - wv[i]) / (1 + math.abs(wv[i]))
      if not (d <= tol) then
        H.check(false, ('%s: %s[%d] = %.9g, the native build %.9g (relative %.2g > %g)')
          :format(what, name, i, gv[i], wv[i], d, tol))
      end
      if d > worst then worst = d end
    end
  end
  return worst
end

-- -- gpu_pack.sh -------------------------------------------------------------------

H.test('gpu_pack.sh builds the portable archive under the runner\'s limit', function()
  local m = missing('make', 'cc', 'strip', 'tar', 'ldd', 'objdump', 'gzip')
  if m then packed = m .. ' not found'; return H.skip('gpu_pack.sh needs ' .. m .. ': not found') end
  local out, rc, s = sh('cd ' .. q(ROOT) .. ' && env -u EMBER_PACK_NO_BUILD -u EMBER_PACK_LIMIT_MB ' ..
                        'sh tests/bench/gpu_pack.sh')
  print(('  gpu_pack.sh: %.0f s'):format(s))
  if not H.check(rc == 0, 'gpu_pack.sh exited ' .. rc .. ':\n' .. tail(out, 30)) then
    packed = 'gpu_pack.sh failed'
    return
  end
  H.check(out:find('gpu_pack: build-portable/ember-gpu.tar.gz', 1, true), 'no archive line:\n' .. tail(out))
  local size = tonumber((sh('wc -c < ' .. q(ROOT .. '/build-portable/ember-gpu.tar.gz'))))
  H.check(size and size > 1048576 and size < LIMIT_MB * 1048576,
          ('the archive is %s bytes, want 1 MiB to %d MiB'):format(tostring(size), LIMIT_MB))
  print(('  archive: %.1f MiB'):format((size or 0) / 1048576))
  local _, crc = sh('cp ' .. q(ROOT .. '/build-portable/ember-gpu.tar.gz') .. ' ' .. q(ARCHIVE) ..
                    ' && tar -C ' .. q(TMP) .. ' -xzf ' .. q(ARCHIVE))
  if not H.check(crc == 0, 'could not copy and unpack the archive') then packed = 'no archive'; return end
  PACK = TMP .. '/ember-gpu'
  for _, f in ipairs{ 'ember', 'lib/libember.so', 'lua/ember/init.lua', 'tests/test_cuda_elementwise' } do
    H.check(io.open(PACK .. '/' .. f) ~= nil, 'the archive lacks ember-gpu/' .. f)
  end
  -- AVX-512 (zmm registers, mask registers, EVEX's upper 16 vector registers) only
  -- in the functions chosen at run time; the unstripped library has their names.
  local bad = sh('objdump -d --no-show-raw-insn ' .. q(ROOT .. '/build-portable/libember.so') ..
                 [[ | awk '/^[0-9a-f]+ <.*>:$/ { fn = $2 }
                  /%zmm|%k[1-7]|%[xy]mm(1[6-9]|2[0-9]|3[01])/ { print fn }' | sort -u |
                  grep -v '_avx512[.a-z0-9_]*>:$']])
  H.check(bad:match('^%s*$'), 'AVX-512 instructions outside the *_avx512 functions:\n' .. tail(bad))
end)

H.test('gpu_pack.sh fails over its limit, saying so', function()
  if not PACK then return H.skip('no archive: ' .. tostring(packed)) end
  -- packs build-portable/ as it is (no build) against a 1 MiB limit
  local out, rc = sh('cd ' .. q(ROOT) .. ' && EMBER_PACK_NO_BUILD=1 EMBER_PACK_LIMIT_MB=1 ' ..
                     'sh tests/bench/gpu_pack.sh')
  H.check(rc ~= 0, 'gpu_pack.sh over a 1 MiB limit exited 0')
  H.check(out:find('FAILED: the archive is over the device runner\'s 1 MiB', 1, true),
          'no message about the limit:\n' .. tail(out))
end)

-- -- The packed build on other CPUs ------------------------------------------------------

local native
local function run_native()
  if not native then
    local out, rc = sh('EMBER_NUM_THREADS=1 ' .. q(EMBER) .. ' ' .. q(SCRIPT))
    H.check(rc == 0, 'the native build exited ' .. rc .. ':\n' .. tail(out))
    native = out
  end
  return native
end

H.test('the packed ember on this CPU prints the native build\'s figures', function()
  if not PACK then return H.skip('no archive: ' .. tostring(packed)) end
  local want = run_native()
  local out, rc, s = sh('env -i PATH="$PATH" EMBER_NUM_THREADS=1 LD_LIBRARY_PATH=' ..
                        q(PACK .. '/lib') .. ' ' .. q(PACK .. '/ember') .. ' ' .. q(SCRIPT))
  if not H.check(rc == 0, 'the packed ember exited ' .. rc .. ':\n' .. tail(out)) then return end
  local worst = same_figures(out, want, 1e-6, 'packed, this CPU')
  print(('  packed on this CPU: %.1f s, largest relative difference %.2g'):format(s, worst))
end)

H.test('the packed ember on an emulated Haswell (AVX2, no AVX-512) trains as natively', function()
  if not PACK then return H.skip('no archive: ' .. tostring(packed)) end
  if not have('qemu-x86_64') then return H.skip('qemu-x86_64 not found (make deps-test installs qemu-user)') end
  local want = run_native()
  -- LD_LIBRARY_PATH for the emulated process only (-E), not for qemu itself. QEMU's
  -- TCG has no AVX-512 at all: an AVX-512 instruction run there is a SIGILL.
  local out, rc, s = sh('env -u LD_LIBRARY_PATH EMBER_NUM_THREADS=1 qemu-x86_64 -cpu Haswell -E ' ..
                        q('LD_LIBRARY_PATH=' .. PACK .. '/lib') .. ' ' .. q(PACK .. '/ember') ..
                        ' ' .. q(SCRIPT))
  if not H.check(rc == 0, 'the packed ember under qemu exited ' .. rc .. ':\n' .. tail(out)) then return end
  local worst = same_figures(out, want, TOL_HASWELL, 'packed, Haswell')
  print(('  packed on Haswell (qemu): %.1f s, largest relative difference %.2g (tolerance %g)')
    :format(s, worst, TOL_HASWELL))
end)

-- -- gpu_run.sh ------------------------------------------------------------------------

H.test('gpu_run.sh with no GPU ends at once, saying so', function()
  if not PACK then return H.skip('no archive: ' .. tostring(packed)) end
  local m = missing('timeout')
  if m then return H.skip(m .. ' not found') end
  if have('nvidia-smi') and os.execute('nvidia-smi -L 2>/dev/null | grep -q "^GPU "') == 0 then
    return H.skip('this machine has a GPU')
  end
  local out, rc, s = sh('cd ' .. q(ROOT) .. ' && env -u EMBER_GPU_EMULATE -u EMBER_GPU_ONLY -u OUT ' ..
                        'EMBER_GPU_LOGS=' .. q(TMP .. '/logs-nogpu') ..
                        ' timeout -k 5 90 sh tests/bench/gpu_run.sh ' .. q(ARCHIVE))
  print(('  gpu_run.sh, no GPU: %.1f s'):format(s))
  H.check(rc == 0, 'gpu_run.sh exited ' .. rc .. ':\n' .. tail(out))
  H.check(s < 60, ('gpu_run.sh took %.0f s, want under 60'):format(s))
  H.check(out:find('SKIP (no GPU here', 1, true), 'no "no GPU here" line:\n' .. tail(out))
end)

H.test('gpu_run.sh on emulated devices passes its steps', function()
  if not PACK then return H.skip('no archive: ' .. tostring(packed)) end
  local out, rc, s = sh('cd ' .. q(ROOT) .. ' && env -u OUT EMBER_GPU_EMULATE=1:1024 ' ..
                        '"EMBER_GPU_ONLY=info|test_cuda_elementwise|gpu_check|test_cuda_shared_gpu" ' ..
                        'EMBER_GPU_LOGS=' ..
                        q(TMP .. '/logs-emu') .. ' sh tests/bench/gpu_run.sh ' .. q(ARCHIVE))
  print(('  gpu_run.sh, emulated: %.1f s'):format(s))
  H.check(rc == 0, 'gpu_run.sh exited ' .. rc .. ':\n' .. tail(out, 30))
  local f = io.open(TMP .. '/logs-emu/summary.txt')
  local summary = f and f:read('*a') or ''
  if f then f:close() end
  for _, step in ipairs{ 'info', 'test_cuda_elementwise', 'gpu_check%.lua',
                         'test_cuda_shared_gpu%.lua' } do
    H.check(summary:find('\n?' .. step .. '%s+%d+s%s+PASS'),
            ('the summary has no PASS for %s:\n%s'):format(step:gsub('%%', ''), summary))
  end
  H.check(not summary:find('FAIL'), 'the summary lists a failure:\n' .. summary)
end)

os.execute('rm -rf ' .. q(TMP))
H.done()

--[[
test_device_seam.lua -- the device boundary holds as the README says:
  - no object of core/ uses a symbol defined in kernels/ (nm on the build's
    objects), and kernels/ includes no header of core/ but backend.h (and
    philox.h, the counter-based generator every backend draws with);
  - em_state names no device kind (no cuda field in core/internal.h);
  - libember.so carries no CUDA backend: stripped, it is under 2 MB, and it has
    no kernel symbol; libember_cuda.so has the kind's registration;
  - from a plain luajit that loads libember.so, the first CUDA device loads
    libember_cuda.so from beside it (on emulated devices), and with the library
    missing CUDA calls say why while the CPU works (skipped without luajit, and
    in sanitizer builds, which a plain luajit cannot load).
]]
local dir = (arg and arg[0] and arg[0]:match('^(.*/)')) or
            ((os.getenv('EMBER_TESTS') or 'tests') .. '/lua/')
local H = dofile(dir .. 'harness.lua')

local root = dir .. '../..'
local build = (arg and arg[-1] or ''):match('^(.*)/[^/]*$')

local sh, read = H.sh, H.read

local function set_of(text)
  local s = {}
  for w in text:gmatch('%S+') do s[w] = true end
  return s
end

H.test('nm: no core object uses a symbol defined in kernels/', function()
  if not build or sh('command -v nm'):len() == 0 then H.skip('no nm or build dir') return end
  local kobjs = sh("find '" .. build .. "/obj/kernels' -name '*.o' 2>/dev/null")
  local cobjs = sh("find '" .. build .. "/obj/core' -name '*.o' 2>/dev/null")
  if kobjs == '' or cobjs == '' then H.skip('no objects under ' .. build .. '/obj') return end
  local defined = set_of(sh("find '" .. build .. "/obj/kernels' -name '*.o' | xargs nm " ..
    "--defined-only 2>/dev/null | awk '$2 ~ /[TDRBVW]/ { print $3 }'"))
  local n, bad = 0, {}
  for obj in cobjs:gmatch('[^\n]+') do
    n = n + 1
    for sym in sh("nm -u '" .. obj .. "' | awk '{ print $2 }'"):gmatch('%S+') do
      if defined[sym] then bad[#bad + 1] = obj:match('obj/(.*)$') .. ': ' .. sym end
    end
  end
  H.check(n > 50, ('read %d core objects'):format(n))
  H.check(next(defined) ~= nil, 'kernels/ defines symbols')
  H.check(#bad == 0, 'core objects that use kernels/: ' .. table.concat(bad, ', '))
end)

H.test('kernels/ includes only backend.h and philox.h of core; em_state has no device kind', function()
  local files = sh("find '" .. root .. "/kernels' -name '*.c' -o -name '*.h' -o -name '*.cu' " ..
    "-path '" .. root .. "/kernels/*'")
  local n, bad = 0, {}
  for path in files:gmatch('[^\n]+') do
    n = n + 1
    for inc in (read(path) or ''):gmatch('#include%s+"([^"]+)"') do
      local base = inc:match('([^/]+)$')
      local own = io.open(path:match('^(.*)/') .. '/' .. inc) or
                  io.open(root .. '/kernels/' .. inc)
      if own then own:close()
      elseif base ~= 'backend.h' and base ~= 'ember.h' and base ~= 'philox.h' then
        bad[#bad + 1] = path:match('kernels/.*$') .. ' includes ' .. inc
      end
    end
  end
  H.check(n > 40, ('read %d files of kernels/'):format(n))
  H.check(#bad == 0, table.concat(bad, '; '))
  local internal = read(root .. '/core/internal.h') or ''
  local state = internal:match('struct em_state {(.-)\n};') or ''
  H.check(#state > 100, 'found em_state')
  state = state:gsub('/%*.-%*/', '')             -- fields, not what their comments cite
  H.check(not state:lower():find('cuda'), 'em_state has a cuda field: ' .. state)
end)

H.test('libember.so carries no CUDA backend; libember_cuda.so does', function()
  if not build then H.skip('no build dir') return end
  local core_so, cuda_so = build .. '/libember.so', build .. '/libember_cuda.so'
  if not read(core_so) or not read(cuda_so) then H.skip('no shared libraries built') return end
  local tmp = os.tmpname()
  sh("strip -o '" .. tmp .. "' '" .. core_so .. "' 2>/dev/null")
  local size = #(read(tmp) or '')
  os.remove(tmp)
  H.check(size > 0 and size < 2 * 2 ^ 20,
    ('stripped libember.so: %.2f MB (under 2 MB)'):format(size / 2 ^ 20))
  local core_syms = sh("nm -D --defined-only '" .. core_so .. "'")
  H.check(not core_syms:find('emk_'), 'libember.so defines no emk_ symbol')
  H.check(sh("nm -D --defined-only '" .. cuda_so .. "'"):find('emk_cuda_kind', 1, true),
    'libember_cuda.so registers the cuda kind')
end)

-- Runs a script in a plain luajit against the build's libember.so.
local function plain(script, env)
  local lj = sh('command -v luajit 2>/dev/null'):match('[^\n]+')
  if not build or not lj then return nil, 'no luajit or build dir' end
  local file = os.tmpname()
  local f = io.open(file, 'w')
  f:write(("package.path = '%s/lua/?.lua;%s/lua/?/init.lua;' .. package.path\n")
    :format(build, build) .. script)
  f:close()
  local out = sh((env or '') .. ' ' .. lj .. ' ' .. file .. ' 2>&1')
  os.remove(file)
  if out:find('ASan runtime', 1, true) or out:find('libtsan', 1, true) then
    return nil, 'a sanitizer build: luajit cannot load it'
  end
  return out
end

H.test('a plain luajit loads libember_cuda.so on the first CUDA device', function()
  local out, why = plain([[
    local em = require 'ember'
    local x = em.ones(3, { device = 'cuda' })
    io.write('sum ', (x * 2):sum():item(), ' ', em.cuda.emulated() and 'emulated' or 'real', '\n')
    local f = io.open('/proc/self/maps'); local m = f:read('*a'); f:close()
    io.write(m:find('libember_cuda.so', 1, true) and 'loaded\n' or 'not loaded\n')
  ]], 'EMBER_CUDA_EMULATE=1:64')
  if not out then H.skip(why) return end
  H.check(out:find('sum 6 emulated', 1, true), out)
  H.check(out:find('loaded', 1, true) and not out:find('not loaded', 1, true), out)
end)

H.test('without libember_cuda.so: CUDA says why, the CPU works', function()
  local out, why = plain([[
    local em = require 'ember'
    io.write('cpu ', em.ones(4):sum():item(), '\n')
    io.write('available ', tostring(em.cuda.is_available()), '\n')
    local ok, err = pcall(function() return em.ones(2, { device = 'cuda' }) end)
    io.write('error ', tostring(err), '\n')
    io.write('meta ', em.zeros(8, { device = 'meta' }).device, '\n')
  ]], 'EMBER_CUDA_EMULATE=1:64 EMBER_CUDA_LIB=/nonexistent/libember_cuda.so')
  if not out then H.skip(why) return end
  H.check(out:find('cpu 4', 1, true), out)
  H.check(out:find('available false', 1, true), out)
  H.check(out:find('error [^\n]*EMBER_CUDA_LIB=/nonexistent'), 'the reason names the library: ' .. out)
  H.check(out:find('meta meta', 1, true), out)
end)

H.test('a kind built for another device interface version is refused, by name', function()
  -- a stand-in library whose kind says version 1 (the check reads the version first)
  local d = H.tmpdir()
  local src = io.open(d .. '/old_kind.c', 'w')
  src:write('struct { int version, abi; } emk_cuda_kind = { 1, 0 };\n')
  src:close()
  local built = sh(('cc -shared -fPIC -o %s/libold_kind.so %s/old_kind.c 2>&1 && echo built')
    :format(d, d))
  if not built:find('built', 1, true) then H.skip('no C compiler: ' .. built) return end
  local out, why = plain([[
    local em = require 'ember'
    local ok, err = pcall(function() return em.ones(2, { device = 'cuda' }) end)
    io.write('error ', tostring(err), '\n')
    io.write('cpu ', em.ones(3):sum():item(), '\n')
  ]], 'EMBER_CUDA_EMULATE=1:64 EMBER_CUDA_LIB=' .. d .. '/libold_kind.so')
  if not out then H.skip(why) return end
  H.check(out:find('implements version 1 of the device interface', 1, true) and
          out:find('rebuild them together', 1, true), 'the reason names the versions: ' .. out)
  H.check(out:find('cpu 3', 1, true), 'the CPU works: ' .. out)
end)

H.done()

--[[
test_lua_seam.lua -- the Lua layer reaches C through ember.h and generated
declarations only:
  - no module but ember/ffi.lua touches ffi.C, and none writes the
    out-of-memory retry by hand;
  - the table of C functions (ember.capi, generated) wraps the calls that hand
    out tensors and leaves the others, and the enum constants, to the library;
  - from a plain `luajit`, where the core is the loaded libember.so and not
    the ember command's own symbols, the profiler writes its trace (names go
    through em_utf8_valid and em_json_quote), em.clock ticks and dtypes and
    the tensor registry work (skipped when luajit is missing).
]]
local dir = (arg and arg[0] and arg[0]:match('^(.*/)')) or
            ((os.getenv('EMBER_TESTS') or 'tests') .. '/lua/')
local H = dofile(dir .. 'harness.lua')
local em = require 'ember'
local core = require 'ember.ffi'

local sh, read = H.sh, H.read

H.test('no module but ember/ffi.lua touches ffi.C or writes the retry', function()
  local root = dir .. '../../lua/ember'
  local list = sh("find '" .. root .. "' -name '*.lua' 2>/dev/null")
  local n = 0
  for path in list:gmatch('[^\n]+') do
    n = n + 1
    local src = read(path)
    if not path:match('/ember/ffi%.lua$') then
      H.check(not src:find('ffi%.C[^%w_]'), path .. ' touches ffi.C')
    end
    H.check(not src:find('again%(C%.') and not src:find('core%.again'),
      path .. ' writes the retry by hand')
  end
  H.check(n > 20, 'found the modules under ' .. root)
end)

H.test('ember.capi: the calls that hand out tensors are wrapped, the rest is the library', function()
  local C = core.C
  for _, name in ipairs({ 'em_empty', 'em_binary', 'em_var', 'em_max_dim', 'em_argmax',
                          'em_index_select', 'em_gather', 'em_max_pool2d', 'em_nll_loss',
                          'em_batch_norm', 'em_adaptive_avg_pool2d', 'em_clip_grad_norm_' }) do
    H.eq(type(rawget(C, name)), 'function', name .. ' is wrapped')
  end
  -- no tensor handed out, or a second try would not repeat the first
  for _, name in ipairs({ 'em_tensor_ndim', 'em_fill_', 'em_backward', 'em_loader_next',
                          'em_comm_allgather' }) do
    H.eq(rawget(C, name), nil, name .. ' is not wrapped')
    H.eq(type(C[name]), 'cdata', name .. ' reads the library')
  end
  H.eq(C.EM_FLOAT32, 0)
  H.eq(C.EM_BOOL, 7)
  H.eq(em.zeros(2, { dtype = 'bool' }).dtype, 'bool')
end)

H.test('a plain luajit: the profiler writes its trace, em.clock and dtypes work', function()
  local bin = arg and arg[-1] or ''
  local build = bin:match('^(.*)/[^/]*$')
  local lj = sh('command -v luajit 2>/dev/null'):match('[^\n]+')
  if not build or not lj then H.skip('no luajit or build dir') return end
  local trace = os.tmpname()
  local script = ([[
    package.path = '%s/lua/?.lua;%s/lua/?/init.lua;' .. package.path
    local em = require 'ember'
    io.write('lib ', require('ember.ffi').libpath, '\n')
    local t0 = em.clock()
    em.profile.start { trace = %q }
    em.profile.range('caf\195\169 \255', function()
      local a = em.rand(4, 4)
      local b = (a + a):sum()
      return b:item()
    end)
    em.profile.stop()
    io.write('clock ', em.clock() >= t0 and 'ok' or 'backwards', '\n')
    io.write('dtypes ', em.arange(3).dtype, ' ', em.tensor({ true }).dtype, ' ',
      em.tensor({ 1.5 }).dtype, '\n')
    for _ = 1, 20000 do local _ = em.zeros(4) end
    em.collect()
    io.write('done\n')
    io.stdout:flush()
  ]]):format(build, build, trace)
  local file = os.tmpname()
  local f = io.open(file, 'w'); f:write(script); f:close()
  local out = sh(lj .. ' ' .. file .. ' 2>&1')
  os.remove(file)
  if out:find('ASan runtime', 1, true) or out:find('libtsan', 1, true) then
    os.remove(trace)
    H.skip('a sanitizer build: luajit cannot load it') return
  end
  H.check(out:find('lib [^\n]*libember%.so'), 'the core is the loaded library: ' .. out)
  H.check(not out:find('undefined symbol', 1, true), out)
  H.check(out:find('done', 1, true), out)
  H.check(out:find('clock ok', 1, true), out)
  H.check(out:find('dtypes int64 bool float32', 1, true), out)
  local text = read(trace) or ''
  os.remove(trace)
  H.check(text:find('"traceEvents"', 1, true), 'the trace was written: ' .. text:sub(1, 200))
  H.check(text:find('"caf?? ?"', 1, true), 'a name that is not UTF-8 is cleaned')
end)

H.done()

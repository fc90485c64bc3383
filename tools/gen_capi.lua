--[[
gen_capi.lua -- writes ember.capi, the table of C functions the Lua layer calls,
from core/include/ember.h:

  luajit tools/gen_capi.lua core/include/ember.h > build/lua/ember/capi.lua

The output is a function of (lib, again) that returns a table whose missing
keys read lib (the library's namespace: functions and enum constants alike).
Each function that may allocate tensor memory gets an entry of its own in the
table, a wrapper of the same arity that calls it and, only when the call
failed, returns again(fn, status, args...) -- ember.ffi's collect-and-retry,
which collects Lua's garbage and calls fn once more when a device ran out of
memory. On success the wrapper costs one comparison, the check the caller
makes anyway, and the JIT inlines it.

Which functions: those returning em_status that hand out new tensors through
an `em_tensor **` argument, plus RETRY below, minus NEVER below. A failed op
leaves the state as it was, so a second try repeats the first; NEVER lists the
calls where it would not. The build stops when a name in either list is not
in the header, or a chosen function has varargs.
]]

-- Allocating calls that hand out no tensor.
local RETRY = {
  em_clip_grad_norm_ = 'its norm buffers are device tensors, made before it writes',
}

-- Calls whose second try would not repeat the first.
local NEVER = {
  em_loader_next = 'a second try takes the next batch',
  em_transform_apply = 'it replaces fields in place',
  em_comm_allgather = 'a collective: every replica must make the same calls',
  em_comm_reduce_scatter = 'a collective: every replica must make the same calls',
  em_backward_capture = 'a backward that failed may have accumulated into other leaves',
  em_grad_probe_end = 'it ends the probe',
}

local path = assert(arg[1], 'usage: luajit tools/gen_capi.lua ember.h')
local f = assert(io.open(path, 'rb'))
local src = f:read('*a')
f:close()

-- Declarations only: no comments, no preprocessor lines, no C++ guard, and no
-- brace bodies (struct members and enum constants are not functions).
src = src:gsub('/%*.-%*/', ' '):gsub('//[^\n]*', ' ')
src = ('\n' .. src):gsub('\n[ \t]*#[^\n]*', '\n')
src = src:gsub('extern%s*"C"%s*{', ' ')
local prev
repeat prev = src; src = src:gsub('%b{}', ' ') until src == prev

-- Splits a parameter list at its top-level commas.
local function params(list)
  local out, depth, cur = {}, 0, {}
  for ch in list:gmatch('.') do
    if ch == '(' then depth = depth + 1 elseif ch == ')' then depth = depth - 1 end
    if ch == ',' and depth == 0 then
      out[#out + 1] = table.concat(cur):match('^%s*(.-)%s*$'); cur = {}
    else
      cur[#cur + 1] = ch
    end
  end
  local last = table.concat(cur):match('^%s*(.-)%s*$')
  if last ~= '' and last ~= 'void' then out[#out + 1] = last end
  return out
end

local chosen, seen = {}, {}
for stmt in src:gmatch('[^;]+') do
  stmt = stmt:gsub('%s+', ' '):match('^%s*(.-)%s*$')
  if not stmt:match('^typedef') then
    local ret, name, plist = stmt:match('^(.-)%s*%**%s*(em_[%w_]+)%s*(%b())$')
    if name then
      seen[name] = true
      local ps = params(plist:sub(2, -2))
      local hands_out = false
      for _, p in ipairs(ps) do
        if p:match('^em_tensor%s*%*%s*%*') then hands_out = true end
      end
      local full = stmt:match('^(.-)em_[%w_]+%s*%b()$')
      local want = (full:match('^em_status%s*$') and hands_out) or RETRY[name]
      if want and not NEVER[name] then
        for _, p in ipairs(ps) do
          if p == '...' then error(path .. ': ' .. name .. ' has varargs', 0) end
        end
        chosen[#chosen + 1] = { name = name, n = #ps }
      end
    end
  end
end
for _, list in ipairs({ RETRY, NEVER }) do
  for name in pairs(list) do
    if not seen[name] then error('gen_capi.lua: ' .. name .. ' is not in ' .. path, 0) end
  end
end
if #chosen == 0 then error('gen_capi.lua: no allocating function found in ' .. path, 0) end

local out = {}
local function w(s) out[#out + 1] = s end
w('-- Generated from ' .. path .. ' by tools/gen_capi.lua. Do not edit.')
w('-- ' .. #chosen .. ' functions that may allocate tensor memory, each retried once')
w('-- through again(fn, status, ...) when it fails; every other name reads lib.')
w('return function(lib, again)')
w('  local api = setmetatable({}, { __index = lib })')
for _, fn in ipairs(chosen) do
  local args = {}
  for i = 1, fn.n do args[i] = 'a' .. i end
  local a = table.concat(args, ', ')
  local sep = fn.n > 0 and ', ' or ''
  w(('  function api.%s(%s)'):format(fn.name, a))
  w(('    local st = lib.%s(%s)'):format(fn.name, a))
  w(('    if st ~= 0 then return again(lib.%s, st%s%s) end'):format(fn.name, sep, a))
  w('    return st')
  w('  end')
end
w('  return api')
w('end')
io.write(table.concat(out, '\n'), '\n')

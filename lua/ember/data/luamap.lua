--[[
ember.data.luamap -- ds:map(fn) with a Lua function: the main state's side.

The loader runs transforms on C worker threads, and this Lua state can only run
on one thread at a time, so fn runs in worker Lua states instead (one per
loader worker, made by lua/host/luamap.c, see ember.data.worker). It gets
there as data: its bytecode (string.dump, which keeps the file and line
numbers for error messages) and its upvalues, serialized here and rebuilt in
each worker state.

What an upvalue may hold: nil, booleans, numbers, strings; plain tables of
those (copied deeply, shared and cyclic references kept); Lua functions
(carried the same way, with their own upvalues); and anything reachable from
package.loaded -- a module table (em, math, a module of yours) or a function or
table stored in one (em.data.T, math.floor) -- which travels by name and is
required in the worker. Anything else (a tensor, a Module, cdata, userdata, a
coroutine, a stray C function) raises an error at the ds:map line naming the
upvalue. Globals fn reads are looked up in the worker's own globals: the
standard libraries and `em`. Each worker has its own copy of the upvalues:
changes fn makes to them are not seen by the main state or by other workers.

  M.transform(fn, op) -> em_transform* (owned: the caller releases it)
  M.live_states()      -> worker Lua states open in the process (for tests)

Blob format, a prefix code read by ember.data.worker.decode:
  'z' nil  'T' true  'F' false  'n' + 8 bytes double  's' len ':' bytes
  't' key value ... 'e'      (a new table; gets the next reference number)
  'f' <s bytecode> count ':' upvalue ...   (a new function; next reference)
  'r' number ':'             (a table or function seen before)
  'm' <s module name>        package.loaded[name]
  'k' <s module name> key    package.loaded[name][key]
]]
local ffi = require 'ffi'
local core = require 'ember.ffi'
local C, S, raise = core.C, core.S, core.raise

local M = {}

-- -- The C functions: in the process (the ember command), else libember_lua.so ---
local lib
local function luamap_lib()
  if lib then return lib end
  if pcall(function() return core.process.ember_luamap_new end) then
    lib = core.process
    return lib
  end
  local tried = {}
  local libdir = core.libpath:match('^(.*)/[^/]*$')
  local candidates = {}
  if libdir then candidates[#candidates + 1] = libdir .. '/libember_lua.so' end
  candidates[#candidates + 1] = core.dir .. '/../../libember_lua.so'
  candidates[#candidates + 1] = 'ember_lua'
  for _, p in ipairs(candidates) do
    local ok, l = pcall(ffi.load, p)
    if ok then lib = l return lib end
    tried[#tried + 1] = tostring(l)
  end
  raise('ds:map: a Lua function needs libember_lua.so (worker Lua states), which was ' ..
    'not found beside ' .. core.libpath .. ' (' .. table.concat(tried, '; ') .. ')')
end

-- -- What package.loaded holds: module tables and the values stored in them -----
local function loaded_index()
  local mods, vals = {}, {}
  for name, mod in pairs(package.loaded) do
    if type(name) == 'string' and (type(mod) == 'table' or type(mod) == 'function') then
      if mods[mod] == nil then mods[mod] = name end
    end
  end
  for name, mod in pairs(package.loaded) do
    -- _G's fields are the user's globals, not a module's: a global table of
    -- the user must be copied, not looked up in the worker's (empty) globals.
    if type(name) == 'string' and type(mod) == 'table' and name ~= '_G' then
      for k, v in pairs(mod) do
        local tk = type(k)
        if (type(v) == 'function' or type(v) == 'table') and vals[v] == nil and
            mods[v] == nil and (tk == 'string' or tk == 'number') then
          vals[v] = { name, k }
        end
      end
    end
  end
  return mods, vals
end

-- -- Serialization ---------------------------------------------------------------
local double_buf = ffi.new('double[1]')

local function describe(v)
  if core.kind(v) == 'tensor' then return 'a tensor (cdata)' end
  local t = type(v)
  if t == 'cdata' then return ('a cdata (%s)'):format(tostring(ffi.typeof(v))) end
  if t == 'userdata' then return 'a userdata' end
  if t == 'thread' then return 'a coroutine' end
  if t == 'function' then return 'a C function that is in no loaded module' end
  if t == 'table' then return 'a table with a metatable (an object such as a Module)' end
  return 'a ' .. t
end

local function keystr(k)
  if type(k) == 'string' and k:match('^[%a_][%w_]*$') then return '.' .. k end
  if type(k) == 'string' then return ('[%q]'):format(k) end
  return '[' .. tostring(k) .. ']'
end

-- Serializes fn; raises at the user's line when something cannot travel.
local function serialize(fn, op)
  local mods, vals = loaded_index()
  local out, n = {}, 0
  local seen, nref = {}, 0
  local function put(s) n = n + 1; out[n] = s end
  local function str(s) put(#s); put(':'); put(s) end

  local function bad(path, v)
    local top, rest = path[1], table.concat(path, '', 2)
    local where = rest == '' and ("the function's upvalue '%s' is"):format(top)
      or ("the function's upvalue '%s' holds, at %s%s,"):format(top, top, rest)
    raise(('%s: %s %s, which cannot be carried into the worker Lua states; pass ' ..
      'numbers, strings, booleans and plain tables, or use em.data.T transforms'):format(
      op, where, describe(v)))
  end

  local value
  local function func(f, path)
    local ok, code = pcall(string.dump, f)
    if not ok then bad(path, f) end
    nref = nref + 1; seen[f] = nref
    put('f'); str(code)
    local nup = 0
    while debug.getupvalue(f, nup + 1) ~= nil do nup = nup + 1 end
    put(nup); put(':')
    for i = 1, nup do
      local name, v = debug.getupvalue(f, i)
      if #path == 0 then
        path[1] = name ~= '' and name or '?' .. i
        value(v, path)
        path[1] = nil
      else
        path[#path + 1] = (' (upvalue %s)'):format(name ~= '' and name or '?' .. i)
        value(v, path)
        path[#path] = nil
      end
    end
  end

  function value(v, path)
    local t = type(v)
    if v == nil then put('z')
    elseif v == true then put('T')
    elseif v == false then put('F')
    elseif t == 'number' then
      double_buf[0] = v
      put('n'); put(ffi.string(double_buf, 8))
    elseif t == 'string' then put('s'); str(v)
    elseif seen[v] then put('r'); put(seen[v]); put(':')
    elseif (t == 'table' or t == 'function') and mods[v] then put('m'); str(mods[v])
    elseif (t == 'table' or t == 'function') and vals[v] then
      put('k'); str(vals[v][1]); value(vals[v][2], path)
    elseif t == 'table' and getmetatable(v) == nil then
      nref = nref + 1; seen[v] = nref
      put('t')
      for k, x in pairs(v) do
        path[#path + 1] = keystr(k)
        local tk = type(k)
        if tk ~= 'string' and tk ~= 'number' and tk ~= 'boolean' and tk ~= 'table' then
          bad(path, k)
        end
        value(k, path)
        value(x, path)
        path[#path] = nil
      end
      put('e')
    elseif t == 'function' then
      func(v, path)
    else
      bad(path, v)
    end
  end

  func(fn, {})
  return table.concat(out)
end
M.serialize = serialize

-- Worker Lua states open now in the process (for tests).
function M.live_states() return luamap_lib().ember_luamap_live() end

-- -- The transform -------------------------------------------------------------
function M.transform(fn, op)
  op = op or 'ds:map'
  if type(fn) ~= 'function' then
    raise(('%s: expected a transform or a Lua function, got %s'):format(op, core.kind(fn)))
  end
  if debug.getinfo(fn, 'S').what == 'C' then
    raise(op .. ': a C function cannot run in the worker Lua states; wrap it in a Lua function')
  end
  local blob = serialize(fn, op)
  local L = luamap_lib()
  -- The worker states find ember where this state found it, then where the
  -- main state looks for everything else.
  local root = core.dir:match('^(.*)/ember$') or (core.dir .. '/..')
  local path = root .. '/?.lua;' .. root .. '/?/init.lua;' .. package.path
  local ud = L.ember_luamap_new(blob, #blob, path, package.cpath)
  if ud == nil then raise(op .. ': out of memory') end
  local out = ffi.new('em_transform*[1]')
  local st = C.em_transform_custom(S, 'map', ffi.cast('em_sample_fn', L.ember_luamap_call),
    ud, ffi.cast('void (*)(void *)', L.ember_luamap_release), out)
  if st ~= 0 then core.fail() end
  return out[0]
end

return M

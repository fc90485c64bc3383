--[[
ember.data.worker -- ds:map(fn) with a Lua function: the worker state's side.

Loaded in each worker Lua state that lua/host/luamap.c creates (EMBER_WORKER is
set there, so this state's em_state runs ops on one thread: the loader's
workers already are the parallelism). load(blob) rebuilds the user's function
from what ember.data.luamap serialized in the main state and returns the
runner the C side calls per sample:

  runner(fields, n, seed)   fields: lightuserdata em_tensor*[n], the sample's
                      fields (owned by the loader, belonging to the main em_state);
                      seed: the sample's seed, given to em.manual_seed first

It copies each field into this state (em_clone: nothing of the main state's is
referenced once the call returns), calls fn(x, y, ...) and writes its results
back: a tensor replaces the field (the old reference released), a number
becomes a 0-d tensor (int64 when integral, else float32), nil or a missing
result keeps the field (so an argument changed in place must be returned: it is
a copy). The fields are only written after every result has been checked, so an
error leaves the sample as it was. Tensors put into fields
belong to this state; the core copies them into the main state right after.
]]
local ffi = require 'ffi'
local core = require 'ember.ffi'
require 'ember.tensor'
local C, S, wrap = core.C, core.S, core.wrap
local box_t, istype = core.box_t, ffi.istype

local manual_seed = require('ember').manual_seed

local M = {}

-- -- Rebuilding the function (format: ember.data.luamap) ------------------------
local dbuf = ffi.new('double[1]')

function M.decode(blob)
  local pos, refs = 1, {}
  local function num()
    local e = blob:find(':', pos, true)
    local v = tonumber(blob:sub(pos, e - 1))
    pos = e + 1
    return v
  end
  local function str()
    local len = num()
    local s = blob:sub(pos, pos + len - 1)
    pos = pos + len
    return s
  end
  local value
  function value()
    local tag = blob:sub(pos, pos)
    pos = pos + 1
    if tag == 'z' then return nil
    elseif tag == 'T' then return true
    elseif tag == 'F' then return false
    elseif tag == 'n' then
      ffi.copy(dbuf, blob:sub(pos, pos + 7), 8)
      pos = pos + 8
      return dbuf[0]
    elseif tag == 's' then return str()
    elseif tag == 'r' then return refs[num()]
    elseif tag == 'm' then return require(str())
    elseif tag == 'k' then
      local name = str()
      local key = value()
      local v = require(name)[key]
      if v == nil then
        error(("module '%s' has no field '%s' in the worker Lua state"):format(name,
          tostring(key)), 0)
      end
      return v
    elseif tag == 't' then
      local t = {}
      refs[#refs + 1] = t
      while blob:sub(pos, pos) ~= 'e' do
        local k = value()
        t[k] = value()
      end
      pos = pos + 1
      return t
    elseif tag == 'f' then
      local f, err = loadstring(str())
      if not f then error('cannot load the function in the worker Lua state: ' .. err, 0) end
      refs[#refs + 1] = f
      for i = 1, num() do debug.setupvalue(f, i, value()) end
      return f
    end
    error(('corrupt function blob at byte %d'):format(pos - 1), 0)
  end
  return value()
end

-- -- Per sample ---------------------------------------------------------------------
local out = ffi.new('em_tensor*[1]')
local i64 = ffi.new('int64_t[1]')
local shape0 = ffi.new('int64_t[1]')

local function scalar(v)
  if v % 1 == 0 and v >= -2 ^ 63 and v < 2 ^ 63 then
    i64[0] = v
    if C.em_from_data(S, shape0, 0, C.EM_INT64, i64, C.EM_INT64, out) ~= 0 then core.fail() end
  elseif C.em_full(S, shape0, 0, v, C.EM_FLOAT32, C.EM_CPU, out) ~= 0 then
    core.fail()
  end
  return wrap(out[0])
end

function M.load(blob, worker)
  local fn = M.decode(blob)
  local info = debug.getinfo(fn, 'S')
  local where = ('%s:%d'):format(info.short_src, info.linedefined)

  -- Checks the results, then stores them into fields[0 .. n).
  local function finish(fields, n, ...)
    local nres = select('#', ...)
    if nres > n then
      error(('the function at %s returned %d values, but the samples have %d fields'):format(
        where, nres, n), 0)
    end
    local keep = { ... }   -- holds the boxes (and so their handles) until stored
    for k = 1, nres do
      local v = keep[k]
      if v ~= nil then
        if type(v) == 'number' then
          keep[k] = scalar(v)
        elseif not istype(box_t, v) then
          error(('the function at %s returned %s as value %d (expected a tensor, a number, ' ..
            'or nil to keep field %d)'):format(where, core.kind(v), k, k), 0)
        elseif v._h == nil then
          error(('the function at %s returned a freed tensor as value %d'):format(where, k), 0)
        end
      end
    end
    for k = 1, nres do
      local v = keep[k]
      if v ~= nil then
        local h = v._h
        C.em_tensor_retain(h)
        C.em_tensor_release(fields[k - 1])
        fields[k - 1] = h
      end
    end
  end

  -- em's generator is seeded per sample, so em.rand & co. inside fn give the same
  -- values whichever worker runs the sample.
  return function(lud, n, seed)
    manual_seed(seed)
    local fields = ffi.cast('em_tensor **', lud)
    local args = {}
    for i = 1, n do
      if C.em_clone(S, fields[i - 1], out) ~= 0 then
        error('copying field ' .. i .. ' into the worker state: ' .. core.errmsg(), 0)
      end
      args[i] = wrap(out[0])
    end
    finish(fields, n, fn(unpack(args, 1, n)))
  end
end

return M

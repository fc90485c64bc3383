--[[
ember.function -- em.autograd.apply(name, value, inputs, backward_fn): a custom
autograd function (the core's em_function_apply). The result is a view of
value whose backward calls backward_fn(grad), which returns a table with one
gradient per input (nil for none). An error raised there is the error of
t:backward(), with its message. em.autograd.backward_capture(root, grad, wrt)
returns the gradients of the leaves wrt (a list) instead of accumulating them.

How Lua is reached from C. LuaJIT limits callbacks (each ffi.cast of a Lua
function takes a slot of a small, never freed area), so there is one, shared by
every function: its ud points to a cell (int32) that holds the function's id,
the key of `live`. A node may be freed anywhere -- by a tensor release inside
compiled code, where a callback into Lua would be fatal ("bad callback") -- so
its release is no callback but the core's em_function_release_flag, which sets
the cell to 0; apply() sweeps `live` for zeroed cells when it has doubled since
the last sweep, or when Lua's collector has finished a cycle since
(handles.on_cycle: a flag set from the handles' sentinel finalizer): a backward function holds what it recomputes from -- a
checkpointed module, a sharded model -- so dead records must not wait for the
live ones to double. Cells sit in fixed chunks (C memory never moves under a
node).

The backward callback runs inside em_backward: the Lua functions that call
em_backward or em_backward_capture are kept out of the JIT (jit.off), since a
compiled FFI call must not call back into Lua.
]]
local ffi = require 'ffi'
local core = require 'ember.ffi'
require 'ember.tensor'
local C, S, wrap, fail, raise, kind = core.C, core.S, core.wrap, core.fail, core.raise, core.kind
local box_t, istype = core.box_t, ffi.istype

local M = {}

-- -- Cells ---------------------------------------------------------------------------------
local CHUNK = 1024
local chunks, ncells, free = {}, 0, {}
local live, nlive, sweep_at = {}, 0, 64

local function cell_ptr(id)
  local c = chunks[math.floor((id - 1) / CHUNK) + 1]
  return c + (id - 1) % CHUNK
end

local function sweep()
  for id in pairs(live) do
    if cell_ptr(id)[0] == 0 then
      live[id] = nil
      nlive = nlive - 1
      free[#free + 1] = id
    end
  end
  sweep_at = math.max(64, 2 * nlive)
end

-- Each finished GC cycle lets the next new_id sweep (ember.handles' sentinel).
local dirty = false
require('ember.handles').on_cycle(function() dirty = true end)

local function new_id()
  if dirty or nlive >= sweep_at then dirty = false; sweep() end
  local id = table.remove(free)
  if not id then
    if ncells % CHUNK == 0 then chunks[#chunks + 1] = ffi.new('int32_t[?]', CHUNK) end
    ncells = ncells + 1
    id = ncells
  end
  nlive = nlive + 1
  return id
end

-- -- The backward callback -----------------------------------------------------------------
local i32p = ffi.typeof('int32_t *')

local tensor_p = ffi.typeof('em_tensor *')

local function run_backward(rec, g, gin)
  g = ffi.cast(tensor_p, g)   -- borrowed: wrap takes a reference of its own
  C.em_tensor_retain(g)
  local res = rec.fn(wrap(g))
  if istype(box_t, res) and rec.n == 1 then res = { res } end
  if type(res) ~= 'table' then
    error(('autograd.apply: %s: backward_fn must return a table of gradients (one per ' ..
      'input), got %s'):format(rec.name, kind(res)), 0)
  end
  for i = 1, rec.n do
    local v = res[i]
    if v ~= nil then
      if not istype(box_t, v) then
        error(('autograd.apply: %s: gradient %d is a %s, not a tensor'):format(rec.name, i,
          kind(v)), 0)
      end
      C.em_tensor_retain(v._h)
      gin[i - 1] = v._h
      -- a backward that gives (apply's give) lets go of its boxes now, not at
      -- a collection (a weight's gradient is megabytes)
      if rec.give then core.handles.release(v) end
    end
  end
end

local callback = ffi.cast('em_function_backward_fn', function(_, ud, g, gin)
  local rec = live[ffi.cast(i32p, ud)[0]]
  local ok, err = pcall(run_backward, rec, g, gin)
  if ok then return 0 end
  return tonumber(C.em_set_error(S, C.EM_ERR_ARG, tostring(err)))
end)
core.on_close[#core.on_close + 1] = function() callback:free() end

-- -- apply ---------------------------------------------------------------------------------
local out = ffi.new('em_tensor*[1]')

-- give (internal): backward_fn keeps none of the tensors it returns, and
-- nothing else holds them (em.nn.checkpoint's fresh gradients; ZeRO 3's
-- gradient handed on as it came): the core takes them over, and they go once
-- the engine is done with them, not at a collection.
function M.apply(name, value, inputs, backward_fn, give)
  if type(name) ~= 'string' then raise('autograd.apply: expected a name (string), got ' .. kind(name)) end
  if not istype(box_t, value) then
    raise(('autograd.apply: %s: expected a tensor as the value, got %s'):format(name, kind(value)))
  end
  if type(inputs) ~= 'table' or istype(box_t, inputs) then
    raise(('autograd.apply: %s: expected a table of input tensors, got %s'):format(name, kind(inputs)))
  end
  if type(backward_fn) ~= 'function' then
    raise(('autograd.apply: %s: expected a backward function, got %s'):format(name, kind(backward_fn)))
  end
  local n = inputs.n or #inputs
  local hs = ffi.new('em_tensor*[?]', math.max(n, 1))
  for i = 1, n do
    local t = inputs[i]
    if not istype(box_t, t) then
      raise(('autograd.apply: %s: input %d is a %s, not a tensor'):format(name, i, kind(t)))
    end
    hs[i - 1] = t._h
  end
  local id = new_id()
  local cell = cell_ptr(id)
  cell[0] = id
  live[id] = { fn = backward_fn, n = n, name = name, give = give and true or nil }
  if C.em_function_apply(S, name, value._h, hs, n, callback, cell, C.em_function_release_flag,
      out) ~= 0 then
    cell[0] = 0   -- not released by the core: the caller keeps it
    fail()
  end
  return wrap(out[0])
end

-- -- Capturing backward --------------------------------------------------------------------
function M.backward_capture(root, grad, wrt)
  local h = core.H(root, 'backward_capture', 1)
  local gh = grad ~= nil and core.H(grad, 'backward_capture', 2) or nil
  local n = #wrt
  local ws = ffi.new('em_tensor*[?]', math.max(n, 1))
  local gs = ffi.new('em_tensor*[?]', math.max(n, 1))
  for i = 1, n do ws[i - 1] = core.H(wrt[i], 'backward_capture', 3) end
  if C.em_backward_capture(S, h, gh, ws, n, gs) ~= 0 then fail() end
  local res = {}
  for i = 1, n do if gs[i - 1] ~= nil then res[i] = wrap(gs[i - 1]) end end
  return res
end
jit.off(M.backward_capture)

return M

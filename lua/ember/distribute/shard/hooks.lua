--[[
ember.distribute.shard.hooks -- the registry of live sharded models and their
registrations with backward: a gradient hook on every parameter and a callback
at the end of each backward (shard.lua's essay, "Gradients"), both handed on to
shard/grads.lua, and removed when the model is collected or the state closes.
]]
local ffi = require 'ffi'
local core = require 'ember.ffi'
local dist = require 'ember.distribute'
local gather = require 'ember.distribute.shard.gather'
local grads = require 'ember.distribute.shard.grads'
local C, S = core.C, core.S

local M = {}

local check = gather.check

-- Every live sharded model by id (callbacks name them by id), and the id of the
-- model a shard tensor belongs to (clip_grad_norm asks). An id, not the model:
-- LuaJIT's weak keys are no ephemerons, so a value that leads back to its key
-- (the model holds its shards) would keep both alive for ever.
local models = setmetatable({}, { __mode = 'v' })
local owner = setmetatable({}, { __mode = 'k' })
local next_id = 0

-- A fresh id for a model about to be built.
function M.new_id()
  next_id = next_id + 1
  return next_id
end

-- dm answers callbacks from now on (by dm._id).
function M.register(dm) models[dm._id] = dm end

-- Shard tensor t belongs to the model of id id.
function M.set_owner(t, id) owner[t] = id end

function M.owner_of(t)
  local id = owner[t]
  return id and models[id]
end

-- -- Callbacks from backward -----------------------------------------------------------------
-- One ffi callback each for all models (LuaJIT has few callback slots); ud is
-- id * 2^20 + parameter index. An error is kept as the backward's message.
local PARAM_BITS = 2 ^ 20
local function guarded(fn, ...)
  local ok, err = pcall(fn, ...)
  if ok then return 0 end
  return C.em_set_error(S, C.EM_ERR_INTERNAL, tostring(err))
end
local grad_hook = ffi.cast('em_grad_hook_fn', function(_, _, ud)
  local v = tonumber(ffi.cast('intptr_t', ud))
  local dm = models[math.floor(v / PARAM_BITS)]
  if not dm or not dm._armed then return 0 end
  return guarded(grads.on_grad, dm, v % PARAM_BITS)
end)
local backward_end = ffi.cast('em_backward_callback_fn', function(_, failed, ud)
  local dm = models[tonumber(ffi.cast('intptr_t', ud))]
  if not dm or not dm._armed then return 0 end
  return guarded(grads.on_backward_end, dm, failed ~= 0)
end)

-- A dead model's registrations go with it: a cdata the model holds, whose
-- finalizer removes its backward callback and the hooks on its parameters (which
-- outlive it when the model is wrapped again) and lets go of the parameters'
-- handles it kept for that. It holds raw handles, not the tensors, so that it
-- delays no memory; the state's close removes whatever is left first (the
-- state's callbacks are gone after it), and then the finalizer finds it done.
local function ud_of(n) return ffi.cast('void *', ffi.cast('intptr_t', n)) end
local function unhook_later(id, hooked)
  local done = false
  local function unhook()
    if done then return end
    done = true
    if hooked.callback then C.em_backward_remove_callback(S, backward_end, ud_of(id)) end
    for i, h in ipairs(hooked) do
      C.em_tensor_remove_grad_hook(h, grad_hook, ud_of(id * PARAM_BITS + i))
      C.em_tensor_release(h)
    end
  end
  return dist._track(ffi.gc(ffi.new('char[1]'), unhook), unhook)
end

-- Hooks dm's parameters (dm._P) and adds its backward callback, all removed
-- when the model is collected.
function M.install(dm)
  local hooked = {}
  rawset(dm, '_unhook', unhook_later(dm._id, hooked))
  for i, p in ipairs(dm._P) do
    check(C.em_tensor_add_grad_hook(S, p._h, grad_hook, ud_of(dm._id * PARAM_BITS + i)))
    C.em_tensor_retain(p._h)
    hooked[i] = p._h
  end
  check(C.em_backward_add_callback(S, backward_end, ud_of(dm._id)))
  hooked.callback = true
end

return M

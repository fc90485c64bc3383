--[[
ember.distribute.shard.state -- a sharded model's state as a checkpoint sees it:
where each parameter's shard lies (shard_layout), the full state on every
replica (state_dict, a collective) and loading one back into the shards
(load_state_dict). shard.lua installs these as the model's methods.
]]
local ffi = require 'ffi'
local em = require 'ember'
local core = require 'ember.ffi'
local gather = require 'ember.distribute.shard.gather'
local raise = core.raise

local M = {}

local slice = gather.slice

function M:shard_layout()
  local params = {}
  for i, p in ipairs(self._P) do
    local u = self._units[self._unit_of[i]]
    local pos = self._pos[i]
    params[i] = { name = self._names[i], shape = p.shape, dtype = p.dtype, numel = u.numel[pos],
                  lo = u.lo[pos], hi = u.hi[pos], shard = self._shards[i] }
  end
  local buffers = {}
  for _, nb in ipairs(self.module:named_buffers()) do
    buffers[#buffers + 1] = { name = nb[1], tensor = nb[2] }
  end
  return { mode = self.shard_mode, world_size = self.strategy.world_size,
           rank = self.strategy.rank, params = params, buffers = buffers }
end

-- The full state on every replica (a collective: every replica calls it): the
-- tensors are the model's own for 'optimizer' and 'gradients', copies for
-- 'parameters'.
function M:state_dict()
  if self.shard_mode ~= 'parameters' then
    -- the shards may have changed since (a step, a load)
    if self.shard_mode then gather.gather_all(self) end
    return self.module:state_dict()
  end
  local sd = self.module:state_dict()
  em.no_grad(function()
    for _, u in ipairs(self._units) do
      local flat = gather.allgather(self, u, false)
      for pos, i in ipairs(u.idx) do
        sd[self._names[i]] = slice(flat, u.off[pos], u.numel[pos]):view(self._P[i].shape):clone()
      end
    end
  end)
  return sd
end

function M:load_state_dict(sd, strict)
  if self.shard_mode ~= 'parameters' then
    local r = self.module:load_state_dict(sd, strict)
    if self._offload then
      for _, u in ipairs(self._units) do
        em.no_grad(function()
          for pos, i in ipairs(u.idx) do
            local len = u.hi[pos] - u.lo[pos]
            slice(u.segt, u.at[pos], len):copy_(slice(self._P[i]:detach():reshape(-1), u.lo[pos], len))
          end
        end)
      end
    end
    return r
  end
  if type(sd) ~= 'table' then raise('load_state_dict: expected a table of tensors, got ' .. core.kind(sd)) end
  for i, name in ipairs(self._names) do
    local src = sd[name]
    if src == nil then
      if strict ~= false then raise('load_state_dict: missing keys: ' .. name) end
    elseif not ffi.istype(core.box_t, src) or src:numel() ~= self._P[i]:numel() then
      raise(('load_state_dict: shape mismatch for %s: the model has [%s], the state %s'):format(
        name, table.concat(self._P[i].shape, ','), ffi.istype(core.box_t, src) and
        '[' .. table.concat(src.shape, ',') .. ']' or core.kind(src)))
    end
  end
  em.no_grad(function()
    for i, name in ipairs(self._names) do
      local src = sd[name]
      if src ~= nil then
        local u = self._units[self._unit_of[i]]
        local pos = self._pos[i]
        local len = u.hi[pos] - u.lo[pos]
        self._shards[i]:copy_(slice(src:reshape(-1), u.lo[pos], len))
      end
    end
    for _, nb in ipairs(self.module:named_buffers()) do
      if sd[nb[1]] ~= nil then nb[2]:copy_(sd[nb[1]]) end
    end
  end)
  return { missing_keys = {}, unexpected_keys = {} }
end

return M

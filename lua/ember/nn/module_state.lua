--[[
ember.nn.module_state -- a module's state as a flat table: Module:state_dict()
(name -> tensor, parameters detached, then buffers) and
Module:load_state_dict(sd[, strict]), which checks every key and shape before it
copies anything, so a refused state leaves the model as it was.
]]
local ffi = require 'ffi'
local em = require 'ember'
local core = require 'ember.ffi'
local raise, box_t, istype = core.raise, core.box_t, ffi.istype

local function is_tensor(x) return istype(box_t, x) end
local function shape_str(t) return '[' .. table.concat(t.shape, ',') .. ']' end

return function(Module)
  function Module:state_dict()
    local sd = {}
    for _, np in ipairs(self:named_parameters()) do sd[np[1]] = np[2]:detach() end
    for _, nb in ipairs(self:named_buffers()) do sd[nb[1]] = nb[2] end
    return sd
  end

  function Module:load_state_dict(sd, strict)
    if type(sd) ~= 'table' then raise('load_state_dict: expected a table of tensors, got ' .. core.kind(sd)) end
    if strict == nil then strict = true end
    local own = {}
    for _, np in ipairs(self:named_parameters()) do own[np[1]] = np[2] end
    for _, nb in ipairs(self:named_buffers()) do own[nb[1]] = nb[2] end
    local missing, unexpected = {}, {}
    for k in pairs(own) do if sd[k] == nil then missing[#missing + 1] = k end end
    for k in pairs(sd) do if own[k] == nil then unexpected[#unexpected + 1] = k end end
    table.sort(missing); table.sort(unexpected)
    if strict and (#missing > 0 or #unexpected > 0) then
      local parts = {}
      if #missing > 0 then parts[#parts + 1] = 'missing keys: ' .. table.concat(missing, ', ') end
      if #unexpected > 0 then parts[#parts + 1] = 'unexpected keys: ' .. table.concat(unexpected, ', ') end
      raise('load_state_dict: ' .. table.concat(parts, '; '))
    end
    for k, dst in pairs(own) do
      local src = sd[k]
      if src ~= nil then
        if not is_tensor(src) then
          raise(('load_state_dict: %s is a %s, expected a tensor'):format(k, core.kind(src)))
        end
        local a, b = shape_str(dst), shape_str(src)
        if a ~= b then
          raise(('load_state_dict: shape mismatch for %s: the model has %s, the state %s')
            :format(k, a, b))
        end
      end
    end
    em.no_grad(function()
      for k, dst in pairs(own) do
        if sd[k] ~= nil then dst:copy_(sd[k]) end
      end
    end)
    return { missing_keys = missing, unexpected_keys = unexpected }
  end
end

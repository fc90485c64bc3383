--[[
ember.nn.module -- em.nn.Module, the base class of every layer and model.

  local Net = em.nn.Module:extend('Net')
  function Net:init(n) self.fc = em.nn.Linear(n, 2) end
  function Net:forward(x) return self.fc(x) end
  local m = Net(4); local y = m(x)

Assigning a module, an em.nn.Parameter or any tensor that requires grad to a
field registers it (in order of assignment), and so does assigning a plain table
of them (it becomes an em.nn.ModuleList/ModuleDict, ember.nn.container); self:register_buffer(name, t)
registers state that is saved but not trained (BatchNorm's running stats).
Registered things live in per-instance ordered tables, so every assignment to
them goes through __newindex (a plain field would bypass it after the first).
]]
local ffi = require 'ffi'
local em = require 'ember'
local core = require 'ember.ffi'
local raise, box_t, istype = core.raise, core.box_t, ffi.istype

local Module = { __name = 'Module' }
local is_class = {}            -- class table -> true

local function is_tensor(x) return istype(box_t, x) end
local function is_module(x)
  return type(x) == 'table' and is_class[getmetatable(x)] == true
end

-- -- Per-instance registry: ordered names per kind ---------------------------------
local function reg(self) return rawget(self, '_reg') end

local function instance_index(self, k)
  local r = reg(self)
  local v = r.params[k]
  if v ~= nil then return v end
  v = r.modules[type(k) == 'number' and tostring(k) or k]
  if v ~= nil then return v end
  v = r.buffers[k]
  if v ~= nil then return v end
  return getmetatable(self)[k]
end

local function put(list, set, k, v)
  if set[k] == nil then list[#list + 1] = k end
  set[k] = v
end

local function remove(list, set, k)
  if set[k] == nil then return end
  set[k] = nil
  for i = 1, #list do if list[i] == k then table.remove(list, i) break end end
end

local function instance_newindex(self, k, v)
  local r = reg(self)
  r.watch[k] = nil
  if type(v) == 'table' and getmetatable(v) == nil then
    -- a plain table of modules or parameters becomes a ModuleList/ModuleDict (or
    -- ParameterList/ParameterDict) in place: its contents are never silently left
    -- out. An empty one is watched: filled later, the next walk adopts it.
    if next(v) == nil then r.watch[k] = v
    else Module._adopt_table(self.__name, tostring(k), v) end
  end
  if is_module(v) then
    remove(r.pnames, r.params, k); remove(r.bnames, r.buffers, k)
    return put(r.mnames, r.modules, k, v)
  elseif is_tensor(v) and (v.requires_grad or r.params[k] ~= nil) then
    remove(r.mnames, r.modules, k); remove(r.bnames, r.buffers, k)
    return put(r.pnames, r.params, k, v)
  elseif is_tensor(v) and r.buffers[k] ~= nil then
    return put(r.bnames, r.buffers, k, v)
  elseif v == nil and (r.params[k] or r.modules[k] or r.buffers[k]) then
    remove(r.pnames, r.params, k); remove(r.mnames, r.modules, k)
    return remove(r.bnames, r.buffers, k)
  end
  if r.params[k] or r.modules[k] or r.buffers[k] then
    raise(('%s: cannot assign a %s to %s, which holds a registered %s'):format(
      self.__name, core.kind(v), k, r.params[k] and 'parameter' or
      (r.modules[k] and 'module' or 'buffer')))
  end
  rawset(self, k, v)
end

-- -- Classes -----------------------------------------------------------------------------
-- cls:extend(name) makes a subclass; calling a class makes an instance.
function Module:extend(name)
  if type(name) ~= 'string' then raise('Module:extend: expected a class name (string)') end
  local cls = { __name = name, super = self }
  for _, mm in ipairs({ '__tostring', '__call' }) do cls[mm] = rawget(self, mm) end
  cls.__index = instance_index
  cls.__newindex = instance_newindex
  is_class[cls] = true
  return setmetatable(cls, { __index = self, __call = function(c, ...) return c.new(c, ...) end,
    __tostring = function() return 'class ' .. name end })
end

-- Module._become(t, cls, ...): the (empty) table t made an instance of cls in place
-- (a plain table of modules assigned to a field keeps its identity that way).
function Module._become(t, cls, ...)
  rawset(t, '_reg', { params = {}, pnames = {}, modules = {}, mnames = {}, buffers = {},
    bnames = {}, watch = {} })
  rawset(t, 'training', true)
  setmetatable(t, cls)
  t:init(...)
  return t
end

function Module.new(cls, ...) return Module._become({}, cls, ...) end

function Module:init() end
function Module:forward()
  raise(self.__name .. ': forward is not defined')
end
-- While the profiler records, each module's forward is a span named after its
-- class, so the report can say which module made a copy; otherwise one lookup.
Module.__call = function(self, ...)
  local prof = package.loaded['ember.profile']
  if prof and prof.active() then return prof.hooks.module_forward(self, ...) end
  return self:forward(...)
end

function Module:register_buffer(name, t)
  local r = reg(self)
  remove(r.pnames, r.params, name); remove(r.mnames, r.modules, name)
  if t == nil then return remove(r.bnames, r.buffers, name) end
  put(r.bnames, r.buffers, name, t)
end

function Module:register_parameter(name, t)
  local r = reg(self)
  remove(r.bnames, r.buffers, name); remove(r.mnames, r.modules, name)
  if t == nil then return remove(r.pnames, r.params, name) end
  put(r.pnames, r.params, name, t)
end

-- -- Traversal ----------------------------------------------------------------------------
-- Every module under m, depth first, self first, children in registration order,
-- with its dotted prefix: two parallel arrays. No callback on purpose: a LuaJIT
-- trace recorded through a recursive walk that calls a fresh closure keeps that
-- closure as a constant -- and with it every tensor its upvalues hold (a list of
-- parameters, say) -- until the trace is flushed, so whether a model's old
-- weights outlive it would depend on which loops happened to get hot.
-- A wrapper class with `transparent = true` (em.nn.Checkpoint) adds no name of
-- its own: its child's parameters are named as if the child stood in its place,
-- so a state_dict loads between the wrapped and the plain model.
-- The fields that held an empty plain table when assigned and now hold modules or
-- parameters: adopted (in place) and registered under their field names.
local function adopt_watched(m, r)
  for k, t in pairs(r.watch) do
    if rawget(m, k) ~= t then r.watch[k] = nil
    elseif next(t) ~= nil and Module._adopt_table(m.__name, tostring(k), t) then
      r.watch[k] = nil
      rawset(m, k, nil)
      instance_newindex(m, k, t)
    end
  end
end

local function gather_modules(m, prefix, mods, prefixes)
  local n = #mods + 1
  mods[n], prefixes[n] = m, prefix
  local sync = m._sync_entries    -- a list container registers entries put in with rawset
  if sync then sync(m) end
  local r = reg(m)
  if next(r.watch) ~= nil then adopt_watched(m, r) end
  local through = rawget(getmetatable(m) or {}, 'transparent')
  for _, k in ipairs(r.mnames) do
    gather_modules(r.modules[k], through and prefix or prefix .. k .. '.', mods, prefixes)
  end
end

local function all_modules(m)
  local mods, prefixes = {}, {}
  gather_modules(m, '', mods, prefixes)
  return mods, prefixes
end

-- o: nil or {recurse = true | false} (false: the module's own tensors alone, as
-- torch's recurse=False).
local function recursing(o, what)
  if o == nil then return true end
  if type(o) ~= 'table' or (o.recurse ~= nil and type(o.recurse) ~= 'boolean') then
    raise(('%s: expected nil or an options table {recurse = true|false}, got %s'):format(what,
      type(o) == 'table' and 'recurse = ' .. core.kind(o.recurse) or core.kind(o)))
  end
  return o.recurse ~= false
end

-- {{dotted name, tensor}} of kind 'p' (parameters) or 'b' (buffers).
local function named(self, o, what, names, tensors)
  local list = {}
  local mods, prefixes = { self }, { '' }
  if recursing(o, what) then mods, prefixes = all_modules(self) end
  for i, m in ipairs(mods) do
    local r, prefix = reg(m), prefixes[i]
    for _, k in ipairs(r[names]) do list[#list + 1] = { prefix .. k, r[tensors][k] } end
  end
  return list
end

function Module:named_parameters(o) return named(self, o, 'named_parameters', 'pnames', 'params') end

function Module:parameters(o)
  local list = {}
  for i, np in ipairs(named(self, o, 'parameters', 'pnames', 'params')) do list[i] = np[2] end
  return list
end

function Module:named_buffers(o) return named(self, o, 'named_buffers', 'bnames', 'buffers') end

function Module:buffers(o)
  local list = {}
  for i, nb in ipairs(named(self, o, 'buffers', 'bnames', 'buffers')) do list[i] = nb[2] end
  return list
end

function Module:named_children()
  local r, list = reg(self), {}
  for _, k in ipairs(r.mnames) do list[#list + 1] = { k, r.modules[k] } end
  return list
end

function Module:children()
  local list = {}
  for i, nc in ipairs(self:named_children()) do list[i] = nc[2] end
  return list
end

function Module:modules()
  return (all_modules(self))
end

function Module:apply(fn)
  for _, c in ipairs(self:children()) do c:apply(fn) end
  fn(self)
  return self
end

function Module:train(flag)
  if flag == nil then flag = true end
  for _, m in ipairs((all_modules(self))) do rawset(m, 'training', flag and true or false) end
  return self
end
function Module:eval() return self:train(false) end

function Module:zero_grad()
  for _, p in ipairs(self:parameters()) do p.grad = nil end
end

function Module:num_parameters()
  local n = 0
  for _, p in ipairs(self:parameters()) do n = n + p:numel() end
  return n
end

-- to(dtype | device | {dtype=, device=, memory_format=}): parameters stay leaves
-- that require grad. A memory_format reorders the 4-D parameters (and their
-- gradients) and buffers in place of their data (ember/layout.lua), after any
-- dtype/device conversion, as torch's module.to(memory_format=...).
-- The device Module:to's arguments name, if any: 'cpu', 'meta', 'cuda[:N]', or a
-- table's device field (a dtype alone names none).
local function device_of_args(args)
  local a = args[1]
  if type(a) == 'string' and (a == 'cpu' or a == 'meta' or a:match('^cuda')) then return a end
  if type(a) == 'table' and a.device ~= nil then return a.device end
  return nil
end

function Module:to(...)
  local args = { ... }
  local fmt
  for i, v in ipairs(args) do
    if type(v) == 'table' and v.memory_format ~= nil then
      local layout = require 'ember.layout'
      fmt = layout.format_of(v.memory_format, 'Module:to')
      if v.dtype == nil and v.device == nil then args[i] = nil
      else args[i] = { dtype = v.dtype, device = v.device } end
    end
  end
  if fmt ~= nil then
    if #args > 0 then self:to(unpack(args)) end
    if fmt == 'keep' then return self end
    local layout = require 'ember.layout'
    for _, m in ipairs((all_modules(self))) do
      local r = reg(m)
      for _, k in ipairs(r.pnames) do
        local p = r.params[k]
        if p:dim() == 4 then
          layout.set_memory_format_(p, fmt)
          local g = p.grad
          if g ~= nil and g:dim() == 4 then layout.set_memory_format_(g, fmt) end
        end
      end
      for _, k in ipairs(r.bnames) do
        local b = r.buffers[k]
        if b ~= nil and b:dim() == 4 then layout.set_memory_format_(b, fmt) end
      end
    end
    return self
  end
  local moved = false
  for _, m in ipairs((all_modules(self))) do
    local r = reg(m)
    for _, k in ipairs(r.pnames) do
      local p = r.params[k]
      local q = p:to(unpack(args))
      if q ~= p then
        q = q:detach():requires_grad_(p.requires_grad)
        r.params[k] = q
        moved = true
      end
    end
    if m._after_to then m:_after_to() end
    for _, k in ipairs(r.bnames) do
      local b = r.buffers[k]
      local c
      if b:is_floating_point() then
        c = b:to(unpack(args))
      else
        -- integer buffers (num_batches_tracked, position ids) move with the model
        -- but keep their dtype
        local dev = device_of_args(args)
        c = dev and b:to(dev) or b
      end
      if c ~= b then r.buffers[k] = c; moved = true end
    end
  end
  -- The tensors left behind are garbage; collected now, the device they were on
  -- has their memory back at once (a model placed by hand across GPUs, block by
  -- block, would otherwise stay whole on the first until the collector ran).
  if moved then core.collect() end
  return self
end

-- state_dict and load_state_dict: ember.nn.module_state
require('ember.nn.module_state')(Module)

local function shape_str(t) return '[' .. table.concat(t.shape, ',') .. ']' end

-- -- Printing -------------------------------------------------------------------------------
function Module:extra_repr() return '' end

local function count_str(n)
  local s = tostring(n):reverse():gsub('(%d%d%d)', '%1,'):reverse()
  return (s:gsub('^,', ''))
end

local function repr(m, indent)
  local r = reg(m)
  local head = m.__name .. '(' .. m:extra_repr()
  local own = {}
  for _, k in ipairs(r.pnames) do own[#own + 1] = k .. ' ' .. shape_str(r.params[k]) end
  if #r.mnames == 0 then
    local s = head .. ')'
    if #own > 0 then
      local n = 0
      for _, k in ipairs(r.pnames) do n = n + r.params[k]:numel() end
      s = s .. '  -- ' .. table.concat(own, ', ') .. ' (' .. count_str(n) .. ' params)'
    end
    return s
  end
  local lines = { head .. (head:sub(-1) == '(' and '' or ',') }
  if head:sub(-1) ~= '(' then lines[1] = head .. ')(' end
  local pad = indent .. '  '
  for _, k in ipairs(r.pnames) do lines[#lines + 1] = pad .. k .. ': ' .. shape_str(r.params[k]) end
  for _, k in ipairs(r.mnames) do
    lines[#lines + 1] = pad .. '(' .. k .. '): ' .. repr(r.modules[k], pad)
  end
  lines[#lines + 1] = indent .. ')'
  return table.concat(lines, '\n')
end

Module.__tostring = function(self)
  local n = self:num_parameters()
  if n == 0 and #reg(self).mnames == 0 then return repr(self, '') end
  return repr(self, '') .. '\n' .. count_str(n) .. ' parameters'
end
Module.__call = Module.__call

is_class[Module] = true
Module.__index = instance_index
Module.__newindex = instance_newindex
Module.is_module = is_module

return Module

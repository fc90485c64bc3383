--[[
ember.nn.container -- the containers: Sequential(m1, m2, ...) (or Sequential{m1, ...}),
ModuleList(list), ModuleDict(table), ParameterList(list), ParameterDict(table).

Lists keep their entries as raw array slots (so l[i], #l and ipairs(l) are plain
Lua) and register entry i under the name "i" (parameters are named
`blocks.1.weight`, PyTorch's `blocks.0.weight` counted from 1). An entry put in
with rawset or table.insert is registered when the module tree is next walked
(the `_sync_entries` method, which Module's traversal calls). Dicts keep their entries in
the registry, in insertion order.

A plain Lua table of modules or parameters assigned to a module's field becomes
one of these in place (ember.nn.module calls adopt_table; an empty table is adopted
once it is filled, at the next walk of the tree), so its parameters are never
silently left out of parameters(), state_dict, to() or train().
]]
local em = require 'ember'
local core = require 'ember.ffi'
local raise, kind = core.raise, core.kind

local function plural(n, one, many) return n == 1 and ('1 ' .. one) or (n .. ' ' .. many) end

return function(nn)
  local Module = nn.Module
  local is_module = Module.is_module
  local function is_param(v) return em.is_tensor(v) and v.requires_grad end
  local function reg(self) return rawget(self, '_reg') end

  -- The children's names "1", "2", ... made once: tostring(i) on every forward
  -- would be a visible share of a small net's inference time.
  local names = setmetatable({}, { __index = function(t, i)
    local s = tostring(i)
    t[i] = s
    return s
  end })

  local function out_of_range(what, i, n)
    raise(('%s: index %s is out of range: it has %s (valid indices are 1 to %d)')
      :format(what, tostring(i), plural(n, 'child', 'children'), n))
  end

  -- -- Sequential ----------------------------------------------------------------------
  local Sequential = Module:extend('Sequential')
  function Sequential:init(...)
    local list = { ... }
    if #list == 1 and type(list[1]) == 'table' and not is_module(list[1]) then
      list = list[1]
    end
    rawset(self, 'n', 0)
    for _, m in ipairs(list) do self:add(m) end
  end
  function Sequential:add(m)
    if not is_module(m) then raise('Sequential: expected a module, got ' .. kind(m)) end
    local n = rawget(self, 'n') + 1
    rawset(self, 'n', n)
    self[names[n]] = m
    rawset(self, n, m)     -- seq[i] and #seq (LuaJIT ignores __len on tables)
    return self
  end
  function Sequential:forward(x)
    local r = rawget(self, '_reg')
    for i = 1, rawget(self, 'n') do x = r.modules[names[i]](x) end
    return x
  end
  function Sequential:get(i)
    local n = rawget(self, 'n')
    if type(i) ~= 'number' or i < 1 or i > n or i % 1 ~= 0 then out_of_range('Sequential:get', i, n) end
    return reg(self).modules[names[i]]
  end
  nn.Sequential = Sequential

  -- -- Lists ----------------------------------------------------------------------------
  -- make_list(name, accepts, what, kind_of_entry): ModuleList and ParameterList.
  local function make_list(name, accepts, what)
    local L = Module:extend(name)
    local function check(self, v, where)
      if not accepts(v) then
        raise(('%s: %s must be %s, got %s'):format(name, where, what, kind(v)))
      end
    end
    -- Registers raw slots 1..#self under "1".."n" and drops names past the end.
    function L:_sync_entries()
      local r, n = reg(self), #self
      local list, set = r.mnames, r.modules
      if name == 'ParameterList' then list, set = r.pnames, r.params end
      local same = #list == n
      for i = 1, n do
        local v = rawget(self, i)
        if set[names[i]] ~= v or list[i] ~= names[i] then same = false end
      end
      if same then return end
      for k in pairs(set) do set[k] = nil end
      for i = #list, 1, -1 do list[i] = nil end
      for i = 1, n do
        local v = rawget(self, i)
        check(self, v, 'entry ' .. i)
        list[i], set[names[i]] = names[i], v
      end
    end
    function L:init(list)
      if list ~= nil then self:extend(list) end
    end
    function L:append(v)
      check(self, v, 'append\'s argument')
      rawset(self, #self + 1, v)
      self:_sync_entries()
      return self
    end
    function L:extend(list)
      if type(list) ~= 'table' or is_module(list) then
        raise(('%s:extend: expected a list, got %s'):format(name, kind(list)))
      end
      local items = {}
      for i, v in ipairs(list) do check(self, v, 'entry ' .. i); items[i] = v end
      for _, v in ipairs(items) do rawset(self, #self + 1, v) end
      self:_sync_entries()
      return self
    end
    -- insert(i, v) puts v before entry i (as PyTorch's insert); i = #l + 1 appends.
    function L:insert(i, v)
      local n = #self
      if type(i) ~= 'number' or i % 1 ~= 0 or i < 1 or i > n + 1 then
        raise(('%s:insert: index %s is out of range: it has %s (valid indices are 1 to %d)')
          :format(name, tostring(i), plural(n, 'entry', 'entries'), n + 1))
      end
      check(self, v, 'insert\'s argument')
      table.insert(self, i, v)
      self:_sync_entries()
      return self
    end
    function L:get(i)
      local n = #self
      if type(i) ~= 'number' or i % 1 ~= 0 or i < 1 or i > n then
        raise(('%s:get: index %s is out of range: it has %s (valid indices are 1 to %d)')
          :format(name, tostring(i), plural(n, 'entry', 'entries'), n))
      end
      return rawget(self, i)
    end
    function L:ipairs() return ipairs(self) end
    function L:len() return #self end
    -- l[i] = v for a new slot i (existing slots are raw and the next sync sees them).
    L.__newindex = function(self, k, v)
      if type(k) == 'number' then
        local n = #self
        if k % 1 ~= 0 or k < 1 or k > n + 1 then
          raise(('%s: index %s is out of range for assignment: it has %s (use append)')
            :format(name, tostring(k), plural(n, 'entry', 'entries')))
        end
        check(self, v, 'entry ' .. k)
        rawset(self, k, v)
        return self:_sync_entries()
      end
      return Module.__newindex(self, k, v)
    end
    -- A parameter moved by to() is a new tensor: the raw slot follows the registry.
    function L:_after_to()
      if name ~= 'ParameterList' then return end
      local r = reg(self)
      for i = 1, #self do rawset(self, i, r.params[names[i]]) end
    end
    function L:forward() raise(name .. ': has no forward; call its entries') end
    return L
  end
  nn.ModuleList = make_list('ModuleList', is_module, 'a module')
  nn.ParameterList = make_list('ParameterList', is_param,
    'a parameter (em.nn.Parameter or a tensor that requires grad)')

  -- -- Dicts ----------------------------------------------------------------------------
  local function make_dict(name, accepts, what)
    local D = Module:extend(name)
    local function key_of(k)
      if type(k) == 'number' then return names[k] end
      if type(k) ~= 'string' then raise(('%s: keys must be strings, got %s'):format(name, kind(k))) end
      if D[k] ~= nil or k == 'training' or k:sub(1, 1) == '_' then
        raise(('%s: key %q names one of its methods or fields; choose another key'):format(name, k))
      end
      return k
    end
    function D:init(t)
      if t ~= nil then self:update(t) end
    end
    -- update(t): t's keys sorted (a Lua table has no order), or a list of {key, value} pairs.
    function D:update(t)
      if type(t) ~= 'table' or is_module(t) then
        raise(('%s:update: expected a table, got %s'):format(name, kind(t)))
      end
      local keys = {}
      if #t > 0 and type(t[1]) == 'table' and not is_module(t[1]) then
        for _, kv in ipairs(t) do keys[#keys + 1] = kv[1]; end
        local vals = {}
        for i, kv in ipairs(t) do vals[i] = kv[2] end
        t = {}
        for i, k in ipairs(keys) do t[k] = vals[i] end
      else
        for k in pairs(t) do keys[#keys + 1] = k end
        table.sort(keys, function(a, b) return tostring(a) < tostring(b) end)
      end
      for _, k in ipairs(keys) do
        if not accepts(t[k]) then
          raise(('%s: the value at key %s must be %s, got %s'):format(name, tostring(k), what, kind(t[k])))
        end
      end
      for _, k in ipairs(keys) do self[key_of(k)] = t[k] end
      return self
    end
    local function ordered(self)
      local r = reg(self)
      if name == 'ParameterDict' then return r.pnames, r.params end
      return r.mnames, r.modules
    end
    function D:keys()
      local list = {}
      for i, k in ipairs((ordered(self))) do list[i] = k end
      return list
    end
    function D:values()
      local list, set = ordered(self)
      local out = {}
      for i, k in ipairs(list) do out[i] = set[k] end
      return out
    end
    function D:items()
      local list, set = ordered(self)
      local out = {}
      for i, k in ipairs(list) do out[i] = { k, set[k] } end
      return out
    end
    -- for k, v in d:pairs() do ... end, in insertion order.
    function D:pairs()
      local items, i = self:items(), 0
      return function()
        i = i + 1
        local kv = items[i]
        if kv then return kv[1], kv[2] end
      end
    end
    function D:len() return #(ordered(self)) end
    function D:contains(k) local _, set = ordered(self); return set[k] ~= nil end
    function D:pop(k)
      local _, set = ordered(self)
      local v = set[k]
      if v == nil then raise(('%s:pop: no key %s'):format(name, tostring(k))) end
      self[k] = nil
      return v
    end
    D.__newindex = function(self, k, v)
      if v ~= nil and not accepts(v) then
        raise(('%s: the value at key %s must be %s, got %s'):format(name, tostring(k), what, kind(v)))
      end
      return Module.__newindex(self, key_of(k), v)
    end
    function D:forward() raise(name .. ': has no forward; call its entries') end
    return D
  end
  nn.ModuleDict = make_dict('ModuleDict', is_module, 'a module')
  nn.ParameterDict = make_dict('ParameterDict', is_param,
    'a parameter (em.nn.Parameter or a tensor that requires grad)')

  -- -- Plain tables assigned to a module's field ------------------------------------------
  -- adopt_table(owner, field, t): t made the container it stands for, in place
  -- (ModuleList, ModuleDict, ParameterList or ParameterDict), or nil when t holds no
  -- module and no parameter (it stays a plain table). Nested tables are adopted too.
  local function holds_registrable(t, seen)
    seen = seen or {}
    if seen[t] then return false end
    seen[t] = true
    for _, v in pairs(t) do
      if is_module(v) or is_param(v) then return true end
      if type(v) == 'table' and getmetatable(v) == nil and holds_registrable(v, seen) then return true end
    end
    return false
  end

  local function adopt(owner, field, t)
    if getmetatable(t) ~= nil or not holds_registrable(t) then return nil end
    local n, count, mods, params = #t, 0, 0, 0
    local vals = {}
    for k, v in pairs(t) do
      count = count + 1
      if type(v) == 'table' and not is_module(v) then
        local c = adopt(owner, field .. '[' .. tostring(k) .. ']', v)
        if c then v = c end
      end
      vals[k] = v
      if is_module(v) then mods = mods + 1
      elseif is_param(v) then params = params + 1
      else
        raise(('%s: the table assigned to %s holds modules or parameters and also a %s at key ' ..
          '%s; it would be registered as an em.nn.ModuleList/ModuleDict, which hold only modules ' ..
          '(or ParameterList/ParameterDict, only parameters): keep other values in a field of their own')
          :format(owner, field, kind(v), tostring(k)))
      end
    end
    if mods > 0 and params > 0 then
      raise(('%s: the table assigned to %s mixes modules and parameters; put them in separate ' ..
        'fields (a ModuleList/ModuleDict and a ParameterList/ParameterDict)'):format(owner, field))
    end
    -- t becomes the container itself, so a reference the caller kept still sees it
    local is_list = count == n
    for k in pairs(vals) do t[k] = nil end
    if is_list then
      local list = {}
      for i = 1, n do list[i] = vals[i] end
      return Module._become(t, mods > 0 and nn.ModuleList or nn.ParameterList, list)
    end
    return Module._become(t, mods > 0 and nn.ModuleDict or nn.ParameterDict, vals)
  end
  Module._adopt_table = adopt
end

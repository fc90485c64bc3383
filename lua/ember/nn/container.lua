--[[
ember.nn.container -- Sequential(m1, m2, ...) (or Sequential{m1, m2, ...}):
children named "1", "2", ... run in order; seq[i] is child i, #seq the count (raw array entries),
seq:add(m) appends.
]]
return function(nn)
  local Sequential = nn.Module:extend('Sequential')
  function Sequential:init(...)
    local list = { ... }
    if #list == 1 and type(list[1]) == 'table' and not nn.Module.is_module(list[1]) then
      list = list[1]
    end
    rawset(self, 'n', 0)
    for _, m in ipairs(list) do self:add(m) end
  end
  function Sequential:add(m)
    if not nn.Module.is_module(m) then
      require('ember.ffi').raise('Sequential: expected a module, got ' .. type(m))
    end
    local n = rawget(self, 'n') + 1
    rawset(self, 'n', n)
    self[tostring(n)] = m
    rawset(self, n, m)     -- seq[i] and #seq (LuaJIT ignores __len on tables)
    return self
  end
  -- The children's names "1", "2", ... made once: tostring(i) on every forward
  -- would be a visible share of a small net's inference time.
  local names = setmetatable({}, { __index = function(t, i)
    local s = tostring(i)
    t[i] = s
    return s
  end })
  function Sequential:forward(x)
    local r = rawget(self, '_reg')
    for i = 1, rawget(self, 'n') do x = r.modules[names[i]](x) end
    return x
  end
  function Sequential:get(i) return rawget(self, '_reg').modules[tostring(i)] end
  nn.Sequential = Sequential
end

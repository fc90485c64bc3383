--[[
ember.repl -- the Lua half of the ember command's REPL: tab completion.

complete(text, line) gets the word under the cursor ("em.ze", "t:su", "pri")
and returns the full candidates ("em.zeros", "em.zeros_like"). The part before
the last '.' or ':' is looked up as a chain of names from the globals, never
evaluated as code (no calls, so completing cannot run anything with side
effects beyond __index). Fields come from tables, their __index tables, and
for tensors from the method table and the computed fields; after ':' only
functions are offered. Inside the string of help('...') the candidates are the
reference's names (em.nn.Conv2d, Tensor:matmul).
]]
local M = {}

local keywords = { 'and', 'break', 'do', 'else', 'elseif', 'end', 'false', 'for', 'function',
  'goto', 'if', 'in', 'local', 'nil', 'not', 'or', 'repeat', 'return', 'then', 'true',
  'until', 'while' }

-- Resolve "a.b.c" from the globals; nil when any step is missing or fails.
local function resolve(path)
  local obj = _G
  for name in path:gmatch('[^%.:]+') do
    if not name:match('^[%a_][%w_]*$') then return nil end
    local ok, v = pcall(function() return obj[name] end)
    if not ok or v == nil then return nil end
    obj = v
  end
  return obj
end

-- Keys of x worth offering, into set.
local function collect(x, set, methods_only, depth)
  depth = depth or 0
  if depth > 4 then return end
  local tx = type(x)
  if tx == 'table' and x == package.loaded.ember then
    local _ = x.version           -- em loads lazily: make its fields exist
  end
  if tx == 'table' then
    for k, v in pairs(x) do
      if type(k) == 'string' and (not methods_only or type(v) == 'function') then set[k] = true end
    end
    local mt = getmetatable(x)
    if type(mt) == 'table' and type(mt.__index) == 'table' then
      collect(mt.__index, set, methods_only, depth + 1)
    end
  elseif tx == 'string' then
    collect(string, set, methods_only, depth + 1)
  elseif tx == 'cdata' then
    local ok, em = pcall(require, 'ember')
    if ok and em.is_tensor(x) then
      local core = require 'ember.ffi'
      collect(core.Tensor, set, methods_only, depth + 1)
      if not methods_only then
        for k in pairs(core.getters) do set[k] = true end
      end
    end
  end
end

function M.candidates(text)
  local head, sep, partial = text:match('^(.*)([%.:])([%w_]*)$')
  local set = {}
  if head then
    if not head:match('^[%a_][%w_%.:]*$') then return {} end
    local obj = resolve(head)
    if obj == nil then return {} end
    collect(obj, set, sep == ':')
  else
    partial, head, sep = text, '', ''
    collect(_G, set, false)
    for _, k in ipairs(keywords) do set[k] = true end
  end
  local out = {}
  for k in pairs(set) do
    if k:sub(1, #partial) == partial and k:match('^[%a_][%w_]*$') then
      if not (k:sub(1, 1) == '_' and partial:sub(1, 1) ~= '_') then
        out[#out + 1] = head .. sep .. k
      end
    end
  end
  table.sort(out)
  return out
end

-- Inside help's string (help('nn.Con), the reference's names (ember.doc_names).
local function help_names(text)
  local out = {}
  for _, n in ipairs(require('ember.doc_names').names()) do
    if n:sub(1, #text) == text then out[#out + 1] = n end
  end
  return out
end

function M.complete(text, line)
  local inside = line and line:match('help%(%s*[\'"]([^\'"]*)$')
  if inside and inside == text then
    local ok, res = pcall(help_names, text)
    if ok then return res end
  end
  local ok, res = pcall(M.candidates, text or '')
  if ok then return res end
  return {}
end

return M

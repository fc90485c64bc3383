--[[
ember.checkpoint.json -- the JSON decoder of ember.checkpoint: strict RFC 8259
JSON from a file that may be hostile, with a depth limit; it builds data, never
runs anything.

  local v, kinds, counts = decode(text, max_depth)

Objects and arrays become Lua tables, recorded in `kinds` ('object' or 'array',
so that a caller can tell {} from []) with their element count in `counts`.
null is refused (the documents never hold it: a nil could not be stored in a
table anyway). Errors are raised as tables {msg = '... at byte N'}.
]]
local bit = require 'bit'
local fmt, char, concat = string.format, string.char, table.concat

local function decode(text, MAX_DEPTH)
  local pos, kinds, counts = 1, {}, {}
  local function bad(msg)
    error({ msg = fmt('%s at byte %d', msg, pos) }, 0)
  end
  local function ws()
    pos = text:find('[^ \t\r\n]', pos) or #text + 1
  end
  local function utf8(cp)
    if cp < 0x80 then return char(cp) end
    if cp < 0x800 then return char(0xc0 + bit.rshift(cp, 6), 0x80 + bit.band(cp, 0x3f)) end
    if cp < 0x10000 then
      return char(0xe0 + bit.rshift(cp, 12), 0x80 + bit.band(bit.rshift(cp, 6), 0x3f),
        0x80 + bit.band(cp, 0x3f))
    end
    return char(0xf0 + bit.rshift(cp, 18), 0x80 + bit.band(bit.rshift(cp, 12), 0x3f),
      0x80 + bit.band(bit.rshift(cp, 6), 0x3f), 0x80 + bit.band(cp, 0x3f))
  end
  local simple = { ['"'] = '"', ['\\'] = '\\', ['/'] = '/', b = '\b', f = '\f', n = '\n',
    r = '\r', t = '\t' }
  local function str()
    pos = pos + 1
    local parts = {}
    while true do
      local s = text:find('["\\%c]', pos)
      if not s then pos = #text + 1; bad('unterminated string') end
      parts[#parts + 1] = text:sub(pos, s - 1)
      local c = text:sub(s, s)
      pos = s
      if c == '"' then pos = s + 1; return concat(parts) end
      if c ~= '\\' then bad('control character in a string') end
      local e = text:sub(s + 1, s + 1)
      if simple[e] then
        parts[#parts + 1] = simple[e]
        pos = s + 2
      elseif e == 'u' then
        local h = text:match('^%x%x%x%x', s + 2)
        if not h then bad('invalid \\u escape') end
        local cp = tonumber(h, 16)
        if cp >= 0xdc00 and cp <= 0xdfff then bad('lone surrogate') end
        pos = s + 6
        if cp >= 0xd800 and cp <= 0xdbff then
          local h2 = text:match('^\\u(%x%x%x%x)', pos)
          local lo = h2 and tonumber(h2, 16)
          if not lo or lo < 0xdc00 or lo > 0xdfff then bad('lone surrogate') end
          cp = 0x10000 + (cp - 0xd800) * 1024 + (lo - 0xdc00)
          pos = pos + 6
        end
        parts[#parts + 1] = utf8(cp)
      else
        bad('invalid escape')
      end
    end
  end
  local value
  -- The items of an object or array; item() parses one.
  local function items(close, depth, item)
    if depth > MAX_DEPTH then bad('nesting deeper than ' .. MAX_DEPTH .. ' levels') end
    pos = pos + 1
    ws()
    if text:sub(pos, pos) == close then pos = pos + 1; return end
    while true do
      item()
      ws()
      local c = text:sub(pos, pos)
      if c == close then pos = pos + 1; return end
      if c ~= ',' then bad("expected ',' or '" .. close .. "'") end
      pos = pos + 1
      ws()
    end
  end
  value = function(depth)
    ws()
    local c = text:sub(pos, pos)
    if c == '{' then
      local t, n = {}, 0
      items('}', depth, function()
        if text:sub(pos, pos) ~= '"' then bad('expected a string key') end
        local k = str()
        ws()
        if text:sub(pos, pos) ~= ':' then bad("expected ':'") end
        pos = pos + 1
        if t[k] ~= nil then bad("duplicate key '" .. k .. "'") end
        t[k] = value(depth + 1)
        n = n + 1
      end)
      kinds[t], counts[t] = 'object', n
      return t
    elseif c == '[' then
      local t, n = {}, 0
      items(']', depth, function()
        n = n + 1
        t[n] = value(depth + 1)
      end)
      kinds[t], counts[t] = 'array', n
      return t
    elseif c == '"' then
      return str()
    end
    local lit = text:match('^true', pos) or text:match('^false', pos)
    if lit then
      pos = pos + #lit
      return lit == 'true'
    end
    local num = text:match('^-?%d+%.?%d*[eE]?[-+]?%d*', pos)
    local v = num and tonumber(num)
    if not v then bad('invalid value') end
    pos = pos + #num
    return v
  end
  local v = value(1)
  ws()
  if pos <= #text then bad('trailing characters') end
  return v, kinds, counts
end

return decode

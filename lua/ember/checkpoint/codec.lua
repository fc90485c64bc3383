--[[
ember.checkpoint.codec -- the values of ember.checkpoint's JSON document: encode
writes a Lua value as the document's JSON (tensors collected by dotted path,
values JSON lacks tagged: __num__, __bytes__, __int64__, __uint64__, __pairs__,
__state_dict__), revive turns the decoded JSON (ember.checkpoint.json) back into
Lua values, tags resolved and tensors looked up.

  codec.encode(ctx, v, path, buf, depth)   ctx = {tensors = {}, name_of = {}, seen = {}}
  codec.revive(ctx, v, depth)              ctx = {tensors, used, state_dicts, kinds, counts}

encode raises at the user's line; revive raises tables {msg = ...}.
]]
local ffi = require 'ffi'
local core = require 'ember.ffi'
local C, raise, kind = core.C, core.raise, core.kind
local box_t, istype = core.box_t, ffi.istype
local fmt, byte, char = string.format, string.byte, string.char

local M = {}
local MAX_DEPTH = 100
M.MAX_DEPTH = MAX_DEPTH

-- -- JSON out -------------------------------------------------------------------------------

-- Strings are quoted, and checked to be UTF-8, by the core's JSON writer (the
-- one that writes safetensors headers): one implementation of both rules.
local quote = core.json_quote

-- Well-formed UTF-8 (what the file format requires of its header).
local function utf8_ok(s) return C.em_utf8_valid(s, #s) ~= 0 end

local function is_marker(k)
  return type(k) == 'string' and k:match('^__.*__$') ~= nil
end

-- The state_dict method of v, if it has one.
local function state_dict_of(v)
  if type(v) ~= 'table' then return nil end
  local ok, f = pcall(function() return v.state_dict end)
  return ok and type(f) == 'function' and f or nil
end

local int64_t, uint64_t = ffi.typeof('int64_t'), ffi.typeof('uint64_t')
local function u64str(x) return (tostring(x):gsub('U?LL$', '')) end

-- Encodes v (found at dotted path `path`) into the list buf; tensors go to ctx.
local function encode(ctx, v, path, buf, depth)
  if depth > MAX_DEPTH then
    raise(fmt("checkpoint.save: '%s' is nested deeper than %d levels", path, MAX_DEPTH))
  end
  local tv = type(v)
  if tv == 'number' then
    if v ~= v then buf[#buf + 1] = '{"__num__":"nan"}'
    elseif v == math.huge then buf[#buf + 1] = '{"__num__":"inf"}'
    elseif v == -math.huge then buf[#buf + 1] = '{"__num__":"-inf"}'
    elseif v == 0 and 1 / v < 0 then buf[#buf + 1] = '-0.0'
    elseif v % 1 == 0 and v > -2 ^ 53 and v < 2 ^ 53 then buf[#buf + 1] = fmt('%d', v)
    else buf[#buf + 1] = fmt('%.17g', v) end
  elseif tv == 'string' then
    if utf8_ok(v) then buf[#buf + 1] = quote(v)
    else
      buf[#buf + 1] = '{"__bytes__":"' .. v:gsub('.', function(c)
        return fmt('%02x', byte(c)) end) .. '"}'
    end
  elseif tv == 'boolean' then
    buf[#buf + 1] = v and 'true' or 'false'
  elseif istype(box_t, v) then
    local name = ctx.name_of[v]
    if not name then
      name = path
      local k = 1
      while ctx.tensors[name] ~= nil do k = k + 1; name = path .. '#' .. k end
      ctx.tensors[name] = v
      ctx.name_of[v] = name
    end
    buf[#buf + 1] = '{"__tensor__":' .. quote(name) .. '}'
  elseif istype(int64_t, v) then
    buf[#buf + 1] = '{"__int64__":"' .. u64str(v) .. '"}'
  elseif istype(uint64_t, v) then
    buf[#buf + 1] = '{"__uint64__":"' .. u64str(v) .. '"}'
  elseif tv == 'table' then
    local sd = state_dict_of(v)
    if sd then
      local d = sd(v)
      if type(d) ~= 'table' then
        raise(fmt("checkpoint.save: '%s':state_dict() returned a %s, expected a table", path,
          kind(d)))
      end
      buf[#buf + 1] = '{"__state_dict__":'
      encode(ctx, d, path, buf, depth + 1)
      buf[#buf + 1] = '}'
      return
    end
    if ctx.seen[v] then raise(fmt("checkpoint.save: the table at '%s' contains itself", path)) end
    ctx.seen[v] = true
    local n, count, strings, ints = #v, 0, true, true
    for k in pairs(v) do
      count = count + 1
      if type(k) ~= 'string' or is_marker(k) or not utf8_ok(k) then strings = false end
      if type(k) ~= 'number' or k % 1 ~= 0 or k < 1 or k > n then ints = false end
    end
    local prefix = path == '' and '' or path .. '.'
    if count == 0 then
      buf[#buf + 1] = '{}'
    elseif ints and count == n then            -- a list
      buf[#buf + 1] = '['
      for i = 1, n do
        if i > 1 then buf[#buf + 1] = ',' end
        encode(ctx, v[i], prefix .. i, buf, depth + 1)
      end
      buf[#buf + 1] = ']'
    else
      local keys = {}
      for k in pairs(v) do
        local tk = type(k)
        if tk ~= 'string' and (tk ~= 'number' or k ~= k) then
          raise(fmt("checkpoint.save: '%s' has a key of type %s (keys must be strings or " ..
            "numbers)", path == '' and '(root)' or path, kind(k)))
        end
        keys[#keys + 1] = k
      end
      table.sort(keys, function(a, b)
        if type(a) == type(b) then return a < b end
        return type(a) == 'number'
      end)
      buf[#buf + 1] = strings and '{' or '{"__pairs__":['
      for i, k in ipairs(keys) do
        if i > 1 then buf[#buf + 1] = ',' end
        if strings then
          buf[#buf + 1] = quote(k) .. ':'
        else
          buf[#buf + 1] = '['
          encode(ctx, k, path, buf, depth + 1)
          buf[#buf + 1] = ','
        end
        encode(ctx, v[k], prefix .. tostring(k), buf, depth + 1)
        if not strings then buf[#buf + 1] = ']' end
      end
      buf[#buf + 1] = strings and '}' or ']}'
    end
    ctx.seen[v] = nil
  else
    raise(fmt("checkpoint.save: '%s' is a %s; checkpoints hold numbers, strings, booleans, " ..
      "tensors, objects with :state_dict() and tables of those", path, kind(v)))
  end
end

-- -- Rebuilding values ------------------------------------------------------------------------

local function parse_u64(s, what)
  if type(s) ~= 'string' or not s:match('^%d+$') or #s > 20 then
    error({ msg = 'bad ' .. what .. ' value ' .. tostring(s) }, 0)
  end
  local v = 0ULL
  for i = 1, #s do v = v * 10 + (byte(s, i) - 48) end
  return v
end

-- The Lua value of decoded JSON v: tags resolved, tensors looked up.
local function revive(ctx, v, depth)
  if type(v) ~= 'table' then return v end
  local kinds = ctx.kinds
  local function bad(msg) error({ msg = msg }, 0) end
  if kinds[v] == 'array' then
    local t = {}
    for i = 1, ctx.counts[v] do t[i] = revive(ctx, v[i], depth + 1) end
    return t
  end
  local tag = ctx.counts[v] == 1 and next(v)
  if not is_marker(tag) then
    local t = {}
    for k, x in pairs(v) do t[k] = revive(ctx, x, depth + 1) end
    return t
  end
  local x = v[tag]
  if tag == '__tensor__' then
    local t = type(x) == 'string' and ctx.tensors[x]
    if not t then bad('it refers to a tensor ' .. tostring(x) .. ' that the file lacks') end
    ctx.used[x] = true
    return t
  elseif tag == '__state_dict__' then
    local t = revive(ctx, x, depth + 1)
    if type(t) ~= 'table' then bad('a state dict is not a table') end
    ctx.state_dicts[t] = true
    return t
  elseif tag == '__num__' then
    if x == 'nan' then return 0 / 0 elseif x == 'inf' then return math.huge
    elseif x == '-inf' then return -math.huge end
    bad('bad __num__ value ' .. tostring(x))
  elseif tag == '__bytes__' then
    if type(x) ~= 'string' or #x % 2 ~= 0 or x:find('[^%x]') then bad('bad __bytes__ value') end
    return (x:gsub('%x%x', function(h) return char(tonumber(h, 16)) end))
  elseif tag == '__int64__' then
    local neg = type(x) == 'string' and x:sub(1, 1) == '-'
    local u = parse_u64(neg and x:sub(2) or x, '__int64__')
    return neg and -ffi.cast('int64_t', u) or ffi.cast('int64_t', u)
  elseif tag == '__uint64__' then
    return parse_u64(x, '__uint64__')
  elseif tag == '__pairs__' then
    if kinds[x] ~= 'array' then bad('__pairs__ is not a list') end
    local t = {}
    for i = 1, ctx.counts[x] do
      local p = x[i]
      if kinds[p] ~= 'array' or ctx.counts[p] ~= 2 then bad('__pairs__ holds a non-pair') end
      local k = revive(ctx, p[1], depth + 1)
      if (type(k) ~= 'string' and type(k) ~= 'number') or k ~= k then
        bad('__pairs__ holds a key of type ' .. type(k))
      end
      t[k] = revive(ctx, p[2], depth + 1)
    end
    return t
  end
  bad('unknown tag ' .. tag)
end

M.encode, M.revive, M.parse_u64, M.u64str = encode, revive, parse_u64, u64str
M.state_dict_of = state_dict_of

return M

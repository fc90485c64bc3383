--[[
ember.checkpoint -- em.checkpoint.save / em.checkpoint.load: a training run's
whole state in one safetensors file, replaced atomically.

  em.checkpoint.save(path, {model = m, optimizer = opt, step = n, ...})
  local rest = em.checkpoint.load(path, {model = m, optimizer = opt})

What is saved. Every value of the table: numbers, strings, booleans, tensors,
64-bit integer cdata, nested tables of those, and any object with a
:state_dict() method (a model, an optimizer, a data loader, a scheduler), which
is saved as what that method returns. The RNG state (em_rng_get_state) is saved
too.

Layout. One safetensors file: every tensor under its dotted path from the root
("model.fc.weight", "optimizer.state.1.exp_avg", "extra.t"; a tensor reachable
twice is stored once), so that other tools can read the weights. Everything else
is a JSON document in the metadata key "ember.checkpoint": the tree of values
in which tensors are {"__tensor__": name}, state dicts {"__state_dict__": ...},
and values JSON lacks are tagged ({"__num__": "nan"}, {"__bytes__": hex} for
strings that are not UTF-8, {"__pairs__": [[k, v], ...]} for tables that are not
plain lists or plain string-keyed records). Plain lists become JSON arrays.

Atomicity. The file is written through em_safetensors_write with EM_SAVE_SYNC:
a temporary file in the same folder, fsync, rename over path, fsync of the
folder. A crash or kill -9 at any moment leaves path with the previous
checkpoint or the new one, whole (a stale "<path>.tmp-..." file may remain).
save's third argument {sync = false} skips the two fsyncs (still atomic against
a crash of the process, not against one of the machine).

Sharded models. When state.model is a sharded model (dm.shard_mode set), save
writes a folder instead, every replica its share (ember.checkpoint.shard_save);
load reads such a folder, or loads any checkpoint into a sharded model
(ember.checkpoint.shard_load).

Loading calls obj:load_state_dict(sd) for each object passed in, restores the
RNG state last (so that the next random draw equals the one that followed the
save), and returns the other fields. Nothing in the file is ever run: the JSON
is parsed by a small strict decoder (ember/checkpoint/json.lua), with a depth
limit. Writing it, the strings are quoted and UTF-8-checked by the core
(em_json_quote, em_utf8_valid: the safetensors writer's own rules).
]]
local ffi = require 'ffi'
local core = require 'ember.ffi'
local save = require 'ember.save'
local decode = require 'ember.checkpoint.json'
local C, S, raise, kind = core.C, core.S, core.raise, core.kind
local box_t, istype = core.box_t, ffi.istype
local fmt, byte, char, concat = string.format, string.byte, string.char, table.concat

local M = {}
M.FORMAT = 'ember.checkpoint'
M.VERSION = 1
local MAX_DEPTH = 100

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

-- -- save / load --------------------------------------------------------------------------------

local seed_box, offset_box = ffi.new('uint64_t[1]'), ffi.new('uint64_t[1]')

-- A sharded wrapped model (ember.distribute's s:wrap(m, {shard = ...})).
local function sharded(obj)
  if type(obj) ~= 'table' then return false end
  local ok, mode = pcall(function() return obj.shard_mode end)
  return ok and mode ~= nil
end

-- A folder holding a sharded checkpoint (its index.json).
local function sharded_dir(path)
  local f = io.open(path .. '/index.json', 'rb')
  if f then f:close() return true end
  return false
end

function M.save(path, state, opts)
  if type(path) ~= 'string' then
    raise('checkpoint.save: expected a file name as argument 1, got ' .. kind(path))
  end
  if type(state) ~= 'table' or istype(box_t, state) then
    raise('checkpoint.save: expected a table as argument 2 ({model = m, step = n, ...}), got ' ..
      kind(state))
  end
  if sharded(state.model) then return require('ember.checkpoint.shard_save').save(path, state, opts) end
  local ctx = { tensors = {}, name_of = {}, seen = {} }
  local buf = {}
  encode(ctx, state, '', buf, 0)
  C.em_rng_get_state(S, seed_box, offset_box)
  local doc = fmt('{"version":%d,"rng":{"seed":"%s","offset":"%s"},"fields":%s}', M.VERSION,
    u64str(seed_box[0]), u64str(offset_box[0]), concat(buf))
  local sync = not (opts and opts.sync == false)
  save.write('checkpoint.save', path, ctx.tensors, { format = M.FORMAT, [M.FORMAT] = doc }, sync)
end

function M.load(path, objects)
  if type(path) ~= 'string' then
    raise('checkpoint.load: expected a file name as argument 1, got ' .. kind(path))
  end
  if objects ~= nil and (type(objects) ~= 'table' or istype(box_t, objects)) then
    raise('checkpoint.load: expected a table of objects as argument 2 ({model = m}), got ' ..
      kind(objects))
  end
  objects = objects or {}
  if sharded(objects.model) or sharded_dir(path) then
    return require('ember.checkpoint.shard_load').load(path, objects)
  end
  for k, obj in pairs(objects) do
    local ok, f = pcall(function() return obj.load_state_dict end)
    if not (ok and type(f) == 'function') then
      raise(fmt("checkpoint.load: objects.%s has no :load_state_dict() method", tostring(k)))
    end
  end
  local tensors, meta = save.read('checkpoint.load', path)
  local doc = meta[M.FORMAT]
  if not doc then
    raise(fmt("checkpoint.load: '%s' is not an ember checkpoint (its metadata has no '%s' " ..
      "entry; use em.load for plain safetensors files)", path, M.FORMAT))
  end
  local ctx = { tensors = tensors, used = {}, state_dicts = {} }
  local ok, res = pcall(function()
    local v, kinds, counts = decode(doc, MAX_DEPTH)
    ctx.kinds, ctx.counts = kinds, counts
    if type(v) ~= 'table' or kinds[v] ~= 'object' then error({ msg = 'not an object' }, 0) end
    if v.version ~= M.VERSION then
      error({ msg = 'version ' .. tostring(v.version) .. ' (this ember reads ' .. M.VERSION ..
        ')' }, 0)
    end
    local rng = v.rng
    if type(rng) ~= 'table' then error({ msg = 'no rng state' }, 0) end
    return { fields = revive(ctx, v.fields, 0), seed = parse_u64(rng.seed, 'rng seed'),
      offset = parse_u64(rng.offset, 'rng offset') }
  end)
  if not ok then
    if type(res) ~= 'table' then error(res, 0) end
    raise(fmt("checkpoint.load: '%s': corrupt checkpoint document: %s", path, res.msg))
  end
  local fields = res.fields
  if type(fields) ~= 'table' then
    raise(fmt("checkpoint.load: '%s': corrupt checkpoint document: fields is not a table", path))
  end
  for k, obj in pairs(objects) do
    local sd = fields[k]
    if sd == nil then
      raise(fmt("checkpoint.load: '%s' has no '%s' entry to restore objects.%s from", path,
        tostring(k), tostring(k)))
    end
    obj:load_state_dict(sd)
    fields[k] = nil
  end
  C.em_rng_set_state(S, res.seed, res.offset)
  return fields
end

-- -- For ember.checkpoint.sharded ------------------------------------------------------------

-- The JSON document of value (as save writes its fields) and its tensors by name.
function M._encode(value)
  local ctx = { tensors = {}, name_of = {}, seen = {} }
  local buf = {}
  encode(ctx, value, '', buf, 0)
  return concat(buf), ctx.tensors
end

-- The value of such a document; tensors: name -> what a tensor reference
-- becomes. Errors are raised as tables {msg = ...}.
function M._decode(text, tensors)
  local v, kinds, counts = decode(text, MAX_DEPTH)
  local ctx = { tensors = tensors, used = {}, state_dicts = {}, kinds = kinds, counts = counts }
  return revive(ctx, v, 0)
end

-- The RNG state as two decimal strings, and its restoration from them.
function M._rng_get()
  C.em_rng_get_state(S, seed_box, offset_box)
  return { seed = u64str(seed_box[0]), offset = u64str(offset_box[0]) }
end
function M._rng_parse(rng)
  if type(rng) ~= 'table' then error({ msg = 'no rng state' }, 0) end
  return { seed = parse_u64(rng.seed, 'rng seed'), offset = parse_u64(rng.offset, 'rng offset') }
end
function M._rng_set(parsed) C.em_rng_set_state(S, parsed.seed, parsed.offset) end

return M

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
save), and returns the other fields. It restores every object or none: a file
that cannot be read, lacks an entry, or holds a state an object refuses (a
checkpoint of another run's model or optimizer) raises an error naming the file
and leaves every object and the RNG as they were. For that, each object's state
(its :state_dict(), where it has one) is copied to host memory before it is
loaded, and put back on a refusal. Nothing in the file is ever run: the JSON
is parsed by a small strict decoder (ember/checkpoint/json.lua), with a depth
limit. Writing it, the strings are quoted and UTF-8-checked by the core
(em_json_quote, em_utf8_valid: the safetensors writer's own rules).
]]
local ffi = require 'ffi'
local core = require 'ember.ffi'
local save = require 'ember.save'
local decode = require 'ember.checkpoint.json'
local codec = require 'ember.checkpoint.codec'
local C, S, raise, kind = core.C, core.S, core.raise, core.kind
local box_t, istype = core.box_t, ffi.istype
local fmt, concat = string.format, table.concat
local encode, revive, state_dict_of = codec.encode, codec.revive, codec.state_dict_of
local parse_u64, u64str = codec.parse_u64, codec.u64str

local M = {}
M.FORMAT = 'ember.checkpoint'
M.VERSION = 1
local MAX_DEPTH = codec.MAX_DEPTH

-- (the document's values are written and read back by ember.checkpoint.codec)

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

-- A copy of state dict v that later changes to the object do not reach:
-- tensors are copied to host memory (a GPU model's copy takes no device memory).
local function copy_state(v, depth)
  if istype(box_t, v) then
    local c = v:to('cpu')
    return rawequal(c, v) and v:clone() or c
  elseif type(v) == 'table' and depth < MAX_DEPTH then
    local t = {}
    for k, x in pairs(v) do t[k] = copy_state(x, depth + 1) end
    return t
  end
  return v
end

-- Restores every object from fields, or none: an object whose state is refused
-- (a checkpoint of another model or optimizer) leaves every object as it was,
-- each one put back from a copy of its state taken before, and the error names
-- the file.
local function restore_all(path, objects, fields)
  local done = {}
  for k, obj in pairs(objects) do
    -- (an object without a state to give yet -- one that only loads -- is not copied)
    local sd = state_dict_of(obj)
    local got, before = pcall(function() return sd and sd(obj) end)
    if got and type(before) == 'table' then
      done[#done + 1] = { obj = obj, before = copy_state(before, 0) }
    end
    local ok, err = pcall(obj.load_state_dict, obj, fields[k])
    if not ok then
      for i = #done, 1, -1 do done[i].obj:load_state_dict(done[i].before) end
      -- the object's error, without the position that raise gave it
      err = tostring(err):gsub('^[^\n]-:%d+: ', '', 1)
      raise(fmt("checkpoint.load: '%s': objects.%s refused its state: %s", path, tostring(k),
        err))
    end
  end
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
  for k in pairs(objects) do
    if fields[k] == nil then
      raise(fmt("checkpoint.load: '%s' has no '%s' entry to restore objects.%s from", path,
        tostring(k), tostring(k)))
    end
  end
  restore_all(path, objects, fields)
  for k in pairs(objects) do fields[k] = nil end
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

--[==[
ember.save -- em.save and em.load: safetensors files, read and written by the C
core (core/io/safetensors.c, which validates everything a file says before
believing it; loading never runs code).

  em.save(path, tensors[, metadata[, opts]])
      tensors: name -> tensor, nested tables allowed: {model = {fc = {weight = t}}}
      is written as "model.fc.weight" (list positions count from 1: {a = {t1, t2}}
      gives "a.1", "a.2"). metadata: string -> string (numbers and booleans are
      converted with tostring). opts.sync = true also flushes the file to the
      disk. The file is written beside path and renamed over it, so path never
      holds a half-written file. Strided tensors are written contiguously.
  em.load(path[, {nested = true}]) -> tensors, metadata
      tensors is flat (name -> tensor) unless nested is set: then dotted names
      become nested tables again, and name parts that are plain integers ("0",
      "12") become number keys, so lists come back as lists.

M.write(op, path, flat, metadata, sync, in_place) is the plain writer that
ember.checkpoint shares (flat: name -> tensor; in_place: EM_SAVE_IN_PLACE).
]==]
local ffi = require 'ffi'
local core = require 'ember.ffi'
require 'ember.tensor'
local C, S, wrap, raise, kind = core.C, core.S, core.wrap, core.raise, core.kind
local box_t, istype = core.box_t, ffi.istype
local out = core.out

local M = {}

-- Raises the C error; its "save:" / "load:" prefix becomes op's name.
local function cfail(op)
  local msg = core.errmsg()
  if op ~= 'save' and op ~= 'load' then msg = (msg:gsub('^%a+:', op .. ':', 1)) end
  raise(msg)
end

-- -- Names -----------------------------------------------------------------------------

-- Adds the tensors of nested table tbl to flat under dotted names.
local function flatten(op, tbl, prefix, flat, seen)
  for k, v in pairs(tbl) do
    local tk = type(k)
    if tk ~= 'string' and not (tk == 'number' and k % 1 == 0) then
      raise(('%s: table keys must be strings or integers, got %s%s'):format(op,
        tk == 'number' and tostring(k) or tk, prefix and ' in ' .. prefix or ''))
    end
    local name = prefix and (prefix .. '.' .. tostring(k)) or tostring(k)
    if istype(box_t, v) then
      if flat[name] ~= nil then
        raise(('%s: two tensors would both be named \'%s\''):format(op, name))
      end
      flat[name] = v
    elseif type(v) == 'table' then
      if seen[v] then raise(('%s: the table at \'%s\' contains itself'):format(op, name)) end
      seen[v] = true
      flatten(op, v, name, flat, seen)
      seen[v] = nil
    else
      raise(('%s: \'%s\' is a %s, expected a tensor or a table of tensors'):format(op, name,
        kind(v)))
    end
  end
end

local function sorted_keys(t)
  local keys = {}
  for k in pairs(t) do keys[#keys + 1] = k end
  table.sort(keys)
  return keys
end

-- "12" -> 12 (plain integers only: no sign, no leading zero), else the string.
local function key_of(part)
  if part == '0' or (part:match('^[1-9]%d*$') and #part < 16) then return tonumber(part) end
  return part
end

-- Dotted names -> nested tables.
local function nest(op, path, flat)
  local root = {}
  for _, name in ipairs(sorted_keys(flat)) do
    local node, parts = root, {}
    for part in (name .. '.'):gmatch('([^.]*)%.') do parts[#parts + 1] = key_of(part) end
    for i = 1, #parts do
      local key = parts[i]
      if i == #parts then
        if node[key] ~= nil then
          raise(("%s: '%s': '%s' is both a tensor and a prefix of other names; load it " ..
            "without {nested = true}"):format(op, path, name))
        end
        node[key] = flat[name]
      else
        local nxt = node[key]
        if nxt == nil then
          nxt = {}
          node[key] = nxt
        elseif type(nxt) ~= 'table' then
          raise(("%s: '%s': '%s' is both a tensor and a prefix of '%s'; load it without " ..
            "{nested = true}"):format(op, path, table.concat(parts, '.', 1, i), name))
        end
        node = nxt
      end
    end
  end
  return root
end

-- -- Writing --------------------------------------------------------------------------------

function M.write(op, path, flat, metadata, sync, in_place)
  local names = sorted_keys(flat)
  local n = #names
  local cnames = ffi.new('const char *[?]', n + 1)
  local handles = ffi.new('em_tensor *[?]', n + 1)
  local keep = {}                 -- anchors the cpu copies while C reads them
  for i, name in ipairs(names) do
    local t = flat[name]
    local h = t._h
    if C.em_tensor_device(h) ~= -1 then
      t = t:cpu()
      keep[#keep + 1] = t
      h = t._h
    end
    cnames[i - 1] = name
    handles[i - 1] = h
  end
  local mkeys, nm = {}, 0
  if metadata ~= nil then
    if type(metadata) ~= 'table' then
      raise(('%s: metadata must be a table of strings, got %s'):format(op, kind(metadata)))
    end
    for k, v in pairs(metadata) do
      if type(k) ~= 'string' then
        raise(('%s: metadata keys must be strings, got %s'):format(op, kind(k)))
      end
      local tv = type(v)
      if tv ~= 'string' and tv ~= 'number' and tv ~= 'boolean' then
        raise(('%s: metadata value of \'%s\' is a %s, expected a string'):format(op, k, kind(v)))
      end
      nm = nm + 1
      mkeys[nm] = k
    end
    table.sort(mkeys)
  end
  local ck = ffi.new('const char *[?]', nm + 1)
  local cv = ffi.new('const char *[?]', nm + 1)
  local vals = {}
  for i, k in ipairs(mkeys) do
    vals[i] = tostring(metadata[k])
    ck[i - 1] = k
    cv[i - 1] = vals[i]
  end
  local flags = (sync and C.EM_SAVE_SYNC or 0) + (in_place and C.EM_SAVE_IN_PLACE or 0)
  if C.em_safetensors_write(S, path, cnames, handles, n, ck, cv, nm, flags) ~= 0 then
    cfail(op)
  end
  return names, keep, vals      -- keeps the anchors alive until here
end

function M.save(path, tensors, metadata, opts)
  if type(path) ~= 'string' then
    raise('save: expected a file name as argument 1, got ' .. kind(path))
  end
  if type(tensors) ~= 'table' or istype(box_t, tensors) then
    raise('save: expected a table of tensors as argument 2 (e.g. {weight = t}), got ' ..
      kind(tensors))
  end
  if opts ~= nil and type(opts) ~= 'table' then
    raise('save: expected an options table as argument 4, got ' .. kind(opts))
  end
  local flat = {}
  flatten('save', tensors, nil, flat, { [tensors] = true })
  M.write('save', path, flat, metadata, opts and opts.sync)
end

-- -- Reading ---------------------------------------------------------------------------------

local fbox = ffi.new('em_safetensors *[1]')

function M.read(op, path)
  if type(path) ~= 'string' then
    raise(op .. ': expected a file name as argument 1, got ' .. kind(path))
  end
  if C.em_safetensors_open(S, path, fbox) ~= 0 then cfail(op) end
  local f = fbox[0]
  local tensors, metadata = {}, {}
  for i = 0, tonumber(C.em_safetensors_count(f)) - 1 do
    if C.em_safetensors_get(S, f, i, out) ~= 0 then
      C.em_safetensors_close(f)
      cfail(op)
    end
    local t = wrap(out[0])
    tensors[ffi.string(C.em_safetensors_name(f, i))] = t
  end
  for i = 0, tonumber(C.em_safetensors_metadata_count(f)) - 1 do
    metadata[ffi.string(C.em_safetensors_metadata_key(f, i))] =
      ffi.string(C.em_safetensors_metadata_value(f, i))
  end
  C.em_safetensors_close(f)
  return tensors, metadata
end

function M.load(path, opts)
  if opts ~= nil and type(opts) ~= 'table' then
    raise('load: expected an options table as argument 2, got ' .. kind(opts))
  end
  local tensors, metadata = M.read('load', path)
  if opts and opts.nested then tensors = nest('load', path, tensors) end
  return tensors, metadata
end

return M

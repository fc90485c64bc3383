--[[
ember.checkpoint.source -- a checkpoint as the sharded loader reads it: a
sharded folder (index.json and one file per replica) or a plain checkpoint file,
opened and checked whole, nothing read but headers.

  local src = source.open(op, path)   -- raises on anything wrong, naming the file
  src:range(entry, a, b) -> 1-D tensor of elements [a, b) of a parameter's (or a
                            state tensor's) flattened data
  src:whole(ref)         -> a buffer or field tensor, whole
  src:close()

What it describes:
  src.params[name] = {name, shape, dtype, numel, pieces}    (pieces below)
  src.buffers[name] = ref        src.fields = the other fields (tensors as refs)
  src.optimizer = nil or {kind (nil for plain files), param_groups,
                          by_name[name] or by_index[i] = {tensors = {key = entry},
                          scalars = {key = v}}}
  src.rng, src.rank_rng[r + 1] (the replicas' RNG states), src.world_size
An entry is {dtype, numel, pieces = {{file, f, idx, lo, hi}, ...}}: the piece
[lo, hi) of the flattened tensor is element 0.. of tensor idx of file f. The
pieces of every entry are checked to tile [0, numel) exactly.

A ref is a table with the metatable REF: {file, f, idx, name}.
]]
local ffi = require 'ffi'
local em = require 'ember'
local core = require 'ember.ffi'
local ckpt = require 'ember.checkpoint'
local target = require 'ember.checkpoint.target'
local C, S, raise, kind = core.C, core.S, core.raise, core.kind
local fmt = string.format

local M = {}
local REF = {}
M.REF = REF
local Source = {}
Source.__index = Source

local fbox = ffi.new('em_safetensors *[1]')
local dt_box, nd_box = ffi.new('em_dtype[1]'), ffi.new('int[1]')
local shape_box = ffi.new('int64_t[16]')
local outbox = ffi.new('em_tensor *[1]')

local function opened(self, op, path)
  if C.em_safetensors_open(S, path, fbox) ~= 0 then
    raise(fmt('%s: %s', op, core.errmsg()))
  end
  local f = fbox[0]
  self.handles[#self.handles + 1] = f
  return f
end

local function metadata(f, key)
  for i = 0, tonumber(C.em_safetensors_metadata_count(f)) - 1 do
    if ffi.string(C.em_safetensors_metadata_key(f, i)) == key then
      return ffi.string(C.em_safetensors_metadata_value(f, i))
    end
  end
end

-- Dtype name, shape and element count of tensor `name` of file f; nil when absent.
local function info(f, name)
  local idx = C.em_safetensors_find(f, name)
  if idx < 0 then return nil end
  if C.em_safetensors_info(S, f, idx, dt_box, nd_box, shape_box) ~= 0 then
    raise('checkpoint.load: ' .. core.errmsg())
  end
  local shape, n = {}, 1
  for d = 1, nd_box[0] do shape[d] = tonumber(shape_box[d - 1]); n = n * shape[d] end
  return idx, core.dtype_names[tonumber(dt_box[0])], shape, n
end

local function ref_of(op, self, file, f, name)
  local idx, dtype, shape, n = info(f, name)
  if not idx then raise(fmt("%s: '%s' lacks the tensor '%s'", op, file, name)) end
  return setmetatable({ file = file, f = f, idx = idx, name = name, dtype = dtype,
                        shape = shape, numel = n }, REF)
end

local function shape_str(shape) return '[' .. table.concat(shape, ',') .. ']' end

-- Checks that an entry's pieces tile [0, numel).
local function check_tiling(op, what, e)
  table.sort(e.pieces, function(a, b) return a.lo < b.lo end)
  local pos = 0
  for _, p in ipairs(e.pieces) do
    if p.lo ~= pos then
      raise(fmt("%s: %s: elements [%d, %d) are in no file (or in two)", op, what, pos,
        math.max(p.lo, pos)))
    end
    pos = p.hi
  end
  if pos ~= e.numel then
    raise(fmt('%s: %s: elements [%d, %d) are in no file', op, what, pos, e.numel))
  end
end

-- -- A sharded folder --------------------------------------------------------------------------

-- A whole file's bytes, or nil when it can't be opened (shard_save.lua too).
local function read_all(path)
  local f = io.open(path, 'rb')
  if not f then return nil end
  local s = f:read('*a')
  f:close()
  return s
end
M.read_all = read_all

-- Raises "op: 'where': msg" for a malformed document.
local function corrupt(op, where, msg)
  raise(fmt("%s: '%s': corrupt checkpoint: %s", op, where, msg))
end

local function decode(op, where, text, tensors)
  local ok, v = pcall(ckpt._decode, text, tensors)
  if not ok then
    if type(v) ~= 'table' then error(v, 0) end
    corrupt(op, where, v.msg)
  end
  if type(v) ~= 'table' then corrupt(op, where, 'not an object') end
  return v
end

local function open_sharded(self, op, dir)
  local ipath = dir .. '/index.json'
  local text = read_all(ipath)
  if not text then raise(fmt("%s: can't read '%s'", op, ipath)) end
  -- Field tensors live in replica 0's file; references become refs once it is open.
  local wanted = {}
  local lazy = setmetatable({}, { __index = function(_, name)
    local r = { field = name }
    wanted[#wanted + 1] = r
    return r
  end })
  local ix = decode(op, ipath, text, lazy)
  if ix.format ~= 'ember.sharded_checkpoint' or ix.version ~= 1 then
    corrupt(op, ipath, fmt('format %s version %s (this ember reads ember.sharded_checkpoint ' ..
      'version 1)', tostring(ix.format), tostring(ix.version)))
  end
  local N = ix.world_size
  if type(N) ~= 'number' or N < 1 or type(ix.files) ~= 'table' or #ix.files ~= N or
     type(ix.params) ~= 'table' or type(ix.run_id) ~= 'string' then
    corrupt(op, ipath, 'world_size, files, params or run_id is missing or inconsistent')
  end
  self.world_size, self.shard_mode, self.run_id = N, ix.shard_mode, ix.run_id
  local ok, rng = pcall(ckpt._rng_parse, ix.rng)
  if not ok then corrupt(op, ipath, type(rng) == 'table' and rng.msg or tostring(rng)) end
  self.rng, self.rank_rng = rng, {}
  -- Every file: present, whole (its header checked against its size), of this run.
  local files, metas = {}, {}
  for r = 1, N do
    local name = ix.files[r]
    if type(name) ~= 'string' or name:find('/') then corrupt(op, ipath, 'bad file name') end
    local path = dir .. '/' .. name
    local f = opened(self, op, path)
    local doc = metadata(f, 'ember.shard')
    if not doc then raise(fmt("%s: '%s' is not a shard of an ember checkpoint", op, path)) end
    local m = decode(op, path, doc, {})
    if m.run_id ~= ix.run_id then
      raise(fmt("%s: '%s' belongs to another checkpoint (run id %s; the index '%s' says %s)",
        op, path, tostring(m.run_id), ipath, ix.run_id))
    end
    if m.rank ~= r - 1 or m.world_size ~= N or type(m.params) ~= 'table' then
      corrupt(op, path, fmt('it says rank %s of %s, the index rank %d of %d', tostring(m.rank),
        tostring(m.world_size), r - 1, N))
    end
    local rok, rr = pcall(ckpt._rng_parse, m.rng)
    self.rank_rng[r] = rok and rr or nil
    files[r], metas[r] = { path = path, f = f }, m
  end
  -- Parameters: the index's ranges, checked against each file's own account.
  for i, p in ipairs(ix.params) do
    if type(p) ~= 'table' or type(p.name) ~= 'string' or type(p.shape) ~= 'table' or
       type(p.ranges) ~= 'table' then corrupt(op, ipath, 'parameter ' .. i .. ' is malformed') end
    local e = { name = p.name, shape = p.shape, dtype = p.dtype, numel = target.numel_of(p.shape),
                pieces = {}, index = i }
    for _, rg in ipairs(p.ranges) do
      local fr, lo, hi = files[(rg[1] or -1) + 1], rg[2], rg[3]
      if not fr then corrupt(op, ipath, 'a range of ' .. p.name .. ' names no file') end
      local own = metas[rg[1] + 1].params[i]
      if type(own) ~= 'table' or own.name ~= p.name or own.lo ~= lo or own.hi ~= hi then
        corrupt(op, fr.path, fmt('its range of %s differs from the index', p.name))
      end
      local tname = 'model.' .. p.name
      local idx, dtype, _, n = info(fr.f, tname)
      if not idx then raise(fmt("%s: '%s' lacks the tensor '%s'", op, fr.path, tname)) end
      if dtype ~= p.dtype or n ~= hi - lo then
        corrupt(op, fr.path, fmt("'%s' is %s of %d elements, the index says %s [%d, %d)", tname,
          dtype, n, p.dtype, lo, hi))
      end
      e.pieces[#e.pieces + 1] = { file = fr.path, f = fr.f, idx = idx, lo = lo, hi = hi }
    end
    check_tiling(op, fmt("'%s': parameter %s", dir, p.name), e)
    if self.params[p.name] then corrupt(op, ipath, p.name .. ' appears twice') end
    self.params[p.name] = e
    self.order[i] = p.name
  end
  -- Buffers: the file the index names (replica 0's, but for a pipeline's later
  -- stages); field tensors: replica 0's file.
  for _, b in ipairs(ix.buffers or {}) do
    local f = files[(tonumber(b.file) or 0) + 1] or files[1]   -- a pipeline's stage's file
    self.buffers[b.name] = ref_of(op, self, f.path, f.f, 'buffers.' .. b.name)
  end
  for _, r in ipairs(wanted) do
    local ref = ref_of(op, self, files[1].path, files[1].f, 'fields.' .. r.field)
    r.field = nil
    for k, v in pairs(ref) do r[k] = v end
    setmetatable(r, REF)
  end
  self.fields = type(ix.fields) == 'table' and ix.fields or {}
  -- Optimizer state: each file's shards of each parameter's state tensors.
  if ix.optimizer then
    local o = { kind = ix.optimizer.kind, param_groups = ix.optimizer.param_groups, by_name = {} }
    for r = 1, N do
      for _, rec in ipairs(metas[r].state or {}) do
        local e = self.params[rec.name]
        local own = metas[r].params[rec.index]
        if not e or type(own) ~= 'table' then
          corrupt(op, files[r].path, 'optimizer state of an unknown parameter')
        end
        local st = o.by_name[rec.name]
        if not st then
          st = { tensors = {}, scalars = {}, holders = {} }
          o.by_name[rec.name] = st
        end
        st.holders[r] = true
        for k, v in pairs(rec.scalars or {}) do
          if st.scalars[k] == nil then st.scalars[k] = v end
        end
        for key, t in pairs(rec.tensors or {}) do
          local te = st.tensors[key]
          if not te then
            te = { dtype = t.dtype, numel = e.numel, pieces = {} }
            st.tensors[key] = te
          end
          if own.hi > own.lo then
            local idx, dtype, _, n = info(files[r].f, t.tensor or '')
            if not idx or dtype ~= t.dtype or n ~= own.hi - own.lo then
              raise(fmt("%s: '%s' lacks the optimizer state '%s' of %s (%d elements of %s)", op,
                files[r].path, key, rec.name, own.hi - own.lo, tostring(t.dtype)))
            end
            te.pieces[#te.pieces + 1] = { file = files[r].path, f = files[r].f, idx = idx,
                                          lo = own.lo, hi = own.hi }
          end
        end
      end
    end
    for name, st in pairs(o.by_name) do
      for key, te in pairs(st.tensors) do
        check_tiling(op, fmt("'%s': optimizer state '%s' of %s", dir, key, name), te)
      end
    end
    self.optimizer = o
  end
end

-- -- A plain checkpoint file ---------------------------------------------------------------------

local function open_plain(self, op, path)
  local f = opened(self, op, path)
  local doc = metadata(f, ckpt.FORMAT)
  if not doc then
    raise(fmt("%s: '%s' is not an ember checkpoint (neither a folder with index.json nor a " ..
      'file with ember.checkpoint metadata)', op, path))
  end
  local refs = setmetatable({}, { __index = function(_, name)
    return ref_of(op, self, path, f, name)
  end })
  local v = decode(op, path, doc, refs)
  local ok, rng = pcall(ckpt._rng_parse, v.rng)
  if not ok then corrupt(op, path, type(rng) == 'table' and rng.msg or tostring(rng)) end
  self.rng, self.rank_rng, self.world_size = rng, {}, 1
  local fields = type(v.fields) == 'table' and v.fields or {}
  local sd = fields.model
  if type(sd) == 'table' then
    for name, ref in pairs(sd) do
      if getmetatable(ref) == REF then
        self.params[name] = { name = name, shape = ref.shape, dtype = ref.dtype,
          numel = ref.numel, pieces = { { file = path, f = f, idx = ref.idx, lo = 0,
          hi = ref.numel } } }
        self.buffers[name] = ref
      end
    end
  end
  local osd = fields.optimizer
  if type(osd) == 'table' and type(osd.param_groups) == 'table' then
    local o = { param_groups = osd.param_groups, by_index = {} }
    for i, st in pairs(osd.state or {}) do
      local rec = { tensors = {}, scalars = {} }
      for k, x in pairs(st) do
        if getmetatable(x) == REF then
          rec.tensors[k] = { dtype = x.dtype, numel = x.numel, pieces = { { file = path, f = f,
            idx = x.idx, lo = 0, hi = x.numel } } }
        else
          rec.scalars[k] = x
        end
      end
      o.by_index[tonumber(i) or i] = rec
    end
    self.optimizer = o
  end
  fields.model, fields.optimizer = nil, nil
  self.fields = fields
  self.plain = true
end

-- -- Reading -----------------------------------------------------------------------------------

local function read_piece(p, a, b)
  if C.em_safetensors_read_range(S, p.f, p.idx, a, b, outbox) ~= 0 then
    raise('checkpoint.load: ' .. core.errmsg())
  end
  return core.wrap(outbox[0])
end

function Source:range(e, a, b)
  if a == b then return em.empty(0, { dtype = e.dtype }) end
  local parts = {}
  for _, p in ipairs(e.pieces) do
    local lo, hi = math.max(a, p.lo), math.min(b, p.hi)
    if lo < hi then parts[#parts + 1] = read_piece(p, lo - p.lo, hi - p.lo) end
  end
  if #parts == 1 then return parts[1] end
  return em.cat(parts, 1)
end

function Source:whole(ref)
  return read_piece(ref, 0, ref.numel):view(ref.shape)
end

function Source:close()
  for _, f in ipairs(self.handles) do C.em_safetensors_close(f) end
  self.handles = {}
end

function M.open(op, path)
  local self = setmetatable({ handles = {}, params = {}, buffers = {}, order = {}, path = path },
    Source)
  local isdir = read_all(path .. '/index.json') ~= nil
  local ok, err = pcall(isdir and open_sharded or open_plain, self, op, path)
  if not ok then
    self:close()
    error(err, 0)
  end
  return self
end

M.shape_str = shape_str
return M

--[[
ember.checkpoint.shard_save -- em.checkpoint.save(dir, {model = dm, ...}) for a
sharded model: called by every replica, each writes its own share.

The folder. dir/index.json says what the checkpoint is: its run id, world size
and shard mode, each parameter's full shape and dtype and which file holds
which element range [lo, hi) of it, the buffers, the optimizer's kind and
hyper-parameters, the other fields of the table and replica 0's RNG state. Each
replica r writes dir/rank-<r>-of-<N>.<run id>.safetensors: its non-empty
parameter shards ("model.<name>", 1-D), the optimizer state of those shards
("optimizer.<name>.<key>", same length), and in its metadata ("ember.shard") the
run id, its rank, each parameter's [lo, hi), the optimizer state's scalars
(step, ...) and its own RNG state. Replica 0's file also holds the buffers
("buffers.<name>") and the tensors of the other fields ("fields.<path>").

Why an index that points at files, rather than a folder renamed into place.
index.json is the commit record: it is replaced atomically (a temporary file,
fsync, rename, fsync of the folder), and only after every replica has written
and fsynced its file (a barrier in between). The files of a save carry that
save's run id in their names, so a new save never overwrites a file the current
index names. A crash at any step therefore leaves index.json naming a complete
checkpoint: the previous one until the rename, the new one after it. The
previous files are removed only after the rename; a crash before that leaves
them behind, so the new index lists them ("stale") for the next save to
remove, and a save that never committed is recorded in dir/pending.json (its
run id and file names, written before any shard) so the next save removes its
files too. A folder rename would need two renames (old aside, new in), with a
moment at which dir does not exist.

Crash tests set M._hook = function(step, rank) ... end; it is called at the
steps 'begin' (the run id agreed, nothing written), 'written' (this replica's
file fsynced), 'commit' (replica 0, every file written, the index not yet),
'committed' (the index replaced, old files still there) and 'cleaned'.
]]
local ffi = require 'ffi'
local em = require 'ember'
local core = require 'ember.ffi'
local save = require 'ember.save'
local ckpt = require 'ember.checkpoint'
local target = require 'ember.checkpoint.target'
local C, S, raise, kind = core.C, core.S, core.raise, core.kind
local box_t, istype = core.box_t, ffi.istype
local fmt = string.format

local M = {}
M.FORMAT = 'ember.sharded_checkpoint'
M.VERSION = 1
local OP = 'checkpoint.save'

local function hook(step, rank)
  if M._hook then M._hook(step, rank) end
end

-- Every replica's outcome of a step (a collective in place of a barrier): when
-- one failed -- a full disk, say -- every replica removes its new file and
-- raises the first failed replica's error, naming it, so none waits for a
-- replica that has left the save; the previous checkpoint is untouched. (kept:
-- the failure came after the new index was in place, which then names the new
-- files: they stay.) The outcome travels as int32 codes: a status, then the
-- message's bytes.
local MSG = 400
local function settle(s, dir, file, ok, err, what, pending, kept)
  local mine = em.zeros(1, MSG + 1, { dtype = 'int32' })
  if not ok then
    local text = tostring(err):sub(1, MSG)
    local codes = { kept and 2 or 1 }
    for i = 1, #text do codes[i + 1] = text:byte(i) end
    mine:narrow(2, 1, #codes):copy_(em.tensor({ codes }, { dtype = 'int32' }))
  end
  local all = s:allgather(mine):totable()
  local failed, row
  for r = 1, s.world_size do
    if all[r][1] ~= 0 then failed, row = r - 1, all[r]; break end
  end
  if failed == nil then return end
  if row[1] ~= 2 then
    os.remove(dir .. '/' .. file)
    if pending then os.remove(pending) end
  end
  s:barrier()                   -- every replica's files are gone before anyone goes on
  if failed == s.rank then error(err, 0) end
  local chars = {}
  for i = 2, MSG + 1 do
    if row[i] == 0 then break end
    chars[#chars + 1] = string.char(row[i])
  end
  raise(fmt("%s: '%s': replica %d could not %s: %s", OP, dir, failed, what, table.concat(chars)))
end

function M.file_name(rank, world, id)
  return fmt('rank-%05d-of-%05d.%s.safetensors', rank, world, id)
end

-- 64 random bits as 16 hex digits (the run id), from the system's entropy.
local function random_id()
  local f = io.open('/dev/urandom', 'rb')
  local bytes = f and f:read(8)
  if f then f:close() end
  if not bytes or #bytes < 8 then
    bytes = tostring(os.time()) .. tostring(em.clock()) .. tostring({})
  end
  local out = {}
  for i = 1, 8 do out[i] = fmt('%02x', bytes:byte(i)) end
  return table.concat(out)
end

-- The run id of replica 0 on every replica (as four 16-bit numbers).
local function agree_id(s, id)
  local t = em.zeros(4, { dtype = 'float64' })
  if s.rank == 0 then
    for i = 1, 4 do t[i] = tonumber(id:sub(4 * i - 3, 4 * i), 16) end
  end
  if s.device and s.device ~= 'cpu' then t = t:to(s.device) end
  t = s:broadcast(t, 0):cpu()
  local parts = {}
  for i = 1, 4 do parts[i] = fmt('%04x', t[i]) end
  return table.concat(parts)
end

-- Every replica's [lo, hi) of every parameter: ranges[r + 1][i] = {lo, hi}.
local function all_ranges(s, tg)
  local n = #tg.params
  local mine = em.zeros(1, 2 * math.max(n, 1), { dtype = 'float64' })
  for i, p in ipairs(tg.params) do
    if p.write ~= false then
      mine[1][2 * i - 1] = p.lo
      mine[1][2 * i] = p.hi
    end
  end
  if s.device and s.device ~= 'cpu' then mine = mine:to(s.device) end
  local rows = s:allgather(mine):cpu():totable()
  local out = {}
  for r, row in ipairs(rows) do
    out[r] = {}
    for i = 1, n do out[r][i] = { row[2 * i - 1], row[2 * i] } end
  end
  return out
end

local read_text = require('ember.checkpoint.source').read_all

local function exists(path)
  local f = io.open(path, 'rb')
  if f then f:close() end
  return f ~= nil
end

-- The file names listed by an existing index.json or pending.json (best effort:
-- what can't be read is left alone).
local function listed(path, keys)
  local text = read_text(path)
  if not text then return {} end
  local any = setmetatable({}, { __index = function() return true end })
  local ok, v = pcall(ckpt._decode, text, any)
  if not ok or type(v) ~= 'table' then return {} end
  local out = {}
  for _, k in ipairs(keys) do
    if type(v[k]) == 'table' then
      for _, name in ipairs(v[k]) do
        if type(name) == 'string' and not name:find('/') then out[#out + 1] = name end
      end
    end
  end
  return out, v
end

local function write_file(path, text, sync)
  if C.em_file_write(S, path, text, #text, sync and C.EM_SAVE_SYNC or 0) ~= 0 then
    raise(OP .. ': ' .. core.errmsg())
  end
end

-- This replica's file: tensors and the metadata document.
local function shard_contents(tg, id, rng)
  local flat, params, state = {}, {}, {}
  local opt = tg.optimizer
  local pos = {}                -- tg index -> the optimizer's position
  for k, i in ipairs(tg.opt_index or {}) do pos[i] = k end
  for i, p in ipairs(tg.params) do
    local writes = p.write ~= false
    local n = writes and p.hi - p.lo or 0
    params[i] = { name = p.name, lo = writes and p.lo or 0, hi = writes and p.hi or 0 }
    if n > 0 then flat['model.' .. p.name] = p.t:detach():reshape(n) end
    local st = opt and writes and opt.state[tg.opt_index and pos[i] or i]
    if st then
      local rec = { index = i, name = p.name, tensors = {}, scalars = {} }
      for key, v in pairs(st) do
        if type(key) ~= 'string' then
          raise(fmt('%s: optimizer state of %s has a key of type %s', OP, p.name, kind(key)))
        end
        if istype(box_t, v) then
          if v:numel() ~= n then
            raise(fmt("%s: optimizer state '%s' of %s has %d elements, its shard %d: only " ..
              'state shaped like the parameter can be resharded', OP, key, p.name, v:numel(), n))
          end
          local tname = 'optimizer.' .. p.name .. '.' .. key
          rec.tensors[key] = { dtype = v.dtype, tensor = n > 0 and tname or nil }
          if n > 0 then flat[tname] = v:detach():reshape(n) end
        else
          rec.scalars[key] = v
        end
      end
      state[#state + 1] = rec
    end
  end
  return flat, { run_id = id, rank = tg.rank, world_size = tg.world_size, rng = rng,
                 params = params, state = state }
end

function M.save(dir, state, opts)
  local sync = not (opts and opts.sync == false)
  local tg = target.of(OP, state.model, state.optimizer)
  local s = tg.strategy
  local rank, world = tg.rank, tg.world_size
  if not s or s.world_size ~= world or s.rank ~= rank then
    raise(OP .. ': the sharded model has no strategy matching its layout (dm.strategy)')
  end
  local opt = tg.optimizer
  local id = random_id()
  local index_path, pending_path = dir .. '/index.json', dir .. '/pending.json'
  local old_files, old_index = {}, nil
  if rank == 0 then
    if C.em_dir_make(S, dir) ~= 0 then raise(OP .. ': ' .. core.errmsg()) end
    local stale
    old_files, old_index = listed(index_path, { 'files', 'stale' })
    -- The new index lists the old files, and those of the old stale list that are
    -- still there, until they are removed (so the list does not grow).
    stale = {}
    local n_old = old_index and type(old_index.files) == 'table' and #old_index.files or 0
    for i, name in ipairs(old_files) do
      if i <= n_old or exists(dir .. '/' .. name) then stale[#stale + 1] = name end
    end
    old_files = stale
    -- What a save that never committed left: removed now (its id is not the index's).
    local pend, pv = listed(pending_path, { 'files' })
    if pv and not (old_index and old_index.run_id == pv.run_id) then
      for _, name in ipairs(pend) do os.remove(dir .. '/' .. name) end
    end
    local names = {}
    for r = 0, world - 1 do names[r + 1] = M.file_name(r, world, id) end
    write_file(pending_path, (ckpt._encode({ run_id = id, files = names })), false)
  end
  id = agree_id(s, id)                       -- also: dir exists before anyone writes
  local ranges = all_ranges(s, tg)
  hook('begin', rank)

  local rng = ckpt._rng_get()
  local flat, meta = shard_contents(tg, id, rng)
  local fields_doc
  if rank == 0 then
    local rest = {}
    for k, v in pairs(state) do
      if k ~= 'model' and k ~= 'optimizer' then rest[k] = v end
    end
    local doc, tensors = ckpt._encode(rest)
    fields_doc = doc
    for name, t in pairs(tensors) do flat['fields.' .. name] = t end
  end
  -- buffers: in the file of the replica that holds them (replica 0, but for a
  -- pipeline's later stages)
  for _, b in ipairs(tg.buffers) do
    if b.write and (b.rank or 0) == rank then flat['buffers.' .. b.name] = b.t end
  end
  local mdoc = ckpt._encode(meta)
  local file = M.file_name(rank, world, id)
  -- Written in place: no reader looks at it before the index names it, and a
  -- crash then leaves only names that pending.json lists.
  local wrote, werr = pcall(save.write, OP, dir .. '/' .. file, flat,
    { format = 'ember.shard', ['ember.shard'] = mdoc }, sync, true)
  if wrote then hook('written', rank) end
  settle(s, dir, file, wrote, werr, 'write its share', rank == 0 and pending_path)

  local replaced = false
  local committed, cerr = pcall(function()
    if rank == 0 then
      hook('commit', rank)
      -- The shards' folder entries reach the disk before the index that names them.
      if sync and C.em_dir_sync(S, dir) ~= 0 then raise(OP .. ': ' .. core.errmsg()) end
      local files, params, buffers = {}, {}, {}
      for r = 0, world - 1 do files[r + 1] = M.file_name(r, world, id) end
      for i, p in ipairs(tg.params) do
        local pieces = {}
        for r = 1, world do
          local lo, hi = ranges[r][i][1], ranges[r][i][2]
          if hi > lo then pieces[#pieces + 1] = { r - 1, lo, hi } end
        end
        params[i] = { name = p.name, shape = p.shape, dtype = p.dtype, numel = p.numel,
                      ranges = pieces }
      end
      for i, b in ipairs(tg.buffers) do
        buffers[i] = { name = b.name, shape = b.shape, dtype = b.dtype, file = b.rank or 0 }
      end
      local optimizer
      if opt then
        local groups = opt:state_dict().param_groups
        if tg.opt_index then
          -- a pipeline stage's optimizer holds its stage's parameters: the
          -- checkpoint's one group is the whole model's
          if #groups ~= 1 then
            raise(fmt('%s: a pipeline\'s optimizer must have one parameter group, it has %d',
              OP, #groups))
          end
          local all = {}
          for i = 1, #tg.params do all[i] = i end
          groups[1].params = all
        end
        optimizer = { kind = opt.class and opt.class.name or tostring(opt),
                      param_groups = groups }
      end
      local head = ckpt._encode({
        format = M.FORMAT, version = M.VERSION, run_id = id, world_size = world,
        shard_mode = tg.mode, files = files, params = params, buffers = buffers,
        optimizer = optimizer, rng = rng, stale = old_files })
      write_file(index_path, head:sub(1, -2) .. ',"fields":' .. fields_doc .. '}', sync)
      replaced = true
      hook('committed', rank)
      for _, name in ipairs(old_files) do os.remove(dir .. '/' .. name) end
      os.remove(pending_path)
      if sync and C.em_dir_sync(S, dir) ~= 0 then raise(OP .. ': ' .. core.errmsg()) end
      hook('cleaned', rank)
    end
  end)
  -- every replica returns with the checkpoint in place, or with an error
  settle(s, dir, file, committed, cerr, 'commit the index', rank == 0 and pending_path,
    replaced)
end

return M

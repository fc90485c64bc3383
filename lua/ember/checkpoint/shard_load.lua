--[[
ember.checkpoint.shard_load -- em.checkpoint.load(path, {model = X, optimizer = opt})
where path is a sharded checkpoint's folder or X a sharded model: restores at any
world size and shard mode, into a sharded or a plain model, from a sharded
folder or a plain checkpoint file.

Each process reads only what it holds: for each parameter, the element range
[lo, hi) of its shard (the whole parameter for a plain model), gathered from
whichever files hold pieces of it, reading just those bytes; the same ranges of
each optimizer state tensor; the buffers and other fields whole. No collective
is made: replicas load independently, and a sharded model re-gathers its full
parameters from the shards itself.

All or nothing. Everything is checked and read into fresh tensors first --
names, shapes, dtypes, the optimizer's kind and groups, every file's header and
run id -- and only then is anything written (shard:copy_, the optimizer's
load_state_dict, buffers, other objects, the RNG state). An error names the
file and the parameter and leaves the model and optimizer as they were.

The optimizer. opt.state[i] belongs to the i-th parameter (the model's order);
state from a sharded folder is matched by parameter name, from a plain file by
position. A plain file does not record the optimizer's kind; a folder does, and
a different kind is refused.
]]
local em = require 'ember'
local core = require 'ember.ffi'
local ckpt = require 'ember.checkpoint'
local target = require 'ember.checkpoint.target'
local source = require 'ember.checkpoint.source'
local raise = core.raise
local fmt = string.format
local REF, shape_str = source.REF, source.shape_str

local M = {}
local OP = 'checkpoint.load'

local function same_shape(a, b)
  if #a ~= #b then return false end
  for i = 1, #a do if a[i] ~= b[i] then return false end end
  return true
end

-- Fields with refs replaced by tensors read whole.
local function resolve(src, v, seen)
  if getmetatable(v) == REF then return src:whole(v) end
  if type(v) ~= 'table' or seen[v] then return v end
  seen[v] = true
  for k, x in pairs(v) do v[k] = resolve(src, x, seen) end
  return v
end

-- Checks the optimizer against the source; returns the state to load (by
-- position), read.
local function optimizer_state(src, tg)
  local opt = tg.optimizer
  local so = src.optimizer
  if not so then raise(fmt("%s: '%s' holds no optimizer state", OP, src.path)) end
  local name = opt.class and opt.class.name
  if so.kind and so.kind ~= name then
    raise(fmt("%s: '%s' holds the state of a %s optimizer, not of a %s", OP, src.path,
      tostring(so.kind), tostring(name)))
  end
  local groups = so.param_groups
  if type(groups) ~= 'table' or #groups ~= #opt.param_groups then
    raise(fmt("%s: '%s' has %s parameter groups, the optimizer %d", OP, src.path,
      type(groups) == 'table' and tostring(#groups) or 'no', #opt.param_groups))
  end
  for gi, g in ipairs(opt.param_groups) do
    local n = type(groups[gi]) == 'table' and type(groups[gi].params) == 'table' and
      #groups[gi].params
    -- a pipeline stage's optimizer holds a part of the model's parameters
    local want = tg.opt_index and #tg.params or #g.params
    if n ~= want then
      raise(fmt("%s: '%s': group %d has %s parameters, the optimizer's %d", OP, src.path, gi,
        tostring(n), want))
    end
  end
  if so.by_index then
    for i in pairs(so.by_index) do
      if not tg.params[i] then
        raise(fmt("%s: '%s' has optimizer state for parameter %s, which the model lacks", OP,
          src.path, tostring(i)))
      end
    end
  end
  local state = {}
  local index = tg.opt_index
  local pos = {}                -- tg index -> the optimizer's position
  for k, i in ipairs(index or {}) do pos[i] = k end
  for i, p in ipairs(tg.params) do
    local st = (not index or pos[i]) and (so.by_name and so.by_name[p.name] or so.by_index and so.by_index[i])
    if st then
      local ns = {}
      for k, v in pairs(st.scalars) do ns[k] = v end
      for key, e in pairs(st.tensors) do
        if e.numel ~= p.numel or e.dtype ~= p.dtype then
          raise(fmt("%s: '%s': optimizer state '%s' of %s is %s of %d elements, the parameter " ..
            '%s of %d', OP, src.path, key, p.name, tostring(e.dtype), e.numel, p.dtype, p.numel))
        end
        ns[key] = src:range(e, p.lo, p.hi)
      end
      state[index and pos[i] or i] = ns
    end
  end
  local sd_groups = {}
  for gi, g in ipairs(groups) do
    local ng = {}
    for k, v in pairs(g) do ng[k] = v end
    if tg.opt_index then          -- the stage's own parameters, by position
      local own = {}
      for k = 1, #opt.param_groups[gi].params do own[k] = k end
      ng.params = own
    end
    sd_groups[gi] = ng
  end
  return { state = state, param_groups = sd_groups }
end

local function load(src, tg, objects)
  -- Parameters and buffers: every name, shape and dtype first.
  local own = {}
  for _, p in ipairs(tg.params) do
    own[p.name] = true
    local e = src.params[p.name]
    if not e then
      raise(fmt("%s: '%s' has no parameter %s (the model's)", OP, src.path, p.name))
    end
    if not same_shape(e.shape, p.shape) or e.dtype ~= p.dtype then
      raise(fmt("%s: '%s': parameter %s is %s %s in the checkpoint, %s %s in the model", OP,
        src.path, p.name, tostring(e.dtype), shape_str(e.shape), p.dtype, shape_str(p.shape)))
    end
  end
  for _, b in ipairs(tg.buffers) do
    own[b.name] = true
    local ref = src.buffers[b.name]
    if not ref then raise(fmt("%s: '%s' has no buffer %s (the model's)", OP, src.path, b.name)) end
    local shape, dtype = b.shape or b.t.shape, b.dtype or b.t.dtype
    if not same_shape(ref.shape, shape) or ref.dtype ~= dtype then
      raise(fmt("%s: '%s': buffer %s is %s %s in the checkpoint, %s %s in the model", OP,
        src.path, b.name, ref.dtype, shape_str(ref.shape), dtype, shape_str(shape)))
    end
  end
  local extra = {}
  for name in pairs(src.params) do if not own[name] then extra[#extra + 1] = name end end
  for name in pairs(src.buffers) do
    if not own[name] and not src.params[name] then extra[#extra + 1] = name end
  end
  table.sort(extra)
  if #extra > 0 then
    raise(fmt("%s: '%s' has %s that the model lacks: %s", OP, src.path,
      #extra > 1 and 'tensors' or 'a tensor', table.concat(extra, ', ')))
  end
  for k, obj in pairs(objects) do
    if k ~= 'model' and k ~= 'optimizer' then
      local ok, f = pcall(function() return obj.load_state_dict end)
      if not (ok and type(f) == 'function') then
        raise(fmt('%s: objects.%s has no :load_state_dict() method', OP, tostring(k)))
      end
      if src.fields[k] == nil then
        raise(fmt("%s: '%s' has no '%s' entry to restore objects.%s from", OP, src.path,
          tostring(k), tostring(k)))
      end
    end
  end

  -- Everything read into fresh tensors.
  local values = {}
  for i, p in ipairs(tg.params) do values[i] = src:range(src.params[p.name], p.lo, p.hi) end
  local bufs = {}
  for i, b in ipairs(tg.buffers) do bufs[i] = b.t and src:whole(src.buffers[b.name]) end
  local osd = tg.optimizer and optimizer_state(src, tg)
  local fields = resolve(src, src.fields, {})
  local rng = src.world_size == tg.world_size and src.rank_rng[tg.rank + 1] or src.rng

  -- Then written.
  if osd then tg.optimizer:load_state_dict(osd) end
  em.no_grad(function()
    for i, p in ipairs(tg.params) do
      p.t:copy_(values[i]:reshape(p.t.shape))
    end
    for i, b in ipairs(tg.buffers) do if b.t then b.t:copy_(bufs[i]) end end
  end)
  -- a sharded model gathers its full weights from the shards before it next runs
  local model = objects.model
  if type(model) == 'table' and model.shard_mode and model.invalidate then model:invalidate() end
  for k, obj in pairs(objects) do
    if k ~= 'model' and k ~= 'optimizer' then
      obj:load_state_dict(fields[k])
      fields[k] = nil
    end
  end
  ckpt._rng_set(rng)
  return fields
end

function M.load(path, objects)
  if objects.model == nil then
    raise(OP .. ': a sharded checkpoint loads into a model: pass {model = m}')
  end
  local tg = target.of(OP, objects.model, objects.optimizer)
  local src = source.open(OP, path)
  local ok, res = pcall(load, src, tg, objects)
  src:close()
  if not ok then error(res, 0) end
  return res
end

return M

--[[
ember.checkpoint.target -- what a sharded checkpoint is saved from and loaded
into, in one shape whether the model is sharded or plain.

  local tg = target.of(op, model, optimizer)

tg.params: one entry per parameter in the optimizer's order, {name, shape,
dtype, numel, lo, hi, t}: the element range [lo, hi) of the flattened parameter
this process holds, and t the tensor holding it (a sharded model's 1-D shard,
or a plain model's whole parameter: lo = 0, hi = numel). tg.buffers: {name, t}
(replicated). tg.optimizer: the optimizer, checked to be built on exactly the
tensors t, in this order (opt.state[i] belongs to tg.params[i]). tg.mode,
tg.world_size, tg.rank, tg.strategy: the sharding (nil, 1, 0, nil for a plain
model).

A pipeline (mode 'pipeline') lists the whole model, the other stages' parameters
as empty ranges; its optimizer holds only this stage's: tg.opt_index[k] is the
entry of the optimizer's k-th parameter. Entries with write = false are held
and loaded but left to another replica to save (a stage's data replicas), and
each buffer names the replica (rank) whose file holds it; t is nil for a buffer
held elsewhere.

A sharded model is known by its interface only (dm.shard_mode,
dm:shard_layout(), dm.strategy): how it groups parameters into units is its
own affair; each parameter's [lo, hi) is all that matters here.
]]
local ffi = require 'ffi'
local core = require 'ember.ffi'
local raise, kind, box_t = core.raise, core.kind, core.box_t

local M = {}

local function numel_of(shape)
  local n = 1
  for _, d in ipairs(shape) do n = n * d end
  return n
end
M.numel_of = numel_of

local function copy_list(t)
  local c = {}
  for i, v in ipairs(t) do c[i] = v end
  return c
end

local function from_sharded(op, dm)
  local lay = dm:shard_layout()
  local tg = { mode = lay.mode, world_size = lay.world_size, rank = lay.rank,
               strategy = dm.strategy, params = {}, buffers = {} }
  for i, p in ipairs(lay.params) do
    if p.hi - p.lo ~= p.shard:numel() then
      raise(('%s: the shard of %s holds %d elements, its range [%d, %d) %d'):format(op, p.name,
        p.shard:numel(), p.lo, p.hi, p.hi - p.lo))
    end
    tg.params[i] = { name = p.name, shape = copy_list(p.shape), dtype = p.dtype, numel = p.numel,
                     lo = p.lo, hi = p.hi, t = p.shard, write = p.write ~= false }
  end
  for i, b in ipairs(lay.buffers or {}) do
    tg.buffers[i] = { name = b.name, t = b.tensor, shape = b.shape or b.tensor.shape,
                      dtype = b.dtype or b.tensor.dtype, rank = b.rank or 0,
                      write = b.write ~= false and b.tensor ~= nil }
  end
  tg.opt_index = lay.optimizer_index
  return tg
end

local function from_module(op, m)
  local tg = { world_size = 1, rank = 0, params = {}, buffers = {} }
  for i, np in ipairs(m:named_parameters()) do
    local t = np[2]
    local shape = copy_list(t.shape)
    local n = numel_of(shape)
    tg.params[i] = { name = np[1], shape = shape, dtype = t.dtype, numel = n, lo = 0, hi = n,
                     t = t }
  end
  for i, nb in ipairs(m:named_buffers()) do tg.buffers[i] = { name = nb[1], t = nb[2] } end
  return tg
end

-- The optimizer's parameters, checked against the target's tensors.
local function check_optimizer(op, tg, opt)
  local ok, groups = pcall(function() return opt.param_groups end)
  if not ok or type(groups) ~= 'table' or type(opt.state) ~= 'table' then
    raise(('%s: optimizer is a %s, expected an em.optim optimizer'):format(op, kind(opt)))
  end
  local i = 0
  local index = tg.opt_index
  for _, g in ipairs(groups) do
    for _, p in ipairs(g.params) do
      i = i + 1
      local want = tg.params[index and index[i] or i]
      if not want or not ffi.istype(box_t, p) or p._h ~= want.t._h then
        raise(('%s: the optimizer is not built on the model\'s parameters (its parameter %d ' ..
          'is not %s); build it on %s'):format(op, i, want and want.name or '(none)',
          tg.mode and 'dm:parameters()' or 'model:parameters()'))
      end
    end
  end
  if i ~= (index and #index or #tg.params) then
    raise(('%s: the optimizer has %d parameters, the model %d'):format(op, i, #tg.params))
  end
end

function M.of(op, model, opt)
  if type(model) ~= 'table' then
    raise(('%s: model is a %s, expected a sharded model or an em.nn.Module'):format(op,
      kind(model)))
  end
  local tg
  if model.shard_mode ~= nil then tg = from_sharded(op, model)
  elseif type(model.named_parameters) == 'function' then tg = from_module(op, model)
  else
    raise(('%s: model has neither :shard_layout() nor :named_parameters()'):format(op))
  end
  if opt ~= nil then
    check_optimizer(op, tg, opt)
    tg.optimizer = opt
  end
  return tg
end

return M

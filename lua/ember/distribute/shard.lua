--[[
ember.distribute.shard -- s:wrap(model, {shard = 'optimizer' | 'gradients' |
'parameters', offload = false, comm_dtype = nil | 'bfloat16', bucket_mb = 25}):
data parallel that stops keeping a full copy of everything on every replica
(ZeRO, Rajbhandari et al. 2020; PyTorch's FSDP).

What each mode keeps on a replica of N (float32, Adam; bytes per parameter):
  plain        weights 4, gradients 4, moments 8            16
  optimizer    weights 4, gradients 4, moments 8/N           8 + 8/N
  gradients    weights 4, gradients 4/N, moments 8/N         4 + 12/N
  parameters   all of it 1/N, plus one module's weights      16/N
               while that module runs forward or backward

The layout (shard/layout.lua). Parameters travel in units: size buckets for
'optimizer' and 'gradients', one unit per module that owns parameters for
'parameters'. A unit's parameters, flattened end to end and padded, split into
N equal segments; replica r's share of each parameter (its shard) is what falls
in segment r. dm:parameters() returns the shards -- 1-D leaf tensors -- so an
optimizer, clip_grad_norm (which sums the norm across replicas for shards) and
the schedules work on them unchanged.

Gradients. A hook on every parameter takes its gradient once it is final for
this backward, copies it into its place in the unit's flat buffer (zeros where
none arrives) and drops it from the parameter, so a unit holds one buffer, not
its gradients and a copy. When a unit has all of them its collective starts on
the communicator's thread while backward goes on: allreduce ('optimizer', and
the unsharded comm_dtype path) or reduce-scatter ('gradients', 'parameters'),
the mean in either case. Units start strictly in unit order, so every replica
issues the same collectives in the same order whatever its timing, and at most
two are under way (a backward holds a bounded number of flat buffers); at the
end of backward the units still missing gradients (parameters that got none)
go with zeros, which is how ranks that touched different parameters never hang.
When a third unit starts, the oldest is waited for: its shards get their slice
of the average as .grad -- a view, or an addition to the .grad already there
(accumulation) -- and its buffer is released at once (core.handles.release),
not at Lua's next collection. (Never earlier because its collective happened to
be done: the step's peak memory is the same whatever the threads' timing.)
comm_dtype = 'bfloat16' sends the flat buffer in bfloat16 (half the bytes; the
backends sum bfloat16 in float32) and casts the result back.

Weights. 'optimizer' and 'gradients' keep full weights; their shards are views
of them, so the optimizer updates this replica's share in place, and the next
forward (or state_dict) allgathers every unit's segments into the full
weights. 'parameters' keeps only the shards (a segment tensor per unit); each
module's weights are resident tensors (core/resident.c) whose data is gathered
just before its forward and freed just after, gathered again when the gradient
reaches the module's output (a custom autograd node), and freed once their
gradients are reduced. Autograd's saved views see the data come and go.

offload = true (GPU replicas) keeps the shards, their gradients and so the
optimizer's state and update in host memory; a segment is copied to the device
for each gather and each reduced gradient slice back to the host.

Files: this one builds the model and answers its methods; shard/layout.lua is
the arithmetic of units and segments, shard/gather.lua gathers the weights,
shard/grads.lua reduces the gradients, shard/hooks.lua keeps the live models and
their hooks on backward, and shard/state.lua is the model's state_dict and
load_state_dict.
]]
local em = require 'ember'
local core = require 'ember.ffi'
local layout = require 'ember.distribute.shard.layout'
local gather = require 'ember.distribute.shard.gather'
local grads = require 'ember.distribute.shard.grads'
local hooks = require 'ember.distribute.shard.hooks'
local state = require 'ember.distribute.shard.state'
local wrap = require 'ember.distribute.wrap'
local memory_kinds = require 'ember.memory_kinds'
local C = core.C
local raise = core.raise

local M = {}
local Sharded = {}
M.Sharded = Sharded

-- -- Helpers ---------------------------------------------------------------------------------
local slice, nbytes = gather.slice, gather.nbytes

-- The model a shard tensor belongs to, or nil (clip_grad_norm asks).
M.owner_of = hooks.owner_of

-- -- Options -----------------------------------------------------------------------------------
local MODES = { optimizer = true, gradients = true, parameters = true }

function M.check(o)
  local mode = o.shard
  if mode ~= nil and not MODES[mode] then
    raise(("wrap: shard must be 'optimizer', 'gradients' or 'parameters', got %s")
      :format(type(mode) == 'string' and "'" .. mode .. "'" or core.kind(mode)))
  end
  if o.comm_dtype ~= nil and o.comm_dtype ~= 'bfloat16' and o.comm_dtype ~= 'float16' and
     o.comm_dtype ~= 'float32' then
    raise(("wrap: comm_dtype must be 'bfloat16', 'float16' or 'float32', got %s")
      :format(tostring(o.comm_dtype)))
  end
  if o.offload ~= nil and type(o.offload) ~= 'boolean' then
    raise('wrap: offload must be true or false, got ' .. core.kind(o.offload))
  end
  if o.offload and not mode then
    raise("wrap: offload = true keeps a sharded optimizer's state in host memory; it needs " ..
      "shard = 'optimizer', 'gradients' or 'parameters'")
  end
end

-- -- Building ----------------------------------------------------------------------------------
local OWN = { recurse = false }   -- (a module's own parameters, not its children's)

-- The modules that own trainable parameters directly, each with those parameters'
-- global indices, in registration order. (Module.modules is that order; a recursive
-- closure here would let a LuaJIT trace keep index_of -- the original weights --
-- alive as a constant: see nn/module.lua's traversal.)
local function owners(model, index_of)
  local list, taken = {}, {}
  for _, m in ipairs(em.nn.Module.modules(model)) do
    local idx = {}
    for _, p in ipairs(em.nn.Module.parameters(m, OWN)) do
      local i = index_of[p]
      -- (a weight two modules share belongs to the first)
      if i and not taken[i] then idx[#idx + 1] = i; taken[i] = true end
    end
    if #idx > 0 then list[#list + 1] = { module = m, idx = idx } end
  end
  return list
end

local function make_unit(dm, idx)
  local P, world, rank = dm._P, dm.strategy.world_size, dm.strategy.rank
  local numels = {}
  for k, i in ipairs(idx) do numels[k] = P[i]:numel() end
  local u = layout.unit(numels, dm.shard_mode and world or 1, dm.shard_mode and rank or 0)
  u.idx, u.dtype, u.device = idx, P[idx[1]].dtype, P[idx[1]].device
  u.g, u.got, u.ready = {}, 0, false
  return u
end

-- This replica's shards: views of the weights, or of a segment tensor of the unit
-- (kept on the host with offload, the only copy with 'parameters').
local function make_shards(dm, u)
  local P, shard = dm._P, dm._shards
  local own_segment = dm.shard_mode == 'parameters' or dm._offload
  if own_segment then
    u.segt = em.zeros(u.seg, { dtype = u.dtype, device = dm._offload and 'cpu' or u.device })
  end
  em.no_grad(function()
    for k, i in ipairs(u.idx) do
      local len = u.hi[k] - u.lo[k]
      local flat = P[i]:detach():reshape(-1)
      local sh
      if not dm.shard_mode then
        sh = P[i]
      elseif own_segment then
        local dst = slice(u.segt, u.at[k], len)
        dst:copy_(slice(flat, u.lo[k], len))
        sh = dst:detach():requires_grad_()
      else
        sh = slice(flat, u.lo[k], len):detach():requires_grad_()
      end
      shard[i] = sh
      if dm.shard_mode then hooks.set_owner(sh, dm._id) end
    end
  end)
end

function M.wrap(s, model, o)
  local mode = o.shard
  if s.device ~= 'cpu' then model:to(s.device) end
  local named, P, index_of = {}, {}, {}
  for _, np in ipairs(model:named_parameters()) do
    if np[2].requires_grad then
      named[#named + 1] = np[1]
      P[#P + 1] = np[2]
      index_of[np[2]] = #P
    end
  end
  if #P == 0 then raise('wrap: the model has no parameter that requires grad') end
  for i, p in ipairs(P) do
    if not p:is_contiguous() then
      raise(('wrap: parameter %s is not contiguous; sharding needs contiguous parameters')
        :format(named[i]))
    end
  end
  local buffers = model:buffers()
  -- the same starting point everywhere
  if s.world_size > 1 then
    em.no_grad(function()
      for _, p in ipairs(P) do s:broadcast(p, 0) end
      for _, b in ipairs(buffers) do s:broadcast(b, 0) end
    end)
  end
  local dm = setmetatable({
    module = model, strategy = s, shard_mode = mode, _id = hooks.new_id(),
    _offload = o.offload and s.device ~= 'cpu' or false,
    _comm_dtype = o.comm_dtype, _names = named, _P = P, _shards = {}, _units = {},
    _unit_of = {}, _pos = {}, _buffers = buffers,
    _broadcast_buffers = o.broadcast_buffers ~= false and #buffers > 0 and s.world_size > 1,
    _sync = true, _armed = false, _stale = false, _stats = { steps = 0, comm_s = 0,
      wait_s = 0, bytes = 0, allreduce = 0, reduce_scatter = 0, allgather = 0 },
    _mem = { activations = 0 },
  }, Sharded)
  hooks.register(dm)

  -- units
  local groups = {}
  if mode == 'parameters' then
    local own = owners(model, index_of)
    for k = #own, 1, -1 do groups[#groups + 1] = own[k] end    -- backward order
  else
    local sizes, keys = {}, {}
    for i, p in ipairs(P) do sizes[i] = nbytes(p); keys[i] = p.dtype .. '@' .. p.device end
    for _, idx in ipairs(layout.shard_buckets(sizes, keys, o.bucket_mb)) do
      groups[#groups + 1] = { idx = idx }
    end
  end
  for k, g in ipairs(groups) do
    local u = make_unit(dm, g.idx)
    u.k, u.module = k, g.module
    dm._units[k] = u
    for pos, i in ipairs(g.idx) do dm._unit_of[i], dm._pos[i] = k, pos end
    make_shards(dm, u)
  end

  -- 'parameters': the weights become resident tensors, freed until their forward.
  -- A unit's are freed as soon as they exist, so that setting up holds the
  -- weights, their shards and one unit at most; the weights the model held
  -- before are garbage then, and go in one collection at the end.
  if mode == 'parameters' then
    for k, g in ipairs(groups) do
      for _, kp in ipairs(g.module:named_parameters { recurse = false }) do
        local key, i = kp[1], index_of[kp[2]]
        if i then
          local fresh = P[i]:detach():clone():requires_grad_()
          g.module[key] = fresh
          P[i] = fresh
        end
      end
      gather.free(dm, dm._units[k])
    end
    for _, u in ipairs(dm._units) do gather.hook_forward(dm, u) end
    for t in pairs(index_of) do index_of[t] = nil end    -- (its keys: the old weights)
    collectgarbage()
  end

  -- hooks, removed when the model is collected
  hooks.install(dm)
  memory_kinds.register_model(dm)
  return dm
end

-- -- The wrapped model -------------------------------------------------------------------------
Sharded.__index = wrap.model_index(Sharded)

function Sharded.__call(self, ...)
  if self.strategy._box._h == nil then raise('wrapped model: its strategy was closed') end
  if self._broadcast_buffers then
    em.no_grad(function()
      for _, b in ipairs(self._buffers) do self.strategy:broadcast(b, 0) end
    end)
  end
  if self._stale then gather.gather_all(self) end
  if self._sync and em.is_grad_enabled() then
    self._armed = true
    grads.reset(self)
    local dev = self.strategy.device
    em.reset_peak_memory_stats(dev)
    self._mem.start = em.memory_stats(dev).allocated
  end
  return self.module(...)
end

-- The next backward averages (reduces) gradients, as after a forward through
-- dm (see DistributedModel:arm).
function Sharded:arm()
  self._armed = true
  grads.reset(self)
  self._mem.start = em.memory_stats(self.strategy.device).allocated
end

function Sharded.__tostring(self)
  return ("sharded ('%s') for %d replicas (%d units):\n%s"):format(
    self.shard_mode or 'none', self.strategy.world_size, #self._units, tostring(self.module))
end

-- What this replica's optimizer updates: its shards (every parameter's, in the
-- model's order, empty ones included).
function Sharded:parameters()
  local list = {}
  for i = 1, #self._P do list[i] = self._shards[i] end
  return list
end

function Sharded:named_parameters()
  local list = {}
  for i = 1, #self._P do list[i] = { self._names[i], self._shards[i] } end
  return list
end

Sharded.no_sync = wrap.DistributedModel.no_sync

-- Drops the shards' gradients (what the optimizer reads) and any full ones, as
-- model:zero_grad() does for a plain model.
function Sharded:zero_grad()
  for _, sh in ipairs(self._shards) do sh.grad = nil end
  self.module:zero_grad()
end

-- The weights are stale after a step; a loader that wrote shards says so too.
function Sharded:invalidate()
  if self.shard_mode == 'optimizer' or self.shard_mode == 'gradients' then self._stale = true end
end

-- Where each shard lies, the full state and loading it: shard/state.lua.
Sharded.shard_layout = state.shard_layout
Sharded.state_dict = state.state_dict
Sharded.load_state_dict = state.load_state_dict

-- This replica's bytes by kind: {parameters, gradients, optimizer, activations}.
function Sharded:memory()
  local params, grads = 0, 0
  local counted = {}
  for _, p in ipairs(self.module:parameters()) do
    if C.em_tensor_has_data(p._h) ~= 0 then params = params + nbytes(p) end
    local g = p.grad
    if g then grads = grads + nbytes(g) end
  end
  for _, u in ipairs(self._units) do
    if u.segt then params = params + nbytes(u.segt) end
    -- 'optimizer' (and unsharded) shard gradients are views of the whole averaged unit
    local whole = self.shard_mode == 'optimizer'
    for pos, i in ipairs(u.idx) do
      local sh = self._shards[i]
      local g = self.shard_mode and sh.grad
      if g and not counted[u] then
        grads = grads + (whole and u.L * em.empty(0, { dtype = u.dtype }):element_size() or nbytes(g))
        if whole then counted[u] = true end
      end
    end
  end
  local opt_bytes = memory_kinds.optimizer_bytes(self._shards)
  return { parameters = params, gradients = grads, optimizer = opt_bytes,
           activations = self._mem.activations }
end

function Sharded:comm_stats()
  local st = self._stats
  local steps = math.max(st.steps, 1)
  local overlap_s = math.max(0, st.comm_s - st.wait_s)
  return { buckets = #self._units, units = #self._units, steps = st.steps, comm_s = st.comm_s,
           overlap_s = overlap_s, wait_s = st.wait_s,
           overlap = st.comm_s > 0 and overlap_s / st.comm_s or 0,
           bytes_per_step = st.bytes / steps,
           collectives = { allreduce = st.allreduce / steps,
                           reduce_scatter = st.reduce_scatter / steps,
                           allgather = st.allgather / steps } }
end

function Sharded:num_buckets() return #self._units end

return M

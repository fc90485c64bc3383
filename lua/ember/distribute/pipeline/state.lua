--[[
ember.distribute.pipeline.state -- what a pipeline holds, under the whole
model's names (the methods pipeline.lua gives its objects): a replica's pieces
are children firsts[c] .. of the full Sequential, so its names "j.rest" (or
"c.j.rest" with several pieces) map to the full model's "(first + j - 1).rest";
parameters, state_dict and load_state_dict, and the layout a sharded
checkpoint saves and loads (shard_layout).
]]
local em = require 'ember'
local core = require 'ember.ffi'
local raise, kind = core.raise, core.kind
local fmt = string.format

local Pipeline = {}

-- A stage name "j.rest" is the full model's "(first + j - 1).rest".
-- Interleaved, a name "c.j.rest" is chunk c's: (firsts[c] + j - 1).rest.
function Pipeline:_full_name(name)
  if self.nested then
    local c, j, rest = name:match('^(%d+)%.(%d+)(.*)$')
    return tostring(self.firsts[tonumber(c)] + tonumber(j) - 1) .. rest
  end
  local j, rest = name:match('^(%d+)(.*)$')
  return tostring(self.first_child + tonumber(j) - 1) .. rest
end

-- The piece (0-based) that holds child i of the full model.
function Pipeline:_piece_of(i)
  for k = #self.starts, 1, -1 do
    if i >= self.starts[k] then return k - 1 end
  end
end

function Pipeline:_stage_name(name)
  local i, rest = name:match('^(%d+)(.*)$')
  i = tonumber(i)
  if not i or i < 1 or i > self.model_children then return nil end
  local k = self:_piece_of(i)
  if k % self.stages ~= self.stage then return nil end
  local c = math.floor(k / self.stages) + 1
  local j = tostring(i - self.firsts[c] + 1) .. rest
  return self.nested and tostring(c) .. '.' .. j or j
end

-- The chunks' in order (a wrapped chunk's are what its optimizer updates).
function Pipeline:parameters()
  if not self.wrapped_parts then return self.module:parameters() end
  local list = {}
  for _, dm in ipairs(self.wrapped_parts) do
    for _, p in ipairs(dm:parameters()) do list[#list + 1] = p end
  end
  return list
end

function Pipeline:named_parameters()
  local list = {}
  for i, np in ipairs(self.module:named_parameters()) do list[i] = { self:_full_name(np[1]), np[2] } end
  return list
end

-- Each chunk's state under the full model's names.
function Pipeline:state_dict()
  local sd = {}
  for c, part in ipairs(self.parts) do
    local dm = self.wrapped_parts and self.wrapped_parts[c]
    local pre = self.nested and c .. '.' or ''
    for k, v in pairs((dm or part):state_dict()) do sd[self:_full_name(pre .. k)] = v end
  end
  return sd
end

-- sd holds full-model names; this stage takes its own (all of them) and
-- ignores the other stages'.
function Pipeline:load_state_dict(sd)
  if type(sd) ~= 'table' then raise('pipeline: load_state_dict: expected a table, got ' .. kind(sd)) end
  local own = {}
  for c = 1, #self.parts do own[c] = {} end
  for k, v in pairs(sd) do
    local name = self:_stage_name(k)
    if name then
      local c, rest = 1, name
      if self.nested then c, rest = name:match('^(%d+)%.(.*)$'); c = tonumber(c) end
      own[c][rest] = v
    end
  end
  for c, part in ipairs(self.parts) do
    local dm = self.wrapped_parts and self.wrapped_parts[c]
    ;(dm or part):load_state_dict(own[c])
  end
end

-- What a sharded checkpoint saves and loads (the interface of
-- ember.checkpoint.target): every parameter and buffer of the whole model, in
-- its order and under its names; the other stages' parameters are empty
-- ranges. A stage whose data replicas shard it (shard = ...) holds, of each of
-- its parameters, the range [lo, hi) its group's sharded model gives this
-- replica, and every replica writes its own. Otherwise a stage's parameters are
-- held whole here ([0, numel)) and written by its replica of data index 0 only
-- (write = false on the others, which load them all the same).
-- optimizer_index[k] is the entry of pp:parameters()[k]. A buffer is written by
-- the replica that holds it on data index 0 (rank = its stage).
function Pipeline:shard_layout()
  local s, dev = self.strategy, self.strategy.device
  local writes = self.data_index == 0
  local own = {}                -- full name -> {t, lo, hi, pos, write}
  local sharded = self.wrapped_parts and self.wrapped_parts[1].shard_mode
  if sharded then
    -- each piece's sharded model, its names "j.rest" counted from the piece's
    -- first child; positions run on through the pieces, as pp:parameters() does
    local pos = 0
    for c, dm in ipairs(self.wrapped_parts) do
      local inner = dm:shard_layout()
      if inner.world_size ~= self.data_size or inner.rank ~= self.data_index then
        raise(fmt('pipeline: the stage\'s sharded model is replica %d of %d, the pipeline ' ..
          'says data index %d of %d', inner.rank, inner.world_size, self.data_index,
          self.data_size))
      end
      for k, p in ipairs(inner.params) do
        local j, rest = p.name:match('^(%d+)(.*)$')
        own[tostring(self.firsts[c] + tonumber(j) - 1) .. rest] =
          { t = p.shard, lo = p.lo, hi = p.hi, pos = pos + k, write = true }
      end
      pos = pos + #inner.params
    end
  end
  -- whole tensors: an unsharded stage's parameters, and those a sharded model
  -- leaves out (frozen ones), which its optimizer does not hold either
  for k, np in ipairs(self:named_parameters()) do
    if not own[np[1]] then
      own[np[1]] = { t = np[2], lo = 0, hi = np[2]:numel(),
                     pos = not sharded and k or nil, write = writes }
    end
  end
  local empty = em.zeros({ 0 }, { device = dev })
  local params, index = {}, {}
  for i, np in ipairs(self._full:named_parameters()) do
    local t, o = np[2], own[np[1]]
    local shape = {}
    for d, v in ipairs(t.shape) do shape[d] = v end
    params[i] = { name = np[1], shape = shape, dtype = t.dtype, numel = t:numel(),
                  lo = o and o.lo or 0, hi = o and o.hi or 0, shard = o and o.t or empty,
                  write = o ~= nil and o.write }
    if o and o.pos then index[o.pos] = i end
  end
  local bufs, mine = {}, {}
  for _, nb in ipairs(self.module:named_buffers()) do mine[self:_full_name(nb[1])] = nb[2] end
  for i, nb in ipairs(self._full:named_buffers()) do
    local owner = self:_piece_of(tonumber(nb[1]:match('^(%d+)'))) % self.stages
    bufs[i] = { name = nb[1], tensor = mine[nb[1]], shape = nb[2].shape, dtype = nb[2].dtype,
                rank = owner, write = mine[nb[1]] ~= nil and writes }
  end
  return { mode = 'pipeline', world_size = s.world_size, rank = s.rank, params = params,
           buffers = bufs, optimizer_index = index }
end

-- A loader wrote new values into the shards: the stage's sharded model
-- gathers its weights from them before it next runs.
function Pipeline:invalidate()
  for _, dm in ipairs(self.wrapped_parts or {}) do
    if dm.invalidate then dm:invalidate() end
  end
end

return Pipeline

--[[
shard_standin.lua -- a stand-in for a sharded wrapped model (s:wrap(model,
{shard = mode})), with the interface of the real one that checkpoints use:
dm.shard_mode, dm.strategy, dm.module, dm:shard_layout(), dm:parameters(),
dm:state_dict() (a collective), and the layout rule: parameters grouped into
units, a unit flattened and concatenated, padded with zeros to a multiple of
the world size N, replica r owning the segment [r*L/N, (r+1)*L/N) and each
parameter's shard being its intersection with the parameter's flat range.

  local standin = dofile(dir .. 'shard_standin.lua')
  local dm = standin.wrap(s, model, {shard = 'optimizer', unit = 1})

unit: parameters per unit (1 by default; the real model groups several, and
checkpoints must not care). Shards are copies of the model's ranges; the
stand-in never writes them back into the model (the real one re-gathers on
forward): dm:state_dict() gathers them.
]]
local M = {}

local function numel_of(shape)
  local n = 1
  for _, d in ipairs(shape) do n = n * d end
  return n
end

function M.wrap(s, model, o)
  local mode, per_unit = o.shard or 'optimizer', o.unit or 1
  local N, r = s.world_size, s.rank
  local named = {}
  for _, np in ipairs(model:named_parameters()) do
    if np[2].requires_grad then named[#named + 1] = np end
  end
  local params = {}
  local i = 1
  while i <= #named do
    local unit = {}
    for k = i, math.min(i + per_unit - 1, #named) do unit[#unit + 1] = named[k] end
    local L = 0
    for _, np in ipairs(unit) do L = L + np[2]:numel() end
    local padded = math.ceil(L / N) * N
    local seg_lo, seg_hi = r * padded / N, (r + 1) * padded / N
    local off = 0
    for _, np in ipairs(unit) do
      local t = np[2]
      local n = t:numel()
      local lo = math.min(math.max(seg_lo - off, 0), n)
      local hi = math.min(math.max(seg_hi - off, 0), n)
      local shard = em.no_grad(function()
        return t:detach():reshape(n):narrow(1, lo + 1, hi - lo):clone()
      end)
      shard.requires_grad = true
      params[#params + 1] = { name = np[1], shape = t.shape, dtype = t.dtype, numel = n,
                              lo = lo, hi = hi, shard = shard, seg = padded / N,
                              unit_off = off, seg_lo = seg_lo }
      off = off + n
    end
    i = i + per_unit
  end
  local dm = { shard_mode = mode, strategy = s, module = model }
  function dm:shard_layout()
    local buffers = {}
    for _, nb in ipairs(model:named_buffers()) do
      buffers[#buffers + 1] = { name = nb[1], tensor = nb[2] }
    end
    return { mode = mode, world_size = N, rank = r, params = params, buffers = buffers }
  end
  function dm:parameters()
    local list = {}
    for k, p in ipairs(params) do list[k] = p.shard end
    return list
  end
  -- The full tensor of parameter p whose shard on this replica is x: the
  -- shards allgathered (each row: lo, hi, then the values, padded), in float64.
  function dm:gather(p, x)
    local mine = em.zeros(1, p.seg + 2, { dtype = 'float64' })
    mine[1][1], mine[1][2] = p.lo, p.hi
    if p.hi > p.lo then mine[1]:narrow(1, 3, p.hi - p.lo):copy_(x:detach():double()) end
    local rows = s:allgather(mine)
    local full = em.zeros(p.numel, { dtype = 'float64' })
    for k = 1, N do
      local lo, hi = rows[k][1], rows[k][2]
      if hi > lo then full:narrow(1, lo + 1, hi - lo):copy_(rows[k]:narrow(1, 3, hi - lo)) end
    end
    return full
  end
  function dm:state_dict()
    local sd = {}
    for _, p in ipairs(params) do
      sd[p.name] = dm:gather(p, p.shard):to(p.dtype):reshape(p.shape)
    end
    for _, nb in ipairs(model:named_buffers()) do sd[nb[1]] = nb[2] end
    return sd
  end
  return dm
end

M.numel_of = numel_of
return M

--[[
ember.distribute.shard.layout -- where each replica's share of a sharded model
lies: pure arithmetic on sizes, no tensors, so it is the same on every replica
and testable alone.

A unit is a list of parameters that travel together (one collective per unit).
Its parameters, flattened, are laid end to end into a flat vector of `total`
elements, padded with zeros to L, a multiple of the world size N; replica r
owns the segment [r * L/N, (r + 1) * L/N). A parameter's shard on replica r is
the part of its flat range that falls in r's segment: a contiguous range
[lo, hi) of the flattened parameter (possibly empty), at offset `at` in the
segment. So one reduce-scatter of the unit's flat gradient hands each replica
exactly its shards' gradients, and one allgather of the segments rebuilds the
flat vector -- every parameter at its own offset.

  local u = layout.unit({n1, n2, ...}, N, r)
  u.L, u.seg, u.off[i], u.lo[i], u.hi[i], u.at[i]      (0-based element counts)
  layout.buckets(sizes_bytes, first_bytes, bytes, dtypes) -> lists of indices
  layout.shard_buckets(sizes_bytes, dtypes, mb) -> the sharded model's units

The sizes the sharded model works with live here too, so that the planner's
arithmetic (plan/layouts.lua) reads the same figures.
]]
local M = {}

-- 'optimizer' and 'gradients' units, in MB: smaller than the unsharded wrap's 25,
-- as a unit's flat gradient is whole until its reduce-scatter, so the bucket
-- bounds what 'gradients' adds to the peak.
M.BUCKET_MB = 4
-- Units whose gradients are being reduced at once (shard/grads.lua): a backward
-- holds this many flat gradient buffers, plus the one filling, whatever the depth.
M.MAX_IN_FLIGHT = 2

function M.unit(numels, world, rank)
  local off, total = {}, 0
  for i, n in ipairs(numels) do off[i] = total; total = total + n end
  local seg = math.ceil(total / world)
  local L = seg * world
  local s0, s1 = rank * seg, (rank + 1) * seg
  local lo, hi, at = {}, {}, {}
  for i, n in ipairs(numels) do
    local a, b = math.max(off[i], s0), math.min(off[i] + n, s1)
    if b > a then
      lo[i], hi[i], at[i] = a - off[i], b - off[i], a - s0
    else                          -- no share here: an empty range at the nearer end
      local e = math.min(math.max(s0 - off[i], 0), n)
      lo[i], hi[i], at[i] = e, e, 0
    end
  end
  return { total = total, L = L, seg = seg, off = off, lo = lo, hi = hi, at = at,
           numel = numels }
end

-- Indices (into the parameter list) grouped into buckets in reverse order --
-- backward produces the last layer's gradients first -- the first about
-- first_bytes (communication starts early), then about `bytes` each; one dtype
-- and one device per bucket (keys[i] says which).
function M.buckets(nbytes, keys, first_bytes, bytes)
  local out, cur, size, key = {}, nil, 0, nil
  local limit = first_bytes
  for i = #nbytes, 1, -1 do
    if cur and (size >= limit or keys[i] ~= key) then
      out[#out + 1] = cur
      cur, size = nil, 0
      limit = bytes
    end
    if not cur then cur, key = {}, keys[i] end
    cur[#cur + 1] = i
    size = size + nbytes[i]
  end
  if cur then out[#out + 1] = cur end
  return out
end

-- The units of 'optimizer' and 'gradients' (shard.lua), which the planner
-- replays: buckets of about mb MiB (BUCKET_MB by default), the first of 1 MiB
-- at most.
function M.shard_buckets(nbytes, keys, mb)
  mb = mb or M.BUCKET_MB
  return M.buckets(nbytes, keys, math.min(1, mb) * 2 ^ 20, mb * 2 ^ 20)
end

return M

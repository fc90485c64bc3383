--[[
ember.memlimit -- the cap on this state's CPU tensor memory: em.set_memory_limit
and the EMBER_MEMORY_LIMIT variable (which `ember --memory-limit SIZE` sets, so
that every replica's state takes it when it opens).

Sizes are bytes, or a whole number followed by K, M or G (powers of 1024):
'512K', '256M', '1G'. 0 and nil mean no cap. Past the cap an op fails as on a
full GPU (core/memlimit.c): the C call returns EM_ERR_NOMEM with the pressure
flag raised, so ember.capi's retry collects Lua's garbage and tries once more
before the error is final.
]]
local core = require 'ember.ffi'
local C, S = core.C, core.S

local M = {}

local units = { [''] = 1, K = 1024, M = 1024 ^ 2, G = 1024 ^ 3 }

-- -- Garbage under a cap -------------------------------------------------------
-- The garbage the collector's pacing (ember.handles) lets a cap of `cap`
-- bytes keep when `held` bytes were allocated at the last collection: a 16th
-- of what is held, at least a 64th and at most an 8th of the cap. Tied to
-- what is held, it stays a small share of any step's peak, so a step holds
-- about the same whether or not Lua's own cycles happen to free its garbage
-- first -- which is what lets the planner, measuring without those cycles,
-- predict the peak within a few percent (an 8th of the cap alone would be
-- 20-30% of a small model's peak under a loose cap). The planner's replay
-- assumes the same.
function M.cap_slack(cap, held)
  local s = (held or 0) / 16
  if s < cap / 64 then s = cap / 64 end
  if s > cap / 8 then s = cap / 8 end
  return s
end
-- Garbage worth a collection of its own on a device of `capacity` bytes (0 or
-- nil: uncapped): `most`, or a 64th of the capacity where that is less -- under
-- a small cap the garbage must stay a small share of it: more would let a
-- pipeline stage's micro-batches pile up garbage that Lua's own cycles free in
-- some runs and not in others, which the planner can only assume the worst of.
-- Code that knows it just made that much (a pipeline's micro-batches, a
-- checkpoint's forward) collects at once, so that its memory does not hang on
-- the collector's pace; the planner assumes the same rule.
function M.garbage_worth(capacity, most)
  if capacity and capacity > 0 and capacity / 64 < most then return capacity / 64 end
  return most
end

-- The capacity a collection rule reads for `device` (a name, or nil: the
-- cpu's). Meta tensors have no capacity of their own; while the planner
-- measures a step on meta for a device of M.meta_capacity bytes, the rules
-- read that, so the measured step collects where the real one would.
M.meta_capacity = nil
function M.capacity(em, device)
  if device == 'meta' and M.meta_capacity then return M.meta_capacity end
  return em.memory_stats(device).capacity
end

-- Bytes for a size, or nil and why not.
function M.parse_size(v)
  if type(v) == 'number' then
    if v >= 0 and v == math.floor(v) and v < 2 ^ 62 then return v end
    return nil, ('expected a whole number of bytes >= 0, got %s'):format(tostring(v))
  end
  if type(v) ~= 'string' then return nil, 'expected a number of bytes or a size like 256M' end
  local digits, unit = v:match('^%s*(%d+)%s*([KkMmGg]?)%s*$')
  local n = digits and tonumber(digits) * units[unit:upper()]
  if not n or n >= 2 ^ 62 then
    return nil, ("expected bytes or a whole number with K, M or G (powers of 1024), " ..
      "e.g. 256M, got '%s'"):format(v)
  end
  return n
end

function M.set(v)
  local n, why = 0, nil
  if v ~= nil then n, why = M.parse_size(v) end
  if not n then core.raise('set_memory_limit: ' .. why) end
  core.check(C.em_set_memory_limit(S, C.EM_CPU, n))
end

function M.install(em)
  em.set_memory_limit = M.set
  -- A ds:map worker's state is not a replica: the cap is its replica's.
  local env = os.getenv('EMBER_MEMORY_LIMIT')
  if env and env ~= '' and rawget(_G, 'EMBER_WORKER') == nil then
    local n, why = M.parse_size(env)
    if not n then error('EMBER_MEMORY_LIMIT: ' .. why, 0) end
    core.check(C.em_set_memory_limit(S, C.EM_CPU, n))
  end
end

return M

--[[
ember.profile.join -- what stop() needs to join the replicas' profiles: plain data
as Lua source and back, an allgather of one string per replica, the
communicator's calibration (bandwidth and latency), the world size, and the
merge of the replicas' timelines into the page's one.
]]
local ffi = require 'ffi'
local core = require 'ember.ffi'
local C = core.C

local M = {}

-- Plain data (numbers, strings, booleans, tables of them) as Lua source, and back.
local function ser(v, out)
  local t = type(v)
  if t == 'number' then
    out[#out + 1] = v ~= v and '0/0' or v == math.huge and 'math.huge' or
      v == -math.huge and '-math.huge' or string.format('%.17g', v)
  elseif t == 'string' then out[#out + 1] = string.format('%q', v)
  elseif t == 'boolean' then out[#out + 1] = tostring(v)
  elseif t == 'table' then
    out[#out + 1] = '{'
    for k, x in pairs(v) do
      out[#out + 1] = '['; ser(k, out); out[#out + 1] = ']='; ser(x, out); out[#out + 1] = ','
    end
    out[#out + 1] = '}'
  else out[#out + 1] = 'nil' end
  return out
end
function M.serialize(v) return 'return ' .. table.concat(ser(v, {})) end
function M.deserialize(s)
  local f = assert(loadstring(s, '=profile'))
  setfenv(f, { math = math })
  return f()
end

-- Every replica's string, in rank order: one allgather of the lengths, one of the
-- bytes (padded to the longest, 4 per int32).
function M.gather_strings(strategy, str)
  local em = require 'ember'
  local len = em.tensor({ #str }, { dtype = 'int64' })
  local lens_t = strategy:allgather(len)
  local lens = ffi.cast('const int64_t *', lens_t:data_ptr())
  local world, longest = strategy.world_size, 0
  for r = 0, world - 1 do longest = math.max(longest, tonumber(lens[r])) end
  local words = math.max(1, math.ceil(longest / 4))
  local buf = em.zeros({ words }, { dtype = 'int32' })
  ffi.copy(buf:data_ptr(), str, #str)
  local all = strategy:allgather(buf)
  local base = ffi.cast('const char *', all:data_ptr())
  local out = {}
  for r = 0, world - 1 do out[r + 1] = ffi.string(base + r * words * 4, tonumber(lens[r])) end
  return out
end

-- Bus bandwidth (GB/s) and per-allreduce latency of this communicator: a 4-byte
-- allreduce for latency, a 4 MB one for bandwidth.
function M.calibrate(strategy)
  local em = require 'ember'
  local n = strategy.world_size
  local small, big = em.zeros(1), em.zeros(1048576)
  strategy:barrier()
  for _ = 1, 3 do strategy:allreduce(small, 'sum') end
  local t0 = C.em_profile_clock()
  for _ = 1, 10 do strategy:allreduce(small, 'sum') end
  local lat = (C.em_profile_clock() - t0) / 10
  strategy:allreduce(big, 'sum')
  t0 = C.em_profile_clock()
  for _ = 1, 3 do strategy:allreduce(big, 'sum') end
  local t_big = (C.em_profile_clock() - t0) / 3
  local moved = 2 * (n - 1) / n * 4 * 1048576
  return { gbps = moved / math.max(t_big - lat, 1e-9) / 1e9, latency_s = lat }
end

function M.world_size()
  local rep = rawget(_G, 'EMBER_REPLICA')
  if rep and rep.world_size and rep.world_size > 1 then return rep.world_size end
  local r, n = ffi.new('int[1]'), ffi.new('int[1]')
  if C.em_mpi_launched(r, n) ~= 0 and n[0] > 1 then return n[0] end
  return 1
end

-- The timeline shown on the page: TIMELINE_STEPS steps from the middle of the run.
M.TIMELINE_STEPS, M.TIMELINE_EVENTS = 3, 20000
local TIMELINE_EVENTS = M.TIMELINE_EVENTS

function M.merge_timelines(tls)
  local out = { tracks = {}, steps = tls[1].steps, events = {} }
  local zero = tls[1].start_abs
  for r, tl in ipairs(tls) do
    local base = #out.tracks
    for _, name in ipairs(tl.tracks) do
      out.tracks[#out.tracks + 1] = (#tls > 1 and ('rank ' .. (r - 1) .. ' ') or '') .. name
    end
    local shift = (tl.start_abs - zero) * 1e6
    for _, e in ipairs(tl.events) do
      if #out.events >= TIMELINE_EVENTS then out.truncated = true; break end
      e.track = e.track + base
      e.ts = e.ts + shift
      out.events[#out.events + 1] = e
    end
    out.truncated = out.truncated or tl.truncated
  end
  return out
end

return M

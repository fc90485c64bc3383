--[[
ember.profile.trace -- Chrome trace-event JSON (what Perfetto and chrome://tracing
open) from the profiles of all replicas.

Layout: one process per replica (pid = rank, named "replica r"), one thread per
track (the step thread "main", the communicator's "comm", each loader worker).
Spans are complete events ("ph":"X", microseconds); step marks are instant
events; a bucket's launch (its last gradient arrived) and its allreduce on the
comm track are joined by a flow arrow ("s" at the launch, "f" binding to the
enclosing allreduce), with ids made unique across replicas; the state's
allocated bytes are a counter track sampled from the ops (at most one sample
per 100 µs).

Each replica renders its own part (M.part) as a string of comma-separated
events; the report's owner joins the parts (M.document), so parts travel
between MPI processes as plain text.
]]
local ffi = require 'ffi'
local core = require 'ember.ffi'
local summary = require 'ember.profile.summary'
local K, CATEGORY = summary.KIND, summary.CATEGORY

local M = {}

-- Names as JSON strings, through the core's JSON writer; bytes that are not
-- UTF-8 (a user's range name, say) become '?'.
local function quote(s)
  if core.C.em_utf8_valid(s, #s) == 0 then s = s:gsub('[\128-\255]', '?') end
  return core.json_quote(s)
end
M.quote = quote

local fmt = string.format

-- The events of one replica's profile p (summary.read) as a JSON fragment; times
-- in µs from `zero` (seconds on the shared monotonic clock).
function M.part(p, rank, zero)
  local out = {}
  local function add(s) out[#out + 1] = s end
  add(fmt('{"ph":"M","pid":%d,"name":"process_name","args":{"name":"replica %d"}}', rank, rank))
  add(fmt('{"ph":"M","pid":%d,"name":"process_sort_index","args":{"sort_index":%d}}', rank, rank))
  for t, name in ipairs(p.tracks) do
    add(fmt('{"ph":"M","pid":%d,"tid":%d,"name":"thread_name","args":{"name":%s}}', rank,
            t - 1, quote(name)))
  end
  local shift = (p.origin - zero) * 1e6
  local flow_base = rank * 1000000000
  local last_mem_ts = -1e300
  local ev = p.events
  local launched = {}        -- flows that start at a bucket: only those get an end
  for i = 0, p.n - 1 do
    if ev[i].kind == K.BUCKET_READY then launched[tonumber(ev[i].flow)] = true end
  end
  for i = 0, p.n - 1 do
    local e = ev[i]
    local k = e.kind
    local ts = e.t0 * 1e6 + shift
    local name = quote(ffi.string(e.name))
    local cat = CATEGORY[k] or 'other'
    if k == K.STEP then
      add(fmt('{"ph":"i","s":"p","name":"step","cat":"step","pid":%d,"tid":%d,"ts":%.3f}',
              rank, e.track, ts))
    elseif k == K.GRAD then
      -- counted in the report; one instant per parameter would only clutter the view
    elseif k == K.BUCKET_READY then     -- a slice, so that the arrow has one to leave
      local dur = (e.t1 - e.t0) * 1e6
      add(fmt('{"ph":"X","name":"bucket %d launch","cat":"bucket","pid":%d,"tid":%d,' ..
              '"ts":%.3f,"dur":%.3f,"args":{"bytes":%d}}', tonumber(e.arg0), rank, e.track, ts,
              dur, tonumber(e.bytes)))
      add(fmt('{"ph":"s","id":%d,"name":"gradient bucket","cat":"bucket","pid":%d,"tid":%d,' ..
              '"ts":%.3f}', flow_base + tonumber(e.flow), rank, e.track, ts))
    else
      local args
      if k == K.OP then
        local dims = {}
        for d = 0, math.min(e.ndim, 8) - 1 do dims[#dims + 1] = tostring(tonumber(e.sizes[d])) end
        args = fmt('{"shape":"[%s]","dtype":"%s","device":"%s"}', table.concat(dims, ','),
                   ffi.string(core.C.em_dtype_name(e.dtype)),
                   core.device_name(e.device))
      elseif k == K.COLLECTIVE then
        args = fmt('{"bytes":%d,"waiting_for_peers_us":%.3f,"replicas":%d,"seq":%d}',
                   tonumber(e.bytes), e.wait * 1e6, tonumber(e.arg0), tonumber(e.flow))
      elseif k == K.COMM_WAIT then
        args = fmt('{"bytes":%d,"waiting_for_peers_us":%.3f}', tonumber(e.bytes), e.wait * 1e6)
      elseif k == K.DATA_WAIT then
        args = fmt('{"workers":%d,"prefetch":%d}', tonumber(e.arg0), tonumber(e.arg1))
      end
      add(fmt('{"ph":"X","name":%s,"cat":"%s","pid":%d,"tid":%d,"ts":%.3f,"dur":%.3f%s}',
              name, cat, rank, e.track, ts, (e.t1 - e.t0) * 1e6,
              args and (',"args":' .. args) or ''))
      if k == K.COLLECTIVE and launched[tonumber(e.flow)] then
        add(fmt('{"ph":"f","bp":"e","id":%d,"name":"gradient bucket","cat":"bucket",' ..
                '"pid":%d,"tid":%d,"ts":%.3f}', flow_base + tonumber(e.flow), rank, e.track, ts))
      end
      if k == K.OP and ts - last_mem_ts >= 100 then
        last_mem_ts = ts
        add(fmt('{"ph":"C","name":"memory","pid":%d,"ts":%.3f,"args":{"allocated bytes":%d}}',
                rank, (e.t1 * 1e6) + shift, tonumber(e.mem)))
      end
    end
  end
  for _, x in ipairs(p.notes or {}) do      -- em.profile.note: instants with their fields
    local args = {}
    for k, v in pairs(x.fields or {}) do
      local val = type(v) == 'string' and quote(v) or type(v) == 'boolean' and tostring(v) or
        (v ~= v or v == math.huge or v == -math.huge) and quote(tostring(v)) or fmt('%.17g', v)
      args[#args + 1] = quote(k) .. ':' .. val
    end
    table.sort(args)
    add(fmt('{"ph":"i","s":"t","name":%s,"cat":"note","pid":%d,"tid":%d,"ts":%.3f,"args":{%s}}',
            quote(x.name), rank, p.main, x.t * 1e6 + shift, table.concat(args, ',')))
  end
  return table.concat(out, ',\n')
end

-- The whole trace from the parts of every replica.
function M.document(parts)
  local head = '{"displayTimeUnit":"ms","otherData":{"generator":"ember"},"traceEvents":[\n'
  local body = {}
  for _, p in ipairs(parts) do if p ~= '' then body[#body + 1] = p end end
  return head .. table.concat(body, ',\n') .. '\n]}\n'
end

return M

--[[
ember.compile.reads -- values a compiled step reads with item() after its last
kernel call, replayed as well.

A training step usually ends by handing the loss back to Lua: `return
loss:item()`. A read in the middle of a step ends the record (what follows
depends on the value, in Lua), but a read after the last kernel call depends
on nothing that runs later: the replay runs the kernels, then reads the same
tensor again. What fn returns is a Lua value computed from the read, which a
replay can't recompute without running fn; so a number (or boolean) fn returns
must be one of the values it read, found by equality at capture, and a replay
returns that tensor's value as read anew. And every value read must be
returned: one that only steers Lua (a GradScaler's inf flag deciding whether
the optimizer steps) would steer it as at the capture, whatever the replay's
value. A step that returns a number made from a read (`loss:item() / n`),
reads a value it does not return, or makes two equal reads that can't be told
apart, runs eagerly and says why.
]]
local core = require 'ember.ffi'
local C, S = core.C, core.S

local M = {}

-- While capturing: a read of t (kept alive, so the record keeps its buffer
-- and a replay rewrites it), after `at` calls were recorded, at `where`.
function M.note(cap, t, where)
  cap.items[#cap.items + 1] = { t = t, at = C.em_compile_recorded(S), where = where }
end

local function plain(v) return type(v) == 'table' and getmetatable(v) == nil end
local function scalar(v) return type(v) == 'number' or type(v) == 'boolean' end

-- After the capture of fn, which recorded `total` calls and returned res: the
-- slots of res a replay fills ({i, k, read}), or nil and why it can't replay.
function M.plan(cap, total, res)
  for _, r in ipairs(cap.items) do
    if r.at < total then
      return nil, ('it reads a value: item at %s, before its last kernel call (the calls ' ..
        'after it could depend on the value)'):format(r.where)
    end
  end
  local slots, used = {}, {}
  local function map(v, i, k)
    if not scalar(v) then return true end
    local found
    for _, r in ipairs(cap.items) do
      if r.t:item() == v then
        if found and found.t ~= r.t then
          return nil, ('two values it reads are equal (%s, at %s and %s): a result equal to ' ..
            'them can\'t be told apart'):format(tostring(v), found.where, r.where)
        end
        found = found or r
      end
    end
    if not found then
      return nil, ('it returns %s, which is none of the values it read (at %s): return the ' ..
        'value itself or a tensor; a replay does not run Lua'):format(tostring(v), cap.items[1].where)
    end
    slots[#slots + 1] = { i = i, k = k, read = found.t }
    used[found.t] = true
    return true
  end
  for i = 1, res.n do
    local v = res[i]
    if plain(v) then
      for k, x in pairs(v) do
        local ok, why = map(x, i, k)
        if not ok then return nil, why end
      end
    else
      local ok, why = map(v, i)
      if not ok then return nil, why end
    end
  end
  for _, r in ipairs(cap.items) do
    if not used[r.t] then
      return nil, ('it reads a value at %s that it does not return (what it does with the ' ..
        'value is Lua, which a replay does not run)'):format(r.where)
    end
  end
  return slots
end

-- A replay's results (the caller's own copy) get each slot's value read anew.
function M.fill(res, slots)
  for _, s in ipairs(slots) do
    local v = s.read:item()
    if s.k == nil then res[s.i] = v else res[s.i][s.k] = v end
  end
end

return M

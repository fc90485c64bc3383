--[[
ember.distribute.comm -- the handles under a strategy (distribute.lua): the boxes
of communicators and works, the order they are freed in when the state closes,
the groups whose strategies were collected, each backend's one communicator, a
strategy's live communicator (comm) and run, which starts a collective
synchronously or as a Work to wait for. The collectives, point-to-point and
groups build on these.
]]
local ffi = require 'ffi'
local core = require 'ember.ffi'
local C, S = core.C, core.S
local raise = core.raise

local M = {}

ffi.cdef [[ typedef struct em_commbox { em_comm *_h; } em_commbox;
            typedef struct em_workbox { em_comm_work *_h; } em_workbox; ]]
local commbox_t, workbox_t = ffi.typeof('em_commbox'), ffi.typeof('em_workbox')
M.commbox_t = commbox_t

-- -- Lifetime ----------------------------------------------------------------------------
local live = setmetatable({}, { __mode = 'k' })   -- box -> release function
local function track(obj, release) live[obj] = release; return obj end
M.track = track
local releaser = core.releaser
local free_comm, free_work = releaser(C.em_comm_free), releaser(C.em_comm_work_free)
local free_group = releaser(C.em_comm_free)     -- a group goes before its parent
M.free_comm, M.free_group = free_comm, free_group

-- A group whose strategy was collected (a dropped pipeline's stage group) is
-- freed -- its comm thread joined, its channels given back -- at the next safe
-- point, not inside the collector: a work of the group collected in the same
-- cycle must be waited for and freed first, and the collector runs finalizers
-- in no set order. The safe points: the next collective or group made, and the
-- state's close. (Freeing it on one replica while another still holds its own
-- is safe: a group moves no byte itself, see core/dist/group.c.)
local dead_groups = {}
function M.group_collected(box)
  if box._h ~= nil then
    dead_groups[#dead_groups + 1] = ffi.cast('em_comm *', box._h)
    box._h = nil
  end
end
local function free_dead_groups()
  for i = #dead_groups, 1, -1 do
    local h = dead_groups[i]
    dead_groups[i] = nil
    C.em_comm_free(h)
  end
end

-- Works first (they hold tensors and wait for their collective), then reducers
-- (registered by wrap.lua), then groups, then communicators.
local comms = {}            -- backend name -> comm box
M.comms = comms
core.on_close[#core.on_close + 1] = function()
  for obj, release in pairs(live) do if release == free_work then release(obj) end end
  for obj, release in pairs(live) do
    if release ~= free_work and release ~= free_comm and release ~= free_group then release(obj) end
  end
  free_dead_groups()
  for obj, release in pairs(live) do if release == free_group then release(obj) end end
  for obj, release in pairs(live) do release(obj) end
end

-- A strategy's communicator, for op (a name for messages); a safe point for
-- freeing collected groups.
function M.comm(self, op)
  if dead_groups[1] then free_dead_groups() end
  local c = self._box._h
  if c == nil then raise(op .. ': the strategy was closed') end
  return c
end

-- -- Works ---------------------------------------------------------------------------------------
local Work = {}
Work.__index = Work
local workout = ffi.new('em_comm_work*[1]')
local done_buf = ffi.new('int[1]')

-- Runs a collective: synchronously, or as a handle whose wait() returns the
-- result: t (in place), or the new tensor start left in out[0]. Values, not a
-- closure over them: a LuaJIT trace through a call keeps the called closure as
-- a constant, and with it the tensors it captured, until the trace is flushed
-- (a model's original weights, broadcast when it was wrapped, say). start's
-- closures capture raw handles only.
function M.run(self, async, start, t, out)
  if not async then
    if start(nil) ~= 0 then core.fail() end
    if out then return core.wrap(out[0]) end
    return t
  end
  if start(workout) ~= 0 then core.fail() end
  local result = t
  if out then result = core.wrap(out[0]) end
  -- (a handle dropped unwaited is waited for and freed when it is collected: it
  -- holds the collective's tensors)
  local box = track(ffi.gc(workbox_t(workout[0]), free_work), free_work)
  -- (_strategy: a group's work keeps the group alive until it is done with)
  return setmetatable({ _box = box, _result = result, _strategy = self }, Work)
end

function Work:wait()
  local h = self._box._h
  if h ~= nil then
    local st = C.em_comm_work_wait(S, h)
    if st ~= 0 then
      local msg = core.errmsg()
      free_work(self._box)
      error(msg, core.blame_level())
    end
    free_work(self._box)
  end
  return self._result
end

function Work:done()
  local h = self._box._h
  if h == nil then return true end
  C.em_comm_work_test(S, h, done_buf)
  return done_buf[0] ~= 0
end

return M

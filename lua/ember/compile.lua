--[[
ember.compile -- em.compile(fn[, opts]): a step captured once per input
signature and replayed after, without Lua between its kernels.

How it works. The first call with a signature (each tensor argument's shape,
dtype, device, strides and requires_grad; every other argument's value) copies
the tensor arguments into static tensors of its own, and runs fn on them once,
eagerly, while the C core records every kernel call the CPU receives
(core/compile/: forward, the autograd engine's backward, the optimizer's fused
update, .grad changes, a wrapped model's allreduces). Later calls with that signature copy their tensors into
the statics and replay the record: the same kernels on the same memory, so the
results equal the eager step's bits; fn's Lua code does not run. What fn returns
comes back as copies, detached from autograd (call backward inside fn), so a
result kept from an earlier call does not change.

What changes per step is not in the record, and is handled so:
  - random draws (dropout) take fresh counters at every replay (C);
  - the optimizers register hooks while captured (M.on_replay) that set the
    replayed update's learning rate and Adam's step count before each replay,
    and count the step after it if it ran;
  - a parameter's .grad is set by the replay as by the eager step;
  - a decision ember's own code takes on a value it reads (a GradScaler skipping
    the update on inf) is a guard of the record (M.guard, core/compile/guard.c)
    that the replay takes on the value it computed; a capture that skipped the
    guarded calls can't record them and is not kept (M.retry).
A step that can't be replayed runs eagerly for that signature, and explain()
says why: it read a value (item, totable, tostring, element access: the rest
of the step would depend on it) -- except item() after the last kernel call,
whose value a replay reads again (compile/reads.lua) -- touched a device other
than the CPU, ran a collective other than an in-place allreduce or broadcast,
took a tensor that requires grad, or accumulated into gradients from before the
call. `check = true` runs the first
calls after a capture eagerly again, recording them, and raises at the first
call that differs from the captured step (fn branching on data or on a Lua
value that is no argument). EMBER_COMPILE=0 runs every compiled function eagerly.
]]
local ffi = require 'ffi'
local core = require 'ember.ffi'
require 'ember.tensor'
local reads = require 'ember.compile.reads'
local carried = require 'ember.compile.args'
local C, S, raise, kind = core.C, core.S, core.raise, core.kind

local M = {}

local function pack(...) return { n = select('#', ...), ... } end

-- -- While capturing ---------------------------------------------------------------------
local capture   -- {hooks, after, items, read = why, retry = why} of the capture that runs

-- What the host keeps per step (an optimizer's per-step arguments, a scaler's
-- schedule): before(program) runs before every replay of the capture that runs
-- now, after(program) after it (either may be nil; nothing when none runs).
function M.on_replay(before, after)
  if not capture then return end
  if before then capture.hooks[#capture.hooks + 1] = before end
  if after then capture.after[#capture.after + 1] = after end
end
function M.capturing() return capture ~= nil end

-- fn() as a stretch of the step that a replay skips when flag (a CPU tensor of
-- one element) is nonzero at that point: a decision the eager step makes on the
-- host (a GradScaler skipping the update). The capture records the stretch by
-- running it, so the caller makes the capture on a step that runs it (M.retry
-- otherwise). Returns fn(...)'s results.
function M.guard(flag, fn, ...)
  if not capture then return fn(...) end
  core.check(C.em_compile_guard_begin(S, flag._h))
  local res = pack(pcall(fn, ...))
  core.check(C.em_compile_guard_end(S))
  if not res[1] then error(res[2], 0) end
  return unpack(res, 2, res.n)
end

-- The value of a one-element tensor read by ember itself during a capture,
-- neither recorded nor counted as the step's read: for a decision that a guard
-- replays.
function M.peek(t)
  local was = core.host_access
  core.host_access = nil
  C.em_compile_pause(S, 1)
  local ok, v = pcall(t.item, t)
  C.em_compile_pause(S, 0)
  core.host_access = was
  if not ok then error(v, 0) end
  return v
end

-- The capture that runs is not kept (why: for explain()); the next call with its
-- signature captures again.
function M.retry(why)
  if capture and not capture.retry then capture.retry = why end
end

-- fn(...) run once, not recorded (state an optimizer makes at its first step: a
-- replay must not make it again). Returns fn's results.
function M.once(fn, ...)
  if not capture then return fn(...) end
  C.em_compile_pause(S, 1)
  local res = { pcall(fn, ...) }
  C.em_compile_pause(S, 0)
  if not res[1] then error(res[2], 0) end
  return unpack(res, 2)
end

-- The first line of the caller's code (outside ember's own files) on the stack.
local function user_line()
  for level = 3, 40 do
    local info = debug.getinfo(level, 'Sl')
    if not info then break end
    local src = info.short_src or ''
    if not src:find('ember/', 1, true) and info.currentline and info.currentline > 0 then
      return src:match('[^/]*$') .. ':' .. info.currentline
    end
  end
  return '?'
end

-- A value read while capturing: item() notes its tensor (compile/reads.lua
-- replays a read after the last kernel); any other read ends the record.
local function host_access(what, t)
  if not capture then return end
  if what == 'item' and t then reads.note(capture, t, user_line())
  elseif not capture.read then capture.read = what .. ' at ' .. user_line() end
end

local signature, each_tensor, plain = carried.signature, carried.each_tensor, carried.plain
local static_like, at, own, fill = carried.static_like, carried.at, carried.own, carried.fill

-- -- The compiled function -----------------------------------------------------------------
local Compiled = {}
Compiled.__index = Compiled

local free_program = function(p) C.em_program_free(S, p) end
local prog_box = ffi.typeof('em_program*[1]')

-- (read once: the environment of a running process does not change under Lua)
local DISABLED = os.getenv('EMBER_COMPILE') == '0'
local function disabled() return DISABLED end

-- Runs fn(args) once, eagerly, while the core records its calls. Returns the
-- program (collected with its box), why the core can't replay it (or nil), the
-- capture's Lua side ({hooks, read}) and fn's results {n = ...}; fn's error is
-- raised after the recording ended.
local function record(fn, args)
  local cap = { hooks = {}, after = {}, items = {} }
  core.check(C.em_compile_begin(S))
  capture, core.host_access = cap, host_access
  local res = pack(pcall(fn, unpack(args, 1, args.n)))
  cap.total = C.em_compile_recorded(S)
  capture, core.host_access = nil, nil
  -- the step's dead tensors let go of their buffers, so the memory plan (at the
  -- capture's end) sees which buffers only the record holds (ember.handles'
  -- full collection hands dead tensors back to C)
  collectgarbage()
  local box, whybuf = prog_box(), ffi.new('char[256]')
  local st = C.em_compile_end(S, box, whybuf, 256)
  local prog = box[0] ~= nil and ffi.gc(box[0], free_program) or nil
  if not res[1] then error(res[2], 0) end
  if st ~= 0 then core.fail() end
  table.remove(res, 1)
  res.n = res.n - 1
  local why = ffi.string(whybuf)
  return prog, why ~= '' and why or nil, cap, res
end

-- Runs fn(args) while recording: the entry for the signature, and fn's results.
function Compiled:capture(key, args)
  local statics, call_args = {}, { n = args.n }
  for i = 1, args.n do call_args[i] = plain(args[i]) and {} or args[i] end
  for i = 1, args.n do
    if plain(args[i]) then for k, v in pairs(args[i]) do call_args[i][k] = v end end
  end
  local why
  each_tensor(args, function(t, i, k)
    if t.requires_grad then
      why = why or ('argument %d%s requires grad (compiled steps take data, not leaves)')
        :format(i, k and ('.' .. tostring(k)) or '')
      return
    end
    local s = static_like(t)
    statics[#statics + 1] = { static = s, i = i, k = k }
    if k == nil then call_args[i] = s else call_args[i][k] = s end
  end)
  if why then
    local res = pack(self.fn(unpack(args, 1, args.n)))
    return { eager = true, why = why }, res
  end
  local prog, why_not, cap, res = record(self.fn, call_args)
  if cap.retry then
    if prog then ffi.gc(prog, nil); free_program(prog) end
    self.counts.retries = self.counts.retries + 1
    return { retry = cap.retry }, res
  end
  self.counts.captures = self.counts.captures + 1
  why = cap.read and ('it reads a value: ' .. cap.read) or why_not
  local slots
  if not why and #cap.items > 0 then slots, why = reads.plan(cap, cap.total, res) end
  if why then
    self.counts.breaks = self.counts.breaks + 1
    if prog then ffi.gc(prog, nil); free_program(prog) end
    return { eager = true, why = why }, res
  end
  local info = ffi.new('em_program_info')
  C.em_program_stats(prog, info)
  -- the fused calls by kind, and each distinct (kind, ops inside) with its count
  local fusions, inside, order = {}, {}, {}
  for k = 0, info.fused - 1 do
    local kind = ffi.string(C.em_program_fused(prog, k))
    fusions[kind] = (fusions[kind] or 0) + 1
    local what = kind .. ': ' .. ffi.string(C.em_program_fused_ops(prog, k))
    if not inside[what] then order[#order + 1] = what end
    inside[what] = (inside[what] or 0) + 1
  end
  local fused_lines = {}
  for i, what in ipairs(order) do
    fused_lines[i] = inside[what] > 1 and ('%s (x%d)'):format(what, inside[what]) or what
  end
  return { prog = prog, statics = statics, results = res, hooks = cap.hooks, after = cap.after,
           reads = slots,
           kernels = info.kernels, calls = info.calls, held = tonumber(info.held_bytes),
           fused = info.fused, fusions = fusions, fused_lines = fused_lines,
           checks = self.check }, own(res)
end

-- Runs fn eagerly while recording, and raises where its calls differ from e's.
function Compiled:check_against(e, args)
  local now, _, cap, res = record(self.fn, args)
  -- (a run that skipped a guarded stretch, as a scaler on inf, recorded less)
  if cap.retry then return res end
  local i = C.em_program_compare(e.prog, now)
  if i >= 0 or cap.read then
    local function op(p) local s = C.em_program_op(p, i); return s ~= nil and ffi.string(s) or 'the end' end
    local was, is = op(e.prog), op(now)
    if was == is then is = is .. ' with other arguments (scalars, shapes, dtypes or strides)' end
    raise(cap.read and ('compile: check: the step now reads a value (%s), which the captured ' ..
      'step did not'):format(cap.read) or
      ('compile: check: call %d of the step differs from the captured one: captured %s, now %s ' ..
      '(fn branches on data or on a value that is not an argument)'):format(i + 1, was, is))
  end
  return res
end

function Compiled:__call(...)
  local args = pack(...)
  if disabled() then return self.fn(...) end
  local key = signature(args)
  local e = self.cache[key]
  if not e then
    local res
    e, res = self:capture(key, args)
    if e.retry then
      self.retried = e.retry
    else
      self.cache[key] = e
      self.order[#self.order + 1] = key
    end
    return unpack(res, 1, res.n)
  end
  if e.eager then
    self.counts.eager = self.counts.eager + 1
    return self.fn(...)
  end
  if C.em_program_ready(e.prog) == 0 then
    -- a .grad the captured step did not have: the eager step accumulates into it
    self.counts.eager = self.counts.eager + 1
    e.not_ready = (e.not_ready or 0) + 1
    return self.fn(...)
  end
  if e.checks and e.checks > 0 then
    e.checks = e.checks - 1
    local res = self:check_against(e, args)
    return unpack(res, 1, res.n)
  end
  for _, s in ipairs(e.statics) do fill(s.static, at(args, s.i, s.k)) end
  for _, h in ipairs(e.hooks) do h(e.prog) end
  core.check(C.em_program_run(S, e.prog))
  for _, h in ipairs(e.after) do h(e.prog) end
  self.counts.replays = self.counts.replays + 1
  local res = own(e.results)
  if e.reads then reads.fill(res, e.reads) end
  return unpack(res, 1, res.n)
end

-- {captures, replays, breaks, eager, retries, fused, fusions, ops, kernels, peak_bytes}:
-- calls, kernel calls and fused calls of the captured steps (each signature's),
-- fusions the fused calls by kind ({conv2d_relu = 2, ...}), peak_bytes the memory
-- their programs hold between calls.
function Compiled:stats()
  local s = { captures = self.counts.captures, replays = self.counts.replays,
              breaks = self.counts.breaks, eager = self.counts.eager,
              retries = self.counts.retries, fused = 0, ops = 0, kernels = 0, peak_bytes = 0,
              fusions = {} }
  for _, key in ipairs(self.order) do
    local e = self.cache[key]
    if not e.eager then
      s.ops, s.kernels, s.fused = s.ops + e.calls, s.kernels + e.kernels, s.fused + e.fused
      s.peak_bytes = s.peak_bytes + e.held
      for kind, n in pairs(e.fusions) do s.fusions[kind] = (s.fusions[kind] or 0) + n end
    end
  end
  return s
end

-- "3 fused: 2 conv2d_relu, 1 relu_backward", or "none fused"
local function fused_words(e)
  local kinds = {}
  for kind, n in pairs(e.fusions) do kinds[#kinds + 1] = n .. ' ' .. kind end
  table.sort(kinds)
  return #kinds == 0 and 'none fused' or ('%d fused: %s'):format(e.fused, table.concat(kinds, ', '))
end

-- Each signature: replayed, or eager and why.
function Compiled:explain()
  local lines = {}
  if disabled() then lines[1] = 'EMBER_COMPILE=0: every call runs eagerly' end
  for n, key in ipairs(self.order) do
    local e = self.cache[key]
    if e.eager then
      lines[#lines + 1] = ('signature %d: runs eagerly: %s'):format(n, e.why)
    else
      lines[#lines + 1] = ('signature %d: replayed: %d kernel calls (%s), %.2f MiB held%s')
        :format(n, e.kernels, fused_words(e), e.held / 2 ^ 20, e.not_ready and (', ran eagerly %d times (a .grad was set ' ..
        'before the call)'):format(e.not_ready) or '')
    end
    lines[#lines + 1] = '  ' .. key
    for _, f in ipairs(e.fused_lines or {}) do lines[#lines + 1] = '  fused ' .. f end
  end
  if self.retried then
    lines[#lines + 1] = ('captures not kept: %d (the last because %s; the next call captures ' ..
      'again)'):format(self.counts.retries, self.retried)
  end
  if #lines == 0 then lines[1] = 'not called yet' end
  return table.concat(lines, '\n')
end

function M.compile(fn, opts)
  if type(fn) ~= 'function' and not (type(fn) == 'table' and getmetatable(fn) and
      getmetatable(fn).__call) then
    raise('compile: expected a function, got ' .. kind(fn))
  end
  opts = opts or {}
  if type(opts) ~= 'table' then raise('compile: options must be a table, got ' .. kind(opts)) end
  for k in pairs(opts) do
    if k ~= 'check' and k ~= 'graph' then
      raise(("compile: unknown option '%s' (check, graph)"):format(tostring(k)))
    end
  end
  local check = opts.check
  if check == true then check = 2 elseif not check then check = 0 end
  return setmetatable({ fn = fn, cache = {}, order = {}, check = check,
    counts = { captures = 0, replays = 0, breaks = 0, eager = 0, retries = 0 } }, Compiled)
end

return M

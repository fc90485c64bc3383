--[[
ember.nn.recompute -- activation checkpointing: em.nn.checkpoint(fn, ...) and
the module form em.nn.Checkpoint(module).

The forward runs fn under no_grad, so none of its intermediate tensors is kept
for backward; it remembers the RNG state and, with the core's grad probe, which
tensors requiring grad fn read. The tensor results become views of one custom
autograd node (em.autograd.apply) whose inputs are the arguments requiring grad
plus the leaves requiring grad the probe saw (the parameters: found even when
no argument requires grad). A non-leaf requiring grad that fn reads but that is
no argument can't be rebuilt by recomputing, so it is an error.

The node's backward sets the remembered RNG state (so dropout draws the same
masks; the current state is put back after), runs fn again with grad mode on,
on detached copies of the arguments (requiring grad as the originals did), and
backpropagates the gradient through that fresh graph with
em.autograd.backward_capture, capturing the gradients of the copies and the
parameters. Those go back to the node's edges: the parameters' gradients then
accumulate in the outer backward, where their hooks (a wrapped model's
averaging) run when they are final. Checkpoints nest: an inner one runs plainly
under the outer forward's no_grad, and checkpoints itself during the recompute.

Several tensor results are packed into one node, the flat concatenation of the
floating ones (same dtype and device), which the results are views of, so the
recompute runs once per backward; other results pass through as they are.
]]
local ffi = require 'ffi'
local em = require 'ember'
local core = require 'ember.ffi'
local memlimit = require 'ember.memlimit'
local C, S, raise, kind, wrap = core.C, core.S, core.raise, core.kind, core.wrap
local box_t, istype = core.box_t, ffi.istype

local function pack(...) return { n = select('#', ...), ... } end
local function is_tensor(x) return istype(box_t, x) end
local function addr(t) return tonumber(ffi.cast('intptr_t', t._h)) end

-- The tensors fn made and dropped are garbage that only Lua's collector frees:
-- left to it, they would stay until the next collection and eat the memory
-- checkpointing saves -- or not, as its pace goes, which a plan of the step's
-- memory cannot foresee. When what fn allocated beyond its results passes
-- GARBAGE bytes, or a 64th of its device's memory where that is less
-- (memlimit.garbage_worth), they are collected at once (the cost of a
-- collection is small beside computing that much).
local GARBAGE = 8 * 2 ^ 20
local function worth(capacity) return memlimit.garbage_worth(capacity, GARBAGE) end
local function tidy(before, res, from)
  local kept, dev = 0, nil
  for i = from, res.n do
    local v = res[i]
    if is_tensor(v) then
      kept = kept + v:numel() * C.em_dtype_size(core.dtype_of(v._h))
      dev = dev or v.device
    end
  end
  local left = tonumber(C.em_memory_allocated(S)) - before - kept
  if left > worth(dev and memlimit.capacity(em, dev)) then core.collect() end
end

-- fn(...) under no_grad with a probe; returns its results and the probed tensors.
local function probed_forward(fn, args)
  local before = tonumber(C.em_memory_allocated(S))
  if C.em_grad_probe_begin(S) ~= 0 then core.fail() end
  local was = C.em_is_grad_enabled(S)
  C.em_set_grad_enabled(S, 0)
  local res = pack(pcall(fn, unpack(args, 1, args.n)))
  C.em_set_grad_enabled(S, was)
  local n = C.em_grad_probe_count(S)
  local buf = ffi.new('em_tensor*[?]', math.max(n, 1))
  local st = C.em_grad_probe_end(S, buf, n)
  if not res[1] then error(res[2], 0) end
  if st ~= 0 then core.fail() end
  local seen = {}
  for i = 1, n do seen[i] = wrap(buf[i - 1]) end
  tidy(before, res, 2)
  return res, seen
end

-- The floating tensor results (positions in res, which starts with pcall's true).
local function float_outputs(res)
  local pos = {}
  for i = 2, res.n do
    local v = res[i]
    if is_tensor(v) and core.is_float[core.dtype_of(v._h)] then pos[#pos + 1] = i end
  end
  return pos
end

-- One tensor standing for the results at pos: the result itself, or the flat
-- concatenation of them all.
local function packed(res, pos)
  if #pos == 1 then return res[pos[1]] end
  local first = res[pos[1]]
  local flat = {}
  for k, i in ipairs(pos) do
    local t = res[i]
    if t.dtype ~= first.dtype or t.device ~= first.device then
      raise(('checkpoint: results %d and %d differ in dtype or device (%s on %s, %s on %s); ' ..
        'several results must share them'):format(pos[1] - 1, i - 1, first.dtype,
        first.device, t.dtype, t.device))
    end
    flat[k] = t:reshape(-1)
  end
  return em.cat(flat, 1)
end

-- The results at pos as views of the node's output y.
local function unpacked(res, pos, y)
  if #pos == 1 then res[pos[1]] = y return end
  local at = 0
  for _, i in ipairs(pos) do
    local t = res[i]
    local n = t:numel()
    res[i] = y:narrow(1, at + 1, n):view(t.shape)
    at = at + n
  end
end

local function same_shape(sa, sb)
  if #sa ~= #sb then return false end
  for d = 1, #sa do if sa[d] ~= sb[d] then return false end end
  return true
end

local function checkpoint(fn, ...)
  if type(fn) ~= 'function' and not (type(fn) == 'table' and getmetatable(fn) and
      getmetatable(fn).__call) then
    raise('checkpoint: expected a function, got ' .. kind(fn))
  end
  if C.em_is_grad_enabled(S) == 0 then return fn(...) end
  local args = pack(...)
  local rng = em.get_rng_state()
  local res, seen = probed_forward(fn, args)

  -- the node's inputs: arguments requiring grad, then the leaves fn read
  local inputs, is_arg, arg_pos = {}, {}, {}
  for i = 1, args.n do
    local a = args[i]
    if is_tensor(a) then
      is_arg[addr(a)] = true
      if a.requires_grad then inputs[#inputs + 1] = a; arg_pos[#arg_pos + 1] = i end
    end
  end
  local params = {}
  for _, t in ipairs(seen) do
    if not is_arg[addr(t)] then
      if not t.is_leaf then
        raise(('checkpoint: the function reads a tensor of shape [%s] that requires grad, ' ..
          'is not a leaf and is not one of its arguments; its gradient can\'t flow through ' ..
          'the recomputation: pass it to checkpoint as an argument'):format(
          table.concat(t.shape, ',')))
      end
      params[#params + 1] = t
      inputs[#inputs + 1] = t
    end
  end
  local pos = float_outputs(res)
  if #inputs == 0 or #pos == 0 then return unpack(res, 2, res.n) end
  local value = packed(res, pos)
  -- the closure lives as long as the node: it must not hold the results (views
  -- of the node), only their shapes
  local shapes = {}
  for k, i in ipairs(pos) do shapes[k] = res[i].shape end

  local function backward(g)
    if not args then
      error('checkpoint: trying to backward through the graph a second time; the inputs ' ..
        'it recomputes from were freed by the first backward', 0)
    end
    local before = tonumber(C.em_memory_allocated(S))
    local now = em.get_rng_state()
    em.set_rng_state(rng)
    local copies, wrt = {}, {}
    for i = 1, args.n do copies[i] = args[i] end
    for _, i in ipairs(arg_pos) do
      local c = args[i]:detach():requires_grad_()
      copies[i] = c
      wrt[#wrt + 1] = c
    end
    for _, p in ipairs(params) do wrt[#wrt + 1] = p end
    local again = pack(pcall(em.enable_grad, fn, unpack(copies, 1, args.n)))
    em.set_rng_state(now)
    if not again[1] then error(again[2], 0) end
    local apos = float_outputs(again)
    local ok = #apos == #pos
    for k = 1, #pos do
      ok = ok and apos[k] == pos[k] and same_shape(again[apos[k]].shape, shapes[k])
    end
    if not ok then
      error('checkpoint: the recomputed forward returned other results than the first ' ..
        '(fn must compute the same thing when run again)', 0)
    end
    local root = em.enable_grad(packed, again, apos)
    if not root.requires_grad then return {} end
    local gs = em.autograd.backward_capture(root, g, wrt)
    -- as a node's saved tensors, the inputs go with the first backward; so does
    -- fn, which holds the module (and through it the model) until the node is
    -- freed, which may be a collection or more later
    again, root, copies, args, params, fn, rng = nil, nil, nil, nil, nil, nil, nil
    gs.n = #wrt
    tidy(before, gs, 1)
    return gs
  end
  jit.off(backward)

  -- (the gradients backward returns are its own: the core takes them over)
  local y = em.autograd.apply('checkpoint', value, inputs, backward, true)
  unpacked(res, pos, y)
  return unpack(res, 2, res.n)
end

return function(nn)
  nn.checkpoint = checkpoint
  -- (the garbage a checkpoint collects at once on a device of that capacity:
  -- the planner's replay, plan/pipeline.lua)
  nn._checkpoint_tidy_bytes = worth

  local Checkpoint = nn.Module:extend('Checkpoint')
  -- its module's parameters keep their names: a state_dict loads between the
  -- checkpointed and the plain model (nn/module.lua, gather_modules)
  Checkpoint.transparent = true
  function Checkpoint:init(module)
    if type(module) ~= 'table' or type(module.forward) ~= 'function' then
      raise('Checkpoint: expected a module, got ' .. kind(module))
    end
    self.module = module
  end
  function Checkpoint:forward(...)
    local m = self.module
    return checkpoint(function(...) return m:forward(...) end, ...)
  end
  nn.Checkpoint = Checkpoint
end

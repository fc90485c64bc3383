--[[
ember.optim -- optimizers and learning-rate schedules (API.md, "em.optim").

  local opt = em.optim.AdamW(model:parameters(), {lr = 1e-3})
  local sched = em.optim.OneCycleLR(opt, {max_lr = 1e-2, total_steps = 1000})
  ... loss:backward(); em.nn.utils.clip_grad_norm(params, 1.0); opt:step();
  opt:zero_grad(); sched:step()

This file holds what every optimizer shares (the Optimizer base: parameter
groups, opt.lr, zero_grad, state_dict / load_state_dict); sgd.lua and adam.lua
hold the update rules, lr_scheduler.lua the schedules, clip.lua
clip_grad_norm. Update rules follow PyTorch 1.13; a step updates the parameters
of a group with one C call per device and dtype (em_sgd_step_multi_,
em_adam_step_multi_ in core/ops/optim.c): on cuda one kernel launch for all of
them, on the CPU one fused pass per parameter.

Gradients are read and written through the C autograd API (em_tensor_grad,
em_tensor_set_grad), the same storage as t.grad.

State. opt.state[i] is the state of the i-th parameter (1-based, counted
across groups in order). state_dict() returns {state = {[i] = {...}},
param_groups = {{lr = ..., ..., params = {i, ...}}, ...}}: tensors, numbers,
booleans and strings only (the state tensors themselves, not copies);
load_state_dict copies them into the optimizer.
]]
local ffi = require 'ffi'
local core = require 'ember.ffi'
require 'ember.tensor'
local create = require 'ember.create'
local memory_kinds = require 'ember.memory_kinds'
local C, S, raise, kind = core.C, core.S, core.raise, core.kind
local box_t, istype = core.box_t, ffi.istype

local M = {}

-- -- Parameter groups -----------------------------------------------------------------
local function copy_value(v)
  if type(v) == 'table' then
    local t = {}
    for k, x in pairs(v) do t[k] = x end
    return t
  end
  return v
end

-- params: a list of tensors or a list of groups {params = {...}, lr = ..., ...}.
-- Returns the groups (each with .params and every default filled in).
local function make_groups(op, params, defaults)
  if istype(box_t, params) then params = { params } end
  if type(params) ~= 'table' then
    raise(('%s: expected a list of tensors or of parameter groups, got %s'):format(op,
      kind(params)))
  end
  if #params == 0 then raise(op .. ': got an empty parameter list') end
  local groups = {}
  if istype(box_t, params[1]) then
    groups[1] = { params = params }
  else
    for i, g in ipairs(params) do
      if type(g) ~= 'table' or g.params == nil then
        raise(('%s: parameter group %d must be a table with a params list, got %s'):format(
          op, i, kind(g)))
      end
      local ng = {}
      for k, v in pairs(g) do ng[k] = v end
      if istype(box_t, ng.params) then ng.params = { ng.params } end
      groups[i] = ng
    end
  end
  local seen = {}
  for gi, g in ipairs(groups) do
    local list = {}
    if type(g.params) ~= 'table' then
      raise(('%s: params of group %d must be a list of tensors, got %s'):format(op, gi,
        kind(g.params)))
    end
    for i, p in ipairs(g.params) do
      if not istype(box_t, p) then
        raise(('%s: parameter %d of group %d is a %s, not a tensor'):format(op, i, gi, kind(p)))
      end
      local key = tostring(ffi.cast('uintptr_t', p._h))
      if seen[key] then
        raise(('%s: parameter %d of group %d appears more than once'):format(op, i, gi))
      end
      seen[key] = true
      list[i] = p
    end
    g.params = list
    for k, v in pairs(defaults) do
      if g[k] == nil then g[k] = copy_value(v) end
    end
  end
  return groups
end

-- -- The base class ----------------------------------------------------------------------
local Optimizer = {}
M.Optimizer = Optimizer

-- opt.lr reads the first group's lr; writing it sets every group's.
local function opt_index(self, k)
  if k == 'lr' then return self.param_groups[1].lr end
  return self.class[k]
end
local function opt_newindex(self, k, v)
  if k == 'lr' then
    if type(v) ~= 'number' then raise('lr: expected a number, got ' .. kind(v)) end
    for _, g in ipairs(self.param_groups) do g.lr = v end
    return
  end
  rawset(self, k, v)
end

-- A new optimizer class: name (for messages), defaults, a check of a group's
-- hyper-parameters, and update(self, group, bucket), which updates the bucket's
-- parameters -- bucket[1 .. bucket.n] = {p = tensor, h = its handle, gh = its
-- gradient's handle, s = its state table, index}, all of one device and dtype --
-- in one C call and returns its em_status.
function M.class(name, defaults, check, update)
  local cls = setmetatable({ name = name, defaults = defaults, check = check,
                             update = update }, { __index = Optimizer })
  local mt = { __index = opt_index, __newindex = opt_newindex,
               __tostring = function(self) return name .. ' optimizer' end }
  return function(params, opts)
    if opts ~= nil and type(opts) ~= 'table' then
      raise(('%s: expected an options table, got %s'):format(name, kind(opts)))
    end
    opts = opts or {}
    local d = {}
    for k, v in pairs(defaults) do d[k] = v end
    for k, v in pairs(opts) do
      if defaults[k] == nil then
        raise(('%s: unknown option %s'):format(name, tostring(k)))
      end
      d[k] = v
    end
    local self = setmetatable({ class = cls, state = {}, defaults = d }, mt)
    self.param_groups = make_groups(name, params, d)
    for gi, g in ipairs(self.param_groups) do check(name, g, gi) end
    memory_kinds.register_optimizer(self)   -- the profiler's memory by kind counts it
    return self
  end
end

-- Checks that hyper-parameter k of group g is a number (>= lo when given).
function M.check_number(op, g, gi, k, lo)
  local v = g[k]
  if type(v) ~= 'number' or v ~= v or (lo and v < lo) then
    raise(('%s: %s must be a number%s, got %s%s'):format(op, k,
      lo and (' >= ' .. lo) or '', type(v) == 'number' and tostring(v) or kind(v),
      gi > 1 and (' (group ' .. gi .. ')') or ''))
  end
end

-- step([closure]): updates every parameter that has a gradient. With a closure
-- (which recomputes the loss), calls it first and returns its result.
function Optimizer:step(closure)
  if C.em_profile_active(S) ~= 0 then    -- the step as one span on the profile
    return require('ember.profile').hooks.optimizer_step((self.class.name or 'optimizer') ..
      '.step', self._step, self, closure)
  end
  return self:_step(closure)
end

function Optimizer:_step(closure)
  local loss
  if closure ~= nil then loss = closure() end
  local update, state = self.class.update, self.state
  local index = 0
  for _, g in ipairs(self.param_groups) do
    -- The parameters with a gradient, bucketed by device and dtype in order of
    -- first appearance: update() takes a bucket in one C call (one kernel launch
    -- on cuda), since one launch serves one device and one dtype.
    local buckets, keys = {}, {}
    for _, p in ipairs(g.params) do
      index = index + 1
      local h = p._h
      local gh = C.em_tensor_grad(h)
      if gh ~= nil then
        -- A non-contiguous gradient is copied first (the kernels walk flat memory),
        -- unless it is channels last as its parameter (one flat order for both).
        if C.em_tensor_is_contiguous(gh) == 0 and not (C.em_tensor_is_channels_last(gh) ~= 0
            and C.em_tensor_is_channels_last(h) ~= 0) then
          local st = C.em_contiguous(S, gh, core.out2)
          C.em_tensor_release(gh)
          if st ~= 0 then
            for _, key in ipairs(keys) do
              local b = buckets[key]
              for i = 1, b.n do C.em_tensor_release(b[i].gh) end
            end
            core.fail()
          end
          gh = core.out2[0]
        end
        local s = state[index]
        if s == nil then s = {}; state[index] = s end
        local key = tonumber(C.em_tensor_device(h)) * 64 + tonumber(C.em_tensor_dtype(h))
        local b = buckets[key]
        if b == nil then
          b = { n = 0 }
          buckets[key] = b
          keys[#keys + 1] = key
        end
        b.n = b.n + 1
        b[b.n] = { p = p, h = h, gh = gh, s = s, index = index }
      end
    end
    -- The gradients' handles are released whatever happens: an update that raises
    -- (its state ran out of memory, say) must not leave them held, and with them
    -- the gradients (a wrapped model's buckets) for the rest of the process.
    local failed, err = false, nil
    for _, key in ipairs(keys) do
      local b = buckets[key]
      if not failed then
        local ok, st = pcall(update, self, g, b)
        if not ok then failed, err = true, st else failed = st ~= 0 end
      end
      for i = 1, b.n do
        local it = b[i]
        C.em_tensor_release(it.gh)
        if next(it.s) == nil then state[it.index] = nil end  -- stateless rule (plain SGD)
      end
    end
    if err ~= nil then error(err, 0) end
    if failed then core.fail() end   -- the message of the failed call is still there
  end
  return loss
end

-- zero_grad([set_to_none = true]): drops every gradient (PyTorch 2's default),
-- or with false, zeroes them in place.
function Optimizer:zero_grad(set_to_none)
  for _, g in ipairs(self.param_groups) do
    for _, p in ipairs(g.params) do
      local h = p._h
      if set_to_none == false then
        local gh = C.em_tensor_grad(h)
        if gh ~= nil then
          local st = C.em_fill_(S, gh, 0)
          C.em_tensor_release(gh)
          if st ~= 0 then core.fail() end
        end
      elseif C.em_tensor_set_grad(S, h, nil) ~= 0 then
        core.fail()
      end
    end
  end
end

local function plain(v)
  if type(v) == 'table' then
    local t = {}
    for k, x in pairs(v) do t[k] = x end
    return t
  end
  return v
end

function Optimizer:state_dict()
  local groups, index = {}, 0
  for gi, g in ipairs(self.param_groups) do
    local ng = {}
    for k, v in pairs(g) do
      if k ~= 'params' then ng[k] = plain(v) end
    end
    ng.params = {}
    for i = 1, #g.params do
      index = index + 1
      ng.params[i] = index
    end
    groups[gi] = ng
  end
  local state = {}
  for i, s in pairs(self.state) do
    local ns = {}
    for k, v in pairs(s) do ns[k] = v end
    state[i] = ns
  end
  return { state = state, param_groups = groups }
end

-- Restores hyper-parameters and state saved by state_dict() of an optimizer
-- with the same groups and parameter shapes; tensors are copied (cast to the
-- parameter's dtype), so sd stays independent of the optimizer.
function Optimizer:load_state_dict(sd)
  local op = self.class.name .. ':load_state_dict'
  if type(sd) ~= 'table' or type(sd.param_groups) ~= 'table' then
    raise(op .. ': expected a table with state and param_groups, got ' .. kind(sd))
  end
  local groups = self.param_groups
  if #sd.param_groups ~= #groups then
    raise(('%s: the state has %d parameter groups, the optimizer %d'):format(op,
      #sd.param_groups, #groups))
  end
  local params = {}
  for gi, g in ipairs(groups) do
    local sg = sd.param_groups[gi]
    local n = type(sg.params) == 'table' and #sg.params or nil
    if n ~= #g.params then
      raise(('%s: group %d has %s parameters in the state, %d in the optimizer'):format(op,
        gi, tostring(n), #g.params))
    end
    for _, p in ipairs(g.params) do params[#params + 1] = p end
  end
  local state = {}
  for k, s in pairs(sd.state or {}) do
    local i = tonumber(k)
    local p = i and params[i]
    if not p then raise(('%s: state for parameter %s, which does not exist'):format(op,
      tostring(k))) end
    if type(s) ~= 'table' then raise(('%s: state %s is a %s'):format(op, tostring(k), kind(s))) end
    local ns = {}
    for name, v in pairs(s) do
      if istype(box_t, v) then
        if v:numel() ~= p:numel() then
          raise(('%s: state %s.%s has %d elements, the parameter %d'):format(op, tostring(k),
            name, v:numel(), p:numel()))
        end
        local t = create.empty_like(p)
        t:copy_(v:reshape(core.shape_of(p._h)))
        v = t
      else
        v = plain(v)
      end
      ns[name] = v
    end
    state[i] = ns
  end
  for gi, g in ipairs(groups) do
    for k, v in pairs(sd.param_groups[gi]) do
      if k ~= 'params' then g[k] = plain(v) end
    end
    self.class.check(self.class.name, g, gi)
  end
  rawset(self, 'state', state)
end

-- -- Contents ----------------------------------------------------------------------------
M.SGD = require('ember.optim.sgd')(M)
local adam = require('ember.optim.adam')(M)
M.Adam, M.AdamW = adam.Adam, adam.AdamW
local sched = require 'ember.optim.lr_scheduler'
for k, v in pairs(sched) do M[k] = v end
M.clip_grad_norm = require 'ember.optim.clip'
M.clip_grad_norm_ = M.clip_grad_norm

return M

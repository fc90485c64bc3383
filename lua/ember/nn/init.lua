--[[
ember.nn -- em.nn: Module (ember.nn.module), the layers (one file per family),
the losses, em.nn.F (ember.nn.functional; F.pad, F.rms_norm, F.group_norm and
attention join it from their layers' files), em.nn.init (ember.nn.initializers),
em.nn.Parameter, em.nn.utils.clip_grad_norm, and activation checkpointing
(em.nn.checkpoint, em.nn.Checkpoint: ember.nn.recompute).
]]
local em = require 'ember'
local core = require 'ember.ffi'
local _ = em.float32  -- load the core

local nn = {}
nn.Module = require 'ember.nn.module'
nn.F = require 'ember.nn.functional'
nn.functional = nn.F
nn.init = require 'ember.nn.initializers'

-- Parameter(t): t itself when it is a leaf (made to require grad), else a
-- detached leaf sharing its storage.
function nn.Parameter(t, requires_grad)
  if not em.is_tensor(t) then core.raise('Parameter: expected a tensor, got ' .. core.kind(t)) end
  if not t.is_leaf then t = t:detach() end
  return t:requires_grad_(requires_grad ~= false)
end

for _, f in ipairs({ 'linear', 'conv', 'pool', 'norm', 'activation', 'dropout', 'embedding',
  'container', 'loss', 'recompute', 'rnn', 'norm_more', 'pad', 'attention' }) do
  require('ember.nn.' .. f)(nn)
end
-- autocast's lists, for the F functions those files added
require('ember.amp.policy').wrap_functional(nn.F)

local clip = require 'ember.optim.clip'
nn.utils = { clip_grad_norm = clip, clip_grad_norm_ = clip }

return nn

--[[
ember.amp -- mixed precision: em.amp.autocast(dtype, fn, ...) runs fn with
matmul, linear and conv in bfloat16/float16 and softmax, the norms, losses,
reductions and exp/log/pow in float32 (the lists and hooks are in
ember.amp.policy), and em.amp.GradScaler{...} scales the loss so that float16
gradients do not underflow, skipping steps whose gradients overflowed
(ember.amp.scaler).
]]
local P = require 'ember.amp.policy'

local M = {}

-- autocast(dtype, fn, ...): fn's results; nests; the previous setting comes back
-- on return and on error. dtype false turns autocast off inside.
M.autocast = P.run

-- The dtype name autocast is in, or nil outside any region.
M.autocast_dtype = P.dtype

M.GradScaler = require 'ember.amp.scaler'

return M

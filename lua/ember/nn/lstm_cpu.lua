--[[
ember.nn.lstm_cpu -- nn.LSTM's time loop on the CPU, one direction of one layer,
with each step's pointwise part in one fused kernel (em_cpu_lstm_cell_forward
and _backward, core/cpu/rnn_cell.c) between its recurrent matmuls.
ember.nn.rnn_recurrence hands float32 and float64 CPU sequences here and
composes the same arithmetic from ops on other devices.

Why: composed, a step's cell is a dozen elementwise ops forward and twice that
backward, each a pass over the gates, a fresh tensor and a dispatch from Lua.
Fused, a step is its matmul and one pass each way; the matmuls are then most of
what is left.

The node is the same as the composed one's: inputs {xw, w_hh, h0, c0}, value
(T + 1, N, H) with the h of each step in time order and the final c last. The
forward keeps per step the gate activations (written over the gates), c and the
h it started from; the backward writes each step's gate gradients into one
(T, N, 4H) tensor and makes weight_hh's gradient one matmul over every step.
]]
local em = require 'ember'
local core = require 'ember.ffi'
local C, S, check = core.C, core.S, core.check
local release = core.handles.release

local code = { float32 = C.EM_FLOAT32, float64 = C.EM_FLOAT64 }
local function ptr(t) return C.em_tensor_data(t._h) end

local M = {}

-- Whether the fused kernels serve this sequence.
function M.serves(xs) return xs.device == 'cpu' and code[xs.dtype] ~= nil end

-- (shared with the composed loop of ember.nn.rnn_recurrence)
-- The forward's end: the final c into the value's last row (T + 1); without a
-- backward to come, the last h and c go now. Returns v.
function M.close_value(v, h, c, h0, c0, keep)
  local vc = v[v.shape[1]]
  vc:copy_(c)
  release(vc)
  if not keep then
    if h ~= h0 then release(h) end
    if c ~= c0 then release(c) end
  end
  return v
end

-- The node's gradients: the gates' dG (T, N, 4H; xw's as they are), weight_hh's
-- (one matmul over every step's gate gradients and the h it started from, in
-- time order), h0's dh and c0's dc.
function M.node_grads(dG, hprev, dh, dc)
  local T, N, G = dG.shape[1], dG.shape[2], dG.shape[3]
  local hp = {}
  for t = 1, T do hp[t] = hprev[t] end
  local dw = dG:reshape(T * N, G):t():mm(em.stack(hp, 1):reshape(T * N, G / 4))
  return { dG, dw, dh, dc }
end

-- A direction's results from its value or node (T + 1, N, H): the h of each step
-- in time order, the last step's h (last: its time index) and the final c.
function M.results(value, T, last)
  local out = {}
  for t = 1, T do out[t] = value[t] end
  return out, value[last], value[T + 1]
end

-- xw: (T, N, 4H), the input's projection with the biases; order: the steps in
-- the order they run; keep: whether a gradient will be asked for. Returns the
-- list of h per step (in time order), the last h and the last c.
function M.direction(F, w_hh, xw, h0, c0, order, keep)
  local T, N, Hd = xw.shape[1], xw.shape[2], w_hh.shape[2]
  local dt = code[xw.dtype]
  -- (the state given may be a view of the caller's (L * D, N, H) tensor)
  h0, c0 = h0:contiguous(), c0:contiguous()
  local acts, cs, hprev = {}, {}, {}
  local value = em.no_grad(function()
    local v = em.empty({ T + 1, N, Hd }, { dtype = xw.dtype })
    local h, c = h0, c0
    for _, t in ipairs(order) do
      -- (the kernel adds the input's projection xt to the recurrent product)
      local xt = xw[t]
      local g = F.linear(h, w_hh):contiguous()
      local hn, cn = em.empty({ N, Hd }, { dtype = xw.dtype }), em.empty({ N, Hd }, { dtype = xw.dtype })
      check(C.em_cpu_lstm_cell_forward(S, dt, N, Hd, ptr(g), ptr(xt), ptr(c), ptr(g), ptr(hn), ptr(cn)))
      release(xt)
      -- (the output is a copy: a caller's in-place change to it leaves the
      -- h the backward reads alone)
      local vt = v[t]
      vt:copy_(hn)
      release(vt)
      if keep then
        hprev[t], acts[t], cs[t] = h, g, cn
      else
        release(g)
        if h ~= h0 then release(h) end
        if c ~= c0 then release(c) end
      end
      h, c = hn, cn
    end
    return M.close_value(v, h, c, h0, c0, keep)
  end)
  if not keep then return M.results(value, T, order[T]) end
  local node = em.autograd.apply('lstm', value, { xw, w_hh, h0, c0 }, function(grad)
    return em.no_grad(function()
      -- (a sum's gradient comes expanded, with zero strides: the kernel reads rows)
      grad = grad:contiguous()
      local dG = em.empty({ T, N, 4 * Hd }, { dtype = grad.dtype })
      local dc = grad[T + 1]:clone()
      local dh = nil
      for s = T, 1, -1 do
        local t = order[s]
        local cprev = s > 1 and cs[order[s - 1]] or c0
        local gy, d = grad[t], dG[t]
        check(C.em_cpu_lstm_cell_backward(S, dt, N, Hd, ptr(acts[t]), ptr(cs[t]), ptr(cprev),
          ptr(gy), dh and ptr(dh) or nil, ptr(dc), ptr(d)))
        release(gy)
        if dh then release(dh) end
        dh = d:mm(w_hh)
        release(d)
      end
      return M.node_grads(dG, hprev, dh, dc)
    end)
  end)
  return M.results(node, T, order[T])
end

return M

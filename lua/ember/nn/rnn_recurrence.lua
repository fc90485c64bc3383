--[[
ember.nn.rnn_recurrence -- the time loops of nn.LSTM and nn.GRU (ember.nn.rnn),
one direction of one layer each, as one autograd node with the cell's
closed-form backward.

Why a node of its own: left to autograd op by op, every step's gate views each
get a zero-filled gradient of all the gates, every step makes its own weight_hh
gradient to add up, and each intermediate waits for Lua's collector -- three
times the arithmetic's work. Here the forward keeps, per step, only what the
backward reads (the gate activations, and c or the recurrent product), and only
when a gradient will be asked for; every other intermediate is released as soon
as it is dead, so the next step's tensors reuse its blocks from the cache. The
backward walks the steps in reverse under no_grad, writes each step's gate
gradients into one (T, N, G * H) tensor -- the input projection's gradient as it
is -- and makes weight_hh's gradient one matmul over every step.

  local rec = require('ember.nn.rnn_recurrence')(em.nn.F)
  out, h_n, c_n = rec.lstm_direction(m, sfx, xs, h0, c0, reverse)
  out, h_n = rec.gru_direction(m, sfx, xs, h0, nil, reverse)

xs is (T, N, in); out the list of h per step, in time order.
]]
local em = require 'ember'
local core = require 'ember.ffi'
local release = core.handles.release
local lstm_cpu = require 'ember.nn.lstm_cpu'

return function(F)
local M = {}

-- The time order of the steps, and whether a gradient will be asked for.
local function steps(T, reverse)
  local order = {}
  for s = 1, T do order[s] = reverse and T - s + 1 or s end
  return order
end
local function wants_grad(list)
  if not em.is_grad_enabled() then return false end
  for _, t in ipairs(list) do if t ~= nil and t.requires_grad then return true end end
  return false
end

-- The recurrence is one autograd node with a backward of its own (an LSTM's
-- gradient is a known closed form): per time step the forward keeps the gate
-- activations, and the backward walks the steps in reverse with a handful of
-- whole-tensor ops under no_grad, writing each step's gate gradients into one
-- (T, N, 4H) tensor; the weight_hh gradient is then one matmul over every step,
-- and the gates' input gradient is that tensor itself. Left to autograd op by
-- op, each step's gate views would each get a zero-filled gradient of all four
-- gates and each step its own weight_hh gradient to add up: three times the
-- work of the arithmetic.
--
-- xw: (T, N, 4H), the input's projection with the biases (autograd's); returns
-- the list of h per step (in time order) and the final states.
function M.lstm_direction(m, sfx, xs, h0, c0, reverse)
  local T, N, Hd = xs.shape[1], xs.shape[2], m.hidden_size
  local w_ih, w_hh = m['weight_ih_' .. sfx], m['weight_hh_' .. sfx]
  local b = nil
  if m.bias then b = m['bias_ih_' .. sfx] + m['bias_hh_' .. sfx] end
  local xw = F.linear(xs:reshape(T * N, xs.shape[3]), w_ih, b):reshape(T, N, 4 * Hd)
  local order = steps(T, reverse)
  -- The forward keeps, per step, the sigmoid gates (N, 4H; g's slot unused),
  -- tanh(g), c and the h it started from -- only when a gradient will be asked
  -- for. Every other intermediate is released as soon as it is dead, so the
  -- next step's tensors reuse its blocks (still in cache) instead of fresh
  -- memory from the system, which costs more than the arithmetic at these sizes.
  local keep = wants_grad({ xw, w_hh, h0, c0 })
  -- (on the CPU each step's cell is one fused kernel: ember.nn.lstm_cpu)
  if lstm_cpu.serves(xs) then return lstm_cpu.direction(F, w_hh, xw, h0, c0, order, keep) end
  local sg, tg, cs, hprev = {}, {}, {}, {}
  local value = em.no_grad(function()
    local v = em.empty({ T + 1, N, Hd }, { dtype = xs.dtype, device = xs.device })
    local h, c = h0, c0
    for _, t in ipairs(order) do
      local xt = xw[t]
      local g = F.linear(h, w_hh, xt)
      release(xt)
      local sgt = g:sigmoid()
      local gv = g:narrow(2, 2 * Hd + 1, Hd)
      local tgt = gv:tanh()
      release(gv); release(g)
      local iv, fv, ov = sgt:narrow(2, 1, Hd), sgt:narrow(2, Hd + 1, Hd), sgt:narrow(2, 3 * Hd + 1, Hd)
      local fc, it = fv * c, iv * tgt
      local cn = fc + it
      local tc = cn:tanh()
      local hn = ov * tc
      release(fc); release(it); release(tc); release(iv); release(fv); release(ov)
      local vt = v[t]
      vt:copy_(hn)
      release(vt)
      if keep then
        hprev[t], sg[t], tg[t], cs[t] = h, sgt, tgt, cn
      else
        release(sgt); release(tgt)
        if h ~= h0 then release(h) end
        if c ~= c0 then release(c) end
      end
      h, c = hn, cn
    end
    return lstm_cpu.close_value(v, h, c, h0, c0, keep)
  end)
  if not keep then return lstm_cpu.results(value, T, order[T]) end
  local node = em.autograd.apply('lstm', value, { xw, w_hh, h0, c0 }, function(grad)
    return em.no_grad(function()
      local dG = em.empty({ T, N, 4 * Hd }, { dtype = grad.dtype, device = grad.device })
      local dh, dc = nil, grad[T + 1]
      for s = T, 1, -1 do
        local t = order[s]
        local gt = sg[t]
        local i, f, o = gt:narrow(2, 1, Hd), gt:narrow(2, Hd + 1, Hd), gt:narrow(2, 3 * Hd + 1, Hd)
        local g = tg[t]
        local cprev = s > 1 and cs[order[s - 1]] or c0
        local gy = grad[t]
        local dy = gy
        if dh then dy = gy + dh; release(gy); release(dh) end
        local tc = cs[t]:tanh()
        -- dc += dy o (1 - tc^2)
        local a = tc * tc
        local b = 1 - a
        local e = dy * o
        local q = e * b
        local dc2 = dc + q
        release(a); release(b); release(e); release(q); release(dc)
        dc = dc2
        local d = dG[t]
        -- (each gate's gradient: the product of four factors, written in place)
        local function put(at, x1, x2, x3, x4)
          local v = d:narrow(2, at, Hd)
          local p1 = x1 * x2
          local p2 = p1 * x3
          v:copy_(x4 and p2:mul_(x4) or p2)
          release(p1); release(p2); release(v)
        end
        local om, im, fm, gg = 1 - o, 1 - i, 1 - f, g * g
        local gm = 1 - gg
        put(3 * Hd + 1, dy, tc, o, om)
        put(1, dc, g, i, im)
        put(2 * Hd + 1, dc, i, gm)
        put(Hd + 1, dc, cprev, f, fm)
        release(om); release(im); release(fm); release(gg); release(gm); release(tc)
        release(dy)
        local dcf = dc * f
        release(dc); release(i); release(f); release(o)
        dc = dcf
        dh = d:mm(w_hh)
        release(d)
      end
      return lstm_cpu.node_grads(dG, hprev, dh, dc)
    end)
  end)
  return lstm_cpu.results(node, T, order[T])
end


-- GRU: r, z = sigmoid(x_rz + h W_rz + b_rz); n = tanh(x_n + r (h W_n + b_n));
-- h' = n + z (h - n). The forward keeps r|z, n, the recurrent product
-- (h W_n + b_n) and the h each step started from.
function M.gru_direction(m, sfx, xs, h0, _, reverse)
  local T, N, Hd = xs.shape[1], xs.shape[2], m.hidden_size
  local w_ih, w_hh = m['weight_ih_' .. sfx], m['weight_hh_' .. sfx]
  local b_ih, b_hh = m['bias_ih_' .. sfx], m['bias_hh_' .. sfx]
  local xw = F.linear(xs:reshape(T * N, xs.shape[3]), w_ih, b_ih):reshape(T, N, 3 * Hd)
  local order = steps(T, reverse)
  local keep = wants_grad({ xw, w_hh, b_hh, h0 })
  local rzs, ns, hns, hprev = {}, {}, {}, {}
  local value = em.no_grad(function()
    local v = em.empty({ T, N, Hd }, { dtype = xs.dtype, device = xs.device })
    local h = h0
    for _, t in ipairs(order) do
      local xt = xw[t]
      local hw = F.linear(h, w_hh, b_hh)
      local xa, ha = xt:narrow(2, 1, 2 * Hd), hw:narrow(2, 1, 2 * Hd)
      local pre = xa + ha
      local rz = pre:sigmoid()
      release(pre); release(xa); release(ha)
      local r, z = rz:narrow(2, 1, Hd), rz:narrow(2, Hd + 1, Hd)
      local hn = hw:narrow(2, 2 * Hd + 1, Hd)
      local xn = xt:narrow(2, 2 * Hd + 1, Hd)
      local rh = r * hn
      local pn = xn + rh
      local n = pn:tanh()
      release(rh); release(pn); release(xn); release(xt)
      local d = h - n
      local zd = z * d
      local hnew = n + zd
      release(d); release(zd); release(r); release(z)
      local vt = v[t]
      vt:copy_(hnew)
      release(vt)
      if keep then
        hprev[t], rzs[t], ns[t], hns[t] = h, rz, n, hn
      else
        release(rz); release(n); release(hn)
        if h ~= h0 then release(h) end
      end
      release(hw)
      h = hnew
    end
    if not keep and h ~= h0 then release(h) end
    return v
  end)
  if not keep then
    local out = {}
    for t = 1, T do out[t] = value[t] end
    return out, value[order[T]], nil
  end
  local inputs = { xw, w_hh, h0 }
  if b_hh then inputs[4] = b_hh end
  local node = em.autograd.apply('gru', value, inputs, function(grad)
    return em.no_grad(function()
      local dX = em.empty({ T, N, 3 * Hd }, { dtype = grad.dtype, device = grad.device })
      local dH = em.empty({ T, N, 3 * Hd }, { dtype = grad.dtype, device = grad.device })
      local dh = nil
      for s = T, 1, -1 do
        local t = order[s]
        local rz, n, hn, hp = rzs[t], ns[t], hns[t], hprev[t]
        local r, z = rz:narrow(2, 1, Hd), rz:narrow(2, Hd + 1, Hd)
        local gy = grad[t]
        local dy = gy
        if dh then dy = gy + dh; release(gy); release(dh) end
        local dx, dhh = dX[t], dH[t]
        -- n: dn = dy (1 - z), through tanh: da = dn (1 - n^2)
        local omz, nn2 = 1 - z, n * n
        local omn = 1 - nn2
        local dn = dy * omz
        local da = dn * omn
        release(omz); release(nn2); release(omn); release(dn)
        local xn_, hn_ = dx:narrow(2, 2 * Hd + 1, Hd), dhh:narrow(2, 2 * Hd + 1, Hd)
        xn_:copy_(da)
        local dar = da * r
        hn_:copy_(dar)
        release(dar); release(xn_); release(hn_)
        -- r: dr = da (h W_n + b_n), through the sigmoid
        local dr = da * hn
        local omr = 1 - r
        local dr1 = dr * r
        local dar2 = dr1 * omr
        release(dr); release(omr); release(dr1); release(da)
        -- z: dz = dy (h - n), through the sigmoid
        local hmn = hp - n
        local dz = dy * hmn
        local omz2 = 1 - z
        local dz1 = dz * z
        local daz = dz1 * omz2
        release(hmn); release(dz); release(omz2); release(dz1)
        for _, part in ipairs({ { dx, 1, dar2 }, { dx, Hd + 1, daz }, { dhh, 1, dar2 }, { dhh, Hd + 1, daz } }) do
          local w = part[1]:narrow(2, part[2], Hd)
          w:copy_(part[3])
          release(w)
        end
        release(dar2); release(daz)
        -- h: directly through z, and through every recurrent product
        local dzh = dy * z
        local back = dhh:mm(w_hh)
        dh = dzh + back
        release(dzh); release(back); release(dy); release(r); release(z)
        release(dx); release(dhh)
      end
      local hp = {}
      for t = 1, T do hp[t] = hprev[t] end
      local flat = dH:reshape(T * N, 3 * Hd)
      local dw = flat:t():mm(em.stack(hp, 1):reshape(T * N, Hd))
      local db = b_hh and flat:sum(1) or nil
      return { dX, dw, dh, db }
    end)
  end)
  local out = {}
  for t = 1, T do out[t] = node[t] end
  return out, node[order[T]], nil
end

return M
end

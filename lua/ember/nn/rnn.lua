--[[
ember.nn.rnn -- LSTM and GRU, PyTorch's layers (names, options, gate order,
parameter names and initialisation, so a PyTorch state_dict loads):

  nn.LSTM(input_size, hidden_size, {num_layers = 1, bias = true, batch_first = false,
    dropout = 0, bidirectional = false, dtype})
  y, {h_n, c_n} = lstm(x[, {h0, c0}])
  nn.GRU(input_size, hidden_size, {same options})
  y, h_n = gru(x[, h0])

x is (T, N, input_size), (N, T, input_size) with batch_first, or (T, input_size)
unbatched; y is (T, N, D * hidden_size) (D = 2 when bidirectional); h_n and c_n
are (num_layers * D, N, hidden_size), layer by layer, the forward direction first.
Parameters weight_ih_l{k}, weight_hh_l{k}, bias_ih_l{k}, bias_hh_l{k} (suffix
_reverse for the backward direction), all U(-1/sqrt(hidden), 1/sqrt(hidden)).
Gates: LSTM i, f, g, o; GRU r, z, n.

Each layer and direction multiplies the whole sequence by weight_ih in one
matmul (with the biases that can be added there); each time step then does one
matmul by weight_hh and the gate math in a few whole-tensor ops (one sigmoid
over all the gates, views for each). The GRU's gradient comes from those core
ops; the LSTM's recurrence is one autograd node with its closed-form backward
(lstm_direction). Both are core ops only, so every backend runs them.
]]
local em = require 'ember'
local core = require 'ember.ffi'
local raise, kind = core.raise, core.kind
local release = core.handles.release

return function(nn)
  local Module, F, I = nn.Module, nn.F, nn.init

  local function shape_str(t) return '[' .. table.concat(t.shape, ',') .. ']' end

  local function make(name, gates)
    local cls = Module:extend(name)

    function cls:init(input_size, hidden_size, opts)
      if type(input_size) ~= 'number' or input_size < 1 or input_size % 1 ~= 0 then
        raise(('%s: input_size must be a positive integer, got %s'):format(name, tostring(input_size)))
      end
      if type(hidden_size) ~= 'number' or hidden_size < 1 or hidden_size % 1 ~= 0 then
        raise(('%s: hidden_size must be a positive integer, got %s'):format(name, tostring(hidden_size)))
      end
      if opts ~= nil and type(opts) ~= 'table' then
        raise(name .. ': expected an options table as argument 3, got ' .. kind(opts))
      end
      opts = opts or {}
      local L = opts.num_layers or 1
      if type(L) ~= 'number' or L < 1 or L % 1 ~= 0 then
        raise(('%s: num_layers must be a positive integer, got %s'):format(name, tostring(L)))
      end
      local p = opts.dropout or 0
      if type(p) ~= 'number' or p < 0 or p > 1 then
        raise(('%s: dropout must be a probability in [0, 1], got %s'):format(name, tostring(p)))
      end
      self.input_size, self.hidden_size, self.num_layers = input_size, hidden_size, L
      self.bias = opts.bias ~= false
      self.batch_first = opts.batch_first == true
      self.bidirectional = opts.bidirectional == true
      self.dropout = p
      local dt, k = opts.dtype or 'float32', 1 / math.sqrt(hidden_size)
      local D = self.bidirectional and 2 or 1
      local function param(...) return nn.Parameter(I.uniform_(em.empty({ ... }, { dtype = dt }), -k, k)) end
      for l = 0, L - 1 do
        local in_l = l == 0 and input_size or hidden_size * D
        for d = 1, D do
          local sfx = ('l%d%s'):format(l, d == 2 and '_reverse' or '')
          self['weight_ih_' .. sfx] = param(gates * hidden_size, in_l)
          self['weight_hh_' .. sfx] = param(gates * hidden_size, hidden_size)
          if self.bias then
            self['bias_ih_' .. sfx] = param(gates * hidden_size)
            self['bias_hh_' .. sfx] = param(gates * hidden_size)
          end
        end
      end
    end

    function cls:extra_repr()
      return ('%d, %d, num_layers=%d, bias=%s, batch_first=%s, dropout=%s, bidirectional=%s')
        :format(self.input_size, self.hidden_size, self.num_layers, tostring(self.bias),
          tostring(self.batch_first), tostring(self.dropout), tostring(self.bidirectional))
    end

    return cls
  end

  -- -- LSTM: one direction of one layer -----------------------------------------------
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
  local function lstm_direction(m, sfx, xs, h0, c0, reverse)
    local T, N, Hd = xs.shape[1], xs.shape[2], m.hidden_size
    local w_ih, w_hh = m['weight_ih_' .. sfx], m['weight_hh_' .. sfx]
    local b = nil
    if m.bias then b = m['bias_ih_' .. sfx] + m['bias_hh_' .. sfx] end
    local xw = F.linear(xs:reshape(T * N, xs.shape[3]), w_ih, b):reshape(T, N, 4 * Hd)
    local order = {}
    for s = 1, T do order[s] = reverse and T - s + 1 or s end
    -- The forward keeps, per step, the sigmoid gates (N, 4H; g's slot unused),
    -- tanh(g), c and the h it started from -- only when a gradient will be asked
    -- for. Every other intermediate is released as soon as it is dead, so the
    -- next step's tensors reuse its blocks (still in cache) instead of fresh
    -- memory from the system, which costs more than the arithmetic at these sizes.
    local keep = em.is_grad_enabled() and (xw.requires_grad or w_hh.requires_grad or
      h0.requires_grad or c0.requires_grad)
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
      local vc = v[T + 1]
      vc:copy_(c)
      release(vc)
      if not keep then
        if h ~= h0 then release(h) end
        if c ~= c0 then release(c) end
      end
      return v
    end)
    if not keep then
      local out = {}
      for t = 1, T do out[t] = value[t] end
      return out, value[order[T]], value[T + 1]
    end
    local first, last = order[1], order[T]
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
        -- every step's h it started from, in time order, as one (T * N, H) matrix
        local hp = {}
        for t = 1, T do hp[t] = hprev[t] end
        local dw = dG:reshape(T * N, 4 * Hd):t():mm(em.stack(hp, 1):reshape(T * N, Hd))
        return { dG, dw, dh, dc }
      end)
    end)
    local out = {}
    for t = 1, T do out[t] = node[t] end
    return out, node[last], node[T + 1]
  end

  local function gru_direction(m, sfx, xs, h, _, reverse)
    local T, N, Hd = xs.shape[1], xs.shape[2], m.hidden_size
    local w_ih, w_hh = m['weight_ih_' .. sfx], m['weight_hh_' .. sfx]
    local b_ih, b_hh = m['bias_ih_' .. sfx], m['bias_hh_' .. sfx]
    local xw = F.linear(xs:reshape(T * N, xs.shape[3]), w_ih, b_ih):reshape(T, N, 3 * Hd)
    local out = {}
    for s = 1, T do
      local t = reverse and T - s + 1 or s
      local x_t, hw = xw[t], F.linear(h, w_hh, b_hh)
      local rz = (x_t:narrow(2, 1, 2 * Hd) + hw:narrow(2, 1, 2 * Hd)):sigmoid()
      local n = (x_t:narrow(2, 2 * Hd + 1, Hd) + rz:narrow(2, 1, Hd) * hw:narrow(2, 2 * Hd + 1, Hd)):tanh()
      h = n + rz:narrow(2, Hd + 1, Hd) * (h - n)   -- (1 - z) n + z h
      out[t] = h
    end
    return out, h, nil
  end

  -- Checks a given initial state against (L * D, N, H) and the input.
  local function check_state(m, what, st, want, x)
    if not em.is_tensor(st) then
      raise(('%s: %s must be a tensor %s, got %s'):format(m.__name, what,
        '[' .. table.concat(want, ',') .. ']', kind(st)))
    end
    local ok = st:dim() == #want
    for i = 1, #want do ok = ok and st.shape[i] == want[i] end
    if not ok then
      raise(('%s: %s %s must be [%s] (num_layers * directions, batch, hidden_size) for input %s')
        :format(m.__name, what, shape_str(st), table.concat(want, ','), shape_str(x)))
    end
    if st.dtype ~= x.dtype or st.device ~= x.device then
      raise(('%s: %s is %s on %s but the input is %s on %s'):format(m.__name, what, st.dtype,
        st.device, x.dtype, x.device))
    end
  end

  local function run(m, x, state, direction, is_lstm)
    local name = m.__name
    if not em.is_tensor(x) then raise(name .. ': expected a tensor as input, got ' .. kind(x)) end
    local batched = x:dim() == 3
    if not (batched or x:dim() == 2) or x.shape[x:dim()] ~= m.input_size then
      raise(('%s: input %s must be %s with input_size %d last (or unbatched (T, %d))')
        :format(name, shape_str(x), m.batch_first and '(N, T, input_size)' or '(T, N, input_size)',
          m.input_size, m.input_size))
    end
    local w = m.weight_ih_l0
    if x.dtype ~= w.dtype or x.device ~= w.device then
      raise(('%s: input is %s on %s but the parameters are %s on %s; move one with :to(...)')
        :format(name, x.dtype, x.device, w.dtype, w.device))
    end
    local x0 = x
    if not batched then x = x:unsqueeze(2)
    elseif m.batch_first then x = x:transpose(1, 2) end
    local N, Hd, D = x.shape[2], m.hidden_size, m.bidirectional and 2 or 1
    local LD = m.num_layers * D
    local want = batched and { LD, N, Hd } or { LD, Hd }
    local h0, c0
    if state ~= nil then
      if is_lstm then
        if type(state) ~= 'table' or em.is_tensor(state) then
          raise(name .. ': the initial state must be a pair {h0, c0}, got ' .. kind(state))
        end
        h0, c0 = state[1], state[2]
        check_state(m, 'h0', h0, want, x0)
        check_state(m, 'c0', c0, want, x0)
      else
        h0 = state
        check_state(m, 'h0', h0, want, x0)
      end
      if not batched then
        h0 = h0:unsqueeze(2)
        if c0 then c0 = c0:unsqueeze(2) end
      end
    end
    local zeros = nil
    if h0 == nil or (is_lstm and c0 == nil) then
      zeros = em.zeros({ N, Hd }, { dtype = x.dtype, device = x.device })
    end
    local hn, cn = {}, {}
    local layer_in = x
    for l = 0, m.num_layers - 1 do
      local outs = {}
      for d = 1, D do
        local idx = l * D + d
        local sfx = ('l%d%s'):format(l, d == 2 and '_reverse' or '')
        local h = h0 and h0[idx] or zeros
        local c = is_lstm and (c0 and c0[idx] or zeros) or nil
        local seq, hT, cT = direction(m, sfx, layer_in, h, c, d == 2)
        outs[d] = em.stack(seq, 1)
        hn[idx], cn[idx] = hT, cT
      end
      layer_in = D == 2 and em.cat(outs, 3) or outs[1]
      if m.dropout > 0 and m.training and l < m.num_layers - 1 then
        layer_in = F.dropout(layer_in, m.dropout, true)
      end
    end
    local y = layer_in
    local h_n, c_n = em.stack(hn, 1), is_lstm and em.stack(cn, 1) or nil
    if not batched then
      y, h_n = y:squeeze(2), h_n:squeeze(2)
      if c_n then c_n = c_n:squeeze(2) end
    elseif m.batch_first then
      y = y:transpose(1, 2)
    end
    if is_lstm then return y, { h_n, c_n } end
    return y, h_n
  end

  local LSTM = make('LSTM', 4)
  function LSTM:forward(x, state) return run(self, x, state, lstm_direction, true) end
  nn.LSTM = LSTM

  local GRU = make('GRU', 3)
  function GRU:forward(x, h0) return run(self, x, h0, gru_direction, false) end
  nn.GRU = GRU
end

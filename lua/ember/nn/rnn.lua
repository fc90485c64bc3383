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
over all the gates, views for each); the recurrence of each is one autograd
node with its closed-form backward (ember.nn.rnn_recurrence). Both are core ops
only, so every backend runs them; on the CPU an LSTM step's gate math is one fused
kernel instead (ember.nn.lstm_cpu).
]]
local em = require 'ember'
local core = require 'ember.ffi'
local raise, kind = core.raise, core.kind

return function(nn)
  local Module, F, I = nn.Module, nn.F, nn.init
  local rec = require('ember.nn.rnn_recurrence')(F)

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

  local lstm_direction, gru_direction = rec.lstm_direction, rec.gru_direction

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

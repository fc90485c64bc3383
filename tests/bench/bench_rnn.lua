--[[
bench_rnn.lua -- nn.LSTM and nn.GRU against PyTorch's (bench_rnn.py prints the
same names): the forward alone (inference, no autograd) and a training step
(forward, backward of the sum of the output) of a 2-layer network on a (T, N, I)
sequence, in milliseconds per call: lstm_* and gru_*. BENCH_LSTM_SIZES="T,N,I,H,L"
sets the sizes (tiny ones check that the script runs); EMBER_BENCH_DEVICE=cuda
runs it on the GPU.
]]
local dir = arg[0]:match('^(.*/)') or './'
local B = dofile(dir .. 'common.lua')
local em = B.em

local function sizes()
  local s = os.getenv('BENCH_LSTM_SIZES') or '64,32,128,256,2'
  local v = {}
  for n in s:gmatch('%d+') do v[#v + 1] = tonumber(n) end
  assert(#v == 5, 'BENCH_LSTM_SIZES must be T,N,I,H,L, got ' .. s)
  return v[1], v[2], v[3], v[4], v[5]
end

local T, N, I, Hd, L = sizes()
local dev = os.getenv('EMBER_BENCH_DEVICE') or 'cpu'
local reps = tonumber(os.getenv('BENCH_LSTM_REPS') or '10')
local function sync() if dev ~= 'cpu' then em.cuda.synchronize() end end

for _, kind in ipairs({ 'LSTM', 'GRU' }) do
  em.manual_seed(0)
  local m = em.nn[kind](I, Hd, { num_layers = L }):to(dev)
  local x = em.randn({ T, N, I }, { device = dev })

  local function forward(n)
    em.no_grad(function()
      for _ = 1, n do m(x) end
    end)
    sync()
  end

  local function train(n)
    for _ = 1, n do
      m:zero_grad()
      local y = m(x)
      y:sum():backward()
    end
    sync()
  end

  forward(1); train(1)   -- warm up the JIT and the allocator
  local name = kind:lower()
  B.result(name .. '_forward', B.time(forward, reps, 3) * 1e3, 'ms/call', 'lower', '<= torch')
  B.result(name .. '_train_step', B.time(train, reps, 3) * 1e3, 'ms/call', 'lower', '<= torch')
end

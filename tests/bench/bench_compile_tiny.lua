--[[
bench_compile_tiny.lua -- a small model's whole training step (the game and embedded
case: an MLP 16-32-32-4, batch 8, cross-entropy, Adam): microseconds per step eager
and through em.compile, in one run. Its twin bench_compile_tiny.py times the same step
in PyTorch eager (and torch.compile where it runs), so run.sh prints
compile_tiny_step_vs_torch2 (the compiled step against PyTorch's eager one) and
compile_tiny_speedup (compiled against ember's eager, in this run).

The second row is an element-wise chain: a tanh-approximated GELU plus a bias over
256 x 4096 floats (ten calls eager), whose compiled call runs tile by tile:
compile_chain_vs_torch2 (against PyTorch eager), compile_chain_speedup (against
ember's eager); the twin reports torch.compile's figure beside it.
]]
local B = dofile(debug.getinfo(1, 'S').source:sub(2):match('(.*/)') .. 'common.lua')
local em = B.em
local nn, F = em.nn, em.nn.F

local function make()
  em.manual_seed(1)
  local m = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU(),
                          nn.Linear(32, 4))
  local opt = em.optim.Adam(m:parameters(), { lr = 1e-3 })
  return function(x, y)
    opt:zero_grad()
    local loss = F.cross_entropy(m(x), y)
    loss:backward()
    opt:step()
    return loss
  end
end

-- Microseconds per call of eager(...) and compiled(...): after `warm` calls each, they
-- alternate, and each keeps its best of 5 rounds of n calls.
local function alternate(eager, compiled, warm, n, ...)
  for _ = 1, warm do eager(...); compiled(...) end
  local best = { eager = math.huge, compiled = math.huge }
  for _ = 1, 5 do
    for _, k in ipairs({ 'eager', 'compiled' }) do
      local f = k == 'eager' and eager or compiled
      local t0 = B.now()
      for _ = 1, n do f(...) end
      best[k] = math.min(best[k], (B.now() - t0) / n * 1e6)
    end
  end
  return best
end

local x, y = em.randn(8, 16), em.randint(1, 4, { 8 }, { dtype = 'int64' })
local compiled = em.compile(make())
local best = alternate(make(), compiled, 200, 2000, x, y)
assert(compiled:stats().replays > 0, 'the compiled step did not replay: ' .. compiled:explain())
-- the element-wise chain
local function gelu_bias(xx, b)
  return 0.5 * xx * (1 + ((xx + 0.044715 * xx * xx * xx) * 0.7978845608):tanh()) + b
end
local chain = em.compile(gelu_bias)
local cbest = alternate(gelu_bias, chain, 3, 20, em.randn(256, 4096), em.randn(4096))
assert((chain:stats().fusions.elementwise_chain or 0) == 1, 'no chain: ' .. chain:explain())
B.result('compile_chain_eager', cbest.eager, 'us', 'lower', 'report')
B.result('compile_chain', cbest.compiled, 'us', 'lower', 'ratio >= 1.0')
B.result('compile_chain_speedup', cbest.eager / cbest.compiled, 'x', 'higher', '>= 1.5')

B.result('compile_tiny_step_eager', best.eager, 'us', 'lower', 'report')
B.result('compile_tiny_step', best.compiled, 'us', 'lower', 'ratio >= 1.5')
B.result('compile_tiny_speedup', best.eager / best.compiled, 'x', 'higher', '>= 1.5')

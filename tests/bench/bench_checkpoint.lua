-- bench_checkpoint.lua -- activation checkpointing on a deep MLP (16 Linear+ReLU
-- layers, width 128, batch 8192, float32, blocks of two layers checkpointed):
-- step time (forward, backward, SGD) and peak tensor memory, with and without
-- checkpointing. Beside bench_checkpoint.py (torch.utils.checkpoint,
-- use_reentrant=False). args: steps (default 5).
local dir = debug.getinfo(1, 'S').source:sub(2):match('(.*/)')
local B = dofile(dir .. 'common.lua')
local em = B.em
local nn = em.nn

local steps = tonumber(arg and arg[1] or '') or 5
local W, N, L = 128, 8192, 16

em.manual_seed(0)
local layers = {}
for i = 1, L do layers[i] = nn.Sequential(nn.Linear(W, W), nn.ReLU()) end
local params = {}
for _, l in ipairs(layers) do for _, p in ipairs(l:parameters()) do params[#params + 1] = p end end
local opt = em.optim.SGD(params, { lr = 1e-3 })
local x = em.randn(N, W)

local function step(ckpt)
  opt:zero_grad()
  local h = x
  for i = 1, L, 2 do
    local a, b = layers[i], layers[i + 1]
    local f = function(t) return b(a(t)) end
    if ckpt then h = nn.checkpoint(f, h) else h = f(h) end
  end
  h:pow(2):mean():backward()
  opt:step()
end

for _, ckpt in ipairs({ false, true }) do
  local tag = ckpt and 'ckpt' or 'plain'
  step(ckpt)   -- warm up
  collectgarbage(); collectgarbage()
  em.reset_peak_memory_stats()
  local base = em.memory_stats('cpu').allocated
  local s = B.time(function(n) for _ = 1, n do step(ckpt) end end, steps, 3)
  local peak = (em.memory_stats('cpu').peak - base) / 2 ^ 20
  B.result('mlp16_' .. tag .. '_step_ms', s * 1e3, 'ms', 'lower', 'ratio >= 0.8')
  B.result('mlp16_' .. tag .. '_peak_mb', peak, 'MiB', 'lower', '')
end

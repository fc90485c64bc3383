--[[
bench_sort.lua -- sorting along the last dim, in float32 lines per second:
topk(50) of a batch of 32 lines of 50,257 logits (sampling a GPT's next token),
the whole sort of 256 lines of 1,024 (ranking, argsort), and multinomial
sampling with replacement: 256 draws from each of 32 rows of 50,257 probabilities
(in rows per second). PyTorch's twin is bench_sort.py.
]]
local dir = arg[0]:match('^(.*/)') or './'
local B = dofile(dir .. 'common.lua')
local em = B.em

em.manual_seed(0)
local logits = em.randn(32, 50257)
local rows = em.randn(256, 1024)
local probs = logits:softmax(2)
local function topk(n)
  local v
  for _ = 1, n do v = logits:topk(50) end
  return v
end
local function sort(n)
  local v
  for _ = 1, n do v = rows:sort(2) end
  return v
end
local function sample(n)
  local v
  for _ = 1, n do v = em.multinomial(probs, 256, true) end
  return v
end
topk(2); sort(2); sample(2)
B.result('topk50_32x50257', 32 / B.time(topk, 5, 5), 'lines/s', 'higher', 'ratio >= 1')
B.result('sort_256x1024', 256 / B.time(sort, 5, 5), 'lines/s', 'higher', 'ratio >= 1')
B.result('multinomial256_32x50257', 32 / B.time(sample, 5, 5), 'rows/s', 'higher', 'ratio >= 1')

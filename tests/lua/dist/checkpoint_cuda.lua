-- checkpoint_cuda.lua -- run by test_checkpoint_act.lua under EMBER_CUDA_EMULATE:
-- checkpointing on a cuda device gives the gradients of the plain run there,
-- dropout included. prints "cuda maxdiff D params P"
local nn = em.nn
local function build()
  em.manual_seed(5)
  return nn.Sequential(nn.Linear(5, 7), nn.GELU(), nn.Dropout(0.25), nn.Linear(7, 3)):to('cuda')
end
local plain, ck = build(), build()
local wrapped = nn.Checkpoint(ck)
em.manual_seed(9)
local x = em.randn(4, 5):to('cuda'):requires_grad_()
em.manual_seed(11)
plain(x):pow(2):sum():backward()
local gx = x.grad:clone()
x.grad = nil
em.manual_seed(11)
wrapped(x):pow(2):sum():backward()
local d = (x.grad - gx):abs():max():item()
local pp, pc = plain:parameters(), ck:parameters()
for i = 1, #pp do d = math.max(d, (pp[i].grad - pc[i].grad):abs():max():item()) end
print(('cuda maxdiff %.17g params %d device %s'):format(d, #pc, pc[1].grad.device))

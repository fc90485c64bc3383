-- demo.lua -- a short tour of ember's tensors without autograd: softmax
-- regression on synthetic blobs, with the gradient written out by hand
-- (examples/fashion_mnist.lua trains with autograd and nn).
--
--   ember examples/demo.lua [steps]

local steps = tonumber(arg and arg[1]) or 200
em.manual_seed(0)

-- Three Gaussian blobs in 2-D, 300 points each.
local n, classes = 300, 3
local centers = em.tensor({{0, 3}, {-3, -2}, {3, -2}})
local xs, ys = {}, {}
for c = 1, classes do
  xs[c] = em.randn(n, 2) + centers[c]           -- broadcast (n,2) + (2)
  ys[c] = em.full({n}, c, {dtype = 'int64'})
end
local x, y = em.cat(xs, 1), em.cat(ys, 1)     -- (900, 2), (900)
local target = em.one_hot(y, classes):float()  -- (900, 3)
print(('data: x %s, y %s'):format(table.concat(x.shape, 'x'), table.concat(y.shape, 'x')))

-- Parameters of a linear classifier.
local w = em.zeros(2, classes)
local b = em.zeros(classes)
local lr = 0.5

for step = 1, steps do
  local logits = em.matmul(x, w) + b            -- (900, 3)
  local logp = logits:log_softmax(2)
  local loss = -(logp * target):sum(2):mean()
  -- d loss / d logits = (softmax - onehot) / N
  local g = (logp:exp() - target) / x:size(1)
  w:add_(em.matmul(x:t(), g), -lr)
  b:add_(g:sum(1), -lr)
  if step == 1 or step % 50 == 0 then
    local acc = logits:argmax(2):eq(y):float():mean():item()
    print(('step %4d  loss %.4f  accuracy %.2f%%'):format(step, loss:item(), 100 * acc))
  end
end

print('weights:')
print(w)
local acc = (em.matmul(x, w) + b):argmax(2):eq(y):float():mean():item()
print(('train accuracy: %.2f%%'):format(100 * acc))

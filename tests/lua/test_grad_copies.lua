--[[
test_grad_copies.lua -- gradients reach .grad without a copy when no one else
holds them: a Linear's weight gradient (no copy of any kind in the backward, by
em.copy_count()), a weight kept transposed (the gradient comes dense in
its own strides and is adopted), values against gradients computed another way,
accumulation over two backward calls; and gradients someone else holds (the
caller's own tensor given to backward) are still copied, so nothing aliases.
]]
local dir = (arg and arg[0] and arg[0]:match('^(.*/)')) or
            ((os.getenv('EMBER_TESTS') or 'tests') .. '/lua/')
local H = dofile(dir .. 'harness.lua')
local em = require 'ember'

-- nested tables of numbers, or a tensor, as one flat list
local function flat(t, out)
  out = out or {}
  if type(t) ~= 'table' then
    if type(t) == 'number' then out[#out + 1] = t; return out end
    for _, v in ipairs(H.flat(t)) do out[#out + 1] = v end
    return out
  end
  for _, v in ipairs(t) do flat(v, out) end
  return out
end
local function close(got, want, tol, msg) return H.close(flat(got), flat(want), tol, msg) end

-- The copies fn() ran (every kind, from the core's counter).
local function copies_in(fn)
  local n0 = em.copy_count()
  fn()
  return em.copy_count() - n0
end

-- d loss / d W for loss = sum((x W^T + b)^2), by hand: 2 y^T x.
local function linear_grad_ref(x, w, b)
  local X, W, B = x:totable(), w:totable(), b:totable()
  local g = {}
  for i = 1, #W do
    g[i] = {}
    for j = 1, #W[1] do
      local s = 0
      for r = 1, #X do
        local y = B[i]
        for k = 1, #W[1] do y = y + X[r][k] * W[i][k] end
        s = s + 2 * y * X[r][j]
      end
      g[i][j] = s
    end
  end
  return g
end

H.test('a Linear weight gradient is not a copy, and is right', function()
  em.manual_seed(1)
  local lin = em.nn.Linear(5, 3, { dtype = 'float64' })
  local x = em.randn({ 4, 5 }, { dtype = 'float64' })
  local n = copies_in(function() (lin(x) ^ 2):sum():backward() end)
  H.eq(n, 0, 'copy ops in forward and backward')
  H.check(lin.weight.grad:is_contiguous(), 'the weight gradient is contiguous')
  close(lin.weight.grad:totable(), linear_grad_ref(x, lin.weight, lin.bias), 1e-10)
  -- a second backward accumulates into the same .grad
  local before = lin.weight.grad
  n = copies_in(function() (lin(x) ^ 2):sum():backward() end)
  H.eq(n, 0, 'copy ops in the accumulating backward')
  local ref = linear_grad_ref(x, lin.weight, lin.bias)
  for i = 1, #ref do for j = 1, #ref[1] do ref[i][j] = 2 * ref[i][j] end end
  close(lin.weight.grad:totable(), ref, 1e-10)
  close(before:totable(), ref, 1e-10, 'accumulated in place')
end)

H.test('a weight kept transposed gets its gradient in its own strides, uncopied', function()
  em.manual_seed(2)
  local w = em.randn({ 3, 6 }, { dtype = 'float64' }):t():detach():requires_grad_()
  local x = em.randn({ 5, 6 }, { dtype = 'float64' })   -- strided: a narrow of a wider one
  local xs = em.randn({ 5, 9 }, { dtype = 'float64' }):narrow(2, 2, 6)
  xs:copy_(x)
  H.eq(w:stride(), { 1, 6 }, 'the leaf is transposed')
  local n = copies_in(function() (xs:matmul(w) ^ 2):sum():backward() end)
  H.eq(n, 0, 'copy ops')
  H.eq(w.grad:stride(), { 1, 6 }, 'the gradient keeps the leaf\'s layout')
  -- reference: d/dW sum((x W)^2) = 2 x^T (x W), by hand in float64
  local X, W = x:totable(), w:totable()
  local ref = {}
  for i = 1, 6 do
    ref[i] = {}
    for j = 1, 3 do
      local s = 0
      for r = 1, 5 do
        local y = 0
        for k = 1, 6 do y = y + X[r][k] * W[k][j] end
        s = s + 2 * X[r][i] * y
      end
      ref[i][j] = s
    end
  end
  close(w.grad:totable(), ref, 1e-10)
end)

H.test('a gradient someone else holds is copied into .grad', function()
  local x = em.randn({ 2, 3 }):requires_grad_()
  local g = em.ones({ 6 })
  x:reshape({ 6 }):backward(g)        -- the gradient reaching x is a view of g
  close(x.grad:totable(), { { 1, 1, 1 }, { 1, 1, 1 } }, 0)
  g:fill_(5)                          -- the caller's tensor changes; .grad must not
  close(x.grad:totable(), { { 1, 1, 1 }, { 1, 1, 1 } }, 0, '.grad does not alias g')
  local leaf = em.randn({ 4 }):requires_grad_()
  local h = em.full({ 4 }, 2)
  leaf:backward(h)                    -- backward on the leaf itself: its grad is h's values
  h:fill_(7)
  close(leaf.grad:totable(), { 2, 2, 2, 2 }, 0, 'a leaf\'s own backward copies')
end)

H.test('finite differences agree for a Linear in a chain (float64)', function()
  em.manual_seed(3)
  local lin = em.nn.Linear(4, 2, { dtype = 'float64' })
  local x = em.randn({ 3, 4 }, { dtype = 'float64' })
  local l = (em.nn.functional.relu(lin(x)) ^ 2):sum()
  l:backward()
  local g = lin.weight.grad:totable()
  local W, b = lin.weight:detach():totable(), lin.bias:detach()
  local function loss_at(i, j, v)
    local Wp = {}
    for r = 1, #W do Wp[r] = {}; for c = 1, #W[1] do Wp[r][c] = W[r][c] end end
    Wp[i][j] = v
    local wt = em.tensor(Wp, { dtype = 'float64' })
    return (em.nn.functional.relu(em.nn.functional.linear(x, wt, b)) ^ 2):sum():item()
  end
  local eps = 1e-6
  for i = 1, 2 do
    for j = 1, 4 do
      local fd = (loss_at(i, j, W[i][j] + eps) - loss_at(i, j, W[i][j] - eps)) / (2 * eps)
      close(g[i][j], fd, 1e-5, ('dW[%d][%d]'):format(i, j))
    end
  end
end)

H.done()

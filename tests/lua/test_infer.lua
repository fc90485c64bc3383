--[[
test_infer.lua -- the small-net inference path: the matmul
kernel for short blocks of rows (M < 4: batch-1 layers), in every layout and
compute type, against a plain Lua sum; F.linear / em_linear (one call, no
intermediate tensors without autograd) against x:matmul(w:t()) + b, in values,
dtypes, shapes and gradients; and nn.Linear under no_grad.
]]
local dir = (arg and arg[0] and arg[0]:match('^(.*/)')) or
            ((os.getenv('EMBER_TESTS') or 'tests') .. '/lua/')
local H = dofile(dir .. 'harness.lua')
local em = require 'ember'
local F = em.nn.F

em.manual_seed(7)

-- a (M, K) @ b (K, N) summed in Lua (float64), as a flat row-major list.
local function ref_mm(a, b)
  local A, B = a:double():totable(), b:double():totable()
  local M, K, N = #A, #B, #B[1]
  local out = {}
  for i = 1, M do
    for j = 1, N do
      local s = 0
      for k = 1, K do s = s + A[i][k] * B[k][j] end
      out[#out + 1] = s
    end
  end
  return out
end

local function flat(t) return t:double():contiguous():view(-1):totable() end

H.test('short-row matmul: every layout and type against a plain sum', function()
  for _, dt in ipairs({ 'float32', 'float64', 'int64' }) do
    local tol = dt == 'float32' and 1e-5 or 1e-12
    for _, M in ipairs({ 1, 2, 3 }) do
      for _, K in ipairs({ 1, 5, 16, 17, 33, 64 }) do
        for _, N in ipairs({ 1, 3, 4, 5, 16, 17, 64, 70 }) do
          local function mk(r, c)
            if dt == 'int64' then return em.randint(-5, 5, { r, c }, { dtype = 'int64' }) end
            return em.randn({ r, c }, { dtype = dt })
          end
          local a = mk(M, K)
          local layouts = {
            { 'b dense rows', mk(K, N) },
            { 'b = w:t()', mk(N, K):t() },
            { 'b strided', mk(K, 2 * N):narrow(2, 1, N) },
          }
          for _, l in ipairs(layouts) do
            local want = ref_mm(a, l[2])
            local got = flat(em.matmul(a, l[2]))
            local what = ('%s M=%d K=%d N=%d %s'):format(dt, M, K, N, l[1])
            if dt == 'int64' then H.eq(got, want, what) else H.close(got, want, tol, what) end
          end
          -- a's rows strided (a transposed view), b transposed too
          local at, bt = mk(K, M):t(), mk(N, K):t()
          local what = ('%s M=%d K=%d N=%d strided a'):format(dt, M, K, N)
          if dt == 'int64' then H.eq(flat(em.matmul(at, bt)), ref_mm(at, bt), what)
          else H.close(flat(em.matmul(at, bt)), ref_mm(at, bt), tol, what) end
        end
      end
    end
  end
end)

H.test('F.linear equals x:matmul(w:t()) + b', function()
  local w, b = em.randn(6, 5), em.randn(6)
  for _, shape in ipairs({ { 5 }, { 1, 5 }, { 3, 5 }, { 2, 4, 5 } }) do
    local x = em.randn(shape)
    local want = x:matmul(w:t()) + b
    local got = F.linear(x, w, b)
    H.eq(got.shape, want.shape, 'shape')
    H.close(flat(got), flat(want), 1e-6, 'with bias')
    H.close(flat(F.linear(x, w)), flat(x:matmul(w:t())), 1e-6, 'without bias')
    em.no_grad(function()
      H.close(flat(F.linear(x, w, b)), flat(want), 1e-6, 'under no_grad')
    end)
  end
  -- 1-D weight: a dot product per row, as w:t() of a vector is the vector
  local x, v = em.randn(3, 5), em.randn(5)
  H.close(flat(F.linear(x, v)), flat(x:matmul(v)), 1e-6, '1-D weight')
  -- a float64 bias promotes (out of place), a 2-D bias broadcasts
  local b64 = em.randn({ 6 }, { dtype = 'float64' })
  local y = F.linear(em.randn(2, 5), w, b64)
  H.eq(y.dtype, 'float64', 'promoted dtype')
  local b2 = em.randn(3, 1)
  H.eq(F.linear(em.randn(3, 5), w, b2).shape, { 3, 6 }, 'broadcast bias')
  H.raises(function() F.linear(em.randn(2, 5), em.randn(2, 6, 5)) end, 'linear', '[2,6,5]')
  H.raises(function() F.linear(em.randn(2, 4), w, b) end, 'linear: input [2,4] does not fit weight [6,5]')
end)

H.test('F.linear records the gradients of the composition', function()
  local x = em.randn(3, 5):requires_grad_()
  local w, b = em.randn(4, 5):requires_grad_(), em.randn(4):requires_grad_()
  F.linear(x, w, b):pow(2):sum():backward()
  local gx, gw, gb = flat(x.grad), flat(w.grad), flat(b.grad)
  local x2, w2, b2 = x:detach():clone():requires_grad_(), w:detach():clone():requires_grad_(),
                     b:detach():clone():requires_grad_()
  local l2 = (x2:matmul(w2:t()) + b2):pow(2):sum()
  l2:backward()
  H.close(gx, flat(x2.grad), 1e-5, 'dx')
  H.close(gw, flat(w2.grad), 1e-5, 'dw')
  H.close(gb, flat(b2.grad), 1e-5, 'db')
  em.no_grad(function() H.eq(F.linear(x, w, b).requires_grad, false, 'no history under no_grad') end)
end)

H.test('the 32-64-4 MLP under no_grad', function()
  local nn = em.nn
  local model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 4))
  local x = em.randn(1, 32)
  local l1, l2 = model[1], model[3]
  local want = (x:matmul(l1.weight:t()) + l1.bias):relu():matmul(l2.weight:t()) + l2.bias
  local got = em.no_grad(function() return model(x) end)
  H.eq(got.shape, { 1, 4 }, 'shape')
  H.close(flat(got), flat(want), 1e-5, 'values')
  -- no leak: after a full collection 1000 more inferences hold no more tensor memory
  local function held()
    for _ = 1, 4 do collectgarbage() end
    require('ember.handles').collect()
    return em.memory_stats('cpu').allocated
  end
  for _ = 1, 10 do em.no_grad(function() model(x) end) end
  local before = held()
  for _ = 1, 1000 do em.no_grad(function() model(x) end) end
  H.eq(held(), before, 'tensor bytes held after 1000 inferences')
end)

H.done()

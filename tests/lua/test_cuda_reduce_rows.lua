--[[
test_cuda_reduce_rows.lua -- the reductions' and softmax's float32 fast paths on
long rows against the CPU backend (EMBER_CUDA_EMULATE=1:256): a block of 256
threads per row reads four float4 loads per round, a warp per row for rows up to
512, the split pass for a full sum, and the scalar head and tail around the
float4 run. Rows of 4096 and more (every thread takes the four-load round), rows
where some threads take it and some do not (1100, 4099), rows starting off a
16-byte boundary (narrowed), a transposed input (the strided path), and a whole
sum of 70001 elements (split into chunks of about 4 K).
]]
local dir = (arg and arg[0] and arg[0]:match('^(.*/)')) or
            ((os.getenv('EMBER_TESTS') or 'tests') .. '/lua/')
local H, em = dofile(dir .. 'cuda_emulated.lua')('1:256')

-- The reference is the CPU's in float64: the device accumulates float32 in double
-- and rounds once (the CPU's float32 sums may be a few float32 ulps of the partial
-- sums off when they cancel), so it is within a few float32 ulps of it.
local TOL = 2e-6

local function inputs(rows, cols)
  em.manual_seed(7)
  local x = em.randn({ rows, cols + 3 }) * 3
  return {
    { 'contiguous', x:narrow(2, 1, cols):contiguous() },
    { 'narrowed by one (off a 16-byte boundary)', x:narrow(2, 2, cols) },
    { 'narrowed by three', x:narrow(2, 4, cols) },
  }
end

local function same(op, got, want, what)
  H.close(H.flat(got:to('cpu')), H.flat(want), TOL, ('%s %s'):format(op, what))
end

local OPS = {
  { 'sum(-1)', function(t) return t:sum(-1) end },
  { 'mean(-1)', function(t) return t:mean(-1) end },
  { 'var(-1)', function(t) return t:var(-1) end },
  { 'logsumexp(-1)', function(t) return t:logsumexp(-1) end },
  { 'max(-1)', function(t) return (t:max(-1)) end },
  { 'softmax(-1)', function(t) return t:softmax(-1) end },
  { 'log_softmax(-1)', function(t) return t:log_softmax(-1) end },
}

for _, shape in ipairs({ { 3, 4096 }, { 2, 8197 }, { 5, 1100 }, { 3, 4099 }, { 6, 512 },
                         { 4, 509 } }) do
  H.test(('rows of %d: every op matches the cpu'):format(shape[2]), function()
    for _, inp in ipairs(inputs(shape[1], shape[2])) do
      local what, x = inp[1], inp[2]
      local xc = x:to('cuda')
      local x64 = x:to('float64')
      for _, op in ipairs(OPS) do same(op[1], op[2](xc), op[2](x64), ('%dx%d %s'):format(
        shape[1], shape[2], what)) end
    end
  end)
end

H.test('a transposed input (strided rows) matches the cpu', function()
  em.manual_seed(3)
  local x = em.randn({ 4099, 3 }):t()
  local xc = x:to('cuda')
  local x64 = x:to('float64')
  for _, op in ipairs(OPS) do same(op[1], op[2](xc), op[2](x64), 'transposed 3x4099') end
end)

H.test('a whole sum over chunks (the split pass) matches the cpu', function()
  em.manual_seed(5)
  for _, n in ipairs({ 70001, 65536, 16387 }) do
    local x = em.randn(n + 1):narrow(1, 2, n)
    local xc, x64 = x:to('cuda'), x:to('float64')
    same('sum()', xc:sum(), x64:sum(), ('of %d, off a boundary'):format(n))
    same('mean()', xc:mean(), x64:mean(), ('of %d, off a boundary'):format(n))
    same('sum()', xc:contiguous():sum(), x64:sum(), ('of %d'):format(n))
  end
end)

H.test('the device result is the same run to run (a fixed folding order)', function()
  em.manual_seed(9)
  local xc = em.randn({ 4, 8197 }):to('cuda')
  H.eq(H.flat(xc:sum(-1):to('cpu')), H.flat(xc:sum(-1):to('cpu')), 'sum(-1) twice')
  H.eq(H.flat(xc:sum():to('cpu')), H.flat(xc:sum():to('cpu')), 'sum() twice')
end)

H.done()

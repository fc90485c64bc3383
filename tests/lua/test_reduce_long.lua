--[[
test_reduce_long.lua -- float32 sums over long segments (the CPU's streamed
kernel: a segment of 1024 elements or more is read as four streams, the rest
in double lanes; a reduction longer than a block is cut into blocks of 65536)
against float64 sums of the same values: sum, mean, the 1- and 2-norms, over
everything, along the last dim of contiguous and row-strided matrices, at
lengths around each boundary; every thread count gives the same bits.
]]
local dir = (arg and arg[0] and arg[0]:match('^(.*/)')) or
            ((os.getenv('EMBER_TESTS') or 'tests') .. '/lua/')
local H = dofile(dir .. 'harness.lua')

-- |got - want| within 1e-6 of the sum of magnitudes (float32 terms, runs of 16
-- added in float: a few ulps of the float32 magnitudes, not of the result)
local function near(got, want, scale, what)
  H.check(math.abs(got - want) <= 1e-6 * scale + 1e-30,
    ('%s: got %.9g, want %.9g (scale %.4g)'):format(what, got, want, scale))
end

local LENGTHS = { 17, 1023, 1024, 1025, 4096 + 15, 65536, 65536 + 1024 + 7, 300001 }

H.test('sum, mean and norms of long float32 vectors against float64', function()
  em.manual_seed(7)
  for _, n in ipairs(LENGTHS) do
    -- (a positive offset: a sum that cancels would hide a lost stream)
    local x = em.randn(n) + 0.25
    local xd = x:double()
    local mag = xd:abs():sum():item()
    near(x:sum():item(), xd:sum():item(), mag, 'sum n=' .. n)
    near(x:mean():item(), xd:mean():item(), mag / n, 'mean n=' .. n)
    near(x:norm(1):item(), mag, mag, 'norm(1) n=' .. n)
    local sq = (xd * xd):sum():item()
    near(x:norm(2):item() ^ 2, sq, sq, 'norm(2)^2 n=' .. n)
    near((x * x):sum():item(), sq, sq, 'sum of squares n=' .. n)
  end
end)

H.test('sums along the last dim: contiguous and row-strided matrices', function()
  em.manual_seed(8)
  for _, n in ipairs({ 1023, 1030, 5000 }) do
    local wide = em.randn(4, n + 9) + 0.5
    for _, m in ipairs({ wide:narrow(2, 1, n):contiguous(), wide:narrow(2, 5, n) }) do
      local got, want = m:sum(-1), m:double():sum(-1)
      local mag = m:double():abs():sum(-1)
      for r = 1, 4 do
        near(got[r], want[r], mag[r],
          ('row %d of %s n=%d'):format(r, m:is_contiguous() and 'contiguous' or 'strided', n))
      end
    end
  end
end)

H.test('the same bits whatever the thread count', function()
  local prog = [[
    em.manual_seed(9)
    local x = em.randn(300001) + 0.25
    io.write(('%a %a'):format(x:sum():item(), x:norm(2):item()))
  ]]
  local outs = {}
  for _, threads in ipairs({ 1, 2 }) do
    outs[#outs + 1] = H.ember(prog, { prefix = 'EMBER_NUM_THREADS=' .. threads })
  end
  H.check(outs[1]:match('^%-?0x[%x.]+p[-+]%d+ 0x[%x.]+p[-+]%d+$'), 'two hex floats: ' .. outs[1])
  H.eq(outs[1], outs[2], 'sum and norm on 1 and 2 threads')
end)

H.done()

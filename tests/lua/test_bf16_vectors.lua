--[[
test_bf16_vectors.lua -- the CPU's vector bfloat16 conversions (elementwise.c: 8
lanes with AVX2 on contiguous runs) against the scalar ones (strided runs), bit for
bit: every bfloat16 value widened, and float32 results narrowed with ties, NaN,
infinities, subnormals and overflow. The same op runs once on contiguous operands
(vector path) and once on views with a stride of 2 elements (scalar path).
]]
local dir = (arg and arg[0] and arg[0]:match('^(.*/)')) or
            ((os.getenv('EMBER_TESTS') or 'tests') .. '/lua/')
local H = dofile(dir .. 'harness.lua')
local em = require 'ember'
local ffi = require 'ffi'

-- every bfloat16 bit pattern as the float32 it stands for
local function all_bf16_values()
  local u = ffi.new('uint32_t[1]')
  local f = ffi.cast('float *', u)
  local t = {}
  for p = 0, 65535 do
    u[0] = p * 65536
    t[#t + 1] = f[0]
  end
  return t
end

-- the float32 bit pattern of each element of a float32 tensor (NaNs as one pattern:
-- their payloads are not part of the contract)
local function bits(t)
  local out, u = {}, ffi.new('float[1]')
  local pu = ffi.cast('uint32_t *', u)
  for i = 1, t:size(1) do
    local v = t[i]
    if v ~= v then out[i] = 'nan' else u[0] = v; out[i] = pu[0] end
  end
  return out
end

-- x (bfloat16, n) through fn, contiguous and as a stride-2 view of a wider buffer
local function both_paths(x, fn)
  local n = x:size(1)
  local wide = em.zeros({ n, 2 }, { dtype = 'bfloat16' })
  wide:select(2, 1):copy_(x)
  return fn(x), fn(wide:select(2, 1))
end

H.test('every bfloat16 value widens and narrows back unchanged, vector = scalar', function()
  local vals = all_bf16_values()
  local x = em.tensor(vals):to('bfloat16')
  H.eq(x:size(1), 65536)
  local v, s = both_paths(x, function(t) return (t * 1):float() end)
  local bv, bs, want = bits(v), bits(s), bits(em.tensor(vals))
  local bad = 0
  for i = 1, #want do
    if bv[i] ~= want[i] or bs[i] ~= want[i] then bad = bad + 1 end
  end
  H.eq(bad, 0, 'patterns off')
end)

H.test('float32 results round to nearest even, vector = scalar, bit for bit', function()
  em.manual_seed(3)
  -- sums that land between bfloat16 values, exact ties, overflow to inf, tiny values
  local a = em.cat({ em.randn(4099) * 1e3, em.tensor({ 1, 1, 3.38e38, -3.38e38, 1e-39, 0 }) })
  local b = em.cat({ em.randn(4099) * 1e-2, em.tensor({ 2^-8, 3 * 2^-8, 3.38e38, -3.38e38,
                                                          1e-39, 0 / 0 }) })
  local x, y = a:to('bfloat16'), b:to('bfloat16')
  local n = x:size(1)
  local wx, wy = em.zeros({ n, 2 }, { dtype = 'bfloat16' }), em.zeros({ n, 2 }, { dtype = 'bfloat16' })
  wx:select(2, 1):copy_(x); wy:select(2, 1):copy_(y)
  local v = (x * 1.5 + y):float()
  local s = (wx:select(2, 1) * 1.5 + wy:select(2, 1)):float()
  local bv, bs = bits(v), bits(s)
  local bad = 0
  for i = 1, #bv do if bv[i] ~= bs[i] then bad = bad + 1 end end
  H.eq(bad, 0, 'results that differ between the paths')
  -- exact ties on the vector path: 1 + k 2^-8 (k odd) lies halfway between two
  -- multiples of 2^-7; the even one wins
  local ks, want = {}, {}
  for k = 1, 63, 2 do
    ks[#ks + 1] = k * 2^-8
    local lo, hi = (k - 1) / 2, (k + 1) / 2
    want[#want + 1] = 1 + 2^-7 * (lo % 2 == 0 and lo or hi)
  end
  local ties = (em.ones(#ks):to('bfloat16') + em.tensor(ks):to('bfloat16')):float()
  H.eq(H.flat(ties), want, 'ties to even')
  -- and through the conversion of a copy
  local t = em.tensor({ 1 + 2^-8, 1 + 3 * 2^-8 }):to('bfloat16'):float()
  H.eq(H.flat(t), { 1, 1 + 2^-6 })
  H.check(v[n - 3] == math.huge, 'overflow rounds to inf')
  H.check(v[n] ~= v[n], 'NaN stays NaN')
end)

H.done()

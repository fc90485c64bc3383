--[[
test_cuda_bn_nhwc.lua -- batch norm on channels-last tensors on the CUDA backend
(the emulated runtime, EMBER_CUDA_EMULATE=2:64; the test runs itself again with it
otherwise; on a GPU machine, EMBER_TEST_REAL_CUDA, the real device). The CUDA
backend serves NHWC batch norm natively (EMI_NHWC_BN): training through the
runtime's batch norm with NHWC descriptors (cuDNN; the CPU's NHWC loops on the
emulator), evaluation and its backward through k_dnn.cu's kernels indexing NHWC.
So em.layout_conversions() does not move inside batch norm, forward or backward,
and an NHWC CNN step on cuda converts only at its entry and at flatten.

References: the same op in float64 on the CPU in NCHW order (another layout and
other loops), and, for evaluation, the CPU's own NHWC batch norm in the same dtype,
which the emulated device equals bit for bit.
]]
local dir = (arg and arg[0] and arg[0]:match('^(.*/)')) or
            ((os.getenv('EMBER_TESTS') or 'tests') .. '/lua/')
local H, em = dofile(dir .. 'cuda_emulated.lua')('2:64')
local F = em.nn.F
local N = dofile(dir .. 'nhwc_cases.lua')
local diff, rel, cl, leaf, half = N.diff, N.rel, N.cl, N.leaf, N.half

local EMU = os.getenv('EMBER_TEST_REAL_CUDA') == nil

-- dtype; tolerances against the float64 reference on the same rounded inputs,
-- relative to the largest value: `out` for what comes out in the dtype (y, grad x),
-- `param` for the float32 parameter gradients and running statistics of a half
-- dtype (and the dtype's own otherwise). A half result is a float32 computation
-- rounded once to the dtype: at most one unit roundoff, 2^-8 (bfloat16, 8 bits)
-- or 2^-11 (float16, 11 bits); the tolerance is two (2^-7 ~ 7.8e-3, 2^-10 ~ 1e-3),
-- the emulator measures 2.6e-3 and 3.3e-4. float32 sums at most 72 elements a
-- channel: 1e-5 leaves a different summation order on a GPU a wide margin over
-- the 1e-7 measured. float64: 1e-12, a few thousand ulps.
local dtypes = {
  { 'float32', out = 1e-5, param = 1e-5 }, { 'float64', out = 1e-12, param = 1e-12 },
  { 'float16', out = 1e-3, param = 1e-5 }, { 'bfloat16', out = 1e-2, param = 1e-5 },
}

-- One batch norm case on x (an NCHW CPU tensor): the float64 NCHW CPU reference,
-- the dt NHWC cuda run (parameters float32 for a half dt), compared forward,
-- backward and in the running statistics; no conversion inside on cuda.
local function case(name, x, d, training, affine, running)
  local dt = d[1]
  local C = x.shape[2]
  local pdt = half(dt) and 'float32' or dt
  local w0, b0 = em.randn(C):mul(0.5):add(1), em.randn(C)
  local rm0, rv0 = em.randn(C), em.rand(C):add(0.5)
  local xv = x:to(dt):double()                     -- the values dt can hold
  local g = em.randn(unpack(x.shape)):to(dt):double()
  -- reference: float64, NCHW, CPU
  local xa = leaf(xv)
  local wa, ba, rma, rva, wb, bb, rmb, rvb
  if affine then wa, ba = leaf(w0:to(pdt):double()), leaf(b0:to(pdt):double()) end
  if running then rma, rva = rm0:to(pdt):double(), rv0:to(pdt):double() end
  local ya = F.batch_norm(xa, rma, rva, wa, ba, training, 0.1, 1e-5)
  ya:backward(g)
  -- cuda, NHWC, dt
  local xb = leaf(cl(xv:cuda():to(dt)))
  if affine then wb, bb = leaf(w0:to(pdt):cuda()), leaf(b0:to(pdt):cuda()) end
  if running then rmb, rvb = rm0:to(pdt):cuda(), rv0:to(pdt):cuda() end
  local gb = cl(g:cuda():to(dt))
  local c0 = em.layout_conversions()
  local yb = F.batch_norm(xb, rmb, rvb, wb, bb, training, 0.1, 1e-5)
  yb:backward(gb)
  H.eq(em.layout_conversions() - c0, 0, name .. ': no conversion, forward or backward')
  H.check(yb:is_contiguous('channels_last') and yb.dtype == dt, name .. ': output NHWC ' .. dt)
  H.check(xb.grad:is_contiguous('channels_last') and xb.grad.dtype == dt,
          name .. ': grad NHWC ' .. dt)
  H.close(rel(ya, yb), 0, d.out, name .. ': forward')
  H.close(rel(xa.grad, xb.grad), 0, d.out, name .. ': grad x')
  if affine then
    H.check(wb.grad.dtype == pdt and bb.grad.dtype == pdt, name .. ': param grads ' .. pdt)
    H.close(rel(wa.grad, wb.grad), 0, d.param, name .. ': grad weight')
    H.close(rel(ba.grad, bb.grad), 0, d.param, name .. ': grad bias')
  end
  if running then
    H.close(rel(rma, rmb), 0, d.param, name .. ': running_mean')
    H.close(rel(rva, rvb), 0, d.param, name .. ': running_var')
  end
end

H.test('batch norm NHWC on cuda against float64 NCHW, every dtype', function()
  em.manual_seed(7)
  for _, d in ipairs(dtypes) do
    for _, shape in ipairs({ { 3, 5, 4, 6 }, { 2, 70, 3, 3 }, { 1, 3, 5, 1 } }) do
      local x = em.randn(unpack(shape)):mul(2):add(0.5)
      local s = ('[%s] %s'):format(table.concat(shape, ','), d[1])
      case('train ' .. s, x, d, true, true, true)
      case('train no affine, no stats ' .. s, x, d, true, false, false)
      case('eval ' .. s, x, d, false, true, true)
      case('eval no affine ' .. s, x, d, false, false, true)
    end
  end
end)

-- The same op on the CPU (its NHWC loops) and on cuda, both NHWC in dt: evaluation
-- (k_dnn.cu's kernels) walks the CPU's order, so on the emulated device the
-- results are the CPU's bits; on a GPU, nvcc may fuse a multiply-add the CPU
-- rounds twice, so they agree to a few units in the last place.
H.test('batch norm eval NHWC on cuda equals the CPU NHWC', function()
  em.manual_seed(8)
  for _, dt in ipairs({ 'float32', 'float64', 'float16', 'bfloat16' }) do
    local pdt = half(dt) and 'float32' or dt
    local x = cl(em.randn(3, 6, 5, 4):mul(3):add(1):to(dt))
    local w, b = em.randn(6):to(pdt), em.randn(6):to(pdt)
    local rm, rv = em.randn(6):to(pdt), em.rand(6):add(0.5):to(pdt)
    local g = cl(em.randn(3, 6, 5, 4):to(dt))
    local ca, cb = { leaf(x), leaf(w), leaf(b) }, { leaf(x:cuda()), leaf(w:cuda()), leaf(b:cuda()) }
    H.check(cb[1]:is_contiguous('channels_last'), dt .. ': cuda input NHWC')
    local ya = F.batch_norm(ca[1], rm, rv, ca[2], ca[3], false, 0.1, 1e-5)
    local yb = F.batch_norm(cb[1], rm:cuda(), rv:cuda(), cb[2], cb[3], false, 0.1, 1e-5)
    ya:backward(g)
    yb:backward(g:cuda())
    local tol = EMU and 0 or (dt == 'float64' and 1e-14 or dt == 'float32' and 1e-6 or 1e-2)
    local names = { 'forward', 'grad x', 'grad weight', 'grad bias' }
    local got = { { ya, yb }, { ca[1].grad, cb[1].grad }, { ca[2].grad, cb[2].grad },
                  { ca[3].grad, cb[3].grad } }
    for i, p in ipairs(got) do
      -- the CPU sums a half input's weight and bias gradients over row blocks
      -- (bn_half.c: float within a block, double across), the device per channel
      -- in order: the same sum, associated differently
      local sums = half(dt) and i >= 3
      if EMU and not sums then
        H.eq(diff(p[1], p[2]), 0, dt .. ' eval ' .. names[i] .. ': the CPU bits')
      else H.close(rel(p[1], p[2]), 0, EMU and 1e-5 or tol, dt .. ' eval ' .. names[i]) end
    end
  end
end)

-- gradcheck perturbs CPU leaves: the function moves them to cuda (x stays NHWC),
-- runs batch norm there and brings the result back, so the analytic gradients are
-- the cuda backward's and the numerical ones come from cuda forwards.
H.test('batch norm float64 NHWC on cuda: gradcheck, training and eval', function()
  em.manual_seed(9)
  for _, training in ipairs({ true, false }) do
    local x = leaf(cl(em.randn(2, 3, 3, 2):double()))
    local w, b = leaf(em.randn(3):double()), leaf(em.randn(3):double())
    local rm, rv = em.randn(3):double():cuda(), em.rand(3):add(0.5):double():cuda()
    local ok = em.autograd.gradcheck(function(a, ww, bb)
      local ac = a:cuda()
      assert(ac:is_contiguous('channels_last'))
      local y = F.batch_norm(ac, not training and rm or nil, not training and rv or nil,
                             ww:cuda(), bb:cuda(), training, 0.1, 1e-5)
      assert(y:is_contiguous('channels_last'))
      return y:cpu()
    end, { x, w, b })
    H.check(ok, 'gradcheck ' .. (training and 'training' or 'eval'))
  end
end)

H.test('batch norm on cuda: non-dense channels-last views and NCHW inputs', function()
  em.manual_seed(10)
  -- a channel slice of an NHWC tensor is not dense: the ops layer makes it so
  -- (one counted conversion), the result NHWC
  local big = cl(em.randn(2, 8, 4, 5))
  local xs = big:narrow(2, 3, 4)
  local xd = xs:cuda()
  local a = F.batch_norm(xs:contiguous(), nil, nil, nil, nil, true)
  local b = F.batch_norm(xd, nil, nil, nil, nil, true)
  H.close(diff(a, b), 0, 1e-5, 'narrowed NHWC view: values')
  -- an NHWC tensor made by permuting NHWC storage: dense already, no conversion
  local store = em.randn(2, 4, 5, 6)          -- N, H, W, C
  local xp = store:cuda():permute(1, 4, 2, 3)
  H.check(xp:is_contiguous('channels_last'), 'permuted storage is channels last')
  local c0 = em.layout_conversions()
  local yp = F.batch_norm(xp, nil, nil, nil, nil, true)
  H.eq(em.layout_conversions() - c0, 0, 'permuted NHWC: no conversion')
  H.check(yp:is_contiguous('channels_last'), 'permuted NHWC: output NHWC')
  H.close(diff(yp, F.batch_norm(store:permute(1, 4, 2, 3):contiguous(), nil, nil, nil, nil,
                                true)), 0, 1e-5, 'permuted NHWC: values')
  -- NCHW stays NCHW, and NHWC and NCHW give the same values on cuda
  local x = em.randn(3, 4, 5, 5):cuda()
  local yn = F.batch_norm(x, nil, nil, nil, nil, true)
  local yc = F.batch_norm(cl(x), nil, nil, nil, nil, true)
  H.check(yn:is_contiguous() and yc:is_contiguous('channels_last'), 'each keeps its layout')
  H.close(diff(yn, yc), 0, 1e-5, 'NCHW and NHWC agree')
end)

H.test('NHWC CNN step on cuda converts only at entry and flatten', function()
  local a, b = N.cnn_pair(11)                 -- a: CPU NCHW; b: cuda NHWC
  b.all:to('cuda')
  b.all:to{ memory_format = 'channels_last' }
  local opta = em.optim.SGD(a.all:parameters(), { lr = 0.1, momentum = 0.9 })
  local optb = em.optim.SGD(b.all:parameters(), { lr = 0.1, momentum = 0.9 })
  local x, t = em.randn(4, 3, 8, 8), em.tensor({ 1, 2, 3, 4 }):long()
  local xg, tg = x:cuda(), t:cuda()
  for step = 1, 3 do
    local la, lb, n = N.step(a, opta, b, optb, x, t, xg, tg)
    H.eq(n, 2, 'step ' .. step .. ': entry + flatten only')
    H.close(la, lb, 1e-4, 'step ' .. step .. ' loss')
  end
  H.close(diff(a.c1.weight, b.c1.weight), 0, 1e-4, 'conv weights after three steps')
  H.close(diff(a.b1.weight, b.b1.weight), 0, 1e-4, 'bn weights after three steps')
  H.close(diff(a.b2.running_var, b.b2.running_var), 0, 1e-4, 'running_var after three steps')
  H.check(b.c1.weight:is_contiguous('channels_last'), 'conv weights stay NHWC')
  -- evaluation: the same conversions, the same values
  a.all:eval()
  b.all:eval()
  local n0 = em.layout_conversions()
  local yb = b.forward(cl(xg))
  H.eq(em.layout_conversions() - n0, 2, 'eval forward: entry + flatten only')
  H.close(diff(a.forward(x), yb), 0, 1e-4, 'eval forward values')
end)

H.done()

--[[
test_cpu_dnnl.lua -- oneDNN's CPU kernels (core/cpu/dnnl.c) against ember's own:
conv2d forward and both backward products through the ops and autograd (strides,
padding, dilation, groups, non-contiguous inputs), NHWC and bfloat16 at the CPU
backend's conv entry, matmul in float32 and bfloat16 with transposed operands,
the mode switch, and clean errors. ember's kernels (em.cpu_kernels('ours')) are the
reference; 'onednn' makes oneDNN serve every case it can. Skipped when oneDNN is
not installed (the switch and the errors are still tested; EMBER_DNNL_LIB=none
runs it so).
]]
local dir = (arg and arg[0] and arg[0]:match('^(.*/)')) or
            ((os.getenv('EMBER_TESTS') or 'tests') .. '/lua/')
local H = dofile(dir .. 'harness.lua')
local em = require 'ember'
local ffi = require 'ffi'
local core = require 'ember.ffi'
local F = em.nn.functional

local info = em.cpu_kernels_info()
local have = info:find('^oneDNN %d') ~= nil
local SKIP = 'skipped: oneDNN not installed or not usable here (' .. info:match('^[^\n]*') .. ')'

-- max |a - b| / max(|b|, tiny), in float64
local function rel(a, b)
  local d = (a:to('float64') - b:to('float64')):abs():max():item()
  local s = b:to('float64'):abs():max():item()
  return d / math.max(s, 1e-30)
end

local function with_mode(mode, fn)
  local before = em.cpu_kernels(mode)
  local ok, a, b, c, d = pcall(fn)
  em.cpu_kernels(before)
  if not ok then error(a, 0) end
  return a, b, c, d
end

H.test('the mode switch', function()
  local before = em.cpu_kernels()
  H.check(before == 'auto' or before == 'ours' or before == 'onednn' or before == 'onednn-blocked',
    'mode ' .. tostring(before))
  H.eq(em.cpu_kernels('ours'), before)
  H.eq(em.cpu_kernels(), 'ours')
  H.raises(function() em.cpu_kernels('fastest') end, 'cpu_kernels', 'fastest')
  H.eq(em.cpu_kernels(), 'ours', 'a bad name leaves the mode')
  em.cpu_kernels(before)
  H.check(info:find('conv2d forward float32 NCHW: ', 1, true) ~= nil, info)
  H.check(info:find('matmul bfloat16: ', 1, true) ~= nil, info)
end)

-- conv2d forward and backward through autograd, in mode; returns y, gx, gw, gb.
local function conv_run(mode, x, w, b, opt, gy)
  return with_mode(mode, function()
    local xl, wl = x:clone():requires_grad_(), w:clone():requires_grad_()
    local bl = b and b:clone():requires_grad_() or nil
    local y = F.conv2d(xl, wl, bl, opt.stride, opt.padding, opt.dilation, opt.groups)
    y:backward(gy or em.ones_like(y))
    return y:detach(), xl.grad, wl.grad, bl and bl.grad
  end)
end

local CASES = {
  { 'plain 3x3', { 4, 8, 12, 12 }, { 16, 8, 3, 3 }, { stride = 1, padding = 1 } },
  { 'stride 2, no bias', { 3, 6, 11, 9 }, { 10, 6, 3, 3 }, { stride = 2, padding = 1 }, true },
  { 'dilation 2', { 2, 5, 13, 13 }, { 7, 5, 3, 3 }, { stride = 1, padding = 2, dilation = 2 } },
  { 'groups 2, 1x1', { 2, 8, 7, 7 }, { 6, 4, 1, 1 }, { stride = 1, padding = 0, groups = 2 } },
  { 'groups 4, asymmetric', { 2, 8, 9, 6 }, { 8, 2, 3, 2 }, { stride = { 2, 1 }, padding = { 1, 0 }, groups = 4 } },
  { 'floor drops a row', { 2, 3, 5, 5 }, { 4, 3, 2, 2 }, { stride = 2, padding = 0 } },
}

H.test('conv2d float32: oneDNN against ours, forward and backward', function()
  if not have then H.skip(SKIP); return end
  em.manual_seed(3)
  local function cached() return tonumber(em.cpu_kernels_info():match('primitives cached: (%d+)')) end
  local before = cached()
  for _, c in ipairs(CASES) do
    local x, w = em.randn(unpack(c[2])),
                 em.randn(unpack(c[3]))
    local b = not c[5] and em.randn(c[3][1]) or nil
    local y0, gx0, gw0, gb0 = conv_run('ours', x, w, b, c[4])
    local gy = em.randn(unpack(y0.shape))
    y0, gx0, gw0, gb0 = conv_run('ours', x, w, b, c[4], gy)
    local y1, gx1, gw1, gb1 = conv_run('onednn', x, w, b, c[4], gy)
    H.check(rel(y1, y0) < 1e-5, c[1] .. ': y ' .. rel(y1, y0))
    H.check(rel(gx1, gx0) < 1e-5, c[1] .. ': gx ' .. rel(gx1, gx0))
    H.check(rel(gw1, gw0) < 1e-5, c[1] .. ': gw ' .. rel(gw1, gw0))
    if b then H.check(rel(gb1, gb0) < 1e-5, c[1] .. ': gb ' .. rel(gb1, gb0)) end
    local y2 = conv_run('onednn-blocked', x, w, b, c[4], gy)
    H.check(rel(y2, y0) < 1e-5, c[1] .. ': blocked y ' .. rel(y2, y0))
  end
  -- oneDNN served them: three primitives (forward, backward data and weights) each
  H.check(cached() >= before + 3 * #CASES, 'primitives made: ' .. (cached() - before))
end)

H.test('conv2d float32: non-contiguous inputs are made contiguous first', function()
  if not have then H.skip(SKIP); return end
  em.manual_seed(4)
  local big = em.randn(3, 16, 10, 12)
  local x = big:narrow(2, 3, 6):narrow(4, 2, 9)          -- strided view
  local xt = em.randn(3, 6, 9, 10):transpose(3, 4)        -- H and W swapped
  local w = em.randn(5, 6, 3, 3):transpose(3, 4)          -- weight as a view
  for _, xi in ipairs({ x, xt }) do
    local y0, gx0, gw0 = conv_run('ours', xi, w, nil, { stride = 1, padding = 1 })
    local y1, gx1, gw1 = conv_run('onednn', xi, w, nil, { stride = 1, padding = 1 })
    H.check(rel(y1, y0) < 1e-5, 'y ' .. rel(y1, y0))
    H.check(rel(gx1, gx0) < 1e-5, 'gx ' .. rel(gx1, gx0))
    H.check(rel(gw1, gw0) < 1e-5, 'gw ' .. rel(gw1, gw0))
  end
end)

H.test('conv2d bfloat16: oneDNN against ours in float32 on the same values', function()
  if not have then
    H.raises(function() F.conv2d(em.randn(1, 2, 4, 4):to('bfloat16'),
      em.randn(3, 2, 3, 3):to('bfloat16')) end, 'conv2d', 'bfloat16')
    H.skip(SKIP); return
  end
  em.manual_seed(5)
  for _, c in ipairs(CASES) do
    local x = em.randn(unpack(c[2])):to('bfloat16')
    local w = em.randn(unpack(c[3])):to('bfloat16')
    local b = not c[5] and em.randn(c[3][1]):to('bfloat16') or nil
    local y0 = conv_run('ours', x:to('float32'), w:to('float32'), b and b:to('float32'), c[4])
    local gy = em.randn(unpack(y0.shape)):to('bfloat16')
    local y0_, gx0, gw0, gb0 = conv_run('ours', x:to('float32'), w:to('float32'),
      b and b:to('float32'), c[4], gy:to('float32'))
    local y1, gx1, gw1, gb1 = conv_run('onednn', x, w, b, c[4], gy)
    H.eq(y1.dtype, 'bfloat16')
    -- float32 accumulation, one rounding to bfloat16 (8 bits): within 2^-7
    H.check(rel(y1, y0_) < 1e-2, c[1] .. ': y ' .. rel(y1, y0_))
    H.check(rel(gx1, gx0) < 1e-2, c[1] .. ': gx ' .. rel(gx1, gx0))
    H.check(rel(gw1, gw0) < 1e-2, c[1] .. ': gw ' .. rel(gw1, gw0))
    if b then H.check(rel(gb1, gb0) < 1e-2, c[1] .. ': gb ' .. rel(gb1, gb0)) end
  end
  -- without oneDNN's kernels a bfloat16 conv widens to float32 (conv_lowp.c)
  with_mode('ours', function()
    local x, w = em.randn(1, 2, 5, 5):to('bfloat16'), em.randn(3, 2, 3, 3):to('bfloat16')
    local y = F.conv2d(x, w)
    H.eq(y.dtype, 'bfloat16')
    H.check(rel(y, F.conv2d(x:float(), w:float())) < 1e-2, 'bf16 through float32')
  end)
end)

-- NHWC tensors at the CPU backend's conv entry (the ops layer hands NCHW today).
ffi.cdef [[
typedef struct { int64_t N, C, H, W, O, kH, kW, OH, OW, sH, sW, pH, pW, dH, dW, G; } test_conv_geom;
void *emi_cpu_device(em_state *S);
int emi_cpu_conv2d(void *d, const test_conv_geom *g, em_tensor *y, const em_tensor *x,
                   const em_tensor *w, const em_tensor *b);
int emi_cpu_conv2d_backward(void *d, const test_conv_geom *g, em_tensor *gx, em_tensor *gw,
                            em_tensor *gb, const em_tensor *gy, const em_tensor *x,
                            const em_tensor *w);
int emi_dnnl_conv2d(em_state *S, const test_conv_geom *g, em_tensor *y, const em_tensor *x,
                    const em_tensor *w, const em_tensor *b, bool *served);
]]

local function nhwc(t)   -- same values, channels-last memory
  local n, c, h, w = unpack(t.shape)
  local o = em.empty(n, h, w, c, { dtype = t.dtype }):permute(1, 4, 2, 3)
  o:copy_(t)
  return o
end

H.test('conv2d NHWC at the backend entry: float32 and bfloat16', function()
  if not have then H.skip(SKIP); return end
  local C, S, Hd = core.C, core.S, core.H
  local dev = C.emi_cpu_device(S)
  em.manual_seed(6)
  local N, Ci, Hh, W, O = 2, 6, 9, 8, 10
  local g = ffi.new('test_conv_geom', { N, Ci, Hh, W, O, 3, 3, 5, 4, 2, 2, 1, 1, 1, 1, 1 })
  for _, dt in ipairs({ 'float32', 'bfloat16' }) do
    local x = em.randn(N, Ci, Hh, W):to(dt)
    local w = em.randn(O, Ci, 3, 3):to(dt)
    local b = em.randn(O):to(dt)
    local gy = em.randn(N, O, 5, 4):to(dt)
    -- reference: ours in float32 NCHW on the same values
    local y0, gx0, gw0, gb0 = conv_run('ours', x:to('float32'), w:to('float32'),
      b:to('float32'), { stride = 2, padding = 1 }, gy:to('float32'))
    local xn, gyn = nhwc(x), nhwc(gy)
    local y, gx = nhwc(em.zeros(N, O, 5, 4):to(dt)), nhwc(em.zeros(N, Ci, Hh, W):to(dt))
    local gw, gb = em.zeros(O, Ci, 3, 3):to(dt), em.zeros(O):to(dt)
    with_mode('onednn', function()
      H.eq(C.emi_cpu_conv2d(dev, g, Hd(y), Hd(xn), Hd(w), Hd(b)), 0)
      H.eq(C.emi_cpu_conv2d_backward(dev, g, Hd(gx), Hd(gw), Hd(gb), Hd(gyn), Hd(xn), Hd(w)), 0)
    end)
    local tol = dt == 'float32' and 1e-5 or 1e-2
    H.check(rel(y, y0) < tol, dt .. ' y ' .. rel(y, y0))
    H.check(rel(gx, gx0) < tol, dt .. ' gx ' .. rel(gx, gx0))
    H.check(rel(gw, gw0) < tol, dt .. ' gw ' .. rel(gw, gw0))
    H.check(rel(gb, gb0) < tol, dt .. ' gb ' .. rel(gb, gb0))
    H.check(y:stride()[2] == 1, 'the output kept its NHWC strides')
  end
end)

-- oneDNN is given dense NCHW and NHWC tensors only; other strides are declined (the
-- ops layer makes them contiguous before the backend sees them).
H.test('the oneDNN entry serves NCHW and NHWC and declines other strides', function()
  if not have then H.skip(SKIP); return end
  local C, S, Hd = core.C, core.S, core.H
  local g = ffi.new('test_conv_geom', { 2, 4, 6, 6, 5, 3, 3, 6, 6, 1, 1, 1, 1, 1, 1, 1 })
  local w, served = em.randn(5, 4, 3, 3), ffi.new('bool[1]')
  local y = em.zeros(2, 5, 6, 6)
  local dense = em.randn(2, 4, 6, 6)
  local xs = {
    { 'NCHW', dense, true },
    { 'NHWC', nhwc(dense), true },
    { 'every other channel', em.randn(2, 8, 6, 6):narrow(2, 1, 4), false },
    { 'H and W swapped', em.randn(2, 4, 6, 6):transpose(3, 4), false },
    { 'a narrowed width', em.randn(2, 4, 6, 12):narrow(4, 1, 6), false },
  }
  with_mode('onednn', function()
    for _, c in ipairs(xs) do
      served[0] = false
      y:zero_()
      H.eq(C.emi_dnnl_conv2d(S, g, Hd(y), Hd(c[2]), Hd(w), nil, served), 0, c[1])
      H.eq(served[0], c[3], c[1])
      if c[3] then
        local y0 = with_mode('ours', function()
          return F.conv2d(c[2]:contiguous(), w, nil, 1, 1)
        end)
        H.check(rel(y, y0) < 1e-5, c[1] .. ' ' .. rel(y, y0))
      else
        H.eq(y:abs():sum():item(), 0, c[1] .. ': nothing written')
      end
    end
  end)
  with_mode('ours', function()
    served[0] = true
    H.eq(C.emi_dnnl_conv2d(S, g, Hd(y), Hd(dense), Hd(w), nil, served), 0)
    H.eq(served[0], false, "mode 'ours' declines")
  end)
end)

H.test('matmul: oneDNN against ours, transposed operands, float32 and bfloat16', function()
  if not have then H.skip(SKIP); return end
  em.manual_seed(7)
  for _, dt in ipairs({ 'float32', 'bfloat16' }) do
    local a, w = em.randn(33, 70):to(dt), em.randn(50, 70):to(dt)
    local cases = {
      { 'a @ w^T', function() return em.matmul(a, w:t()) end },
      { 'a^T @ a', function() return em.matmul(a:t(), a) end },
      { 'small', function() return em.matmul(a:narrow(1, 1, 1), w:t()) end },
      { 'strided rows', function() return em.matmul(a:narrow(2, 3, 40), w:narrow(2, 5, 40):t()) end },
    }
    for _, c in ipairs(cases) do
      local r0 = with_mode('ours', c[2])
      local r1 = with_mode('onednn', c[2])
      H.eq(r1.dtype, dt)
      local tol = dt == 'float32' and 1e-5 or 1e-2
      H.check(rel(r1, r0) < tol, dt .. ' ' .. c[1] .. ' ' .. rel(r1, r0))
    end
  end
end)

H.test('one thread and two give the same oneDNN results', function()
  if not have then H.skip(SKIP); return end
  em.manual_seed(8)
  local x, w = em.randn(4, 8, 10, 10), em.randn(12, 8, 3, 3)
  local n = em.get_num_threads()
  em.set_num_threads(1)
  local y1 = conv_run('onednn', x, w, nil, { stride = 1, padding = 1 })
  em.set_num_threads(2)
  local y2 = conv_run('onednn', x, w, nil, { stride = 1, padding = 1 })
  em.set_num_threads(n)
  local y0 = conv_run('ours', x, w, nil, { stride = 1, padding = 1 })
  H.check(rel(y1, y0) < 1e-5 and rel(y2, y0) < 1e-5, 'threads ' .. rel(y1, y0) .. ' ' .. rel(y2, y0))
  H.check(em.cpu_kernels_info():find('primitives cached: [1-9]') ~= nil, 'primitives were cached')
end)

-- A library that is not oneDNN (here libm) in its place: ember says why and runs its
-- own kernels; a bfloat16 conv runs through float32 (each output 18, 12 of them).
local CHILD = [[
local em = require 'ember'
print(em.cpu_kernels_info():match('^[^\n]*'))
em.cpu_kernels('onednn')
local y = em.nn.functional.conv2d(em.ones(1, 2, 4, 4), em.ones(3, 2, 3, 3), nil, 1, 1)
print('sum', y:sum():item())
local ok, r = pcall(em.nn.functional.conv2d, em.ones(1, 2, 4, 4):to('bfloat16'),
  em.ones(3, 2, 3, 3):to('bfloat16'))
print('bf16', ok, ok and r:float():sum():item() or r)
]]

-- Runs CHILD in a new ember with env (a prefix of VAR=value words); its output.
local function child(env)
  local script = os.tmpname()
  local f = assert(io.open(script, 'w'))
  f:write(CHILD)
  f:close()
  local p = io.popen(('%s %q %q 2>&1; echo "exit=$?"'):format(env, arg[-1] or 'ember', script))
  local out = p:read('*a')
  p:close()
  os.remove(script)
  return out
end

H.test('without a usable oneDNN: ours, and --info says why', function()
  local out = child('EMBER_DNNL_LIB=libm.so.6')
  H.check(out:find('oneDNN: not used (libm.so.6 lacks dnnl_', 1, true) ~= nil or
          out:find('oneDNN: not used (a sanitizer build', 1, true) ~= nil, out)
  -- each output is the sum over 2 channels of a 3x3 window clipped by the border
  H.check(out:find('sum\t' .. (3 * 2 * (4 * 4 + 8 * 6 + 4 * 9))) ~= nil, out)
  H.check(out:find('bf16\ttrue\t216') ~= nil, out)
  H.check(out:find('exit=0', 1, true) ~= nil, out)
end)

-- Capped at AVX2, oneDNN has no bfloat16 conv: making the primitive fails, the case
-- is declined (ember's float32 path serves it), and the float32 conv still runs in
-- oneDNN.
H.test('a primitive oneDNN cannot make is declined cleanly', function()
  if not have then H.skip(SKIP); return end
  local out = child('ONEDNN_MAX_CPU_ISA=AVX2')
  H.check(out:find('^oneDNN %d[^\n]*avx2') ~= nil, out)
  H.check(out:find('sum\t600') ~= nil, out)
  H.check(out:find('bf16\ttrue\t216') ~= nil, out)
  H.check(out:find('exit=0', 1, true) ~= nil, out)
end)

H.done()

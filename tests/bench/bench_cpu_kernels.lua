--[[
bench_cpu_kernels.lua -- ember's own CPU kernels against oneDNN's, in the same run,
on the benchmark shapes: the Fashion-MNIST CNN's convs (batch 128), the 18-layer
ResNet for 32x32 inputs (stem 16 filters, stages 16/32/64/128, batch 64), forward,
backward-data and backward-weights, float32 and bfloat16, NCHW and NHWC; matmul on
the 512-2048-2048-10 MLP (batch 32) and the batch-1 inference MLP (32-64-4).

  ember tests/bench/bench_cpu_kernels.lua [--quick] [--only LUA-PATTERN]

(--only keeps the conv groups "net dir dtype layout" and matmul rows "name dir
dtype" that match, e.g. --only 'resnet18 bwd_weights bfloat16'.)

Each case times the modes of em.cpu_kernels alternately ('ours', 'onednn': the
tensors as they are, 'onednn-blocked': activations reordered to oneDNN's blocked
format and back) and prints the ratios of the best repetitions, ours/mode (> 1: oneDNN faster).
The convs are called at the CPU backend's entry (the layer under em_conv2d), so
NHWC tensors reach it before the ops layer keeps channels-last. ember has no
bfloat16 or NHWC conv of its own: 'ours' there is what it would otherwise do,
widen to float32 (or convert to NCHW), compute, and convert back, conversions
timed. The summary lines weigh each ResNet conv by how often the net runs it:
they are what dnnl.c's decision table follows.
]]
local dir = arg[0]:match('^(.*/)') or './'
local B = dofile(dir .. 'common.lua')
local em = B.em
local ffi = require 'ffi'
local core = require 'ember.ffi'
local C, S, H = core.C, core.S, core.H
local quick, only = false, nil
for i = 1, #arg do
  if arg[i] == '--quick' then quick = true end
  if arg[i] == '--only' then only = arg[i + 1] end
end
local function wanted(s) return not only or s:find(only) ~= nil end

if not em.cpu_kernels then print('SKIP cpu_kernels: this ember has no em.cpu_kernels'); return end
local info = em.cpu_kernels_info()
print(info)
if not info:find('^oneDNN %d') then
  print('SKIP cpu_kernels: oneDNN not available')
  return
end

ffi.cdef [[
typedef struct { int64_t N, C, H, W, O, kH, kW, OH, OW, sH, sW, pH, pW, dH, dW, G; } bench_conv_geom;
void *emi_cpu_device(em_state *S);
int emi_cpu_conv2d(void *d, const bench_conv_geom *g, em_tensor *y, const em_tensor *x,
                   const em_tensor *w, const em_tensor *b);
int emi_cpu_conv2d_backward(void *d, const bench_conv_geom *g, em_tensor *gx, em_tensor *gw,
                            em_tensor *gb, const em_tensor *gy, const em_tensor *x,
                            const em_tensor *w);
]]
local dev = C.emi_cpu_device(S)

-- An (N, C, H, W) tensor with NCHW or NHWC memory order.
local function act(n, c, h, w, dt, nhwc, fill)
  local t
  if nhwc then t = em.empty(n, h, w, c, { dtype = dt }):permute(1, 4, 2, 3)
  else t = em.empty(n, c, h, w, { dtype = dt }) end
  if fill then t:copy_(em.randn(n, c, h, w)) end
  return t
end

local function check(st, what) if st ~= 0 then core.fail() end end

-- One conv case: returns fn(mode) that runs it once in that mode.
local function conv_case(s, dir_, dt, nhwc)
  local N, Ci, Hh, W, O, k, st, p = s[1], s[2], s[3], s[4], s[5], s[6], s[7], s[8]
  local OH, OW = math.floor((Hh + 2 * p - k) / st) + 1, math.floor((W + 2 * p - k) / st) + 1
  local g = ffi.new('bench_conv_geom', { N, Ci, Hh, W, O, k, k, OH, OW, st, st, p, p, 1, 1, 1 })
  local x = act(N, Ci, Hh, W, dt, nhwc, true)
  local w = em.randn(O, Ci, k, k):mul(0.1):to(dt)
  local y = act(N, O, OH, OW, dt, nhwc, dir_ ~= 'fwd')   -- gy for the backward
  local out = dir_ == 'fwd' and y or dir_ == 'bwd_data' and act(N, Ci, Hh, W, dt, nhwc)
    or em.empty(O, Ci, k, k, { dtype = dt })
  -- float32 NCHW copies for ours where ember has no kernel (bfloat16, NHWC)
  local plain = dt == 'float32' and not nhwc
  local xf, wf, yf, of
  if not plain then
    xf, wf = x:to('float32'):contiguous(), w:to('float32')
    yf = y:to('float32'):contiguous()
    of = dir_ == 'bwd_data' and em.empty(N, Ci, Hh, W) or dir_ == 'fwd' and em.empty(N, O, OH, OW)
      or em.empty(O, Ci, k, k)
  end
  local function run(X, Wt, Y, Out)
    if dir_ == 'fwd' then check(C.emi_cpu_conv2d(dev, g, H(Out), H(X), H(Wt), nil))
    elseif dir_ == 'bwd_data' then
      check(C.emi_cpu_conv2d_backward(dev, g, H(Out), nil, nil, H(Y), H(X), H(Wt)))
    else check(C.emi_cpu_conv2d_backward(dev, g, nil, H(Out), nil, H(Y), H(X), H(Wt))) end
  end
  return function(mode)
    em.cpu_kernels(mode)
    if mode ~= 'ours' or plain then return run(x, w, y, out) end
    -- ours without a kernel of its own: convert in, compute in float32 NCHW, convert out
    if dir_ ~= 'bwd_data' then xf:copy_(x) end
    if dir_ ~= 'fwd' then yf:copy_(y) end
    wf:copy_(w)
    run(xf, wf, yf, of)
    out:copy_(of)
  end
end

local MODES = { 'ours', 'onednn', 'onednn-blocked' }

-- Median seconds per run of each mode, alternating modes within each repetition.
local function measure(fn, modes)
  for _, m in ipairs(modes) do fn(m) end            -- primitives made, caches warm
  local t0 = B.now(); fn(modes[1]); local once = math.max(B.now() - t0, 1e-6)
  local n = math.max(1, math.min(50, math.floor((quick and 0.01 or 0.03) / once)))
  local times = {}
  for _, m in ipairs(modes) do times[m] = {} end
  for r = 1, quick and 3 or 7 do
    for _, m in ipairs(modes) do
      local t = B.now()
      for _ = 1, n do fn(m) end
      times[m][r] = (B.now() - t) / n
    end
  end
  -- the best repetition: the CPU is shared with other work, and the fastest run
  -- of each mode is the one least disturbed by it
  local best = {}
  for _, m in ipairs(modes) do best[m] = math.min(unpack(times[m])) end
  return best
end

-- {N, C, H, W, O, k, stride, pad}, and how many times the net runs it
local CNN = { { 128, 1, 28, 28, 32, 3, 1, 1, 1, 'cnn.conv1' }, { 128, 32, 14, 14, 64, 3, 1, 1, 1, 'cnn.conv2' } }
local RESNET = {
  { 64, 3, 32, 32, 16, 3, 1, 1, 1, 'stem' }, { 64, 16, 32, 32, 16, 3, 1, 1, 4, 'l1' },
  { 64, 16, 32, 32, 32, 3, 2, 1, 1, 'l2.down3x3' }, { 64, 32, 16, 16, 32, 3, 1, 1, 3, 'l2' },
  { 64, 16, 32, 32, 32, 1, 2, 0, 1, 'l2.ds1x1' },
  { 64, 32, 16, 16, 64, 3, 2, 1, 1, 'l3.down3x3' }, { 64, 64, 8, 8, 64, 3, 1, 1, 3, 'l3' },
  { 64, 32, 16, 16, 64, 1, 2, 0, 1, 'l3.ds1x1' },
  { 64, 64, 8, 8, 128, 3, 2, 1, 1, 'l4.down3x3' }, { 64, 128, 4, 4, 128, 3, 1, 1, 3, 'l4' },
  { 64, 64, 8, 8, 128, 1, 2, 0, 1, 'l4.ds1x1' },
}

print(('%-12s %-9s %-8s %-4s %10s %9s %9s'):format('conv', 'dir', 'dtype', 'lay',
  'ours ms', '/onednn', '/blocked'))
local summary = {}
for _, net in ipairs({ { 'cnn', CNN }, { 'resnet18', RESNET } }) do
  for _, dt in ipairs({ 'float32', 'bfloat16' }) do
    for _, lay in ipairs({ 'NCHW', 'NHWC' }) do
      for _, d in ipairs({ 'fwd', 'bwd_data', 'bwd_weights' }) do
       if wanted(('%s %s %s %s'):format(net[1], d, dt, lay)) then
        local tot = {}
        for _, m in ipairs(MODES) do tot[m] = 0 end
        for _, s in ipairs(net[2]) do
          if not (d == 'bwd_data' and s[2] == 1) then   -- the first layer needs no gx
            local med = measure(conv_case(s, d, dt, lay == 'NHWC'), MODES)
            for _, m in ipairs(MODES) do tot[m] = tot[m] + med[m] * s[9] end
            print(('%-12s %-9s %-8s %-4s %10.3f %9.2f %9.2f'):format(s[10], d, dt, lay,
              med.ours * 1e3, med.ours / med.onednn, med.ours / med['onednn-blocked']))
            collectgarbage()
          end
        end
        summary[#summary + 1] = ('%-8s %-11s %-8s %-4s ours %8.2f ms  ours/onednn %5.2f  ours/blocked %5.2f')
          :format(net[1], d, dt, lay, tot.ours * 1e3, tot.ours / tot.onednn,
                  tot.ours / tot['onednn-blocked'])
        B.result(('cpu_conv_%s_%s_%s_%s'):format(net[1], d, dt, lay:lower()),
          tot.ours / math.min(tot.onednn, tot['onednn-blocked']), 'x', 'higher',
          'ours/best oneDNN')
       end
      end
    end
  end
end

-- -- Matmul ---------------------------------------------------------------------------
-- The MLP's products: forward x @ w^T, backward gy @ w (data) and gy^T @ x (weights),
-- the weight as nn.Linear keeps it (out, in), read through transposed views.
local MM = {
  { 32, 512, 2048, 'mlp.fc1' }, { 32, 2048, 2048, 'mlp.fc2' }, { 32, 2048, 10, 'mlp.fc3' },
  { 1, 32, 64, 'infer.fc1' }, { 1, 64, 4, 'infer.fc2' },
}
print(('%-10s %-9s %-8s %10s %9s'):format('matmul', 'dir', 'dtype', 'ours us', '/onednn'))
for _, dt in ipairs({ 'float32', 'bfloat16' }) do
  for _, s in ipairs(MM) do
    local M, K, N = s[1], s[2], s[3]
    local x, w = em.randn(M, K):to(dt), em.randn(N, K):mul(0.05):to(dt)
    local gy = em.randn(M, N):to(dt)
    local dirs = { { 'fwd', function() return em.matmul(x, w:t()) end } }
    if M > 1 then
      dirs[2] = { 'bwd_data', function() return em.matmul(gy, w) end }
      dirs[3] = { 'bwd_weights', function() return em.matmul(gy:t(), x) end }
    end
    for _, d in ipairs(dirs) do
     if wanted(('%s %s %s'):format(s[4], d[1], dt)) then
      local med = measure(function(mode) em.cpu_kernels(mode); return d[2]() end,
        { 'ours', 'onednn' })
      print(('%-10s %-9s %-8s %10.2f %9.2f'):format(s[4], d[1], dt, med.ours * 1e6,
        med.ours / med.onednn))
      B.result(('cpu_matmul_%s_%s_%s'):format(s[4], d[1], dt), med.ours / med.onednn, 'x',
        'higher', 'ours/oneDNN')
     end
    end
  end
end
em.cpu_kernels('auto')

-- -- libxsmm ---------------------------------------------------------------------------
-- Debian ships libxsmm as static libraries only: bench_xsmm.c, built here against
-- this build's libember.so, times its kernels beside em_matmul.
local function xsmm()
  local a, nob = '/usr/lib/libxsmm.a', '/usr/lib/libxsmmnoblas.a'
  local f = io.open(a, 'rb')
  if not f then print('SKIP cpu_xsmm: no ' .. a .. ' (apt-get install libxsmm-dev)'); return end
  f:close()
  local build = core.dir .. '/../..'
  local exe = os.tmpname()
  local cmd = ('cc -O2 -I%q %q -o %q -L%q -lember -Wl,-rpath,%q %q %q -lpthread -ldl -lm 2>&1')
    :format(dir .. '../../core/include', dir .. 'bench_xsmm.c', exe, build, build, a, nob)
  local p = io.popen(cmd)
  local msg = p:read('*a')
  if not p:close() or msg:match('error') then
    print('SKIP cpu_xsmm: cc failed: ' .. msg:gsub('\n', ' '):sub(1, 200))
  else
    p = io.popen(('%q %d'):format(exe, quick and 20000 or 100000))
    io.write(p:read('*a'))
    p:close()
  end
  os.remove(exe)
end
if wanted('xsmm') then xsmm() end

print('summary (ResNet convs weighted by their count in the net):')
for _, l in ipairs(summary) do print('  ' .. l) end

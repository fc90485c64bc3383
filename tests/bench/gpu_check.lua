--[[
gpu_check.lua -- one pass over every family of device work on the real GPU (no
emulation), each result against the CPU backend, one line per check:

  <family>/<what>  max_err <e>  tol <t>  PASS|FAIL [why]

The families: element-wise (broadcast, strided, casts), reductions (whole-tensor sums
past one block, rows, var/norm, arg, softmax), index ops, matmul (f32 with TF32 off,
f64, bf16, batched), seeded random draws, the losses, layer norm, SGD/Adam/AdamW and
clip_grad_norm, pooling, batch norm (train and eval), conv forward and backward, a
training step captured with em.cuda.graph and replayed, the pinned loader feeding a
model, and GPU replicas over NCCL (two on one device where NCCL allows it; with one
replica there is nothing to agree on, so that check is a skip saying why).
Gradients are compared too wherever an op has them. It ends with `#counts P F S` as
the test programs do, so tests/bench/gpu_run.sh counts it.

  ember tests/bench/gpu_check.lua [--only PATTERN]

On the emulator (EMBER_CUDA_EMULATE) it runs the same checks, which is how it is
kept working without a GPU; tests/lua/test_gpu_check.lua does that in make test.
]]
local em = require 'ember'
local F = em.nn.F
local only = arg and arg[1] == '--only' and arg[2] or nil
local passed, failed, skipped = 0, 0, 0

if not em.cuda.is_available() then
  print('skip: no CUDA device: ' .. tostring(em.cuda.why_not and em.cuda.why_not() or '?'))
  print('#counts 0 0 1')
  return
end
print(('gpu_check: %d device(s), %s'):format(em.cuda.device_count(),
  em.cuda.emulated() and 'EMULATED (not a GPU result)' or 'real GPU'))
if em.cuda.allow_tf32 then em.cuda.allow_tf32(false) end

-- The largest |a - b| over two tensors of one shape, any devices, in float64.
local function maxerr(a, b)
  if a.shape and b.shape and #a.shape ~= #b.shape then error('shapes differ') end
  local x, y = a:cpu():double(), b:cpu():double()
  if x:numel() == 0 then return 0 end
  local d = (x - y):abs():max():item()
  if d ~= d then error('NaN in the result') end
  return d
end

-- Tolerance relative to the reference's largest magnitude.
local function rel(ref, k)
  local m = ref:numel() > 0 and ref:cpu():double():abs():max():item() or 0
  return k * math.max(1, m)
end

-- What a check's fn returns, with the reason, when it cannot check here.
local SKIP = {}

-- check(name, fn): fn returns err, tol (or SKIP, why); any error raised is a failure
-- with its text.
local function check(name, fn)
  if only and not name:find(only) then return end
  local t0 = em.clock()
  local ok, err, tol = pcall(fn)
  local ms = (em.clock() - t0) * 1e3
  if ok and err == SKIP then
    skipped = skipped + 1
    print(('%-36s SKIP  %s'):format(name, tostring(tol)))
  elseif ok and type(err) == 'number' and err <= tol then
    passed = passed + 1
    print(('%-36s max_err %-10.3g tol %-9.3g PASS  (%.0f ms)'):format(name, err, tol, ms))
  else
    failed = failed + 1
    if ok then
      print(('%-36s max_err %-10.3g tol %-9.3g FAIL  (%.0f ms)'):format(name, err or -1, tol or -1, ms))
    else
      print(('%-36s FAIL  raised: %s'):format(name, tostring(err)))
    end
  end
  io.stdout:flush()
end

-- fwd_bwd(fn, inputs, k): fn on CPU leaves and on cuda copies; compares the outputs and,
-- backward from (out * w):sum(), the gradient of every float input. Returns the worst
-- error over all, and its tolerance.
local function fwd_bwd(fn, inputs, k, grads)
  local lc, ld = {}, {}
  for i, t in ipairs(inputs) do
    lc[i] = t:clone(); ld[i] = t:cuda()
    if grads ~= false and t.dtype:find('float') then lc[i]:requires_grad_(); ld[i]:requires_grad_() end
  end
  local yc, yd = fn(unpack(lc)), fn(unpack(ld))
  local e, tol = maxerr(yc, yd), rel(yc, k)
  if grads == false then return e, tol end
  local w = em.randn(yc.shape, { dtype = yc.dtype })
  ;(yc * w):sum():backward()
  ;(yd * w:cuda()):sum():backward()
  local worst = e / tol
  for i = 1, #inputs do
    if lc[i].requires_grad and lc[i].grad then
      if not ld[i].grad then error('input ' .. i .. ' has no gradient on cuda') end
      local ge, gt = maxerr(lc[i].grad, ld[i].grad), rel(lc[i].grad, k)
      worst = math.max(worst, ge / gt)
    end
  end
  return worst * tol, tol
end

em.manual_seed(1)
local f32, f64 = { dtype = 'float32' }, { dtype = 'float64' }

-- -- Element-wise --------------------------------------------------------------------------
check('elementwise/add_broadcast', function()
  local a, b = em.randn({ 300, 257 }), em.randn({ 257 })
  return fwd_bwd(function(x, y) return x + y end, { a, b }, 1e-6)
end)
check('elementwise/mul_strided', function()
  local a, b = em.randn({ 257, 300 }), em.randn({ 300, 257 })
  return fwd_bwd(function(x, y) return x:t() * y end, { a, b }, 1e-6)
end)
check('elementwise/unary_f32', function()
  local a = em.rand({ 1048576 }) * 4 + 0.1
  return fwd_bwd(function(x) return x:exp():log() + x:sin() + x:tanh() + x:sigmoid() + x:sqrt() end,
                 { a }, 1e-5)
end)
check('elementwise/unary_f64', function()
  local a = em.rand({ 70000 }, f64) * 4 + 0.1
  return fwd_bwd(function(x) return x:exp():log() + x:sin() + x:cos() + x:tanh() end, { a }, 1e-12)
end)
check('elementwise/casts', function()
  local a = em.randn({ 1000, 33 }) * 100
  local e = 0
  for _, dt in ipairs { 'float16', 'bfloat16', 'int32', 'uint8', 'float64', 'bool' } do
    e = math.max(e, maxerr(a:to(dt), a:cuda():to(dt)))
  end
  return e, 0
end)
check('elementwise/where_clamp', function()
  local a, b = em.randn({ 513, 129 }), em.randn({ 513, 129 })
  return fwd_bwd(function(x, y) return em.where(x:gt(0), x, y):clamp(-0.5, 0.7) end, { a, b }, 1e-6)
end)

-- -- Reductions --------------------------------------------------------------------------------
check('reduce/sum_all_16M', function()
  local a = em.rand({ 16777216 }, f64)
  return maxerr(a:sum(), a:cuda():sum()), rel(a:sum(), 1e-13)
end)
check('reduce/sum_all_f32_strided', function()
  local a = em.randn({ 4096, 3000 })
  local v = a:t()
  return maxerr(v:sum(), a:cuda():t():sum()), rel(v:sum(), 1e-4) + 1e-2
end)
check('reduce/rows_cols', function()
  local a = em.randn({ 1000, 777 }, f64)
  local e = math.max(maxerr(a:sum(1), a:cuda():sum(1)), maxerr(a:mean(2), a:cuda():mean(2)),
                     maxerr(a:max(2), a:cuda():max(2)), maxerr(a:min(1), a:cuda():min(1)))
  return e, 1e-10
end)
check('reduce/var_norm', function()
  local a = em.randn({ 500, 301 }, f64)
  local d = a:cuda()
  return math.max(maxerr(a:var(2), d:var(2)), maxerr(a:norm(), d:norm())), 1e-10
end)
check('reduce/argmax', function()
  local a = em.randn({ 999, 1000 })
  return maxerr(a:argmax(2), a:cuda():argmax(2)), 0
end)
check('reduce/softmax_logsoftmax', function()
  local a = em.randn({ 256, 4099 })
  return fwd_bwd(function(x) return x:softmax(2) + x:log_softmax(2) end, { a }, 1e-5)
end)

-- -- Index ops ---------------------------------------------------------------------------------
check('index/select_gather', function()
  local a = em.randn({ 500, 64 }, f64)
  local idx = em.randint(1, 501, { 3000 })
  local gi = em.randint(1, 65, { 500, 10 })
  local e = maxerr(a:index_select(1, idx), a:cuda():index_select(1, idx:cuda()))
  e = math.max(e, maxerr(a:gather(2, gi), a:cuda():gather(2, gi:cuda())))
  return e, 1e-12
end)

-- -- Matmul ---------------------------------------------------------------------------------------
check('matmul/f32_tf32_off', function()
  local a, b = em.randn({ 513, 1025 }), em.randn({ 1025, 257 })
  return fwd_bwd(function(x, y) return x:matmul(y) end, { a, b }, 1e-5)
end)
check('matmul/f64_batched_broadcast', function()
  local a, b = em.randn({ 7, 65, 33 }, f64), em.randn({ 33, 17 }, f64)
  return fwd_bwd(function(x, y) return x:matmul(y) end, { a, b }, 1e-12)
end)
check('matmul/bf16', function()
  local a, b = em.randn({ 256, 512 }), em.randn({ 512, 128 })
  local ref = a:bfloat16():float():matmul(b:bfloat16():float())
  return maxerr(ref, a:cuda():bfloat16():matmul(b:cuda():bfloat16()):float()), rel(ref, 1e-2)
end)
check('matmul/transposed_operands', function()
  local a, b = em.randn({ 300, 200 }), em.randn({ 100, 300 })
  return fwd_bwd(function(x, y) return x:t():matmul(y:t()) end, { a, b }, 1e-5)
end)

-- -- Random -----------------------------------------------------------------------------------------
check('random/seeded_same_as_cpu', function()
  em.manual_seed(42); local c1, c2 = em.rand({ 100003 }), em.randn({ 100003 }, f64)
  em.manual_seed(42)
  local d1, d2 = em.rand({ 100003 }, { device = 'cuda' }), em.randn({ 100003 }, { dtype = 'float64', device = 'cuda' })
  return math.max(maxerr(c1, d1), maxerr(c2, d2)), 1e-14
end)

-- -- Losses and layer norm ------------------------------------------------------------------------
check('loss/cross_entropy', function()
  local x, y = em.randn({ 512, 1000 }), em.randint(1, 1001, { 512 })
  return fwd_bwd(function(a) return F.cross_entropy(a, y:to(a.device), { label_smoothing = 0.1 }) end, { x }, 1e-5)
end)
check('loss/nll_mse_bce', function()
  local x, y, t = em.randn({ 300, 17 }), em.randint(1, 18, { 300 }), em.rand({ 300, 17 })
  return fwd_bwd(function(a)
    return F.nll_loss(a:log_softmax(2), y:to(a.device)) + F.mse_loss(a, t:to(a.device)) +
           F.binary_cross_entropy_with_logits(a, t:to(a.device))
  end, { x }, 1e-5)
end)
check('norm/layer_norm', function()
  local x, w, b = em.randn({ 64, 33, 1024 }), em.randn({ 1024 }), em.randn({ 1024 })
  return fwd_bwd(function(a, ww, bb) return F.layer_norm(a, { 1024 }, ww, bb, 1e-5) end, { x, w, b }, 1e-4)
end)

-- -- Pooling, batch norm, conv (cuDNN) --------------------------------------------------------------
check('dnn/max_avg_adaptive_pool', function()
  local x = em.randn({ 8, 16, 33, 31 })
  return fwd_bwd(function(a)
    return F.max_pool2d(a, 3, 2, 1):sum(4):narrow(3, 1, 16) + F.avg_pool2d(a, 2, 2):sum(4) +
           F.adaptive_avg_pool2d(a, { 16, 1 }):sum(4)
  end, { x }, 1e-5)
end)
check('dnn/batch_norm_train', function()
  local x, w, b = em.randn({ 16, 32, 14, 14 }) * 3 + 1, em.randn({ 32 }), em.randn({ 32 })
  local rmc, rvc = em.zeros({ 32 }), em.ones({ 32 })
  local rmd, rvd = rmc:cuda(), rvc:cuda()
  local e, tol = fwd_bwd(function(a, ww, bb)
    if a.device == 'cpu' then return F.batch_norm(a, rmc, rvc, ww, bb, true, 0.1, 1e-5) end
    return F.batch_norm(a, rmd, rvd, ww, bb, true, 0.1, 1e-5)
  end, { x, w, b }, 1e-4)
  return math.max(e, maxerr(rmc, rmd), maxerr(rvc, rvd)), tol
end)
check('dnn/batch_norm_eval', function()
  local x, w, b = em.randn({ 16, 32, 14, 14 }), em.randn({ 32 }), em.randn({ 32 })
  local rm, rv = em.randn({ 32 }), em.rand({ 32 }) + 0.5
  return fwd_bwd(function(a, ww, bb)
    return F.batch_norm(a, rm:to(a.device), rv:to(a.device), ww, bb, false, 0.1, 1e-5)
  end, { x, w, b }, 1e-4)
end)
check('dnn/conv2d_f32', function()
  local x, w, b = em.randn({ 8, 16, 32, 32 }), em.randn({ 32, 16, 3, 3 }) * 0.1, em.randn({ 32 })
  return fwd_bwd(function(a, ww, bb) return F.conv2d(a, ww, bb, 1, 1) end, { x, w, b }, 1e-4)
end)
check('dnn/conv2d_f64_strided_groups', function()
  local x, w = em.randn({ 4, 8, 17, 19 }, f64), em.randn({ 12, 4, 3, 5 }, f64)
  return fwd_bwd(function(a, ww) return F.conv2d(a, ww, nil, { 2, 1 }, { 1, 2 }, { 1, 2 }, 2) end,
                 { x, w }, 1e-10)
end)

-- -- Optimizers -----------------------------------------------------------------------------------------
local function optim_run(kind, opts, dev)
  em.manual_seed(7)
  local m = em.nn.Sequential(em.nn.Linear(64, 128), em.nn.ReLU(), em.nn.Linear(128, 10))
  if dev then m:to(dev) end
  local o = em.optim[kind](m:parameters(), opts)
  em.manual_seed(8)
  for _ = 1, 5 do
    local x, y = em.randn({ 32, 64 }), em.randint(1, 11, { 32 })
    if dev then x, y = x:to(dev), y:to(dev) end
    o:zero_grad()
    F.cross_entropy(m(x), y):backward()
    em.nn.utils.clip_grad_norm(m:parameters(), 0.5)
    o:step()
  end
  return m:parameters()
end
for _, c in ipairs {
  { 'SGD', { lr = 0.1, momentum = 0.9, weight_decay = 1e-4, nesterov = true } },
  { 'Adam', { lr = 1e-3 } }, { 'AdamW', { lr = 1e-3, weight_decay = 0.01 } } } do
  check('optim/' .. c[1] .. '+clip_grad_norm', function()
    local pc, pd = optim_run(c[1], c[2]), optim_run(c[1], c[2], 'cuda')
    local e = 0
    for i = 1, #pc do e = math.max(e, maxerr(pc[i], pd[i])) end
    return e, 1e-5
  end)
end

-- -- A captured training step, replayed -----------------------------------------------------------------
check('graph/captured_step_replay', function()
  local function setup()
    em.manual_seed(5)
    local m = em.nn.Sequential(em.nn.Linear(32, 64), em.nn.ReLU(), em.nn.Linear(64, 4))
    m:to('cuda')
    return m, em.optim.SGD(m:parameters(), { lr = 0.05, momentum = 0.9 })
  end
  local mg, og = setup()
  local md, od = setup()
  local x, y = em.zeros({ 16, 32 }, { device = 'cuda' }), em.zeros({ 16, 4 }, { device = 'cuda' })
  local function step(m, o, xs, ys)
    o:zero_grad()
    local loss = F.mse_loss(m(xs), ys)
    loss:backward()
    o:step()
    return loss
  end
  step(mg, og, x, y); step(md, od, x, y)
  local g = em.cuda.graph(function() return step(mg, og, x, y) end)
  local e = 0
  for _ = 1, 5 do
    local bx, by = em.randn({ 16, 32 }), em.randn({ 16, 4 })
    x:copy_(bx); y:copy_(by)
    local lg = g()
    local ld = step(md, od, bx:cuda(), by:cuda())
    e = math.max(e, math.abs(lg:item() - ld:item()))
  end
  local pg, pd = mg:parameters(), md:parameters()
  for k = 1, #pg do e = math.max(e, maxerr(pg[k], pd[k])) end
  return e, 1e-5
end)

-- -- The pinned loader feeding a model --------------------------------------------------------------------
check('loader/pinned_feed_training', function()
  local ds = em.data.synthetic { shape = { 1, 28, 28 }, classes = 10, size = 512, dtype = 'float32' }
  local function train(opts, dev)
    em.manual_seed(3)
    local m = em.nn.Sequential(em.nn.Conv2d(1, 8, 3, { padding = 1 }), em.nn.ReLU(),
                               em.nn.MaxPool2d(2), em.nn.Flatten(), em.nn.Linear(8 * 14 * 14, 10))
    if dev then m:to(dev) end
    local o = em.optim.SGD(m:parameters(), { lr = 0.05, momentum = 0.9 })
    local n, last = 0, nil
    for x, y in ds:batch(64):loader(opts):epoch(1) do
      if dev and not x.device:find('^' .. dev) then error('the loader gave a batch on ' .. x.device) end
      o:zero_grad()
      last = F.cross_entropy(m(x), y)
      last:backward()
      o:step()
      n = n + 1
    end
    if n ~= 8 then error(n .. ' batches, 8 expected') end
    return m:parameters(), last
  end
  local pc, lc = train { workers = 1 }
  local pd, ld = train({ workers = 2, pin_memory = true, device = 'cuda' }, 'cuda')
  local e = maxerr(lc, ld)
  for i = 1, #pc do e = math.max(e, maxerr(pc[i], pd[i])) end
  return e, 1e-4
end)

-- -- GPU replicas ------------------------------------------------------------------------------------------
-- Two replicas: on two GPUs over NCCL; on one GPU (NCCL refuses a device twice)
-- 'auto' picks threads averaging through pinned host memory.
check('replicas/nccl_equivalence', function()
  local root = os.getenv('EMBER_TESTS') or 'tests'
  local ember = arg[-1] or 'ember'
  local function run(devs)
    local cmd = ('%s --replicas %d --devices %s %s/lua/dist/gpu.lua equiv 3 0.0003 2>&1; echo "exit=$?"')
      :format(ember, select(2, devs:gsub(',', ',')) + 1, devs, root)
    local p = io.popen(cmd); local out = p:read('*a'); p:close()
    return out, tonumber(out:match('exit=(%d+)%s*$'))
  end
  local out, rc = run('cuda:0,cuda:0')
  local n = 2
  if rc ~= 0 and em.cuda.device_count() == 1 then
    print('  two replicas on one device failed; one replica instead. The error:')
    print('  ' .. out:gsub('\n', '\n  '))
    out, rc = run('cuda:0'); n = 1
  end
  if rc ~= 0 then error('exit ' .. tostring(rc) .. ':\n' .. out) end
  local worst, seen = 0, 0
  for d, agree in out:gmatch('maxdiff (%S+) replicas_agree (%S+)') do
    seen = seen + 1
    if agree ~= 'true' then error('replicas disagree:\n' .. out) end
    worst = math.max(worst, tonumber(d))
  end
  if seen ~= n then error(('%d of %d replicas reported:\n%s'):format(seen, n, out)) end
  -- one replica agrees with itself: the run worked, the equivalence is unchecked
  if n == 1 then
    return SKIP, 'two replicas on the one device failed here; one replica ran, ' ..
      'so nothing was compared across replicas'
  end
  return worst, 1e-5
end)

print(('#counts %d %d %d'):format(passed, failed, skipped))

--[[
test_cuda_amp_graph.lua -- a float16 autocast training step with its GradScaler
captured in em.cuda.graph, on the emulated runtime (EMBER_CUDA_EMULATE=1:256; the
test runs itself again with it otherwise): launches of the graph against the same
steps run eagerly -- the parameters, and the scale through a growth, an inf that
skips (weights and momentum bit for bit unchanged, on the device, without a read
on the host) and the growth after it -- and the errors for a capture that comes
before the first step.
]]
local dir = (arg and arg[0] and arg[0]:match('^(.*/)')) or
            ((os.getenv('EMBER_TESTS') or 'tests') .. '/lua/')
local H, em = dofile(dir .. 'cuda_emulated.lua')('1:256')


H.test('GradScaler in em.cuda.graph: launches match eager steps, an inf skips on the device', function()
  local function setup()
    em.manual_seed(4)
    -- moved before the optimizer is made: to() gives the model new parameter tensors
    local m = em.nn.Sequential(em.nn.Linear(6, 16), em.nn.Tanh(), em.nn.Linear(16, 3)):to('cuda')
    local opt = em.optim.SGD(m:parameters(), { lr = 0.05, momentum = 0.9 })
    return m, opt, em.amp.GradScaler{ init_scale = 1024, growth_interval = 3 }
  end
  local mg, og, sg = setup()
  local me, oe, se = setup()
  local x, y = em.zeros({ 8, 6 }, { device = 'cuda' }), em.zeros({ 8, 3 }, { device = 'cuda' })
  local function step(m, o, sc, xs, ys)
    o:zero_grad()
    local loss = em.amp.autocast('float16', function() return em.nn.F.mse_loss(m(xs), ys) end)
    sc:scale(loss):backward()
    local stepped = sc:step(o)
    sc:update()
    return loss, stepped
  end
  em.manual_seed(8)
  local bx, by = em.randn(8, 6), em.randn(8, 3)
  x:copy_(bx); y:copy_(by)
  step(mg, og, sg, x, y)                -- the warm-up: momentum, the scale on the device
  step(me, oe, se, bx:cuda(), by:cuda())
  local g = em.cuda.graph(function() return step(mg, og, sg, x, y) end)
  H.eq(sg:get_scale(), 1024, 'the capture ran nothing')
  -- launch 2 grows (3 clean steps with the warm-up), 3 holds an inf, 6 grows again
  local scales = { 1024, 2048, 1024, 1024, 1024, 2048 }
  for i = 1, 6 do
    bx, by = em.randn(8, 6), em.randn(8, 3)
    if i == 3 then bx[2][5] = math.huge end
    x:copy_(bx); y:copy_(by)
    local before = {}
    for k, p in ipairs(mg:parameters()) do before[k] = p:cpu() end
    local mom = og.state[1].momentum_buffer:cpu()
    g()
    local _, stepped = step(me, oe, se, bx:cuda(), by:cuda())
    H.eq(stepped, i ~= 3, 'eager twin steps, launch ' .. i)
    H.eq(sg:get_scale(), se:get_scale(), 'scale after launch ' .. i)
    H.eq(sg:get_scale(), scales[i], 'scale schedule, launch ' .. i)
    local pg, pe = mg:parameters(), me:parameters()
    for k = 1, #pg do
      H.close(H.flat(pg[k]:cpu()), H.flat(pe[k]:cpu()), 1e-6, ('launch %d parameter %d'):format(i, k))
      if i == 3 then
        H.check(pg[k]:cpu():eq(before[k]):all():item(), 'inf: parameter ' .. k .. ' bit for bit unchanged')
      end
    end
    if i == 3 then
      H.check(og.state[1].momentum_buffer:cpu():eq(mom):all():item(), 'inf: momentum unchanged')
    else
      H.check(not mg:parameters()[1]:cpu():eq(before[1]):all():item(), 'launch ' .. i .. ' moved')
    end
  end
  local sd = sg:state_dict()
  H.eq({ sd.scale, sd._growth_tracker }, { 2048, 0 }, 'state_dict reads the device')
  g:free()
  -- eager steps go on from the device's numbers
  step(mg, og, sg, x, y)
  H.eq(sg:get_scale(), 2048, 'eager after the graph')
end)

H.test('GradScaler in em.cuda.graph: errors', function()
  local m = em.nn.Linear(3, 2):to('cuda')  -- before the optimizer: to() makes new parameters
  local opt = em.optim.SGD(m:parameters(), { lr = 0.1 })
  local sc = em.amp.GradScaler{}
  local x = em.ones({ 4, 3 }, { device = 'cuda' })
  H.raises(function()
    em.cuda.graph(function() sc:scale(m(x):sum()):backward() end)
  end, 'GradScaler inside em.cuda.graph', 'before capturing')
  H.eq(em.cuda.is_capturing(), false)
  -- after a warm-up, update(new_scale) is not capturable
  opt:zero_grad(); sc:scale(m(x):sum()):backward(); sc:step(opt); sc:update()
  H.raises(function()
    em.cuda.graph(function()
      opt:zero_grad(); sc:scale(m(x):sum()):backward(); sc:step(opt); sc:update(8)
    end)
  end, 'GradScaler:update', 'new_scale', 'CUDA graph')
  H.eq(em.cuda.is_capturing(), false)
end)

H.done()

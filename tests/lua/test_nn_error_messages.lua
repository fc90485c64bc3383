--[[
test_nn_error_messages.lua -- errors name the call the user made (not the internal
op it runs on) and say the fix: the creation functions on a device that does not
exist (one emulated CUDA device here), nn.Linear and F.linear on an input of the
wrong width, F.embedding on an id out of range, and the class-label range of
cross_entropy and nll_loss on the CPU and on CUDA.
]]
local dir = (arg and arg[0] and arg[0]:match('^(.*/)')) or
            ((os.getenv('EMBER_TESTS') or 'tests') .. '/lua/')
local H, em = dofile(dir .. 'cuda_emulated.lua')('1:64')
local nn, F = em.nn, em.nn.F

-- The message must start (after the position) with op and not name the internal op.
local function names(fn, op, internal, ...)
  local err = H.raises(fn, op .. ':', ...)
  H.check(err:find(': ' .. op .. ': ', 1, true) ~= nil, ('%s is named first: %s'):format(op, err))
  if internal then
    H.check(not err:find(internal .. ':', 1, true), ('%s is not blamed: %s'):format(internal, err))
  end
  H.check(err:find('test_nn_error_messages.lua', 1, true) ~= nil, 'the user\'s line: ' .. err)
end

H.test('creation functions on a missing device name themselves and the fix', function()
  local bad = { device = 'cuda:1' }
  local x = em.zeros(2)
  names(function() em.zeros(2, bad) end, 'zeros', 'full', 'no device cuda:1', "device = 'cuda'")
  names(function() em.ones({ 2, 3 }, bad) end, 'ones', 'full', 'cuda:1')
  names(function() em.empty(2, bad) end, 'empty', nil, 'cuda:1')
  names(function() em.full({ 2 }, 7, bad) end, 'full', nil, 'cuda:1')
  names(function() em.rand(2, bad) end, 'rand', 'empty', 'cuda:1')
  names(function() em.randn(2, bad) end, 'randn', 'empty', 'cuda:1')
  names(function() em.randint(0, 3, { 2 }, bad) end, 'randint', 'empty', 'cuda:1')
  names(function() em.eye(2, bad) end, 'eye', nil, 'cuda:1')
  names(function() em.arange(0, 3, bad) end, 'arange', nil, 'cuda:1')
  names(function() em.tensor({ 1, 2 }, bad) end, 'tensor', 'to', 'no device cuda:1')
  names(function() em.tensor(3, bad) end, 'tensor', 'full', 'cuda:1')
  names(function() em.tensor(x, bad) end, 'tensor', 'to', 'cuda:1')
  names(function() em.zeros_like(x, bad) end, 'zeros_like', 'full', 'cuda:1')
  names(function() em.ones_like(x, bad) end, 'ones_like', 'full', 'cuda:1')
  names(function() em.full_like(x, 2, bad) end, 'full_like', 'full', 'cuda:1')
  names(function() em.empty_like(x, bad) end, 'empty_like', 'empty', 'cuda:1')
  names(function() em.rand_like(x, bad) end, 'rand_like', 'empty', 'cuda:1')
  names(function() em.randn_like(x, bad) end, 'randn_like', 'empty', 'cuda:1')
  H.eq(em.zeros(2, { device = 'cuda' }).device, 'cuda:0', 'the existing device still works')
  H.eq(em.tensor({ 1, 2 }, { device = 'cuda' }):totable(), { 1, 2 }, 'em.tensor on cuda copies')
end)

H.test('Linear and F.linear name the layer, in_features and the input shape', function()
  local m = nn.Linear(4, 8)
  names(function() m(em.randn(2, 5)) end, 'Linear(4, 8)', 'matmul', 'input [2,5]',
    'in_features = 4', 'got 5', 'Linear(5, 8)')
  names(function() m(em.randn(3, 2, 5)) end, 'Linear(4, 8)', 'matmul', 'input [3,2,5]')
  names(function() m(em.tensor(1.5)) end, 'Linear(4, 8)', nil, 'a 0-d tensor')
  names(function() F.linear(em.randn(2, 5), em.randn(8, 4)) end, 'linear', 'matmul',
    'input [2,5]', 'weight [8,4]', 'must be 4')
  H.eq(m(em.randn(3, 4)).shape, { 3, 8 }, 'a fitting input still works')
  H.eq(m:to('cuda')(em.randn(3, 4, { device = 'cuda' })).shape, { 3, 8 }, 'and on cuda')
end)

H.test('embedding names itself for an id out of range', function()
  local e = nn.Embedding(4, 3)
  names(function() e(em.tensor({ 0, 1 }, { dtype = 'int64' })) end, 'embedding', 'index_select',
    'index 0 is out of range for 4 embeddings', 'count from 1')
  names(function() e(em.tensor({ 5 }, { dtype = 'int64' })) end, 'embedding', 'index_select',
    'index 5')
end)

H.test('batch norm names the channels and the layer to make', function()
  names(function() nn.BatchNorm2d(3)(em.randn(2, 4, 5, 5)) end, 'batch_norm', nil,
    'input [2,4,5,5] has 4 channels', 'num_features = 3', 'BatchNorm2d(4)')
  names(function() nn.BatchNorm1d(3)(em.randn(2, 4)) end, 'batch_norm', nil,
    'input [2,4] has 4 channels', 'BatchNorm1d(4)')
  names(function() nn.BatchNorm2d(3):to('cuda')(em.randn(2, 4, 5, 5, { device = 'cuda' })) end, 'batch_norm',
    nil, 'has 4 channels', 'BatchNorm2d(4)')
  H.eq(nn.BatchNorm2d(4)(em.randn(2, 4, 5, 5)).shape, { 2, 4, 5, 5 }, 'a fitting input still works')
end)

H.test('layer norm names the layer that would fit', function()
  names(function() nn.LayerNorm(3)(em.randn(2, 4)) end, 'layer_norm', nil, 'input [2,4]',
    'normalizes over [3]', 'ends in [4]', 'LayerNorm(4)')
  names(function() nn.LayerNorm({ 2, 3 })(em.randn(5, 4, 3)) end, 'layer_norm', nil,
    'normalizes over [2,3]', 'LayerNorm({4, 3})')
  H.eq(nn.LayerNorm(4)(em.randn(2, 4)).shape, { 2, 4 }, 'a fitting input still works')
end)

H.test('binary_cross_entropy_with_logits and embedding name themselves', function()
  local F = em.nn.F
  names(function() F.binary_cross_entropy_with_logits(em.randn(3), em.tensor({ 1, 0, 1 })) end,
    'binary_cross_entropy_with_logits', 'bce_with_logits', 'int64', 'target:to(input.dtype)')
  names(function() nn.BCEWithLogitsLoss()(em.randn(3), em.randn(4)) end,
    'binary_cross_entropy_with_logits', 'bce_with_logits', '[3]', '[4]')
  names(function() nn.Embedding(4, 3)(em.randn(2)) end, 'embedding', 'index_select',
    'got float32', 'idx:long()')
end)

H.test('class labels out of range say labels count from 1', function()
  for _, dev in ipairs({ 'cpu', 'cuda' }) do
    local x = em.randn(2, 3, { device = dev })
    local t0 = em.tensor({ 0, 1 }, { dtype = 'int64', device = dev })
    names(function() F.cross_entropy(x, t0) end, 'cross_entropy', nil,
      'target 0 is out of range for 3 classes', 'labels count from 1', 'run 1..3',
      'add 1 to 0-based labels')
    names(function() F.nll_loss(x, t0) end, 'nll_loss', nil, 'labels count from 1')
    names(function() F.cross_entropy(x, em.tensor({ 3, 4 }, { dtype = 'int32', device = dev })) end,
      'cross_entropy', nil, 'target 4 is out of range')
    names(function() nn.CrossEntropyLoss()(x:reshape(2, 3, 1), t0:reshape(2, 1)) end,
      'cross_entropy', nil, 'target 0')
  end
end)

H.done()

--[[
test_data_transforms.lua -- em.data.T through ds:map on em.data.tensors.

  - torchvision 0.14 values from tests/fixtures/transforms.txt (gen_transforms.py):
    a center_crop -> resize -> to_float -> normalize pipeline, uint8 resize and
    center crops that pad, on samples that are strided views of their dataset;
  - random_crop, hflip and cutout against their definitions, the same sample
    twice giving the same result, other seeds other results;
  - a loader with worker threads gives the batches computed on the caller's thread;
  - transforms called on a tensor directly, and the error messages.
]]
local dir = (arg and arg[0] and arg[0]:match('^(.*/)')) or
            ((os.getenv('EMBER_TESTS') or 'tests') .. '/lua/')
local H = dofile(dir .. 'harness.lua')
local em = require 'ember'
local T = em.data.T

-- -- Fixtures: "name ndim sizes... values..." per line --------------------------------
local fx = {}
for line in io.lines(dir .. '../fixtures/transforms.txt') do
  local name, rest = line:match('^(%S+)%s+(.*)$')
  local nums = {}
  for v in rest:gmatch('%S+') do nums[#nums + 1] = tonumber(v) end
  local nd, shape, vals = nums[1], {}, {}
  for i = 1, nd do shape[i] = nums[1 + i] end
  for i = nd + 2, #nums do vals[#vals + 1] = nums[i] end
  fx[name] = { shape = shape, vals = vals }
end

local function fixture(name, dtype)
  local f = assert(fx[name], 'missing fixture ' .. name)
  return em.tensor(f.vals, dtype or 'float32'):reshape(unpack(f.shape)), f
end

-- A dataset of n copies of image x (C, H, W) whose samples are strided views:
-- the rows are stored (n, C, W, H) and transposed back.
local function strided_source(x, n)
  local vals = H.flat(x:transpose(2, 3):contiguous())
  local all = {}
  for _ = 1, n do for i = 1, #vals do all[#all + 1] = vals[i] end end
  local s = x.shape
  local stored = em.tensor(all, x.dtype):reshape(n, s[1], s[3], s[2])
  local labels = {}
  for i = 1, n do labels[i] = i end
  return em.data.tensors(stored:transpose(3, 4), em.tensor(labels, 'int64'))
end

local function same(a, b) return H.deep_eq(a.shape, b.shape) and H.deep_eq(H.flat(a), H.flat(b)) end

H.test('constructors', function()
  local names = {
    { T.to_float(), 'to_float' }, { T.normalize({ 0.5 }, { 0.2 }), 'normalize' },
    { T.random_crop(4, { padding = 2 }), 'random_crop' }, { T.center_crop({ 3, 5 }), 'center_crop' },
    { T.resize(8, 9), 'resize' }, { T.hflip(0.5), 'hflip' }, { T.cutout(3), 'cutout' },
    { T.compose { T.to_float(), T.hflip() }, 'compose' },
  }
  for _, p in ipairs(names) do H.eq(p[1]:name(), p[2], 'name') end
  H.eq(tostring(T.resize(2, 2)), 'transform(resize)')
end)

H.test('pipeline through ds:map matches torchvision', function()
  local x = fixture('pipe.x', 'uint8')
  local want = fixture('pipe.y')
  local ds = strided_source(x, 3):map(T.compose {
    T.center_crop({ 12, 10 }), T.resize(8, 9), T.to_float(),
    T.normalize({ 0.4, 0.5, 0.6 }, { 0.2, 0.25, 0.3 }),
  })
  for i = 1, 3 do
    local img, label = ds:get(i)
    H.eq(img.shape, { 3, 8, 9 }, 'shape')
    H.eq(img.dtype, 'float32', 'dtype')
    H.close(H.flat(img), H.flat(want), 1e-6, 'sample ' .. i)
    H.eq(H.num(label), i, 'the label passes through')
  end
end)

H.test('resize and center_crop match torchvision', function()
  for i = 0, 4 do
    local x, f = fixture(('rsu%d.x'):format(i), 'uint8')
    local p = fx[('rsu%d.p'):format(i)].vals
    local img = strided_source(x, 1):map(T.resize(p[1], p[2])):get(1)
    H.eq(img.dtype, 'uint8', 'dtype')
    H.eq(H.flat(img), fx[('rsu%d.y'):format(i)].vals, 'uint8 resize ' .. i .. ' ' .. H.show(f.shape))
  end
  local x = fixture('cc.x')
  for i = 0, 12 do
    local p = fx[('cc%d.p'):format(i)].vals
    local img = strided_source(x, 1):map(T.center_crop({ p[1], p[2] })):get(1)
    H.eq(H.flat(img), fx[('cc%d.y'):format(i)].vals, ('center_crop %dx%d'):format(p[1], p[2]))
  end
end)

-- Is y (C, h, w) the window at (top, left) (0-based) of x zero-padded by p?
local function is_window(y, x, p, top, left)
  local ys, xs = y.shape, x.shape
  local yv, xv = H.flat(y), H.flat(x)
  local C, Hh, W, h, w = xs[1], xs[2], xs[3], ys[2], ys[3]
  for c = 0, C - 1 do
    for i = 0, h - 1 do
      for j = 0, w - 1 do
        local sy, sx = top + i - p, left + j - p
        local v = (sy < 0 or sy >= Hh or sx < 0 or sx >= W) and 0 or xv[(c * Hh + sy) * W + sx + 1]
        if yv[(c * h + i) * w + j + 1] ~= v then return false end
      end
    end
  end
  return true
end

H.test('random_crop', function()
  local vals = {}
  for i = 1, 2 * 4 * 5 do vals[i] = i end
  local x = em.tensor(vals, 'uint8'):reshape(2, 4, 5)
  local ds = strided_source(x, 60):map(T.random_crop({ 4, 4 }, { padding = 1 }), { seed = 5 })
  local other = strided_source(x, 60):map(T.random_crop({ 4, 4 }, { padding = 1 }), { seed = 6 })
  local offsets, all_windows, det, differ = {}, true, true, 0
  for i = 1, 60 do
    local y = ds:get(i)
    local found
    for top = 0, 2 do
      for left = 0, 3 do
        if not found and is_window(y, x, 1, top, left) then found = top * 4 + left end
      end
    end
    all_windows = all_windows and found ~= nil
    if found then offsets[found] = true end
    det = det and same(y, ds:get(i))
    if not same(y, other:get(i)) then differ = differ + 1 end
  end
  local n = 0
  for _ in pairs(offsets) do n = n + 1 end
  H.check(all_windows, 'every sample is a window of the padded image')
  H.check(n == 12, ('%d of the 12 offsets seen in 60 samples'):format(n))
  H.check(det, 'the same sample twice, the same crop')
  H.check(differ > 30, ('seeds 5 and 6 differ on %d of 60 samples'):format(differ))
  H.raises(function() strided_source(x, 1):map(T.random_crop(8)):get(1) end,
    'random_crop: crop 8x8 larger than the padded image 4x5 (padding 0')
end)

H.test('hflip and cutout', function()
  local x = em.tensor({ 1, 2, 3, 4, 5, 6 }, 'float32'):reshape(1, 2, 3)
  H.eq(H.flat(strided_source(x, 1):map(T.hflip(1)):get(1)), { 3, 2, 1, 6, 5, 4 }, 'p = 1')
  H.eq(H.flat(strided_source(x, 1):map(T.hflip(0)):get(1)), { 1, 2, 3, 4, 5, 6 }, 'p = 0')
  local flips = 0
  local ds = strided_source(x, 100):map(T.hflip(0.5), { seed = 2 })
  for i = 1, 100 do if H.flat(ds:get(i))[1] == 3 then flips = flips + 1 end end
  H.check(flips > 30 and flips < 70, ('%d of 100 flipped'):format(flips))
  local vals = {}
  for i = 1, 2 * 6 * 7 do vals[i] = i end
  local img = em.tensor(vals, 'float32'):reshape(2, 6, 7)
  ds = strided_source(img, 40):map(T.cutout(3), { seed = 3 })
  local ok = true
  for i = 1, 40 do
    local y = H.flat(ds:get(i))
    local zeros = { 0, 0 }
    for k = 1, #y do
      if y[k] == 0 then
        local c = k <= 42 and 1 or 2
        zeros[c] = zeros[c] + 1
      elseif y[k] ~= vals[k] then
        ok = false
      end
    end
    ok = ok and zeros[1] == zeros[2] and zeros[1] >= 4 and zeros[1] <= 9
  end
  H.check(ok, 'cutout zeroes one clipped 3x3 square in every channel, nothing else')
end)

H.test('a loader with workers gives the same batches', function()
  local vals = {}
  for i = 1, 3 * 8 * 8 do vals[i] = i % 251 end
  local x = em.tensor(vals, 'uint8'):reshape(3, 8, 8)
  local ds = strided_source(x, 10):map(T.compose {
    T.random_crop(6, { padding = 2 }), T.hflip(), T.cutout(2), T.to_float(),
    T.normalize({ 0.5, 0.4, 0.3 }, { 0.2, 0.2, 0.2 }),
  }, { seed = 9 }):batch(4)
  local function epoch(workers)
    local out = {}
    local l = ds:loader { workers = workers }
    for xb, yb in l:epoch() do out[#out + 1] = { xb, yb } end
    return out
  end
  local a, b = epoch(0), epoch(2)
  H.eq(#a, 3, 'batches')
  H.eq(#b, 3, 'batches with workers')
  for i = 1, math.min(#a, #b) do
    H.check(same(a[i][1], b[i][1]) and same(a[i][2], b[i][2]), 'batch ' .. i .. ' the same')
  end
  H.eq(a[1][1].shape, { 4, 3, 6, 6 }, 'batch shape')
end)

H.test('called on a tensor', function()
  local x = em.tensor({ 1, 2, 3, 4 }, 'uint8'):reshape(1, 2, 2)
  H.eq(H.flat(T.hflip(1)(x)), { 2, 1, 4, 3 }, 'hflip')
  H.close(H.flat(T.to_float()(x)), { 1 / 255, 2 / 255, 3 / 255, 4 / 255 }, 1e-7, 'to_float')
  local rc = T.random_crop(2, { padding = 1 })
  H.check(same(rc(x, { seed = 1, index = 7 }), rc(x, { seed = 1, index = 7 })), 'deterministic')
  H.eq(x.dtype, 'uint8', 'the input is untouched')
  H.eq(H.flat(x), { 1, 2, 3, 4 }, 'the input values are untouched')
end)

H.test('errors', function()
  local gray = em.tensor({ 0.1, 0.2, 0.3, 0.4 }, 'float32'):reshape(1, 2, 2)
  H.raises(function() strided_source(gray, 1):map(T.normalize({ 1, 2, 3 }, { 1, 1, 1 })):get(1) end,
    'normalize: 3 means for an image with 1 channel')
  local u8 = em.tensor({ 1, 2, 3, 4 }, 'uint8'):reshape(1, 2, 2)
  H.raises(function() strided_source(u8, 1):map(T.normalize({ 0.5 }, { 0.5 })):get(1) end,
    'normalize', 'uint8', 'to_float')
  H.raises(function() T.resize(2, 2)(em.tensor({ 1, 2, 3, 4 }, 'int64'):reshape(1, 2, 2)) end,
    'resize', 'int64')
  H.raises(function() T.center_crop(2)(em.tensor({ 1, 2, 3 }, 'float32')) end,
    'center_crop', '(C, H, W)', '[3]')
  H.raises(function() T.normalize({ 0 }, { 0 }) end, 'normalize', 'std')
  H.raises(function() T.cutout(0) end, 'cutout')
  H.raises(function() T.resize(0, 3) end, 'resize')
  H.raises(function() T.hflip(2) end, 'hflip')
end)

H.done()

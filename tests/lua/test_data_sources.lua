--[[
test_data_sources.lua -- the file-backed sources through Lua: em.data.cifar10,
em.data.csv, em.data.image_folder and em.data.idx, read with ds[i], #ds and a
loader with worker threads.

  - CIFAR-10 batch files written here (train = the five data_batch_N.bin, test =
    test_batch.bin): values in R, G, B plane order, 1-based labels, batches;
  - the CSV fixtures of tests/fixtures/data/: header found by itself or given,
    label by name and by 1-based column, int64 and float32 labels, errors that
    name the line;
  - an image folder built from the PIL-written fixtures (gen_images.py): order,
    labels, pixels equal to PIL's decode (images.txt), resize, batches from two
    workers, a corrupt file's error naming it, other files skipped;
  - IDX files written here: (1, H, W) images, labels + 1, mismatch errors.
]]
local dir = (arg and arg[0] and arg[0]:match('^(.*/)')) or
            ((os.getenv('EMBER_TESTS') or 'tests') .. '/lua/')
local H = dofile(dir .. 'harness.lua')
local em = require 'ember'

local fixtures = dir .. '../fixtures/data/'

local function ok_status(r) return r == 0 or r == true end

local scratch
do
  local base = os.tmpname()
  os.remove(base)
  scratch = '/tmp/ember-dsrc-' .. base:match('[^/]+$')
  assert(ok_status(os.execute('mkdir -p ' .. scratch)), 'cannot create ' .. scratch)
end
local function tmp(name) return scratch .. '/' .. name end

local function write(path, bytes)
  local f = assert(io.open(path, 'wb'))
  f:write(bytes)
  f:close()
end

local function sh(cmd) assert(ok_status(os.execute(cmd)), cmd) end

-- PIL's pixels for a fixture: images.txt lines `file channels C H W v...`.
local function pil_pixels(file, channels)
  for line in io.lines(fixtures .. 'images.txt') do
    local name, ch, rest = line:match('^(%S+) (%d+) (.*)$')
    if name == file and tonumber(ch) == channels then
      local v = {}
      for n in rest:gmatch('%d+') do v[#v + 1] = tonumber(n) end
      local shape = { v[1], v[2], v[3] }
      return shape, { unpack(v, 4) }
    end
  end
  error('no fixture line for ' .. file)
end

-- -- CIFAR-10 ------------------------------------------------------------------------------
-- n records starting at global index base: label (base + r) % 10, pixel j of
-- record r = (base + r + j) % 256.
local function cifar_file(path, base, n)
  local recs = {}
  for r = 0, n - 1 do
    local g = base + r
    local px = {}
    for j = 0, 3071 do px[j + 1] = string.char((g + j) % 256) end
    recs[#recs + 1] = string.char(g % 10) .. table.concat(px)
  end
  write(path, table.concat(recs))
end

H.test('cifar10: train and test splits, values, 1-based labels, a loader', function()
  local root = tmp('cifar')
  sh('mkdir -p ' .. root)
  for b = 1, 5 do cifar_file(root .. '/data_batch_' .. b .. '.bin', (b - 1) * 3, 3) end
  cifar_file(root .. '/test_batch.bin', 100, 2)
  local ds = em.data.cifar10{ root = root, split = 'train' }
  H.eq(#ds, 15)
  local x, y = ds:get(8)              -- record 7 (0-based): batch 3, its second
  H.eq(x.shape, { 3, 32, 32 })
  H.eq(x.dtype, 'uint8')
  H.eq(y.dtype, 'int64')
  H.eq(y:item(), 7 % 10 + 1)
  H.eq(x[1][1][1], 7)          -- R plane, (0, 0): byte 0
  H.eq(x[2][1][1], (7 + 1024) % 256)
  H.eq(x[3][32][32], (7 + 3071) % 256)
  local test = em.data.cifar10{ root = root, split = 'test' }
  H.eq(#test, 2)
  H.eq(test[2][2]:item(), 101 % 10 + 1)
  local labels = {}
  for bx, by in ds:batch(4):loader{ workers = 2 }:epoch() do
    H.eq(bx.shape[2], 3)
    for _, v in ipairs(by:totable()) do labels[#labels + 1] = v end
  end
  local want = {}
  for i = 0, 14 do want[#want + 1] = i % 10 + 1 end
  H.eq(labels, want)
  H.raises(function() em.data.cifar10{ root = tmp('nowhere') } end, 'cifar10', "can't open",
    'data_batch_1.bin')
  H.raises(function() em.data.cifar10{ root = root, split = 'valid' } end, 'split')
  write(root .. '/data_batch_2.bin', ('x'):rep(3073 * 2 + 5))
  H.raises(function() em.data.cifar10{ root = root } end, 'data_batch_2.bin',
    'truncated record 3')
end)

-- -- CSV ---------------------------------------------------------------------------------------
H.test('csv: header, label by name and column, int and float labels, errors', function()
  local ds = em.data.csv(fixtures .. 'basic.csv', { label = 'label' })
  H.eq(#ds, 3)
  local x, y = ds:get(2)
  H.eq(x.dtype, 'float32')
  H.eq(x:totable(), { 4, 0.5, 6 })
  H.eq(y.dtype, 'int64')
  H.eq(y:item(), 2)                                   -- as written, no shift
  local d4 = em.data.csv(fixtures .. 'basic.csv', { label = 4, header = true })
  H.eq(d4[3][2]:item(), 1)
  H.eq(d4[3][1]:totable(), { -7.25, 8, 9 })
  local nolabel = em.data.csv(fixtures .. 'basic.csv')   -- header found by itself
  H.eq(#nolabel, 3)
  H.eq(nolabel[1][1]:totable(), { 1, 2.5, -3, 0 })
  H.eq(nolabel[1][2], nil)
  local f = em.data.csv(fixtures .. 'float_label.csv', { label = 1 })
  H.eq(f[2][2].dtype, 'float32')
  H.eq(f[2][2]:item(), 1.25)
  H.eq(f[3][1]:totable(), { 5, 6 })
  local bx, by = f:batch(3):loader{}:epoch()()
  H.eq(bx:totable(), { { 1, 2 }, { 3, 4 }, { 5, 6 } })
  H.eq(by:totable(), { 0.5, 1.25, -2 })
  H.raises(function() em.data.csv(fixtures .. 'bad_number.csv') end, 'bad_number.csv',
    "line 7: field 3 'abc' is not a number")
  H.raises(function() em.data.csv(fixtures .. 'bad_count.csv') end, 'line 9: 4 fields, expected 5')
  H.raises(function() em.data.csv(fixtures .. 'basic.csv', { label = 'y' }) end,
    "no column named 'y'")
  H.raises(function() em.data.csv(fixtures .. 'empty.csv', { header = true }) end, 'empty file')
  H.raises(function() em.data.csv(tmp('none.csv')) end, "can't open", 'none.csv')
end)

-- -- Image folders -----------------------------------------------------------------------------
H.test('image_folder: order, labels, PIL pixels, resize, loader, corrupt files', function()
  local root = tmp('images')
  sh(('mkdir -p %s/ant %s/bee'):format(root, root))
  sh(('cp %spil_rgb.jpg %s/ant/2.jpg && cp %spil_gray.jpg %s/ant/1.JPG'):format(
    fixtures, root, fixtures, root))
  sh(('cp %spil_rgba.png %s/bee/x.png && cp %spil_palette.png %s/bee/y.png'):format(
    fixtures, root, fixtures, root))
  write(root .. '/bee/readme.txt', 'skipped')
  local ds = em.data.image_folder(root)
  H.eq(#ds, 4)
  local want = { { 'pil_gray.jpg', 1 }, { 'pil_rgb.jpg', 1 }, { 'pil_rgba.png', 2 },
                 { 'pil_palette.png', 2 } }
  for i, w in ipairs(want) do
    local x, y = ds:get(i)
    local shape, pixels = pil_pixels(w[1], 3)
    H.eq(x.shape, shape, w[1] .. ' shape')
    H.eq(x.dtype, 'uint8')
    H.eq(H.flat(x), pixels, w[1] .. ' pixels as PIL decodes them')
    H.eq(y:item(), w[2])
  end
  local small = em.data.image_folder(root, { size = { 5, 6 } })
  H.eq(small[2][1].shape, { 3, 5, 6 })
  local square = em.data.image_folder(root, { size = 4 })
  local n, labels = 0, {}
  for bx, by in square:batch(3):loader{ workers = 2 }:epoch() do
    n = n + 1
    H.eq(bx.shape, { by.shape[1], 3, 4, 4 })
    for _, v in ipairs(by:totable()) do labels[#labels + 1] = v end
  end
  H.eq(n, 2)
  H.eq(labels, { 1, 1, 2, 2 })
  -- a file with an image name that is not an image fails when read, named
  write(root .. '/bee/z.png', 'not a png at all')
  local bad = em.data.image_folder(root, { size = 4 })
  H.eq(#bad, 5)
  H.raises(function() return bad[5] end, 'image_folder', 'z.png', 'not a JPEG or PNG file')
  H.raises(function()
    for _ in bad:batch(2):loader{ workers = 2 }:epoch() do end
  end, 'z.png')
  H.raises(function() em.data.image_folder(tmp('none')) end, 'image_folder', 'none')
end)

H.test('max_pixels: load_image, image_folder, em.data.max_pixels; full_decode', function()
  local root = tmp('limits')
  sh(('mkdir -p %s/a'):format(root))
  sh(('cp %spil_rgb.jpg %s/a/1.jpg'):format(fixtures, root))
  local img = em.data.load_image(root .. '/a/1.jpg')
  local h, w = img.shape[2], img.shape[3]
  local n = h * w
  H.raises(function() em.data.load_image(root .. '/a/1.jpg', { max_pixels = n - 1 }) end,
    '1.jpg', ('%dx%d'):format(w, h), 'limit of ' .. (n - 1), 'max_pixels')
  H.eq(em.data.load_image(root .. '/a/1.jpg', { max_pixels = n }).shape, img.shape)
  H.raises(function() em.data.load_image(root .. '/a/1.jpg', { max_pixels = 0 }) end,
    'max_pixels must be an integer >= 1')
  H.eq(em.data.max_pixels(), 89478485)
  H.eq(em.data.max_pixels(n - 1), n - 1)
  H.raises(function() em.data.load_image(root .. '/a/1.jpg') end, 'limit of ' .. (n - 1))
  H.eq(em.data.load_image(root .. '/a/1.jpg', { max_pixels = false }).shape, img.shape)
  local ds = em.data.image_folder(root)                -- the state's setting, taken now
  em.data.max_pixels(false)
  H.eq(em.data.max_pixels(), false)
  H.raises(function() return ds[1] end, 'image_folder', '1.jpg', 'max_pixels')
  H.eq(em.data.image_folder(root, { max_pixels = n })[1][1].shape, img.shape)
  H.raises(function() return em.data.image_folder(root, { max_pixels = 10 })[1] end,
    'limit of 10 ')
  em.data.max_pixels(89478485)
  -- full_decode: exactly a full decode then the resize transform; the reduced
  -- decode (the default with a size) has the same shape (its closeness to the full
  -- one is measured on a smooth image in tests/c/test_hostile_files.c)
  local full = em.data.image_folder(root, { size = 4, full_decode = true })[1][1]
  local plain = em.data.image_folder(root):map(em.data.T.resize(4, 4))[1][1]
  H.eq(H.flat(full), H.flat(plain), 'full_decode = decode + resize')
  H.eq(em.data.image_folder(root, { size = 4 })[1][1].shape, { 3, 4, 4 })
end)

-- -- IDX --------------------------------------------------------------------------------------
local function be32(n)
  return string.char(math.floor(n / 16777216) % 256, math.floor(n / 65536) % 256,
    math.floor(n / 256) % 256, n % 256)
end

H.test('idx: (1, H, W) images, labels from 1, pairing errors', function()
  local img, lab, lab2 = tmp('img-idx3'), tmp('lab-idx1'), tmp('lab2-idx1')
  local px = {}
  for i = 0, 2 * 3 * 2 - 1 do px[#px + 1] = string.char(i * 10) end
  write(img, '\0\0\8\3' .. be32(2) .. be32(3) .. be32(2) .. table.concat(px))
  write(lab, '\0\0\8\1' .. be32(2) .. '\7\0')
  write(lab2, '\0\0\8\1' .. be32(3) .. '\1\2\3')
  local ds = em.data.idx(img, lab)
  H.eq(#ds, 2)
  local x, y = ds:get(2)
  H.eq(x.shape, { 1, 3, 2 })
  H.eq(H.flat(x), { 60, 70, 80, 90, 100, 110 })
  H.eq(y:item(), 1)
  H.eq(ds[1][2]:item(), 8)
  H.raises(function() em.data.idx(img, lab2) end, 'img-idx3', 'lab2-idx1', '2 images', '3 labels')
  write(img, '\0\0\8\3' .. be32(2) .. be32(3) .. be32(2) .. table.concat(px, '', 1, 8))
  H.raises(function() em.data.idx(img, lab) end, 'img-idx3', 'truncated at record 2 of 2')
end)

os.execute('rm -rf ' .. scratch)
H.done()
